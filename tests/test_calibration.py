"""Calibration tests that can fail: the verdict rule's error rates, power and intervals measured on simulated sweeps
with known truth (benchmarks/calibration.py), rules that are wrong on purpose failing the same checks, and a
known-truth server (tests/truth_server.py) measured by the real load generator in blocks."""
import math

import numpy as np

from servesweep import decide


def test_one_launch_rounds_decide_nothing():
    """Rounds of one launch per config leave launch-to-launch variation out of the interval: such a comparison
    keeps its interval but is "not measurable", and is not counted in the Benjamini–Hochberg family."""
    rng = np.random.default_rng(0)
    a, b = np.exp(rng.normal(0, 0.005, 4)), np.exp(rng.normal(0.3, 0.005, 4))   # 1.35×, tight rounds
    one = decide.unpaired(a, b, decide.ONE_LAUNCH)
    assert one.measurable and one.lo > 1.2                                       # an interval, for display
    blocks = decide.paired(dict(enumerate(a)), dict(enumerate(b)))
    alone = decide.decide([blocks], decide.Rule())[0]
    both = decide.decide([blocks, one], decide.Rule())
    assert both[1].verdict == decide.NOT_MEASURABLE
    assert both[0].verdict == alone.verdict == decide.FASTER
    assert both[0].q_difference == alone.q_difference                            # family of one, not two
    assert decide.decide([decide.unpaired(a, b)], decide.Rule())[0].verdict == decide.FASTER  # launches: decides
