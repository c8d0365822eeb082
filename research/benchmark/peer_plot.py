"""The ``peer`` section as a picture: LookHere against timm's ViT-B, with the issue's goals
and the FLOP bounds (matplotlib)."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Sequence

__all__ = ['PEER_GOALS', 'plot_peer']

#: the time goals of issue 18 against timm's ViT-B (x timm), per case and preset
PEER_GOALS = {
    ('frame', 'lh180'): 0.85,
    ('frame', 'lh90'): 0.75,
    ('frame', 'lh45'): 0.72,
    ('big_frame', 'lh90'): 0.62,
    ('train', 'lh180'): 1.05,
    ('train', 'lh90'): 1.05,
    ('segmenter', 'lookhere'): 1.05,
}


def _panels(
    peers: Sequence[Dict[str, Any]], failed: Optional[List[str]] = None
) -> List[Dict[str, Any]]:
    """One panel per case group present: bars (label, ratio, goal, bound). Rows that
    failed (``error``, no ratio) are left out; ``failed`` collects them as
    ``'<group>: <model>: <error>'``, and the panel's title names them. A group with no
    row left makes no panel."""
    failed = [] if failed is None else failed
    panels = []
    layers = [p['layer'] for p in peers if p.get('layer')]
    layers += [layer for p in peers for layer in p.get('train_layer') or []]
    for layer in layers:
        bars = [
            (r['case'], r['ratio'], None, None)
            for r in layer['rows']
            if r['case'] != 'dense sdpa, no bias'
        ]
        what = 'forward + backward' if layer.get('train') else 'inference'
        panels.append(
            dict(
                title=f'one attention layer, {layer["tokens"]} tokens, {what}\n'
                '(x dense SDPA, no bias)',
                bars=bars,
                line=1.0,
            )
        )
    titles = {
        'frame': 'whole frame, inference',
        'big_frame': 'large frame, inference',
        'train': 'train step',
        'segmenter': 'Segmenter train step',
    }
    for key, title in titles.items():
        for p in peers:
            part = p.get(key)
            if not part:
                continue
            bounds = {(b['preset'], tuple(b['grid'])): b for b in p.get('bounds', [])}
            size = part['runs'] and next(iter(part['runs'].values()))[0].get('size')
            bars = []
            missing = []
            for r in part['rows']:
                if 'time_ratio' not in r:  # a failed row: no ratio to draw
                    missing.append(r['model'])
                    failed.append(f'{key}: {r["model"]}: {r.get("error", "no time_ratio")}')
                    continue
                if r['model'] == 'timm':
                    continue
                preset = r['model'].split(':')[0]
                bound = None
                if size and key in ('frame', 'big_frame'):
                    grid = (-(-size[0] // 16), -(-size[1] // 16))
                    b = bounds.get((preset, grid))
                    bound = b['bound'] if b else None
                label = r['model'] + (f' ({r["backend"]})' if r.get('backend') else '')
                bars.append((label, r['time_ratio'], PEER_GOALS.get((key, r['model'])), bound))
            where = f' {size[0]}x{size[1]}' if size else ''
            rounds = max((r.get('rounds') or 0 for r in part['rows']), default=0)
            where += f', {rounds} round{"s" * (rounds != 1)}' if rounds else ''
            if not bars:
                continue
            note = f'\nfailed, not drawn: {", ".join(missing)}' if missing else ''
            panels.append(
                dict(title=f'{title}{where}\n(time x timm ViT-B){note}', bars=bars, line=1.0)
            )
    return panels


def plot_peer(results: Sequence[Dict[str, Any]], png: str, title: Optional[str] = None) -> None:
    """Draw the ``peer`` sections of one or more benchmark JSONs (``results``: each the
    whole JSON of ``tools/benchmark.py --sections peer``) into ``png``: per case group the
    ratio of every model against its baseline (bars), the goal (black tick) and the FLOP
    bound (grey tick) where one exists. Rows that failed (``error``) are left out, named
    on stderr and in their panel's title."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    peers = [r['peer'] for r in results if r.get('peer')]
    failed: List[str] = []
    panels = _panels(peers, failed)
    for line in failed:  # named, not drawn
        print(f'failed peer row, left out of the plot: {line}', file=sys.stderr)
    if not panels:
        raise ValueError(
            'no peer results to draw (run tools/benchmark.py --sections peer)'
            + (f'; every row failed ({len(failed)})' if failed else '')
        )
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 4.3 * rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.axis('off')
    for ax, panel in zip(axes.flat, panels):
        labels = [b[0] for b in panel['bars']]
        ratios = [b[1] for b in panel['bars']]
        xs = range(len(labels))
        colors = [
            'tab:green' if 'fused' in lab else 'tab:gray' if 'nobias' in lab else 'tab:blue'
            for lab in labels
        ]
        ax.bar(xs, ratios, color=colors, width=0.7)
        for x, (_, ratio, goal, bound) in zip(xs, panel['bars']):
            ax.text(x, ratio + 0.01, f'{ratio:.2f}', ha='center', va='bottom', fontsize=7)
            if goal is not None:
                ax.hlines(goal, x - 0.4, x + 0.4, colors='black', linewidth=2)
            if bound is not None:
                ax.hlines(bound, x - 0.4, x + 0.4, colors='0.6', linestyles='dashed')
        ax.axhline(panel['line'], color='tab:red', linewidth=0.8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=60, ha='right', fontsize=7)
        ax.set_title(panel['title'], fontsize=8)
        ax.set_ylim(0, max(1.2, max(ratios) * 1.1))
    fig.suptitle(
        title
        or 'LookHere ViT-B against its baseline (red: 1.0; black: goal; grey dashed: FLOP bound)',
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
