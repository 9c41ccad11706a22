"""Run the pipeline's bench job (``servesweep.bench.run_config``) for the configs in ``config.yaml`` beside this
file (the copy of ``config/h200-sglang.yaml`` that the recorded run used).

    python3 examples/h200-sglang/run_bench.py --model MODEL_DIR --results RESULTS_DIR [ar ngram ar-nograph]

``MODEL_DIR`` is a directory written by ``python -m servesweep.dummy_model --arch llama-dense`` (served with
``--load-format dummy``); SGLang is the one importable by this Python. Each config's run folder lands in
``RESULTS_DIR/runs/<config>/``, as the pipeline's ``bench_config`` rule writes it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from servesweep.bench import JobPaths, run_config  # noqa: E402
from servesweep.config import check_config  # noqa: E402
from servesweep.engines import get_engine  # noqa: E402
from servesweep.models import materialise  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Command line: run the named configs (default: all) one after another."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--results", required=True, type=Path)
    ap.add_argument("configs", nargs="*")
    args = ap.parse_args(argv)
    raw = yaml.safe_load((Path(__file__).resolve().parent / "config.yaml").read_text())
    model_name = next(iter(raw["models"]))
    raw["models"][model_name]["source"] = {"local": str(args.model.resolve())}
    config = check_config(raw)
    facts = get_engine("sglang").prepare(config["engines"]["sglang"], sys.stderr)
    manifest = materialise(model_name, config["models"][model_name], args.results / "models", log=sys.stderr)
    for cfg in args.configs or list(config["server_configs"]):
        paths = JobPaths.for_config(args.results, cfg)
        meta = run_config(cfg, config, manifest, facts, paths, log=sys.stderr)
        print(f"{cfg}: {meta['status']}, {meta['cells_measured']} cells, ready after {meta['ready_s']:.1f} s",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
