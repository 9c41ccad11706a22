"""The speculation gate: ran / never drafted / engine cannot tell / not speculative, on constructed cell frames."""
import math

import pandas as pd
import pytest

from servesweep.engines import get_engine
from servesweep.speculation import SpeculationStatus, failed_speculation_configs, speculation_status

pytestmark = pytest.mark.shares_host

NAN = math.nan
CELLS = [(128, 1), (128, 8), (128, 64), (512, 1), (512, 8), (512, 64)]


def _cells(config, drafted=None, accepted=None, verify=None, **extra):
    rows = []
    for i, (ctx, conc) in enumerate(CELLS):
        row = {"config": config, "ctx": ctx, "concurrency": conc, "output_tokens": 512}
        for col, values in (("spec_drafted_tokens", drafted), ("spec_accepted_tokens", accepted),
                            ("spec_verify_steps", verify)):
            if values is not None:
                row[col] = values[i] if isinstance(values, list) else values
        for col, values in extra.items():
            row[col] = values[i] if isinstance(values, list) else values
        rows.append(row)
    return rows


LLAMA_NGRAM = {"config": "ngram", "engine": "llamacpp", "labels": {"speculative": "ngram-simple"},
               "options": {"parallel": 4, "spec_type": "ngram-simple", "spec_ngram_size_n": 3}}
LLAMA_AR = {"config": "ar", "engine": "llamacpp", "labels": {"speculative": "none"}, "options": {"parallel": 4}}


def test_ran():
    cells = pd.DataFrame(_cells("ngram", drafted=[100, 80, 0, 90, 70, 60], accepted=[40, 30, 0, 35, 20, 10],
                                verify=[20, 16, 0, 18, 14, 12]))
    s = speculation_status(cells, [LLAMA_NGRAM])["ngram"]
    assert s == SpeculationStatus("ngram", "ngram-simple", True, 400.0, 135.0, s.reason)
    assert s.reason == ("asked for ngram-simple; the server counted 400 draft tokens proposed and 135 accepted in 5 of "
                        "6 cells (none in ctx=128 C=64)")
    assert failed_speculation_configs({"ngram": s}) == []


def test_never_drafted():
    cells = pd.DataFrame(_cells("ngram", drafted=0.0, accepted=0.0, verify=0.0) + _cells("ar", drafted=0.0,
                                                                                         accepted=0.0, verify=0.0))
    statuses = speculation_status(cells, [LLAMA_AR, LLAMA_NGRAM])
    s = statuses["ngram"]
    assert s.requested == "ngram-simple" and s.ran is False
    assert s.drafted_tokens == 0.0 and s.accepted_tokens == 0.0
    assert s.reason == "asked for ngram-simple; the server's counters stayed at 0 draft tokens proposed over all 6 cells"
    assert failed_speculation_configs(statuses) == ["ngram"]
    assert failed_speculation_configs(list(statuses.values())) == ["ngram"]
    # no guessed cause in the sentence
    assert "because" not in s.reason and "probably" not in s.reason


def test_never_drafted_counts_only_reporting_cells():
    cells = pd.DataFrame(_cells("ngram", drafted=[0, 0, NAN, 0, 0, NAN], verify=[0, 0, NAN, 0, 0, NAN]))
    s = speculation_status(cells, [LLAMA_NGRAM])["ngram"]
    assert s.ran is False
    assert s.reason.endswith("over the 4 of 6 cells that reported it")


def test_engine_cannot_tell():
    # the columns are absent (an engine or a run without the counters) or NaN: nothing is known
    for cells in (pd.DataFrame(_cells("ngram")), pd.DataFrame(_cells("ngram", drafted=NAN, accepted=NAN, verify=NAN))):
        s = speculation_status(cells, [LLAMA_NGRAM])["ngram"]
        assert s.requested == "ngram-simple" and s.ran is None
        assert math.isnan(s.drafted_tokens) and math.isnan(s.accepted_tokens)
        assert "not known" in s.reason
        assert failed_speculation_configs({"ngram": s}) == []


