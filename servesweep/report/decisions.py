"""The evidence behind the report's answers: the sweep's resolution and flags, the failed launches, how to read the
verdicts, the ranking per cell, the replicate check, drops with concurrency and the launch-order check (each
config's ratios to the baseline are tabled by ``servesweep.report.matrix``).

Every comparison comes from the speedup table (``aggregate.speedup_table``: the sweep's rule, one family) or is
decided here in a family of its own that the text names. Margins are only ever between cells of the same workload,
prompt length and concurrency.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from servesweep import compare, decide
from servesweep.launch_failure import STAGES, remeasure_command
from servesweep.plan import run_folder
from servesweep.engines.base import cell_label

LOW, HIGH = "interactive", "batch"


def _num(x, spec=".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def prompts_label(workload: str, ctx) -> str:
    return f"synthetic {int(ctx)}-token prompts" if workload == "synthetic" else f"{workload} prompts"


def ratio_text(ratio, lo, hi) -> str:
    return f"{_num(ratio)}×" + (f" [{_num(lo)}, {_num(hi)}]" if pd.notna(lo) else " (no interval)")


def verdict_words(verdict: str, blocks_to_decide=None) -> str:
    """A verdict as the report prints it: inconclusive says how many blocks would likely decide it."""
    if verdict == decide.INCONCLUSIVE and blocks_to_decide is not None and pd.notna(blocks_to_decide):
        return f"inconclusive (about {int(blocks_to_decide)} blocks would likely decide it)"
    return verdict


def _closed(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["load"] == "concurrency"] if "load" in df else df


def _sweep_family(speedup: pd.DataFrame) -> pd.DataFrame:
    closed = _closed(speedup)
    return closed[closed["family"] == "sweep"] if "family" in closed else closed


def mde_parts(sweep: pd.DataFrame, worst: bool = True) -> tuple[list[str], bool]:
    """The smallest differences the sweep's comparisons could have seen: the median MDE per user at the lowest C and
    in throughput at the highest (with the largest where it is worse, if ``worst``), and whether either median is
    beyond what the report shows as a figure."""
    parts, unusable = [], False
    if sweep.empty:
        return parts, unusable
    for level, metric, label in ((sweep["concurrency"].min(), "per_request_mde", "per user"),
                                 (sweep["concurrency"].max(), "mde", "throughput")):
        at = sweep[sweep["concurrency"] == level]
        if metric == "mde" and "verdict" in at:  # throughput whose window held whole waves of users is not decided
            at = at[at["verdict"] != decide.LOCKSTEP]
        mdes = at[metric].dropna()
        if len(mdes):
            most = (f" (up to {decide.mde_text(mdes.max())})" if worst and mdes.max() > mdes.median() + 1e-9
                    and mdes.median() <= decide.MDE_SHOWN_MAX else "")
            parts.append(f"{decide.mde_text(mdes.median())} {label} at C={int(level)}{most}")
            unusable = unusable or mdes.median() > decide.MDE_SHOWN_MAX
    return parts, unusable


def resolution_line(speedup: pd.DataFrame, design: dict) -> list[str]:
    """The first screen's resolution in one sentence: blocks, comparisons, the smallest differences seen."""
    blocks = design.get("blocks", 0)
    parts, _ = mde_parts(_sweep_family(speedup), worst=False)
    rule = design.get("rule") or {}
    launches = f"{blocks} block{'s' if blocks != 1 else ''}" if blocks else "one launch per config"
    text = (f"**Resolution**: {launches}, {design.get('comparisons', 0)} comparisons at a false-discovery rate of "
            f"{100 * rule.get('alpha', 0.05):.2g} %")
    text += ("; smallest difference seen: " + ", ".join(parts) + "." if parts else "; no comparison had an interval.")
    if design.get("adaptive"):
        text += f" {adaptive_stop(design['adaptive'])}."
    return [text, ""]


