"""The correctness table: pass@1 per config and, per speculative config, the lossless check against the baseline."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from servesweep.correctness.lossless import compare, is_speculative, read_greedy, rerun_summary
from servesweep.correctness.sandbox import UNSANDBOXED

COLUMNS = ["config", "speculative", "pass_at_1", "passed", "problems", "failed", "errors", "timeouts",
           "lossless_prompts", "exact_match_rate", "first_divergence_token", "divergences", "lossless", "greedy_rerun",
           "sandbox", "sandbox_network", "sandbox_filesystem", "skipped"]


def _by_config(paths) -> dict[str, Path]:
    return {Path(p).parent.name: Path(p) for p in paths}


def correctness_table(coding_paths: list[Path], greedy_paths: list[Path], meta_paths: list[Path],
                      baseline: str) -> pd.DataFrame:
    """One row per config; the lossless columns are filled for speculative configs only."""
    coding = {cfg: json.loads(p.read_text()) for cfg, p in _by_config(coding_paths).items()}
    greedy = {cfg: read_greedy(p) for cfg, p in _by_config(greedy_paths).items()}
    metas = {cfg: json.loads(p.read_text()) for cfg, p in _by_config(meta_paths).items()}
    base_greedy = greedy.get(baseline) or []
    base_skipped = coding.get(baseline, {}).get("skipped")
    rows = []
    for cfg in sorted(coding):
        result, meta = coding[cfg], metas.get(cfg, {})
        speculative = is_speculative(meta)
        outcomes = result.get("outcomes", {})
        row = {"config": cfg, "speculative": speculative, "pass_at_1": result.get("pass_at_1"),
               "passed": result.get("passed"), "problems": result.get("total"), "failed": outcomes.get("failed"),
               "errors": outcomes.get("error"), "timeouts": outcomes.get("timeout"),
               "sandbox": result.get("sandbox", {}).get("sandbox"),
               "sandbox_network": result.get("sandbox", {}).get("network"),
               "sandbox_filesystem": result.get("sandbox", {}).get("filesystem"), "skipped": result.get("skipped"),
               "lossless_prompts": None, "exact_match_rate": None, "first_divergence_token": None,
               "divergences": None, "lossless": None}
        rerun = rerun_summary(greedy.get(cfg, []))
        # its own greedy output generated twice: "matched of rerun", the reproducibility the lossless check relies on
        row["greedy_rerun"] = f"{rerun[0]} of {rerun[1]}" if rerun else None
        if speculative and cfg != baseline:
            if result.get("skipped"):
                row["lossless"] = "skipped"
            elif base_skipped or not base_greedy:
                row["lossless"] = f"no baseline completions ({base_skipped or 'baseline produced none'})"
            else:
                check = compare(base_greedy, greedy.get(cfg, []))
                # Per diverging prompt: its first differing token and where the texts part (JSON, for the report).
                parted = [{"prompt_id": p["prompt_id"], "token": p["first_divergence"], **p["where"]}
                          for p in check["per_prompt"] if p.get("where")]
                row.update(lossless_prompts=check["prompts"], exact_match_rate=check["exact_match_rate"],
                           first_divergence_token=check["first_divergence"],
                           divergences=json.dumps(parted) if parted else None,
                           lossless="identical" if check["exact_matches"] == check["prompts"] else "below 100 %")
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def to_markdown(table: pd.DataFrame) -> str:
    """The table as shown in the report: pass@1 and the lossless result side by side."""
    def pct(x):
        return "–" if x is None or pd.isna(x) else f"{100 * x:.0f} %"

    def num(x):
        return "–" if x is None or pd.isna(x) else str(int(x))

    shown = pd.DataFrame({
        "config": table["config"],
        "pass@1": [f"{pct(p)} ({num(n)}/{num(t)})" + (f", **{UNSANDBOXED}**" if box == UNSANDBOXED else "")
                   if not isinstance(s, str) else "skipped"
                   for p, n, t, s, box in zip(table["pass_at_1"], table["passed"], table["problems"], table["skipped"],
                                              table["sandbox"])],
        "speculative": ["yes" if s else "no" for s in table["speculative"]],
        "greedy exact match vs baseline": [pct(r) for r in table["exact_match_rate"]],
        "first divergence (token)": [num(d) for d in table["first_divergence_token"]],
        "lossless": [("**below 100 %**" if v == "below 100 %" else v) if isinstance(v, str) else "–"
                     for v in table["lossless"]],
    })
    return shown.to_markdown(index=False) + "\n"


def write_correctness_tables(coding_paths: list[Path], greedy_paths: list[Path], meta_paths: list[Path], baseline: str,
                             csv_path: Path, md_path: Path) -> None:
    """Write results/tables/correctness.{csv,md} from each config's coding_eval.json, greedy.jsonl and meta.json."""
    table = correctness_table(coding_paths, greedy_paths, meta_paths, baseline)
    table.to_csv(csv_path, index=False)
    Path(md_path).write_text(to_markdown(table))
