"""Checkpoint engines: one interface, loaded by name (the shape of Django's email backends).

``get_engine("criu", agent)`` imports the class named in ENGINES (or the agent configuration's
``engines`` mapping, or a dotted path given directly) and instantiates it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..util import import_string
from .base import CheckpointEngine, EngineError, EngineUnavailable

if TYPE_CHECKING:
    from ..config import AgentConfig

ENGINES = {
    "criu": "gpusweep_agent.engines.criu.CriuEngine",
    "cuda": "gpusweep_agent.engines.cuda.CudaEngine",
    "signal": "gpusweep_agent.engines.signal.SignalEngine",
    "none": "gpusweep_agent.engines.none.NoneEngine",
}

__all__ = ["ENGINES", "CheckpointEngine", "EngineError", "EngineUnavailable", "get_engine"]


def get_engine(name: str, config: AgentConfig) -> CheckpointEngine:
    dotted = {**ENGINES, **config.engines}.get(name)
    if dotted is None:
        raise EngineUnavailable(f"unknown checkpoint engine {name!r} (known: {', '.join(sorted(ENGINES))})")
    try:
        cls = import_string(dotted)
    except ImportError as exc:
        raise EngineUnavailable(f"checkpoint engine {name!r}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, CheckpointEngine)):
        raise EngineUnavailable(f"checkpoint engine {name!r}: {dotted} is not a CheckpointEngine")
    return cls(config)
