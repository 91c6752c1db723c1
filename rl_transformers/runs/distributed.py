"""Data-parallel PPO over ``torch.distributed``: every rank acts in its own envs, gradients are averaged.

Launch with ``torchrun --nproc_per_node K scripts/train_gtrxl.py ...``. Each rank reads RANK / WORLD_SIZE /
LOCAL_RANK from the environment (set by torchrun), joins a process group (``gloo`` on CPU, ``nccl`` on GPU),
receives rank 0's initial parameters, seeds its envs with an offset, and after every backward pass all-reduces
one flat buffer holding all gradients plus a few scalars the ranks must agree on (the approximate KL for the
target-KL stop, a non-finite flag). Since every rank then applies the same averaged gradient with the same
optimizer, parameters stay identical (tested with 2 gloo ranks). Only rank 0 logs and writes checkpoints.
"""

from __future__ import annotations

import datetime
import gc
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rl_transformers.utils.checks import check_device, check_device_available


@dataclass(frozen=True)
class DistContext:
    """Where this process sits in the job (a single process is rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_context() -> DistContext:
    """The job shape torchrun's environment variables describe, before any process group exists."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    return DistContext(
        rank=rank,
        world_size=world_size,
        local_rank=int(os.environ.get("LOCAL_RANK", str(rank))),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size))),
    )


def resolve_device(name: str, ctx: DistContext) -> torch.device:
    """``auto`` -> cuda if available else cpu; a bare ``cuda`` under torchrun -> this rank's local GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(name)  # UserError naming --device, the valid forms and the closest match
    device = torch.device(name)
    check_device_available(device)
    if device.type == "cuda" and device.index is None and ctx.enabled:
        device = torch.device("cuda", ctx.local_rank)
    return device


def init_distributed(device: torch.device, timeout: datetime.timedelta | None = None) -> DistContext:
    """Join the process group described by torchrun's environment variables (no-op for a single process)."""
    ctx = launched_context()
    if not ctx.enabled:
        return DistContext()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=ctx.rank, world_size=ctx.world_size, timeout=timeout)
    return DistContext(ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, backend)


def setup_distributed(
    device_name: str, timeout: datetime.timedelta | None = None
) -> tuple[DistContext, torch.device]:
    """Resolve the device for this rank and join the process group: ``(context, device)``."""
    device = resolve_device(device_name, launched_context())
    return init_distributed(device, timeout), device


def shutdown(ctx: DistContext) -> None:
    """Destroy the process group, then collect garbage so that the backend object really goes now.

    ``destroy_process_group`` only drops torch's own references. A DistributedDataParallel wrapper sits in
    reference cycles and keeps its group alive until the cyclic collector runs, which may be at interpreter
    exit: gloo's worker threads then free tensors without a live interpreter and the rank dies with SIGABRT
    ("terminate called without an active exception"), seen once in a few dozen CI runs of the 2-rank DT tests.
    Trainers drop their wrapper in ``close()`` (before this runs); the collection frees what the cycles held."""
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()


def broadcast_parameters(module: nn.Module, ctx: DistContext) -> None:
    """Copy rank 0's parameters and buffers to every rank."""
    if not ctx.enabled:
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)


def allreduce_gradients(module: nn.Module, ctx: DistContext, scalars: Tensor) -> Tensor:
    """Average every gradient and ``scalars`` (1-D float) over ranks in one collective; return the scalars."""
    if not ctx.enabled:
        return scalars
    params = [p for p in module.parameters() if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads] + [scalars.to(grads[0].dtype).reshape(-1)])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= ctx.world_size
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        averaged = flat[offset : offset + n].view_as(g)
        if p.grad is None:
            p.grad = averaged.clone()
        else:
            p.grad.copy_(averaged)
        offset += n
    return flat[offset:].to(scalars.dtype)


def allreduce_max(value: float, ctx: DistContext) -> float:
    """Maximum of a scalar over ranks (e.g. the Ctrl-C flag, so every rank stops after the same update)."""
    if not ctx.enabled:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    if ctx.backend == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def allreduce_sum(t: Tensor, ctx: DistContext) -> Tensor:
    """Element-wise sum of ``t`` over ranks (a new tensor; ``t`` itself for a single process)."""
    if not ctx.enabled:
        return t
    out = t.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def any_rank(flag: bool, ctx: DistContext) -> bool:
    """True on every rank when ``flag`` is True on at least one."""
    return allreduce_max(1.0 if flag else 0.0, ctx) > 0


def gather_objects(obj: Any, ctx: DistContext) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if not ctx.enabled:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def parameter_checksum(module: nn.Module) -> Tensor:
    """Float64 sum and sum of squares of all parameters, to compare replicas."""
    with torch.no_grad():
        flat = torch.cat([p.detach().double().reshape(-1) for p in module.parameters()])
    return torch.stack([flat.sum(), (flat * flat).sum()])
