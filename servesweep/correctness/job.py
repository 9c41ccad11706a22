"""The correctness part of one config's bench job, run while its server is still up.

Writes the coding eval (``coding_eval.json``) and the greedy completions for the lossless check (``greedy.jsonl``).
Both are always written, so that the pipeline's outputs exist; a skipped check says why instead.
"""
from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from servesweep.plan import CorrectnessSettings, ServerConfig
from servesweep.correctness import humaneval, lossless
from servesweep.correctness.client import complete
from servesweep.correctness.sandbox import NO_SANDBOX_FIX, Limits, SandboxUnavailable, self_test

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CorrectnessOutputs:
    """Where one config's correctness outputs go."""

    coding_eval_json: Path
    greedy_jsonl: Path

    def skipped(self, config: str, reason: str) -> None:
        """Write both outputs of a check that did not run, saying why."""
        self.coding_eval_json.write_text(json.dumps({"config": config, "skipped": reason}, indent=2) + "\n")
        self.greedy_jsonl.write_text("")


def skip_reason(sc, settings: CorrectnessSettings) -> str | None:
    """Why this config gets no coding eval and no lossless check, or None."""
    if not settings.enabled:
        return "correctness.enabled is false"
    simulation = getattr(sc, "simulation", None)
    if simulation is not None:
        return (f"its acceptance is simulated ({simulation.words()}): the engine commits draft tokens it did not "
                "verify, so its output is not the model's")
    if sc.model.get("load_format") == "dummy":
        return (f"model `{sc.model_name}` has load_format: dummy (random weights), so its answers carry no "
                "meaning")
    return None


def coding_eval_configs(config: dict) -> list[str]:
    """The server configs of a validated config whose bench jobs run the coding eval (model-written code)."""
    settings = CorrectnessSettings.from_config(config.get("correctness"))
    return sorted(name for name in config["server_configs"]
                  if skip_reason(ServerConfig.from_config(name, config), settings) is None)


def limits_for(settings: CorrectnessSettings) -> Limits:
    """The sandbox limits of one coding-eval program."""
    return Limits(timeout_s=settings.timeout_s, cpu_s=max(1, int(settings.timeout_s)), sandbox=settings.sandbox)


def check_sandbox(sc, settings: CorrectnessSettings) -> None:
    """Before the server starts: raise :class:`SandboxUnavailable` with the fix when this config runs the coding eval
    in bwrap and bwrap cannot confine a program here (the host check says so first; this catches a bench job on
    another host, or a bwrap removed since)."""
    if skip_reason(sc, settings) is not None or settings.sandbox == "none":
        return
    probe = self_test()
    if not probe["works"] and not probe["allow_unsandboxed_env"]:
        raise SandboxUnavailable(f"config '{sc.name}' runs the coding eval, whose model-written code needs bwrap: "
                                 f"{probe['error']} — fix: {NO_SANDBOX_FIX}")


async def _generate(server, engine, sc, settings: CorrectnessSettings, problems: list[dict]):
    timeout = aiohttp.ClientTimeout(total=sc.request_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def coding(prompt: str) -> dict:
            return await complete(session, server.base_url, sc.served_name, prompt, settings.max_tokens,
                                  {"stop": humaneval.STOP})

        async def fixed_length(prompt: str) -> dict:
            return await complete(session, server.base_url, sc.served_name, prompt, settings.lossless_output_tokens,
                                  engine.request_fields(sc))

        # The configs that do not decode speculatively (the lossless check's baselines) generate each prompt a second
        # time asking for every token's log-probability and likeliest alternatives, so the check can tell a near tie
        # where a speculative config parts from them (and whether their own greedy output repeats).
        async def fixed_length_logprobs(prompt: str) -> dict:
            return await complete(session, server.base_url, sc.served_name, prompt, settings.lossless_output_tokens,
                                  {**engine.request_fields(sc), "logprobs": lossless.TOP_LOGPROBS})

        async def tokenize(text: str) -> list[int]:
            return await engine.tokenize(session, server.base_url, text)

        completions = await humaneval.generate(coding, problems)
        greedy = await lossless.generate(fixed_length, tokenize, settings.lossless_prompts,
                                         None if lossless.is_speculative(asdict(sc)) else fixed_length_logprobs)
    return completions, greedy


def run_correctness(server, engine, sc, settings: CorrectnessSettings, outputs: CorrectnessOutputs) -> dict:
    """Coding eval and greedy completions against a ready server; writes both outputs, returns a summary for meta."""
    outputs.coding_eval_json.parent.mkdir(parents=True, exist_ok=True)
    reason = skip_reason(sc, settings)
    if reason:
        log.info("[%s] correctness checks skipped: %s", sc.name, reason)
        outputs.skipped(sc.name, reason)
        return {"skipped": reason}
    problems = humaneval.select_problems(settings.problems if isinstance(settings.problems, int)
                                         else list(settings.problems))
    completions, greedy = asyncio.run(_generate(server, engine, sc, settings, problems))
    with open(outputs.greedy_jsonl, "w") as fh:
        for record in greedy:
            fh.write(json.dumps(record) + "\n")
    scored = humaneval.score(problems, completions, limits_for(settings))
    result = {"config": sc.name, "skipped": None, "max_tokens": settings.max_tokens, "timeout_s": settings.timeout_s,
              "sandbox_setting": settings.sandbox, **scored}
    outputs.coding_eval_json.write_text(json.dumps(result, indent=2) + "\n")
    log.info("[%s] coding eval: %d/%d passed%s; sandbox network %s; %d greedy completions for the lossless check",
             sc.name, scored["passed"], scored["total"], " (unsandboxed)" if scored["unsandboxed"] else "",
             scored["sandbox"].get("network"), len(greedy))
    return {"pass_at_1": scored["pass_at_1"], "passed": scored["passed"], "total": scored["total"],
            "unsandboxed": scored["unsandboxed"], "greedy_prompts": len(greedy)}
