"""What sampling the server's /metrics through a window costs the throughput it measures, on the embedded default.

    python3 benchmarks/metrics_sampling.py                       # C = 2, 200 ms, 8 pairs of 6 s windows
    python3 benchmarks/metrics_sampling.py --interval-ms 100 --pairs 6
    python3 benchmarks/metrics_sampling.py --loop-lag            # the sampler's cost to the client's event loop

One llama-server (the embedded default's build and Gemma-3-270M, ``config/config.yaml``'s ``ar`` options) serves
every window, under the host's CPU lease as a bench job holds it (so no other servesweep bench job runs beside it:
two llama-servers spinning on two cores slow each other by far more than any sampler could). Windows alternate with and without the sampler (each pair in a random order, so a drift of the host
does not land on one side); each window is a steady-state cell of synthetic prompts, measured as the bench job
measures it (``stats.window_stats``). Printed: each pair's output tok/s, the paired ratio (with / without) with a
95 % interval over the pairs, and the client's CPU per scrape (scrape plus parse) measured apart for this engine's
exposition and for SGLang's recorded one (/work/shared/fixtures/sglang-0.5.17-h200/ep_metrics.txt, 603 lines).
"""
from __future__ import annotations

import argparse
import asyncio
import io
import math
import random
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import yaml  # noqa: E402

from servesweep import metrics_series, promtext  # noqa: E402
from servesweep.config import check_config  # noqa: E402
from servesweep.engines import get_engine  # noqa: E402
from servesweep.lifecycle import ServerProcess, lease_for_config, wait_until_ready  # noqa: E402
from servesweep.loadgen import LoadSpec, WindowPlan, run_load  # noqa: E402
from servesweep.models import materialise  # noqa: E402
from servesweep.plan import ServerConfig  # noqa: E402
from servesweep.ports import free_port  # noqa: E402
from servesweep.stats import mean_ci95, window_stats  # noqa: E402
from servesweep.workloads import SyntheticPrompts, corpus_text  # noqa: E402

SGLANG_METRICS = Path("/work/shared/fixtures/sglang-0.5.17-h200/ep_metrics.txt")


async def _window(session, server, engine, sc, source, concurrency: int, seconds: float,
                  interval_s: float | None, tag: int) -> dict:
    sampler = (metrics_series.MetricsSampler(session, server.base_url, engine.metrics_path, engine.state_metrics,
                                             interval_s) if interval_s else None)
    spec = LoadSpec(base_url=server.base_url, model=sc.served_name, concurrency=concurrency, prompts=[],
                    output_tokens=32, extra_fields=engine.load_fields(sc), request_timeout_s=60, progress=False,
                    window=WindowPlan(warmup_s=1.0, warmup_requests=concurrency, measure_s=seconds,
                                      measure_requests=2 * concurrency, max_s=4 * seconds),
                    prompt_source=replace(source, tag=tag))
    state: dict = {}

    async def opened():
        if sampler is not None:
            sampler.begin()

    async def closed():
        if sampler is not None:
            state["samples"] = await sampler.end()

    records, client = await run_load(spec, opened, closed)
    out = window_stats(records, client["window_start"], client["window_end"])
    out["samples"] = len(state.get("samples", []))
    out["loop_lag_p99_ms"] = client.get("loop_lag_p99_ms", math.nan)
    return out


def parse_cost_ms(text: str, state_metrics: dict, repeats: int = 200) -> float:
    """CPU ms of one sample's parse (the cut to the named lines, then the Prometheus parser)."""
    t0 = time.process_time()
    for _ in range(repeats):
        metrics_series.read_state(text, state_metrics)
    return 1000 * (time.process_time() - t0) / repeats


async def _measure(args) -> None:
    config = check_config(yaml.safe_load((ROOT / "config" / "config.yaml").read_text()))
    engine = get_engine("llamacpp")
    with tempfile.TemporaryDirectory(prefix="servesweep-metrics-") as tmp:
        tmp = Path(tmp)
        manifest = materialise("gemma-3-270m", config["models"]["gemma-3-270m"], tmp / "model")
        facts = engine.prepare(config["engines"]["llamacpp"], log=io.StringIO())
        sc = ServerConfig.from_config("ar", config)
        spec = engine.launch(sc, Path(manifest["path"]), free_port(), facts)
        lease, _ = lease_for_config(tmp / "servers", dict(sc.env), 0, exclusive_cpu=True,
                                    on_wait=lambda p: print(f"# waiting for the host's CPU lease ({p})", flush=True))
        try:
            await _pairs(args, engine, sc, spec, tmp)
        finally:
            lease.release()


