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
whole mode), the backbone on a random tensor; a difference above 1e-3 prints a warning.

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
    from lookhere_dense.apis.cli import ToolArgumentParser, add_cfg_options_arg, positive_int
    from lookhere_dense.apis.export import EXPORT_FORMATS, EXPORT_PARTS

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
    from lookhere_dense.apis.cli import quiet_known_warnings
    from lookhere_dense.apis.export import export_model

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
    )
    if args.json:
        from research.reporting import write_json

        write_json(args.json, report)
        print(f'wrote {args.json}')


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
