"""Sharded data parallelism (FSDP2, `torch.distributed.fsdp.fully_shard`) for LoRA jobs
whose base model does not fit one device (docs/decisions/0032-fsdp2-lockstep.md).

A job with `"sharding": "fsdp"` runs the data-parallel loop of `parallel.py` (each process
its share of every batch, per-item seeds, global normalisers) with the model's weights
split over the processes: each transformer block, and then the rest of the model, is a
`fully_shard` unit holding 1/N of its parameters; a forward pass all-gathers a block's
weights just before it runs and frees them after, and the backward pass reduce-scatters
the gradients, so each process keeps 1/N of the adapter's gradients and optimizer state.

That makes every forward and backward pass a collective: the processes must call the
model the same number of times, in the same order, or they wait for each other forever.
The loop therefore runs in *lockstep* where the number of passes depends on the data:

- sampling goes on, token by token, until every process's rows have ended
  (`sampling.decode_from`), and a prefill's shared-prefix pass is taken by every process
  or by none (`sampling.prefill`);
- a GRPO update takes as many micro-batch passes on every process as on the busiest,
  the others passing one token whose loss is multiplied by 0 (`passes_pad`);
- evaluations and canaries are sampled by every process (rank 0 alone scores and records
  them), and checkpoints and the export gather the adapter on every process (rank 0
  alone writes).

Gradients are summed, not averaged (`set_gradient_divide_factor(1)`): each process's loss
is already its share of the global batch's, as in the replicated mode.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from training.trainer.parallel import Ranks, collective, gathering, ranks_current


def is_sharded(model: Any) -> bool:
    """True when `model` holds `fully_shard` units: its passes are collectives."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in model.modules())


def lockstep(model: Any) -> Ranks | None:
    """The job's processes when `model` is sharded over them (its passes are collectives,
    so every process must take as many as the others), else None."""
    ranks = ranks_current()
    if ranks.size == 1 or not is_sharded(model):
        return None
    return ranks


def blocks_of(model: Any) -> list[torch.nn.Module]:
    """The transformer blocks of a (peft-wrapped) causal LM: the `layers` list of the
    decoder, found by name so that Llama-, Qwen2- and Mistral-style models all shard."""
    for name, module in model.named_modules():
        if name.endswith("model.layers") and isinstance(module, torch.nn.ModuleList):
            return list(module)
    raise ValueError("no transformer blocks (a `model.layers` list) to shard in this model")


