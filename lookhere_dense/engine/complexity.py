"""FLOP counts with the attention included (:func:`flop_analyzer`, :func:`sdpa_flop_jit`).

mmengine's counter (``mmengine.analysis.get_model_complexity_info`` / ``FlopAnalyzer``)
has no handle for ``aten::scaled_dot_product_attention``: it warns ``Unsupported operator
aten::scaled_dot_product_attention`` and counts nothing for it, so every model whose
attention runs through it -- the LookHere trunk (its traced graph: ``auto`` leaves the fused
kernel and flex out of a trace), timm's ViT -- is counted without its ``Q K^T`` and ``P V``
(a ViT-S at 256x256: 5.54 G instead of 6.15 G). :func:`flop_analyzer` is mmengine's
``FlopAnalyzer`` with that handle set; its counts follow mmengine's convention (one
multiply-add is one FLOP), so a LookHere ViT and mmseg's ``VisionTransformer`` of the same
shape count the same (``tests/test_complexity.py``).

The count is of the dense attention the traced graph computes. LookHere's fused kernel skips
the tiles its masks hide (about half of them for ``lh180``); the FLOP bound of the visible
pairs is ``research.benchmark.peer.flop_bound`` (docs/performance.md).
"""

from __future__ import annotations

from math import prod
from typing import Any, List, Tuple, Union

from torch import Tensor, nn

__all__ = ['SDPA_OP', 'sdpa_flop_jit', 'flop_analyzer']

#: the traced operator mmengine's counter has no handle for
SDPA_OP = 'aten::scaled_dot_product_attention'


def sdpa_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """FLOPs of one ``aten::scaled_dot_product_attention`` call, counted as mmengine counts
    a matmul: ``Q K^T`` and ``P V``, ``B * H * Nq * Nk * (d + dv)`` for ``q`` of shape
    ``(B, H, Nq, d)``, ``k`` ``(B, H, Nk, d)`` and ``v`` ``(B, H, Nk, dv)`` (the softmax and
    the mask, elementwise, are not counted, as mmengine counts no elementwise op)."""
    from mmengine.analysis.jit_handles import get_shape

    q, k, v = (get_shape(x) for x in inputs[:3])
    return prod(q[:-2]) * q[-2] * k[-2] * (q[-1] + v[-1])


def flop_analyzer(model: nn.Module, inputs: Union[Tensor, Tuple[Tensor, ...]]) -> Any:
    """mmengine's ``FlopAnalyzer`` of ``model`` on ``inputs`` with the attention counted
    (:func:`sdpa_flop_jit`): ``.total()``, ``.by_module()``, and
    ``mmengine.analysis.complexity_stats_table(flops=...)`` as for mmengine's own."""
    from mmengine.analysis import FlopAnalyzer

    return FlopAnalyzer(model, inputs).set_op_handle(SDPA_OP, sdpa_flop_jit)
