"""Pictures of each head's field of view: the LookHere bias from one query patch to every
key (``tools/plot_heads.py``; torch, matplotlib for the PNG).

One row per chosen layer, one panel per head. A panel shows the additive bias the head puts
on the attention logits from the query patch (red cross) to each key patch: 0 at the query,
more negative farther away (the per-head/per-layer distance penalty), and dark grey where the
head's direction mask blocks the key. The values come from the bias code that the attention
itself uses (:func:`lookhere_dense.lookhere.bias.build_grid_bias`).

For a model trained with learnable slopes (``lh_config.learnable_slopes=True``),
:func:`draw_learned_slopes` reads the checkpoint and draws the learned effective slope of
every layer and head next to the configured (preset) one and their ratio
(``tools/plot_heads.py --checkpoint CKPT``).
"""

from __future__ import annotations

import json
import os
import os.path as osp
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from lookhere_dense import compat
from lookhere_dense.checkpoint import load_checkpoint_file
from lookhere_dense.lookhere.bias import build_grid_bias
from lookhere_dense.lookhere.config import (
    LookHereConfig,
    head_layout,
    layer_slopes,
    resolve_lh_config,
)
from lookhere_dense.lookhere.slopes import (
    configured_slopes,
    format_slope_table,
    slopes_from_state_dict,
)
from lookhere_dense.lookhere.weights import backbone_weights, file_num_heads

__all__ = [
    'head_fields',
    'head_titles',
    'plot_fields',
    'load_lh_config',
    'draw_head_fields',
    'checkpoint_slopes',
    'plot_slopes',
    'draw_learned_slopes',
]


def head_fields(
    config: LookHereConfig,
    grid_size: Tuple[int, int],
    query: Tuple[int, int],
    depth: int,
    num_heads: int,
    layers: Sequence[int],
) -> Tensor:
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
    return torch.stack(
        [gb.rows(l, q, q + 1)[:, 0].reshape(num_heads, height, width) for l in layers]
    )


def head_titles(config: LookHereConfig, depth: int, num_heads: int, layer: int) -> List[str]:
    """``'up\\nslope 0.75'``-style labels: each head's primitives and its total slope."""
    specs, slopes, _ = head_layout(config.layer_direction(layer), num_heads)
    scale = config.global_slope * layer_slopes(config, depth)[layer]
    return [
        f'{"+".join(s) if s else "none"}\nslope {scale * float(h):.3g}'
        for s, h in zip(specs, slopes)
    ]


def plot_fields(
    fields: Tensor,
    config: LookHereConfig,
    query: Tuple[int, int],
    depth: int,
    layers: Sequence[int],
    out: str,
    title: str = '',
) -> None:
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
    fig, axes = plt.subplots(
        n_layers, heads, figsize=(1.55 * heads, 1.9 * n_layers + 0.6), squeeze=False
    )
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
    fig.suptitle(
        title
        or f'LookHere bias from query patch {tuple(query)} '
        f'({height}x{width} grid); dark grey = blocked',
        fontsize=9,
    )
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


def draw_head_fields(
    config: LookHereConfig,
    grid_size: Tuple[int, int],
    out: str,
    query: Optional[Tuple[int, int]] = None,
    depth: int = 12,
    num_heads: int = 12,
    layers: Optional[Sequence[int]] = None,
    name: str = 'lh_config',
) -> Tensor:
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
    plot_fields(
        fields,
        config,
        query,
        depth,
        layers,
        out,
        f'{name} {config.head_directions}: bias from query patch {query} on a '
        f'{grid[0]}x{grid[1]} grid, {num_heads} heads, depth {depth}; '
        'dark grey = blocked',
    )
    return fields


