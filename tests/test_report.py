"""Findings written from the data: verdict wording, rankings, anomalies."""
import pandas as pd
import pytest

from servesweep.report import anomalies, best_per_cell, pays_verdict, speculative_findings


def series(speedups, conc=(1, 2, 4, 8)):
    return pd.DataFrame({"concurrency": list(conc), "speedup": speedups})


@pytest.mark.parametrize("speedups, words", [
    ([2.0, 1.2, 0.9, 0.8], "pays up to C=2 and stops paying from C=4 on"),
    ([0.9, 0.95, 1.1, 1.2], "pays only from C=4 on"),
    ([1.1, 0.9, 1.2, 0.8], "pays at C=1, 4 only"),
    ([1.5, 1.5, 1.5, 1.5], "pays at every concurrency measured"),
    ([0.5, 0.6, 0.7, 0.8], "never beats the baseline"),
    ([1.01, 1.02, 0.99, 1.0], "never beats the baseline"),  # within the noise margin
])
def test_pays_verdict(speedups, words):
    assert pays_verdict(series(speedups)) == words


def test_seeds_ddtree_case():
    # The user's DDTree measurement: 2.15x at C=1, no gain at C=64.
    sp = pd.DataFrame({"config": ["ddtree"] * 3, "ctx": [60] * 3, "concurrency": [1, 32, 64],
                       "speedup": [303 / 132.7, 1.10, 1.0]})
    (line,) = speculative_findings(sp, baseline="ar")
    assert "pays up to C=32 and stops paying from C=64 on" in line and "C=1: 2.28×" in line


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


def test_anomalies_errors_and_throughput_drop():
    found = "\n".join(anomalies(cells()))
    assert "`spec` ctx=128 C=2: 1 of 4 requests failed" in found
    assert "`spec` ctx=128: throughput falls from 133.0 tok/s at C=2 to 90.0 at C=4" in found
    assert "`ar` ctx=128: throughput falls" not in found  # 115 -> 113 is within 5 %
