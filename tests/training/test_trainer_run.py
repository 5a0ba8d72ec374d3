"""The one training loop: its typed run state reads the plain state dicts of checkpoints
written before it existed, and it drives any kind's step with the same cadence of
evaluations, reports, monitors, checkpoints and cancels."""

from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures.configs import small
from training.trainer.common import Hooks, batch_for_step
from training.trainer.config import GRPOConfig, MonitorConfig, SFTConfig
from training.trainer.distill import sft_train
from training.trainer.grpo import grpo_train
from training.trainer.items import TurnItem
from training.trainer.monitors import Breach
from training.trainer.policy import (
    Policy,
    latest_checkpoint,
    load_checkpoint,
    load_policy,
    make_optimizer,
    save_checkpoint,
)
from training.trainer.run import RunState, StepOutput, Trainer, run_training

ITEMS = [
    TurnItem(id=f"q{i}", messages=[{"role": "user", "content": f"refund order A{i} please"}], target=f"Sorry, A{i}.")
    for i in range(4)
]


def _old_state(**extra) -> dict:
    """A run state as the loops kept it before `RunState`: a plain dict, as written."""
    history = [
        {"step": s, "reward_mean": 0.5, "loss": 0.1, "response_length": 1000.0, "empty_share": 0.0} for s in (1, 2)
    ]
    breach = {"monitor": "length", "value": 1000.0, "limit": 0.15, "message": "too long", "step": 2}
    return {
        "history": history,
        "evals": [{"step": 0, "reward": 0.25}],
        "start_length": 1000.0,
        "start_canary": None,
        "breaches": [breach],
        **extra,
    }


def test_a_state_dict_round_trips_and_an_old_one_without_active_breaches_reads():
    old = _old_state()
    state = RunState.from_dict(json.loads(json.dumps(old)))
    assert state.history == old["history"] and state.start_length == 1000.0 and state.active_breaches == []
    assert state.to_dict() == old | {"active_breaches": []}
    assert RunState.from_dict(state.to_dict()) == state
    with pytest.raises(ValueError, match="does not know"):
        RunState.from_dict(old | {"lr_schedule": 3})


def test_a_grpo_checkpoint_written_with_a_plain_state_dict_resumes(tiny_model_dir, tmp_path):
    """A checkpoint whose state is the old plain dict: the job goes on from its step with
    its history, evaluations and breaches, the length monitor's baseline from the dict (a
    length of 1000 tokens, so the monitor keeps firing) and that monitor, already firing,
    not reported again."""
    config = small(
        GRPOConfig, tiny_model_dir, steps=4, group_size=4, checkpoint_every=3, monitors=MonitorConfig(window=1)
    )
    policy = load_policy(config, reference=True)
    old = _old_state(active_breaches=["length"])
    save_checkpoint(tmp_path, policy=policy, optimizer=make_optimizer(policy, config), step=2, config=config, state=old)

    steps, breaches, logs = [], [], []
    hooks = Hooks(
        on_step=lambda s, m: steps.append(s),
        on_breach=lambda s, found: breaches.append(found),
        log=logs.append,
    )
    result = grpo_train(
        config=config,
        items=ITEMS,
        score=lambda item, c: [float(len(t) % 2) for t in c],
        run_dir=tmp_path,
        policy=policy,
        hooks=hooks,
        export=False,
    )
    assert logs == ["resumed from step-000002"]
    assert result.status == "finished" and steps == [3, 4]
    assert result.history[:2] == old["history"] and [m["step"] for m in result.history] == [1, 2, 3, 4]
    assert result.evals == old["evals"]
    assert result.breaches[0] == old["breaches"][0]
    assert "length" not in [b["monitor"] for found in breaches for b in found]
    saved = json.loads((latest_checkpoint(tmp_path) / "trainer_state.json").read_text())
    assert saved["step"] == 3 and saved["state"]["start_length"] == 1000.0
    assert "length" in saved["state"]["active_breaches"]


