"""A sweep's tables, charts and FINDINGS.md rebuilt from its bench jobs' run folders, outside Snakemake.

The same library calls as the pipeline's aggregate_tables, check_lossless, plot_charts and write_findings rules; the
recorded GPU examples regenerate their reports with it, and so can anyone holding copied run folders.
"""
from __future__ import annotations

import gzip
import json
import re
import tempfile
from pathlib import Path

from servesweep.aggregate import build_tables_in, closed_loop
from servesweep.correctness.table import write_correctness_tables
from servesweep.decide import Rule
from servesweep.report import FindingsInputs, write_findings
from servesweep.slo import slos_from_config


def _server_log(run: Path) -> str | None:
    if (run / "server.log").is_file():
        return (run / "server.log").read_text(errors="replace")
    if (run / "server.log.gz").is_file():
        with gzip.open(run / "server.log.gz", "rt", errors="replace") as f:
            return f.read()
    return None


LAUNCH_MARK = re.compile(r"^==== servesweep: block (\d+),", re.M)


def launch_log(text: str, block: int | None) -> str:
    """The part of a collected ``server.log`` that the launch of ``block`` wrote: the collect step joins the
    launches' logs, each under a ``==== servesweep: block N, …`` line, and a fact read per launch (the first weight
    load is the target's) must not read another launch's lines. The whole text where it has no such lines."""
    marks = list(LAUNCH_MARK.finditer(text))
    for i, m in enumerate(marks):
        if int(m.group(1)) == (block or 0):
            return text[m.start():marks[i + 1].start() if i + 1 < len(marks) else len(text)]
    return text if not marks else ""


def metas_with_log_facts(runs: list[Path], scratch: Path) -> list[Path]:
    """Each run's meta.json path; where its record lacks start-up facts that its engine now reads from the server
    log (``Engine.log_facts_for_old_runs``), or holds one whose reading was corrected since
    (``Engine.log_facts_corrected``), and the run folder has that log, a copy under ``scratch`` with the facts read
    again from the log of the launch the record describes (its keys listed in ``startup_phases_reread``); every other
    recorded value is kept."""
    from servesweep.engines import engine_names, get_engine

    paths, rewritten = [], False
    for run in runs:
        paths.append(run / "meta.json")
        meta = json.loads(paths[-1].read_text())
        engine = get_engine(meta["engine"]) if meta.get("engine") in engine_names() else None
        phases = meta.get("startup_phases") or {}
        missing = [k for k in (engine.log_facts_for_old_runs if engine else ()) if k not in phases]
        corrected = list(engine.log_facts_corrected) if engine else []
        text = launch_log(_server_log(run) or "", meta.get("block")) if missing or corrected else None
        if not text:
            continue
        found = engine.startup_phases(engine.parse_log(text))
        added = {k: found[k] for k in missing if k in found}
        added.update({k: found[k] for k in corrected if k in found and phases.get(k) != found[k]})
        if added:
            meta["startup_phases"] = {**phases, **added, "startup_phases_reread": sorted(added)}
            scratch.mkdir(parents=True, exist_ok=True)
            paths[-1] = scratch / f"{run.name}.meta.json"
            paths[-1].write_text(json.dumps(meta))
            rewritten = True
    if rewritten:  # the report orders configs by their meta's path: keep every one beside the copies
        scratch.mkdir(parents=True, exist_ok=True)
        for i, (run, path) in enumerate(zip(runs, paths)):
            if path.parent != scratch:
                paths[i] = scratch / f"{run.name}.meta.json"
                paths[i].write_bytes(path.read_bytes())
    return paths


def _requests(run: Path) -> list[dict]:
    path = run / "requests.jsonl"
    opener = (lambda: open(path)) if path.is_file() else (lambda: gzip.open(run / "requests.jsonl.gz", "rt"))
    with opener() as f:
        return [json.loads(line) for line in f if line.strip()]


def runs_with_send_bursts(runs: list[Path], scratch: Path) -> list[Path]:
    """The run folders the tables are built from: ``runs``, or where a run recorded before ``send_bursts`` (how many
    bursts its window's sends fell into, ``stats.send_bursts``) holds its requests, copies under ``scratch`` whose
    repeats.csv has that column counted from the requests of each round's window (same block, cell and window);
    every recorded value is kept."""
    import pandas as pd

    from servesweep.stats import send_bursts

    recorded = [r for r in runs if (r / "repeats.csv").is_file() and (r / "repeats.csv").stat().st_size]
    todo = [r for r in recorded if "send_bursts" not in pd.read_csv(r / "repeats.csv", nrows=0).columns
            and ((r / "requests.jsonl").is_file() or (r / "requests.jsonl.gz").is_file())]
    if not todo:
        return runs
    out = []
    for run in runs:
        copy = scratch / "runs" / run.name
        copy.mkdir(parents=True, exist_ok=True)
        for name in ("cells.csv", "repeats.csv", "meta.json"):
            if (run / name).is_file():
                (copy / name).write_bytes((run / name).read_bytes())
        if run in todo:
            repeats, requests = pd.read_csv(run / "repeats.csv"), pd.DataFrame(_requests(run))
            counts = []
            for row in repeats.itertuples():
                mask = (requests["send"] >= row.window_start) & (requests["send"] < row.window_end)
                for key in ("block", "workload", "ctx", "concurrency"):
                    if key in requests and key in repeats and pd.notna(getattr(row, key)):
                        mask &= requests[key] == getattr(row, key)
                counts.append(send_bursts(requests.loc[mask, "send"]))
            bursts = pd.DataFrame({"send_bursts": counts}, index=repeats.index)
            pd.concat([repeats, bursts], axis=1).to_csv(copy / "repeats.csv", index=False)
        out.append(copy)
    return out


