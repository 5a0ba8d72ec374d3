"""Sandbox inputs a model can send that once got through: non-finite refund amounts,
folder trees without bound, integers past Python's digit limit, arguments nested too deep.
Each comes back as a tool error the model reads; the episode, grading and cleanup go on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from training.environments import Completion, environment_get, episode_run
from training.environments.files import FileSandbox, FileTasks


@pytest.fixture
def desk():
    env = environment_get("support-desk")
    task = next(t for t in env.tasks_for(split="train", graded=True) if t.hidden["refund"])
    return env, task


@pytest.mark.parametrize(
    "arguments",
    [
        '{"order_id": "%s", "amount": "nan"}',
        '{"order_id": "%s", "amount": "NaN"}',
        '{"order_id": "%s", "amount": NaN}',
        '{"order_id": "%s", "amount": "-inf"}',
        '{"order_id": "%s", "amount": -Infinity}',
    ],
)
def test_a_refund_of_a_non_finite_amount_is_refused(desk, arguments):
    env, task = desk
    order_id = task.hidden["order_id"]
    state = env.reset(task)
    result = env.execute(state, task, "issue_refund", arguments % order_id)
    assert result.error, result.content
    row = state.rows[order_id]
    assert row["status"] != "refunded" and row.get("refunded_amount") in (None, 0, 0.0)
    # The same through an already-parsed argument object (an SDK that sends a dict).
    result = env.execute(state, task, "issue_refund", {"order_id": order_id, "amount": float("nan")})
    assert result.error and "finite" in result.content


def test_an_integer_past_pythons_digit_limit_is_a_tool_error_not_a_crash(desk):
    env, task = desk
    state = env.reset(task)
    huge = "9" * 5000
    result = env.execute(state, task, "issue_refund", f'{{"order_id": "{task.hidden["order_id"]}", "amount": {huge}}}')
    assert result.error and "not valid JSON" in result.content
    result = env.execute(state, task, "lookup_order", f'{{"order_id": {huge}}}')
    assert result.error


def test_arguments_nested_thousands_deep_are_a_tool_error(desk):
    env, task = desk
    state = env.reset(task)
    result = env.execute(state, task, "lookup_order", "[" * 5000 + "]" * 5000)
    assert result.error


def test_folders_count_against_a_limit_and_depth_is_bounded():
    sandbox = FileSandbox.create()
    try:
        deep = "/".join(["a"] * 1800) + "/x.txt"
        with pytest.raises(Exception, match="too deep"):
            sandbox.write_file(deep, "x")
        sandbox.max_calls = 1000
        made = 0
        with pytest.raises(Exception, match="folders"):
            for i in range(200):
                sandbox.write_file(f"d{i}/e/f.txt", "x")
                made += 1
        assert made * 2 <= sandbox.max_folders
        assert sum(1 for _ in Path(sandbox.root).rglob("*") if _.is_dir()) <= sandbox.max_folders
    finally:
        sandbox.remove()
    assert not sandbox.root.exists()


def test_a_tree_too_deep_to_recurse_is_graded_and_always_removed():
    env = FileTasks(count=4, heldout=1, kinds=("write",), example=False)
    task = env.tasks()[0]
    name, word = next(iter(task.hidden["expect"].items()))
    roots = []

    def complete(messages, tools, max_tokens):
        if len(messages) == 1:
            sandbox_root = roots[0]
            # Something planted a tree 1,800 levels deep (a seed, an earlier bug): reading
            # and removing it must not recurse.
            folder = sandbox_root
            for _ in range(1800):
                folder = os.path.join(folder, "a")
                os.mkdir(folder)
            arguments = json.dumps({"path": name, "content": word})
            return Completion(
                message={
                    "content": "",
                    "tool_calls": [{"id": "c", "function": {"name": "write_file", "arguments": arguments}}],
                },
                tokens=5,
            )
        return Completion(message={"content": "done"}, tokens=1)

    reset = env.reset

    def reset_and_remember(task):
        state = reset(task)
        roots.append(str(state.root))
        return state

    env.reset = reset_and_remember
    episode = episode_run(env, task, complete)
    assert episode.reward == 1.0
    assert not os.path.exists(roots[0])
