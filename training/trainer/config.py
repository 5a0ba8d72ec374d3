"""One typed, JSON-serialisable config per job kind, saved on the job row and in every
checkpoint. Defaults follow docs in `shared/notes/rl-methods.md`: RLOO advantages
without std scaling, constant normaliser, LoRA on all linear layers, β = 0 with the KL
always logged."""

from __future__ import annotations

import dataclasses
import string
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from training.environments.base import environment_names
from training.trainer.graders import GRADERS

# No count a job takes goes past this (a step counter is a 32-bit column).
MAX_INT_SETTING = 1_000_000_000
# Hinted samples per zero-variance group: each is a full sample and a forward pass more.
MAX_HINT_SAMPLES = 64


@dataclass
class MonitorConfig:
    """Reward-hacking monitors. A breach is always flagged; it stops the job only when
    `stop_on_breach` is set."""

    length_tolerance: float = 0.15  # mean response length vs the starting model, ± this share
    kl_budget: float | None = None  # mean per-token KL to the starting model (k3)
    max_empty_share: float = 0.3  # share of empty responses in a step
    max_truncated_share: float = 0.5  # share of responses cut at max_new_tokens
    max_invalid_tool_call_share: float = 0.2  # share of <tool_call> blocks that do not parse
    canary_drop: float = 0.2  # absolute drop of the canary reward below its start
    # Environment fidelity (episode jobs): flag a job whose reward rises while the rate of
    # tool errors, budget exhaustion or early stops rises too, each by more than this.
    fidelity_rise: float = 0.15
    # Harm (episode jobs): flag a job whose evaluation episodes change records their task
    # does not concern, or call tools on ids never shown, in a larger share than the
    # starting model's (its evaluation at step 0) plus this margin.
    harm_rise: float = 0.0
    window: int = 5  # steps averaged before comparing
    stop_on_breach: bool = False


@dataclass
class TrainConfig:
    """Fields every job kind shares."""

    kind: ClassVar[str] = ""

    model_path: str = ""
    adapter: Literal["lora", "full"] = "lora"
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target: str = "all-linear"
    init_adapter: str = ""  # continue training an existing LoRA version's adapter
    trainable_layers: int | None = (
        None  # only the top N blocks train (full: those blocks; lora: adapters on them); None = all
    )
    learning_rate: float = 2e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    steps: int = 50
    prompts_per_step: int = 4
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    eval_every: int = 10
    eval_samples: int = 4
    checkpoint_every: int = 10
    keep_checkpoints: int = 2
    samples_every: int = 5  # keep sample rollouts for the job page at these steps
    device: str = "auto"  # "auto" = cuda when available, else cpu
    dtype: Literal["float32", "bfloat16"] = "float32"
    torch_threads: int = 1
    # Data-parallel processes (torchrun, one node): each takes its share of every batch and
    # the gradients are summed, so the job trains as one process would on the same batches
    # (docs/decisions/0026-data-parallel-jobs.md). 1 = the worker's own process.
    processes: int = 1
    # "fsdp": the processes also split the model's weights, its adapter's gradients and
    # optimizer state (FSDP2) for a base model too large for one device; LoRA only
    # (docs/decisions/0032-fsdp2-lockstep.md). "replicate": each process holds the model.
    sharding: Literal["replicate", "fsdp"] = "replicate"
    monitors: MonitorConfig = field(default_factory=MonitorConfig)
    # Canary prompts, scored at each evaluation; a drop below their start flags the job.
    # Each: {"prompt": str (or "messages": [...]), "reference": str, "grader": name}.
    canaries: list = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["kind"] = self.kind
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        """Build from JSON, refusing unknown fields (a typo must not silently fall back
        to a default). Raises ConfigError listing (field, reason) pairs."""
        data = dict(data)
        data.pop("kind", None)
        names = {f.name for f in dataclasses.fields(cls)}
        errors = [(key, "unknown field") for key in data if key not in names]
        monitors = data.pop("monitors", None)
        if isinstance(monitors, dict):
            monitor_names = {f.name for f in dataclasses.fields(MonitorConfig)}
            errors += [(f"monitors.{k}", "unknown field") for k in monitors if k not in monitor_names]
        elif monitors is not None:
            errors.append(("monitors", "must be an object"))
        if errors:
            raise ConfigError(errors)
        config = cls(**{k: v for k, v in data.items() if k in names})
        if isinstance(monitors, dict):
            config.monitors = MonitorConfig(**monitors)
        errors = config.validate()
        if errors:
            raise ConfigError(errors)
        return config

    def validate(self) -> list[tuple[str, str]]:
        errors: list[tuple[str, str]] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            expected = _BASIC_TYPES.get(f.type if isinstance(f.type, str) else "")
            wrong_type = expected and value is not None and not isinstance(value, expected)
            if wrong_type or (isinstance(value, bool) and f.type in ("int", "float", "int | None", "float | None")):
                errors.append((f.name, f"must be {f.type}"))
        if errors:
            return errors
        errors += [
            (f.name, f"must be at most {MAX_INT_SETTING:,}")
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), int)
            and not isinstance(getattr(self, f.name), bool)
            and abs(getattr(self, f.name)) > MAX_INT_SETTING
        ]
        if errors:
            return errors
        if self.adapter not in ("lora", "full"):
            errors.append(("adapter", "must be 'lora' or 'full'"))
        if self.dtype not in ("float32", "bfloat16"):
            errors.append(("dtype", "must be 'float32' or 'bfloat16'"))
        positive = ["lora_rank", "steps", "prompts_per_step", "max_new_tokens", "eval_samples", "torch_threads"]
        errors += [(name, "must be ≥ 1") for name in positive if getattr(self, name) < 1]
        if not 0 < self.learning_rate < 1:
            errors.append(("learning_rate", "must be in (0, 1)"))
        if self.temperature <= 0:
            errors.append(("temperature", "must be > 0"))
        if not 0 < self.top_p <= 1:
            errors.append(("top_p", "must be in (0, 1]"))
        if self.trainable_layers is not None and self.trainable_layers < 1:
            errors.append(("trainable_layers", "must be ≥ 1 or null"))
        if not isinstance(self.canaries, list):
            errors.append(("canaries", "must be a list"))
        else:
            for i, canary in enumerate(self.canaries):
                if not isinstance(canary, dict) or not (canary.get("prompt") or canary.get("messages")):
                    errors.append((f"canaries[{i}]", "needs a prompt (or messages)"))
                elif canary.get("grader") not in GRADERS:
                    errors.append((f"canaries[{i}].grader", f"must be one of {', '.join(GRADERS)}"))
        for name in ("eval_every", "checkpoint_every", "samples_every", "keep_checkpoints"):
            if getattr(self, name) < 0:
                errors.append((name, "must be ≥ 0"))
        return errors + processes_errors(self)


