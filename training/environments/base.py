"""The environment interface, small enough to implement in an afternoon.

An environment is a task set plus four methods:

- `tasks()` → the tasks (id, prompt, tools in OpenAI function format, hidden grading data);
- `reset(task)` → a fresh per-episode state (a temporary directory, a copy of a table, …);
- `call(state, name, arguments)` → the tool's result as text; raise `ToolError` for a
  mistake the model should read and recover from;
- `grade(state, messages)` → a `Grade` (reward in [0, 1] and a reason), from the final state.

`close(state)` releases what `reset` made. The step and token budgets are class attributes
the episode loop enforces. Environments register by name with `@register`.
"""

from __future__ import annotations

import importlib
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

MAX_TOOL_RESULT_CHARS = 4000


@dataclass(frozen=True)
class Task:
    """One task. `hidden` is for the grader only and never reaches the model."""

    id: str
    prompt: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    hidden: dict[str, Any] = field(default_factory=dict)
    system: str = ""
    split: str = "train"  # "train", "validation" or "heldout", "test", "fresh" (see episode_job_tasks)
    # Earlier turns shown before the prompt (a worked example in the chat format): small
    # models follow a demonstrated tool call far more readily than a described one.
    examples: tuple[dict[str, Any], ...] = ()

    def first_messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        messages += [dict(m) for m in self.examples]
        messages.append({"role": "user", "content": self.prompt})
        return messages


@dataclass(frozen=True)
class ToolResult:
    content: str
    error: bool = False


@dataclass(frozen=True)
class EpisodeAudit:
    """What an episode did beyond its task, whatever its grade: writes to records the task
    does not concern (`collateral_changes`), tool calls naming ids that appear nowhere
    earlier in the conversation (`unknown_ids`, i.e. invented or remembered from training),
    and writes to the records the task does concern that its expected outcome does not
    contain (`policy_violations`: a refund the policy forbids, a wrong amount, a second
    refund), each described in words. A promotion gate compares the rates of all three
    against the live version's."""

    collateral_changes: tuple[str, ...] = ()
    unknown_ids: tuple[str, ...] = ()
    policy_violations: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "collateral_changes": list(self.collateral_changes),
            "unknown_ids": list(self.unknown_ids),
            "policy_violations": list(self.policy_violations),
        }


@dataclass(frozen=True)
class Grade:
    reward: float  # in [0, 1]
    reason: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"a reward must lie in [0, 1], not {self.reward}")


@dataclass(frozen=True)
class DecisionCurve:
    """What an environment with a parametric rule measures a version's decision against:
    the probability that the turn right after a lookup calls `action`, as a function of one
    number the lookup shows (`x_label`), over `xs`, with the rule's `threshold` (the policy
    acts at or below it). `statuses` are the other values of the looked-up record's status,
    each measured once beside the curve."""

    x_label: str
    action: str
    threshold: int
    xs: tuple[int, ...]
    status: str  # the status the curve is drawn for
    statuses: tuple[str, ...] = ()


@dataclass(frozen=True)
class DecisionContext:
    """One held-out decision point: the conversation right after the lookup, the record made
    to show `status` and `x`, and whether the rule calls `action` there."""

    status: str
    x: int | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    acts: bool


class ToolError(Exception):
    """A tool refused or failed; the message goes back to the model as the tool's result."""