def checkpoint_slopes(path: str) -> Dict[str, Any]:
    """The slopes of the LookHere backbone saved in ``path`` (a training checkpoint, a
    converted or an official file).

    Returns:
        ``{'config', 'depth', 'num_heads', 'learned', 'configured'}``: the stored
        :class:`LookHereConfig`, the sizes, and the learned and configured slopes in the
        layout of :meth:`~lookhere_dense.lookhere.slopes.LookHereSlopes.values`
        (``learned`` is None for a fixed-slope file).

    Raises:
        FileNotFoundError, CheckpointError: the file cannot be read or holds no backbone.
        ValueError: it records no LookHere config, or its learned slopes are incomplete.
    """
    compat.apply()  # a Runner checkpoint holds a few of mmengine's own classes
    weights = backbone_weights(load_checkpoint_file(path))
    if weights.lh_config is None:
        raise ValueError(
            f'{path!r} records no LookHere config (not a LookHere model, or a '
            'timm / DeiT-III file): there are no slopes to draw'
        )
    config = resolve_lh_config(weights.lh_config)
    num_heads, _ = file_num_heads(weights)
    blocks = [
        int(m.group(1))
        for k in weights.state_dict
        for m in [re.match(r'^blocks\.(\d+)\.', k)]
        if m
    ]
    if not blocks or num_heads is None:
        raise ValueError(f'{path!r}: cannot tell the depth / head count of its backbone')
    depth = max(blocks) + 1
    learned = slopes_from_state_dict(
        config, depth, num_heads, weights.state_dict, 'pos_enc.slopes.'
    )
    return dict(
        config=config,
        depth=depth,
        num_heads=num_heads,
        learned=learned,
        configured=configured_slopes(config, depth, num_heads),
    )


def plot_slopes(
    learned: Dict[str, Any], configured: Dict[str, Any], out: str, title: str = ''
) -> None:
    """Three panels, layers x heads: the configured effective slope of every head
    (``global x layer x head``), the learned one (same log colour scale), and their ratio
    (log2 scale, 0 = unchanged), with the global and layer slopes in the titles. PNG."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    import numpy as np

    conf = configured['effective'].double().numpy()
    lrn = learned['effective'].double().numpy()
    depth, heads = conf.shape
    both = np.log10(np.concatenate([conf.ravel(), lrn.ravel()]))
    vmin, vmax = float(both.min()), float(both.max())
    ratio = np.log2(lrn / conf)
    lim = max(float(np.abs(ratio).max()), 1e-3)
    fig, axes = plt.subplots(
        1,
        3,
        figsize=(3 * max(3.2, 0.42 * heads + 1.2), max(2.6, 0.36 * depth + 1.6)),
        squeeze=False,
    )
    panels = [
        (conf, 'configured', 'viridis', (vmin, vmax), True),
        (lrn, 'learned', 'viridis', (vmin, vmax), True),
        (lrn / conf, 'learned / configured', 'coolwarm', (-lim, lim), False),
    ]
    for ax, (data, name, cmap, (lo, hi), logscale) in zip(axes[0], panels):
        shown = np.log10(data) if logscale else np.log2(data)
        image = ax.imshow(
            shown, cmap=cmap, vmin=lo, vmax=hi, aspect='auto', interpolation='nearest'
        )
        key = 'global' if name != 'learned / configured' else None
        sub = (
            ''
            if key is None
            else (f'\nglobal {float((learned if name == "learned" else configured)[key]):.3g}')
        )
        ax.set_title(f'{name}{sub}', fontsize=8)
        ax.set_xlabel('head', fontsize=8)
        ax.set_ylabel('layer', fontsize=8)
        ax.set_xticks(range(heads))
        ax.set_yticks(range(depth))
        ax.tick_params(labelsize=6)
        if not logscale and heads * depth <= 256:
            for l in range(depth):
                for h in range(heads):
                    ax.text(h, l, f'{data[l, h]:.2f}', ha='center', va='center', fontsize=5)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04).set_label(
            'log10 slope' if logscale else 'log2 ratio', fontsize=7
        )
    layers = ', '.join(
        f'{float(a):.3g}/{float(b):.3g}' for a, b in zip(learned['layer'], configured['layer'])
    )
    fig.suptitle(
        (title + '\n' if title else '') + f'layer slopes learned/configured: {layers}', fontsize=8
    )
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw_learned_slopes(path: str, out: str) -> Dict[str, Any]:
    """Read the slopes of the checkpoint ``path`` (:func:`checkpoint_slopes`) and draw the
    learned ones next to the configured ones (:func:`plot_slopes`) into ``out``. A
    fixed-slope file is drawn with its configured slopes in both panels (ratio 1).

    Returns:
        :func:`checkpoint_slopes`'s dict plus ``'table'`` (the text of
        :func:`~lookhere_dense.lookhere.slopes.format_slope_table`).
    """
    info = checkpoint_slopes(path)
    learned = info['learned'] if info['learned'] is not None else info['configured']
    kind = 'learned' if info['learned'] is not None else 'fixed (not learnable)'
    plot_slopes(
        learned,
        info['configured'],
        out,
        f'{osp.basename(path)}: {kind} LookHere slopes, '
        f'{info["config"].head_directions}, {info["depth"]} layers x '
        f'{info["num_heads"]} heads',
    )
    info['table'] = format_slope_table(learned, info['configured'])
    return info
