"""A loop-based construction of the LookHere bias that follows the official algorithm.

The baseline of the ``bias`` section (:mod:`.bias`): Python loops over query patches,
per-query triangle masks with ``np.tri``, float64 numpy, a dense ``(depth, heads, N, N)``
result, bf16 rounding -- the way the official ``create_lh_bias_tensor`` builds it. Only
the head layout / slope rules are shared with the package (:func:`head_layout`), and
:func:`baseline_matches` checks that it gives exactly our bias on small grids.

Needs numpy (torch and numpy only; no OpenMMLab).
"""

from __future__ import annotations

import math
import time
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from lookhere_dense.lookhere import head_layout, layer_slopes, lookhere_bias, resolve_lh_config

from ..memory import peak_rss

__all__ = ['official_style_bias', 'baseline_matches']


def _cone_rows(height: int, width: int, qy: int, qx: int) -> Dict[str, np.ndarray]:
    """Visible keys ``(H, W)`` of the four 90-degree cones of query ``(qy, qx)``.

    Built from shifted triangular matrices (``np.tri``) per query, the official way.
    ``i``/``j`` are key rows/columns; ``dy = i - qy``, ``dx = j - qx``.
    """
    d, s = qx - qy, qx + qy
    tri = lambda k: np.tri(height, width, k=k, dtype=bool)  # noqa: E731  j <= i + k
    dx_ge_dy = ~tri(d - 1)  # j - i >= qx - qy
    dx_le_dy = tri(d)  # j - i <= qx - qy
    sum_le = ~np.fliplr(tri(width - 2 - s))  # i + j <= qx + qy
    sum_ge = np.fliplr(tri(width - 1 - s))  # i + j >= qx + qy
    return {
        'up': dx_ge_dy & sum_le,
        'down': dx_le_dy & sum_ge,
        'left': dx_le_dy & sum_le,
        'right': dx_ge_dy & sum_ge,
    }


def _half_rows(height: int, width: int, qy: int, qx: int) -> Dict[str, np.ndarray]:
    """Visible keys ``(H, W)`` of the four half planes of query ``(qy, qx)``."""
    i = np.arange(height)[:, None].repeat(width, 1)
    j = np.arange(width)[None, :].repeat(height, 0)
    return {'up': i <= qy, 'down': i >= qy, 'left': j <= qx, 'right': j >= qx}


def official_style_bias(
    config,
    grid_size: Tuple[int, int],
    depth: int,
    num_heads: int,
    marks: Optional[Dict[str, float]] = None,
) -> torch.Tensor:
    """Dense LookHere bias ``(depth, heads, N, N)`` the way the official code builds it.

    Loops over query patches for the direction masks (per-query ``np.tri`` triangles and
    half planes), float64 numpy distance matrices tiled over heads, per-head fill, slopes,
    then per layer: scale, ``nan_to_num(posinf=bf16 max)``, bfloat16, negate. Only the
    head layout/slope rules are shared with the package (:func:`head_layout`).

    Args:
        marks: if given, filled with ``{'shared_s', 'layers_s', 'shared_rss',
            'layers_rss'}`` (seconds and peak RSS after the head stage / after all layers).

    Returns:
        bfloat16 tensor; blocked entries hold ``-bfloat16.max`` as in the official code.
    """
    t0 = time.perf_counter()
    height, width = grid_size
    n = height * width
    direction = config.layer_direction(0)
    specs, head_slopes, _ = head_layout(direction, num_heads)
    ys = np.array([y for y in range(height) for x in range(width)], dtype=np.float64)
    xs = np.array([x for y in range(height) for x in range(width)], dtype=np.float64)
    dist = np.empty((n, n))
    for q in range(n):  # one query row at a time
        dist[q] = np.sqrt((ys - ys[q]) ** 2 + (xs - xs[q]) ** 2)
    if config.distance == 'sqrt':
        dist = dist**0.5
    elif config.distance == 'square':
        dist = dist**2
    centre = np.sqrt((xs - (width - 1) / 2) ** 2 + (ys - (height - 1) / 2) ** 2)

    prims = {p for spec in specs for p in spec}
    need_cones = any(p.startswith(('tri_', 'diag_')) for p in prims)
    visible = {}  # primitive -> (N, N) bool, built query by query
    for name in ('up', 'down', 'left', 'right'):
        visible[name] = np.ones((n, n), dtype=bool)
        if need_cones:
            visible['tri_' + name] = np.ones((n, n), dtype=bool)
    for q in range(n):
        qy, qx = divmod(q, width)
        for name, rows in _half_rows(height, width, qy, qx).items():
            visible[name][q] = rows.ravel()
        if need_cones:
            for name, rows in _cone_rows(height, width, qy, qx).items():
                visible['tri_' + name][q] = rows.ravel()

    lh = np.tile(dist, (num_heads, 1, 1))
    for h, spec in enumerate(specs):
        blocked = np.zeros((n, n), dtype=bool)
        for prim in spec:
            if prim == 'center':
                lh[h] = centre[None, :]
            elif prim == 'zero':
                lh[h] = 0.0
            elif prim.startswith('diag_'):
                _, a, b = prim.split('_')
                blocked |= ~(visible['tri_' + a] | visible['tri_' + b])
            else:
                blocked |= ~visible[prim]
            if config.fill_with == 'inf':
                lh[h][blocked] = np.inf
            elif config.fill_with == 'zero':
                lh[h][blocked] = 0.0
            else:
                lh[h][blocked] = lh[h].max()
    lh *= head_slopes.numpy()[:, None, None]
    t1 = time.perf_counter()
    shared_rss = peak_rss()

    bf16_max = float(torch.finfo(torch.bfloat16).max)
    out = torch.empty(depth, num_heads, n, n, dtype=torch.bfloat16)
    for layer, slope in enumerate(layer_slopes(config, depth)):
        scaled = np.nan_to_num(config.global_slope * slope * lh, posinf=bf16_max)
        out[layer] = torch.from_numpy(scaled).to(torch.bfloat16) * -1.0
        del scaled
    if marks is not None:
        marks.update(
            shared_s=t1 - t0,
            layers_s=time.perf_counter() - t1,
            shared_rss=shared_rss,
            layers_rss=peak_rss(),
        )
    return out


def baseline_matches(preset: str = 'lh45', grid: Tuple[int, int] = (5, 7)) -> bool:
    """Whether the baseline gives our dense bias (bf16 max <-> -inf) on a small grid, for
    ``preset`` and for ``lh90`` and ``lh180`` (3 layers, 12 heads)."""
    ok = True
    for p in (preset, 'lh90', 'lh180'):
        cfg = resolve_lh_config(p)
        ours = lookhere_bias(cfg, grid, 3, 12, dtype=torch.float32)
        theirs = official_style_bias(cfg, grid, 3, 12).float()
        theirs[theirs == -torch.finfo(torch.bfloat16).max] = -math.inf
        ok &= bool(torch.equal(ours, theirs))
    return ok
