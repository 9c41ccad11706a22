"""Capacity under a service-level target: the most load a config sustains while meeting it, found by a search.

The search (:class:`CapacitySearch`) doubles the load from ``start`` until a probe fails, then bisects between the
last passing and the first failing load until they lie within ``tolerance`` of each other — GuideLLM's search, over
closed-loop concurrency or open-loop request rate (``load``). It stops early, *not converged*, when the next probe
would not fit its time budget, or when the largest load allowed (``max``) still passes.

A probe is measured in segments, each a window like any cell's (:func:`servesweep.bench.run_cell`), and looks at
its attainment — the share of its measured requests within every limit of the target, pooled over its segments —
after each (:class:`Looks`): the exact (Clopper–Pearson) interval at the look's share of the error against the
required attainment. At or above it, the load is sustained; below it, it is not; straddling it, the probe is too
close to call and gets another segment, until ``max_requests`` (then it is *undecided*, and counts as not sustained:
the capacity is the largest load *shown* to meet the target). Each side (a wrong pass, a wrong fail) may spend 2.5 %
over all of a probe's looks, by an O'Brien–Fleming-type spending function over the most looks the settings allow, so
looking again after every segment does not raise the error (benchmarks/capacity_looks.py). A probe whose requests'
delay rises through its window (:func:`saturated`) stops at once and fails.

The library side only: :func:`servesweep.bench.run_capacity` measures the probes against a running server.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterable, Mapping

from servesweep.decide import spending
from servesweep.slo import SLO
from servesweep.stats import clopper_pearson, request_timings

if TYPE_CHECKING:
    import pandas as pd

LOADS = ("concurrency", "rate")
DECISIONS = ("pass", "fail", "undecided")
# A rate search whose start fails halves the rate this many times before it says nothing was sustained.
RATE_HALVINGS = 4
# The most often a probe may wrongly pass (its true attainment below the required one), and wrongly fail, over all
# its looks: the one-sided error of the 95 % interval a probe was decided on before its looks were corrected.
SIDE_ALPHA = 0.025
# The rule a probe was decided under, as recorded with it (capacity_probes.csv ``decision_rule``).
DECISION_RULE = "clopper-pearson, O'Brien-Fleming spending, 2.5 % per side over the looks"
# Probes recorded before the rule above (their meta.json has no ``decision_rule``): Wilson 95 % after each segment,
# no correction for the repeated looks. They keep the decision they were recorded with.
RECORDED_RULE = "wilson 95 % per look, uncorrected"


@dataclass(frozen=True)
class CapacitySettings:
    """The ``capacity:`` section, typed (its defaults are the schema's)."""

    load: str
    workload: str
    ctx: int
    start: float
    max_load: float
    tolerance: float
    attainment: float | None
    window_s: float
    min_requests: int
    max_requests: int
    budget_s: float
    saturation_rise: float
    configs: tuple[str, ...] = ()
    slos: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, section: Mapping, matrix: Mapping) -> "CapacitySettings | None":
        """The settings of a checked config's ``capacity:`` section (None when it is not enabled); ``matrix``: the
        config's ``matrix:`` section, whose first workload and context length are the defaults."""
        if not section or not section.get("enabled"):
            return None
        attainment = section.get("attainment")
        return cls(load=str(section["load"]),
                   workload=str(section.get("workload") or (matrix.get("workloads") or ["synthetic"])[0]),
                   ctx=int(section.get("ctx") or matrix["context_lengths"][0]),
                   start=float(section["start"]), max_load=float(section["max"]),
                   tolerance=float(section["tolerance"]),
                   attainment=None if attainment is None else float(attainment),
                   window_s=float(section["window_s"]), min_requests=int(section["min_requests"]),
                   max_requests=int(section["max_requests"]), budget_s=float(section["budget_s"]),
                   saturation_rise=float(section["saturation_rise"]),
                   configs=tuple(section.get("configs") or ()), slos=tuple(section.get("slos") or ()))

    @property
    def closed(self) -> bool:
        return self.load == "concurrency"

    def searches(self, config: str) -> bool:
        """Whether config ``config`` is searched."""
        return not self.configs or config in self.configs

    def targets(self, slos: Iterable[SLO]) -> list[SLO]:
        """The targets searched, in the config's order."""
        return [s for s in slos if not self.slos or s.name in self.slos]

    def required(self, slo: SLO) -> float:
        """The attainment a probe must show: ``attainment``, else the target's percentile / 100."""
        return self.attainment if self.attainment is not None else slo.percentile / 100.0


