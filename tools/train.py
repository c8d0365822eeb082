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
import logging
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


def build_cfg(args: argparse.Namespace):
    """The config to train with (file + ``--cfg-options`` + the flags, checked) and the
    pretrained files it named that were missing (dropped: training starts from scratch)."""
    from lookhere_dense.cli import load_config, preflight, set_work_dir
    from lookhere_dense.swap import ConfigError

    cfg = load_config(args.config, args.cfg_options)
    cfg.launcher = args.launcher
    set_work_dir(cfg, args.work_dir, args.config)
    if isinstance(cfg.get('visualizer'), dict):
        # mmseg / mmdet configs name their visualizer 'visualizer'; a named instance is
        # reused by every later Runner in the process (logging into the first run's
        # folder). Without the name each run gets its own, named after the experiment.
        cfg.visualizer.pop('name', None)
    if args.amp:
        import torch
        if not torch.cuda.is_available():
            raise ConfigError('--amp needs a CUDA GPU (mmengine AmpOptimWrapper); drop --amp '
                             'on CPU')
        wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
        if wrapper == 'AmpOptimWrapper':
            from mmengine.logging import print_log
            print_log('AMP is already enabled in the config', logger='current',
                      level=logging.WARNING)
        elif wrapper != 'OptimWrapper':
            raise ConfigError(f'--amp works with optim_wrapper type OptimWrapper, the config '
                             f'has {wrapper!r}')
        else:
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        if not os.path.isfile(args.resume):
            raise FileNotFoundError(f'--resume checkpoint {args.resume!r} not found')
        cfg.resume = True
        cfg.load_from = args.resume
    dropped = preflight(cfg, ('train', 'val'), require_pretrained=args.require_pretrained,
                        check_data=not args.skip_data_check)
    return cfg, dropped


def main(argv: Optional[List[str]] = None):
    """Train; returns the Runner (its ``work_dir`` holds logs and checkpoints)."""
    from lookhere_dense.cli import quiet_known_warnings
    quiet_known_warnings()
    import lookhere_dense
    lookhere_dense.register_all_modules()
    from mmengine.runner import Runner

    args = parse_args(argv)
    from lookhere_dense.cli import apply_threads
    apply_threads(args.threads)
    cfg, dropped = build_cfg(args)
    if 'runner_type' in cfg:
        from mmengine.registry import RUNNERS
        runner = RUNNERS.build(cfg)
    else:
        runner = Runner.from_cfg(cfg)
    for path in dropped:  # repeat the warning where the run's log file gets it
        runner.logger.warning(f'pretrained file {path!r} not found: the backbone starts '
                              'from RANDOM weights (see the data/config checks above)')
    runner.train()
    return runner


if __name__ == '__main__':
    from lookhere_dense.cli import run_main
    run_main(main)