class Environment(ABC):
    """Subclass, set `name`, implement `tasks`, `reset`, `call` and `grade`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    max_steps: ClassVar[int] = 8  # assistant turns per episode
    max_tokens: ClassVar[int] = 1024  # model tokens per episode, all turns together
    # The kinds a task's `hidden["kind"]` may name, each with a label for people: the
    # evaluation reports success and policy violations per kind.
    kinds: ClassVar[dict[str, str]] = {}

    @abstractmethod
    def tasks(self) -> list[Task]: ...

    @abstractmethod
    def reset(self, task: Task) -> Any: ...

    @abstractmethod
    def call(self, state: Any, name: str, arguments: dict[str, Any]) -> str: ...

    @abstractmethod
    def grade(self, state: Any, messages: list[dict[str, Any]]) -> Grade: ...

    def close(self, state: Any) -> None:  # noqa: B027 - optional hook
        """Release what `reset` made (temporary folders, connections)."""

    def tasks_fresh(self, *, seed: int) -> list[Task]:
        """Tasks generated anew from `seed` (split "fresh"), sharing no record ids, customers or
        request wordings with the environment's own train, validation and test splits: a slice
        no training set can have contained, for measuring a candidate on cases it never saw.
        An environment whose tasks are fixed raises `NotImplementedError`."""
        raise NotImplementedError(f"environment {self.name!r} cannot generate fresh tasks")

    def decision_curve(self) -> DecisionCurve | None:
        """The environment's parametric rule, for a decision curve; None where it has none."""
        return None

    def decision_contexts(self, *, tasks: list[Task], per_point: int, every: int = 1) -> list[DecisionContext]:
        """`per_point` held-out decision contexts for each point of `decision_curve()` (every
        `every`-th x of its status and the two either side of the threshold, then each other
        status), built from `tasks` (the split an evaluation measures) so that no context is a
        training conversation."""
        return []

    def audit(self, state: Any, messages: list[dict[str, Any]]) -> EpisodeAudit:
        """What the episode changed or named outside its task (see `EpisodeAudit`); read
        before `close`. An environment that cannot tell returns an empty audit."""
        return EpisodeAudit()

    def task(self, task_id: str) -> Task:
        for task in self.tasks():
            if task.id == task_id:
                return task
        raise KeyError(f"environment {self.name!r} has no task {task_id!r}")

    def tool_names(self, task: Task) -> set[str]:
        return {t["function"]["name"] for t in task.tools if t.get("type") == "function"}

    def execute(self, state: Any, task: Task, name: str, arguments: str | dict[str, Any] | None) -> ToolResult:
        """Run one model-chosen tool call. Never raises: whatever goes wrong (an unknown
        tool, arguments that are not a JSON object, a refusal, a bug in the tool) becomes
        an error result the model reads, so one bad call does not end the episode."""
        if name not in self.tool_names(task):
            known = ", ".join(sorted(self.tool_names(task))) or "none"
            return ToolResult(f"error: unknown tool {name!r}; the tools are: {known}", error=True)
        if isinstance(arguments, str) or arguments is None:
            try:
                arguments = json.loads(arguments or "{}", parse_constant=_not_a_number)
            except RecursionError:
                return ToolResult("error: the arguments are nested too deeply", error=True)
            except ValueError as e:
                # A JSONDecodeError says where; Python's cap on an integer's digits raises a
                # plain ValueError (4,300 digits), as does a NaN or Infinity literal.
                reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e).split(":")[0]
                return ToolResult(f"error: the arguments are not valid JSON ({reason})", error=True)
        if not isinstance(arguments, dict):
            return ToolResult("error: the arguments must be a JSON object", error=True)
        try:
            content = self.call(state, name, arguments)
        except ToolError as e:
            return ToolResult(f"error: {e}", error=True)
        except TypeError as e:  # wrong or missing arguments for the tool's Python signature
            return ToolResult(f"error: bad arguments for {name}: {e}", error=True)
        except Exception as e:  # a tool's bug is the episode's error, not the trainer's
            return ToolResult(f"error: {name} failed: {type(e).__name__}", error=True)
        if len(content) > MAX_TOOL_RESULT_CHARS:
            content = content[:MAX_TOOL_RESULT_CHARS] + f"\n… (cut at {MAX_TOOL_RESULT_CHARS} characters)"
        return ToolResult(content)


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_REGISTRY: dict[str, type[Environment]] = {}
# The modules whose import registers the environments. Outside Django (a worker script, a GPU
# check) these built-ins; the site replaces them with its PRACTICUM_ENVIRONMENT_MODULES setting
# (`environment_modules_set`, from the training app's ready()), so this package needs no settings.
_MODULES: list[str] = ["training.environments.files", "training.environments.support_desk"]


def environment_modules_set(modules: list[str]) -> None:
    """The modules that register environments (imported on the first lookup)."""
    _MODULES[:] = list(modules)


def register(cls: type[Environment]) -> type[Environment]:
    """Class decorator: make an environment available by its `name`."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} needs a name")
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"an environment named {cls.name!r} is already registered ({existing.__name__})")
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtin() -> None:
    # The built-in environments register themselves on import.
    for module in _MODULES:
        importlib.import_module(module)


def environment_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def environment_kinds() -> dict[str, str]:
    """Every registered environment's task kinds with their labels (see `Environment.kinds`)."""
    _load_builtin()
    return {kind: label for cls in _REGISTRY.values() for kind, label in cls.kinds.items()}


def environment_get(name: str, **options: Any) -> Environment:
    _load_builtin()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise KeyError(f"unknown environment {name!r}; registered: {known}") from None
    return cls(**options)