def problems(section: Mapping, config: Mapping) -> list[tuple[str, str, str]]:
    """What is wrong with a filled ``capacity:`` section of a filled config: (key, problem, fix) each."""
    if not section or not section.get("enabled"):
        return []
    out = []
    known = set(config.get("server_configs") or {})
    for name in section.get("configs") or []:
        if name not in known:
            out.append(("capacity.configs", f"names '{name}', which is not a server config",
                        f"use one of {sorted(known)}, or leave capacity.configs empty for every config"))
    targets = set(config.get("slo") or {})
    if not targets:
        out.append(("capacity.enabled", "is true but the config has no `slo:` targets to search under",
                    "add a target to `slo:`, or set capacity.enabled: false"))
    for name in section.get("slos") or []:
        if targets and name not in targets:
            out.append(("capacity.slos", f"names '{name}', which is not a target of `slo:`",
                        f"use one of {sorted(targets)}, or leave capacity.slos empty for every target"))
    matrix = config.get("matrix") or {}
    workloads = matrix.get("workloads") or ["synthetic"]
    if section.get("workload") and section["workload"] not in workloads:
        out.append(("capacity.workload", f"'{section['workload']}' is not one of matrix.workloads {workloads}",
                    "name a workload the matrix measures (its prompts are built once per launch)"))
    if section.get("ctx") and section["ctx"] not in (matrix.get("context_lengths") or []):
        out.append(("capacity.ctx", f"{section['ctx']} is not one of matrix.context_lengths "
                    f"{matrix.get('context_lengths')}", "name a context length the matrix measures"))
    if section["start"] > section["max"]:
        out.append(("capacity.start", f"{section['start']:g} is above capacity.max {section['max']:g}",
                    "start at or below the largest load the search may probe"))
    if section["load"] == "concurrency" and float(section["start"]) != int(section["start"]):
        out.append(("capacity.start", f"{section['start']:g} is not a whole number of streams",
                    "give a whole concurrency (load: concurrency), or search load: rate"))
    if section["load"] == "rate" and section["max"] > (matrix.get("max_concurrency") or math.inf) * 1e3:
        out.append(("capacity.max", f"{section['max']:g} req/s is far beyond what matrix.max_concurrency "
                    f"{matrix.get('max_concurrency')} streams can carry", "lower capacity.max"))
    if section["min_requests"] > section["max_requests"]:
        out.append(("capacity.min_requests", f"{section['min_requests']} is above capacity.max_requests "
                    f"{section['max_requests']}", "let a probe measure at least one segment's requests"))
    low, high, given = int(section["min_requests"]), int(section["max_requests"]), section.get("attainment")
    required: dict[float, list[str]] = {}  # attainment -> the targets searched at it
    for name, spec in (config.get("slo") or {}).items():
        if not section.get("slos") or name in section["slos"]:
            p = float(given) if given is not None else int(spec.get("percentile", 99)) / 100.0
            required.setdefault(p, []).append(f"'{name}'")
    for p, names in required.items():
        if low <= high and not can_pass(p, low, high):
            lower = "lower capacity.attainment" if given is not None else "set capacity.attainment (e.g. 0.9)"
            out.append(("capacity.max_requests", f"{high} requests can never show target {', '.join(names)} met at "
                        f"attainment {p:g}: even with every request good, no look of a probe (segments of {low}) "
                        "has its exact interval above it", f"raise capacity.max_requests to "
                        f"{least_max_requests(p, low, high)} or more, or {lower}"))
    return out