def report_from_runs(run_dirs: list[Path], config: dict, env_card: Path, out: Path, charts: bool = False) -> str:
    """Tables, correctness tables, the charts' specs (with ``charts``, their PNG and SVG too), FINDINGS.md and the
    HTML page (``index.html``) under ``out`` from ``run_dirs`` (each a ``results/runs/<cfg>`` folder) of a sweep whose
    config (schema defaults applied) is ``config``; the host card is ``env_card``. Returns the report's text."""
    baseline = config["baseline"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = [Path(r) for r in run_dirs]
    with tempfile.TemporaryDirectory() as scratch:
        tables = build_tables_in(runs_with_send_bursts(runs, Path(scratch)), baseline, out, config["cost"],
                                 Rule.from_config(config.get("decision")))
    write_correctness_tables([r / "coding_eval.json" for r in runs], [r / "greedy.jsonl" for r in runs],
                             [r / "meta.json" for r in runs], baseline, out / "correctness.csv",
                             out / "correctness.md")
    import pandas as pd

    from servesweep.charts import write_charts
    from servesweep.metrics_series import read_series
    from servesweep.report.page import write_page

    # As the plot_charts rule: the charts are drawn against concurrency.
    probes = tables.capacity_probes
    write_charts(closed_loop(pd.read_csv(tables.cells)), closed_loop(pd.read_csv(tables.speedup)), baseline,
                 out, capacity_probes=pd.read_csv(probes) if probes.stat().st_size > 1 else None,
                 series=read_series([r / "metrics_series.csv" for r in runs]),
                 metas=[json.loads((r / "meta.json").read_text()) for r in runs], images=charts)
    with tempfile.TemporaryDirectory() as scratch:
        inputs = FindingsInputs(cells=tables.cells, repeats=tables.repeats, noise=tables.noise,
                                throughput_md=tables.throughput_md, speedup=tables.speedup,
                                speedup_md=tables.speedup_md, energy_md=tables.energy_md,
                                correctness=out / "correctness.csv", correctness_md=out / "correctness.md",
                                metas=metas_with_log_facts(runs, Path(scratch)), env_card=env_card,
                                capacity=tables.capacity, capacity_probes=tables.capacity_probes,
                                series=[r / "metrics_series.csv" for r in runs])
        text = write_findings(out / "FINDINGS.md", inputs, baseline, slos_from_config(config), config["cost"],
                              screen_path=out / "first_screen.json")
    write_page(out / "index.html", out / "FINDINGS.md", out / "first_screen.json")
    return text


def report_from_example(example: Path, out: Path | None = None, charts: bool = False) -> str:
    """The report of a recorded example folder: ``config.yaml`` (the config the run used), ``runs/<cfg>/`` (its bench
    jobs' outputs, one per server config) and ``pipeline/env/<host>.md`` (the host card the pipeline wrote) in;
    tables and FINDINGS.md under ``out`` (default ``<example>/report``). Returns the report's text."""
    import yaml

    from servesweep.config import apply_defaults

    example = Path(example)
    config = apply_defaults(yaml.safe_load((example / "config.yaml").read_text()))
    runs = [example / "runs" / name for name in config["server_configs"] if (example / "runs" / name).is_dir()]
    if not runs:
        raise FileNotFoundError(f"{example / 'runs'}: no run folder of any of the config's server_configs")
    cards = sorted((example / "pipeline" / "env").glob("*.md"))
    if len(cards) != 1:
        raise FileNotFoundError(f"{example / 'pipeline' / 'env'}: expected one host card (*.md), found {len(cards)}")
    return report_from_runs(runs, config, cards[0], out or example / "report", charts=charts)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m servesweep.rebuild",
                                 description="Rebuild a recorded example's tables, FINDINGS.md and HTML page from its "
                                             "run folders.")
    ap.add_argument("example", type=Path, help="the example folder (config.yaml, runs/, pipeline/env/)")
    ap.add_argument("out", type=Path, nargs="?", help="where to write (default: EXAMPLE/report)")
    ap.add_argument("--charts", action="store_true", help="draw the charts as PNG and SVG too")
    args = ap.parse_args(argv)
    report_from_example(args.example, args.out, charts=args.charts)
    print((args.out or args.example / "report") / "FINDINGS.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
