"""The one training loop. GRPO, SFT, distillation and episodes differ only in what a step
does (how it gets its samples, scores them and turns them into a loss) and in how they
evaluate and monitor; `run_training` owns everything around that:

    resume or evaluate the start → for each step: stop requested? → the kind's step →
    record its metrics → report → evaluate when due → monitors → checkpoint → export.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training.trainer import monitors, sharding
from training.trainer.common import Hooks, batch_for_step, finite_check
from training.trainer.config import TrainConfig
from training.trainer.parallel import Ranks, ranks_current
from training.trainer.policy import (
    Policy,
    export_model,
    latest_checkpoint,
    load_checkpoint,
    load_policy,
    make_optimizer,
    save_checkpoint,
)


@dataclass
class RunState:
    """What a job keeps between steps, saved under "state" in every checkpoint.

    - history: every step's metrics, in order;
    - evals: every evaluation's metrics (step 0 = the starting model);
    - start_length: the first step's mean response length, the length monitor's baseline
      (None for a job without monitors);
    - start_canary: the first canary reward, the canary monitor's baseline;
    - breaches: every monitor that started firing, with its step;
    - active_breaches: the monitors firing at the last step, so one that stays over is
      reported once."""

    history: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    start_length: float | None = None
    start_canary: float | None = None
    breaches: list[dict] = field(default_factory=list)
    active_breaches: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunState:
        """The state of a checkpoint; one written before any monitor ran has no
        `active_breaches`. A key this code does not know fails the resume rather than
        being dropped from the job's next checkpoint."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"the checkpoint's state has keys this trainer does not know: {unknown}")
        return cls(**data)


@dataclass
class TrainResult:
    status: str  # "finished", "cancelled" or "stopped" (a monitor breach stopped it)
    step: int
    export_path: Path | None = None
    history: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    breaches: list[dict] = field(default_factory=list)


@dataclass
class Trainer:
    """The policy being trained, its optimizer, and the processes it trains with (`ranks`:
    one, or a data-parallel job's group, `parallel.py`)."""

    policy: Policy
    optimizer: torch.optim.Optimizer
    config: TrainConfig
    ranks: Ranks = field(default_factory=Ranks)

    @property
    def sharded(self) -> bool:
        """The model's weights are split over the processes (`sharding.py`): its passes,
        checkpoints and export are collectives every process joins."""
        return sharding.splits(self.config, self.ranks)

    def clip_and_step(self, *, step: int) -> float:
        """Sum the accumulated gradient over the processes, clip it to `max_grad_norm` and
        step the optimizer; returns the norm before clipping. A non-finite norm raises
        before the weights change (on every process alike: the norm is the global one).
        A sharded model's backward pass has already summed its gradient's shards."""
        parameters = self.policy.trainable_parameters()
        if not self.sharded:
            self.ranks.gradients_sum(parameters)
        norm = torch.nn.utils.clip_grad_norm_(parameters, self.config.max_grad_norm)
        grad_norm = finite_check(sharding.grad_norm(norm), what="gradient norm", step=step)
        self.optimizer.step()
        return grad_norm

    def loss_step(self, loss: torch.Tensor, *, step: int, share: float = 1.0) -> tuple[float, float]:
        """One update on a loss computed in a single pass: (loss, gradient norm). `share`:
        this process's part of the global batch's normaliser (its tokens over all
        processes' tokens), so the processes' losses add up to the global batch's loss."""
        if share != 1.0:
            loss = loss * share
        loss_value = finite_check(self.ranks.sum(float(loss.detach()))[0], what="loss", step=step)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return loss_value, self.clip_and_step(step=step)

    def share(self, count: float) -> float:
        """`count` (this process's tokens or rows of the step) over the global batch's."""
        if self.ranks.size == 1:
            return 1.0
        total = self.ranks.sum(count)[0]
        return count / total if total > 0 else 0.0


def setup_torch(config: TrainConfig) -> None:
    torch.set_num_threads(config.torch_threads)
    torch.manual_seed(config.seed)
    random.seed(config.seed)


