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
                  r"(?P<verdict>different but within ±\d+% \((?:faster|slower)\)|faster|slower|equivalent within ±\d+%|"
                  r"inconclusive|not measurable|no verdict: one launch per config|not compared: host busy|failed measurement: speculation never ran|"
                  r"not decided: the offered load sets throughput here|"
                  r"not decided: the users moved in lockstep, so the window's throughput moves by whole waves)")


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


# The "Speculative decoding" section (servesweep/report/speculative.py) and its first-screen line.
SPEC_SEGMENT = re.compile(r"`(?P<cfg>[^`]+)` on (?P<prompts>" + PROMPTS + r"), (?P<metric>per user|throughput): "
                          r"(?P<items>C=.*?) — (?P<cross>[^—]+?)\.(?= `|$)")
UNDECIDED_SEGMENT = re.compile(r"`(?P<cfg>[^`]+)`: where it pays is not decided — no verdict: one launch per config "
                               r"at every C")
ACCEPTANCE_ROW = re.compile(r"\| `(?P<cfg>[^`]+)` \| (?P<prompts>" + PROMPTS + r") \| (?P<c>\d+) \| "
                            r"(?P<length>[\d.]+|–)(?: ± (?P<half>[\d.]+))? \| (?P<rate>\d+ %|–) \|")
MEMORY = re.compile(r"(?P<prompts>" + PROMPTS + r") C=(?P<c>\d+): peak GPU memory (?P<mine>[\d,]+) MiB against "
                    r"(?P<base>[\d,]+) MiB \((?P<extra>[+-][\d,]+) MiB\)(?:, a step (?P<step>[\d.]+) ms against "
                    r"(?P<plain>[\d.]+) ms per plain decode step \((?P<k>[\d.]+)×\))?")


def _cells_row(cells: pd.DataFrame, cfg: str, label: str, c: int) -> pd.Series:
    workload, ctx = _prompts(label)
    sel = cells[(cells["config"] == cfg) & (cells["workload"] == workload) & (cells["concurrency"] == c)]
    if ctx is not None:
        sel = sel[sel["ctx"] == ctx]
    assert len(sel) == 1, f"`{cfg}` on {label} at C={c}: cells.csv has {len(sel)} such rows"
    return sel.iloc[0]


def _check_crossover(claim: str, points: list[tuple[int, str]]) -> None:
    """``claim`` (where speculation stops paying) against the (C, verdict) points it was written from."""
    faster = [str(v).startswith("faster") for _, v in points]
    verdict = dict(points)

    def leading_faster_below(b: int) -> list[int]:
        below = [c for c, _ in points if c < b]
        assert all(verdict[c].startswith("faster") for c in below), (claim, points)
        return below

    if m := re.fullmatch(r"pays at every C measured, up to C=(\d+)", claim):
        assert all(faster) and int(m[1]) == points[-1][0], (claim, points)
    elif m := re.fullmatch(r"stops paying at C=(\d+) \((.+); faster up to C=(\d+)\)", claim):
        below = leading_faster_below(int(m[1]))
        assert below and below[-1] == int(m[3]) and verdict[int(m[1])] == m[2], (claim, points)
        assert m[2].startswith(("slower", "equivalent")), claim
    elif m := re.fullmatch(r"does not pay at C=(\d+), the lowest C measured \((.+)\)", claim):
        assert int(m[1]) == points[0][0] and verdict[int(m[1])] == m[2], (claim, points)
        assert m[2].startswith(("slower", "equivalent")), claim
    elif m := re.fullmatch(r"not resolved between C=(\d+) and C=(\d+) \(faster at C=\1, inconclusive at C=\2\)", claim):
        below = leading_faster_below(int(m[2]))
        assert below and below[-1] == int(m[1]) and verdict[int(m[2])] == "inconclusive", (claim, points)
    elif m := re.fullmatch(r"not resolved at C=(\d+), the lowest C measured \(inconclusive\)", claim):
        assert int(m[1]) == points[0][0] and verdict[int(m[1])] == "inconclusive", (claim, points)
    elif m := re.fullmatch(r"no crossover claimed: C=(\d+) (.+?)(?: \(faster up to C=(\d+)\))?", claim):
        below = leading_faster_below(int(m[1]))
        assert verdict[int(m[1])] == m[2] and (below[-1] if below else None) == (int(m[3]) if m[3] else None)
        assert not m[2].startswith(("faster", "slower", "equivalent", "inconclusive")), claim
    else:
        raise AssertionError(f"a crossover the checks do not know: {claim!r}")