def adaptive_stop(look: dict) -> str:
    """What an adaptive sweep's stop was (``design.blocks: auto``; noise.json ``adaptive``)."""
    why = {"decided": "every first-screen comparison was decided",
           "last look": "it was the last look planned",
           "budget": "the next look would have passed `design.budget_min`"}.get(look["reason"], look["reason"])
    return (f"Blocks were added at looks (`design.blocks: auto`): the sweep stopped at look {look['look'] + 1} of "
            f"{look['looks']} ({look['blocks']} blocks) because {why}, and is decided at that look's share of the "
            f"error rate, {100 * look['level']:.2g} % of the sweep's {100 * look['alpha']:.2g} %")


def unpaired_clause(sweep: pd.DataFrame) -> str:
    """What the unpaired comparisons of the sweep used: every launch of both configs, the fewest launches a side,
    and the range of their degrees of freedom ("" where there are none)."""
    if "design" not in sweep:
        return ""
    welch = sweep[sweep["design"] == decide.UNPAIRED]
    dfs = pd.concat([pd.to_numeric(welch.get(c, pd.Series(dtype=float)), errors="coerce")
                     for c in ("df", "per_request_df")]).dropna()
    dfs = dfs[dfs > 0]
    if welch.empty or dfs.empty:
        return ""
    n = int(pd.to_numeric(welch["blocks"], errors="coerce").min())
    span = f"{dfs.min():.1f}" + (f"–{dfs.max():.1f}" if dfs.max() - dfs.min() >= 0.05 else "")
    cells = f"{len(welch)} cell{'s' if len(welch) != 1 else ''}"
    return (f"; the unpaired comparisons ({cells}) used every launch of both configs ({n}+ a side, Welch on the log "
            f"launch means, df {span}) where pairing by block would have left a launch out")


def resolution(speedup: pd.DataFrame, design: dict) -> list[str]:
    """What this sweep could have seen: its blocks and rounds, its rule, and the minimum detectable effect at the
    lowest and highest concurrency."""
    rule = design.get("rule") or {}
    blocks = design.get("blocks", 0)
    rounds = design.get("rounds_per_launch") or []
    designs = design.get("designs") or {}
    sweep = _sweep_family(speedup)
    parts, unusable = mde_parts(sweep)
    made = ", ".join(f"{n} {d}" for d, n in sorted(designs.items())) or "none decided"
    paired = sweep[sweep["design"].astype(str).str.startswith(decide.PAIRED)] if "design" in sweep else sweep.iloc[0:0]
    used = pd.to_numeric(paired.get("blocks", pd.Series(dtype=float)), errors="coerce").dropna()
    if blocks and len(used) and used.min() < blocks:
        span = f"{int(used.min())}" + (f"–{int(used.max())}" if used.max() > used.min() else "")
        made += (f"; the paired comparisons used {span} of the {blocks} blocks: neither config has a launch in the "
                 "others (left out beside a busy neighbour after its re-measures, failed, or never run)")
    made += unpaired_clause(sweep)
    measured = design.get("launches") or {}
    if not blocks:
        launches = "one launch per config, one config after another (recorded before the sweep was measured in blocks)"
    elif any(n < blocks for n in measured.values()):
        launches = (f"{blocks} blocks, but not every config was measured in each: "
                    + ", ".join(f"`{c}` {n} launch{'es' if n != 1 else ''}" for c, n in sorted(measured.items()))
                    + " (a block a config is missing from gives its comparisons no pair there)")
    else:
        launches = (f"{blocks} block{'s' if blocks != 1 else ''} (every config launched {blocks} "
                    f"time{'s' if blocks != 1 else ''}, in the order the design drew for each block)")
    text = (f"**Resolution** — {launches}, {'/'.join(map(str, rounds)) or '?'} round(s) of the matrix per launch; "
            f"{design.get('comparisons', 0)} comparisons against the baseline ({made}), false-discovery rate "
            f"{100 * rule.get('alpha', 0.05):.0f} % over them (Benjamini–Hochberg), equivalence margin "
            f"±{100 * rule.get('margin', 0.05):.0f} %. ")
    if parts:
        text += (f"Smallest difference this sweep would have seen with {100 * rule.get('power', 0.8):.0f} % power: "
                 + "; ".join(parts) + ".")
        if unusable:
            cap = decide.MDE_SHOWN_MAX
            text += (f" Beyond ±{100 * cap:,.0f} %: even a {cap + 1:.0f}× ratio there could have gone unseen, so a "
                     "comparison there that is not decided says nothing about its size; more blocks narrow it "
                     "(`design.blocks`).")
    elif design.get("undecided"):
        text += (f"Its {design['undecided']} comparisons rest on one launch per config, whose intervals leave "
                 "launch-to-launch variation out, so none is decided and no resolution can be stated; measure the "
                 "sweep in blocks (`design.blocks`) to decide them.")
    else:
        text += "No comparison had an interval, so this sweep could not have seen any difference."
    return [text, ""]


