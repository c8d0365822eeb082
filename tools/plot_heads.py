#!/usr/bin/env python
"""Picture every head's field of view: the LookHere bias from one query patch to every key.

One row per chosen layer, one panel per head. A panel shows the additive bias the head puts
on the attention logits from the query patch (red cross) to each key patch: 0 at the query,
more negative farther away (the per-head/per-layer distance penalty), and dark grey where the
head's direction mask blocks the key. The values come from the bias code that the attention
itself uses (:func:`lookhere_dense.lookhere.bias.build_grid_bias`).

Example::

    python tools/plot_heads.py --preset lh180 --grid 14 14 --query 6 4 --layers 0 11 \\
        --out docs/heads_lh180.png

With ``--checkpoint CKPT`` (a model trained with ``lh_config.learnable_slopes=True``) it
draws the learned slope of every layer and head next to the configured one instead.
"""

from __future__ import annotations

import argparse
import os.path as osp
import sys
from typing import Optional, Sequence

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    from lookhere_dense.apis.cli import ToolArgumentParser

    p = ToolArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        '--preset',
        default='lh180',
        help='LookHere preset: lh180, lh90 or lh45 (ignored with --lh-config)',
    )
    p.add_argument(
        '--lh-config',
        default=None,
        help='LookHere config as JSON text or a JSON file with the official keys '
        '(head_directions, global_slope, layer_slopes, ...)',
    )
    p.add_argument(
        '--grid', nargs=2, type=int, default=[14, 14], metavar=('H', 'W'), help='patch grid size'
    )
    p.add_argument(
        '--query',
        nargs=2,
        type=int,
        default=None,
        metavar=('Y', 'X'),
        help='query patch (row, column); default: the grid centre',
    )
    p.add_argument('--depth', type=int, default=12, help='number of layers of the model')
    p.add_argument('--num-heads', type=int, default=12, help='heads per layer')
    p.add_argument(
        '--layers',
        nargs='+',
        type=int,
        default=None,
        help='layers to draw (default: the first and the last)',
    )
    p.add_argument('--out', default='heads.png', help='output PNG')
    p.add_argument(
        '--checkpoint',
        default=None,
        help='draw the learned slopes of this checkpoint (learnable_slopes=True) '
        'next to the configured ones, instead of the fields of view',
    )
    args = p.parse_args(argv)
    from lookhere_dense.lookhere.config import PRESETS  # torch: after --help

    if args.preset not in PRESETS:
        p.error(
            f'argument --preset: invalid choice: {args.preset!r} (choose from '
            f'{", ".join(sorted(PRESETS))})'
        )
    return args


def main(argv: Optional[Sequence[str]] = None):
    """Draw the picture (:func:`research.head_plots.draw_head_fields`);
    returns the plotted fields (a tensor; with ``--checkpoint``: the slopes drawn,
    :func:`~research.head_plots.draw_learned_slopes`)."""
    args = parse_args(argv)
    from lookhere_dense.checkpoint.atomic import check_output_folder
    from lookhere_dense.errors import ToolError
    from research.head_plots import (
        draw_head_fields,
        draw_learned_slopes,
        load_lh_config,
    )

    check_output_folder(osp.dirname(osp.abspath(args.out)), '--out')
    if args.checkpoint:
        try:
            info = draw_learned_slopes(args.checkpoint, args.out)
        except (ValueError, OSError) as err:  # unreadable file, no LookHere backbone: named
            raise ToolError(f'--checkpoint: {err}') from None
        print(f'{info["table"]}\nwrote {args.out}')
        return info['learned'] if info['learned'] is not None else info['configured']
    try:
        config = load_lh_config(args.lh_config, args.preset)
    except ValueError as err:  # also JSON syntax errors
        raise ToolError(f'--lh-config: {err}') from None
    try:
        fields = draw_head_fields(
            config,
            (args.grid[0], args.grid[1]),
            args.out,
            query=args.query,
            depth=args.depth,
            num_heads=args.num_heads,
            layers=args.layers,
            name='lh_config' if args.lh_config else args.preset,
        )
    except ValueError as err:  # grid, query, layers, heads that do not fit: named
        raise ToolError(str(err)) from None
    print(f'wrote {args.out}')
    return fields


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
