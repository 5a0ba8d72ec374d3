"""The episode loop: tool results go back to the model, a tool's failure never ends the
episode, budgets end it, and the state is always released."""

from __future__ import annotations

import json

import pytest

from training.environments import Completion, Environment, Grade, Task, ToolError, episode_run, episode_steps

TOOLS = [
    {
        "type": "function",
        "function": {"name": "add", "description": "a + b", "parameters": {"type": "object", "properties": {}}},
    }
]


class Counter(Environment):
    name = "counter-test"
    max_steps = 4

    def __init__(self):
        self.closed = 0

    def tasks(self):
        return [Task(id="t1", prompt="Add 2 and 3.", tools=TOOLS, hidden={"answer": 5})]

    def reset(self, task):
        return {"total": None}

    def call(self, state, name, arguments):
        if arguments.get("a") == "boom":
            raise RuntimeError("a bug in the tool")
        if not isinstance(arguments.get("a"), int):
            raise ToolError("a must be an integer")
        state["total"] = arguments["a"] + arguments["b"]
        return str(state["total"])

    def grade(self, state, messages):
        ok = state["total"] == 5 and "5" in (messages[-1].get("content") or "")
        return Grade(1.0 if ok else 0.0, "added and answered" if ok else "wrong or no answer")

    def close(self, state):
        self.closed += 1


def call(arguments) -> Completion:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    message = {
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": args}}],
    }
    return Completion(message=message, tokens=10, finish_reason="tool_calls")


def scripted(*turns):
    seen = []

    def complete(messages, tools, max_tokens):
        seen.append([dict(m) for m in messages])
        return turns[len(seen) - 1]

    complete.seen = seen
    return complete


def test_a_tool_result_reaches_the_model_and_the_grader_reads_the_final_state():
    env = Counter()
    complete = scripted(call({"a": 2, "b": 3}), Completion({"content": "It is 5."}, tokens=4))
    episode = episode_run(env, env.task("t1"), complete)
    assert episode.reward == 1.0 and episode.end == "answered"
    assert complete.seen[1][-1] == {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "5"}
    assert (episode.tool_calls, episode.tool_errors, episode.tokens, env.closed) == (1, 0, 14, 1)


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ("{not json", "error: the arguments are not valid JSON"),
        ("[1, 2]", "error: the arguments must be a JSON object"),
        ({"a": "x", "b": 1}, "error: a must be an integer"),
        ({"a": "boom", "b": 1}, "error: add failed: RuntimeError"),
        ({"a": 1}, "error: add failed: KeyError"),
    ],
)
def test_a_bad_call_is_an_error_the_model_reads_not_a_crash(arguments, error):
    env = Counter()
    complete = scripted(call(arguments), call({"a": 2, "b": 3}), Completion({"content": "5"}, tokens=1))
    episode = episode_run(env, env.task("t1"), complete)
    assert complete.seen[1][-1]["content"].startswith(error)
    assert episode.tool_errors == 1 and episode.reward == 1.0


def test_an_unknown_tool_is_named_in_the_error():
    env = Counter()
    bad = Completion({"tool_calls": [{"id": "x", "function": {"name": "rm", "arguments": "{}"}}]}, tokens=3)
    complete = scripted(bad, Completion({"content": "no"}, tokens=1))
    episode = episode_run(env, env.task("t1"), complete)
    assert complete.seen[1][-1]["content"] == "error: unknown tool 'rm'; the tools are: add"
    assert episode.reward == 0.0


def test_the_step_budget_ends_an_episode_that_never_answers():
    env = Counter()
    episode = episode_run(env, env.task("t1"), lambda m, t, n: call({"a": 2, "b": 3}))
    assert episode.end == "step_budget" and len(episode.completions) == Counter.max_steps
    assert env.closed == 1


def test_the_token_budget_ends_an_episode_and_the_model_is_told_what_is_left():
    env = Counter()
    budgets = []

    def complete(messages, tools, max_tokens):
        budgets.append(max_tokens)
        return call({"a": 2, "b": 3})

    episode = episode_run(env, env.task("t1"), complete, max_tokens=25)
    assert budgets == [25, 15, 5] and episode.end == "token_budget"


def test_the_state_is_released_when_the_model_fails():
    env = Counter()

    def complete(messages, tools, max_tokens):
        raise ConnectionError("the server went away")

    with pytest.raises(ConnectionError):
        episode_run(env, env.task("t1"), complete)
    assert env.closed == 1


