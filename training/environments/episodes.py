"""Drive one episode: the model speaks, its tool calls run in the task's sandbox, the
results go back, until it answers without a tool call or a budget runs out; then the
grader reads the final state.

The model is any `complete(messages, tools, max_tokens) -> Completion`: the trainer's
policy, a vLLM server, or a deployment's gateway through the `openai` client, so the
same loop serves training, evaluation and the demo agent. `episode_steps` is that loop as
a generator that yields each model request, for a caller that serves the turns of many
episodes in one batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from training.environments.base import Environment, EpisodeAudit, Grade, Task


@dataclass
class Completion:
    """One assistant turn. `message` is in the OpenAI chat format (`content`, optional
    `tool_calls` with `function.arguments` as a JSON string); `tokens` counts the tokens
    the model generated; `extra` carries what the caller needs later (token ids, logprobs,
    the served model's name)."""

    message: dict[str, Any]
    tokens: int
    finish_reason: str = "stop"
    extra: dict[str, Any] = field(default_factory=dict)


Complete = Callable[[list[dict[str, Any]], list[dict[str, Any]], int], Completion]
# What an episode asks the model for: (the messages so far, the tools, the tokens left).
TurnRequest = tuple[list[dict[str, Any]], list[dict[str, Any]], int]


@dataclass
class Episode:
    task: Task
    messages: list[dict[str, Any]]
    completions: list[Completion]
    grade: Grade
    end: str  # "answered", "step_budget" or "token_budget"
    tool_calls: int
    tool_errors: int
    tokens: int
    seconds: float
    audit: EpisodeAudit = field(default_factory=EpisodeAudit)

    @property
    def reward(self) -> float:
        return self.grade.reward

    @property
    def budget_exhausted(self) -> bool:
        return self.end != "answered"

    def metadata(self, environment: str) -> dict[str, Any]:
        """What a recorded trace keeps about the episode."""
        return {
            "environment": environment,
            "task_id": self.task.id,
            "split": self.task.split,
            "reward": self.grade.reward,
            "reason": self.grade.reason,
            "end": self.end,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "tokens": self.tokens,
            "collateral_changes": len(self.audit.collateral_changes),
            "unknown_ids": len(self.audit.unknown_ids),
            "policy_violations": len(self.audit.policy_violations),
            "audit": self.audit.as_dict(),
        }


def episode_run(
    env: Environment,
    task: Task,
    complete: Complete,
    *,
    max_steps: int | None = None,
    max_tokens: int | None = None,
) -> Episode:
    """Run `task` to its end in a fresh state and grade it. The state is closed whatever
    happens; a tool's failure is a tool result, never an exception here."""
    steps = episode_steps(env, task, max_steps=max_steps, max_tokens=max_tokens)
    completion = None
    while True:
        try:
            request = steps.send(completion)
        except StopIteration as done:
            return done.value
        try:
            completion = complete(*request)
        except BaseException:
            steps.close()  # closes the state
            raise


def episode_steps(
    env: Environment,
    task: Task,
    *,
    max_steps: int | None = None,
    max_tokens: int | None = None,
) -> Generator[TurnRequest, Completion, Episode]:
    """`episode_run` with the model call turned inside out: the generator yields each
    request for the model, (messages, tools, max_tokens), is sent the model's
    `Completion`, and returns the graded `Episode`. A caller can so run many episodes in
    step and serve their model turns in one batch without a thread per episode; closing
    the generator early closes the state."""
    max_steps = max_steps or env.max_steps
    max_tokens = max_tokens or env.max_tokens
    started = time.perf_counter()
    messages = task.first_messages()
    completions: list[Completion] = []
    tokens = tool_calls = tool_errors = 0
    end = "step_budget"
    state = env.reset(task)
    try:
        for _ in range(max_steps):
            remaining = max_tokens - tokens
            if remaining <= 0:
                end = "token_budget"
                break
            completion = yield messages, task.tools, remaining
            completions.append(completion)
            tokens += completion.tokens
            message = {"role": "assistant", **{k: v for k, v in completion.message.items() if k != "role"}}
            messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                end = "answered"
                break
            for call in calls:
                function = call.get("function") or {}
                result = env.execute(state, task, function.get("name", ""), function.get("arguments"))
                tool_calls += 1
                tool_errors += int(result.error)
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.get("id", ""),
                        "name": function.get("name", ""),
                        "content": result.content,
                    }
                )
        else:
            # The last turn still asked for tools: the step budget ended the episode.
            end = "step_budget"
        grade = env.grade(state, messages)
        audit = env.audit(state, messages)
    finally:
        env.close(state)
    return Episode(
        task=task,
        messages=messages,
        completions=completions,
        grade=grade,
        end=end,
        tool_calls=tool_calls,
        tool_errors=tool_errors,
        tokens=tokens,
        seconds=time.perf_counter() - started,
        audit=audit,
    )


def episode_replay(env: Environment, task: Task, messages: list[dict[str, Any]]) -> tuple[Grade, EpisodeAudit]:
    """A logged episode's grade and audit, recomputed from its conversation alone: every tool
    call of its assistant turns runs again, in order, in a fresh state of `task` (as
    `episode_run` ran them), then the grader and the audit read that state and the logged
    messages. A harness that reports no audit (the gateway logs only the conversation) still
    gets its collateral changes counted. Tools are functions of the state and their
    arguments, so the replayed state is the one the episode left; the messages are untrusted
    (any shape): what is not a call is skipped, a malformed call is an error result as it
    was live."""
    messages = [m for m in messages if isinstance(m, dict)]
    state = env.reset(task)
    try:
        for message in messages:
            if message.get("role") != "assistant":
                continue
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                function = call.get("function") if isinstance(call, dict) else None
                function = function if isinstance(function, dict) else {}
                name = function.get("name")
                env.execute(state, task, name if isinstance(name, str) else "", function.get("arguments"))
        return env.grade(state, messages), env.audit(state, messages)
    finally:
        env.close(state)
