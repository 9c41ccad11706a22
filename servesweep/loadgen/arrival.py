"""Open-loop cells: the arrival plan (rate, gaps, cap) and its seeded schedule of send times."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArrivalPlan:
    """An open-loop cell: requests are sent at ``rate`` per second on a schedule drawn from ``seed``, whatever the
    server's pace, with at most ``max_concurrency`` in flight (a send due while the cap is full waits for a slot).

    ``arrival``: ``poisson`` draws Gamma(shape = ``burstiness``, scale = 1 / (rate × burstiness)) gaps, vLLM's
    rule (burstiness 1 is exponential gaps, a Poisson process); ``constant`` spaces sends exactly 1 / rate apart;
    with ``times``, the sends follow them (a trace's arrivals).
    """

    rate: float
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int = 512
    seed: int = 0
    # A replayed trace instead of drawn gaps: its send offsets (seconds, from 0, ascending), repeated every
    # ``period`` seconds once they run out (``rate``, ``arrival`` and ``burstiness`` then only describe it).
    times: tuple[float, ...] = ()
    period: float = 0.0


class ArrivalSchedule:
    """The absolute send offsets (seconds after the cell starts) of an ``ArrivalPlan``: gap k is the same number
    whatever is asked for first, since the gaps are drawn from one seeded generator in blocks, in order.

    Sends are due at these offsets from one origin (vLLM's way), so a send that goes out late does not push the
    later ones back; SGLang's client sleeps a fresh gap after each send, so its lateness adds up.
    """

    BLOCK = 4096

    def __init__(self, plan: ArrivalPlan):
        if plan.rate <= 0:
            raise ValueError(f"request rate must be > 0, got {plan.rate}")
        if plan.times and (plan.period <= 0 or list(plan.times) != sorted(plan.times) or plan.times[0] < 0):
            raise ValueError("a trace's send times must ascend from ≥ 0 and repeat after a period > 0")
        if plan.arrival not in ("poisson", "constant"):
            raise ValueError(f"arrival must be poisson or constant, got {plan.arrival!r}")
        import numpy as np

        self.plan = plan
        self._rng = np.random.default_rng(plan.seed)
        self._times: list[float] = []
        self._last = 0.0

    def _extend(self) -> None:
        plan = self.plan
        if plan.arrival == "constant":
            gaps = [1.0 / plan.rate] * self.BLOCK
        else:
            gaps = self._rng.gamma(plan.burstiness, 1.0 / (plan.rate * plan.burstiness), self.BLOCK).tolist()
        for gap in gaps:
            self._times.append(self._last)  # the first send is due at once, as in vLLM and SGLang
            self._last += gap

    def time(self, k: int) -> float:
        """When send ``k`` (from 0) is due, in seconds after the cell's start."""
        if self.plan.times:
            loop, at = divmod(k, len(self.plan.times))
            return self.plan.times[at] + loop * self.plan.period
        while k >= len(self._times):
            self._extend()
        return self._times[k]
