"""The demo agent: Acme Store's support bot working on `support-desk` tasks through the
gateway, exactly as a customer's agent would.

Each episode is one conversation: the real `openai` client calls the gateway's
`/v1/chat/completions` with the deployment's API key and `X-Practicum-Trace-Id`, so all
turns of the episode land in one trace, served by the deployment's live version. The
tools run in the episode's own copy of the orders table (`training/environments/`).

How outcomes are reported (the way a customer's harness reports them): after a graded
episode the agent posts the environment's grade (`POST /api/v1/grades`) on the trace:
`outcome` success or failure, the reward as `score`, the grader's reason, and the environment
as `source`. A grade is not customer feedback: it is what a program that knows the answer
found. On a tracking task (no programmatic grade) it posts the customer's own words instead
(`POST /api/v1/feedback`, `customer_ref: "customer"`, thumbs down). The overview page reads
the grades as the success rate per model version.

The trace's metadata (sent as the request's `metadata`) names the environment, the task
and its split, so held-out traffic can be told apart. The session id is the customer's visit:
their order within this run (`customer-<order>-<run>`). A progressive release keeps a session
on the version that served it, so a session that outlived the run would tie every later run's
customers to the version that served them first, and a candidate in its first steps would
never see the agent's traffic.

This module needs no Django: it talks HTTP only.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from training.environments.episodes import Completion, episode_run
from training.environments.support_desk import FRESH_SPLIT, ORDER_ID_PATTERN, SPLITS, SupportDesk, tasks_sample

CUSTOMER_REF = "customer"
DEFAULT_TEMPERATURE = 0.7
MAX_TURN_TOKENS = 96
# The harness keeps each turn in the hermes tool-call format with vLLM's structured outputs
# (a 135M model seldom writes a tool call unprompted): the first turn must act on the
# order, later turns act again or answer the customer in a sentence. The gateway passes
# `structured_outputs` through and vLLM's tool parser turns the text into `tool_calls`.
_CALL = (
    r'<tool_call>\{"name": "(lookup_order|issue_refund)", "arguments": \{"order_id": "'
    + ORDER_ID_PATTERN
    + r'"\}\}</tool_call>'
)
_REPLY = r"[A-Z][A-Za-z0-9 ,.$'!?:-]{10,200}[.!?]"
ACT_REGEX = _CALL
ACT_OR_REPLY_REGEX = f"{_CALL}|{_REPLY}"


@dataclass
class DemoEpisode:
    trace_id: str  # the X-Practicum-Trace-Id the episode's turns were logged under
    task_id: str
    split: str
    graded: bool
    reward: float | None  # None for an ungraded task or an episode the gateway failed
    reason: str
    model: str  # the model version that served the first turn
    end: str  # "answered", "step_budget", "token_budget" or "error"
    tool_calls: int = 0
    tool_errors: int = 0
    seconds: float = 0.0
    operator_comment: str = ""  # what an operator would write about this answer (tracking tasks)
    reported: bool = False  # its grade, or the customer's words, were posted
    collateral_changes: int = 0  # writes to orders the task does not concern (the episode's audit)
    unknown_ids: int = 0  # tool calls on ids the conversation never showed
    # Writes to the customer's own order that the task's expected outcome does not contain
    # (a refund the policy forbids): the episode's audit.
    policy_violations: int = 0
    kind: str = ""  # the task's kind (`Task.hidden["kind"]`)

    @property
    def success(self) -> bool | None:
        return None if self.reward is None else self.reward >= 1.0


@dataclass
class VersionOutcome:
    model: str
    episodes: int = 0
    graded: int = 0
    successes: int = 0
    reward_sum: float = 0.0

    @property
    def success_rate(self) -> float | None:
        return self.successes / self.graded if self.graded else None

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.graded if self.graded else None


@dataclass
class DemoRunResult:
    split: str
    episodes: list[DemoEpisode] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def by_model(self) -> dict[str, VersionOutcome]:
        out: dict[str, VersionOutcome] = {}
        for ep in self.episodes:
            row = out.setdefault(ep.model, VersionOutcome(model=ep.model))
            row.episodes += 1
            if ep.reward is not None:
                row.graded += 1
                row.successes += int(bool(ep.success))
                row.reward_sum += ep.reward
        return out

    @property
    def graded(self) -> int:
        return sum(1 for ep in self.episodes if ep.reward is not None)

    @property
    def success_rate(self) -> float | None:
        graded = [ep for ep in self.episodes if ep.reward is not None]
        return sum(1 for ep in graded if ep.success) / len(graded) if graded else None

    @property
    def collateral_rate(self) -> float | None:
        """The share of finished episodes that changed an order the task does not concern."""
        done = [ep for ep in self.episodes if ep.end != "error"]
        return sum(1 for ep in done if ep.collateral_changes) / len(done) if done else None

    @property
    def violation_rate(self) -> float | None:
        """The share of finished episodes that wrote to their own order against the task's
        expected outcome (a policy violation)."""
        done = [ep for ep in self.episodes if ep.end != "error"]
        return sum(1 for ep in done if ep.policy_violations) / len(done) if done else None

    def summary(self) -> str:
        lines = [f"{len(self.episodes)} episodes on {self.split} tasks in {self.seconds:.1f} s"]
        for row in self.by_model.values():
            rate = "—" if row.success_rate is None else f"{row.success_rate:.3f}"
            lines.append(
                f"  {row.model}: success {rate} ({row.successes}/{row.graded} graded, {row.episodes} episodes)"
            )
        return "\n".join(lines)


def _message_dict(message: Any) -> dict[str, Any]:
    data = message.model_dump(exclude_none=True)
    out: dict[str, Any] = {"content": data.get("content") or ""}
    if data.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c.get("id", ""),
                "type": "function",
                "function": {
                    "name": (c.get("function") or {}).get("name", ""),
                    "arguments": (c.get("function") or {}).get("arguments") or "{}",
                },
            }
            for c in data["tool_calls"]
        ]
    return out


class DemoAgentError(RuntimeError):
    """The site refused what the agent sent (a key without the feedback scope, …)."""


def _post_report(client: httpx.Client, path: str, body: dict[str, Any], *, wait_s: float = 20.0) -> bool:
    """Post one grade or piece of feedback; the gateway writes traces off the response path,
    so a trace that is not stored yet (404) is retried for up to `wait_s` seconds."""
    deadline = time.monotonic() + wait_s
    delay = 0.2
    what = "grade" if path.endswith("grades") else "feedback"
    while True:
        response = client.post(path, json=body)
        if response.status_code in (200, 201):
            return True
        if response.status_code != 404 or time.monotonic() > deadline:
            raise DemoAgentError(f"{what} refused ({response.status_code}): {response.text[:300]}")
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def demo_agent_run(
    *,
    base_url: str,
    api_key: str,
    split: str,
    episodes: int,
    seed: int = 0,
    feedback_base_url: str | None = None,
    report: bool = True,
    temperature: float = DEFAULT_TEMPERATURE,
    model: str = "support-bot",
    graded_share: float | None = None,
    constrained: bool = True,
    progress: Callable[[DemoEpisode], None] | None = None,
    fresh_seed: int | None = None,
    concurrency: int = 1,
) -> DemoRunResult:
    """Run `episodes` support-desk conversations of `split` ("train", "validation",
    "test", or "fresh": the slice generated from `fresh_seed`) through the OpenAI-compatible endpoint at `base_url` (the gateway: `<base_url>/v1`).

    With `report`, each graded outcome is posted as a grade, and each tracking answer's
    customer words as customer feedback, to `feedback_base_url` (default: `base_url`). Tasks are drawn reproducibly from `seed`; on the train split a
    quarter of them are tracking questions (no grade, seeded words), runs on the other
    splits are all graded. An episode the endpoint fails is kept with `end="error"` and no reward.

    `concurrency` conversations run at once, as a deployed bot serves several customers: the
    inference server batches them. Each episode's sampling seed is its own, and the result
    lists the episodes in task order whatever order they finish in. Batched decoding is not
    bit-identical to one request at a time, so runs compare only at one concurrency.
    """
    if split not in (*SPLITS, FRESH_SPLIT):
        raise ValueError(f"split must be one of {', '.join((*SPLITS, FRESH_SPLIT))}")
    if episodes < 1:
        raise ValueError("episodes must be at least 1")
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if graded_share is None:
        graded_share = 0.75 if split == "train" else 1.0
    env = SupportDesk()
    tasks = tasks_sample(split=split, count=episodes, seed=seed, graded_share=graded_share, fresh_seed=fresh_seed)
    client = openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=2, timeout=600)
    http = httpx.Client(
        base_url=(feedback_base_url or base_url).rstrip("/"),
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    run_id = uuid.uuid4().hex[:8]
    result = DemoRunResult(split=split)
    started = time.perf_counter()

    def one(index: int, task) -> DemoEpisode:
        trace_id = f"demo-{run_id}-{split}-{index:03d}"
        served: list[str] = []

        def complete(messages, tools, max_tokens_left):
            response = client.chat.completions.create(
                model=model,
                messages=messages,
                tools=tools,
                max_tokens=max(1, min(MAX_TURN_TOKENS, max_tokens_left)),
                temperature=temperature,
                seed=seed * 100_003 + index,
                metadata={
                    "environment": env.name,
                    "task_id": task.id,
                    "split": task.split,
                    # Which fresh slice: task ids repeat across fresh seeds.
                    **({"fresh_seed": str(fresh_seed)} if task.split == FRESH_SPLIT else {}),
                },
                extra_body=(
                    {"structured_outputs": {"regex": ACT_OR_REPLY_REGEX if len(messages) > 2 else ACT_REGEX}}
                    if constrained
                    else None
                ),
                extra_headers={
                    "X-Practicum-Trace-Id": trace_id,
                    "X-Practicum-Session-Id": f"customer-{task.hidden['order_id']}-{run_id}",
                },
            )
            served.append(response.model)
            choice = response.choices[0]
            tokens = response.usage.completion_tokens if response.usage else 0
            return Completion(
                message=_message_dict(choice.message), tokens=tokens, finish_reason=choice.finish_reason or ""
            )

        t0 = time.perf_counter()
        graded = env.graded(task)
        try:
            episode = episode_run(env, task, complete)
        except (openai.AuthenticationError, openai.PermissionDeniedError):
            raise  # a wrong key fails every episode: say so once
        except openai.APIError as e:
            ep = DemoEpisode(
                trace_id=trace_id,
                task_id=task.id,
                split=task.split,
                graded=graded,
                reward=None,
                reason=f"the endpoint failed: {type(e).__name__}: {str(e)[:200]}",
                model=served[0] if served else "",
                end="error",
                seconds=time.perf_counter() - t0,
            )
        else:
            ep = DemoEpisode(
                trace_id=trace_id,
                task_id=task.id,
                split=task.split,
                graded=graded,
                reward=episode.reward if graded else None,
                reason=episode.grade.reason,
                model=served[0] if served else "",
                end=episode.end,
                tool_calls=episode.tool_calls,
                tool_errors=episode.tool_errors,
                seconds=episode.seconds,
                operator_comment=task.hidden.get("operator_comment", ""),
                collateral_changes=len(episode.audit.collateral_changes),
                unknown_ids=len(episode.audit.unknown_ids),
                policy_violations=len(episode.audit.policy_violations),
                kind=str(task.hidden.get("kind") or ""),
            )
            if report:
                ep.reported = _post_report(http, *_report(ep, task, environment=env.name))
        return ep

    try:
        if concurrency == 1:
            for index, task in enumerate(tasks):
                result.episodes.append(one(index, task))
                if progress is not None:
                    progress(result.episodes[-1])
        else:
            done: dict[int, DemoEpisode] = {}
            pool = ThreadPoolExecutor(max_workers=concurrency)
            futures = {pool.submit(one, index, task): index for index, task in enumerate(tasks)}
            try:
                for future in as_completed(futures):
                    done[futures[future]] = future.result()
                    if progress is not None:
                        progress(done[futures[future]])
            except BaseException:
                # A wrong key, refused feedback or Ctrl-C: drop the queued conversations and do
                # not wait out the ones in flight (their clients are closed below).
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            pool.shutdown()
            result.episodes.extend(done[index] for index in range(len(tasks)))
    finally:
        http.close()
        client.close()
    result.seconds = time.perf_counter() - started
    return result


def _report(ep: DemoEpisode, task, *, environment: str) -> tuple[str, dict[str, Any]]:
    """Where to post what the episode left to report, and the body: the environment's grade of
    a graded task, else the customer's own words."""
    if ep.graded and ep.reward is not None:
        return "/api/v1/grades", {
            "external_id": ep.trace_id,
            "outcome": "success" if ep.success else "failure",
            "score": min(1.0, max(0.0, ep.reward)),
            "reason": ep.reason,
            "source": environment,
        }
    return "/api/v1/feedback", {
        "external_id": ep.trace_id,
        "rating": "down",
        "comment": task.hidden.get("customer_feedback", ""),
        "customer_ref": CUSTOMER_REF,
        "idempotency_key": f"{ep.trace_id}:customer",
    }