def flags(design: dict, speedup: pd.DataFrame) -> list[str]:
    """What the reader must know before acting: the replicate check, designs weaker than paired blocks."""
    out = []
    for cfg, why in sorted((design.get("untrusted") or {}).items()):
        out.append(f"**`{cfg}` is left out of every ranking and pick**: {why}.")
    for cfg, what in sorted((design.get("stream_faults") or {}).items()):
        if cfg not in (design.get("untrusted") or {}):
            out.append(f"**`{cfg}` misbehaved**: {what}.")
    out += lockstep_flags(design.get("lockstep") or [])
    checks = design.get("replicate_check") or []
    if checks:
        differs = design.get("replicate_differs") or []
        copies = sorted({c["config"] for c in checks})
        if differs:
            out.append(f"**The replicate check failed**: {', '.join(f'`{c}`' for c in differs)}, launched exactly "
                       "like the baseline, was called different from it (Replicate check below) — the design did "
                       "not hold this sweep's noise; read every verdict with care.")
        else:
            out.append(f"Replicate check: {', '.join(f'`{c}`' for c in copies)}, launched exactly like the baseline, "
                       f"was called different in none of its {len(checks)} cells, as expected.")
    # Blocks split alike (the same configs in the same runs: a config added or re-measured in a later run splits
    # every block) share one sentence.
    alike: dict[tuple, list[int]] = {}
    for split in design.get("split_blocks") or []:
        key = tuple((run, tuple(cfgs)) for run, cfgs in split["runs"].items())
        alike.setdefault(key, []).append(split["block"])
    for runs, blocks in alike.items():
        parts = "; ".join(f"{', '.join(f'`{c}`' for c in cfgs)} in run `{run}`" for run, cfgs in runs)
        which = (f"Block {blocks[0]} was" if len(blocks) == 1 else
                 f"Blocks {', '.join(map(str, blocks[:-1]))} and {blocks[-1]} were each")
        out.append(f"{which} measured in {len(runs)} runs ({parts}): across runs {'its' if len(blocks) == 1 else 'their'} "
                   "launches are compared unpaired, every launch kept (Welch); a run resumed at once keeps its pairs "
                   f"given the first one's id, `SERVESWEEP_RUN={runs[0][0]} snakemake …` (docs/measurement.md, "
                   "\"Blocks\").")
    sweep = speedup[speedup["family"] == "sweep"] if "family" in speedup else speedup
    weak = sweep[sweep["design"].isin([decide.UNPAIRED, decide.ONE_LAUNCH])] if "design" in sweep else sweep.iloc[0:0]
    if len(weak):
        kinds = sorted(set(weak["design"]))
        # configs with one launch in a sweep of two or more blocks: a launch is missing, not split across runs
        measured = design.get("launches") or {}
        single = sorted(c for c in set(weak["config"]) if measured.get(c, 2) < 2 <= design.get("blocks", 0))
        one = len(single) == 1
        if decide.ONE_LAUNCH in kinds:
            why = ("their configs ran one launch each, so launch-to-launch variation is not in their intervals. "
                   "Measure the sweep in blocks to decide them")
        elif single:
            why = (f"{', '.join(f'`{c}`' for c in single)} measured only one launch{'' if one else ' each'} of the "
                   f"{design['blocks']} blocks, so {'its' if one else 'their'} comparisons have one launch on one "
                   "side and no interval. Measure the missing launches (the same `snakemake` command runs only what "
                   "is missing) to decide them")
        else:
            why = ("a launch of either config had no partner in its block, so each uses every launch of both, "
                   "unpaired, and drift between launches is not cancelled; measure the missing launches to pair them")
        out.append(f"{len(weak)} of {len(sweep)} comparisons are not paired in time ({', '.join(kinds)}): "
                   + why + " (docs/measurement.md, \"Blocks\").")
    return [f"**Flags** — {' '.join(out)}", ""] if out else []


