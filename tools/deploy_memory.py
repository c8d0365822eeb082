#!/usr/bin/env python
"""Memory over time of an exported segmentor in onnxruntime against the same model in torch.

Each run is a fresh process on one normalised input (random weights, seed 0: the model the
``deploy`` benchmark section exports): torch (the model as ``tools/test.py`` runs it), then
the exported file (which must be an export of CONFIG at ``--shape``: the outputs are not
compared here) in onnxruntime sessions with different memory settings
(``SESSION_VARIANTS`` of ``research.benchmark.deploy``: onnxruntime's
defaults, the settings before buffer reuse was turned off, ``onnxruntime_session``). The
RSS is sampled from before the model / session is built to the end of the runs; the PNG
draws one line per run, the JSON holds the samples and each run's peak and seconds.
Without ``--onnx`` the config is exported first (minutes at 1024x2048).

Examples::

    python tools/deploy_memory.py --onnx work_dirs/deploy/segmenter_lookhere_cityscapes_whole_1024x2048.onnx \\
        --png docs/deploy_memory.png --json docs/deploy_memory.json
    python tools/deploy_memory.py configs/segmenter_lookhere_vit-t_tiny-cityscapes.py \\
        --shape 64 128 --png mem.png
"""

from __future__ import annotations

import argparse
import os.path as osp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_CONFIG = 'configs/segmenter_lookhere_cityscapes_whole.py'


def parse_args(argv=None) -> argparse.Namespace:
    from lookhere_dense.apis.cli import ToolArgumentParser, positive_int

    p = ToolArgumentParser(
        description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        'config', nargs='?', default=DEFAULT_CONFIG, help=f'the config (default: {DEFAULT_CONFIG})'
    )
    p.add_argument(
        '--onnx',
        default=None,
        help='an export of CONFIG at --shape with random weights (the deploy section writes '
        'one); default: export it to work_dirs/deploy first',
    )
    p.add_argument(
        '--shape',
        nargs=2,
        type=positive_int,
        default=(1024, 2048),
        metavar=('H', 'W'),
        help='input size (default: 1024 2048)',
    )
    p.add_argument('--threads', type=positive_int, default=1, help='threads (default: 1)')
    p.add_argument('--repeats', type=positive_int, default=1, help='runs per process (default: 1)')
    p.add_argument(
        '--interval', type=float, default=0.05, help='seconds between samples (default: 0.05)'
    )
    p.add_argument('--png', default=None, help='write the picture here')
    p.add_argument('--json', default=None, help='write the samples and peaks here')
    args = p.parse_args(argv)
    from research.benchmark.deploy import MAX_TRACE_INTERVAL

    if not 0 < args.interval <= MAX_TRACE_INTERVAL:
        p.error(f'--interval must be in (0, {MAX_TRACE_INTERVAL:g}] seconds, got {args.interval}')
    if args.png is None and args.json is None:
        p.error('give --png and/or --json: otherwise nothing would be written')
    if args.onnx is not None and not osp.isfile(args.onnx):
        p.error(f'--onnx: no such file: {args.onnx}')
    if args.config == DEFAULT_CONFIG and not osp.isfile(args.config):  # run from elsewhere
        args.config = str(Path(__file__).resolve().parents[1] / DEFAULT_CONFIG)
    if '::' not in args.config and not osp.isfile(args.config):
        p.error(f'config: no such file: {args.config}')
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from research.benchmark.deploy import (
        base_case,
        export_path,
        plot_deploy_trace,
        trace_deploy,
    )
    from research.benchmark.fresh import run_child

    config = args.config
    onnx_file = args.onnx
    if onnx_file is None:
        onnx_file = export_path(config, args.shape)
        print(f'[deploy trace] exporting {config} to {onnx_file} ...', flush=True)
        case = base_case(config, args.shape, onnx_file, 1, args.threads, None)
        res = run_child(dict(case, stage='export'), 7200)
        if 'error' in res:
            raise SystemExit(f'the export failed: {res["error"]}')
    result = trace_deploy(
        config,
        onnx_file,
        args.shape,
        repeats=args.repeats,
        threads=args.threads,
        interval=args.interval,
        log=lambda msg: print(msg, flush=True),
    )
    from research.benchmark.report import environment

    result = dict(command='python ' + ' '.join(sys.argv), env=environment(), **result)
    failed = [k for k, r in result['runs'].items() if 'error' in r]
    if args.json:
        from research.reporting import write_json

        write_json(args.json, result)
        print(f'wrote {args.json}')
    if args.png:
        plot_deploy_trace(result, args.png)
        print(f'wrote {args.png}')
    if failed:
        raise SystemExit(f'runs failed: {", ".join(failed)}')


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