@dataclass
class GRPOConfig(TrainConfig):
    """Turn-level GRPO: resample a logged turn G times, score the group, update."""

    kind: ClassVar[str] = "grpo"

    group_size: int = 8
    baseline: Literal["rloo", "mean"] = "rloo"
    scale_std: bool = False
    advantage_clip: float | None = None
    drop_zero_variance: bool = True
    normaliser: Literal["constant", "token", "sequence"] = "constant"
    updates_per_batch: int = 1  # > 1 reuses a batch: the PPO-clip surrogate then applies
    # Rows (sequences) per forward/backward pass; their gradients accumulate into one
    # optimiser step equal to the whole batch's (`loss.micro_batch_scale`). 0 = the whole
    # batch in one pass. Lower it when G x prompts_per_step sequences do not fit in memory.
    micro_batch: int = 0
    clip_low: float = 0.2
    clip_high: float = 0.28
    beta: float = 0.0  # KL(π ‖ π_start) penalty weight (k3)
    # Log KL(π ‖ π_start) at β = 0 too: at the steps that evaluate and the last one, or every
    # step with a KL budget (`reference_due`; docs/decisions/0044-kl-at-evaluation-steps.md).
    log_kl: bool = True
    # "local": the trainer's own sampler; "vllm": an inference server (`vllm_url`);
    # "colocate": a vLLM engine the job starts on its own device (`vllm_colocate.py`).
    rollout: Literal["local", "vllm", "colocate"] = "local"
    vllm_url: str = ""  # OpenAI-compatible base URL ending in /v1, for rollout="vllm"
    # rollout="colocate": the share of the GPU the engine may take while awake (it sleeps
    # while the trainer trains), and the longest sequence it is sized for.
    colocate_memory: float = 0.3
    colocate_max_model_len: int = 4096
    # vLLM structured outputs (e.g. {"regex": …}) for rollout "vllm" or "colocate": sample
    # under the same constraint the agent's harness serves with, so the trained choices are
    # the served ones.
    structured_outputs: dict = field(default_factory=dict)
    # vLLM rollouts: weigh each sampled token's policy term by min(π_θ/q, cap), q being
    # what vLLM sampled from (its regex, its numerics); see `loss.sampling_correction`
    # and docs/decisions/0019-sampling-correction.md. TRL's cap is 3.
    sampling_correction: bool = True
    sampling_correction_cap: float = 3.0
    # Hinted GRPO (docs/decisions/0024-hinted-grpo.md): a group whose G samples all score
    # the same, for an item with an operator's comment, gets `hint_samples` more from the
    # policy with the comment as a hint (`hint_template`, placed by `hint_at`: in the system
    # message, or as a last user message); the unhinted policy trains on all G + K, the
    # hinted ones weighed by min(π_θ / π_hinted, hint_cap) per token (`loss.hint_weights`).
    hint_samples: int = 0
    hint_template: str = "Feedback on earlier answers, follow it: {feedback}"
    hint_at: Literal["system", "last"] = "system"
    hint_cap: float = 3.0

    def reference_due(self, step: int) -> bool:
        """Whether step `step` (1-based) runs the reference's forward pass, whose only use is
        KL(π ‖ π_start) on the step's sampled tokens (docs/decisions/0044-kl-at-evaluation-steps.md):

        - β > 0: every step, the penalty is part of the loss;
        - `log_kl` off: never (nor is the reference loaded);
        - a KL budget (`monitors.kl_budget`): every step, the monitor averages the KL over its
          window of steps and may stop the job on it;
        - otherwise (β = 0, the default): at the steps that evaluate (every `eval_every`) and
          at the last step, so the chart has a point at each evaluation and the job ends
          with its drift measured, for 1/`eval_every` of the passes.

        The figure is the one every step logged before: the k3 token mean of the batch the
        step trains on, by the policy before the step's update."""
        if self.beta > 0:
            return True
        if not self.log_kl:
            return False
        if self.monitors.kl_budget is not None:
            return True
        return step == self.steps or bool(self.eval_every and step % self.eval_every == 0)

    def validate(self) -> list[tuple[str, str]]:
        errors = super().validate()
        if errors:
            return errors
        if self.group_size < 2:
            errors.append(("group_size", "must be ≥ 2 (advantages compare samples of a group)"))
        if self.baseline not in ("rloo", "mean"):
            errors.append(("baseline", "must be 'rloo' or 'mean'"))
        if self.normaliser not in ("constant", "token", "sequence"):
            errors.append(("normaliser", "must be 'constant', 'token' or 'sequence'"))
        if self.updates_per_batch < 1:
            errors.append(("updates_per_batch", "must be ≥ 1"))
        if self.micro_batch < 0:
            errors.append(("micro_batch", "must be ≥ 0 (0 = the whole batch in one pass)"))
        if self.beta < 0:
            errors.append(("beta", "must be ≥ 0"))
        if self.rollout not in ("local", "vllm", "colocate"):
            errors.append(("rollout", "must be 'local', 'vllm' or 'colocate'"))
        if self.rollout == "vllm" and not self.vllm_url:
            errors.append(("vllm_url", "required when rollout is 'vllm'"))
        errors += self._colocate_errors()
        if not isinstance(self.structured_outputs, dict):
            errors.append(("structured_outputs", "must be an object"))
        elif self.structured_outputs and self.rollout == "local":
            errors.append(("structured_outputs", "needs vLLM rollouts (the local sampler does not constrain)"))
        if not 1 <= self.sampling_correction_cap <= 100:
            errors.append(("sampling_correction_cap", "must be between 1 and 100 (a cap below 1 shrinks every token)"))
        errors += self._hint_errors()
        return errors

    def _colocate_errors(self) -> list[tuple[str, str]]:
        if self.rollout != "colocate":
            return []
        if self.kind == "episodes":
            return [("rollout", "episodes sample through an inference server ('vllm') or locally, not 'colocate'")]
        if self.adapter != "lora":
            return [
                ("rollout", "'colocate' loads the trained adapter into the engine each step: it needs adapter 'lora'")
            ]
        if self.processes > 1:
            return [("rollout", "'colocate' runs one engine for one process (processes must be 1)")]
        if self.device not in ("auto", "cuda", "cpu"):
            # The engine's core takes the first visible GPU, whichever the trainer uses.
            return [("device", "'colocate' runs on 'auto', 'cuda' (the first visible GPU) or 'cpu'")]
        if self.lora_rank > 512:
            return [("lora_rank", "'colocate' serves adapters of rank ≤ 512 (vLLM's largest LoRA slot)")]
        if not 0.05 <= self.colocate_memory <= 0.95:
            return [("colocate_memory", "must be between 0.05 and 0.95 (a share of the GPU)")]
        if self.colocate_max_model_len < self.max_new_tokens + 1:
            return [("colocate_max_model_len", "must exceed max_new_tokens")]
        return []

    def _hint_errors(self) -> list[tuple[str, str]]:
        errors: list[tuple[str, str]] = []
        if not 0 <= self.hint_samples <= MAX_HINT_SAMPLES:
            errors.append(("hint_samples", f"must be between 0 and {MAX_HINT_SAMPLES} (0 = plain GRPO)"))
        elif self.hint_samples > 0 and self.rollout != "local":
            errors.append(("hint_samples", "needs rollout 'local': the trainer draws the hinted samples itself"))
        elif self.hint_samples > 0 and self.processes > 1:
            errors.append(("hint_samples", "runs in one process: hinted samples are not sharded (processes must be 1)"))
        if not _formats_feedback(self.hint_template):
            errors.append(
                ("hint_template", "must contain {feedback} and no other {…} field, conversion or format spec")
            )
        if self.hint_at not in ("system", "last"):
            errors.append(("hint_at", "must be 'system' or 'last'"))
        if not 1 <= self.hint_cap <= 100:
            errors.append(("hint_cap", "must be between 1 and 100 (a cap below 1 shrinks every hinted token)"))
        return errors


