"""The MLP's first linear layer and its GELU as one oneDNN call, for bfloat16 inference on
CPU.

In eager PyTorch ``gelu(fc1(x))`` is three passes over a ``T x 4C`` tensor (8193 x 3072 per
layer for a 1024 x 2048 frame): ``addmm`` copies the bias into its output, the product adds
to it and rounds to bfloat16, and the GELU reads and writes it again. oneDNN's fused linear
(``torch.ops.mkldnn._linear_pointwise``, the op Inductor's CPU backend emits) adds the bias
and applies the GELU to the float32 accumulator before the one bfloat16 rounding: one pass,
and as close to the float64 result as the eager path, which rounds before the GELU
(``tests/test_fused_mlp.py``: within 1.1x the plain path's error).

Used only where it computes what :class:`~lookhere_dense.lookhere.layers.Mlp`'s plain path
computes (:func:`use_fused_mlp`): plain ``nn.Linear`` / ``nn.GELU`` (exact or tanh) /
``nn.Dropout`` modules without hooks (a wrapped, quantized or hooked layer keeps its own
forward), no dropout acting, no autograd (``torch.no_grad`` / inference mode, or a frozen
MLP on an input that needs no gradient; no forward-mode AD or ``torch.func`` transform), a
plain CPU tensor, bfloat16 compute
(``torch.autocast('cpu', torch.bfloat16)`` with float32 / bfloat16 tensors, or bfloat16
inputs and weights), not traced / compiled / exported (the caller checks that first: the
graph keeps standard ops), and a torch whose oneDNN has the op and bfloat16 support on this
CPU. ``LOOKHERE_FUSED_MLP=0`` turns it off. Float32 keeps the plain path (there the product
dominates; oneDNN was no faster in a throw-away A/B of the MLP alone).
"""

from __future__ import annotations

import functools

import torch
import torch.autograd.forward_ad as fwAD
import torch.nn as nn
from torch import Tensor

from ..errors import ConfigError
from ..validation import env_switch

__all__ = ['fused_mlp_available', 'use_fused_mlp', 'fused_mlp']

#: the GELU kinds oneDNN's ``gelu`` post-op computes (its ``algorithm`` argument)
GELU_KINDS = ('none', 'tanh')


@functools.lru_cache(maxsize=None)
def _onednn_bf16_linear() -> bool:
    """This torch has ``mkldnn._linear_pointwise`` and its oneDNN supports bfloat16 on this
    CPU (checked once)."""
    try:
        mkldnn = torch.ops.mkldnn
        return bool(mkldnn._is_mkldnn_bf16_supported()) and hasattr(mkldnn, '_linear_pointwise')
    except (AttributeError, RuntimeError):
        return False


def fused_mlp_available() -> bool:
    """Whether the fused path can run here: oneDNN built in and enabled
    (``torch.backends.mkldnn``), :func:`_onednn_bf16_linear`, and ``LOOKHERE_FUSED_MLP`` not
    ``0``."""
    if not env_switch('LOOKHERE_FUSED_MLP', error=ConfigError):
        return False
    if not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return False
    return _onednn_bf16_linear()


def _plain(module: nn.Module, kind: type) -> bool:
    """``module`` is exactly ``kind`` (no subclass, no wrapper) with no hooks of its own."""
    return type(module) is kind and not module._forward_hooks and not module._forward_pre_hooks


def _global_hooks() -> bool:
    """Any module forward hook registered for every module
    (``nn.modules.module.register_module_forward_hook`` / ``_pre_hook``)."""
    m = nn.modules.module
    return bool(getattr(m, '_global_forward_hooks', None)) or bool(
        getattr(m, '_global_forward_pre_hooks', None)
    )


def _transformed(x: Tensor) -> bool:
    """Under a function transform the op has no rule for: forward-mode AD (a dual level is
    open: the op would drop the tangent) or ``torch.func`` (``vmap``, ``jvp``, ``grad``: a
    wrapped tensor; ``vmap`` would loop over the op)."""
    if fwAD._current_level >= 0:
        return True
    functorch = getattr(torch._C, '_functorch', None)
    wrapped = getattr(functorch, 'is_functorch_wrapped_tensor', None)
    return bool(wrapped(x)) if wrapped is not None else False


def use_fused_mlp(x: Tensor, mlp: nn.Module) -> bool:
    """Whether ``mlp(x)`` (an :class:`~lookhere_dense.lookhere.layers.Mlp`: ``fc1``,
    ``act``, ``drop``, ``fc2``) may take the fused path: every condition of the module
    docstring but the tracing one, which the caller checks first."""
    fc1, act, drop, fc2 = mlp.fc1, mlp.act, mlp.drop, mlp.fc2
    grad = torch.is_grad_enabled()
    if x.device.type != 'cpu' or (grad and x.requires_grad):  # training: out at once
        return False
    if type(x) is not torch.Tensor or _transformed(x):
        return False
    if not (_plain(fc1, nn.Linear) and _plain(fc2, nn.Linear) and _plain(act, nn.GELU)):
        return False
    if act.approximate not in GELU_KINDS or fc1.bias is None:
        return False
    if isinstance(drop, nn.Dropout):
        if not _plain(drop, nn.Dropout) or (drop.training and drop.p > 0):
            return False
    elif not _plain(drop, nn.Identity):
        return False
    params = list(mlp.parameters())
    if any(type(p) is not nn.Parameter for p in params) or _global_hooks():
        return False
    if grad and any(p.requires_grad for p in params):
        return False
    reduced = (torch.float32, torch.bfloat16)  # what autocast casts, or already bfloat16
    if torch.is_autocast_enabled('cpu'):
        if torch.get_autocast_dtype('cpu') != torch.bfloat16:
            return False
        if x.dtype not in reduced or any(p.dtype not in reduced for p in params):
            return False  # the plain path's dtype error (autocast casts float32 only)
    elif x.dtype != torch.bfloat16 or any(p.dtype != torch.bfloat16 for p in params):
        return False
    return fused_mlp_available()


def fused_mlp(x: Tensor, fc1: nn.Linear, act: nn.GELU, fc2: nn.Linear) -> Tensor:
    """``fc2(gelu(fc1(x)))`` in bfloat16 with ``fc1`` and the GELU in one oneDNN call (where
    :func:`use_fused_mlp` says so).

    Args:
        x: ``(..., C)`` tokens.
        fc1, act, fc2: the MLP's layers (``act`` an ``nn.GELU`` of :data:`GELU_KINDS`).

    Returns:
        ``(..., C_out)`` bfloat16, as ``F.linear`` under bfloat16 autocast returns it.
    """
    dtype = torch.bfloat16
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).to(dtype).contiguous()
    h = torch.ops.mkldnn._linear_pointwise(
        x2, fc1.weight.to(dtype), fc1.bias.to(dtype), 'gelu', [], act.approximate
    )
    bias2 = None if fc2.bias is None else fc2.bias.to(dtype)
    out = torch.ops.mkldnn._linear_pointwise(h, fc2.weight.to(dtype), bias2, 'none', [], '')
    return out.reshape(*shape[:-1], out.shape[-1])
