"""Train a segmentor (mmseg config) or detector (mmdet config) with mmengine's Runner.

lookhere-dense registers itself (no install needed beyond the README set-up). Before the
Runner is built the config is checked: unknown model types, heads that cannot read the
backbone, missing dataset folders, label values outside the classes, crops larger than
the images and pretrained files the config names but that are not there stop with a
message that says what to fix (``--allow-random-init`` trains without the missing
weights). A loss that turns NaN / Inf stops the run; ``--resume`` continues bit-exactly
(CPU, num_workers=0). The terminal shows checks, progress, losses and metrics; the log
file in the work dir has everything (config, environment, per-class tables).

The same code runs as ``python tools/train.py`` (in the repository), ``python -m
lookhere_dense.train`` and the ``lookhere-train`` console script (after ``pip install``);
``lookhere_dense::NAME.py`` names a config shipped in the package
(:func:`lookhere_dense.config_path`).

Examples::

    python tools/train.py configs/segmenter_lookhere_ade20k.py
    python tools/train.py configs/segmenter_lookhere_vit-t_tiny-ade.py --work-dir work_dirs/t \\
        --cfg-options model.backbone.preset=lh90 train_cfg.max_iters=100
    torchrun --nproc_per_node=8 tools/train.py configs/segmenter_lookhere_ade20k.py \\
        --launcher pytorch          # NCCL on GPUs, Gloo on a CPU-only machine
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
    """Command-line arguments (mmseg / mmdet ``tools/train.py`` conventions)."""
    parser = ToolArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='config file (or mmseg::/mmdet:: package path)')
    parser.add_argument(
        '--resume',
        nargs='?',
        const='auto',
        default=None,
        metavar='CKPT',
        help='resume training: without a value from the newest readable '
        'checkpoint in the work dir (none there: start from iteration 0, '
        'with a warning), or from the checkpoint CKPT',
    )
    parser.add_argument(
        '--allow-random-init',
        action='store_true',
        help='train even when a pretrained file named by the config is '
        'missing (from random weights, with a warning; default: stop)',
    )
    parser.add_argument(
        '--require-pretrained',
        action='store_true',
        help='stop when a pretrained file named by the config is missing '
        '(the default; kept for old command lines)',
    )
    parser.add_argument(
        '--share-work-dir',
        action='store_true',
        help='train even when another live run holds the work dir (default: refuse; '
        "two runs in one folder overwrite each other's checkpoints)",
    )
    add_runner_job_args(
        parser,
        what='logs and checkpoints',
        cfg_example='model.backbone.preset=lh90 train_cfg.max_iters=1000',
        verbose_extra='library warnings, per-class tables',
        memory_help='memory budget of one training step or validation pass (e.g. 8G, 512M): '
        'a pass whose estimated peak exceeds it is refused before it allocates (default: '
        'the memory the machine or its cgroup has left; off: no limit)',
        amp_help='the training forward (MixedPrecisionOptimWrapper; float16 adds a dynamic '
        'loss scale)',
    )
    args = parse_launch_args(parser, argv)
    return args


def main(argv: Optional[List[str]] = None):
    """Train (:func:`lookhere_dense.apis.train.train_model`); returns the Runner (its
    ``work_dir`` holds logs and checkpoints)."""
    args = parse_args(argv)
    return run_runner_job(
        args,
        'lookhere_dense.apis.train:train_model',
        resume=args.resume,
        require_pretrained=args.require_pretrained,
        allow_random_init=args.allow_random_init,
        share_work_dir=args.share_work_dir,
    )


#: The ``lookhere-train`` console script: :func:`main` with one-line errors.
cli = console_script(main)

if __name__ == '__main__':
    cli()
