"""The layering rules of docs/architecture.md, checked on the source: engine names only in servesweep/engines/, no
import cycle among servesweep's modules or its rooms (type-only imports included, so no import runs up), modules of a
readable size, and adapters that set up their log first."""
import ast
import re
from pathlib import Path

import pytest

from servesweep.engines import engine_names

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "servesweep"

# Files outside servesweep/engines/ that may carry an engine's name, and why. Each must still need its entry.
ENGINE_NAMES_ALLOWED = {
    # RULES keys name the ShareGPT filters of the peer benchmark clients (vLLM's and SGLang's bench tools), not
    # the engines servesweep launches.
    "servesweep/workloads/sharegpt.py",
    # Copied into every bundle and run with a bare Python before servesweep is installed, so it cannot ask the
    # registry; it carries the llama.cpp sources the embedded default builds and runs that engine's build module.
    "servesweep/bundle.py",
}


def _engine_name_pattern() -> re.Pattern:
    names = "|".join(re.escape(n) for n in engine_names())
    return re.compile(rf"(?<![a-z])({names})(?![a-z])", re.I)


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def engine_names_in_python(source: str) -> list[tuple[int, str]]:
    """(line, text) of every identifier, imported module and one-token string constant naming an engine.

    Prose (comments, docstrings, strings with spaces such as messages) may mention an engine; code may not.
    """
    pattern, tree = _engine_name_pattern(), ast.parse(source)
    docstrings, hits = _docstring_nodes(tree), []
    for node in ast.walk(tree):
        texts = code_names(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            texts = [node.value] if not re.search(r"\s", node.value) else []
        hits += [(getattr(node, "lineno", 0), t) for t in texts if pattern.search(t)]
    return hits


def code_names(node: ast.AST) -> list[str]:
    """The names a node uses or binds in code: identifiers, attributes, definitions, keyword and parameter names,
    imported modules and their aliases."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.keyword) and node.arg:
        return [node.arg]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.name, node.asname or ""]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return []


# Modules whose strings become report text: there an engine named even in a sentence is engine knowledge in the
# report (SGLang's request cap was such a sentence); it belongs in that engine's ``findings``.
REPORT_MODULES = (*sorted(str(p.relative_to(Path(__file__).resolve().parent.parent))
                          for p in (Path(__file__).resolve().parent.parent / "servesweep" / "report").glob("*.py")),
                  "servesweep/charts.py", "servesweep/chart_registry.py")
# Report phrases that name the peer benchmark clients whose conventions a column follows, not an engine servesweep
# launches.
REPORT_PHRASES_ALLOWED = ("vLLM's and SGLang's clients", "vLLM's rule")


def engine_names_in_strings(source: str, allowed: tuple[str, ...] = ()) -> list[tuple[int, str]]:
    """(line, text) of every string constant, sentences and f-string parts included, naming an engine outside the
    ``allowed`` phrases; docstrings and comments are not report text and are left out."""
    pattern, tree = _engine_name_pattern(), ast.parse(source)
    docstrings, hits = _docstring_nodes(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
            for phrase in allowed:
                text = text.replace(phrase, "")
            if pattern.search(text):
                hits.append((node.lineno, node.value))
    return hits


def engine_names_in_rules(text: str) -> list[tuple[int, str]]:
    """(line, text) of every non-comment Snakemake line naming an engine."""
    pattern = _engine_name_pattern()
    return [(i, line) for i, line in enumerate(text.splitlines(), 1)
            if pattern.search(line.split("#", 1)[0])]


def test_engine_name_scan_finds_code_and_skips_prose():
    source = ('"""Runs on SGLang."""\nimport os  # vllm\nGPU = ("sglang", "vllm")\n'
              'from servesweep.engines.llamacpp_build import x\nmsg = "no config uses SGLang here"\n'
              'def sglang_port(): pass\n')
    assert sorted(engine_names_in_python(source)) == [
        (3, "sglang"), (3, "vllm"), (4, "servesweep.engines.llamacpp_build"), (6, "sglang_port")]
    assert engine_names_in_rules('    engine="llamacpp|vllm",\n# sglang is fine in a comment\n') == [
        (1, '    engine="llamacpp|vllm",')]


def test_no_engine_names_outside_engines():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("servesweep/engines/"):
            continue
        hits = engine_names_in_python(path.read_text())
        if hits:
            found[rel] = hits
    for path in sorted([ROOT / "Snakefile", *(ROOT / "rules").glob("*.smk")]):
        hits = engine_names_in_rules(path.read_text())
        if hits:
            found[path.relative_to(ROOT).as_posix()] = hits
    unexpected = {f: hits for f, hits in found.items() if f not in ENGINE_NAMES_ALLOWED}
    assert not unexpected, f"engine knowledge outside servesweep/engines/ (move it into an engine): {unexpected}"
    stale = ENGINE_NAMES_ALLOWED - set(found)
    assert not stale, f"no longer name an engine: drop them from ENGINE_NAMES_ALLOWED: {stale}"


def test_report_string_scan_finds_sentences():
    source = ('"""Findings, SGLang\'s included."""\ncap = 48  # SGLang\nx = f"- `{cfg}`: SGLang resets it to {cap}"\n'
              'y = "what vLLM\'s and SGLang\'s clients call ITL"\n')
    assert engine_names_in_strings(source, REPORT_PHRASES_ALLOWED) == [(3, "`: SGLang resets it to ")]
    assert sorted(line for line, _ in engine_names_in_strings(source)) == [3, 4]