def trainer_setup(config: TrainConfig, *, policy: Policy | None, reference: bool) -> Trainer:
    """Seed the RNGs, load the policy unless one is given (`reference`: with the frozen
    copy the KL or a frozen teacher needs) and make its optimizer. In a data-parallel job
    (torch.distributed initialised) every process starts from rank 0's weights; with
    `sharding: fsdp` only rank 0 reads them (into the CPU's memory), and each process
    keeps its shard of them."""
    setup_torch(config)
    ranks = ranks_current()
    sharded = sharding.splits(config, ranks)
    # A sharded job's model is read once, by rank 0, on the CPU: the others build it empty
    # and `shard_model` fills every process's shards from rank 0's weights.
    weights = "device" if not sharded else "host" if ranks.owner else "none"
    policy = policy or load_policy(config, reference=reference, weights=weights)
    if sharded:
        sharding.shard_model(policy.model, ranks)
    else:
        ranks.parameters_broadcast(policy.trainable_parameters())
    return Trainer(policy=policy, optimizer=make_optimizer(policy, config, sharded=sharded), config=config, ranks=ranks)


@dataclass
class StepOutput:
    """What one step of a kind hands back to the loop.

    - metrics: the step's figures, recorded in the history and sent to `on_step`;
    - episodes: the environment episodes it ran, for `on_episodes(step, "train", …)`;
    - samples: builds the sample rows for `on_samples`, called only at the steps due."""

    metrics: dict[str, Any]
    episodes: list | None = None
    samples: Callable[[], list[dict]] | None = None


# step(n, batch, started) -> its output: sample, score and update for step n (1-based) on
# `batch` (`batch_for_step`'s items or tasks); `started` is the `time.perf_counter()`
# reading when the step began, before its first phase, for the step's timings.
StepFn = Callable[[int, list, float], StepOutput]
# evaluate(step, state) -> the evaluation's metrics; it may set the state's baselines.
EvalFn = Callable[[int, RunState], dict]
# monitor(state) -> the monitors firing now.
MonitorFn = Callable[[RunState], list[monitors.Breach]]


def turn_monitors(config: TrainConfig) -> MonitorFn:
    """The reward-hacking monitors over turns (length, KL, empty, truncated, tool calls,
    canary)."""

    def check(state: RunState) -> list[monitors.Breach]:
        return monitors.check(
            config.monitors, history=state.history, start_length=state.start_length, start_canary=state.start_canary
        )

    return check


def run_training(
    trainer: Trainer,
    *,
    items: list,
    step: StepFn,
    first_phase: str = "sampling",
    run_dir: Path,
    hooks: Hooks,
    evaluate: EvalFn | None = None,
    evaluate_at_start: bool = True,
    monitor: MonitorFn | None = None,
    export: bool = True,
) -> TrainResult:
    """Train for `config.steps` steps on `items` (turn items or tasks, `prompts_per_step`
    a step, the same batches after a resume), resuming from `run_dir`'s latest checkpoint
    if there is one (else evaluating the starting model, with `evaluate_at_start`).
    `first_phase`: what a step reports doing first ("sampling", or "update" for a step
    that samples nothing). Every `eval_every` steps and at the last one, `evaluate`;
    after every step, `monitor` (None: a job without monitors). Returns how it ended; the
    model is exported to `run_dir/model` unless cancelled or `export` is off.

    In a data-parallel job each process runs this loop on its shard of every batch; rank 0
    alone evaluates, checkpoints and exports (the others' hooks are empty), and decides
    when to stop, a decision every process receives before each step and after it. A
    sharded job's processes all take part in evaluations (sampling only), checkpoints and
    the export (gathering the adapter): their passes are collectives."""
    config, ranks = trainer.config, trainer.ranks
    result = TrainResult(status="finished", step=0)
    state = RunState()
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, policy=trainer.policy, optimizer=trainer.optimizer, sharded=trainer.sharded)
        result.step, state = saved["step"], RunState.from_dict(saved["state"])
        hooks.emit("log", f"resumed from {checkpoint.name}")
    if trainer.sharded:
        local, whole = sharding.held(trainer.policy.model)
        hooks.emit("log", f"fsdp: the model's {whole:,} weights are split over {ranks.size} processes ({local:,} here)")
    if checkpoint is None and evaluate is not None and evaluate_at_start and (ranks.owner or trainer.sharded):
        _evaluation_record(state, 0, evaluate, hooks)

    for n in range(result.step + 1, config.steps + 1):
        if ranks.agree(hooks.stop_requested()):
            checkpoint_save(run_dir, trainer, n - 1, state, hooks)
            result.status = "cancelled"
            break
        started = time.perf_counter()
        hooks.emit("on_phase", first_phase, n, config.steps)
        batch = ranks.shard(batch_for_step(items, step=n, size=config.prompts_per_step, seed=config.seed))
        out = step(n, batch, started)
        if monitor is not None and state.start_length is None:  # the length monitor's baseline
            state.start_length = out.metrics["response_length"]
        state.history.append(out.metrics)
        result.step = n
        hooks.emit("on_step", n, out.metrics)
        if out.episodes is not None:
            hooks.emit("on_episodes", n, "train", out.episodes)
        if out.samples is not None and config.samples_every and (n == 1 or n % config.samples_every == 0):
            hooks.emit("on_samples", n, out.samples())
        due = config.eval_every and (n % config.eval_every == 0 or n == config.steps)
        if evaluate is not None and due and (ranks.owner or trainer.sharded):
            _evaluation_record(state, n, evaluate, hooks)
        breaches = None if monitor is None else monitor(state)
        if step_close(run_dir, trainer, n, state, hooks, breaches):
            result.status = "stopped"
            break

    return result_close(result, state, trainer, run_dir, export, hooks)


