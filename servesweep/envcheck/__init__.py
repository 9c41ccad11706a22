"""Per-host environment checks. Each check says ok / warn / fail / skipped, why, and the fix.

Probing and judging are separate: :func:`gather_facts` asks the host (NVML, libcuda through ctypes, ``nvcc``, a
subprocess in the engine's Python for torch / Triton / FlashInfer / flash_attn and the modules each engine names in
``Engine.host_needs``, each engine's ``host_version``, the disk, ``print(1)`` through the coding eval's bwrap
sandbox), and each ``check_*`` turns facts into a verdict, so tests can drive every branch with injected facts.
What an engine needs comes from the engine registry. A failing check that matters for the sweep's configs
(``blocks``) stops the pipeline before any server starts.

``probes`` asks, ``checks`` judges. Run ``python3 -m servesweep.envcheck --card`` to print this host's card.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from servesweep.envcheck.checks import CHECKS, check_host, nvls_configs, raise_for_blockers, render_card
from servesweep.envcheck.probes import cpu_model, gather_facts, probe_disk, probe_multicast_env

__all__ = ["CHECKS", "check_host", "cpu_model", "gather_facts", "main", "nvls_configs", "probe_disk",
           "probe_multicast_env", "raise_for_blockers", "render_card"]


def main(argv: list[str] | None = None) -> int:
    """Print this host's card (``--card``) and/or write its facts (``--json``); exit 1 if a needed check fails."""
    parser = argparse.ArgumentParser(prog="python3 -m servesweep.envcheck", description=__doc__.split("\n")[0])
    parser.add_argument("--card", action="store_true", help="print the markdown card")
    parser.add_argument("--json", type=Path, help="write the checks as JSON here")
    parser.add_argument("--engines", default="", help="engines the sweep uses, comma-separated (default: none, so "
                        "nothing blocks and every engine is reported)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs one server needs (default 0)")
    parser.add_argument("--root", type=Path, default=Path("."), help="where resources/ lives (for the disk check)")
    args = parser.parse_args(argv)
    needs = {"engines": [e for e in args.engines.split(",") if e], "max_gpus": args.gpus, "models": {}}
    result = check_host(needs, [], [], root=args.root)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.card or not args.json:
        print(render_card(result))
    return 1 if any(c.get("blocks") for c in result["checks"]) else 0