def test_an_episode_driven_step_by_step_is_the_one_episode_run_gives():
    """`episode_steps` yields each model request and is sent the completion: the caller
    (the trainer, serving many episodes in one batch) sees the same requests and gets the
    same episode as `episode_run` with a completion function."""
    turns = (call({"a": 2, "b": 3}), Completion({"content": "It is 5."}, tokens=4))
    env = Counter()
    complete = scripted(*turns)
    direct = episode_run(env, env.task("t1"), complete)

    steps = episode_steps(env, env.task("t1"))
    seen, limits = [], []
    for request in (lambda: next(steps), lambda: steps.send(turns[0])):
        messages, _, limit = request()
        seen.append([dict(m) for m in messages])
        limits.append(limit)
    with pytest.raises(StopIteration) as done:
        steps.send(turns[1])
    stepped = done.value.value
    assert seen == complete.seen and limits == [env.max_tokens, env.max_tokens - 10]
    assert (stepped.messages, stepped.grade, stepped.end, stepped.tokens) == (
        direct.messages,
        direct.grade,
        direct.end,
        direct.tokens,
    )
    assert env.closed == 2


def test_an_episode_closed_halfway_releases_its_state():
    env = Counter()
    steps = episode_steps(env, env.task("t1"))
    next(steps)
    steps.close()
    assert env.closed == 1


def test_environments_are_found_by_name_without_django_settings():
    """A worker script or a GPU check imports the environments without a Django project."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    probe = (
        "import sys; from training.environments import environment_get, environment_names; "
        "print(environment_names(), environment_get('support-desk').name, 'django' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["['files',", "'support-desk']", "support-desk", "False"]


def _turn(*calls, content="") -> Completion:
    """An assistant turn with these (name, arguments) tool calls; none: a reply."""
    message = {"content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(calls)
        ]
    return Completion(message=message, tokens=5, finish_reason="tool_calls" if calls else "stop")


def _order(order_id) -> str:
    return json.dumps({"order_id": order_id})


def test_replaying_a_logged_episode_gives_the_grade_and_audit_it_had_live():
    from training.environments import episode_replay
    from training.environments.support_desk import SupportDesk

    env = SupportDesk()
    task, other = env.tasks_for(split="test", graded=True)[:2]
    mine, theirs = task.hidden["order_id"], other.hidden["order_id"]
    plays = {
        "right": [_turn(("lookup_order", _order(mine))), _turn(("issue_refund", _order(mine))), _turn(content="Done.")],
        # Another customer's order refunded, an invented id, a malformed call and an unknown
        # tool, two calls in one turn: every one of them replays as it ran.
        "harm": [
            _turn(("issue_refund", _order(theirs)), ("lookup_order", "{not json")),
            _turn(("issue_refund", _order("ZZ-999")), ("drop_table", "{}")),
            _turn(("issue_refund", json.dumps({"order_id": mine, "amount": 0.01}))),
            _turn(content="Refunded."),
        ],
        "budget": [_turn(("lookup_order", _order(mine)))] * (env.max_steps + 1),
    }
    for name, turns in plays.items():
        live = episode_run(env, task, scripted(*turns))
        # As the gateway logs it: the conversation only, through a JSON round trip.
        logged = json.loads(json.dumps(live.messages))

        grade, audit = episode_replay(env, task, logged)

        assert (grade, audit) == (live.grade, live.audit), name
    harm = episode_run(env, task, scripted(*plays["harm"]))
    assert harm.audit.collateral_changes and harm.audit.unknown_ids  # the case is not vacuous


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "assistant", "tool_calls": "lookup"}],
        [{"role": "assistant", "tool_calls": [None, 3, {"function": []}, {"function": {"name": ["x"]}}]}],
        [
            "not a message",
            {"role": "assistant", "tool_calls": [{"function": {"name": "issue_refund", "arguments": 7}}]},
        ],
    ],
)
def test_a_replay_of_any_logged_shape_is_a_grade_not_a_crash(messages):
    from training.environments import episode_replay
    from training.environments.support_desk import SupportDesk

    env = SupportDesk()
    task = env.tasks_for(split="test", graded=True)[0]

    grade, audit = episode_replay(env, task, [*task.first_messages(), *messages])

    assert grade.reward == (1.0 if not task.hidden["refund"] else 0.0) and not audit.collateral_changes
