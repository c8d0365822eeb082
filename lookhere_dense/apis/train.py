"""Train a segmentor (mmseg config) or detector (mmdet config) with mmengine's Runner
(``tools/train.py``).

Before the Runner is built the config is checked (:func:`lookhere_dense.cli.preflight`):
unknown model types, heads that cannot read the backbone, missing dataset folders, label
values outside the classes and crops larger than the images stop with a message that says
what to fix. Pretrained files the config names but that are not there are dropped with a
warning (``require_pretrained``: an error).
"""
from __future__ import annotations

import logging
import os
from typing import List, Optional, Tuple

__all__ = ['build_train_config', 'build_runner', 'train_model']


def build_train_config(config: str, work_dir: Optional[str] = None,
                       cfg_options: Optional[dict] = None, launcher: str = 'none',
                       amp: bool = False, resume: Optional[str] = None,
                       require_pretrained: bool = False, check_data: bool = True
                       ) -> Tuple[object, List[str]]:
    """The config to train with: the file (``mmseg::`` / ``mmdet::`` paths allowed) +
    ``cfg_options`` + the options below, checked.

    Args:
        config: config file.
        work_dir: logs and checkpoints. Default: None (the config's ``work_dir``, else
            ``work_dirs/<config name>``).
        cfg_options: config overrides. Default: None.
        launcher: ``'none'``, ``'pytorch'``, ``'slurm'`` or ``'mpi'``. Default: ``'none'``.
        amp: mixed precision (``AmpOptimWrapper``, dynamic loss scale; needs CUDA).
            Default: False.
        resume: ``'auto'`` (the latest checkpoint in the work dir), a checkpoint path, or
            None (no resume). Default: None.
        require_pretrained: a missing pretrained file is an error. Default: False.
        check_data: run the data checks. Default: True.

    Returns:
        ``(cfg, dropped)``: the config and the pretrained paths that were missing
        (dropped: training starts from scratch).

    Raises:
        lookhere_dense.swap.ConfigError, lookhere_dense.data.checks.DataCheckError,
        FileNotFoundError: saying what to fix.
    """
    from lookhere_dense.cli import load_config, preflight, set_work_dir
    from lookhere_dense.swap import ConfigError

    cfg = load_config(config, cfg_options)
    cfg.launcher = launcher
    set_work_dir(cfg, work_dir, config)
    if isinstance(cfg.get('visualizer'), dict):
        # mmseg / mmdet configs name their visualizer 'visualizer'; a named instance is
        # reused by every later Runner in the process (logging into the first run's
        # folder). Without the name each run gets its own, named after the experiment.
        cfg.visualizer.pop('name', None)
    if amp:
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
    if resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif resume is not None:
        if not os.path.isfile(resume):
            raise FileNotFoundError(f'--resume checkpoint {resume!r} not found')
        cfg.resume = True
        cfg.load_from = resume
    dropped = preflight(cfg, ('train', 'val'), require_pretrained=require_pretrained,
                        check_data=check_data)
    return cfg, dropped


def build_runner(cfg):
    """The config's ``runner_type`` (from mmengine's ``RUNNERS``), else mmengine's Runner."""
    if 'runner_type' in cfg:
        from mmengine.registry import RUNNERS
        return RUNNERS.build(cfg)
    from mmengine.runner import Runner
    return Runner.from_cfg(cfg)


def train_model(config: str, **options):
    """Train: :func:`build_train_config` (``options`` are its arguments), build the Runner,
    repeat the missing-pretrained warnings into the run's log, ``runner.train()``.

    Returns:
        The Runner (its ``work_dir`` holds logs and checkpoints).
    """
    import lookhere_dense
    lookhere_dense.register_all_modules()
    cfg, dropped = build_train_config(config, **options)
    runner = build_runner(cfg)
    for path in dropped:  # repeat the warning where the run's log file gets it
        runner.logger.warning(f'pretrained file {path!r} not found: the backbone starts '
                              'from RANDOM weights (see the data/config checks above)')
    runner.train()
    return runner
