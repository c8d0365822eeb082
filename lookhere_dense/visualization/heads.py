"""Pictures of each head's field of view: the LookHere bias from one query patch to every
key (``tools/plot_heads.py``; torch, matplotlib for the PNG).

One row per chosen layer, one panel per head. A panel shows the additive bias the head puts
on the attention logits from the query patch (red cross) to each key patch: 0 at the query,
more negative farther away (the per-head/per-layer distance penalty), and dark grey where the
head's direction mask blocks the key. The values come from the bias code that the attention
itself uses (:func:`lookhere_dense.lookhere.bias.build_grid_bias`).
"""
from __future__ import annotations

import json
import os
import os.path as osp
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..lookhere.bias import (LookHereConfig, build_grid_bias, head_layout, layer_slopes,
                             resolve_lh_config)

__all__ = ['head_fields', 'head_titles', 'plot_fields', 'load_lh_config', 'draw_head_fields']


def head_fields(config: LookHereConfig, grid_size: Tuple[int, int], query: Tuple[int, int],
                depth: int, num_heads: int, layers: Sequence[int]) -> Tensor:
    """The bias from patch ``query = (y, x)`` to every key, per chosen layer and head.

    Returns:
        float32 ``(len(layers), heads, H, W)``; ``-inf`` where a head's mask blocks the key.

    Raises:
        ValueError: query outside the grid, layer outside ``range(depth)``.
    """
    height, width = grid_size
    qy, qx = query
    if not (0 <= qy < height and 0 <= qx < width):
        raise ValueError(f'query patch {tuple(query)} is outside the {height}x{width} grid')
    bad = [l for l in layers if not 0 <= l < depth]
    if bad:
        raise ValueError(f'layers {bad} out of range for depth={depth}')
    gb = build_grid_bias(config, (height, width), depth, num_heads, dtype=torch.float32)
    q = qy * width + qx
    return torch.stack([gb.rows(l, q, q + 1)[:, 0].reshape(num_heads, height, width)
                        for l in layers])


def head_titles(config: LookHereConfig, depth: int, num_heads: int, layer: int) -> List[str]:
    """``'up\\nslope 0.75'``-style labels: each head's primitives and its total slope."""
    specs, slopes, _ = head_layout(config.layer_direction(layer), num_heads)
    scale = config.global_slope * layer_slopes(config, depth)[layer]
    return [f'{"+".join(s) if s else "none"}\nslope {scale * float(h):.3g}'
            for s, h in zip(specs, slopes)]


def plot_fields(fields: Tensor, config: LookHereConfig, query: Tuple[int, int], depth: int,
                layers: Sequence[int], out: str, title: str = '') -> None:
    """Write the panel grid of :func:`head_fields` to ``out`` (PNG)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np

    n_layers, heads, height, width = fields.shape
    finite = fields[torch.isfinite(fields)]
    vmin = float(finite.min()) if finite.numel() else -1.0
    cmap = matplotlib.colormaps['viridis'].copy()
    cmap.set_bad('#3a3a3a')
    fig, axes = plt.subplots(n_layers, heads, figsize=(1.55 * heads, 1.9 * n_layers + 0.6),
                             squeeze=False)
    image = None
    for r, layer in enumerate(layers):
        titles = head_titles(config, depth, heads, layer)
        for h in range(heads):
            ax = axes[r, h]
            data = np.ma.masked_invalid(fields[r, h].numpy())
            image = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=0.0, interpolation='nearest')
            ax.plot(query[1], query[0], 'x', color='red', ms=6, mew=2)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f'h{h}: {titles[h]}', fontsize=6.5)
            if h == 0:
                ax.set_ylabel(f'layer {layer}', fontsize=8)
    fig.suptitle(title or f'LookHere bias from query patch {tuple(query)} '
                 f'({height}x{width} grid); dark grey = blocked', fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.94, 0.97))
    cax = fig.add_axes((0.95, 0.15, 0.012, 0.7))
    fig.colorbar(image, cax=cax, label='bias added to the logit')
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def load_lh_config(lh_config: Optional[str] = None, preset: str = 'lh180') -> LookHereConfig:
    """The LookHere config from JSON text or a JSON file (the official keys:
    ``head_directions``, ``global_slope``, ``layer_slopes``, ...), else from ``preset``."""
    if lh_config:
        text = lh_config
        if osp.isfile(text):
            with open(text) as f:
                text = f.read()
        return resolve_lh_config(json.loads(text))
    return resolve_lh_config(preset=preset)


def draw_head_fields(config: LookHereConfig, grid_size: Tuple[int, int], out: str,
                     query: Optional[Tuple[int, int]] = None, depth: int = 12,
                     num_heads: int = 12, layers: Optional[Sequence[int]] = None,
                     name: str = 'lh_config') -> Tensor:
    """Compute the fields (:func:`head_fields`) and write their picture to ``out``.

    Args:
        config: the LookHere config (:func:`load_lh_config`).
        grid_size: patch grid ``(H, W)``.
        out: the PNG.
        query: query patch ``(row, column)``. Default: None (the grid centre).
        depth: layers of the model. Default: 12.
        num_heads: heads per layer. Default: 12.
        layers: layers to draw. Default: None (the first and the last).
        name: how the title names the config (e.g. the preset). Default: ``'lh_config'``.

    Returns:
        The plotted fields, ``(len(layers), heads, H, W)``.

    Raises:
        ValueError: query outside the grid, layer outside ``range(depth)``.
    """
    grid = (int(grid_size[0]), int(grid_size[1]))
    query = tuple(query) if query else (grid[0] // 2, grid[1] // 2)
    layers = list(layers) if layers is not None else sorted({0, depth - 1})
    fields = head_fields(config, grid, query, depth, num_heads, layers)
    plot_fields(fields, config, query, depth, layers, out,
                f'{name} {config.head_directions}: bias from query patch {query} on a '
                f'{grid[0]}x{grid[1]} grid, {num_heads} heads, depth {depth}; '
                'dark grey = blocked')
    return fields
