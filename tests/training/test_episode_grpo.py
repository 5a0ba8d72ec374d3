"""Full-episode GRPO: the orchestrator runs G sandboxed episodes per task with batched
model turns, the loss covers the model's own tokens of every turn, rewards combine the
grader and a judge by the configured weights, and the fidelity guard flags a job whose
reward rises with its tool errors."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from training.environments import Grade
from training.environments.files import FileTasks
from training.trainer.config import EpisodesConfig, MonitorConfig
from training.trainer.episode_loss import episode_batch, episode_loss_backward
from training.trainer.episode_rollout import SampledTurn, episodes_rollout
from training.trainer.episode_tokens import episode_segments, episode_tokens
from training.trainer.episodes import episode_rewards, episode_stats, episodes_train
from training.trainer.monitors import fidelity


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def scripted_generate(tokenizer, calls: list[list[list[int]]]):
    """A model that, on its first turn, writes the task's file (right word on even
    episodes, wrong on odd ones) and then says it is done. Records every batch."""
    eos = tokenizer.eos_token_id

    def generate(contexts, limits, seeds):
        calls.append([list(c) for c in contexts])
        out = []
        for row, context in enumerate(contexts):
            text = tokenizer.decode(context)
            if "<tool_response>" in text:
                out.append(SampledTurn([*tokenizer("Done.", add_special_tokens=False)["input_ids"], eos]))
                continue
            name, word = re.findall(r"named (\S+) that contains the word (\w+)", text)[-1]
            args = {"path": name, "content": word if row % 2 == 0 else "wrong"}
            call = f'<tool_call>{{"name": "write_file", "arguments": {json.dumps(args)}}}</tool_call>'
            out.append(SampledTurn([*tokenizer(call, add_special_tokens=False)["input_ids"], eos]))
        return out

    return generate


def test_the_orchestrator_batches_the_turns_of_parallel_episodes_in_separate_sandboxes(tokenizer):
    env = FileTasks(count=4, heldout=0, example=False)
    tasks = env.tasks()[:2]
    calls: list = []
    episodes = episodes_rollout(
        env,
        tasks,
        group_size=3,
        tokenizer=tokenizer,
        generate=scripted_generate(tokenizer, calls),
        stop_ids={tokenizer.eos_token_id},
    )
    # Two model turns per episode, each served for all six episodes in one batch.
    assert [len(batch) for batch in calls] == [6, 6]
    assert [e.task.id for e in episodes] == [tasks[0].id] * 3 + [tasks[1].id] * 3
    assert all(len(e.completions) == 2 and e.end == "answered" for e in episodes)
    assert all(e.tool_calls == 1 and e.tool_errors == 0 for e in episodes)
    # Every episode wrote into its own folder: the graders saw only their own file.
    rewards = [e.reward for e in episodes]
    assert sum(rewards) in (2.0, 3.0, 4.0) and set(rewards) == {0.0, 1.0}
    # The second turn was generated from exactly the prefix training uses.
    for e in episodes:
        sampled = [c.extra["ids"] for c in e.completions]
        ids, mask = episode_tokens(episode_segments(tokenizer, e.messages, e.task.tools, sampled))
        start = len(ids) - len(sampled[1])
        assert ids[:start] in calls[1]
        assert mask[start:] == [1] * len(sampled[1])
    stats = episode_stats(episodes)
    assert stats["tool_error_rate"] == 0.0 and stats["budget_exhaustion"] == 0.0 and stats["early_stop"] == 0.0
    assert stats["turns"] == 2.0


def _one_group(tokenizer):
    """One file task played 4 times by a scripted model: its episodes, their batch and
    fixed advantages."""
    env = FileTasks(count=2, heldout=0, example=False)
    episodes = episodes_rollout(
        env,
        env.tasks()[:1],
        group_size=4,
        tokenizer=tokenizer,
        generate=scripted_generate(tokenizer, []),
        stop_ids={tokenizer.eos_token_id},
    )
    batch = episode_batch(tokenizer, episodes, [0, 1, 2, 3], tokenizer.pad_token_id)
    return episodes, batch, torch.tensor([1.0, -1.0, 0.5, -0.5])


def test_the_loss_value_counts_exactly_the_sampled_tokens(tiny_model_dir, tokenizer):
    """With one update per batch the surrogate's value is -Σ_b A_b · n_b / constant, n_b
    the tokens the model sampled in episode b: a mask that covered a prompt or a tool
    result token would change it."""
    from training.trainer.policy import load_policy

    config = EpisodesConfig(model_path=str(tiny_model_dir), adapter="full", log_kl=False, temperature=1.0)
    policy = load_policy(config)
    episodes, batch, advantages = _one_group(tokenizer)
    out = episode_loss_backward(policy, batch, advantages, config=config, constant=1000.0, micro_batch=3)
    counts = [sum(len(c.extra["ids"]) for c in e.completions) for e in episodes]
    expected = -sum(a * n for a, n in zip(advantages.tolist(), counts, strict=True)) / 1000.0
    assert out["loss"] == pytest.approx(expected, abs=1e-6)
    assert int(batch.mask.sum()) == sum(counts)
    grads = [p.grad for p in policy.trainable_parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_the_episode_loss_adds_beta_k3_per_token_under_the_constant(tiny_model_dir, tokenizer):
    """loss = Σ_b Σ_t m·(-A_b + β·k3_{b,t}) / constant, over micro-batches; the logged KL is
    the token mean of k3."""
    from training.trainer import loss as L
    from training.trainer.episode_loss import sequence_logprobs
    from training.trainer.policy import load_policy

    config = EpisodesConfig(model_path=str(tiny_model_dir), adapter="full", beta=0.5, temperature=1.0)
    policy = load_policy(config, reference=True)
    with torch.no_grad():  # move the policy away from its reference, so k3 > 0
        for param in policy.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    episodes, batch, advantages = _one_group(tokenizer)
    out = episode_loss_backward(policy, batch, advantages, config=config, constant=1000.0, micro_batch=3)

    options = {"pad_id": batch.pad_id, "temperature": 1.0, "share_prefix": False}
    with torch.no_grad():
        logp, mask = sequence_logprobs(policy.model, batch.sequences, batch.masks, **options)
        ref, _ = sequence_logprobs(policy.reference, batch.sequences, batch.masks, **options)
    k3 = L.kl_k3(logp, ref)
    counts = [sum(len(c.extra["ids"]) for c in e.completions) for e in episodes]
    policy_term = -sum(a * n for a, n in zip(advantages.tolist(), counts, strict=True))
    expected = (policy_term + 0.5 * float(L.masked_sum(k3, mask))) / 1000.0
    assert float(L.masked_sum(k3, mask)) > 0
    assert out["loss"] == pytest.approx(expected, rel=1e-5)
    assert out["kl"] == pytest.approx(float(L.masked_mean(k3, mask)), rel=1e-5)


def test_an_episode_step_that_does_not_measure_the_kl_leaves_the_reference_alone(tiny_model_dir, tokenizer):
    """β = 0 with the KL logged: a step `reference_due` does not name runs no reference
    pass and logs no KL, with the same loss as a step that does."""
    from training.trainer.policy import load_policy

    config = EpisodesConfig(model_path=str(tiny_model_dir), adapter="full", temperature=1.0)
    policy = load_policy(config, reference=True)
    passes: list[int] = []
    policy.reference.register_forward_hook(lambda *_: passes.append(1))
    _, batch, advantages = _one_group(tokenizer)
    skipped = episode_loss_backward(
        policy, batch, advantages, config=config, constant=1000.0, micro_batch=3, reference=False
    )
    assert passes == [] and skipped["kl"] is None
    measured = episode_loss_backward(policy, batch, advantages, config=config, constant=1000.0, micro_batch=3)
    assert passes and measured["kl"] == pytest.approx(0.0, abs=1e-6)
    assert skipped["loss"] == pytest.approx(measured["loss"], rel=1e-6)


class ParityTask(FileTasks):
    """A random model's answers give a group both rewards: 1 when the final answer has an
    even number of characters."""

    name = "parity-test"
    max_steps = 2
    max_tokens = 16

    def grade(self, state, messages):
        text = messages[-1].get("content") or ""
        return Grade(float(len(text) % 2 == 0), f"{len(text)} characters")


def test_a_tiny_episode_job_trains_evaluates_reports_and_exports(tiny_model_dir, tmp_path):
    env = ParityTask(count=6, heldout=2)
    tasks = env.tasks()
    config = EpisodesConfig(
        model_path=str(tiny_model_dir),
        environment="files",
        steps=2,
        group_size=4,
        prompts_per_step=2,
        max_new_tokens=8,
        eval_every=2,
        eval_samples=2,
        checkpoint_every=1,
        learning_rate=1e-2,
        samples_every=1,
    )
    seen: dict[str, list] = {"steps": [], "evals": [], "episodes": [], "samples": []}
    from training.trainer.common import Hooks

    hooks = Hooks(
        on_step=lambda s, m: seen["steps"].append(m),
        on_eval=lambda s, m: seen["evals"].append(m),
        on_episodes=lambda s, phase, eps: seen["episodes"].append((s, phase, len(eps))),
        on_samples=lambda s, rows: seen["samples"].append(rows),
    )
    from training.trainer.policy import load_policy

    policy = load_policy(config, reference=True)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    result = episodes_train(
        config=config,
        env=env,
        tasks=[t for t in tasks if t.split == "train"],
        eval_tasks=[t for t in tasks if t.split == "heldout"],
        run_dir=tmp_path,
        hooks=hooks,
        policy=policy,
    )
    assert result.status == "finished" and result.step == 2
    changed = [n for n, p in policy.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed
    for m in seen["steps"]:
        assert torch.isfinite(torch.tensor(m["loss"]))
        for key in ("tool_error_rate", "budget_exhaustion", "early_stop", "episode_tokens", "kl", "success"):
            assert key in m
    assert [e["step"] for e in seen["evals"]] == [0, 2] and seen["evals"][0]["n"] == 4
    assert seen["episodes"] == [(0, "eval", 4), (1, "train", 8), (2, "train", 8), (2, "eval", 4)]
    assert seen["samples"][0][0]["reason"].endswith("characters")
    assert (result.export_path / "adapter_config.json").exists()


def test_a_non_finite_episode_loss_stops_the_job_before_the_weights_move(tiny_model_dir, tmp_path, monkeypatch):
    from training.trainer import loss as L
    from training.trainer.policy import load_policy

    real = L.policy_loss

    def nan_loss(*args, **kwargs):
        loss, stats = real(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(L, "policy_loss", nan_loss)
    env = ParityTask(count=4, heldout=0)
    config = EpisodesConfig(
        model_path=str(tiny_model_dir),
        environment="files",
        steps=1,
        group_size=2,
        prompts_per_step=2,
        max_new_tokens=8,
        eval_every=0,
        checkpoint_every=0,
        samples_every=0,
        drop_zero_variance=False,
    )
    policy = load_policy(config, reference=True)
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    with pytest.raises(FloatingPointError, match="loss became nan at step 1"):
        episodes_train(config=config, env=env, tasks=env.tasks(), run_dir=tmp_path, policy=policy, export=False)
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)


def test_a_non_finite_episode_gradient_stops_the_job_before_the_weights_move(tiny_model_dir, tmp_path):
    from training.trainer.policy import load_policy

    env = ParityTask(count=4, heldout=0)
    config = EpisodesConfig(
        model_path=str(tiny_model_dir),
        environment="files",
        steps=1,
        group_size=2,
        prompts_per_step=2,
        max_new_tokens=8,
        eval_every=0,
        checkpoint_every=0,
        samples_every=0,
        drop_zero_variance=False,
        micro_batch=1,  # several backward passes accumulate before the one check
    )
    policy = load_policy(config, reference=True)
    weight = next(p for p in policy.model.parameters() if p.requires_grad)
    weight.register_hook(lambda grad: grad * float("nan"))  # finite loss, NaN gradient
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    with pytest.raises(FloatingPointError, match="gradient norm became nan at step 1"):
        episodes_train(config=config, env=env, tasks=env.tasks(), run_dir=tmp_path, policy=policy, export=False)
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters() if p.requires_grad)


def test_rewards_combine_the_grader_and_the_judge_by_weight():
    class E:
        def __init__(self, r):
            self.grade = Grade(r, "")

    episodes = [E(1.0), E(0.0)]
    assert episode_rewards(episodes, judge_scores=None, grader_weight=1, judge_weight=1) == [1.0, 0.0]
    combined = episode_rewards(episodes, judge_scores=[0.5, 1.0], grader_weight=3, judge_weight=1)
    assert combined == [pytest.approx(0.875), pytest.approx(0.25)]
    assert episode_rewards(episodes, judge_scores=[0.5, 1.0], grader_weight=1, judge_weight=0) == [1.0, 0.0]


def test_the_fidelity_guard_flags_reward_rising_with_tool_errors_only():
    config = MonitorConfig(window=2, fidelity_rise=0.1)

    def step(reward, errors, budget=0.0, early=0.0):
        return {"grade_mean": reward, "tool_error_rate": errors, "budget_exhaustion": budget, "early_stop": early}

    rising_with_errors = [step(0.2, 0.0), step(0.2, 0.1), step(0.5, 0.3), step(0.6, 0.4)]
    breaches = fidelity(config, history=rising_with_errors)
    assert [b.monitor for b in breaches] == ["fidelity_tool_error_rate"]
    assert "reward rose 0.20 → 0.55 while tool-error rate rose 0.05 → 0.35" in breaches[0].message
    healthy = [step(0.2, 0.3), step(0.2, 0.3), step(0.6, 0.1), step(0.7, 0.1)]
    assert fidelity(config, history=healthy) == []
    flat_reward = [step(0.5, 0.0), step(0.5, 0.0), step(0.5, 0.5), step(0.5, 0.6)]
    assert fidelity(config, history=flat_reward) == []
    budget = [step(0.1, 0, 0.0, 0.0), step(0.1, 0, 0.0, 0.0), step(0.4, 0, 0.5, 0.3), step(0.4, 0, 0.5, 0.3)]
    assert [b.monitor for b in fidelity(config, history=budget)] == [
        "fidelity_budget_exhaustion",
        "fidelity_early_stop",
    ]
    assert fidelity(config, history=rising_with_errors[:3]) == []  # too little history


def test_the_episodes_config_refuses_bad_fields():
    from training.trainer.config import ConfigError, config_from_dict

    config = config_from_dict({"kind": "episodes", "environment": "files", "judge_weight": 0.5, "judge_rubric": "x"})
    assert isinstance(config, EpisodesConfig) and config.group_size == 6
    with pytest.raises(ConfigError) as exc:
        config_from_dict({"kind": "episodes", "environment": "nowhere", "max_steps": -1})
    fields = dict(exc.value.errors)
    assert "unknown environment 'nowhere'" in fields["environment"] and "max_steps" in fields
    with pytest.raises(ConfigError, match="judge_rubric"):
        config_from_dict({"kind": "episodes", "judge_weight": 1.0})


def test_sharing_the_prompt_prefix_in_the_update_gives_the_same_loss_and_gradients(tiny_model_dir):
    """The shared-prefix forward (prefix once, its key/value cache repeated per row) is an
    exact rewrite: the loss and every gradient equal those of one pass per full row."""
    from training.trainer.episode_loss import EpisodeBatch
    from training.trainer.policy import load_policy

    config = EpisodesConfig(model_path=str(tiny_model_dir), adapter="full", log_kl=False, temperature=0.7)
    prefix = list(range(40, 70))
    sequences = [[*prefix, 5, 6, 7, 8, 9, 10], [*prefix, 11, 12, 13], [*prefix, 14, 15, 16, 17, 18, 19, 20, 21]]
    masks = [[0] * 30 + [0, 1, 1, 0, 1, 1], [0] * 30 + [0, 1, 1], [0] * 30 + [0, 0, 1, 1, 1, 0, 1, 1]]
    batch = EpisodeBatch(
        input_ids=torch.zeros(1), attention_mask=torch.zeros(1), mask=torch.zeros(1), sequences=sequences, masks=masks
    )
    advantages = torch.tensor([1.0, -0.5, 0.25])
    results = []
    for share in (False, True):
        torch.manual_seed(0)
        policy = load_policy(config)
        out = episode_loss_backward(
            policy, batch, advantages, config=config, constant=50.0, micro_batch=3, share_prefix=share
        )
        grads = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}
        results.append((out["loss"], grads))
    (plain_loss, plain), (shared_loss, shared) = results
    assert shared_loss == pytest.approx(plain_loss, abs=1e-6)
    assert plain.keys() == shared.keys() and plain
    for name in plain:
        assert torch.allclose(plain[name], shared[name], atol=1e-6, rtol=1e-4), name


def test_served_turns_weigh_each_sampled_token_by_its_truncated_ratio_to_the_server(tiny_model_dir, tokenizer):
    """The log-probs a server reported for each turn travel with the episode to its
    tokens in the loss: w = min(π/q, 3) on exactly the token q was reported for, whether
    the rows share their prefix's pass or not, and the loss is -Σ_b A_b Σ_t w_{b,t} / c."""
    from training.trainer.episode_loss import sequence_logprobs
    from training.trainer.policy import load_policy

    config = EpisodesConfig(model_path=str(tiny_model_dir), adapter="full", log_kl=False, temperature=1.0)
    policy = load_policy(config)
    episodes, batch, _ = _one_group(tokenizer)
    advantages = torch.tensor([1.0, -0.25, 0.5, 0.75])  # no two rows cancel
    # The server's q of each token: π·exp(-δ), δ cycling so that w = 1, e^0.5, e^-0.7 and
    # the cap (e^2 > 3).
    deltas = [0.0, 0.5, -0.7, 2.0]
    expected_weights = []
    for b, e in enumerate(episodes):
        with torch.no_grad():
            row, mask = sequence_logprobs(
                policy.model, [batch.sequences[b]], [batch.masks[b]], pad_id=batch.pad_id, temperature=1.0
            )
        own = row[mask.bool()].tolist()  # the trainer's log-prob of each sampled token, in order
        q = [p - deltas[t % 4] for t, p in enumerate(own)]
        for c in e.completions:
            c.extra["logprobs"], q = q[: len(c.extra["ids"])], q[len(c.extra["ids"]) :]
        expected_weights.append([min(math.exp(deltas[t % 4]), 3.0) for t in range(len(own))])
    batch = episode_batch(tokenizer, episodes, [0, 1, 2, 3], tokenizer.pad_token_id)
    assert batch.sampler_logprobs is not None
    expected_loss = -sum(a * sum(w) for a, w in zip(advantages.tolist(), expected_weights, strict=True)) / 1000.0
    flat = [w for row in expected_weights for w in row]
    for share in (False, True):
        policy.model.zero_grad(set_to_none=True)
        out = episode_loss_backward(
            policy, batch, advantages, config=config, constant=1000.0, micro_batch=3, share_prefix=share
        )
        assert out["loss"] == pytest.approx(expected_loss, rel=1e-4)
        assert out["correction"]["sampling_weight_mean"] == pytest.approx(sum(flat) / len(flat), rel=1e-4)
        assert out["correction"]["sampling_truncated_share"] == pytest.approx(flat.count(3.0) / len(flat))
    # Without the correction the same batch trains as on-policy.
    config.sampling_correction = False
    out = episode_loss_backward(policy, batch, advantages, config=config, constant=1000.0, micro_batch=3)
    counts = [len(w) for w in expected_weights]
    assert out["correction"] == {}
    assert out["loss"] == pytest.approx(-sum(a * n for a, n in zip(advantages.tolist(), counts, strict=True)) / 1000.0)


