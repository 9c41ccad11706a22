"""Service-level targets: the ``slo:`` section of the config, whether a cell meets one, whether a request is good.

A target names limits on TTFT, TPOT and/or E2E latency in milliseconds and a percentile (50, 90 or 99; default 99).
A *cell* meets it when each limited metric's percentile over the cell's measured requests is within the limit (the
cell columns ``ttft_p99_s``, ``tpot_p99_s``, ``e2e_p99_s``). A *request* is good when its own TTFT, TPOT and E2E are
within every limit set — vLLM's ``--goodput`` rule, where TPOT counts as 0 for a request of at most one output token.
Goodput is the good requests of the measured window per second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

METRICS = (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("e2e_ms", "e2e"))


@dataclass(frozen=True)
class SLO:
    name: str
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    percentile: int = 99

    def limits(self) -> list[tuple[str, float]]:
        """(metric, limit in seconds) for each metric this target limits: ``ttft``, ``tpot``, ``e2e``."""
        return [(metric, getattr(self, key) / 1000.0) for key, metric in METRICS if getattr(self, key) is not None]

    def as_config(self) -> dict:
        """The target as its ``slo:`` entry (schema defaults filled): its limits, then its percentile."""
        return {**{key: getattr(self, key) for key, _ in METRICS if getattr(self, key) is not None},
                "percentile": self.percentile}

    def describe(self) -> str:
        parts = [f"{metric.upper()} p{self.percentile} ≤ {getattr(self, key):g} ms"
                 for key, metric in METRICS if getattr(self, key) is not None]
        return f"{self.name}: " + ", ".join(parts)

    def cell_meets(self, row: Mapping) -> bool | None:
        """Whether a cell row meets the target; None when a limited percentile was not measured (NaN or absent)."""
        for metric, limit in self.limits():
            value = row.get(f"{metric}_p{self.percentile}_s")
            if value is None or (isinstance(value, float) and math.isnan(value)):
                return None
            if value > limit:
                return False
        return True

    def request_good(self, ttft_s: float, tpot_s: float, e2e_s: float, output_tokens: float | None = None) -> bool:
        """Whether one successful request met every limit (vLLM's goodput rule: TPOT is 0 for ≤ 1 output token)."""
        values = {"ttft": ttft_s, "tpot": 0.0 if output_tokens is not None and output_tokens <= 1 else tpot_s,
                  "e2e": e2e_s}
        for metric, limit in self.limits():
            value = values[metric]
            if value is None or math.isnan(value) or value > limit:
                return False
        return True


def slos_from_config(config: Mapping) -> list[SLO]:
    """The config's targets (schema defaults applied), in the order the config names them."""
    out = []
    for name, spec in (config.get("slo") or {}).items():
        out.append(SLO(name=name, ttft_ms=spec.get("ttft_ms"), tpot_ms=spec.get("tpot_ms"),
                       e2e_ms=spec.get("e2e_ms"), percentile=int(spec.get("percentile", 99))))
    return out