def lockstep_flags(cells: list[dict]) -> list[str]:
    """A sentence per session cell whose users moved in lockstep (noise.json ``lockstep``)."""
    out = []
    for (workload, ctx, c), group in pd.DataFrame(cells).groupby(["workload", "ctx", "concurrency"]) if cells else []:
        few, most, period = group["waves_min"].min(), group["waves_max"].max(), group["wave_period_s"].median()
        waves, step = ((f"{few:.0f}", f"{100 / few:.0f} %") if round(few) == round(most) else
                       (f"{few:.0f}–{most:.0f}", f"{100 / most:.0f}–{100 / few:.0f} %"))
        out.append(f"**Users moved in lockstep** at {workload} C={c:g} "
                   f"({', '.join(f'`{x}`' for x in sorted(group['config']))}): {waves} whole waves a window, so "
                   f"throughput moves in steps of {step} whatever the server does and is not decided there; "
                   f"`matrix.measure.seconds` ≥ {compare.LOCKSTEP_FEW_WAVES * period:.0f} would hold "
                   f"{compare.LOCKSTEP_FEW_WAVES} waves (docs/measurement.md, \"Users in lockstep\").")
    return out


def _clip(line: str, most: int = 240) -> str:
    return line if len(line) <= most else line[:most - 1] + "…"


def reason_line(reason) -> str:
    """A failure's reason on one line: its first line and, where it goes on (an error that quotes the server's
    log), its last one; the whole text is in meta.json."""
    lines = [line.strip() for line in str(reason or "").strip().splitlines() if line.strip()]
    if not lines:
        return "no reason recorded"
    return _clip(lines[0]) + (f" … `{_clip(lines[-1])}`" if len(lines) > 1 else "")


def failures(metas: list[dict]) -> list[str]:
    """The launches that failed on their job's last attempt, config by config (``failed_blocks`` of each run's
    meta.json): the stage and reason of each, which blocks the config's figures rest on instead, where what they
    measured is kept, and the command that measures them again."""
    parts, kept, again = [], [], []
    for meta in sorted(metas, key=lambda m: m.get("config", "")):
        failed = meta.get("failed_blocks") or []
        if not failed:
            continue
        cfg = meta["config"]
        blocks = [b.get("block") for b in meta.get("blocks") or [meta]]
        finished = [b for b in blocks if b not in {f["block"] for f in failed}]
        why: dict[tuple, list] = {}
        for f in failed:
            # the same error in two blocks reads alike: each block's attempt folder is named below
            reason = reason_line(str(f.get("reason")).replace(f.get("attempt_dir") or "\0", "<attempt>"))
            why.setdefault((f.get("stage", "unknown"), reason), []).append(f["block"])
        reasons = "; ".join(f"block{'s' if len(bs) > 1 else ''} {', '.join(map(str, bs))}: {stage} "
                            f"({STAGES.get(stage, 'stage not recorded')}) — {reason}"
                            for (stage, reason), bs in why.items())
        if finished:
            plural = "s" if len(finished) > 1 else ""
            parts.append(f"`{cfg}`: {len(failed)} of {len(blocks)} launches failed ({reasons}); its cells and "
                         f"comparisons are over the block{plural} that finished (block{plural} "
                         f"{', '.join(map(str, finished))}).")
        else:
            parts.append(f"`{cfg}` failed in every launch and is in no table ({reasons}).")
        for f in failed:
            if f.get("attempt_dir"):
                kept.append(f"`{f['attempt_dir']}/` ({f.get('cells_measured', 0)} cell(s))")
            again.append(run_folder(Path("results"), cfg, f["block"]) / "meta.json")
    if not parts:
        return []
    text = "**Failed** — " + " ".join(parts)
    if kept:
        text += " What the failed launches measured before failing is kept in " + ", ".join(kept) + "."
    text += (f" To measure them again, with the sweep's `--configfile=…` if it has one: `{remeasure_command(again)}`"
             " (docs/faults.md).")
    return [text, ""]


