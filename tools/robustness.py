#!/usr/bin/env python
"""Attack one segmentation checkpoint with FGSM / PGD and report its mIoU per strength.

Each attack maximises the decode head's loss against the ground-truth labels within an
L-inf ball of EPS in 0-255 pixel units (``--eps 4`` is 4/255), clipped to valid pixels; the
perturbed images are predicted whole with the config's data preprocessor and scored with
its evaluator (mmseg's ``IoUMetric``). The clean model is evaluated too, and every attack is
summarised by its mean over the strengths (as the LookHere rebuttal averages). Outputs: a
table on stdout, ``{name}.json``, ``{name}.md`` and ``{name}.png`` (mIoU vs strength).
Details: :mod:`research.robustness.segmentor`.

Examples::

    # FGSM and 10-step PGD at 1, 2, 4, 8 /255 on the first 200 validation images
    python tools/robustness.py configs/segmenter_lookhere_ade20k.py CKPT \\
        --attack fgsm pgd --eps 1 2 4 8 --steps 10 --max-images 200
    # a quick CPU look: FGSM only, 20 images
    python tools/robustness.py CONFIG CKPT --attack fgsm --eps 2 8 --max-images 20 --threads 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a number, got {text!r}') from None
    if not 0 < value <= 255:
        raise argparse.ArgumentTypeError(
            f'expected a number in (0, 255] (pixel units), got {text!r}'
        )
    return value


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    from lookhere_dense.apis.cli import checkpoint_report_parser, positive_int

    parser = checkpoint_report_parser(
        __doc__,
        split='val',
        images='attack',
        outputs='the JSON / MD / PNG',
        name='robustness',
        cfg_example='val_dataloader.dataset.data_root=...',
    )
    parser.add_argument(
        '--attack',
        nargs='+',
        choices=['fgsm', 'pgd'],
        default=['fgsm', 'pgd'],
        help='attacks to run, in order (default: fgsm pgd)',
    )
    parser.add_argument(
        '--eps',
        nargs='+',
        type=_positive_float,
        default=[1.0, 2.0, 4.0, 8.0],
        metavar='EPS',
        help='strengths: L-inf radius in 0-255 pixel units, 4 = '
        '4/255 (default: 1 2 4 8; the clean model is always evaluated)',
    )
    parser.add_argument(
        '--steps',
        type=positive_int,
        default=10,
        help='PGD steps (default: 10); each PGD strength costs STEPS forward + backward '
        'passes per image',
    )
    parser.add_argument(
        '--step-size',
        type=_positive_float,
        default=None,
        help='PGD step in pixel units (default: 2.5 * eps / steps)',
    )
    parser.add_argument(
        '--no-random-start',
        action='store_true',
        help='start PGD at the image instead of a random point of the ball',
    )
    parser.add_argument('--seed', type=int, default=0, help="seed of PGD's random start")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run the report (:func:`research.robustness.robustness_report`);
    returns the JSON content."""
    args = parse_args(argv)
    from lookhere_dense.apis.cli import checkpoint_report_kwargs, start_checkpoint_report

    precision = start_checkpoint_report(args)
    from research.robustness import AttackSettings, robustness_report

    settings = AttackSettings(
        attacks=tuple(dict.fromkeys(args.attack)),
        eps=tuple(args.eps),
        steps=args.steps,
        step_size=args.step_size,
        random_start=not args.no_random_start,
        seed=args.seed,
        max_images=args.max_images,
    )
    with precision:
        return robustness_report(
            args.config,
            args.checkpoint,
            settings,
            **checkpoint_report_kwargs(args, 'robustness.py', argv),
        )


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
