"""Task environments: multi-turn tool tasks whose state lives outside the trainer.

`base` holds the interface and the registry, `episodes` the loop that drives one episode
with any completion function (or, as `episode_steps`, yields each model request to its caller) (the trainer's policy, vLLM, or the gateway through the
`openai` client). Importing this package imports no ML library.
"""

from training.environments.base import (
    DecisionContext,
    DecisionCurve,
    Environment,
    EpisodeAudit,
    Grade,
    Task,
    ToolError,
    ToolResult,
    environment_get,
    environment_kinds,
    environment_names,
    register,
)
from training.environments.episodes import Completion, Episode, episode_replay, episode_run, episode_steps

__all__ = [
    "Completion",
    "DecisionContext",
    "DecisionCurve",
    "Environment",
    "Episode",
    "EpisodeAudit",
    "Grade",
    "Task",
    "ToolError",
    "ToolResult",
    "environment_get",
    "environment_kinds",
    "environment_names",
    "episode_replay",
    "episode_run",
    "episode_steps",
    "register",
]
