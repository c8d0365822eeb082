#!/usr/bin/env python
"""Segment one image or a folder of images and write colour-overlay PNGs, at any resolution.

By default images go through the config's test resize and the config's inference mode;
``--native`` keeps each image's own size, ``--short-side`` / ``--size`` pick another one,
and ``--whole`` / ``--slide`` choose one pass over the whole image or sliding windows of
the training crop. Overlays are written as ``<out-dir>/<image name>.png`` with a legend of
the classes present (``--no-legend``: without), and the class ids as
``<image name>_labels.png`` with ``--save-labels``, numbered as the dataset's annotation
files and ``tools/test.py --out``: for a ``reduce_zero_label`` dataset (ADE20K layout)
class ``k`` of the model is written as ``k + 1`` (0 is the files' "no class" value and is
never written), otherwise as ``k`` (Cityscapes layout). The checkpoint must fit the config's
model; a file that is not an image, an image that cannot be decoded (a float32 TIFF: named
with its type) and an output that cannot be written stop the run with a message naming the
file, the first two before any image is predicted, as do two outputs with one file name
(``--save-labels`` on a folder holding ``a.jpg`` and an earlier run's ``a_labels.png``) and
a ``--size`` / ``--short-side`` below one patch of the backbone. Segmentation (mmseg)
configs only: a detection config stops the run with one line naming it and pointing to
mmdet's ``DetInferencer`` or ``tools/test.py CONFIG CKPT --show-dir DIR``.

Examples::

    python tools/infer.py configs/segmenter_lookhere_ade20k.py CKPT photo.jpg --whole --native
    python tools/infer.py configs/segmenter_lookhere_cityscapes.py CKPT frames/ \\
        --size 2048x4096 --whole --out-dir vis
    # in bfloat16 autocast (CPU or CUDA; the overlays are the same files)
    python tools/infer.py configs/segmenter_lookhere_ade20k.py CKPT photo.jpg --whole --amp
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _hw(text: str) -> Tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected HxW such as 1024x2048, got {text!r}') from None
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f'sizes must be positive, got {text!r}')
    return h, w


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    from lookhere_dense.apis.cli import (
        ToolArgumentParser,
        add_amp_args,
        add_cfg_options_arg,
        add_threads_arg,
        positive_int,
    )

    parser = ToolArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        'config', help='the segmentation (mmseg) config the checkpoint was trained with'
    )
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('input', help='an image file or a folder of images')
    parser.add_argument(
        '--out-dir',
        default='work_dirs/infer',
        help='folder for the overlay PNGs (default: %(default)s)',
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        '--whole', action='store_true', help='predict the whole image in one pass (any size)'
    )
    mode.add_argument(
        '--slide', action='store_true', help='predict in sliding windows of --crop with --stride'
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument(
        '--native', action='store_true', help="keep each image's own size (no resize)"
    )
    size.add_argument(
        '--short-side',
        type=positive_int,
        metavar='S',
        help='resize so the short side is S px (aspect kept; at least one patch of the backbone)',
    )
    size.add_argument(
        '--size',
        type=_hw,
        metavar='HxW',
        help='resize to exactly HxW (each side at least one patch of the backbone)',
    )
    parser.add_argument(
        '--crop',
        type=_hw,
        metavar='HxW',
        help="slide window (default: the config's slide crop, else its training crop)",
    )
    parser.add_argument(
        '--stride',
        type=_hw,
        metavar='HxW',
        help="slide stride (default: the config's, else 2/3 of the crop)",
    )
    parser.add_argument(
        '--opacity',
        type=float,
        default=0.5,
        help='overlay opacity of the class colours, 0..1 (default: 0.5)',
    )
    parser.add_argument(
        '--no-legend', action='store_true', help='do not draw the legend of the classes present'
    )
    parser.add_argument(
        '--save-labels',
        action='store_true',
        help='also write the predicted class ids as <name>_labels.png, numbered as the '
        "dataset's annotation files and tools/test.py --out: with the config's test "
        'dataset reduce_zero_label (ADE20K) model class k is written as k+1 and 0 (the '
        "files' ignore value) never appears; otherwise class k is k (Cityscapes)",
    )
    parser.add_argument(
        '--device', default=None, help='cpu or cuda[:N] (default: cuda when available, else cpu)'
    )
    parser.add_argument(
        '--max-memory',
        metavar='SIZE',
        help='memory budget of one pass (e.g. 8G): a frame whose estimated peak (whole, or '
        'sliding windows with the frame-sized logits) exceeds it is refused before it '
        'allocates, with cheaper options (--slide, a smaller frame, bfloat16; default: the '
        'memory the machine or its cgroup has left; off: no limit)',
    )
    add_cfg_options_arg(parser, 'model.test_cfg.mode=whole')
    add_amp_args(parser, 'the model predicts')
    add_threads_arg(parser)
    args = parser.parse_args(argv)
    if not 0.0 <= args.opacity <= 1.0:
        parser.error(f'--opacity must be in 0..1, got {args.opacity}')
    if args.short_side is not None and args.short_side < 1:
        parser.error(f'--short-side must be >= 1, got {args.short_side}')
    return args


def main(argv: Optional[List[str]] = None) -> List[str]:
    """Write the overlays (:func:`lookhere_dense.apis.inference.segment_images`); returns
    their paths."""
    args = parse_args(argv)
    from lookhere_dense.apis.cli import amp_context, check_device, start_tool

    start_tool(args.config, args.threads)  # a missing config fails before the heavy imports
    check_device(args.device)
    from lookhere_dense.apis.inference import IMAGE_SUFFIXES, segment_images, skipped_files

    with amp_context(args, args.device):
        result = segment_images(
            args.config,
            args.checkpoint,
            args.input,
            out_dir=args.out_dir,
            whole=args.whole,
            slide=args.slide,
            native=args.native,
            short_side=args.short_side,
            size=args.size,
            crop=args.crop,
            stride=args.stride,
            opacity=args.opacity,
            save_labels=args.save_labels,
            device=args.device,
            cfg_options=args.cfg_options,
            legend=not args.no_legend,
            max_memory=args.max_memory,
        )
    resized = ''
    if result.sizes and result.sizes[0] != result.sizes[1]:
        (h, w), (sh, sw) = result.sizes
        how = (
            f'--short-side {args.short_side}'
            if args.short_side
            else '--size'
            if args.size
            else "the config's test Resize; --native keeps each image's size"
        )
        resized = f'; the model saw the first, {h}x{w} image at {sh}x{sw} px: {how}'
    skipped = skipped_files(args.input)
    if skipped:
        resized += (
            f'; {len(skipped)} other file(s) in the folder skipped (not '
            f'{"/".join(s.lstrip(".") for s in IMAGE_SUFFIXES)}: {", ".join(skipped[:3])}'
            + (', ...' if len(skipped) > 3 else '')
            + ')'
        )
    if result.gray:
        resized += (
            f'; {len(result.gray)} grayscale image(s) read as 3 equal channels (e.g. '
            f'{result.gray[0]}): a model trained on colour images sees them as gray'
        )
    print(
        f'wrote {len(result.paths)} overlay(s) to {args.out_dir} '
        f'({result.mode} inference on {result.device}'
        + (f', {args.amp_dtype or "bfloat16"} autocast' if args.amp else '')
        + f'){resized}'
    )
    if args.save_labels:
        print(
            '*_labels.png: model class k written as k+1 (reduce_zero_label: the '
            "dataset's annotation ids, 0 = ignore, as tools/test.py --out)"
            if result.label_offset
            else '*_labels.png: model class k written as k (as tools/test.py --out)'
        )
    return result.paths


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
