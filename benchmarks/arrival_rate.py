"""Arrival-rate fidelity of the load generator's open-loop mode: configured vs measured request rate, send lag.

    python3 benchmarks/arrival_rate.py                                # default rates, constant + Poisson
    python3 benchmarks/arrival_rate.py --rates 1 50 --arrival poisson --seconds 20 --out /tmp/rate.json
    python3 benchmarks/arrival_rate.py --smoke                        # one short constant-rate cell (the tests)

A minimal streaming ``/v1/completions`` endpoint (aiohttp, in a process of its own so that the client is what is
measured) answers each request with ``--tokens`` one-token events after ``--ttft-ms``, ``--gap-ms`` apart. For each
rate the load generator runs one rate cell exactly as the bench job does (``run_load`` with an ``ArrivalPlan`` and a
``WindowPlan``: warm-up at the rate, then the measured window) and this prints, over the window:

- ``sent/s``: requests sent inside the window / window length (the cell's ``achieved_arrival_rps``); with
  constant gaps its count is whole, so over a window of W s it can be off by up to 1/(rate × W) from the rate;
- ``span/s``: (sends − 1) / (last send − first send) inside the window, the rate without that rounding;
- ``sched/s``: what the seeded schedule put inside the window (a Poisson schedule's own count varies around the
  rate: the client is judged against it);
- send lag p50/p99/max (send − scheduled − cap wait) and the client's event-loop lag p99/max (a stall of the
  client process, by the OS or a neighbour, shows in both).

The goal is a measured arrival rate within 2 % of the configured one (constant gaps) and of the schedule's own
(Poisson). Results: docs/performance.md, "Arrival-rate fidelity".
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servesweep import stats  # noqa: E402
from servesweep.loadgen import ArrivalPlan, LoadSpec, Prompt, WindowPlan, run_load  # noqa: E402
from servesweep.workloads import TextPrompts  # noqa: E402

# The embedded default's highest rate (config/config.yaml: ar's request_rates) and higher ones.
DEFAULT_RATES = (0.5, 1.0, 10.0, 50.0, 200.0, 500.0)


def _serve(port_out, ttft_s: float, gap_s: float) -> None:
    """The endpoint's process: serve until killed, after reporting the port it listens on."""
    from aiohttp import web

    sys.path.insert(0, str(ROOT / "tests"))
    from fake_stream import stream_completion

    async def completions(request: web.Request) -> web.StreamResponse:
        return await stream_completion(request, await request.json(), ttft_s, gap_s, 4)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        port_out.put(site._server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    asyncio.run(main())


def measure(url: str, rate: float, arrival: str, seconds: float, tokens: int, seed: int) -> dict:
    """One rate cell against ``url``; the fidelity figures over its window."""
    spec = LoadSpec(base_url=url, model="m", concurrency=512, prompts=[], output_tokens=tokens, progress=False,
                    window=WindowPlan(warmup_s=1.0, warmup_requests=1, measure_s=seconds, measure_requests=1,
                                      max_s=seconds + 60),
                    prompt_source=TextPrompts(tuple(Prompt(f"text {i}") for i in range(64))),
                    arrivals=ArrivalPlan(rate=rate, arrival=arrival, max_concurrency=512, seed=seed))
    records, client = asyncio.run(run_load(spec))
    t0, t1 = client["window_start"], client["window_end"]
    a = stats.arrival_stats(records, t0, t1, rate)
    sends = sorted(r["send"] for r in records if t0 <= r["send"] < t1)
    lags = [r["send_lag_s"] * 1e3 for r in records if t0 <= r["send"] < t1]
    span = (len(sends) - 1) / (sends[-1] - sends[0]) if len(sends) > 1 else float("nan")
    return {"rate": rate, "arrival": arrival, "window_s": t1 - t0, "sent": len(sends),
            "sent_rps": a["achieved_arrival_rps"], "span_rps": span, "scheduled_rps": a["scheduled_rps"],
            "sent_vs_rate_pct": 100 * (a["achieved_arrival_rps"] / rate - 1),
            "span_vs_rate_pct": 100 * (span / rate - 1),
            "sent_vs_schedule_pct": 100 * (a["achieved_arrival_rps"] / a["scheduled_rps"] - 1),
            "lag_p50_ms": a["send_lag_p50_ms"], "lag_p99_ms": a["send_lag_p99_ms"], "lag_max_ms": max(lags),
            "queue_p99_s": a["client_queue_p99_s"], "loop_lag_p99_ms": client["loop_lag_p99_ms"],
            "loop_lag_max_ms": client["loop_lag_max_ms"],
            "errors": sum(1 for r in records if r.get("error"))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES))
    p.add_argument("--arrival", choices=["constant", "poisson", "both"], default="both")
    p.add_argument("--seconds", type=float, default=10.0, help="measured window per rate")
    p.add_argument("--min-sends", type=int, default=50,
                   help="lengthen the window of a slow rate to hold at least this many sends")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--ttft-ms", type=float, default=20.0)
    p.add_argument("--gap-ms", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    p.add_argument("--smoke", action="store_true", help="one rate, constant gaps, a 1 s window (what the tests run)")
    args = p.parse_args()
    if args.smoke:
        args.rates, args.arrival, args.seconds, args.min_sends, args.tokens = [20.0], "constant", 1.0, 5, 4
    ctx = multiprocessing.get_context("spawn")
    port = ctx.Queue()
    server = ctx.Process(target=_serve, args=(port, args.ttft_ms / 1e3, args.gap_ms / 1e3), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port.get(timeout=30)}"
    arrivals = ["constant", "poisson"] if args.arrival == "both" else [args.arrival]
    rows = []
    try:
        for arrival in arrivals:
            for rate in args.rates:
                seconds = max(args.seconds, args.min_sends / rate)
                rows.append(measure(url, rate, arrival, seconds, args.tokens, args.seed))
                r = rows[-1]
                print(f"{arrival:8s} {rate:7g}/s  window {r['window_s']:5.1f} s  sent {r['sent']:5d}  "
                      f"sent/s {r['sent_rps']:8.3f} ({r['sent_vs_rate_pct']:+5.1f} %)  "
                      f"span/s {r['span_rps']:8.3f} ({r['span_vs_rate_pct']:+5.1f} %)  "
                      f"sched/s {r['scheduled_rps']:8.3f} (sent {r['sent_vs_schedule_pct']:+5.1f} %)  "
                      f"lag p50/p99/max {r['lag_p50_ms']:.2f}/{r['lag_p99_ms']:.2f}/{r['lag_max_ms']:.2f} ms  "
                      f"loop p99/max {r['loop_lag_p99_ms']:.2f}/{r['loop_lag_max_ms']:.1f} ms  "
                      f"errors {r['errors']}", flush=True)
    finally:
        server.kill()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
