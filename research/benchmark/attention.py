"""Section ``attn``: LookHere attention alone, flex vs SDPA without / with the bias.

On CUDA: LookHere flex (compiled, block mask, tile order) vs SDPA without a bias (flash)
vs SDPA with the materialised dense bias, at several token counts, plus flex's largest
error against float32 SDPA with the bias. On every device: the fraction of flex tiles the
block mask lets the kernel skip, in row order and in tile order (no GPU needed).

Torch only; the flex parts need a torch with ``flex_attention`` (>= 2.5) and are skipped,
with a note, without it.
"""

from __future__ import annotations

import math
import statistics
from functools import partial
from typing import Any, Callable, Dict, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lookhere_dense.lookhere import LookHereAttentionEngine, resolve_lh_config
from lookhere_dense.lookhere.flex import (
    flex_attention_lookhere,
    flex_available,
    lookhere_block_mask,
)

from . import DTYPES
from .timing import interleaved, paired_ratio

__all__ = ['grid_for', 'skipped_tile_fraction', 'bench_attention']


def grid_for(tokens: int) -> Tuple[int, int]:
    """A patch grid ``(H, W)`` with ``tokens`` patches, as square as possible (H <= W)."""
    if tokens < 1:
        raise ValueError(f'tokens must be >= 1, got {tokens}')
    h = int(math.isqrt(tokens))
    while tokens % h:
        h -= 1
    return h, tokens // h


def skipped_tile_fraction(
    engine: LookHereAttentionEngine, grid: Tuple[int, int], device: torch.device
) -> Dict[str, float]:
    """Fraction of the 128x128 tiles (all heads of layer 0, no CLS) that flex skips,
    ``{'row order': f, 'tile order': f}``."""
    gb = engine.grid_bias(grid, device)
    out = {}
    for name, order in (
        ('row order', None),
        ('tile order', engine.flex_order(grid, False, device)),
    ):
        bm = lookhere_block_mask(gb, 0, False, order=order)
        out[name] = 0.0 if bm is None else bm.sparsity() / 100
    return out


def _cases(q, k, v, grid_bias, mask, score_mod, order, bias) -> Dict[str, Callable]:
    """The three attention calls of one ``attn`` case on ``q, k, v``."""
    return {
        'flex': partial(
            flex_attention_lookhere, q, k, v, grid_bias, 0, False, mask, True, score_mod, order
        ),
        'sdpa_nobias': partial(F.scaled_dot_product_attention, q, k, v),
        'sdpa_dense_bias': partial(F.scaled_dot_product_attention, q, k, v, attn_mask=bias),
    }


def _train_step(fn: Callable, leaves: Sequence[Tensor], grad_out: Tensor) -> None:
    """Forward + backward of one attention call; the leaves' gradients are dropped."""
    fn().backward(grad_out)
    for t in leaves:
        t.grad = None


def bench_attention(
    preset: str = 'lh90',
    tokens: Sequence[int] = (1024, 4096, 8192),
    num_heads: int = 12,
    embed_dims: int = 768,
    device: str = 'cpu',
    dtype: str = 'bfloat16',
    repeats: int = 10,
    backward: bool = True,
) -> Dict[str, Any]:
    """Section ``attn``.

    Args:
        preset: LookHere preset. Default: ``'lh90'``.
        tokens: sequence lengths (patches, no CLS) to measure. Default: 1024, 4096, 8192.
        num_heads: heads. Default: 12.
        embed_dims: channels (head dim = ``embed_dims // num_heads``). Default: 768.
        device: ``'cpu'`` (tile sparsity only) or ``'cuda'`` (timings too). Default: cpu.
        dtype: name in :data:`~research.benchmark.DTYPES`. Default: ``'bfloat16'``.
        repeats: timed interleaved rounds on CUDA (at least 10). Default: 10.
        backward: on CUDA also time forward + backward (``train_seconds``, ratios
            ``train_flex_vs_nobias`` / ``train_dense_vs_flex``). Default: True.

    Returns:
        ``preset``, ``dtype``, ``repeats`` (the interleaved rounds really timed:
        ``max(repeats, 10)`` on CUDA, None on CPU where nothing is timed), ``cases`` per
        token count: ``grid``, and
        ``skipped_tile_fraction`` (or ``skipped``: why not); on CUDA also median
        ``seconds`` per case, ``flex_vs_nobias``, ``dense_vs_flex`` and
        ``flex_max_abs_err``.
    """
    torch_dtype = DTYPES[dtype]
    cfg = resolve_lh_config(preset)
    # the rounds really timed (CUDA only: on CPU nothing is timed), recorded in the result
    rounds = max(repeats, 10) if torch.device(device).type == 'cuda' else None
    res: Dict[str, Any] = dict(preset=preset, dtype=dtype, repeats=rounds, cases={})
    for n in tokens:
        grid = grid_for(n)
        case: Dict[str, Any] = dict(grid=list(grid))
        res['cases'][str(n)] = case
        if not flex_available():
            case['skipped'] = 'no torch.nn.attention.flex_attention in this torch'
            continue
        eng = LookHereAttentionEngine(cfg, 1, num_heads, 'flex')
        dev = torch.device(device)
        case['skipped_tile_fraction'] = skipped_tile_fraction(eng, grid, dev)
        if dev.type != 'cuda':
            continue
        gb = eng.grid_bias(grid, dev)
        q, k, v = (
            torch.randn(1, num_heads, n, embed_dims // num_heads, device=dev, dtype=torch_dtype)
            for _ in range(3)
        )
        bias = eng.dense_bias(0, grid, False, q.device, torch_dtype)[None]
        mask = eng.block_mask(0, grid, False, q.device)
        mod = eng.score_mod(0, grid, False, q.device)
        order = eng.flex_order(grid, False, q.device)

        extra = (gb, mask, mod, order, bias)
        fns = _cases(q, k, v, *extra)
        ref = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=bias.float()
        )
        with torch.inference_mode():
            for fn in fns.values():  # compile / warm up
                for _ in range(3):
                    fn()
            err = (fns['flex']().float() - ref).abs().max().item()
            times = interleaved(fns, rounds, device)
        case.update(
            seconds={name: statistics.median(t) for name, t in times.items()},
            flex_vs_nobias=paired_ratio(times['flex'], times['sdpa_nobias']),
            dense_vs_flex=paired_ratio(times['sdpa_dense_bias'], times['flex']),
            flex_max_abs_err=err,
        )
        if backward:  # forward + backward of q, k, v (the bias takes no gradient)
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            steps = {
                name: partial(_train_step, fn, leaves, torch.randn_like(q))
                for name, fn in _cases(*leaves, *extra).items()
            }
            for fn in steps.values():  # compile / warm up
                for _ in range(2):
                    fn()
            times = interleaved(steps, rounds, device)
            case.update(
                train_seconds={name: statistics.median(t) for name, t in times.items()},
                train_flex_vs_nobias=paired_ratio(times['flex'], times['sdpa_nobias']),
                train_dense_vs_flex=paired_ratio(times['sdpa_dense_bias'], times['flex']),
            )
            del leaves, steps
        del q, k, v, bias, fns, extra
        torch.cuda.empty_cache()
    return res
