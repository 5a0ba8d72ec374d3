"""The file-system sandbox: escapes are refused with a tool error the model reads, the
host is left untouched, parallel episodes do not share state, grading is deterministic."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from training.environments import Completion, environment_get, environment_names, episode_run
from training.environments.files import HELDOUT_WORDS, FileSandbox, FileTasks, grade_files


@pytest.fixture
def host(tmp_path):
    """A folder outside the sandbox with a file the model must never read or change."""
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret")
    return outside


@pytest.fixture
def env():
    return FileTasks(count=8, heldout=2, kinds=("write", "copy"), example=False)


def run_call(env, state, name, **arguments):
    task = env.tasks()[0]
    return env.execute(state, task, name, json.dumps(arguments))


def host_state(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize(
    ("tool", "arguments", "reason"),
    [
        ("read_file", {"path": "../secret.txt"}, "'..' is not allowed"),
        ("read_file", {"path": "a/../../secret.txt"}, "'..' is not allowed"),
        ("write_file", {"path": "../evil.txt", "content": "x"}, "'..' is not allowed"),
        ("list_dir", {"path": ".."}, "'..' is not allowed"),
        ("search", {"query": "secret", "path": "../"}, "'..' is not allowed"),
        ("read_file", {"path": "/etc/passwd"}, "absolute path"),
        ("write_file", {"path": "/tmp/evil.txt", "content": "x"}, "absolute path"),
        ("list_dir", {"path": "/"}, "absolute path"),
        ("read_file", {"path": "C:\\Windows\\win.ini"}, "absolute path"),
        ("read_file", {"path": 5}, "path must be a string"),
    ],
)
def test_escapes_by_name_are_refused_with_a_tool_error(env, host, tool, arguments, reason):
    before = host_state(host)
    state = env.reset(env.tasks()[0])
    try:
        result = run_call(env, state, tool, **arguments)
    finally:
        env.close(state)
    assert result.error and reason in result.content
    assert host_state(host) == before
    assert not Path("/tmp/evil.txt").exists()


def test_a_symlink_out_of_the_sandbox_is_neither_read_nor_written_nor_searched(env, host):
    state = env.reset(env.tasks()[0])
    try:
        (state.root / "link.txt").symlink_to(host / "secret.txt")
        (state.root / "linkdir").symlink_to(host, target_is_directory=True)
        read = run_call(env, state, "read_file", path="link.txt")
        write = run_call(env, state, "write_file", path="link.txt", content="overwritten")
        write_in = run_call(env, state, "write_file", path="linkdir/new.txt", content="planted")
        listed = run_call(env, state, "list_dir", path="linkdir")
        searched = run_call(env, state, "search", query="host secret")
    finally:
        env.close(state)
    assert read.error and "outside the working folder" in read.content
    assert write.error and write_in.error and listed.error
    assert searched.content == "no line contains 'host secret'"
    assert host_state(host) == {"secret.txt": "host secret"}


def test_a_symlink_inside_the_sandbox_is_not_written_through(env):
    state = env.reset(env.tasks()[0])
    try:
        (state.root / "real.txt").write_text("original")
        (state.root / "alias.txt").symlink_to(state.root / "real.txt")
        write = run_call(env, state, "write_file", path="alias.txt", content="changed")
        assert write.error and "symbolic link" in write.content
        assert (state.root / "real.txt").read_text() == "original"
    finally:
        env.close(state)


def test_oversized_writes_and_too_many_files_are_refused(env):
    state = FileSandbox.create(max_write_bytes=100, max_total_bytes=250, max_files=3)
    task = env.tasks()[0]
    try:
        big = env.execute(state, task, "write_file", {"path": "big.txt", "content": "x" * 101})
        assert big.error and "limit for one write is 100" in big.content
        assert not (state.root / "big.txt").exists()
        for name in ("a.txt", "b.txt"):
            assert not env.execute(state, task, "write_file", {"path": name, "content": "y" * 100}).error
        total = env.execute(state, task, "write_file", {"path": "c.txt", "content": "z" * 60})
        assert total.error and "exceed 250 bytes" in total.content
        assert not env.execute(state, task, "write_file", {"path": "c.txt", "content": "z"}).error
        many = env.execute(state, task, "write_file", {"path": "d.txt", "content": "z"})
        assert many.error and "3 files" in many.content
        # Rewriting an existing file is not a new file.
        assert not env.execute(state, task, "write_file", {"path": "a.txt", "content": "short"}).error
    finally:
        state.remove()


def test_a_runaway_loop_gets_a_tool_error_then_the_step_budget_ends_the_episode(env):
    task = env.tasks()[0]
    env.sandbox_limits = {"max_calls": 3}
    seen = []

    def complete(messages, tools, max_tokens):
        seen.append(messages[-1])
        call = {"id": "c", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}
        return Completion({"content": "", "tool_calls": [call]}, tokens=5)

    episode = episode_run(env, task, complete, max_steps=5)
    assert episode.end == "step_budget" and len(episode.completions) == 5
    tool_results = [m["content"] for m in episode.messages if m["role"] == "tool"]
    assert not any(r.startswith("error") for r in tool_results[:3])
    assert all("too many tool calls" in r for r in tool_results[3:])
    assert episode.tool_errors == 2


def test_a_tool_call_with_bad_arguments_is_a_tool_error(env):
    state = env.reset(env.tasks()[0])
    try:
        missing = run_call(env, state, "write_file", path="a.txt")
        extra = run_call(env, state, "read_file", path="a.txt", mode="rb")
        not_there = run_call(env, state, "read_file", path="nothing.txt")
    finally:
        env.close(state)
    assert missing.error and "bad arguments for write_file" in missing.content
    assert extra.error and not_there.error and "no file named" in not_there.content


def test_the_tools_work_inside_the_sandbox(env):
    state = FileSandbox.create({"docs/a.txt": "alpha\nbeta", "b.txt": "gamma beta"})
    task = env.tasks()[0]
    try:
        assert env.execute(state, task, "list_dir", {}).content == "b.txt (10 bytes)\ndocs/"
        assert env.execute(state, task, "read_file", {"path": "./docs/a.txt"}).content == "alpha\nbeta"
        found = env.execute(state, task, "search", {"query": "BETA"}).content
        assert found == "b.txt:1: gamma beta\ndocs/a.txt:2: beta"
        assert not env.execute(state, task, "write_file", {"path": "new/c.txt", "content": "delta"}).error
        assert state.snapshot() == {"b.txt": "gamma beta", "docs/a.txt": "alpha\nbeta", "new/c.txt": "delta"}
    finally:
        state.remove()
    assert not state.root.exists()


def test_the_folder_is_removed_after_the_episode_whatever_happens(env):
    roots = []

    def complete(messages, tools, max_tokens):
        raise RuntimeError("the model server went away")

    original = env.reset

    def reset(task):
        state = original(task)
        roots.append(state.root)
        return state

    env.reset = reset
    with pytest.raises(RuntimeError):
        episode_run(env, env.tasks()[0], complete)
    assert roots and not roots[0].exists()


def test_parallel_episodes_do_not_see_each_other(env):
    """Eight episodes at once, each writing its own marker then listing: each sees only
    its own file and the task's seed files."""
    task = next(t for t in env.tasks() if t.id.startswith("copy"))
    seeded = set(task.hidden["files"])
    barrier = threading.Barrier(8)
    listings: dict[int, str] = {}
    grades = {}

    def agent(n: int):
        turn = {"k": 0}

        def complete(messages, tools, max_tokens):
            turn["k"] += 1
            if turn["k"] == 1:
                args = json.dumps({"path": f"mine-{n}.txt", "content": str(n)})
                call = {"id": "w", "type": "function", "function": {"name": "write_file", "arguments": args}}
                return Completion({"content": "", "tool_calls": [call]}, tokens=3)
            if turn["k"] == 2:
                barrier.wait(timeout=10)  # every episode has written before any lists
                call = {"id": "l", "type": "function", "function": {"name": "list_dir", "arguments": "{}"}}
                return Completion({"content": "", "tool_calls": [call]}, tokens=3)
            listings[n] = messages[-1]["content"]
            return Completion({"content": "done"}, tokens=1)

        grades[n] = episode_run(env, task, complete).grade

    threads = [threading.Thread(target=agent, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(listings) == 8
    for n, listing in listings.items():
        names = {line.split(" ")[0] for line in listing.splitlines()}
        assert names == seeded | {f"mine-{n}.txt"}
    assert len({g.reward for g in grades.values()}) == 1


def test_graders_are_deterministic_and_read_only_the_final_files(env):
    task = next(t for t in env.tasks() if t.id.startswith("copy"))
    (source, word), dest = next(iter(task.hidden["files"].items())), None
    dest = next(p for p in task.hidden["expect"] if p != source)

    def copier(content):
        def complete(messages, tools, max_tokens):
            if messages[-1]["role"] == "tool":
                return Completion({"content": "Copied."}, tokens=2)
            args = json.dumps({"path": dest, "content": content})
            call = {"id": "w", "type": "function", "function": {"name": "write_file", "arguments": args}}
            return Completion({"content": "", "tool_calls": [call]}, tokens=5)

        return complete

    right = [episode_run(env, task, copier(word + "\n")).grade for _ in range(3)]
    wrong = [episode_run(env, task, copier("something else")).grade for _ in range(3)]
    assert {(g.reward, g.reason) for g in right} == {(1.0, "all files correct")}
    assert {(g.reward, g.reason) for g in wrong} == {(0.5, f"{dest} has the wrong content")}
    assert grade_files({"a": "x"}, {"a": "x", "b": None}).reward == 1.0
    assert grade_files({"a": "x", "b": ""}, {"a": "x", "b": None}).reason == "b should not exist"


def test_the_task_family_is_deterministic_and_split():
    a, b = FileTasks(count=20, heldout=5).tasks(), FileTasks(count=20, heldout=5).tasks()
    assert [(t.id, t.prompt, t.hidden) for t in a] == [(t.id, t.prompt, t.hidden) for t in b]
    assert [t.split for t in a].count("heldout") == 5 and len({t.prompt for t in a}) == 20
    # Held-out tasks ask for words that no training task uses.
    words = {t.split: set() for t in a}
    for t in a:
        words[t.split] |= {v for v in t.hidden["expect"].values() if v}
    assert words["heldout"] <= set(HELDOUT_WORDS) and not words["train"] & set(HELDOUT_WORDS)
    # Each opens with a worked example of its kind, then the prompt.
    opening = a[0].first_messages()
    assert [m["role"] for m in opening] == ["user", "assistant", "tool", "assistant", "user"]
    assert opening[-1]["content"] == a[0].prompt
    assert "files" in environment_names()
    assert environment_get("files", count=4, heldout=1).tasks()[0].prompt == a[0].prompt


def test_the_sandbox_lives_in_a_fresh_private_folder(env):
    one, two = env.reset(env.tasks()[0]), env.reset(env.tasks()[0])
    try:
        assert one.root != two.root and one.root.is_dir()
        assert oct(os.stat(one.root).st_mode & 0o777) == "0o700"
    finally:
        env.close(one)
        env.close(two)
