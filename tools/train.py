#!/usr/bin/env python
"""Train a segmentor (mmseg config) or detector (mmdet config) with mmengine's Runner.

lookhere-dense registers itself (no install needed beyond the README set-up). Before the
Runner is built the config is checked: unknown model types, heads that cannot read the
backbone, missing dataset folders, label values outside the classes and crops larger than
the images stop with a message that says what to fix. Pretrained files the config names
but that are not there are dropped with a warning (``--require-pretrained``: an error).

Examples::

    python tools/train.py configs/segmenter_lookhere_ade20k.py
    python tools/train.py configs/segmenter_lookhere_vit-t_tiny-ade.py --work-dir work_dirs/t \\
        --cfg-options model.backbone.preset=lh90 train_cfg.max_iters=100
    torchrun --nproc_per_node=8 tools/train.py configs/segmenter_lookhere_ade20k.py \\
        --launcher pytorch
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments (mmseg / mmdet ``tools/train.py`` conventions)."""
    from mmengine.config import DictAction

    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='config file (or mmseg::/mmdet:: package path)')
    parser.add_argument('--work-dir', help='folder for logs and checkpoints (default: the '
                        "config's work_dir, else work_dirs/<config name>)")
    parser.add_argument('--resume', nargs='?', const='auto', default=None, metavar='CKPT',
                        help='resume training: without a value from the latest checkpoint '
                        'in the work dir, or from the checkpoint CKPT')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision (AmpOptimWrapper, dynamic loss '
                        'scale; needs a GPU)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries, e.g. model.backbone.preset=lh90 '
                        'train_cfg.max_iters=1000 (lists: key="[a,b]")')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher; "pytorch" under torchrun')
    parser.add_argument('--require-pretrained', action='store_true',
                        help='stop when a pretrained file named by the config is missing '
                        '(default: warn and train from random init)')
    parser.add_argument('--skip-data-check', action='store_true',
                        help='do not run the data checks before training (folders are '
                        'still checked when the dataloaders are built)')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0,
                        help='set by torch.distributed.launch; do not pass by hand')
    from lookhere_dense.cli import add_threads_arg
    add_threads_arg(parser)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def main(argv: Optional[List[str]] = None):
    """Train (:func:`lookhere_dense.apis.train.train_model`); returns the Runner (its
    ``work_dir`` holds logs and checkpoints)."""
    from lookhere_dense.cli import apply_threads, quiet_known_warnings
    quiet_known_warnings()
    import lookhere_dense
    lookhere_dense.register_all_modules()
    from lookhere_dense.apis.train import train_model

    args = parse_args(argv)
    apply_threads(args.threads)
    return train_model(args.config, work_dir=args.work_dir, cfg_options=args.cfg_options,
                       launcher=args.launcher, amp=args.amp, resume=args.resume,
                       require_pretrained=args.require_pretrained,
                       check_data=not args.skip_data_check)


if __name__ == '__main__':
    from lookhere_dense.cli import run_main
    run_main(main)
