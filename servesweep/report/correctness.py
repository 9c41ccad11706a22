"""The Correctness section: pass@1, the lossless check and where greedy outputs part."""
from __future__ import annotations

import json

import pandas as pd

from servesweep.correctness.lossless import NEAR_TIE_NATS
from servesweep.correctness.sandbox import UNSANDBOXED


def _shown(text: str) -> str:
    """A snippet of model text inline: escapes visible, no backticks to break the code span."""
    return repr(text)[1:-1].replace("`", "'")


def _divergence_text(parted: list[dict], config: str, most: int = 3) -> str:
    """Where the diverging completions part from the baseline's, as text (up to ``most`` prompts)."""
    if not parted:
        return ""
    parted = sorted(parted, key=lambda d: d["token"])
    shown = [f"{d['prompt_id']} at token {d['token']}: after `…{_shown(d['context'])}` the baseline continued "
             f"`{_shown(d['baseline'])}`, `{config}` `{_shown(d['candidate'])}`"
             + _logprob_text(d.get("logprobs"), config) for d in parted[:most]]
    more = f" (and {len(parted) - most} more)" if len(parted) > most else ""
    return " Where they part — " + "; ".join(shown) + more + "."


def _logprob_text(lp: dict | None, config: str) -> str:
    """The baseline's log-probabilities at a parting, as the report shows them."""
    if not lp:
        return ""
    if lp.get("unplaced"):
        return (" (the baseline's log-probabilities could not be placed at this parting: its tokens do not spell its "
                "text)")
    mine = f"`{_shown(lp['baseline_token'] or '')}` {lp['baseline_logprob']:.3f}"
    if lp.get("candidate_token") is None:
        floor = (f", the {_ordinal(lp['top_k'])} at {lp['top_floor']:.3f}" if lp.get("top_floor") is not None
                 else "")
        return (f" (the baseline's log-probabilities there: {mine}; `{config}`'s token not among its "
                f"{lp['top_k']} likeliest{floor})")
    theirs = f"`{_shown(lp['candidate_token'])}` {lp['candidate_logprob']:.3f}"
    if lp["gap_nats"] == 0:
        return f" (the baseline's log-probabilities there: {mine}, {theirs}: equal as returned, a tie)"
    tie = ", a near tie" if lp["gap_nats"] < NEAR_TIE_NATS else ""
    return f" (the baseline's log-probabilities there: {mine}, {theirs}: {lp['gap_nats']:.3f} nats apart{tie})"


def _ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, … 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _why_text(parted: list[dict]) -> str:
    """What the recorded log-probabilities say about why greedy outputs parted, without claiming a cause."""
    measured = [d["logprobs"] for d in parted if d.get("logprobs") and not d["logprobs"].get("unplaced")]
    if not measured:
        recorded = any(d.get("logprobs") for d in parted)
        return ("This check does not say why it did: a drafting or verification fault, or the verify pass's "
                "floating-point arithmetic differing from plain decoding's where the two likeliest tokens nearly tie, "
                "would both show this way; "
                + ("the baseline's log-probabilities could not be placed at any parting to tell them apart."
                   if recorded else "no log-probabilities were recorded to tell them apart."))
    near = sum(1 for lp in measured if lp.get("gap_nats") is not None and lp["gap_nats"] < NEAR_TIE_NATS)
    equal = sum(1 for lp in measured if lp.get("gap_nats") == 0)
    equal_text = f", {equal} of them {'an exact tie' if equal == 1 else 'exact ties'} as returned" if equal else ""
    return (f"Of the {len(measured)} parting(s) where the baseline's log-probabilities were recorded, {near} "
            f"{'is a near tie' if near == 1 else 'are near ties'} (the two tokens within {NEAR_TIE_NATS} nats"
            f"{equal_text}), "
            "which floating-point differences between the verify pass and plain decoding can flip"
            + (f"; {len(measured) - near} {'is' if len(measured) - near == 1 else 'are'} not, which such "
               "differences do not explain." if near < len(measured) else "; whether they did is not measured."))


def correctness_section(table: pd.DataFrame, table_md: str, baseline: str) -> list[str]:
    """pass@1 per config, the lossless check per speculative config (flagged below 100 %) and the sandbox's
    isolation, from the correctness table."""
    unsandboxed = set(table.loc[table["sandbox"] == UNSANDBOXED, "config"]) if "sandbox" in table else set()
    lines = ["## Correctness", "", "HumanEval pass@1 (temperature 0, completion style, answers run in a sandbox"
             + (" unless labelled unsandboxed" if unsandboxed else "") + "):", ""]
    for r in table.itertuples():
        if isinstance(r.skipped, str):
            lines.append(f"- `{r.config}`: skipped — {r.skipped}.")
            continue
        others = ", ".join(f"{int(n)} {what}" for n, what in ((r.failed, "failed"), (r.errors, "error"),
                                                               (r.timeouts, "timed out")) if n)
        label = (f" — **{UNSANDBOXED}**: its answers ran with resource limits only, without bwrap's network, "
                 "filesystem and process isolation" if r.config in unsandboxed else "")
        lines.append(f"- `{r.config}`: {100 * r.pass_at_1:.0f} % ({int(r.passed)}/{int(r.problems)} passed"
                     f"{'; ' + others if others else ''}){label}.")
    spec = table[table["speculative"] & (table["config"] != baseline)]
    lines += ["", "Lossless check (the same greedy fixed-length prompts, one request at a time, against "
              f"`{baseline}`):", ""]
    base_row = table[table["config"] == baseline]
    rerun = base_row["greedy_rerun"].iloc[0] if "greedy_rerun" in table and not base_row.empty else None
    if isinstance(rerun, str):
        matched, total = (int(x) for x in rerun.split(" of "))
        lines.append(f"- `{baseline}` (the baseline) generated each prompt a second time, asking for "
                     f"log-probabilities: {rerun} completions identical to the first"
                     + ("." if matched == total else
                        " — **its own greedy output does not repeat here**, so a speculative config's divergence "
                        "from it cannot be laid on speculation from this check alone."))
    if spec.empty:
        lines.append("- no speculative config in this sweep.")
    for r in spec.itertuples():
        if r.lossless == "identical":
            lines.append(f"- `{r.config}`: {int(r.lossless_prompts)}/{int(r.lossless_prompts)} completions identical "
                         "(100 %): lossless.")
        elif r.lossless == "below 100 %":
            parted = json.loads(r.divergences) if isinstance(r.divergences, str) and r.divergences else []
            lines.append(f"- `{r.config}`: **below 100 %** — {100 * r.exact_match_rate:.0f} % of "
                         f"{int(r.lossless_prompts)} completions identical; first divergence at token "
                         f"{int(r.first_divergence_token)}.{_divergence_text(parted, r.config)} Greedy "
                         f"output should not change under speculative decoding. {_why_text(parted)}")
        else:
            lines.append(f"- `{r.config}`: not checked ({r.lossless}).")
    networks = sorted(set(table["sandbox_network"].dropna()))
    filesystems = sorted(set(table["sandbox_filesystem"].dropna()))
    if networks:
        isolated = all(n.startswith("isolated") for n in networks)
        lines += ["", f"Sandbox: network {'; '.join(networks)}; filesystem {'; '.join(filesystems)}."
                  + ("" if isolated else " **Network isolation was not in force**: model-written code could reach "
                     "the network.")]
    return lines + ["", table_md, ""]
