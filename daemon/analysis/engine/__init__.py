"""The attribution engine: divides each GPU idle gap's time among the causes that kept the
feeding threads from launching (docs/attribution.md). One code path for the daemon, offline
reports and drills: feed events in, take Attribution records out."""

from gpujitter.daemon.analysis.engine.engine import Engine, EngineConfig, EngineStats

__all__ = ["Engine", "EngineConfig", "EngineStats"]