def test_not_speculative():
    cells = pd.DataFrame(_cells("ar", drafted=0.0, accepted=0.0, verify=0.0))
    s = speculation_status(cells, [LLAMA_AR])["ar"]
    assert s.requested is None and s.ran is None and s.reason == "no speculative decoding asked for"
    assert failed_speculation_configs({"ar": s}) == []
    # spec_type none is no request either
    none = dict(LLAMA_AR, config="none", options={"spec_type": "none"})
    assert speculation_status(pd.DataFrame(_cells("none")), [none])["none"].requested is None


def test_verify_steps_only_engine():
    # SGLang counts verify steps but not draft tokens
    meta = {"config": "eagle", "engine": "sglang", "labels": {}, "options": {"speculative_algorithm": "eagle3"}}
    ran = speculation_status(pd.DataFrame(_cells("eagle", drafted=NAN, verify=[50, 40, 30, 20, 10, 5])), [meta])
    assert ran["eagle"].ran is True and ran["eagle"].requested == "EAGLE3"
    assert ran["eagle"].reason == "asked for EAGLE3; the server counted 155 speculative verify steps in 6 of 6 cells"
    zero = speculation_status(pd.DataFrame(_cells("eagle", drafted=NAN, verify=0.0)), [meta])["eagle"]
    assert zero.ran is False and math.isnan(zero.drafted_tokens)
    assert zero.reason == "asked for EAGLE3; the server's counters stayed at 0 speculative verify steps over all 6 cells"
    # only a log's acceptance length: positive evidence, never proof of absence
    by_len = speculation_status(pd.DataFrame(_cells("eagle", accept_length=2.5)), [meta])["eagle"]
    assert by_len.ran is True and "acceptance lengths exceed 1" in by_len.reason
    flat = speculation_status(pd.DataFrame(_cells("eagle", accept_length=1.0)), [meta])["eagle"]
    assert flat.ran is None


def test_requested_from_labels_when_options_say_nothing():
    meta = {"config": "x", "engine": "llamacpp", "labels": {"speculative": "ngram-simple"}, "options": {}}
    s = speculation_status(pd.DataFrame(_cells("x", drafted=0.0, verify=0.0)), [meta])["x"]
    assert s.requested == "ngram-simple" and s.ran is False and s.reason.startswith("asked for ngram-simple (by its labels)")


def test_configs_without_meta_or_cells():
    cells = pd.DataFrame(_cells("orphan", drafted=0.0))
    statuses = speculation_status(cells, [LLAMA_NGRAM])
    assert statuses["orphan"].requested is None
    assert statuses["ngram"].ran is None and statuses["ngram"].reason == "asked for ngram-simple; no cells were measured"


def test_speculation_requested_per_engine():
    llama, sglang, vllm = (get_engine(n) for n in ("llamacpp", "sglang", "vllm"))
    assert llama.speculation_requested({"spec_type": "ngram-simple"}) == "ngram-simple"
    assert llama.speculation_requested({"spec_type": "none"}) is None
    assert llama.speculation_requested({"draft_model": "/d.gguf"}) == "draft-simple"
    assert llama.speculation_requested({}, draft_model="qwen-0.5b") == "draft-simple"
    assert llama.speculation_requested({"spec_type": "draft-simple", "draft_model": "/d.gguf"}) == "draft-simple"
    assert llama.speculation_requested({"parallel": 4}) is None
    assert sglang.speculation_requested({"speculative_algorithm": "dflash"}) == "DFLASH"
    assert sglang.speculation_requested({"speculative_algorithm": "NONE"}) is None
    assert sglang.speculation_requested({"tp": 2}) is None
    assert sglang.speculation_requested({"speculative_algorithm": "standalone"}, draft_model="d") == "STANDALONE"
    assert vllm.speculation_requested({"speculative_config": {"method": "eagle3", "model": "d"}}) == "eagle3"
    assert vllm.speculation_requested({"speculative_config": {"model": "d", "num_speculative_tokens": 3}}) == \
        "draft_model"
    assert vllm.speculation_requested({"speculative_config": None}) is None
    assert vllm.speculation_requested({}) is None
    assert vllm.speculation_requested({"speculative_config": {"method": "draft_model", "num_speculative_tokens": 4}},
                                      draft_model="d") == "draft_model"
