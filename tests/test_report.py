"""Findings written from the data: verdict wording, rankings, anomalies."""
import pandas as pd
import pytest

from servesweep.report import anomalies, best_per_cell


def cells(**extra):
    df = pd.DataFrame({
        "config": ["ar", "ar", "ar", "spec", "spec", "spec"],
        "ctx": [128] * 6,
        "concurrency": [1, 2, 4, 1, 2, 4],
        "agg_output_tok_s": [77.0, 115.0, 113.0, 91.0, 133.0, 90.0],
        "errors": [0, 0, 0, 0, 1, 0],
        "requests": [4, 4, 8, 4, 4, 8],
    })
    for k, v in extra.items():
        df[k] = v
    return df


def test_best_per_cell_skips_client_bound_cells():
    df = cells(client_bound=[False, False, False, False, True, False])
    best = best_per_cell(df).set_index("concurrency")["config"].to_dict()
    assert best == {1: "spec", 2: "ar", 4: "ar"}


def test_anomalies_errors_and_no_drop_called_without_repeats():
    found = "\n".join(anomalies(cells()))
    assert "`spec` ctx=128 C=2: 1 of 4 requests in the measured windows failed" in found
    assert "throughput falls" not in found  # one repeat: no interval, so no drop is called
