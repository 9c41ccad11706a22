"""Every claim of a FINDINGS.md's verdict lines recomputed from the tables it was written from.

Instead of freezing the report's sentences, the tests parse what it says — each ratio, interval and verdict against
the baseline, each interactive/batch answer, "the only config measured" — and check it against speedup.csv and
cells.csv. A sentence that contradicts the tables fails, whatever its wording.
"""
from __future__ import annotations

import math
import re

import pandas as pd

PROMPTS = r"(?:synthetic \d+-token|[\w-]+) prompts"
ITEM = re.compile(r"`(?P<cfg>[^`]+)` (?P<ratio>[\d.]+)× (?:\[(?P<lo>[\d.]+), (?P<hi>[\d.]+)\]|\(no interval\)),? "
                  r"(?P<verdict>faster, within ±\d+%|slower, within ±\d+%|faster|slower|equivalent within ±\d+%|"
                  r"inconclusive|not measurable|no verdict: one launch per config|not compared: host busy|failed measurement: speculation never ran)")


def _prompts(label: str) -> tuple[str, int | None]:
    m = re.match(r"synthetic (\d+)-token prompts", label)
    return ("synthetic", int(m.group(1))) if m else (label.rsplit(" prompts", 1)[0], None)


def _row(speedup: pd.DataFrame, cfg: str, label: str, c: int) -> pd.Series:
    workload, ctx = _prompts(label)
    sel = speedup[(speedup["config"] == cfg) & (speedup["workload"] == workload) & (speedup["concurrency"] == c)]
    if ctx is not None:
        sel = sel[sel["ctx"] == ctx]
    assert len(sel) == 1, f"the report names `{cfg}` on {label} at C={c}, which speedup.csv has {len(sel)} times"
    return sel.iloc[0]


def _same(item: re.Match, row: pd.Series, prefix: str) -> None:
    ratio = row[f"{prefix}speedup"]
    assert float(item["ratio"]) == round(ratio, 2), (item.group(0), ratio)
    if item["lo"] is not None:
        assert float(item["lo"]) == round(row[f"{prefix}speedup_lo"], 2) and \
            float(item["hi"]) == round(row[f"{prefix}speedup_hi"], 2), (item.group(0), row)
    else:
        assert math.isnan(row[f"{prefix}speedup_lo"])
    verdict = row["verdict" if not prefix else "per_request_verdict"]
    assert item["verdict"] == verdict, (item.group(0), verdict)


def check_claims(text: str, speedup: pd.DataFrame, cells: pd.DataFrame) -> int:
    """Check every verdict claim of ``text``; returns how many were checked (a test asserts it is not 0)."""
    speedup = speedup[speedup["load"] == "concurrency"] if "load" in speedup else speedup
    checked = 0
    for line in text.splitlines():
        found = re.match(r"- `(?P<cfg>[^`]+)` on (?P<prompts>" + PROMPTS + r")(?: \([^)]*\))?: (?P<series>C=.*)",
                         line)
        if found:  # per-config findings against the baseline
            for part in re.finditer(r"C=(\d+): ", found["series"]):
                c = int(part.group(1))
                rest = found["series"][part.end():]
                item = ITEM.match(f"`{found['cfg']}` " + rest)
                assert item, line
                _same(item, _row(speedup, found["cfg"], found["prompts"], c), "")
                checked += 1
            continue
        answer = re.match(r"\*\*(Interactive|Batch)\*\* \([^)]*(?:\([^)]*\))?[^)]*\) — (.*)", line)
        if answer:
            prefix = "per_request_" if answer.group(1) == "Interactive" else ""
            for seg in re.finditer(r"(?P<prompts>" + PROMPTS + r"), C=(?P<c>\d+): (?P<body>.*?)(?=(?: " + PROMPTS
                                   + r", C=\d+:)|$)", answer.group(2)):
                c = int(seg["c"])
                head = re.match(r"\*\*`([^`]+)`\*\* is faster than", seg["body"])
                against = seg["body"].split("): ", 1)[-1]
                for item in ITEM.finditer(against):
                    _same(item, _row(speedup, item["cfg"], seg["prompts"], c), prefix)
                    checked += 1
                if head:
                    row = _row(speedup, head.group(1), seg["prompts"], c)
                    assert str(row["per_request_verdict" if prefix else "verdict"]).startswith("faster"), line
        only = re.match(r"- (?P<cell>.*?C=(?P<c>\d+)): `(?P<cfg>[^`]+)` \([\d.]+ tok/s\), the only config measured",
                        line)
        if only:
            c = int(only["c"])
            where = only["cell"].rsplit(" C=", 1)[0]
            sel = cells[cells["concurrency"] == c]
            if where.startswith("ctx="):
                sel = sel[(sel["workload"] == "synthetic") & (sel["ctx"] == int(where[4:]))]
            else:
                sel = sel[sel["workload"] == where]
            assert set(sel["config"]) == {only["cfg"]}, f"{line}: cells.csv has {sorted(set(sel['config']))} there"
            checked += 1
    return checked
