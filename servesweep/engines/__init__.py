"""Engine registry: one module per engine, all behind :class:`servesweep.engines.base.Engine`."""
from __future__ import annotations

from servesweep.engines.base import Engine, LaunchSpec, LogEvent

_ENGINES: dict[str, Engine] = {}


def _load() -> None:
    from servesweep.engines.llamacpp import LlamaCppEngine

    for cls in (LlamaCppEngine,):
        _ENGINES[cls.name] = cls()
    try:
        from servesweep.engines.sglang import SGLangEngine
        _ENGINES[SGLangEngine.name] = SGLangEngine()
    except ImportError:
        pass
    try:
        from servesweep.engines.vllm import VLLMEngine
        _ENGINES[VLLMEngine.name] = VLLMEngine()
    except ImportError:
        pass


def get_engine(name: str) -> Engine:
    """The engine called ``name``; KeyError when there is none."""
    if not _ENGINES:
        _load()
    return _ENGINES[name]


__all__ = ["Engine", "LaunchSpec", "LogEvent", "get_engine"]