def test_an_sft_checkpoint_without_active_breaches_resumes(tiny_model_dir, tmp_path):
    config = small(SFTConfig, tiny_model_dir, steps=3)
    policy = load_policy(config)
    old = _old_state()
    save_checkpoint(tmp_path, policy=policy, optimizer=make_optimizer(policy, config), step=2, config=config, state=old)
    result = sft_train(config=config, items=ITEMS, run_dir=tmp_path, policy=policy, export=False)
    assert result.status == "finished" and result.step == 3
    assert result.history[:2] == old["history"] and result.history[2]["step"] == 3
    assert result.breaches == old["breaches"]


def _toy_trainer(config) -> Trainer:
    model = torch.nn.Linear(2, 1)
    policy = Policy(model=model, tokenizer=None, device=torch.device("cpu"), adapter="full")
    return Trainer(policy=policy, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config)


def _recorder(events: list, stop_after: int | None = None) -> Hooks:
    polls = {"n": 0}

    def should_stop() -> bool:
        polls["n"] += 1
        return stop_after is not None and polls["n"] > stop_after

    return Hooks(
        on_step=lambda s, m: events.append(("step", s)),
        on_eval=lambda s, m: events.append(("eval", s)),
        on_samples=lambda s, rows: events.append(("samples", s)),
        on_episodes=lambda s, phase, eps: events.append(("episodes", s, phase)),
        on_checkpoint=lambda s, path: events.append(("checkpoint", s)),
        on_breach=lambda s, found: events.append(("breach", s, [b["monitor"] for b in found])),
        should_stop=should_stop,
    )


def _toy_step(n: int, batch: list, started: float) -> StepOutput:
    return StepOutput(
        {"step": n, "response_length": 10.0 + n, "batch": batch}, episodes=[n], samples=lambda: [{"n": n}]
    )


def _toy_evaluate(step: int, state: RunState) -> dict:
    return {"step": step, "reward": float(len(state.history))}


def _toy_monitor(state: RunState) -> list[Breach]:
    # Fires from step 2 on, and stays over.
    return [Breach("length", 1.0, 0.0, "grew")] if len(state.history) >= 2 else []


def test_the_loop_reports_evaluates_monitors_and_checkpoints_on_its_cadence(tmp_path):
    config = GRPOConfig(steps=5, eval_every=2, samples_every=2, checkpoint_every=2, keep_checkpoints=5)
    events: list = []
    result = run_training(
        _toy_trainer(config),
        items=[0, 1, 2],
        step=_toy_step,
        run_dir=tmp_path,
        hooks=_recorder(events),
        evaluate=_toy_evaluate,
        monitor=_toy_monitor,
        export=False,
    )
    assert result.status == "finished" and result.step == 5
    # Samples at step 1 and every 2nd; evaluations at the start, every 2nd step and the last;
    # a monitor reported when it starts firing; no checkpoint after the last step.
    assert events == [
        ("eval", 0),
        ("step", 1),
        ("episodes", 1, "train"),
        ("samples", 1),
        ("step", 2),
        ("episodes", 2, "train"),
        ("samples", 2),
        ("eval", 2),
        ("breach", 2, ["length"]),
        ("checkpoint", 2),
        ("step", 3),
        ("episodes", 3, "train"),
        ("step", 4),
        ("episodes", 4, "train"),
        ("samples", 4),
        ("eval", 4),
        ("checkpoint", 4),
        ("step", 5),
        ("episodes", 5, "train"),
        ("eval", 5),
    ]
    assert [e["reward"] for e in result.evals] == [0.0, 2.0, 4.0, 5.0]
    assert [b["step"] for b in result.breaches] == [2]
    saved = json.loads((latest_checkpoint(tmp_path) / "trainer_state.json").read_text())["state"]
    # The monitors' baseline is the first step's length; the state is the typed one, as a dict.
    assert saved["start_length"] == 11.0 and saved["active_breaches"] == ["length"]
    assert set(saved) == {"history", "evals", "start_length", "start_canary", "breaches", "active_breaches"}


