"""Engine registry: one module per engine, all behind :class:`servesweep.engines.base.Engine`."""
from __future__ import annotations

from servesweep.engines.base import Engine, LaunchSpec, LogEvent

_ENGINES: dict[str, Engine] = {}


def _load() -> None:
    from servesweep.engines.llamacpp import LlamaCppEngine
    from servesweep.engines.sglang import SGLangEngine
    from servesweep.engines.vllm import VLLMEngine

    for cls in (LlamaCppEngine, SGLangEngine, VLLMEngine):
        _ENGINES[cls.name] = cls()


def get_engine(name: str) -> Engine:
    """The engine called ``name``; KeyError when there is none."""
    if not _ENGINES:
        _load()
    return _ENGINES[name]


__all__ = ["Engine", "LaunchSpec", "LogEvent", "get_engine"]
