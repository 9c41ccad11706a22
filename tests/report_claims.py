"""Every claim of a FINDINGS.md's verdict lines recomputed from the tables it was written from.

Instead of freezing the report's sentences, the tests parse what it says — every cell of the config × C tables (each
ratio, interval, mark and verdict against the baseline, and the baseline's own figures), "the only config measured",
the speculative section's crossovers — and check it against speedup.csv and cells.csv. A claim that contradicts the
tables fails, whatever its wording, and a table that leaves out or adds a comparison fails too.
"""
from __future__ import annotations

import re

import pandas as pd

PROMPTS = r"(?:synthetic \d+-token|[\w-]+) prompts"


def _prompts(label: str) -> tuple[str, int | None]:
    m = re.match(r"synthetic (\d+)-token prompts", label)
    return ("synthetic", int(m.group(1))) if m else (label.rsplit(" prompts", 1)[0], None)


# The tables of every config against the baseline (servesweep/report/matrix.py): a heading per prompt set and metric,
# then "| config | C=1 | ... |", the baseline's own figures, then one row per compared config.
TABLE_HEADING = re.compile(r"#### (?P<prompts>" + PROMPTS + r"): (?P<metric>per user|throughput) \(")
TABLE_CELL = re.compile(r"(?P<mark>\S) (?P<ratio>[^ ×]+)× (?:\[(?P<lo>[^,]+), (?P<hi>[^\]]+)\]|\(no interval\)) "
                        r"(?P<words>.+?)(?: \(~(?P<blocks>\d+) blocks\))?(?P<client> \(client-bound\))?")
# what a verdict of speedup.csv must read as in a table cell: (mark, words)
FIXED_MARKS = {"faster": ("▲", "faster"), "slower": ("▼", "slower"), "inconclusive": ("?", "inconclusive"),
               "not measurable": ("·", "not measurable"), "no verdict: one launch per config": ("·", "no verdict"),
               "not decided: the offered load sets throughput here": ("·", "not decided (the load's)"),
               "not decided: the users moved in lockstep, so the window's throughput moves by whole waves":
                   ("·", "not decided (lockstep)")}


def expected_mark(verdict: str) -> tuple[str, str]:
    """The mark and words a table must show for ``verdict``."""
    if verdict in FIXED_MARKS:
        return FIXED_MARKS[verdict]
    if m := re.fullmatch(r"equivalent within (±\d+%)", verdict):
        return "≈", f"equivalent {m[1]}"
    if m := re.fullmatch(r"different but within (±\d+% \((?:faster|slower)\))", verdict):
        return "≈", f"within {m[1]}"
    return "✕", verdict.split(":")[0]


def _number(text: str, value) -> None:
    assert text == ("–" if pd.isna(value) else f"{value:.2f}"), (text, value)


