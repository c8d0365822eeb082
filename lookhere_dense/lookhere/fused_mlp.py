"""The MLP's first linear layer and its GELU as one oneDNN call, for bfloat16 inference on
CPU.

In eager PyTorch ``gelu(fc1(x))`` is three passes over a ``T x 4C`` tensor (8193 x 3072 per
layer for a 1024 x 2048 frame): ``addmm`` copies the bias into its output, the product adds
to it and rounds to bfloat16, and the GELU reads and writes it again. oneDNN's fused linear
(``torch.ops.mkldnn._linear_pointwise``, the op Inductor's CPU backend emits) adds the bias
and applies the GELU to the float32 accumulator before the one bfloat16 rounding: one pass,
and at least as close to the float64 result as the eager path (which rounds before the
GELU; ``tests/test_fused_mlp.py``).

Used only where it computes what :class:`~lookhere_dense.lookhere.layers.Mlp`'s plain path
computes: no autograd (``torch.no_grad`` / inference mode, or a frozen MLP on an input that
needs no gradient), a CPU tensor, bfloat16 compute (``torch.autocast('cpu',
torch.bfloat16)`` with float32 / bfloat16 tensors, or bfloat16 inputs and weights), an exact
or tanh ``nn.GELU``, no active dropout, not traced / compiled / exported (the caller's
check: the graph keeps standard ops), and a torch whose oneDNN has the op and bfloat16
support on this CPU. ``LOOKHERE_FUSED_MLP=0`` turns it off. Float32 keeps the plain path:
there the product dominates and oneDNN was no faster (docs/performance.md).
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

__all__ = ['fused_mlp_available', 'fused_mlp_dtype', 'fused_mlp']

_STATE: dict = {}


def fused_mlp_available() -> bool:
    """Whether this torch and CPU run oneDNN's fused bfloat16 linear (checked once: the op
    exists, oneDNN is built in and enabled, and it supports bfloat16 here), and
    ``LOOKHERE_FUSED_MLP`` is not ``0``."""
    if os.environ.get('LOOKHERE_FUSED_MLP', '1') == '0':
        return False
    if not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return False
    if 'ok' not in _STATE:
        ok = False
        try:
            mkldnn = torch.ops.mkldnn
            ok = bool(mkldnn._is_mkldnn_bf16_supported()) and hasattr(mkldnn, '_linear_pointwise')
        except (AttributeError, RuntimeError):
            ok = False
        _STATE['ok'] = ok
    return _STATE['ok']


def fused_mlp_dtype(
    x: Tensor, fc1: nn.Linear, act: nn.Module, fc2: nn.Linear, dropout: float
) -> Optional[torch.dtype]:
    """The compute dtype of the fused path for this call (``torch.bfloat16``), or None where
    the plain path must run: the module docstring's conditions but the tracing one, which
    the caller checks. ``dropout``: the probability of the MLP's dropout in this call (0 in
    eval mode). "No autograd" is: grad mode off, or nothing of the call needs a gradient
    (a frozen MLP on an input that needs none)."""
    if x.device.type != 'cpu' or type(act) is not nn.GELU or dropout > 0 or fc1.bias is None:
        return None
    params = (fc1.weight, fc1.bias, fc2.weight) + (() if fc2.bias is None else (fc2.bias,))
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)):
        return None
    reduced = (torch.float32, torch.bfloat16)  # what autocast casts, or already bfloat16
    if torch.is_autocast_enabled('cpu'):
        if torch.get_autocast_dtype('cpu') != torch.bfloat16:
            return None
        if x.dtype not in reduced or any(p.dtype not in reduced for p in params):
            return None  # the plain path's dtype error (autocast casts float32 only)
    elif x.dtype != torch.bfloat16 or any(p.dtype != torch.bfloat16 for p in params):
        return None
    if not fused_mlp_available():
        return None
    return torch.bfloat16


def fused_mlp(
    x: Tensor, fc1: nn.Linear, act: nn.GELU, fc2: nn.Linear, dtype: torch.dtype
) -> Tensor:
    """``fc2(gelu(fc1(x)))`` with ``fc1`` and the GELU in one oneDNN call, in ``dtype``.

    Args:
        x: ``(..., C)`` tokens.
        fc1, act, fc2: the MLP's layers (``act`` an ``nn.GELU``).
        dtype: the compute dtype, from :func:`fused_mlp_dtype`.

    Returns:
        ``(..., C_out)`` in ``dtype``, as ``F.linear`` under autocast returns it.
    """
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).to(dtype).contiguous()
    algorithm = 'tanh' if act.approximate == 'tanh' else 'none'
    h = torch.ops.mkldnn._linear_pointwise(
        x2, fc1.weight.to(dtype), fc1.bias.to(dtype), 'gelu', [], algorithm
    )
    bias2 = None if fc2.bias is None else fc2.bias.to(dtype)
    out = torch.ops.mkldnn._linear_pointwise(h, fc2.weight.to(dtype), bias2, 'none', [], '')
    return out.reshape(*shape[:-1], out.shape[-1])