def test_report_text_names_no_engine():
    """What the report says about one engine comes from that engine's ``findings``."""
    found = {rel: hits for rel in REPORT_MODULES
             if (hits := engine_names_in_strings((ROOT / rel).read_text(), REPORT_PHRASES_ALLOWED))}
    assert not found, f"report text naming an engine (move it into that engine's findings): {found}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, type_only: bool = False):
    """Import nodes, leaving out ``if TYPE_CHECKING:`` blocks (type names only, never run) unless ``type_only``."""
    skip = set()
    for node in ast.walk(tree):
        if not type_only and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip]


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """servesweep module -> the servesweep modules it imports, at any depth of the file (lazy imports count; with
    ``type_only``, imports under ``TYPE_CHECKING`` too).

    A package's ``__init__`` that a submodule import runs is not an edge: the registry imports its engines and they
    import their siblings.
    """
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in _imports(ast.parse(path.read_text()), type_only):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                # ``from pkg import sub`` imports the submodule; ``from mod import name`` imports mod
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base for a in node.names}
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = import_graph()
    assert "servesweep.download" in graph["servesweep.models"]  # the graph sees real imports
    assert cycles(graph) == []


def room(module: str) -> str:
    """The room a module lives in: a top-level module, or a package of servesweep with everything under it."""
    return ".".join(module.split(".")[:2])


def test_no_import_runs_up():
    """With the type-only imports counted too, modules and rooms (packages taken whole) stand in layers: each imports
    only what stands below it. The typed sweep (``plan``) is below the engines that take its types."""
    graph = import_graph(type_only=True)
    assert "servesweep.plan" in graph["servesweep.engines.base"]  # the graph sees type-only imports
    assert cycles(graph) == []
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        rooms.setdefault(room(module), set()).update(room(t) for t in targets if room(t) != room(module))
    assert cycles(rooms) == []
    assert "servesweep.lifecycle" not in rooms["servesweep.download"]


# Modules kept whole above the size the others stay under, and why.
LONG_MODULES_ALLOWED = {
    # Copied into every bundle and run with a bare Python before servesweep is installed: one standard-library file.
    "servesweep/bundle.py",
}
MAX_MODULE_LINES = 650


