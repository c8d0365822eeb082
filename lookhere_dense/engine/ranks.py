"""Multi-process runs: decisions every rank takes together (torch.distributed alone; the
values of a single-process run pass through): :func:`world_max`, :func:`barrier`; and
:func:`unwrap_model`, the model inside a DDP / FSDP / TTA wrapper."""

from __future__ import annotations

from typing import Any

__all__ = ['world_max', 'barrier', 'unwrap_model']


def unwrap_model(model: Any) -> Any:
    """``model.module`` of a model wrapper (mmengine's ``is_model_wrapper``: DDP, FSDP,
    ``MMDistributedDataParallel``) or of a test-time-augmentation model (``BaseTTAModel``,
    ``--tta``: the checkpoint holds its inner model's keys), else ``model``; as mmengine's
    own checkpoint loading unwraps them."""
    from mmengine.model import BaseTTAModel, is_model_wrapper

    return model.module if is_model_wrapper(model) or isinstance(model, BaseTTAModel) else model


def world_max(value: int) -> int:
    """The largest ``value`` over all ranks (``value`` itself outside distributed runs):
    a stop flag one rank raised stops them all after the same step."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    device = 'cuda' if dist.get_backend() == 'nccl' else 'cpu'
    flag = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def barrier() -> None:
    """Wait for every rank (nothing outside distributed runs)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
