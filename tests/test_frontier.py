"""The Pareto frontier of throughput per GPU against tok/s per user."""
import math

import pandas as pd
import pytest

from servesweep.frontier import frontier_by, on_frontier

pytestmark = pytest.mark.shares_host


def points(rows):
    return pd.DataFrame(rows, columns=["config", "user", "gpu"])


def test_dominated_points_are_excluded():
    df = points([("a", 10, 100), ("a", 20, 80), ("b", 15, 90), ("b", 12, 70), ("c", 5, 60)])
    # (12, 70) is beaten by (15, 90) on both axes; (5, 60) by everything; the rest trade one axis for the other
    assert on_frontier(df, "user", "gpu").tolist() == [True, True, True, False, False]


def test_equal_points_both_stay_and_equal_on_one_axis_is_dominated():
    df = points([("a", 10, 100), ("b", 10, 100), ("c", 9, 100), ("d", 10, 99)])
    # a and b tie exactly: neither beats the other. c and d match one axis and lose on the other.
    assert on_frontier(df, "user", "gpu").tolist() == [True, True, False, False]


def test_one_point_configs_and_unmeasured_points():
    df = points([("solo", 50, 50), ("a", 10, 100), ("a", 40, 40), ("lonely", 1, 1), ("nan", math.nan, 500)])
    # a one-point config is on the frontier when nothing dominates it, and off it when something does;
    # a point without a value on one axis was not measured there and is never on it (nor does it dominate)
    assert on_frontier(df, "user", "gpu").tolist() == [True, True, False, False, False]


def test_frontier_per_group():
    df = points([("a", 10, 100), ("b", 20, 200), ("a", 10, 100), ("b", 5, 50)])
    df["prompts"] = ["short", "short", "long", "long"]
    assert frontier_by(df, "user", "gpu", ["prompts"]).tolist() == [False, True, True, False]
