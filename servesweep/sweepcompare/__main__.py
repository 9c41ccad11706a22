"""``python -m servesweep.sweepcompare A B [C ...] --out DIR``: compare result folders (docs/compare.md)."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from servesweep.decide import Rule
from servesweep.sweepcompare import compare_folders


def _mapping(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, common = item.partition("=")
        if not sep or not name or not common:
            raise SystemExit(f"--map {item!r}: write NAME=COMPARED_AS (a config's name in a run = the name compared)")
        out[name] = common
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m servesweep.sweepcompare",
                                 description="Compare result folders (runs/<cfg>/ with cells.csv, repeats.csv, "
                                             "meta.json): consecutive pairs, cell by cell.")
    ap.add_argument("folders", type=Path, nargs="+", help="result folders, oldest first")
    ap.add_argument("--out", type=Path, required=True, help="where COMPARE.md, comparisons.csv and the charts go")
    ap.add_argument("--map", action="append", default=[], metavar="NAME=COMPARED_AS",
                    help="compare config NAME (in any run) as COMPARED_AS; repeatable")
    ap.add_argument("--reference", help="the config the session shift is read from (default: the first run's "
                                        "baseline, from its config.yaml)")
    ap.add_argument("--changelog", type=Path, help="the append-only changelog (default: OUT/changelog.jsonl)")
    ap.add_argument("--alpha", type=float, default=Rule.alpha, help="false-discovery rate per family")
    ap.add_argument("--margin", type=float, default=Rule.margin, help="equivalence margin")
    ap.add_argument("--no-charts", action="store_true", help="skip the charts")
    args = ap.parse_args(argv)
    if len(args.folders) < 2:
        ap.error("give two or more result folders")
    command = "python -m servesweep.sweepcompare " + shlex.join(sys.argv[1:] if argv is None else argv)
    compare_folders(args.folders, args.out, _mapping(args.map), args.reference,
                    Rule(alpha=args.alpha, margin=args.margin), args.changelog, command=command,
                    charts=not args.no_charts)
    print(args.out / "COMPARE.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