def planned_looks(min_requests: int, max_requests: int) -> int:
    """The most looks a probe can take: one after each segment, each of at least ``min_requests`` requests, until
    ``max_requests``."""
    return max(1, math.ceil(max_requests / max(min_requests, 1)))


def look_alpha(n: int, max_requests: int, spent: float, side_alpha: float = SIDE_ALPHA) -> float:
    """The error each side of a look after ``n`` requests may spend, ``spent`` having gone to the probe's earlier
    looks: the increment of the O'Brien–Fleming-type spending function (:func:`servesweep.decide.spending`, one
    side of it) at the information fraction n / ``max_requests`` (Lan–DeMets: a segment holding more requests than
    planned spends more); the probe's last look (n ≥ ``max_requests``) spends what is left. The increments add up to
    ``side_alpha``, so a probe stopped at any look errs on a side at most that often (a Bonferroni bound over its
    looks, each look's interval being exact)."""
    if n <= 0:
        return 0.0
    if n >= max_requests:
        return max(side_alpha - spent, 0.0)
    return max(spending(n / max_requests, 2 * side_alpha) / 2 - spent, 0.0)


def can_pass(required: float, min_requests: int, max_requests: int, side_alpha: float = SIDE_ALPHA) -> bool:
    """Whether a probe whose requests are all good passes at some look when each segment holds ``min_requests``
    (the planned looks; the exact lower bound of n/n good at level alpha is alpha^(1/n))."""
    planned, spent = planned_looks(min_requests, max_requests), 0.0
    for k in range(1, planned + 1):
        n = min(k * min_requests, max_requests)
        alpha = look_alpha(n, max_requests, spent, side_alpha)
        spent += alpha
        if alpha > 0 and alpha ** (1 / n) >= required:
            return True
    return False


def least_max_requests(required: float, min_requests: int, above: int = 0, side_alpha: float = SIDE_ALPHA) -> int:
    """The least ``max_requests`` above ``above`` with which an all-good probe can pass (:func:`can_pass`); none
    fewer than one look at the whole ``side_alpha`` needs, log(alpha) / log(required)."""
    if required >= 1:
        raise ValueError("an attainment of 1 is never shown by a finite probe")
    n = max(above + 1, math.ceil(math.log(side_alpha) / math.log(required)))
    while not can_pass(required, min_requests, n, side_alpha):
        n += 1
    return n


def decide(good: int, n: int, required: float, alpha: float = SIDE_ALPHA) -> tuple[str, float, float]:
    """(decision, lo, hi): the Clopper–Pearson bounds [lo, hi] of attainment ``good``/``n``, each one-sided at
    ``alpha`` (one look's share, :class:`Looks`), against ``required`` — ``pass`` when lo ≥ required, ``fail`` when
    hi < required, else ``undecided``."""
    lo, hi = clopper_pearson(good, n, alpha)
    if n <= 0 or alpha <= 0:
        return "undecided", lo, hi
    if lo >= required:
        return "pass", lo, hi
    if hi < required:
        return "fail", lo, hi
    return "undecided", lo, hi


@dataclass
class Looks:
    """A probe's sequential decision: one look after each segment (:meth:`decide`), each spending its share of
    ``side_alpha`` per side (:func:`look_alpha`); at most ``planned`` of them (:func:`planned_looks`), recorded."""

    planned: int
    max_requests: int
    side_alpha: float = SIDE_ALPHA
    count: int = 0
    spent: float = 0.0
    alpha: float = 0.0  # the last look's level per side

    @classmethod
    def for_settings(cls, settings: "CapacitySettings") -> "Looks":
        return cls(planned_looks(settings.min_requests, settings.max_requests), settings.max_requests)

    def decide(self, good: int, n: int, required: float) -> tuple[str, float, float]:
        """The next look at ``good`` of ``n`` requests so far: :func:`decide` at this look's level."""
        self.count += 1
        self.alpha = look_alpha(n, self.max_requests, self.spent, self.side_alpha)
        self.spent += self.alpha
        return decide(good, n, required, self.alpha)


