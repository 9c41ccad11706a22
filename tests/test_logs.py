"""servesweep.logs.configure: one call per job sends servesweep's records, stamped, and stderr to the job's log."""
import logging
import re
import sys

import pytest

from servesweep import logs

pytestmark = pytest.mark.shares_host


def test_configure_writes_stamped_records_and_stderr_to_the_log(tmp_path, monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setattr(logging.getLogger("servesweep"), "level", logging.getLogger("servesweep").level)
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(logs, "_terminal", None)
    path = tmp_path / "job.log"
    stream = logs.configure(path)
    try:
        logging.getLogger("servesweep.bench").info("[ar] cell measured")
        logging.getLogger("servesweep.bench").debug("not at INFO")
        logging.getLogger("urllib3").info("a library's chatter")
        logging.getLogger("urllib3").warning("a library's warning")
        print("a progress bar line", file=sys.stderr)
    finally:
        stream.close()
    lines = path.read_text().splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO servesweep\.bench: \[ar\] cell measured", lines[0])
    assert lines[1].endswith("WARNING urllib3: a library's warning")
    assert lines[2] == "a progress bar line" and len(lines) == 3


def test_a_record_for_the_terminal_reaches_the_stderr_the_job_started_with_as_well(tmp_path, monkeypatch):
    """A job's log gets every record; the stderr Snakemake gave the job (its terminal) gets only the bare lines
    logged with ``extra=logs.TERMINAL``."""
    import io

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setattr(logging.getLogger("servesweep"), "level", logging.getLogger("servesweep").level)
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(logs, "_terminal", None)
    path = tmp_path / "job.log"
    stream = logs.configure(path)
    try:
        assert logs.terminal() is terminal and sys.stderr is stream
        logging.getLogger("servesweep.bench").info("ar b0: cell 1/4 done", extra=logs.TERMINAL)
        logging.getLogger("servesweep.bench").info("only in the log")
        print("a progress bar line", file=sys.stderr)
    finally:
        stream.close()
    assert terminal.getvalue() == "ar b0: cell 1/4 done\n"
    assert path.read_text().splitlines()[0].endswith("INFO servesweep.bench: ar b0: cell 1/4 done")
    assert "only in the log" in path.read_text() and "a progress bar line" in path.read_text()
