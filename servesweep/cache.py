"""The per-machine cache: built engines, assembled models, downloaded workloads."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$SERVESWEEP_CACHE``, else ``~/.cache/servesweep``."""
    return Path(os.environ.get("SERVESWEEP_CACHE", Path.home() / ".cache" / "servesweep"))