def good_requests(records: list[dict], slo: SLO) -> tuple[int, int]:
    """(good, measured) over the measured requests (sent inside the window) of ``records``: the attainment count of
    :func:`servesweep.stats.goodput_stats` (a failed request is never good)."""
    measured = [r for r in records if r.get("phase") == "measured"]
    good = 0
    for r in measured:
        if r.get("error"):
            continue
        t = request_timings(r)
        good += slo.request_good(t["ttft_s"], t["tpot_s"], t["e2e_s"], r.get("completion_tokens"))
    return good, len(measured)


def delay_s(record: dict) -> float:
    """How long a request waited for its first token: client queueing (an open-loop backlog beyond
    max_concurrency) plus TTFT; a failed request waited its whole life."""
    queued = record.get("client_queue_s") or 0.0
    if record.get("error"):
        return queued + (record.get("end", record["send"]) - record["send"])
    return queued + request_timings(record)["ttft_s"]


def saturated(records: list[dict], slo: SLO, rise: float) -> bool:
    """Whether the server was plainly saturated during a window: the median delay (:func:`delay_s`) of the last
    third of its measured requests (by send time) is above ``rise`` × the first third's and above the target's TTFT
    limit (else its E2E limit; else any rise counts) — a queue growing through the window."""
    measured = sorted((r for r in records if r.get("phase") == "measured"), key=lambda r: r["send"])
    if len(measured) < 6:
        return False
    third = len(measured) // 3
    first = statistics.median(delay_s(r) for r in measured[:third])
    last = statistics.median(delay_s(r) for r in measured[-third:])
    limits = dict(slo.limits())
    limit = limits.get("ttft", limits.get("e2e", 0.0))
    return bool(last > rise * max(first, 1e-6) and last > limit)


def concurrency_reached(records: list[dict], t_start: float, t_end: float) -> float:
    """Mean requests in flight at the server over the window [t_start, t_end) (each request from send to end)."""
    length = t_end - t_start
    if length <= 0:
        return math.nan
    busy = sum(max(0.0, min(r.get("end", r["send"]), t_end) - max(r["send"], t_start)) for r in records
               if r.get("phase") != "client-bound")
    return busy / length


@dataclass
class Probe:
    """One probe of a search: its load, what its segments measured pooled, and its decision."""

    level: float
    good: int
    requests: int
    attainment: float
    attainment_lo: float
    attainment_hi: float
    decision: str
    saturated: bool
    segments: int
    wall_s: float
    goodput_rps: float = math.nan
    output_tok_s: float = math.nan
    request_s: float = math.nan
    concurrency_reached: float = math.nan
    achieved_rps: float = math.nan
    looks_planned: int = 0  # the most looks (segments) the probe could take; it took ``segments``
    look_alpha: float = math.nan  # the error per side its last look spent; its interval is at that level
    alpha_spent: float = math.nan  # per side, over its looks
    decision_rule: str = DECISION_RULE

    @property
    def sustained(self) -> bool:
        """Shown to meet the target (an undecided probe is not)."""
        return self.decision == "pass"