@dataclass
class DistillConfig(TrainConfig):
    """Feedback-conditioned on-policy self-distillation: the student (no hint) samples,
    and is pulled toward the teacher (the same model with the feedback as a system hint)
    by a per-token reverse KL on the student's own tokens."""

    kind: ClassVar[str] = "distill"

    samples_per_prompt: int = 4
    teacher: Literal["frozen", "current"] = "frozen"
    hint_template: str = "Feedback on earlier answers, follow it: {feedback}"
    # Where the teacher reads the hint: the system message, or a last user message right
    # before the turn (where a small model reads it far more, docs/experiments/2026-12-02-comment-hints.md).
    hint_at: Literal["system", "last"] = "system"

    def validate(self) -> list[tuple[str, str]]:
        errors = super().validate()
        if errors:
            return errors
        if self.samples_per_prompt < 1:
            errors.append(("samples_per_prompt", "must be ≥ 1"))
        if self.teacher not in ("frozen", "current"):
            errors.append(("teacher", "must be 'frozen' or 'current'"))
        if not _formats_feedback(self.hint_template):
            errors.append(
                ("hint_template", "must contain {feedback} and no other {…} field, conversion or format spec")
            )
        if self.hint_at not in ("system", "last"):
            errors.append(("hint_at", "must be 'system' or 'last'"))
        return errors


