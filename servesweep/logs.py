"""One place that sets up logging for a pipeline job: each module logs to ``logging.getLogger(__name__)``, and the
job's adapter script calls :func:`configure` once with its Snakemake log file."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# ``extra=`` of a record the user should see while the job runs: it goes to the job's log, as every record does, and,
# as its bare message, to the stderr the job started with (Snakemake's terminal, or the SLURM job's output file).
TERMINAL = {"terminal": True}
_terminal: TextIO | None = None


def terminal() -> TextIO | None:
    """The stderr this process started with, once :func:`configure` has sent sys.stderr to the job's log (None
    before): where a job writes the few lines its user should see while it runs."""
    return _terminal


class _ForTerminal(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return bool(getattr(record, "terminal", False))


def configure(log_path: str | Path, level: int = logging.INFO) -> TextIO:
    """Send this job's log records (servesweep's at ``level``, other libraries' warnings) and its stderr to
    ``log_path``, each record stamped with its time. stderr goes there too, so progress bars (tqdm writes to
    stderr), tracebacks and warnings land in the same file, in order. Records logged with ``extra=TERMINAL`` also go,
    as their bare message, to the stderr the process started with (:func:`terminal`). Returns the open stream."""
    global _terminal
    stream = open(log_path, "w", buffering=1)
    if _terminal is None:
        _terminal = sys.stderr
    sys.stderr = stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(FORMAT))
    shown = logging.StreamHandler(_terminal)
    shown.addFilter(_ForTerminal())
    root = logging.getLogger()
    root.handlers[:] = [handler, shown]
    root.setLevel(logging.WARNING)
    logging.getLogger("servesweep").setLevel(level)
    return stream