@dataclass
class CapacitySearch:
    """The search's state: which loads passed and failed, and what to probe next."""

    settings: CapacitySettings
    probes: list[Probe] = field(default_factory=list)

    def _snap(self, level: float) -> float:
        return float(max(1, int(level))) if self.settings.closed else level

    def bracket(self) -> tuple[float, float]:
        """(largest sustained load below the smallest failing one, smallest failing load); NaN where none."""
        fails = [p.level for p in self.probes if not p.sustained]
        hi = min(fails) if fails else math.nan
        passes = [p.level for p in self.probes if p.sustained and not (p.level >= hi)]
        return (max(passes) if passes else math.nan), hi

    def closed_bracket(self) -> bool:
        """Whether the bracket is within tolerance: the first failing load within ``tolerance`` of the last passing
        one (adjacent concurrencies too), or the smallest load possible failing."""
        lo, hi = self.bracket()
        if math.isnan(hi):
            return False
        if math.isnan(lo):
            floor = 1.0 if self.settings.closed else self.settings.start / 2 ** RATE_HALVINGS
            return hi <= floor
        return hi <= lo * (1 + self.settings.tolerance) or (self.settings.closed and hi - lo <= 1)

    def next_level(self) -> float | None:
        """The next load to probe; None when the bracket is closed or the expansion reached ``max``."""
        s = self.settings
        if not self.probes:
            return self._snap(s.start)
        if self.closed_bracket():
            return None
        lo, hi = self.bracket()
        if math.isnan(hi):  # still expanding
            return None if lo >= s.max_load else self._snap(min(2 * lo, s.max_load))
        if math.isnan(lo):  # the start failed: halve down
            return self._snap(hi / 2)
        mid = self._snap((lo + hi) / 2)
        return mid if lo < mid < hi else None

    def record(self, probe: Probe) -> None:
        self.probes.append(probe)

    def result(self, config: str, slo: SLO, wall_s: float, stop: str | None) -> "CapacityResult":
        """The search's answer; ``stop``: why it stopped before its bracket closed, or with its last probe cut short
        (``budget``), or None."""
        lo, hi = self.bracket()
        closed = self.closed_bracket() and stop is None
        if stop is None and not closed:
            stop = "max" if math.isnan(hi) else "tolerance"  # past max, or bisection can split no further
        at = next((p for p in self.probes if p.level == lo and p.sustained), None)
        above = next((p for p in self.probes if p.level == hi and not p.sustained), None)
        return CapacityResult(
            config=config, slo=slo.name, load=self.settings.load, required_attainment=self.settings.required(slo),
            capacity=lo, bracket_lo=lo, bracket_hi=hi, bracket_hi_decision=above.decision if above else "",
            bracket_hi_attainment_lo=above.attainment_lo if above else math.nan,
            bracket_hi_attainment_hi=above.attainment_hi if above else math.nan,
            converged=closed,
            stop_reason="converged" if closed else stop, wall_s=wall_s, probes=list(self.probes),
            attainment_lo=at.attainment_lo if at else math.nan, attainment_hi=at.attainment_hi if at else math.nan,
            concurrency_reached=at.concurrency_reached if at else math.nan,
            output_tok_s=at.output_tok_s if at else math.nan, goodput_rps=at.goodput_rps if at else math.nan,
            request_s=at.request_s if at else math.nan,
            undecided=sum(p.decision == "undecided" for p in self.probes), decision_rule=DECISION_RULE)


@dataclass
class CapacityResult:
    """One search's answer: the largest load shown to meet the target (``capacity``; NaN: none was), the bracket
    [last passing, first failing] load, the decision interval of the passing probe, what was measured at it, and
    whether the bracket closed to tolerance within the budget (``converged``; ``stop_reason`` says why not)."""

    config: str
    slo: str
    load: str
    required_attainment: float
    capacity: float
    bracket_lo: float
    bracket_hi: float
    bracket_hi_decision: str  # "fail" or "undecided" (not shown to meet it); "" with no such probe
    bracket_hi_attainment_lo: float  # the decision interval of the probe at bracket_hi
    bracket_hi_attainment_hi: float
    converged: bool
    stop_reason: str
    wall_s: float
    probes: list[Probe]
    attainment_lo: float = math.nan
    attainment_hi: float = math.nan
    concurrency_reached: float = math.nan
    output_tok_s: float = math.nan
    goodput_rps: float = math.nan
    request_s: float = math.nan
    undecided: int = 0
    decision_rule: str = DECISION_RULE

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        unit = "" if self.load == "concurrency" else " req/s"
        name = "C = " if self.load == "concurrency" else ""
        if math.isnan(self.capacity):
            found = f"no load shown to meet it (the smallest probed: {name}{_num(self.bracket_hi)}{unit})"
        else:
            hi = ("none up to max" if math.isnan(self.bracket_hi)
                  else f"{_num(self.bracket_hi)} ({self.bracket_hi_decision})")
            found = f"{name}{_num(self.capacity)}{unit} [first not sustained: {hi}]"
        state = "converged" if self.converged else f"not converged ({self.stop_reason})"
        return f"[{self.config}] capacity under {self.slo}: {found}, {len(self.probes)} probes, {state}"


