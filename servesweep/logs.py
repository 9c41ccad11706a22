"""One place that sets up logging for a pipeline job: each module logs to ``logging.getLogger(__name__)``, and the
job's adapter script calls :func:`configure` once with its Snakemake log file."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(log_path: str | Path, level: int = logging.INFO) -> TextIO:
    """Send this job's log records (servesweep's at ``level``, other libraries' warnings) and its stderr to
    ``log_path``, each record stamped with its time. stderr goes there too, so progress bars (tqdm writes to
    stderr), tracebacks and warnings land in the same file, in order. Returns the open stream."""
    stream = open(log_path, "w", buffering=1)
    sys.stderr = stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    logging.getLogger("servesweep").setLevel(level)
    return stream
