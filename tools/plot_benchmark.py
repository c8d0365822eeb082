#!/usr/bin/env python
"""Draw the ``peer`` results of ``tools/benchmark.py`` (one or more JSON files) as bars:
LookHere against timm's ViT-B per case, with the goals and the FLOP bounds.

Example::

    python tools/plot_benchmark.py docs/peer_fused_frame_cpu.json docs/peer_fused_train_cpu.json \\
        --png docs/peer_fused_cpu.png
"""

from __future__ import annotations

import argparse
import json
import os.path as osp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None) -> argparse.Namespace:
    from lookhere_dense.apis.cli import ToolArgumentParser

    p = ToolArgumentParser(
        description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument('json', nargs='+', help='benchmark JSON files with a peer section')
    p.add_argument('--png', required=True, help='write the picture here')
    p.add_argument('--title', default=None, help='the picture title (default: a generic one)')
    args = p.parse_args(argv)
    for path in args.json:
        if not osp.isfile(path):
            p.error(f'no such file: {path}')
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from research.benchmark.peer_plot import plot_peer

    results = []
    for path in args.json:
        with open(path) as f:
            try:
                results.append(json.load(f))
            except json.JSONDecodeError as err:
                raise SystemExit(f'{path}: not a benchmark JSON ({err})') from None
    try:
        plot_peer(results, args.png, args.title)
    except ValueError as err:
        raise SystemExit(f'{", ".join(args.json)}: {err}') from None
    print(f'wrote {args.png}')


if __name__ == '__main__':
    main()