def _num(x: float) -> str:
    return f"{x:g}" if not math.isnan(x) else "?"


# The columns of capacity.csv, in order, after config and slo.
RESULT_COLUMNS = ("load", "capacity", "bracket_lo", "bracket_hi", "bracket_hi_decision", "bracket_hi_attainment_lo",
                  "bracket_hi_attainment_hi", "required_attainment", "attainment_lo", "attainment_hi", "concurrency_reached", "request_s", "goodput_rps", "agg_output_tok_s",
                  "output_tok_s_per_gpu", "gpu_count", "gpu_cost_per_m_tokens", "converged", "stop_reason", "probes",
                  "undecided", "wall_s", "decision_rule")


def tables(metas: list[dict]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(capacity, probes) from the run folders' meta.json (each search's :meth:`CapacityResult.as_dict` under
    ``capacity.searches``): one row per config and target, one per probe. ``gpu_count`` is the GPUs the config's
    server ran on (0: a CPU engine, whose per-GPU figures are per host)."""
    import pandas as pd

    rows, probes = [], []
    for meta in metas:
        gpus = int((meta.get("capacity") or {}).get("gpu_count") or 0)
        for search in (meta.get("capacity") or {}).get("searches") or []:
            row = {"config": search["config"], "slo": search["slo"],
                   **{k: search.get(k) for k in RESULT_COLUMNS if k in search}}
            row.update(agg_output_tok_s=search.get("output_tok_s"), gpu_count=gpus, probes=len(search["probes"]))
            row.setdefault("decision_rule", RECORDED_RULE)  # recorded before the looks were corrected: as decided
            if "bracket_hi_decision" not in search:  # a search recorded before these columns: read its probes
                above = next((p for p in search["probes"] if p["level"] == search["bracket_hi"]
                              and p["decision"] != "pass"), None)
                row.update(bracket_hi_decision=above["decision"] if above else "",
                           bracket_hi_attainment_lo=above["attainment_lo"] if above else math.nan,
                           bracket_hi_attainment_hi=above["attainment_hi"] if above else math.nan)
            rows.append(row)
            for i, p in enumerate(search["probes"]):
                probes.append({"config": search["config"], "slo": search["slo"], "load": search["load"],
                               "probe": i, "decision_rule": RECORDED_RULE, **p, "capacity": search.get("capacity")})
    columns = ["config", "slo", *RESULT_COLUMNS]
    return pd.DataFrame(rows, columns=[c for c in columns if c not in ("output_tok_s_per_gpu",
                                                                        "gpu_cost_per_m_tokens")]), \
        pd.DataFrame(probes)


def priced(capacity: pd.DataFrame, cost: Mapping | None) -> pd.DataFrame:
    """``capacity`` with throughput per GPU (per host for a CPU engine) and the GPU cost per million output tokens
    at the found load (``cost.gpu_hour`` × GPUs / output tok/s; NaN without a price or on a CPU engine)."""
    import pandas as pd

    out = capacity.copy()
    tok = pd.to_numeric(out.get("agg_output_tok_s"), errors="coerce")
    gpus = pd.to_numeric(out.get("gpu_count"), errors="coerce").fillna(0)
    out["output_tok_s_per_gpu"] = tok / gpus.where(gpus > 0, 1)
    price = (cost or {}).get("gpu_hour")
    out["gpu_cost_per_m_tokens"] = (price * gpus / (3600 * tok.where(tok > 0)) * 1e6).where(gpus > 0) \
        if price else math.nan
    return out[["config", "slo", *RESULT_COLUMNS]]