@dataclass
class SFTConfig(TrainConfig):
    """Supervised fine-tuning on corrected responses (human or judge-written)."""

    kind: ClassVar[str] = "sft"

    learning_rate: float = 1e-4
    # Weight of each target's first token in the token mean (see `loss.sft_loss`): the
    # token that picks a turn's action. 1 = plain token mean.
    first_token_weight: float = 1.0

    def validate(self) -> list[tuple[str, str]]:
        errors = super().validate()
        if errors:
            return errors
        weight = self.first_token_weight
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 1 <= weight <= 100:
            errors.append(("first_token_weight", "must be between 1 and 100"))
        return errors


@dataclass
class EpisodesConfig(GRPOConfig):
    """Full-episode GRPO: G episodes per task of a registered environment, each graded
    on its final state (optionally combined with a judge's score), group advantages over
    the G episodes, loss on the model's own tokens of every turn. `max_new_tokens` bounds
    one turn; `max_steps`/`max_episode_tokens` bound an episode (0 = the environment's)."""

    kind: ClassVar[str] = "episodes"

    environment: str = "files"
    environment_options: dict = field(default_factory=dict)
    group_size: int = 6
    prompts_per_step: int = 2
    max_new_tokens: int = 64
    max_steps: int = 0
    max_episode_tokens: int = 0
    grader_weight: float = 1.0
    judge_weight: float = 0.0  # > 0: the judge also scores each episode under `judge_rubric`
    judge_rubric: str = ""
    eval_samples: int = 2
    eval_batch: int = 16  # episodes run together during an evaluation
    micro_batch: int = 6  # episodes per forward/backward pass (0 = all of them at once)
    record_traces: bool = True  # record every episode as a trace of the job's deployment

    def validate(self) -> list[tuple[str, str]]:
        errors = super().validate()
        if errors:
            return errors
        if not isinstance(self.environment_options, dict):
            errors.append(("environment_options", "must be an object"))
        else:
            if self.environment not in environment_names():
                known = ", ".join(environment_names()) or "none"
                errors.append(("environment", f"unknown environment {self.environment!r}; registered: {known}"))
        for name in ("max_steps", "max_episode_tokens"):
            if getattr(self, name) < 0:
                errors.append((name, "must be ≥ 0 (0 = the environment's budget)"))
        if self.eval_batch < 1:
            errors.append(("eval_batch", "must be ≥ 1"))
        if self.grader_weight < 0 or self.judge_weight < 0 or self.grader_weight + self.judge_weight <= 0:
            errors.append(("judge_weight", "weights must be ≥ 0 and not both 0"))
        if self.judge_weight > 0 and not self.judge_rubric.strip():
            errors.append(("judge_rubric", "required when judge_weight > 0"))
        if self.hint_samples:
            errors.append(("hint_samples", "turn-level GRPO only: an episode's tasks carry no operator's comment"))
        return errors