def test_a_cancel_checkpoints_the_last_finished_step_and_a_rerun_goes_on_from_it(tmp_path):
    config = GRPOConfig(steps=4, eval_every=0, samples_every=0, checkpoint_every=0)
    first: list = []
    cancelled = run_training(
        _toy_trainer(config),
        items=[0, 1, 2],
        step=_toy_step,
        run_dir=tmp_path,
        hooks=_recorder(first, stop_after=2),
        export=False,
    )
    assert cancelled.status == "cancelled" and cancelled.step == 2
    assert first[-1] == ("checkpoint", 2)
    again: list = []
    resumed = run_training(
        _toy_trainer(config), items=[0, 1, 2], step=_toy_step, run_dir=tmp_path, hooks=_recorder(again), export=False
    )
    assert resumed.status == "finished" and [m["step"] for m in resumed.history] == [1, 2, 3, 4]
    # Steps 3 and 4 got the batches an uninterrupted run gives them.
    expected = [batch_for_step([0, 1, 2], step=s, size=config.prompts_per_step, seed=config.seed) for s in (1, 2, 3, 4)]
    assert [m["batch"] for m in resumed.history] == expected
    assert [e for e in again if e[0] == "step"] == [("step", 3), ("step", 4)]


def test_a_breach_that_stops_the_job_is_checkpointed_first(tmp_path):
    config = GRPOConfig(
        steps=5, eval_every=0, samples_every=0, checkpoint_every=0, monitors=MonitorConfig(stop_on_breach=True)
    )
    events: list = []
    result = run_training(
        _toy_trainer(config),
        items=[0, 1, 2],
        step=_toy_step,
        run_dir=tmp_path,
        hooks=_recorder(events),
        monitor=_toy_monitor,
        export=False,
    )
    assert result.status == "stopped" and result.step == 2
    assert events[-2:] == [("breach", 2, ["length"]), ("checkpoint", 2)]
    assert latest_checkpoint(tmp_path).name == "step-000002"


def test_the_job_optimizer_is_fused_and_steps_as_torchs_reference_adamw(tiny_model_dir):
    config = small(GRPOConfig, tiny_model_dir, steps=1, device="cpu", weight_decay=0.1)

    def start():
        torch.manual_seed(0)  # the adapter's initial weights
        return load_policy(config)

    fused, loop = start(), start()
    optimizer = make_optimizer(fused, config)
    assert optimizer.defaults["fused"] is True
    assert not make_optimizer(loop, config, sharded=True).defaults["fused"]  # DTensor shards keep the loop
    reference = torch.optim.AdamW(
        loop.trainable_parameters(),
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        betas=(0.9, 0.99),
        foreach=False,
    )
    ids = torch.tensor([[5, 17, 33, 41, 9, 60, 2, 71]])
    for _ in range(3):
        for policy, opt in ((fused, optimizer), (loop, reference)):
            opt.zero_grad(set_to_none=True)
            policy.model(input_ids=ids).logits.pow(2).mean().backward()
            opt.step()
    for a, b in zip(fused.trainable_parameters(), loop.trainable_parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # float rounding only
    assert any(
        not torch.equal(a, b) for a, b in zip(fused.trainable_parameters(), start().trainable_parameters(), strict=True)
    )


def test_a_checkpoint_of_the_per_tensor_optimizer_resumes_fused(tiny_model_dir, tmp_path):
    config = small(GRPOConfig, tiny_model_dir, steps=1, device="cpu")
    policy = load_policy(config)
    ids = torch.tensor([[5, 17, 33, 41, 9, 60, 2, 71]])
    older = torch.optim.AdamW(policy.trainable_parameters(), lr=config.learning_rate, foreach=False)
    policy.model(input_ids=ids).logits.pow(2).mean().backward()
    older.step()
    save_checkpoint(tmp_path, policy=policy, optimizer=older, step=1, config=config, state=_old_state())
    optimizer = make_optimizer(policy, config)
    load_checkpoint(latest_checkpoint(tmp_path), policy=policy, optimizer=optimizer)
    assert optimizer.param_groups[0]["fused"] is True and not optimizer.param_groups[0]["foreach"]
    moments = [optimizer.state[p]["exp_avg"].clone() for p in policy.trainable_parameters()]
    assert any(bool(m.abs().sum() > 0) for m in moments)  # the saved moments, not a fresh start
    optimizer.zero_grad(set_to_none=True)
    policy.model(input_ids=ids).logits.pow(2).mean().backward()
    optimizer.step()  # the fused kernel takes the loaded step counts
    assert all(float(optimizer.state[p]["step"]) == 2.0 for p in policy.trainable_parameters())
