"""Loading the policy (LoRA via peft, or full fine-tuning), the frozen reference, and
saving checkpoints, resuming from them, and exporting the trained version."""

from __future__ import annotations

import contextlib
import copy
import json
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.trainer import sharding
from training.trainer.config import TrainConfig
from training.trainer.sharding import trainable_state

REFERENCE_ADAPTER = "reference"  # the frozen copy of a starting adapter, beside peft's "default"


@dataclass
class Policy:
    model: Any  # a transformers causal LM, wrapped by peft for LoRA
    tokenizer: Any
    device: torch.device
    adapter: str  # "lora" or "full"
    reference: Any = None  # a frozen copy for full fine-tuning when a reference is needed
    # LoRA continued from a LoRA version (`init_adapter`): the start is base + that adapter,
    # so switching the adapter off would give the base model, not the start.
    starts_from_adapter: bool = False
    reference_adapter: str | None = None  # the frozen copy of the starting adapter, when loaded

    @contextlib.contextmanager
    def as_reference(self) -> Iterator[Any]:
        """The model as it was at the start of the job, for KL and a frozen teacher.

        - LoRA from a base or full version: the same module with its adapter switched off
          (no second copy in memory).
        - LoRA continued from a LoRA version: the same module with the frozen copy of the
          starting adapter active (`reference_adapter`, loaded beside the trained one), in
          eval mode; the trained adapter and which parameters train are restored after.
        - Full fine-tuning: the frozen copy kept in `reference`."""
        if self.adapter == "lora" and not self.starts_from_adapter:
            with self.model.disable_adapter():
                yield self.model
        elif self.adapter == "lora":
            if self.reference_adapter is None:
                raise RuntimeError(
                    "a LoRA job continued from an adapter without its frozen copy (load with reference=True)"
                )
            trained = self.model.active_adapter
            # peft's set_adapter changes requires_grad on adapter weights; the optimizer's
            # set of trainable parameters must come back exactly as it was.
            flags = [(p, p.requires_grad) for p in self.model.parameters()]
            was_training = self.model.training
            self.model.set_adapter(self.reference_adapter, inference_mode=True)
            self.model.eval()
            try:
                yield self.model
            finally:
                self.model.set_adapter(trained)
                self.model.train(was_training)
                for param, flag in flags:
                    param.requires_grad_(flag)
        else:
            if self.reference is None:
                raise RuntimeError("full fine-tuning without a reference copy (load with reference=True)")
            yield self.reference

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def save_pretrained(self, folder: Path, *, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Save the trained weights as a model or adapter folder: for LoRA only the trained
        adapter (peft would also write the frozen reference copy into a subfolder).
        `state_dict`: the weights' whole values when the model holds shards of them
        (`sharding.trainable_state`)."""
        extra = {} if state_dict is None else {"state_dict": state_dict}
        if self.reference_adapter is not None:
            self.model.save_pretrained(
                folder, safe_serialization=True, selected_adapters=[self.model.active_adapter], **extra
            )
        else:
            self.model.save_pretrained(folder, safe_serialization=True, **extra)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def load_policy(
    config: TrainConfig, *, reference: bool = False, model=None, tokenizer=None, weights: str = "device"
) -> Policy:
    """The trainable policy described by `config`. `model`/`tokenizer` may be passed in
    already built (the GPU check builds random models); otherwise they are loaded from
    `config.model_path`.

    `weights` says where a loaded model's weights go: "device" (the config's), "host" (kept
    on the CPU: a sharded job's rank 0, whose `sharding.shard_model` then moves each block's
    shard to the device, so the device never holds the whole model) or "none" (a sharded
    job's other processes: a skeleton whose parameters are on the meta device, taking no
    memory, filled with rank 0's weights when the model is sharded)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cpu_grouped_attention()
    device = pick_device(config.device)
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(config.model_path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model is None and weights == "none":
        model = model_skeleton(config.model_path, dtype=dtype)
    elif model is None:
        model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=dtype)
    model = model.to(dtype=dtype) if weights != "device" else model.to(device=device, dtype=dtype)
    model.config.use_cache = True
    ref = None
    reference_adapter = None
    if config.adapter == "lora":
        from peft import LoraConfig, PeftModel, get_peft_model

        if config.init_adapter:
            model = PeftModel.from_pretrained(model, config.init_adapter, is_trainable=True)
            if reference:
                # The same adapter a second time, frozen: the reference is the version the
                # job started from (base + adapter), at the cost of one adapter's weights.
                model.load_adapter(config.init_adapter, adapter_name=REFERENCE_ADAPTER, is_trainable=False)
                reference_adapter = REFERENCE_ADAPTER
        else:
            # `trainable_layers` with LoRA: adapters on the top N blocks only, so the
            # backward pass stops there (several times cheaper on a CPU).
            blocks = len(model.model.layers) if config.trainable_layers else 0
            target: str | list[str] = config.lora_target
            if blocks and target == "all-linear":  # peft wants module names with layers_to_transform
                target = sorted(
                    {
                        n.rsplit(".", 1)[-1]
                        for n, m in model.model.layers.named_modules()
                        if isinstance(m, torch.nn.Linear)
                    }
                )
            lora = LoraConfig(
                r=config.lora_rank,
                lora_alpha=config.lora_alpha,
                lora_dropout=config.lora_dropout,
                target_modules=target,
                layers_to_transform=list(range(max(0, blocks - config.trainable_layers), blocks)) if blocks else None,
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, lora)
    else:
        if reference:
            ref = copy.deepcopy(model).eval()
            ref.requires_grad_(False)
        if config.trainable_layers is not None:
            _train_top_layers(model, config.trainable_layers)
    model.train()
    return Policy(
        model=model,
        tokenizer=tokenizer,
        device=device,
        adapter=config.adapter,
        reference=ref,
        starts_from_adapter=config.adapter == "lora" and bool(config.init_adapter),
        reference_adapter=reference_adapter,
    )


def cpu_grouped_attention() -> None:
    """On the CPU, let SDPA read grouped-query attention's shared key/value heads itself
    (`enable_gqa`) when a mask is given. transformers only does so where CUDA's kernels
    allow (no mask), and otherwise copies every key/value head out to its query heads, the
    whole cache, at every layer and decode step: the same outputs, about 3.7 times slower
    batched decoding for SmolLM2-135M (3 key/value heads for 9) on a CPU. Other devices
    keep transformers' own choice. Idempotent: the process's first policy installs it."""
    import transformers.integrations.sdpa_attention as sdpa

    if getattr(sdpa.use_gqa_in_sdpa, "cpu_grouped", False):
        return
    chosen = sdpa.use_gqa_in_sdpa

    def use_gqa(attention_mask, key, value) -> bool:
        if key.device.type == "cpu" and key.shape[-1] == value.shape[-1]:
            return True
        return chosen(attention_mask, key, value)

    use_gqa.cpu_grouped = True  # type: ignore[attr-defined]
    use_gqa.chosen = chosen  # type: ignore[attr-defined]  # transformers' own, as a CUDA job runs
    sdpa.use_gqa_in_sdpa = use_gqa


def model_skeleton(path: str, *, dtype: torch.dtype):
    """The causal LM of `path` without its weights: parameters on the meta device (no
    memory, no values), buffers such as the rotary frequencies computed on the CPU as
    `from_pretrained` computes them, and the folder's generation config (its end-of-turn
    ids)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)
    model.tie_weights()  # as loading does: a tied output layer is the embeddings' parameter
    with contextlib.suppress(OSError):  # a folder without generation_config.json keeps the default
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model


def _train_top_layers(model, count: int) -> None:
    """Freeze everything but the last `count` transformer blocks and the final norm
    (embeddings stay frozen: with tied weights they are the output layer too)."""
    model.requires_grad_(False)
    blocks = model.model.layers
    for block in blocks[max(0, len(blocks) - count) :]:
        block.requires_grad_(True)
    model.model.norm.requires_grad_(True)


def make_optimizer(policy: Policy, config: TrainConfig, *, sharded: bool = False) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters, fused (one kernel over every tensor, as TRL's
    default `adamw_torch_fused` is) where the parameters allow it: on the CPU torch's own
    default is the per-tensor loop, several times slower for a small model's many small
    tensors. A sharded model's parameters are DTensors; they keep the per-tensor loop."""
    parameters = policy.trainable_parameters()
    fused = not sharded and all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in parameters)
    return torch.optim.AdamW(
        parameters,
        lr=config.learning_rate,
        weight_decay=config.weight_decay,
        betas=(0.9, 0.99),
        fused=fused or None,
    )


