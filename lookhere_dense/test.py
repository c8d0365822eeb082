"""Test (and evaluate) a checkpoint with mmengine's Runner: mmseg or mmdet configs.

lookhere-dense registers itself. The model and test data are checked before the Runner
is built (unknown types, missing folders, label values outside the classes), and the
checkpoint must fit the model exactly (missing, unexpected or wrongly shaped keys are
named). The terminal shows progress, the per-class table and the metrics; the log file in
the work dir has everything.

The same code runs as ``python tools/test.py`` (in the repository), ``python -m
lookhere_dense.test`` and the ``lookhere-test`` console script (after ``pip install``);
``lookhere_dense::NAME.py`` names a config shipped in the package
(:func:`lookhere_dense.config_path`).

Examples::

    python tools/test.py configs/segmenter_lookhere_ade20k.py work_dirs/x/iter_160000.pth
    python tools/test.py configs/segmenter_lookhere_cityscapes_whole.py CKPT --show-dir vis
    python tools/test.py configs/segmenter_lookhere_vit-t_tiny-ade.py CKPT --out preds \\
        --cfg-options model.test_cfg.mode=whole
"""

from __future__ import annotations

import argparse
from typing import List, Optional

from lookhere_dense.apis.cli import (
    ToolArgumentParser,
    add_runner_job_args,
    console_script,
    parse_launch_args,
    run_runner_job,
)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments (mmseg / mmdet ``tools/test.py`` conventions)."""
    parser = ToolArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='config file (or mmseg::/mmdet:: package path)')
    parser.add_argument('checkpoint', help='checkpoint file to test')
    parser.add_argument(
        '--out',
        help='mmseg: folder for the predicted label maps (PNG, '
        'one per image); mmdet: a .pkl file for the raw results',
    )
    parser.add_argument(
        '--show-dir',
        help='folder for images painted with the predictions (a relative one: from the '
        'current folder; mmseg writes them in its vis_data/vis_image/)',
    )
    parser.add_argument(
        '--show', action='store_true', help='show the painted predictions in a window'
    )
    parser.add_argument(
        '--show-interval',
        type=int,
        default=1,
        help='with --show / --show-dir: paint every N-th test batch (mmseg configs: every '
        "N-th image at batch size 1; mmdet's DetVisualizationHook paints every image; "
        'default: 1)',
    )
    parser.add_argument(
        '--wait-time',
        type=float,
        default=2,
        help='seconds each shown image stays up (with --show)',
    )
    parser.add_argument(
        '--tta',
        action='store_true',
        help="test-time augmentation with the config's tta_pipeline / tta_model",
    )
    add_runner_job_args(
        parser,
        what='the log and the metrics JSON',
        cfg_example='model.test_cfg.mode=whole',
        verbose_extra='library warnings',
        memory_help='memory budget of one test pass (e.g. 8G): a whole frame whose estimated '
        'peak exceeds it is refused before it allocates, with cheaper options (default: '
        'the memory the machine or its cgroup has left; off: no limit)',
        amp_help='the model predicts (AmpTestLoop; predictions scored and written in float32)',
    )
    args = parse_launch_args(parser, argv)
    if args.show_interval < 1:
        parser.error(f'--show-interval must be >= 1, got {args.show_interval}')
    return args


def main(argv: Optional[List[str]] = None):
    """Test (:func:`lookhere_dense.apis.test.evaluate_checkpoint`); returns the metrics
    dict."""
    args = parse_args(argv)
    return run_runner_job(
        args,
        'lookhere_dense.apis.test:evaluate_checkpoint',
        args.checkpoint,
        out=args.out,
        show_dir=args.show_dir,
        show=args.show,
        show_interval=args.show_interval,
        wait_time=args.wait_time,
        tta=args.tta,
    )


#: The ``lookhere-test`` console script: :func:`main` with one-line errors.
cli = console_script(main)

if __name__ == '__main__':
    cli()
