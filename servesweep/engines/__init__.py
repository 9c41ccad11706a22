"""Engine registry: one module per engine, all behind :class:`servesweep.engines.base.Engine`.

This is the one list of engines: the config schema's ``engine`` enum, the Snakemake wildcard constraint and the host
check all read it from here. Importing this package loads nothing else, so that ``python -m
servesweep.engines.llamacpp_build`` runs on a host where only the standard library is installed yet (a bundle's
install step).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servesweep.engines.base import Engine

_ENGINES: dict[str, Engine] = {}


def _load() -> dict[str, Engine]:
    if not _ENGINES:
        from servesweep.engines.llamacpp import LlamaCppEngine
        from servesweep.engines.sglang import SGLangEngine
        from servesweep.engines.vllm import VLLMEngine

        for cls in (LlamaCppEngine, SGLangEngine, VLLMEngine):
            _ENGINES[cls.name] = cls()
    return _ENGINES


def get_engine(name: str) -> Engine:
    """The engine called ``name``; KeyError when there is none."""
    return _load()[name]


def engine_names() -> list[str]:
    """The names of every engine, sorted: what ``server_configs.<name>.engine`` accepts."""
    return sorted(_load())


def all_engines() -> list[Engine]:
    """Every engine, in name order."""
    return [_load()[name] for name in engine_names()]
