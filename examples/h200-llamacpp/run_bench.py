"""Run the pipeline's bench job (``servesweep.bench.run_config``) for this example's two configs on one GPU.

    python3 examples/h200-llamacpp/run_bench.py --binary /path/to/llama-server --model gemma-3-270m-q4_k_m.gguf \\
        --results RESULTS_DIR [ar ngram]

The configs are the ones in ``config.yaml`` beside this file: llama.cpp's ``llama-server`` built with CUDA (sm_90),
Gemma-3-270M Q4_K_M fully offloaded, 64 server slots, autoregressive and n-gram speculative decoding. Each config's
run folder lands in ``RESULTS_DIR/runs/<config>/``.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from servesweep.bench import JobPaths, run_config  # noqa: E402
from servesweep.config import apply_defaults  # noqa: E402
from servesweep.engines import get_engine  # noqa: E402
from servesweep.logs import FORMAT  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--results", required=True, type=Path)
    ap.add_argument("configs", nargs="*")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=FORMAT, stream=sys.stderr)
    config = yaml.safe_load((HERE / "config.yaml").read_text())
    config["engines"]["llamacpp"]["binary"] = args.binary
    config = apply_defaults(config)
    engine = get_engine("llamacpp")
    facts = engine.prepare(config["engines"]["llamacpp"], sys.stderr)
    model_name = next(iter(config["models"]))
    manifest = {"path": str(args.model), "files": [{"sha256": config["models"][model_name]["sha256"]}],
                "load_format": "gguf"}
    for cfg in args.configs or list(config["server_configs"]):
        paths = JobPaths.for_config(args.results, cfg)
        meta = run_config(cfg, config, manifest, facts, paths)
        print(f"{cfg}: {meta['status']}, {meta['cells_measured']} cells", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