# --- checkpoints -----------------------------------------------------------------------


def save_checkpoint(
    run_dir: Path,
    *,
    policy: Policy,
    optimizer: torch.optim.Optimizer,
    step: int,
    config: TrainConfig,
    state: dict[str, Any],
    keep: int = 2,
    trainable: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write `run_dir/checkpoints/step-NNNNNN/` atomically (a temp folder renamed into
    place, then the `latest` pointer), keeping the newest `keep` checkpoints.

    Holds the trainable weights (the adapter, or the trained blocks), the optimizer
    state, the step, the RNG states, the job config and the loop's own `state`.
    `trainable`, `optimizer_state`: their whole values, gathered beforehand by every
    process of a sharded job (`sharding.py`); by default read from this process."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    from safetensors.torch import save_file

    if trainable is None:
        trainable = trainable_state(policy.model)
    save_file(trainable, str(tmp / "trainable.safetensors"))
    torch.save(optimizer.state_dict() if optimizer_state is None else optimizer_state, tmp / "optimizer.pt")
    rng = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(
        json.dumps({"step": step, "config": config.to_dict(), "state": state}, indent=1, default=str)
    )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    pointer = root / "latest.tmp"
    pointer.write_text(final.name)
    pointer.replace(root / "latest")
    existing = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in existing[: max(0, len(existing) - max(keep, 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return final


CHECKPOINT_NAME = re.compile(r"step-[0-9]{6,9}")
CHECKPOINT_FILES = ("trainable.safetensors", "optimizer.pt", "rng.pt", "trainer_state.json")


class CheckpointRefused(RuntimeError):
    """A checkpoint folder that is not one this code wrote: a `latest` pointer naming
    something other than a `step-N` folder inside the run's own `checkpoints/`, or a
    symlink anywhere on the way. The job fails rather than load it."""


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint the `latest` pointer names, or None when the run has none yet.

    The pointer must name a `step-NNNNNN` folder directly inside `run_dir/checkpoints/`;
    the folder, the pointer and the checkpoint's files must be plain files and folders
    (no symlinks, no `..`): whoever can write the run folder must not be able to make a
    worker load a file from anywhere else. Anything else raises `CheckpointRefused`."""
    root = run_dir / "checkpoints"
    pointer = root / "latest"
    if root.is_symlink():
        raise CheckpointRefused(f"{root} is a symlink")
    if pointer.is_symlink():
        raise CheckpointRefused(f"{pointer} is a symlink")
    if not pointer.exists():
        return None
    if not pointer.is_file():
        raise CheckpointRefused(f"{pointer} is not a file")
    name = pointer.read_text(errors="replace").strip()
    if not CHECKPOINT_NAME.fullmatch(name):
        raise CheckpointRefused(f"{pointer} names {name[:80]!r}, not a step-N folder of this run")
    path = root / name
    if path.is_symlink() or not path.is_dir() or path.resolve().parent != root.resolve():
        raise CheckpointRefused(f"{path} is not a folder inside {root}")
    if not (path / "trainer_state.json").exists():
        return None
    for file in CHECKPOINT_FILES:
        if (path / file).is_symlink():
            raise CheckpointRefused(f"{path / file} is a symlink")
    return path


def load_checkpoint(
    path: Path, *, policy: Policy, optimizer: torch.optim.Optimizer, sharded: bool = False
) -> dict[str, Any]:
    """Restore weights, optimizer and RNG from `path`; return {"step", "config", "state"}.
    `sharded`: the model is split over the job's processes (every process loads, and keeps
    its shard; the optimizer's state is keyed by parameter name, `sharding.optimizer_state`).

    Tensors and plain containers only (`weights_only=True`): a pickled object in a
    checkpoint is refused instead of run."""
    from safetensors.torch import load_file

    weights = load_file(str(path / "trainable.safetensors"), device=str(policy.device))
    params = dict(policy.model.named_parameters())
    missing = [n for n in weights if n not in params]
    if missing:
        raise RuntimeError(f"checkpoint {path} does not fit this model: {missing[:3]}…")

    sharding.trainable_load(policy.model, weights)
    optimizer_state = torch.load(path / "optimizer.pt", map_location=policy.device, weights_only=True)
    # A saved group carries its implementation flags, and loading would put them back: a
    # checkpoint of the per-tensor optimizer would turn a fused one back into the loop, and a
    # fused checkpoint would force the fused kernel on a sharded job's DTensors.
    for group, own in zip(optimizer_state.get("param_groups", []), optimizer.param_groups, strict=False):
        for flag in ("fused", "foreach"):
            if flag in own:
                group[flag] = own[flag]
    if sharded:
        sharding.optimizer_load(policy.model, optimizer, optimizer_state)
    else:
        optimizer.load_state_dict(optimizer_state)
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["torch"])
    random.setstate(_python_rng_state(rng["python"]))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((path / "trainer_state.json").read_text())


def _python_rng_state(value: Any) -> tuple:
    """`random.getstate()` as saved: (version, tuple of ints, gauss), lists or tuples."""
    version, internal, gauss = value
    return (int(version), tuple(int(x) for x in internal), gauss)


def export_model(policy: Policy, dest: Path, *, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Save the trained version: a PEFT adapter folder for LoRA (servable by vLLM:
    no `modules_to_save`), or a full HF model folder; the tokenizer goes with either.
    `state_dict`: see `Policy.save_pretrained`."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.save_pretrained(tmp, state_dict=state_dict)
    policy.tokenizer.save_pretrained(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest
