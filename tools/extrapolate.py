#!/usr/bin/env python
"""Evaluate one segmentation checkpoint at several test resolutions: the extrapolation report.

For every test (``MODE@SIZE``) the config's test pipeline resizes the images to SIZE and
the model predicts the whole image at once (``whole``) or in windows of the config's
slide crop (``slide``); mmseg's ``IoUMetric`` scores it. The report gives mIoU, the patch
grid the backbone saw (vs the training grid), time per image and peak memory, as a table
on stdout, a JSON file and a PNG plot.

SIZE is ``x<f>`` (the config's test scale times f; below 1 tests below the training
size), ``<S>`` (short side S px, aspect kept), ``long<L>`` (long side L px, the image's
native aspect kept) or ``<H>x<W>`` (exactly H x W). Examples::

    # ADE20K: short side 512 / 768 / 1024 / 1536, whole image, plus the usual slide test
    python tools/extrapolate.py configs/segmenter_lookhere_ade20k.py CKPT \\
        --tests slide@x1 whole@512 whole@768 whole@1024 whole@1536
    # Cityscapes: slide-768 vs whole 1024x2048 vs whole 2048x4096 (upsampled)
    python tools/extrapolate.py configs/segmenter_lookhere_cityscapes.py CKPT \\
        --tests slide@1024x2048 whole@1024x2048 whole@2048x4096
    # below the training size (0.25x..0.75x of the test scale) and at native aspect
    # (long side 384 / 512 / 768 px, as ImageNet-Val tested at 384 without a square crop)
    python tools/extrapolate.py configs/segmenter_lookhere_ade20k.py CKPT \\
        --tests whole@x0.25 whole@x0.5 whole@x0.75 whole@x1 whole@long384 whole@long512 \\
        whole@long768
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    from lookhere_dense.apis.cli import checkpoint_report_parser

    parser = checkpoint_report_parser(
        __doc__,
        split='test',
        images='evaluate',
        outputs='extrapolation.json / extrapolation.png',
        name='extrapolation',
        cfg_example='test_dataloader.dataset.data_root=...',
    )
    parser.add_argument(
        '--tests',
        nargs='+',
        default=None,
        metavar='MODE@SIZE',
        help="tests to run, in order (default: the report's DEFAULT_TESTS, "
        'slide@x1 then whole@x1 to whole@x3); MODE whole or slide, SIZE '
        'x<factor of the config test scale> (x0.5: below it), <short side '
        'px>, long<long side px> (native aspect) or <H>x<W>',
    )
    parser.add_argument(
        '--max-memory',
        metavar='SIZE',
        help='memory budget of one pass (e.g. 8G): a test whose estimated peak exceeds it '
        'is refused before it allocates and reported as a refused row with cheaper '
        'options; the other tests run (all refused: an error) (default: the memory the '
        'machine or its cgroup has left; off: no limit)',
    )
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run the report (:func:`research.extrapolation.extrapolation_report`);
    returns the JSON content."""
    args = parse_args(argv)
    from lookhere_dense.apis.cli import checkpoint_report_kwargs, start_checkpoint_report

    with start_checkpoint_report(args):
        from research.extrapolation import DEFAULT_TESTS, extrapolation_report

        return extrapolation_report(
            args.config,
            args.checkpoint,
            args.tests or DEFAULT_TESTS,
            max_images=args.max_images,
            max_memory=args.max_memory,
            **checkpoint_report_kwargs(args, 'extrapolate.py', argv),
        )


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
