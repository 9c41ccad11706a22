"""Snapshot the command-line flags one SGLang version accepts, so tests can check argv without SGLang.

From an install (argparse introspection of ``ServerArgs.add_cli_args``)::

    python3 benchmarks/sglang_flags.py --out tests/data/sglang-flags-0.5.17.json

From a ``server_args.py`` source file (field metadata and the manual ``add_argument`` registrations), optionally
restricted to the ServerArgs fields a real server of the target version printed in its log
(``server_args=ServerArgs(...)``)::

    python3 benchmarks/sglang_flags.py --source server_args.py --fields-from-log server.log \\
        --version 0.5.17 --origin "<where the source came from>" --out tests/data/sglang-flags-0.5.17.json
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesweep.engines.sglang import installed_sglang_flags  # noqa: E402


def _field_cli(node: ast.AnnAssign) -> dict | None:
    """CLI metadata of one ``name: A[T, "help" | Arg(...), NS(...)]`` field; None when it has no CLI surface."""
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id in ("A", "Annotated")):
        return None
    parts = ann.slice.elts[1:] if isinstance(ann.slice, ast.Tuple) else []
    meta = {"aliases": [], "cli_name": None, "negatable": False}
    for part in parts:
        if isinstance(part, ast.Constant) and isinstance(part.value, str) or isinstance(part, (ast.BinOp, ast.JoinedStr)):
            return meta  # a bare help string: derived flag only
        if isinstance(part, ast.Call) and getattr(part.func, "id", None) == "Arg":
            for kw in part.keywords:
                if kw.arg == "no_cli" and isinstance(kw.value, ast.Constant) and kw.value.value:
                    return None
                if kw.arg == "aliases":
                    meta["aliases"] = [e.value for e in kw.value.elts]
                if kw.arg == "cli_name":
                    meta["cli_name"] = kw.value.value
                if kw.arg == "action" and ast.unparse(kw.value).endswith("BooleanOptionalAction"):
                    meta["negatable"] = True
            return meta
    return None  # no help and no Arg: SGLang skips the field (or registers it by hand below)


def _flags_of_field(name: str, meta: dict) -> list[str]:
    primary = meta["cli_name"] or "--" + name.replace("_", "-")
    names = [primary, *meta["aliases"]]
    if meta["negatable"]:
        names += ["--no-" + n[2:] for n in names]
    return names


def flags_from_source(text: str, fields: list[str] | None = None) -> list[str]:
    """Every option string that ``server_args.py`` source registers.

    With ``fields`` (the ServerArgs fields of the target version), field-derived flags are limited to those
    fields, and a listed field the source does not declare gets its derived primary flag.
    """
    tree = ast.parse(text)
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    declared: dict[str, dict | None] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and not node.target.id.startswith("_"):
            declared[node.target.id] = _field_cli(node)
    manual: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            manual |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    flags = set(manual)
    for name in (fields if fields is not None else declared):
        if name not in declared:
            flags.add("--" + name.replace("_", "-"))
        elif declared[name] is not None:
            flags.update(_flags_of_field(name, declared[name]))
    return sorted(flags)


def fields_from_log(text: str) -> list[str]:
    """ServerArgs field names from the ``server_args=ServerArgs(...)`` line a server logs at start."""
    line = next(l for l in text.splitlines() if "server_args=ServerArgs(" in l)
    body = line.split("server_args=ServerArgs(", 1)[1]
    # Nested values (dicts, CudaGraphConfig(...)) carry keys of their own; only depth-0 names are fields.
    names, depth, token = [], 0, ""
    for ch in body:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if depth == 0 and ch == "=" and re.fullmatch(r"[a-z_][a-z0-9_]*", token.strip()):
            names.append(token.strip())
        token = "" if (depth == 0 and ch in ",=") else token + ch
        if depth < 0:
            break
    return names


def main(argv: list[str] | None = None) -> int:
    """Write a flag snapshot JSON from an install or from source."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--source", type=Path, help="a server_args.py to read instead of the installed SGLang")
    ap.add_argument("--fields-from-log", type=Path, help="a real server log of the target version")
    ap.add_argument("--version", help="the SGLang version the snapshot stands for (required with --source)")
    ap.add_argument("--origin", default="", help="where --source came from (repository, path, commit)")
    args = ap.parse_args(argv)
    if args.source:
        if not args.version:
            ap.error("--version is required with --source")
        fields = fields_from_log(args.fields_from_log.read_text()) if args.fields_from_log else None
        flags = flags_from_source(args.source.read_text(), fields)
        made_from = {"kind": "server_args.py source", "origin": args.origin or str(args.source),
                     "fields_from_log": str(args.fields_from_log) if args.fields_from_log else None,
                     "field_count": len(fields) if fields is not None else None}
        version = args.version
    else:
        installed = installed_sglang_flags()
        if installed is None:
            print("SGLang is not importable here; use --source", file=sys.stderr)
            return 1
        version, accepted = installed
        flags, made_from = sorted(accepted), {"kind": "installed SGLang argparse", "origin": sys.executable}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sglang_version": version, "made_from": made_from, "flags": flags}, indent=1) + "\n")
    print(f"{len(flags)} flags for SGLang {version} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
