"""A launch that failed: where it failed (its stage), why, where what it measured is kept, and — on its job's last
attempt — the failure recorded as the launch's declared outputs (``meta.json`` with ``status: failed``), so that the
sweep's tables and report are built from the launches that finished (docs/faults.md).
"""
from __future__ import annotations

import json
import shutil
import socket
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from servesweep.plan import BenchJob, JobPaths

# Where a launch can fail (the ``stage`` of its failure record), in the words its failure message uses.
STAGES = {
    "setup": "before its server was launched",  # sandbox probe, draft model, host lease, pre-flight checks
    "launch": "while its server was starting",
    "readiness": "before its server was ready",
    "measurement": "while measuring its matrix",
    "correctness": "in its correctness checks, after its whole matrix was measured",
    "profiles": "in its profile windows, after its matrix and checks were measured",
}
# Lines of the traceback a failure record keeps (the whole traceback is in the job's log).
TRACEBACK_LINES = 12


@dataclass(frozen=True)
class LaunchFailure:
    """Why one launch of a config failed: its ``stage`` (a key of :data:`STAGES`), the error (``reason``), the last
    lines of its traceback, the attempt folder that keeps what it measured, and how many cells it finished there."""

    stage: str
    reason: str
    traceback_tail: str
    attempt_dir: str | None
    cells_measured: int = 0

    @classmethod
    def of(cls, error: BaseException, stage: str, attempt_dir: Path | None, cells: int = 0) -> "LaunchFailure":
        lines = "".join(traceback.format_exception(error)).rstrip().splitlines()
        kept = str(attempt_dir) if attempt_dir is not None and Path(attempt_dir).exists() else None
        return cls(stage, f"{type(error).__name__}: {error}", "\n".join(lines[-TRACEBACK_LINES:]), kept, cells)

    def as_dict(self) -> dict:
        return asdict(self)


class BenchJobFailed(RuntimeError):
    """A config's job failed: at which stage, why, and where what it measured before failing is kept
    (``failure``)."""

    def __init__(self, message: str, failure: LaunchFailure):
        super().__init__(message)
        self.failure = failure


def failure_message(cfg_name: str, stage: str, error: BaseException, paths: JobPaths, cells: int) -> str:
    """What a failed job says: its stage and error, then the attempt folder that keeps its measurements."""
    return (f"config '{cfg_name}' failed {STAGES[stage]}: {type(error).__name__}: {error}\n"
            f"What it measured is kept in {paths.attempt_dir}/: {cells} cell(s) in cells.csv and repeats.csv, the "
            "requests in requests.jsonl, server.log, telemetry.csv and meta.json (with this error). Before the "
            "job's last attempt Snakemake runs it again; on the last, the failure is recorded as the launch's outputs "
            f"in {paths.cells_csv.parent}/ (status: failed in meta.json) and the report names it.")


def remeasure_command(meta_paths: list[Path]) -> str:
    """The command that measures these launches again (their ``meta.json`` outputs), then rebuilds the report.
    ``--forcerun`` takes every word after it, so it comes after the target."""
    return "snakemake --cores 1 report --forcerun " + " ".join(str(p) for p in meta_paths)


def unlaunched_meta(job: BenchJob) -> dict:
    """The meta of a launch that failed before it launched anything: what its job says."""
    sc = job.server
    return {"config": job.name, "engine": sc.engine, "model": sc.model_name, "labels": sc.labels,
            "options": sc.options, "argv": [], "env": {}, "host": socket.gethostname(), "warnings": [],
            "matrix": job.matrix_section, "slo": job.slo_section(), "cells_measured": 0, **job.block.columns()}


def publish_failure(job: BenchJob, paths: JobPaths, failure: LaunchFailure) -> dict:
    """The declared outputs of a launch that failed on its job's last attempt: ``meta.json`` with ``status:
    failed`` and its ``failure``; cells and repeats empty (a failed launch enters no table); the requests, server
    log and telemetry its attempt kept, as far as it got. The attempt folder (``failure.attempt_dir``) keeps the
    cells it did measure. Returns the meta."""
    attempt = Path(failure.attempt_dir) if failure.attempt_dir else None
    kept = attempt / "meta.json" if attempt is not None else None
    meta = json.loads(kept.read_text()) if kept is not None and kept.exists() else unlaunched_meta(job)
    meta.update(status="failed", error=failure.reason, failure=failure.as_dict())
    paths.cells_csv.parent.mkdir(parents=True, exist_ok=True)
    for out in (paths.cells_csv, paths.repeats_csv):
        out.write_text("")
    for name, out in (("requests.jsonl", paths.requests_jsonl), ("server.log", paths.server_log),
                      ("telemetry.csv", paths.telemetry_csv), ("metrics_series.csv", paths.metrics_series_csv)):
        src = attempt / name if attempt is not None else None
        if src is not None and src.exists():
            shutil.copyfile(src, out)
        else:
            out.write_text("")
    paths.meta_json.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return meta
