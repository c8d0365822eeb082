#!/usr/bin/env python
"""Export a segmentor (whole mode) or its backbone for deployment: ONNX or ``.pt2``.

The file serves one input size: a normalised ``(1, 3, H, W)`` tensor in, the segmentation
logits at ``H x W`` out, what mmseg's whole-mode inference gives (any ``--shape``: the graph
pads the input at the bottom and right to the data preprocessor's ``size_divisor`` with its
``pad_val``, as mmseg does, and crops the logits back; ``--part backbone``: the backbone's
maps of the input as given). It holds the weights plus the small per-layer LookHere tables;
the bias is computed in the graph, never stored as an ``N x N`` constant. ONNX weights go
to ``OUT.data`` beside ``OUT`` (keep the two together). Unless ``--no-check``, the file is
run (onnxruntime / ``torch.export.load``) and compared with the torch model: the segmentor
with mmseg's own inference of a random image (data preprocessor, padding, ``predict`` in
whole mode), the backbone on a random tensor. The check fails -- a ``WARNING`` line, then
exit status 1 after the file (and ``--json``) are written -- where the max |diff| exceeds
``--max-diff`` (1e-3) or an output is NaN / infinite or of another shape. The ONNX file's
input is named ``images``, its output ``logits`` (``--part backbone``: ``block{i}`` per
out index, ``cls{i}`` for its CLS token).

Examples::

    python tools/export.py configs/segmenter_lookhere_cityscapes_whole.py CKPT \\
        --shape 1024 2048 --out work_dirs/export/segmenter_cityscapes.onnx
    python tools/export.py configs/upernet_lookhere-b16_sfpn_8xb2-160k_ade20k-512x512.py \\
        CKPT --shape 512 512 --out upernet.pt2 --format pt2
    python tools/export.py configs/segmenter_lookhere_ade20k.py --random-weights \\
        --shape 512 512 --out vitb.onnx --part backbone
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None) -> argparse.Namespace:
    from lookhere_dense.apis.cli import (
        ToolArgumentParser,
        add_cfg_options_arg,
        positive_float,
        positive_int,
    )
    from lookhere_dense.apis.export import CHECK_WARN_ABS_DIFF, EXPORT_FORMATS, EXPORT_PARTS

    p = ToolArgumentParser(
        description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument('config', help='the mmseg config (mmseg:: paths allowed)')
    p.add_argument(
        'checkpoint', nargs='?', default=None, help='the checkpoint to export (loaded strictly)'
    )
    p.add_argument(
        '--random-weights',
        action='store_true',
        help='no checkpoint: export the randomly initialised model (to measure '
        'the cost of deployment)',
    )
    p.add_argument(
        '--shape',
        nargs=2,
        type=positive_int,
        required=True,
        metavar=('H', 'W'),
        help='input size in pixels (any: the graph pads it as mmseg whole mode does)',
    )
    p.add_argument('--out', required=True, help='output file (.onnx or .pt2)')
    p.add_argument(
        '--format',
        choices=EXPORT_FORMATS,
        default=None,
        help='file format (default: from the --out suffix, else onnx)',
    )
    p.add_argument(
        '--part',
        choices=EXPORT_PARTS,
        default='segmentor',
        help='segmentor (logits, whole mode; default) or backbone (its maps)',
    )
    p.add_argument(
        '--no-check',
        action='store_true',
        help="do not run the exported file against the torch model (mmseg's inference)",
    )
    p.add_argument(
        '--max-diff',
        type=positive_float,
        default=CHECK_WARN_ABS_DIFF,
        metavar='D',
        help='the check fails (exit status 1, after writing the file) above this max |diff| '
        f'of the outputs, or on NaN / infinite outputs (default: {CHECK_WARN_ABS_DIFF:g})',
    )
    p.add_argument('--threads', type=positive_int, default=None, help='torch threads')
    p.add_argument('--json', default=None, help='write the report (sizes, times, diff) here')
    add_cfg_options_arg(p, 'model.backbone.attn_backend=chunked')
    args = p.parse_args(argv)
    if (args.checkpoint is None) == (not args.random_weights):
        p.error('give CHECKPOINT or --random-weights (one of the two)')
    if args.format is None:
        args.format = 'pt2' if args.out.lower().endswith('.pt2') else 'onnx'
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    import os.path as osp

    from lookhere_dense.apis.cli import quiet_known_warnings
    from lookhere_dense.apis.export import export_model
    from lookhere_dense.checkpoint.atomic import check_output_folder
    from lookhere_dense.errors import ConfigError, ToolError

    if args.json:  # before the export, not in a traceback after it
        if osp.isdir(args.json) or args.json.endswith(('/', osp.sep)):
            raise ConfigError(f'--json {args.json!r} is a folder: give the file to write')
        for what, path in (('the checkpoint', args.checkpoint), ('the config', args.config)):
            if path and osp.isfile(path) and osp.realpath(path) == osp.realpath(args.json):
                raise ConfigError(f'--json {args.json!r} is {what}: write the report elsewhere')
        if osp.realpath(args.json) in {osp.realpath(args.out), osp.realpath(args.out + '.data')}:
            raise ConfigError(f'--json {args.json!r} is the exported file: write it elsewhere')
        check_output_folder(osp.dirname(osp.abspath(args.json)), '--json')
    quiet_known_warnings()
    report = export_model(
        args.config,
        args.checkpoint,
        args.shape,
        args.out,
        args.format,
        args.part,
        args.cfg_options,
        not args.no_check,
        args.threads,
        max_diff=args.max_diff,
    )
    if args.json:
        from research.reporting import write_json

        write_json(args.json, report)
        print(f'wrote {args.json}')
    if report.get('check_passed') is False:
        err = ToolError(
            f'the check failed: {"; ".join(report["check_problems"])}. The file is kept '
            f'({args.out}) for inspection; --max-diff sets the limit, --no-check skips the check'
        )
        err.exit_status = 1  # a failed check, not a usage error (2)
        raise err


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