def shard_model(model: Any, ranks: Ranks) -> None:
    """Split `model`'s weights over the job's processes, in place: one `fully_shard` unit
    per transformer block, then the root (embeddings, final norm, output layer). Frozen base
    weights and trainable LoRA weights are sharded alike; FSDP2 keeps each parameter's
    `requires_grad`. Gradients are summed over the processes (divide factor 1).

    Every process's shards are then filled from rank 0's model, whose weights may be on the
    CPU (FSDP2 moves each unit's weights to the device as it shards the unit, whole, then
    keeps the shard: the device never holds more than its shards and one unit's weights),
    and the buffers are rank 0's too. The other processes
    may pass a skeleton (`policy.model_skeleton`, parameters on the meta device): they
    then never hold more than their shards and one whole tensor at a time.

    Every trainable weight must sit in a block (ValueError otherwise, before any
    collective): an adapter on the output layer or the embeddings (a `lora_target` that
    reaches them) would live in the root unit, which FSDP2 leaves gathered after a forward
    pass, and its export would need the layer's base weights too."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    blocks = blocks_of(model)
    inside = {id(p) for block in blocks for p in block.parameters()}
    outside = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in inside]
    if outside:
        raise ValueError(
            f"sharding 'fsdp' trains adapters inside the transformer blocks only; these are outside: {outside[:3]}"
        )
    # Every fill below is a collective over the parameters in order: a process that built
    # another model (another skeleton) would wait in one forever.
    names = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    if any(theirs != names for theirs in ranks.gather(names)):
        raise ValueError("the processes built different models: their parameters differ in names or shapes")
    # Rank 0's whole values, held until every shard is filled from them.
    whole = {name: p.detach() for name, p in model.named_parameters()} if ranks.owner else {}
    mesh = init_device_mesh(ranks.device, (ranks.size,))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # Plain SUM collectives (gloo has no pre-multiplied sum; NCCL's zero-copy path wants SUM too).
            module.set_force_sum_reduction_for_comms(True)
    if any(p.is_meta for p in model.parameters()):  # a skeleton: give its shards memory
        model.to_empty(device=ranks.device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            value = whole.pop(name) if ranks.owner else torch.empty(param.shape, dtype=param.dtype)
            _shard_fill(param, value)
        for buffer in model.buffers():
            collective(dist.broadcast, buffer, src=0)


def _shard_fill(param: torch.Tensor, value: torch.Tensor) -> None:
    """Copy rank 0's whole `value` into this process's shard of `param` (a collective:
    rank 0 scatters the shards; the others' `value` gives only the shape)."""
    from torch.distributed.tensor import distribute_tensor

    shard = gathering(distribute_tensor, value.to(param.device, param.dtype), param.device_mesh, param.placements)
    param.to_local().copy_(shard.to_local())


def splits(config: Any, ranks: Ranks) -> bool:
    """Whether a job with `config`, run by `ranks`, splits its model over its processes."""
    return config.sharding == "fsdp" and ranks.size > 1


def held(model: Any) -> tuple[int, int]:
    """(weights this process holds, weights of the whole model): a sharded model's
    parameters count their local shard only."""
    from torch.distributed.tensor import DTensor

    local = whole = 0
    for p in model.parameters():
        whole += p.numel()
        local += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return local, whole


def full_tensor(value: torch.Tensor) -> torch.Tensor:
    """A parameter's (or optimizer state's) whole value: a sharded one is all-gathered, a
    collective every process must call in the same order."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return gathering(value.full_tensor)
    return value


def trainable_state(model: Any) -> dict[str, torch.Tensor]:
    """The trainable parameters' whole values, on the CPU, by name: a checkpoint's and an
    export's weights. Of a sharded model every process calls it, and each gets the whole set."""
    return {
        name: full_tensor(p.detach()).to("cpu").contiguous() for name, p in model.named_parameters() if p.requires_grad
    }


def trainable_load(model: Any, weights: dict[str, torch.Tensor]) -> None:
    """Copy whole trainable values (a checkpoint's) into `model`; a sharded model's
    processes each keep their own shard of each."""
    from torch.distributed.tensor import DTensor

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            param = params[name]
            if isinstance(param, DTensor):
                _shard_fill(param, value)
            else:
                param.copy_(value)


def optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's whole state (every process calls it), keyed by parameter name so
    that a job resumes with any number of processes.

    Before the first optimizer step it is the plain, empty `state_dict()`, as a
    one-process job saves it: torch's gather would first initialise the state by a step
    at learning rate 0, leaving the live optimizer at step 1 with zero moments, and every
    later update with the wrong bias correction."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    if not optimizer.state:  # every process alike: they step together
        return optimizer.state_dict()
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return gathering(get_optimizer_state_dict, model, optimizer, options=options)


def optimizer_load(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load `optimizer_state`'s whole state, each process keeping its shard; an empty
    state (saved before the first step) leaves the fresh optimizer as it is, for the
    reason `optimizer_state` gives."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not state.get("state"):
        return
    options = StateDictOptions(full_state_dict=True)
    gathering(set_optimizer_state_dict, model, optimizer, optim_state_dict=state, options=options)


def grad_norm(norm: torch.Tensor) -> float:
    """`clip_grad_norm_`'s total norm as a number (a sharded model's is a DTensor)."""
    return float(full_tensor(norm))


def most(ranks: Ranks, count: int) -> int:
    """The largest `count` over the processes (each process's own with one)."""
    if ranks.size == 1:
        return count
    tensor = torch.tensor([count], dtype=torch.int64, device=ranks.device)
    collective(dist.all_reduce, tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def passes_pad(model: Any, count: int, *, backward: bool, device: torch.device) -> None:
    """`count` passes of one token through a sharded `model` that change nothing: the
    lockstep's turns of a process with fewer micro-batches than the busiest. With
    `backward`, the pass's output times 0 is backpropagated, adding zeros to the gradient
    (the reduce-scatter every process must join)."""
    token = torch.zeros((1, 1), dtype=torch.long, device=device)
    for _ in range(count):
        if backward:
            out = model(input_ids=token, use_cache=False)
            (out.logits.float().sum() * 0.0).backward()
        else:
            with torch.no_grad():
                model(input_ids=token, use_cache=False)
