"""One clock for the load generator, telemetry and log windows: monotonic, expressed in epoch seconds."""
from __future__ import annotations

import time

_EPOCH0 = time.time()
_MONO0 = time.monotonic()


def now() -> float:
    """Epoch seconds that never go backwards within this process (monotonic since import)."""
    return _EPOCH0 + (time.monotonic() - _MONO0)