def test_modules_stay_readable():
    long = {p.relative_to(ROOT).as_posix(): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert set(long) - LONG_MODULES_ALLOWED == set(), f"split along its seams: {long}"


def _script_statements(tree: ast.Module) -> list[ast.stmt]:
    """The module's statements with its ``if __name__ == "__main__":`` block's in its place."""
    out: list[ast.stmt] = []
    for node in tree.body:
        guard = isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
        out.extend(node.body if guard else [node])
    return out


def test_scripts_set_up_their_log_before_the_library():
    """Every adapter calls ``servesweep.logs.configure(snakemake.log[0])`` before it imports anything else of
    servesweep, so whatever those imports log or print lands in the job's log."""
    for path in sorted((ROOT / "scripts").glob("*.py")):
        body = _script_statements(ast.parse(path.read_text()))
        first_lib = next(n for n in body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(
            "servesweep"))
        assert first_lib.module == "servesweep.logs", f"{path.name}: import servesweep.logs first"
        configured = next(i for i, n in enumerate(body) if "configure(snakemake.log[0])" in ast.unparse(n))
        later = [n for n in body[:configured] if isinstance(n, ast.ImportFrom) and n is not first_lib
                 and (n.module or "").startswith("servesweep")]
        assert not later, f"{path.name}: call configure(snakemake.log[0]) before importing the library"


def test_scripts_do_nothing_when_a_spawned_child_runs_them_again():
    """multiprocessing's spawn runs the parent's ``__main__`` file again in each child as ``__mp_main__``; under
    Snakemake that file is the script, and the child has no ``snakemake`` object. Every script must then do nothing."""
    import runpy

    for path in sorted((ROOT / "scripts").glob("*.py")):
        runpy.run_path(str(path), run_name="__mp_main__")  # a NameError here is the child's crash


def test_schema_engine_enum_is_the_registry():
    from servesweep.config import schema

    engine = schema()["properties"]["server_configs"]["additionalProperties"]["properties"]["engine"]
    assert engine["enum"] == engine_names() and len(engine_names()) >= 3


def test_the_library_never_touches_snakemake_objects():
    """servesweep/ takes typed arguments and paths: no module imports snakemake or names its objects in code (the
    adapters in scripts/ translate ``snakemake.input``/``output``/``params``); prose may mention the tool."""
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            hits += [f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}: {n}" for n in code_names(node)
                     if n.split(".")[0] in ("snakemake", "Namedlist", "InputFiles", "OutputFiles", "Params")]
    assert not hits, hits


def test_schema_engines_block_is_each_engines_settings_schema():
    import yaml

    from servesweep.config import ConfigError, check_config, schema
    from servesweep.engines import get_engine

    engines = schema()["properties"]["engines"]
    assert engines["additionalProperties"] is False
    assert list(engines["properties"]) == engine_names()
    assert all(engines["properties"][n] == get_engine(n).settings_schema for n in engine_names())
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["engines"]["nosuchengine"] = {}
    try:
        check_config(config)
    except ConfigError as err:
        assert any(key == "engines" and "nosuchengine" in what for key, what, _ in err.problems), err.problems
    else:
        raise AssertionError("an engines block of an unknown engine was accepted")


def test_llamacpp_version_is_spelled_alike_everywhere():
    """The llama-cpp-python sdist version the embedded default builds: the build module's default is the one source;
    the schema default comes from it, and the files that must spell it again (the bundle runs before servesweep is
    installed, the configs and their README are read by people) agree with it. Recorded runs (examples/, tests/data/)
    keep the version they ran."""
    import yaml

    from servesweep import bundle
    from servesweep.config import apply_defaults
    from servesweep.engines.llamacpp_build import DEFAULT_VERSION

    assert apply_defaults({"engines": {"llamacpp": {}}})["engines"]["llamacpp"]["version"] == DEFAULT_VERSION
    assert bundle.LLAMA_CPP_PYTHON == DEFAULT_VERSION
    pinned = {}
    for path in sorted((ROOT / "config").glob("*.yaml")):
        version = ((yaml.safe_load(path.read_text()).get("engines") or {}).get("llamacpp") or {}).get("version")
        if version is not None:
            pinned[path.name] = version
    assert "config.yaml" in pinned and set(pinned.values()) == {DEFAULT_VERSION}, pinned
    readme = (ROOT / "config" / "README.md").read_text()
    assert re.findall(r"`engines\.llamacpp\.version`.*\(default `([^`]+)`\)", readme) == [DEFAULT_VERSION]


def test_the_workflow_reads_nothing_under_examples():
    """The recorded examples are for people and for the example tests: no rule, adapter or library path names
    examples/ in code (prose may), so the tests that run the pipeline in a copy of the tree can leave the folder out."""
    hits = []
    for path in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]:
        hits += [f"{path.relative_to(ROOT)}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
                 if "examples" in line.split("#")[0]]
    for path in [*sorted((ROOT / "scripts").glob("*.py")), *sorted(PACKAGE.rglob("*.py"))]:
        tree = ast.parse(path.read_text())
        prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}   # docstrings
        hits += [f"{path.relative_to(ROOT)}:{n.lineno}" for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and "examples/" in n.value
                 and id(n) not in prose]
    assert not hits, hits