def _evaluation_record(state: RunState, step: int, evaluate: EvalFn, hooks: Hooks) -> None:
    metrics = evaluate(step, state)
    state.evals.append(metrics)
    hooks.emit("on_eval", step, metrics)


def checkpoint_save(run_dir: Path, trainer: Trainer, step: int, state: RunState, hooks: Hooks) -> None:
    """Save a resumable checkpoint (keeping the newest `config.keep_checkpoints`) and tell the caller."""
    config = trainer.config
    gathered: dict[str, Any] = {}
    if trainer.sharded:  # every process joins the gather
        gathered["trainable"] = sharding.trainable_state(trainer.policy.model)
        gathered["optimizer_state"] = sharding.optimizer_state(trainer.policy.model, trainer.optimizer)
    if not trainer.ranks.owner:  # the run folder is rank 0's to write
        return
    hooks.check_held()  # the folder is the job's: a worker that took it over resumes from it
    path = save_checkpoint(
        run_dir,
        policy=trainer.policy,
        optimizer=trainer.optimizer,
        step=step,
        config=config,
        state=state.to_dict(),
        keep=config.keep_checkpoints,
        **gathered,
    )
    hooks.emit("on_checkpoint", step, path)


def breaches_record(state: RunState, step: int, breaches: list[monitors.Breach], hooks: Hooks) -> None:
    """Keep the monitors that fire at `step` in the job's state. A monitor is reported when it
    starts firing, not on every step it stays over."""
    active = set(state.active_breaches)
    state.active_breaches = sorted(b.monitor for b in breaches)
    new = [b.to_dict() | {"step": step} for b in breaches if b.monitor not in active]
    if new:
        state.breaches += new
        hooks.emit("on_breach", step, new)


def step_close(
    run_dir: Path,
    trainer: Trainer,
    step: int,
    state: RunState,
    hooks: Hooks,
    breaches: list[monitors.Breach] | None = None,
) -> bool:
    """The end of a training step: record the monitors that fire (`breaches`; None for a
    loop without monitors) and save a checkpoint when one is due. True when a breach stops
    the job (`stop_on_breach`); that step is checkpointed first, so the job can resume.
    Rank 0's monitors decide for every process (it alone scores the evaluations)."""
    config = trainer.config
    stopping = False
    if breaches is not None:
        breaches_record(state, step, breaches, hooks)
        stopping = bool(breaches) and config.monitors.stop_on_breach
    if trainer.ranks.agree(stopping):
        checkpoint_save(run_dir, trainer, step, state, hooks)
        return True
    if config.checkpoint_every and step % config.checkpoint_every == 0 and step < config.steps:
        checkpoint_save(run_dir, trainer, step, state, hooks)
    return False


def result_close(
    result: TrainResult, state: RunState, trainer: Trainer, run_dir: Path, export: bool, hooks: Hooks
) -> TrainResult:
    """Copy the run's history, evaluations and breaches into `result`, and export the model
    (rank 0) unless the job was cancelled or `export` is off."""
    result.history, result.evals, result.breaches = state.history, state.evals, state.breaches
    if not export or result.status == "cancelled":
        return result
    weights = sharding.trainable_state(trainer.policy.model) if trainer.sharded else None  # every process
    if trainer.ranks.owner:
        hooks.check_held()
        hooks.emit("on_phase", "export", 0, 1)
        result.export_path = export_model(trainer.policy, run_dir / "model", state_dict=weights)
    return result
