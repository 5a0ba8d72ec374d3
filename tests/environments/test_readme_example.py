"""The environments guide's "Writing an environment" example runs as printed."""

from __future__ import annotations

import json
import re
from pathlib import Path

from training.environments import Completion, base, episode_run

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "environments.md"


def test_the_readme_environment_example_registers_runs_and_grades(monkeypatch):
    text = GUIDE.read_text()
    section = text[text.index("## Writing an environment") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    namespace: dict = {}
    exec(compile(code, str(GUIDE), "exec"), namespace)
    env = base.environment_get("counter")
    task = env.task("reach-7")

    def complete(messages, tools, max_tokens):
        if messages[-1]["role"] == "tool":
            return Completion({"content": "Done."}, tokens=2)
        call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": json.dumps({"n": 7})}}
        return Completion({"content": "", "tool_calls": [call]}, tokens=8)

    episode = episode_run(env, task, complete)
    assert (episode.reward, episode.grade.reason) == (1.0, "counter ended at 7, target 7")
    assert len(env.tasks()) == 20 and sum(t.split == "heldout" for t in env.tasks()) == 4
    bad = env.execute(env.reset(task), task, "add", {"n": "seven"})
    assert bad.error and "n must be an integer" in bad.content