def _formats_feedback(template: str) -> bool:
    """Whether `template.format(feedback=…)` works and uses the feedback: at least one
    `{feedback}` field, and no other field, conversion or format spec (`{{feedback}}` is
    the literal text, and a spec such as `{feedback:>999999999}` pads without bound)."""
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(template) if name is not None]
    except ValueError:
        return False
    return bool(fields) and all(field == ("feedback", "", None) for field in fields)


MAX_PROCESSES = 64
PARALLEL_KINDS = ("grpo", "sft", "distill")


def processes_errors(config: TrainConfig) -> list[tuple[str, str]]:
    """Why `config.processes` cannot run, if it cannot: out of range, more processes than
    items in a batch (each process needs at least one), a kind whose steps do not
    shard yet, or LoRA dropout (its masks would not be one process's)."""
    n = config.processes
    if not 1 <= n <= MAX_PROCESSES:
        return [("processes", f"must be between 1 and {MAX_PROCESSES}")]
    if config.sharding not in ("replicate", "fsdp"):
        return [("sharding", "must be 'replicate' or 'fsdp'")]
    if n == 1 and config.sharding == "fsdp":
        return [("sharding", "fsdp splits the model over processes: it needs processes ≥ 2")]
    if n == 1:
        return []
    if config.kind not in PARALLEL_KINDS:
        return [("processes", f"{config.kind} jobs run in one process (data-parallel: {', '.join(PARALLEL_KINDS)})")]
    if n > config.prompts_per_step:
        return [("processes", f"must be ≤ prompts_per_step ({config.prompts_per_step}): each process takes items")]
    if config.sharding == "fsdp" and config.adapter != "lora":
        return [("sharding", "fsdp shards LoRA jobs (adapter 'lora'); full fine-tuning replicates the model")]
    if config.lora_dropout > 0:
        # Dropout draws from torch's global stream, which every process seeds alike: each
        # would drop the same units of its own rows, not what one process draws.
        return [("lora_dropout", "must be 0 with processes > 1: the processes' dropout masks are not sharded")]
    return []


class ConfigError(ValueError):
    """A config that does not validate; `errors` lists (field, reason) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors))


CONFIGS: dict[str, type[TrainConfig]] = {
    "grpo": GRPOConfig,
    "distill": DistillConfig,
    "sft": SFTConfig,
    "episodes": EpisodesConfig,
}

_BASIC_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "int | None": int,
    "float | None": (int, float),
    "dict": dict,
}


def config_from_dict(data: dict[str, Any]) -> TrainConfig:
    """The config for `data["kind"]` ("grpo", "distill", "sft" or "episodes")."""
    kind = data.get("kind")
    if kind not in CONFIGS:
        raise ConfigError([("kind", f"must be one of {', '.join(CONFIGS)}")])
    return CONFIGS[kind].from_dict(data)
