"""The search agent: prompts and styles, action parsing, the episode loop, and the trajectory record."""

from asearch.agent.loop import AgentConfig, run_episode
from asearch.agent.parsing import Action, parse_action
from asearch.agent.styles import STYLES, AgentStyle, get_style
from asearch.agent.trajectory import Segment, Trajectory, Turn

__all__ = [
    "STYLES",
    "Action",
    "AgentConfig",
    "AgentStyle",
    "Segment",
    "Trajectory",
    "Turn",
    "get_style",
    "parse_action",
    "run_episode",
]
