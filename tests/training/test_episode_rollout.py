"""Episodes advanced in step: one batched model call per round serves every episode still
running, and a failure stops them all with every sandbox released."""

from __future__ import annotations

import pytest

from tests.training.test_episode_grpo import scripted_generate
from training.environments.files import FileTasks
from training.trainer.episode_rollout import episodes_rollout


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class Counted(FileTasks):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.opened = self.closed = 0

    def reset(self, task):
        self.opened += 1
        return super().reset(task)

    def close(self, state):
        self.closed += 1
        super().close(state)


def test_a_sampling_failure_stops_every_episode_and_releases_every_sandbox(tokenizer):
    env = Counted(count=4, heldout=0, example=False)
    calls: list = []
    scripted = scripted_generate(tokenizer, calls)

    def generate(contexts, limits, seeds):
        if calls:  # the second round: every episode is halfway, after its tool call
            raise ConnectionError("the inference server went away")
        return scripted(contexts, limits, seeds)

    with pytest.raises(ConnectionError, match="went away"):
        episodes_rollout(
            env,
            env.tasks()[:2],
            group_size=3,
            tokenizer=tokenizer,
            generate=generate,
            stop_ids={tokenizer.eos_token_id},
        )
    assert len(calls) == 1 and len(calls[0]) == 6
    assert env.opened == env.closed == 6


def test_episodes_that_end_early_leave_the_later_batches(tokenizer):
    """An episode that answers at once is graded and leaves; the others' next turn is
    batched without it."""
    env = Counted(count=4, heldout=0, example=False)
    calls: list = []
    scripted = scripted_generate(tokenizer, calls)
    eos = tokenizer.eos_token_id
    done = [*tokenizer("Nothing to do.", add_special_tokens=False)["input_ids"], eos]

    def generate(contexts, limits, seeds):
        out = scripted(contexts, limits, seeds)
        if len(calls) == 1:
            out[0].ids = done  # episode 0 answers without a tool call
        return out

    episodes = episodes_rollout(
        env, env.tasks()[:1], group_size=3, tokenizer=tokenizer, generate=generate, stop_ids={eos}
    )
    assert [len(batch) for batch in calls] == [3, 2]
    assert [len(e.completions) for e in episodes] == [1, 2, 2]
    assert env.opened == env.closed == 3


def test_one_sandbox_whose_teardown_fails_leaves_no_other_open_and_hides_no_cause(tokenizer):
    class FirstCloseFails(Counted):
        def close(self, state):
            super().close(state)
            if self.closed == 1:
                raise OSError("sandbox teardown failed")

    env = FirstCloseFails(count=4, heldout=0, example=False)
    calls: list = []
    scripted = scripted_generate(tokenizer, calls)

    def generate(contexts, limits, seeds):
        if calls:
            raise ConnectionError("the inference server went away")
        return scripted(contexts, limits, seeds)

    with pytest.raises(ConnectionError, match="went away"):  # the cause, not the teardown
        episodes_rollout(
            env,
            env.tasks()[:2],
            group_size=3,
            tokenizer=tokenizer,
            generate=generate,
            stop_ids={tokenizer.eos_token_id},
        )
    assert env.opened == env.closed == 6
