"""The trace breakdown (servesweep.profiling) against Chrome traces whose answers are known.

Every ``tests/fixtures/profiles/<name>.trace.json[.gz]`` is read; where ``<name>.expected.json`` sits beside it
(the synthetic traces' answers were computed by hand, its ``why`` says how), every figure it names must come out; a
trace without one (a trimmed real trace dropped there) must at least parse into a consistent breakdown.
"""
import gzip
import json
import math
import shutil
from pathlib import Path

import pytest

from servesweep import profiling

pytestmark = pytest.mark.shares_host

FIXTURES = Path(__file__).parent / "fixtures" / "profiles"
TRACES = sorted(p for p in FIXTURES.iterdir() if ".trace.json" in p.name)


def _stem(path: Path) -> str:
    return path.name.split(".trace.json")[0]


def _expected(path: Path) -> dict | None:
    e = path.with_name(_stem(path) + ".expected.json")
    return json.loads(e.read_text()) if e.exists() else None


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_breakdown_of_every_fixture(path):
    expected = _expected(path)
    b = profiling.breakdown(profiling.read_trace(path), (expected or {}).get("requested_steps"))
    cols = b.columns()
    # categories partition the GPU time, whatever the trace
    assert sum(cols[f"profile_{c}_ms"] for c in profiling.CATEGORIES) == pytest.approx(cols["profile_gpu_ms"])
    assert b.kernels > 0
    # (the device's span can be longer than the compute stream's: another stream's work extends it)
    assert 0 <= b.compute_stream_idle_share <= 1 and 0 <= b.device_idle_share <= 1
    if expected is None:
        return
    for name, ms in expected.get("gpu_ms", {}).items():
        assert b.gpu_ms[name] == pytest.approx(ms, abs=1e-9), name
    for key in ("kernels", "graph_launches", "eager_launches", "steps", "steps_source", "graph_kernels"):
        if key in expected:
            assert getattr(b, key) == expected[key], key
    idle_tol = expected.get("idle_share_tolerance", 1e-9)
    assert b.compute_stream_idle_share == pytest.approx(expected["compute_stream_idle_share"], abs=idle_tol)
    if "device_idle_share" in expected:
        assert b.device_idle_share == pytest.approx(expected["device_idle_share"])
    if "graph_kernel_share" in expected:
        assert cols["profile_graph_kernel_share"] == pytest.approx(expected["graph_kernel_share"])
    if "kernel_ms" in expected:
        assert b.total_gpu_ms - b.gpu_ms["copies"] == pytest.approx(expected["kernel_ms"],
                                                                    abs=expected["kernel_ms_tolerance"])
    if "host_step_ms" in expected:
        assert b.host_step_ms == pytest.approx(expected["host_step_ms"])
    assert cols["profile_graph_launches_per_step"] == pytest.approx(expected["graph_launches"] / expected["steps"])


def test_synthetic_fixtures_are_there():
    assert {_stem(p) for p in TRACES} >= {"synthetic-graphs", "synthetic-eager-overlap"}


def test_overlap_counts_once():
    assert profiling.merged_ms([(0, 100), (50, 170), (150, 200), (300, 310)]) == pytest.approx(0.21)
    assert profiling.merged_ms([(0, 100), (10, 20)]) == pytest.approx(0.1)
    assert profiling.merged_ms([]) == 0


@pytest.mark.parametrize("name,want", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("nvjet_tst_128x64_64x8_1x2_h_bz_coopA_TNT", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "gemm"),
    ("fused_moe_kernel", "moe"),
    ("grouped_gemm_nt_masked", "moe"),
    ("flashinfer::BatchDecodeWithPagedKVCacheKernel", "attention"),
    ("flash_fwd_splitkv_kernel", "attention"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("cross_device_reduce_1stage<__nv_bfloat16, 2>", "communication"),
    ("std::enable_if<!(false), void>::type internal::GemvKernel<...>", "gemm"),
    ("void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>", "norm_elementwise"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "norm_elementwise"),
    ("triton_poi_fused_add_mul_0", "norm_elementwise"),
    ("top_k_top_p_sampling_from_probs_kernel", "sampling"),
    ("mystery_op", "other"),
])
def test_category_rules(name, want):
    assert profiling.category(name) == want


def test_gzip_folder_and_ranks_combined(tmp_path):
    """A cell's folder of compressed per-rank traces: times and spans summed, launches per rank."""
    src = FIXTURES / "synthetic-graphs.trace.json"
    for rank in (0, 1):
        with open(src, "rb") as fin, gzip.open(tmp_path / f"1700000000-TP-{rank}.trace.json.gz", "wb") as fout:
            shutil.copyfileobj(fin, fout)
    (tmp_path / "notes.json").write_text("{}")  # not a trace: left out
    one = profiling.breakdown(profiling.read_trace(src))
    both = profiling.folder_breakdown(tmp_path)
    assert both.traces == 2
    assert both.total_gpu_ms == pytest.approx(2 * one.total_gpu_ms)
    assert both.compute_stream_idle_share == pytest.approx(one.compute_stream_idle_share)
    assert both.graph_launches == one.graph_launches and both.steps == one.steps
    (tmp_path / "none").mkdir()
    assert profiling.folder_breakdown(tmp_path / "none") is None


def test_no_steps_means_no_per_step_figures():
    trace = json.loads((FIXTURES / "synthetic-eager-overlap.trace.json").read_text())
    cols = profiling.breakdown(trace).columns()
    assert cols["profile_steps_source"] == "none" and math.isnan(cols["profile_eager_launches_per_step"])


def test_real_sglang_trace_decode_runs_in_cuda_graphs_with_the_gpu_mostly_idle():
    """SGLang 0.5.17 on one H200, Gemma-3-270M at C = 16 with decode CUDA graphs on (README.md beside the trace): one
    graph launch per scheduler step carries almost all kernel time, and the compute stream is idle about two thirds
    of its span — the evidence the report's verdict reads."""
    from servesweep.report import profile as rp

    cols = profiling.breakdown(profiling.read_trace(FIXTURES / "sglang-0.5.17-h200-gemma270m-c16.trace.json.gz"),
                               30).columns()
    assert cols["profile_graph_launches_per_step"] == 1.0 and cols["profile_graph_kernel_share"] > 0.95
    assert rp.trace_verdict(cols)[0] == rp.HOST and rp.graphs_answer(cols).startswith("yes — 1.0 graph launches")
    # a small model: norms and elementwise kernels hold more GPU time than its GEMMs, nothing is communication
    assert cols["profile_norm_elementwise_ms"] > cols["profile_gemm_ms"] > cols["profile_attention_ms"]
    assert cols["profile_communication_ms"] == 0 and cols["profile_moe_ms"] == 0
    assert cols["profile_other_share"] < 0.01