async def _pairs(args, engine, sc, spec, tmp: Path) -> None:
    with ServerProcess(spec, tmp / "server.log", stop_grace_s=5, records_dir=tmp / "servers", name="ar") as server:
        await wait_until_ready(server, engine, sc, 300)
        async with aiohttp.ClientSession() as session:
            async def tok(text):
                return await engine.tokenize(session, server.base_url, text)
            corpus = await tok(corpus_text(2000, seed=17))
            source = await SyntheticPrompts.build(tok, corpus, 128)
            text = await promtext.scrape(session, server.base_url, engine.metrics_path)
            t0 = time.perf_counter()
            for _ in range(50):
                await promtext.scrape(session, server.base_url, engine.metrics_path)
            scrape_ms = 1000 * (time.perf_counter() - t0) / 50
            rng = random.Random(args.seed)
            pairs = []
            print(f"# python3 benchmarks/metrics_sampling.py --concurrency {args.concurrency} --interval-ms "
                  f"{args.interval_ms:g} --pairs {args.pairs} --seconds {args.seconds:g}")
            print("| pair | order | tok/s with | tok/s without | with / without | samples |\n|---|---|---|---|---|---|",
                  flush=True)
            for p in range(args.pairs):
                order = ["with", "without"]
                rng.shuffle(order)
                got = {}
                for k, side in enumerate(order):
                    got[side] = await _window(session, server, engine, sc, source, args.concurrency, args.seconds,
                                              args.interval_ms / 1000 if side == "with" else None, 2 * p + k + 1)
                ratio = got["with"]["agg_output_tok_s"] / got["without"]["agg_output_tok_s"]
                pairs.append(ratio)
                print(f"| {p + 1} | {' then '.join(order)} | {got['with']['agg_output_tok_s']:.1f} | "
                      f"{got['without']['agg_output_tok_s']:.1f} | {ratio:.4f} | {got['with']['samples']} |",
                      flush=True)
    logs = [math.log(r) for r in pairs]
    mean, half = mean_ci95(logs)
    print(f"\nthroughput with sampling / without: {math.exp(mean):.4f} (95 % interval "
          f"[{math.exp(mean - half):.4f}, {math.exp(mean + half):.4f}] over {len(pairs)} pairs; geometric mean); "
          f"median of the pair ratios {statistics.median(pairs):.4f}")
    print(f"one llama-server /metrics scrape: {scrape_ms:.2f} ms wall ({len(text or '')} bytes); parse "
          f"{parse_cost_ms(text or '', engine.state_metrics):.3f} ms CPU")
    if SGLANG_METRICS.exists():
        sg = get_engine("sglang")
        print(f"SGLang's recorded exposition ({SGLANG_METRICS.stat().st_size} bytes): parse "
              f"{parse_cost_ms(SGLANG_METRICS.read_text(), sg.state_metrics):.3f} ms CPU per sample; the full "
              f"Prometheus parse of it {_full_parse_ms(SGLANG_METRICS.read_text()):.3f} ms")


def _full_parse_ms(text: str, repeats: int = 50) -> float:
    t0 = time.process_time()
    for _ in range(repeats):
        promtext.parse_samples(text)
    return 1000 * (time.process_time() - t0) / repeats


SGLANG_FULL = ROOT / "tests" / "data" / "sglang-0.5.17-h200" / "ar-metrics-end.prom"


async def _loop_lag(args) -> None:
    """The load generator's event-loop lag (loadgen.windows.LoopLagMonitor, as a cell measures it) while the sampler
    scrapes SGLang 0.5.17's whole recorded exposition (an H200 run's, 605 lines) from a loopback server every
    interval: with no sampler, with the sampler checking only its first body (what it does), and checking every body
    (what it did), each for ``--seconds``, in rounds of the three in a random order."""
    from aiohttp import web

    from servesweep.loadgen.windows import LoopLagMonitor

    text = SGLANG_FULL.read_text()
    sm = get_engine("sglang").state_metrics

    async def metrics(_request):
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    real_scrape = promtext.scrape
    rng = random.Random(args.seed)
    got: dict[str, list[dict]] = {"none": [], "first body checked": [], "every body checked": []}
    print(f"# python3 benchmarks/metrics_sampling.py --loop-lag --interval-ms {args.interval_ms:g} --seconds "
          f"{args.seconds:g} --pairs {args.pairs}  ({len(text)} bytes, {text.count(chr(10))} lines per scrape)")
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(args.pairs):
                order = list(got)
                rng.shuffle(order)
                for side in order:
                    if side == "every body checked":
                        metrics_series.promtext.scrape = lambda s, b, p, check=True: real_scrape(s, b, p, True)
                    monitor = LoopLagMonitor()
                    monitor.start()
                    sampler = metrics_series.MetricsSampler(session, base, "/metrics", sm, args.interval_ms / 1000)
                    if side != "none":
                        sampler.begin()
                    await asyncio.sleep(args.seconds)
                    if side != "none":
                        await sampler.end()
                    metrics_series.promtext.scrape = real_scrape
                    got[side].append(await monitor.stop())
    finally:
        metrics_series.promtext.scrape = real_scrape
        await runner.cleanup()
    print("| sampler | loop lag p99 (ms), median over rounds | max (ms), largest | mean (ms) |\n|---|---|---|---|")
    for side, rows in got.items():
        print(f"| {side} | {statistics.median(r['loop_lag_p99_ms'] for r in rows):.2f} | "
              f"{max(r['loop_lag_max_ms'] for r in rows):.2f} | "
              f"{statistics.fmean(r['loop_lag_mean_ms'] for r in rows):.3f} |")
    print(f"the whole-body check alone: {_full_parse_ms(text):.2f} ms CPU per body")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--interval-ms", type=float, default=200.0)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--loop-lag", action="store_true",
                    help="measure the sampler's cost to the client's event loop instead (no llama-server)")
    args = ap.parse_args(argv)
    asyncio.run(_loop_lag(args) if args.loop_lag else _measure(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