def _c_values(text: str) -> list[int]:
    return [int(c) for c in re.findall(r"C=(\d+)", text)]


def _check_tally(claim: str, points: list[tuple[int, str]]) -> None:
    """``claim`` ("faster at C=1 and C=4, slower at C=64", "faster at no C") against every point's verdict."""
    m = re.fullmatch(r"faster at (?P<faster>no C|C=\d+(?:(?:, | and )C=\d+)*)"
                     r"(?:, slower at (?P<slower>C=\d+(?:(?:, | and )C=\d+)*))?", claim)
    assert m, f"a tally the checks do not know: {claim!r}"
    faster = [] if m["faster"] == "no C" else _c_values(m["faster"])
    assert faster == [c for c, v in points if v.startswith("faster")], (claim, points)
    assert _c_values(m["slower"] or "") == [c for c, v in points if v.startswith("slower")], (claim, points)


def check_speculative_claims(text: str, speedup: pd.DataFrame, cells: pd.DataFrame) -> int:
    """Check every claim of the speculative-decoding section and its summary line: each point's ratio, interval and
    verdict, each crossover against the verdicts, the acceptance table and the memory and step-time figures."""
    speedup = speedup[speedup["load"] == "concurrency"] if "load" in speedup else speedup
    checked = 0
    for line in text.splitlines():
        if not line.startswith(("- `", "**Speculation**", "| `")):
            continue
        for seg in SPEC_SEGMENT.finditer(line):
            prefix = "per_request_" if seg["metric"] == "per user" else ""
            vcol = "per_request_verdict" if prefix else "verdict"
            for part in seg["items"].split("; C="):
                c, rest = part.removeprefix("C=").split(": ", 1)
                item = ITEM.match(f"`{seg['cfg']}` " + rest)
                assert item, (line, part)
                _same(item, _row(speedup, seg["cfg"], seg["prompts"], int(c)), prefix)
                checked += 1
            workload, ctx = _prompts(seg["prompts"])
            rows = speedup[(speedup["config"] == seg["cfg"]) & (speedup["workload"] == workload)]
            rows = (rows[rows["ctx"] == ctx] if ctx is not None else rows).sort_values("concurrency")
            points = [(int(r["concurrency"]), str(r[vcol])) for r in rows.to_dict("records")]
            cross, _, by_verdict = seg["cross"].partition("; by verdict: ")
            _check_crossover(cross, points)
            checked += 1
            if by_verdict:
                _check_tally(by_verdict, points)
                checked += 1
        for seg in UNDECIDED_SEGMENT.finditer(line):
            rows = speedup[speedup["config"] == seg["cfg"]]
            assert len(rows) and set(rows["verdict"]) | set(rows["per_request_verdict"]) == {
                "no verdict: one launch per config"}, line
            checked += 1
        if row := ACCEPTANCE_ROW.match(line):
            r = _cells_row(cells, row["cfg"], row["prompts"], int(row["c"]))
            if row["length"] == "–":
                assert pd.isna(r.get("accept_length")), line
            else:
                # as the report formats it (numpy's round() takes a tie such as 4.745 to the even digit)
                assert row["length"] == f"{r['accept_length']:.2f}", (line, r["accept_length"])
                if row["half"]:
                    assert row["half"] == f"{r['accept_length_ci95']:.2f}", line
            if row["rate"] != "–":
                assert int(row["rate"][:-2]) == round(100 * r["accept_rate"]), (line, r["accept_rate"])
            checked += 1
        against = re.match(r"- `(?P<cfg>[^`]+)`: .*Per cell against `(?P<base>[^`]+)`: ", line)
        for seg in MEMORY.finditer(line) if against else ():
            mine = _cells_row(cells, against["cfg"], seg["prompts"], int(seg["c"]))
            base = _cells_row(cells, against["base"], seg["prompts"], int(seg["c"]))
            assert seg["mine"] == f"{mine['gpu_mem_used_max_mib']:,.0f}", (line, mine["gpu_mem_used_max_mib"])
            assert seg["base"] == f"{base['gpu_mem_used_max_mib']:,.0f}", line
            assert seg["extra"] == f"{mine['gpu_mem_used_max_mib'] - base['gpu_mem_used_max_mib']:+,.0f}", line
            if seg["step"]:
                step, plain = 1000 * mine["accept_length"] / mine["per_request_tok_s"], 1000 / base["per_request_tok_s"]
                assert (seg["step"], seg["plain"], seg["k"]) == (f"{step:.2f}", f"{plain:.2f}", f"{step / plain:.2f}")
            checked += 1
    return checked