def test_a_seeded_rollout_repeats_exactly_whatever_the_threads_timing(tiny_model_dir, tokenizer):
    from training.trainer.episode_rollout import local_generate
    from training.trainer.policy import load_policy

    config = EpisodesConfig(model_path=str(tiny_model_dir), adapter="full", max_new_tokens=8, temperature=1.0)
    policy = load_policy(config)
    env = ParityTask(count=3, heldout=0)
    texts = []
    for _ in range(3):
        torch.manual_seed(0)
        episodes = episodes_rollout(
            env,
            env.tasks(),
            group_size=4,
            tokenizer=tokenizer,
            generate=local_generate(policy, config),
            stop_ids={tokenizer.eos_token_id},
        )
        texts.append([[c.extra["ids"] for c in e.completions] for e in episodes])
    assert texts[0] == texts[1] == texts[2]
    assert len({str(t) for t in texts[0]}) > 1  # the episodes themselves differ


def test_an_episode_job_is_flagged_when_its_evaluation_episodes_change_other_records(tiny_model_dir, tmp_path):
    """The promotion gate's harm check runs on the job's evaluation episodes: here the
    environment's audit starts finding writes outside each task after the first evaluation,
    and the job is flagged at its next one. Each phase reports its own progress on the way."""
    from training.environments import EpisodeAudit
    from training.trainer.common import Hooks

    class Careless(ParityTask):
        harmful = False

        def audit(self, state, messages):
            if not self.harmful:
                return EpisodeAudit()
            return EpisodeAudit(
                collateral_changes=("order A1003: status refunded",),
                policy_violations=('order A1001: status set to "refunded", but the task expects the record unchanged',),
            )

    env = Careless(count=6, heldout=2)
    tasks = env.tasks()
    config = EpisodesConfig(
        model_path=str(tiny_model_dir),
        environment="files",
        steps=2,
        group_size=2,
        prompts_per_step=2,
        max_new_tokens=6,
        eval_every=2,
        eval_samples=1,
        checkpoint_every=0,
        samples_every=0,
    )
    breaches, phases, evals = [], [], []

    def on_eval(step, metrics):
        evals.append(metrics)
        env.harmful = True  # from now on every episode writes outside its task

    hooks = Hooks(
        on_eval=on_eval,
        on_breach=lambda step, found: breaches.extend((step, b["monitor"]) for b in found),
        on_phase=lambda name, done, total: phases.append((name, done, total)),
    )
    result = episodes_train(
        config=config,
        env=env,
        tasks=[t for t in tasks if t.split == "train"],
        eval_tasks=[t for t in tasks if t.split == "heldout"],
        run_dir=tmp_path,
        hooks=hooks,
    )
    assert result.status == "finished"
    assert [(e["step"], e["collateral_rate"]) for e in evals] == [(0, 0.0), (2, 1.0)]
    assert [(e["step"], e["violation_rate"]) for e in evals] == [(0, 0.0), (2, 1.0)]
    assert [b for b in breaches if b[1] in ("collateral", "unknown_ids", "violations")] == [
        (2, "collateral"),
        (2, "violations"),
    ]
    assert phases == [
        ("evaluation", 0, 2),
        ("evaluation", 2, 2),
        ("sampling", 1, 2),
        ("update", 1, 2),
        ("sampling", 2, 2),
        ("update", 2, 2),
        ("evaluation", 0, 2),
        ("evaluation", 2, 2),
        ("export", 0, 1),
    ]
