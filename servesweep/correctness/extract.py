"""Turn what a model wrote into a runnable program for a problem whose prompt ends in a function stub.

Models answer in many shapes: a body continuing the prompt (completion style), a fenced block with or without a
language tag, several blocks (the solution, an example, a corrected version), a block cut off by ``max_tokens``
before its closing fence, a ``<think>`` section first, prose around the code, CRLF line ends, tabs. Every shape
ends as ``prompt + code``: the prompt keeps its imports and helper functions, and a full definition in the code
replaces the prompt's stub because a later ``def`` wins.
"""
from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass

INDENT = "    "
PYTHON_TAGS = {"", "python", "python3", "py", "py3"}
_FENCE_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n`]*$")
_THINK = re.compile(r"<think>.*?</think>", re.S | re.I)
# top-level lines that belong to code; any other unindented line is prose
_CODE_START = re.compile(r"^(def |async def |class |import |from |@|if __name__)")


@dataclass(frozen=True)
class Extraction:
    """The program to run (prompt + code), the code taken from the completion and how it was found."""

    program: str
    code: str
    style: str  # fenced | bare | completion | empty


def normalize(text: str) -> str:
    """CRLF and CR line ends to LF; ``<think>`` sections removed (an unclosed one runs to the end)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _THINK.sub("", text)
    lower = text.lower()
    if "</think>" in lower:  # the opening tag was part of the prompt or chat template
        text = text[lower.rindex("</think>") + len("</think>"):]
    elif "<think>" in lower:
        text = text[:lower.index("<think>")]
    return text


def expand_leading_tabs(code: str) -> str:
    """Each tab in a line's indentation becomes four spaces, so tab- and space-indented lines can mix."""
    out = []
    for line in code.split("\n"):
        stripped = line.lstrip(" \t")
        indent = line[:len(line) - len(stripped)]
        out.append(indent.replace("\t", INDENT) + stripped)
    return "\n".join(out)


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every fenced block; a block left open at the end runs to the end."""
    blocks = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m.group(1)
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        body = []
        i += 1
        while i < len(lines) and not close.match(lines[i]):
            body.append(lines[i])
            i += 1
        blocks.append((m.group(2).lower(), "\n".join(body)))
        i += 1
    return blocks


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
        return True
    except (SyntaxError, ValueError):
        return False


def trim_to_parseable(code: str, prefix: str = "") -> str:
    """The longest leading run of whole lines of ``code`` that parses after ``prefix`` (text cut mid-statement)."""
    lines = code.rstrip().split("\n")
    while lines:
        candidate = "\n".join(lines) + "\n"
        if _parses(prefix + candidate):
            return candidate
        lines.pop()
    return ""


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^[ \t]*(async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code, re.M) is not None


def _is_example(node: ast.stmt, entry_point: str) -> bool:
    """An assignment that runs the solution or reads input: example usage, not part of the solution."""
    calls = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return bool(calls & {entry_point, "input", "print"})


def _keep_definitions(code: str, entry_point: str) -> str:
    """Imports, functions, classes and constants at top level; example calls, prints and asserts go."""
    tree = ast.parse(code)
    lines = code.split("\n")
    kept = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
                isinstance(node, (ast.Assign, ast.AnnAssign)) and not _is_example(node, entry_point)):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("\n".join(lines[first - 1:node.end_lineno]))
    return "\n\n".join(kept) + "\n" if kept else ""


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _used_names(code: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}


def _helpers_from(others: list[str], main: str) -> str:
    """Imports and definitions from the other blocks that ``main`` (or a helper it pulls in) uses."""
    pool: list[tuple[set[str], str]] = []
    for block in others:
        if not _parses(block):
            continue
        lines = block.split("\n")
        for node in ast.parse(block).body:
            names = _bound_names(node)
            if names:
                first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
                pool.append((names, "\n".join(lines[first - 1:node.end_lineno])))
    defined = {name for node in ast.parse(main).body for name in _bound_names(node)}
    needed = _used_names(main) - defined
    chosen: list[str] = []
    changed = True
    while changed:
        changed = False
        for names, source in pool:
            if source not in chosen and names & needed:
                chosen.append(source)
                defined |= names
                needed |= _used_names(source)
                needed -= defined
                changed = True
    return "\n\n".join(chosen) + "\n" if chosen else ""


def _from_blocks(blocks: list[str], entry_point: str) -> str | None:
    """The block defining the entry point (the last that parses, models correct themselves), plus helpers."""
    defining = [b for b in blocks if _defines(b, entry_point)]
    if not defining:
        return None
    whole = [b for b in defining if _parses(b)]
    chosen = whole[-1] if whole else defining[-1]
    main = chosen if whole else trim_to_parseable(chosen)
    if not _defines(main, entry_point):
        return None
    main = _keep_definitions(main, entry_point)
    others = [b for b in blocks if b is not chosen]
    return _helpers_from(others, main) + main


def _bare_code(text: str, entry_point: str) -> str:
    """Code around an unfenced definition of the entry point, with the prose before and after cut away."""
    lines = text.split("\n")
    def_line = next(i for i, l in enumerate(lines) if _defines(l, entry_point))
    start = def_line
    while start > 0:
        prev = lines[start - 1]
        if prev.strip() and not prev[0].isspace() and not _CODE_START.match(prev) and not prev.startswith("#"):
            break
        start -= 1
    end = def_line + 1
    while end < len(lines):
        line = lines[end]
        if line.strip() and not line[0].isspace() and not _CODE_START.match(line) and not line.startswith("#"):
            break
        end += 1
    code = trim_to_parseable(textwrap.dedent("\n".join(lines[start:end])))
    return _keep_definitions(code, entry_point) if code else ""


def reindent_body(body: str) -> str:
    """A function body at the prompt's four-space level, whatever indentation unit (or none) the model used."""
    lines = body.split("\n")
    first = next((l for l in lines if l.strip()), "")
    base = len(first) - len(first.lstrip(" "))
    if base == len(INDENT):
        return body
    indents = [len(l) - len(l.lstrip(" ")) for l in lines if l.strip()]
    if base == 0:
        return "\n".join(INDENT + l if l.strip() else l for l in lines)
    if all(i % base == 0 for i in indents):
        scale = len(INDENT) // base if len(INDENT) % base == 0 else None
        if scale:
            return "\n".join(" " * ((len(l) - len(l.lstrip(" "))) * scale) + l.lstrip(" ") if l.strip() else l
                             for l in lines)
    return body


def _completion_body(text: str) -> str:
    """A body continuing the prompt's stub, up to the first unindented line that is not a definition."""
    lines = text.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    if lines and not lines[0][0].isspace() and not _CODE_START.match(lines[0]):
        # a body the model wrote without indentation: indent all of it; the parse check cuts trailing prose
        lines = reindent_body("\n".join(lines)).split("\n")
    kept = []
    for line in lines:
        if line.strip() and not line[0].isspace() and not _CODE_START.match(line):
            break
        kept.append(line)
    return reindent_body("\n".join(kept))


def extract(completion: str, prompt: str, entry_point: str) -> Extraction:
    """The runnable program for one problem: the prompt followed by the code found in ``completion``."""
    text = expand_leading_tabs(normalize(completion))
    prompt = prompt.replace("\r\n", "\n")
    head = prompt if prompt.endswith("\n") else prompt + "\n"
    blocks = [body for tag, body in fenced_blocks(text) if tag in PYTHON_TAGS]
    if blocks:
        code = _from_blocks([textwrap.dedent(b) for b in blocks], entry_point)
        if code is not None:
            return Extraction(head + "\n\n" + code, code, "fenced")
        # blocks without the signature: a body meant to follow the stub
        body = trim_to_parseable(_completion_body(blocks[0]), prefix=head)
        return Extraction(head + body, body, "fenced" if body else "empty")
    if _defines(text, entry_point):
        code = _bare_code(text, entry_point)
        if code:
            return Extraction(head + "\n\n" + code, code, "bare")
    body = trim_to_parseable(_completion_body(text), prefix=head)
    return Extraction(head + body, body, "completion" if body.strip() else "empty")
