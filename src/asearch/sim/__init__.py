"""The cluster simulator (`asearch sim`): throughput and idle time of synchronous, one-step-off and
fully asynchronous RL on a modelled cluster, calibrated against bench/async_vs_sync.py (docs/sim.md)."""

from asearch.sim.config import Dist, SimConfig
from asearch.sim.model import SimResult, simulate

__all__ = ["Dist", "SimConfig", "SimResult", "simulate"]