def how_to_read(design: dict) -> list[str]:
    rule = design.get("rule") or {}
    m = 100 * rule.get("margin", 0.05)
    return ["## How to read the verdicts", "",
            "Each config is compared with the baseline at the same cell (prompts and concurrency). The ratio is the "
            "geometric mean over blocks of the two configs' launch means, paired within each block (one launch of "
            "every config, in turn), with its 95 % t interval over the blocks: launch-to-launch variation and drift "
            "are inside it. **faster / slower**: the difference test rejects \"no difference\" at the sweep's "
            f"false-discovery rate ({100 * rule.get('alpha', 0.05):.0f} %, Benjamini–Hochberg over all "
            f"comparisons). **equivalent within ±{m:.0f} %**: both one-sided tests (TOST) place the ratio inside "
            f"[1/(1+{m / 100:g}), 1+{m / 100:g}] under the same control. **inconclusive**: neither — with how many "
            "blocks would likely decide it. A 95 % interval that excludes 1 can still be inconclusive: the rule "
            "asks more of each comparison because the sweep makes many. The minimum detectable effect (MDE) of a "
            "comparison is the smallest difference it would find with 80 % power at the strictest level the "
            "control can ask (alpha / comparisons). docs/measurement.md has the design, the rule and its measured "
            "error rates.", ""]


def ranking(cells: pd.DataFrame, speedup: pd.DataFrame, baseline: str) -> list[str]:
    """Per cell: every config by output tok/s (means over launches), each other config's verdict against the
    baseline, and the configs left out of the ranking with the reason."""
    from servesweep.trust import untrusted_configs

    lines = []
    cells = _closed(cells)
    untrusted = untrusted_configs(cells)
    for (workload, ctx, conc), g in cells.groupby(["workload", "ctx", "concurrency"], sort=True):
        client = g[g["client_bound"].fillna(False).astype(bool)] if "client_bound" in g else g.iloc[0:0]
        liars = g[g["config"].isin(untrusted)]
        ranked = g.drop(client.index.union(liars.index)).sort_values("agg_output_tok_s", ascending=False)
        client = client.drop(liars.index, errors="ignore")
        sp = speedup[(speedup["workload"] == workload) & (speedup["ctx"] == ctx) & (speedup["concurrency"] == conc)]
        verdicts = {r["config"]: r["verdict"] for r in sp.to_dict("records")}
        order = " > ".join(f"`{r['config']}` {r['agg_output_tok_s']:.1f}"
                           + (f" ({verdicts[r['config']]})" if r["config"] in verdicts else
                              " (baseline)" if r["config"] == baseline else "")
                           for r in ranked.to_dict("records"))
        left = (" Left out: " + ", ".join(f"`{r['config']}` ({r['agg_output_tok_s']:.1f}, client-bound: the "
                                          "client's pace, not the server's)" for r in client.to_dict("records"))
                + ".") if len(client) else ""
        if len(liars):
            left += " Left out: " + ", ".join(f"`{c}` ({untrusted[c]})" for c in liars["config"]) + "."
        label = cell_label({"workload": workload, "ctx": ctx, "concurrency": int(conc)})
        if ranked.empty:
            lines.append(f"- {label}: no config measured server-bound.{left}")
        elif len(ranked) == 1 and not len(client):
            lines.append(f"- {label}: `{ranked.iloc[0]['config']}` ({ranked.iloc[0]['agg_output_tok_s']:.1f} "
                         "tok/s), the only config measured.")
        else:
            lines.append(f"- {label}: {order} tok/s.{left}")
    return lines


def replicate_section(design: dict) -> list[str]:
    checks = design.get("replicate_check") or []
    if not checks:
        return []
    lines = ["Replicate check (identical copies of the baseline, decided as their own family; expected: nothing "
             "called):", ""]
    for c in checks:
        rate = c.get("load") == "rate"  # an open-loop cell is named by its rate, not as "C=<rate>"
        where = c | ({"concurrency": None, "request_rate": c["level"]} if rate else {"concurrency": c["level"]})
        lines.append(f"- `{c['config']}` {cell_label(where)}: "
                     f"{ratio_text(c['ratio'], c['lo'], c['hi'])} {c['verdict']}; per user "
                     f"{_num(c['per_request_ratio'])}× {c['per_request_verdict']}.")
    return lines + [""]