def _table_rows(lines: list[str], start: int) -> list[list[str]]:
    rows = []
    for line in lines[start:]:
        if not line.strip() and not rows:
            continue
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def check_tables(text: str, speedup: pd.DataFrame, cells: pd.DataFrame) -> int:
    """Every cell of every config × C table: the baseline's row against cells.csv, each other config's ratio,
    interval, mark and verdict against its speedup.csv row, and every comparison of the table's prompt set and metric
    shown exactly once (none missing, none added); every prompt set the baseline ran has both tables."""
    speedup = speedup[speedup["load"] == "concurrency"] if "load" in speedup else speedup
    cells = cells[cells["load"] == "concurrency"] if "load" in cells else cells
    lines, checked, tables = text.splitlines(), 0, set()
    baseline = None
    for i, line in enumerate(lines):
        heading = TABLE_HEADING.match(line)
        if not heading:
            continue
        workload, ctx = _prompts(heading["prompts"])
        prefix = "per_request_" if heading["metric"] == "per user" else ""
        verdict_col = "per_request_verdict" if prefix else "verdict"
        column = "per_request_tok_s" if prefix else "agg_output_tok_s"
        here = speedup[speedup["workload"] == workload]
        mine = cells[cells["workload"] == workload]
        if ctx is not None:
            here, mine = here[here["ctx"] == ctx], mine[mine["ctx"] == ctx]
        rows = _table_rows(lines, i + 1)
        assert rows[0][0] == "config" and all(re.fullmatch(r"C=\d+", h) for h in rows[0][1:]), rows[0]
        levels = [int(h[2:]) for h in rows[0][1:]]
        assert levels == sorted(set(mine["concurrency"].astype(int)) | set(here["concurrency"].astype(int))), levels
        shown = set()
        for row in rows[2:]:
            assert len(row) == len(levels) + 1, row
            cfg = re.match(r"`([^`]+)`", row[0])[1]
            if row[0] == f"`{cfg}` (baseline)":
                baseline = cfg
                base = mine[mine["config"] == cfg].set_index("concurrency")
                for c, value in zip(levels, row[1:]):
                    assert value == (f"{base.loc[c, column]:.1f}" if c in base.index else "–"), (row, c)
                    checked += c in base.index
                continue
            mine_rows = here[here["config"] == cfg]
            replicate = "family" in mine_rows and (mine_rows["family"] == "replicate check").any()
            assert row[0].endswith(" (replicate check)") == bool(replicate), row[0]
            for c, value in zip(levels, row[1:]):
                sel = mine_rows[mine_rows["concurrency"] == c]
                if value == "–":
                    assert sel.empty, (row[0], c, "a comparison speedup.csv has is missing")
                    continue
                assert len(sel) == 1, (row[0], c, f"speedup.csv has {len(sel)} such comparisons")
                r, cell = sel.iloc[0], TABLE_CELL.fullmatch(value)
                assert cell, value
                _number(cell["ratio"], r[f"{prefix}speedup"])
                if cell["lo"] is None:
                    assert pd.isna(r[f"{prefix}speedup_lo"]), value
                else:
                    _number(cell["lo"], r[f"{prefix}speedup_lo"])
                    _number(cell["hi"], r[f"{prefix}speedup_hi"])
                assert (cell["mark"], cell["words"]) == expected_mark(str(r[verdict_col])), (value, r[verdict_col])
                blocks = r.get("blocks_to_decide") if not prefix and r[verdict_col] == "inconclusive" else None
                assert cell["blocks"] == (None if blocks is None or pd.isna(blocks) else str(int(blocks))), value
                client = r.get("client_bound")
                assert bool(cell["client"]) == (pd.notna(client) and bool(client)), value
                shown.add((cfg, c))
                checked += 1
        assert shown == set(zip(here["config"], here["concurrency"].astype(int))), (heading.group(0), shown)
        tables.add((workload, ctx, heading["metric"]))
    if baseline is not None:  # every prompt set the baseline ran, both metrics
        ran = cells[cells["config"] == baseline]
        for workload, ctx in set(zip(ran["workload"], ran["ctx"])):
            key_ctx = int(ctx) if workload == "synthetic" else None
            assert {(workload, key_ctx, m) for m in ("per user", "throughput")} <= tables, (workload, ctx, tables)
    return checked


def check_claims(text: str, speedup: pd.DataFrame, cells: pd.DataFrame) -> int:
    """Check every verdict claim of ``text`` (the config × C tables, :func:`check_tables`, and "the only config
    measured" lines); returns how many were checked (a test asserts it is not 0)."""
    checked = check_tables(text, speedup, cells)
    for line in text.splitlines():
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
            if {"errors", "requests"} <= set(sel):    # a config none of whose requests succeeded measured nothing
                sel = sel[sel["errors"] < sel["requests"]]
            assert set(sel["config"]) == {only["cfg"]}, f"{line}: cells.csv has {sorted(set(sel['config']))} there"
            checked += 1
    return checked


# The "Speculative decoding" section (servesweep/report/speculative.py): its crossover table, acceptance and cost.
CROSSOVER_ROW = re.compile(r"\| `(?P<cfg>[^`]+)`[^|]* \| [^|]+ \| (?P<prompts>" + PROMPTS + r") \| "
                           r"(?P<metric>per user|throughput) \| (?P<cross>[^|]+) \| (?P<tally>[^|]+) \|")
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
    """Check every claim of the speculative-decoding section: each crossover and tally of its table against the
    verdicts, the acceptance table and the memory and step-time figures."""
    speedup = speedup[speedup["load"] == "concurrency"] if "load" in speedup else speedup
    checked = 0
    for line in text.splitlines():
        if not line.startswith(("- `", "| `")):
            continue
        if seg := CROSSOVER_ROW.fullmatch(line):
            vcol = "per_request_verdict" if seg["metric"] == "per user" else "verdict"
            workload, ctx = _prompts(seg["prompts"])
            rows = speedup[(speedup["config"] == seg["cfg"]) & (speedup["workload"] == workload)]
            rows = (rows[rows["ctx"] == ctx] if ctx is not None else rows).sort_values("concurrency")
            points = [(int(r["concurrency"]), str(r[vcol])) for r in rows.to_dict("records")]
            assert points, line
            _check_crossover(seg["cross"], points)
            _check_tally(seg["tally"], points)
            checked += 2
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
