"""Where comment-conditioned distillation's teacher reads the operator's comment: in the
system message, or (`hint_at: "last"`) as a user message right before the turn, where a
small model reads it far more (docs/experiments/2026-12-02-comment-hints.md)."""

from __future__ import annotations

import pytest

from tests.fixtures.configs import small
from training.trainer import distill as D
from training.trainer.config import ConfigError, DistillConfig
from training.trainer.distill import distill_train
from training.trainer.items import TurnItem

COMMENT = "Wrong order: they wrote KVY-571, not 571."
ITEMS = [
    TurnItem(
        id=f"q{i}",
        messages=[{"role": "system", "content": "You are the desk."}, {"role": "user", "content": f"order KVY-57{i}"}],
        feedback=COMMENT,
    )
    for i in range(2)
]


@pytest.mark.parametrize("hint_at", ["system", "last"])
def test_the_teacher_reads_the_comment_where_hint_at_puts_it(tiny_model_dir, tmp_path, monkeypatch, hint_at):
    config = small(DistillConfig, tiny_model_dir, samples_per_prompt=2, steps=1, prompts_per_step=2, hint_at=hint_at)
    seen: list[str] = []
    real = D.forward_logits

    def spy(model, ids, attn, keep):
        seen.extend(tokenizer.decode(row) for row in ids)
        return real(model, ids, attn, keep=keep)

    from training.trainer.policy import load_policy

    policy = load_policy(config, reference=True)
    tokenizer = policy.tokenizer
    monkeypatch.setattr(D, "forward_logits", spy)
    distill_train(config=config, items=ITEMS, run_dir=tmp_path, policy=policy, export=False)
    teacher = [text for text in seen if COMMENT in text]
    assert teacher, "the teacher never read the comment"
    for text in teacher:
        hint = text.index(COMMENT)
        customer = text.index("order KVY-57")
        # system: the hint sits in the system message, before the customer's words;
        # last: after them, as the newest message.
        assert (hint > customer) == (hint_at == "last")
    assert all(COMMENT not in text for text in seen if text not in teacher)  # the student never sees it


def test_an_unknown_hint_place_is_refused():
    with pytest.raises(ConfigError, match="hint_at"):
        DistillConfig.from_dict({"model_path": "x", "hint_at": "middle"})