def concurrency_drops(cells: pd.DataFrame, repeats: pd.DataFrame | None, rule: decide.Rule | None = None) -> list[str]:
    """Cells where more concurrency lowered a config's throughput, called by the sweep's rule (one family: every
    step up in C of every config), paired within launches (both cells were measured by the same servers)."""
    if repeats is None or repeats.empty:
        return []
    rule = rule or decide.Rule()
    cells, repeats = _closed(cells), _closed(repeats)
    if "workload" not in cells:
        cells = cells.assign(workload="synthetic")
    if "workload" not in repeats:
        repeats = repeats.assign(workload="synthetic")
    steps = []
    for (cfg, workload, ctx), g in cells.sort_values("concurrency").groupby(["config", "workload", "ctx"]):
        rows = g.to_dict("records")
        for prev, now in zip(rows, rows[1:]):
            sel = repeats[(repeats["config"] == cfg) & (repeats["workload"] == workload) & (repeats["ctx"] == ctx)]
            est = compare.estimate(sel[sel["concurrency"] == prev["concurrency"]],
                                   sel[sel["concurrency"] == now["concurrency"]], "agg_output_tok_s")
            steps.append((cfg, prev, now, est))
    out = []
    for (cfg, prev, now, est), d in zip(steps, decide.decide([s[3] for s in steps], rule)):
        if d.verdict.startswith(decide.SLOWER):
            out.append(f"- `{cfg}` {cell_label(prev).rsplit(' C=', 1)[0]}: throughput falls from "
                       f"{prev['agg_output_tok_s']:.1f} tok/s at C={int(prev['concurrency'])} to "
                       f"{now['agg_output_tok_s']:.1f} at C={int(now['concurrency'])} "
                       f"({ratio_text(est.ratio, est.lo, est.hi)}, slower by the sweep's rule over {len(steps)} such "
                       "steps): more concurrency lowers throughput here; the cause is not measured by these columns.")
    return out


def order_effect(repeats: pd.DataFrame | None, metas: list[dict]) -> list[str]:
    """Whether launching first in a block mattered: the mean log-ratio of a launch to its config's other launches
    of the same cell, by planned position in the block (a check of the design's balance, not a verdict)."""
    if repeats is None or repeats.empty or "block_position" not in repeats or repeats["block"].nunique() < 2:
        return []
    import numpy as np

    launch = (compare.quiet(repeats).groupby(["config", "workload", "ctx", "concurrency", "block", "block_position"])
              ["agg_output_tok_s"].mean().reset_index())
    launch = launch[launch["agg_output_tok_s"] > 0]
    launch["log"] = np.log(launch["agg_output_tok_s"])
    launch["dev"] = launch["log"] - launch.groupby(["config", "workload", "ctx", "concurrency"])["log"].transform("mean")
    by = launch.groupby("block_position")["dev"].agg(["mean", "count"])
    if len(by) < 2:
        return []
    words = ", ".join(f"position {int(p) + 1}: {100 * (math.exp(r['mean']) - 1):+.1f} % ({int(r['count'])} launches)"
                      for p, r in by.iterrows())
    orders = compare.recorded_orders(repeats)
    balance = decide.order_balance(orders)
    if balance["positions_balanced"]:
        held = ("each config held each position equally often"
                + ("" if balance["balanced"] else " (but did not follow every other config equally often)"))
        return [f"- Launch position in the block, mean deviation from the config's own mean: {words}. In this sweep "
                f"{held}, so such an effect widens intervals rather than favouring a config."]
    firsts = ", ".join(f"`{c}` {n} of {len(orders)}" for c, n in sorted(balance["first"].items()))
    return [f"- Launch position in the block, mean deviation from the config's own mean: {words}. The positions were "
            f"**not balanced** in this sweep (first in the block: {firsts}), so a position effect can favour or "
            "penalise a config here: read the ratios of configs that launched first more often with that in mind."]
