"""Small numeric helpers that must stay cheap to import (no numpy or scipy: engines and telemetry use them)."""
from __future__ import annotations

import math
import statistics
from typing import Iterable


def mean_or_nan(values: Iterable[float]) -> float:
    """The arithmetic mean, or NaN for no values."""
    values = list(values)
    return statistics.fmean(values) if values else math.nan
