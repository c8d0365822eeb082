"""The study's runs: one config per (encoding, seed) (:func:`run_config`), trained with the
mmengine ``Runner`` and evaluated at every ladder rung (:func:`train_and_evaluate`), and
the whole study (:func:`run_study`).

Every run is a real mmengine ``Runner`` on an mmseg config in which only
``model.backbone.pos_encoding`` (and, for LookHere, its preset) changes; with one seed the
runs share the trunk's initial weights (see
:func:`lookhere_dense.models.pos_encoding.isolated_rng`) and the order of the training
data. After training, each test scale gets its own mmengine ``ValLoop`` with
:class:`~lookhere_dense.evaluation.metrics.PerClassIoUMetric`.
"""
from __future__ import annotations

import copy
import datetime
import gc
import os.path as osp
import platform
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from .encodings import DEFAULT_ENCODINGS, backbone_for, parse_encoding
from .ladders import ladder_dataloader, ladder_evaluator, prepare_data, study_settings
from .schedules import schedule_to

__all__ = ['DEFAULT_CONFIG', 'RunOptions', 'run_config', 'train_and_evaluate', 'versions',
           'run_study']


def _repo() -> str:
    from lookhere_dense.cli import REPO
    return REPO


#: the CPU default of ``tools/extrapolation_study.py``: a tiny LookHereViT on the
#: relational task (``configs/study/relational_vit_tiny.py``)
DEFAULT_CONFIG = osp.join(_repo(), 'configs', 'study', 'relational_vit_tiny.py')


@dataclass
class RunOptions:
    """What the command line changes in every run's config (None: the config's own).

    Attributes:
        iters: training iterations; iteration-based LR schedules are stretched to match
            (:func:`~lookhere_dense.study.schedules.schedule_to`). Default: None.
        batch_size: training batch size. Default: None.
        lr: learning rate. Default: None.
        val_interval: also validate at 1x every N iterations while training. Default: None
            (never: the ladder is evaluated after training).
        keep_test_mode: keep the config's ``model.test_cfg`` (else ``mode='whole'``, so the
            model sees the whole larger image). Default: False.
    """

    iters: Optional[int] = None
    batch_size: Optional[int] = None
    lr: Optional[float] = None
    val_interval: Optional[int] = None
    keep_test_mode: bool = False


def run_config(base_cfg, spec: str, seed: int, options: RunOptions, work_dir: str):
    """A deep copy of ``base_cfg`` for one run (encoding ``spec``, ``seed``, ``options``)."""
    cfg = copy.deepcopy(base_cfg)
    cfg.model.backbone = backbone_for(cfg.model.backbone, spec)
    cfg.work_dir = work_dir
    cfg.randomness = dict(seed=seed, deterministic=False)
    if options.iters:
        schedule_to(cfg, options.iters)
    if options.batch_size:
        cfg.train_dataloader.batch_size = options.batch_size
    if options.lr:
        cfg.optim_wrapper.optimizer.lr = options.lr
    cfg.train_cfg.val_interval = (options.val_interval if options.val_interval
                                  else cfg.train_cfg.max_iters + 1)
    if cfg.get('visualizer'):
        cfg.visualizer.pop('name', None)  # one global visualizer name per Runner
    if not options.keep_test_mode:
        cfg.model.test_cfg = dict(mode='whole')
    return cfg


def _plain(value: Any) -> Any:
    """numpy / float32 scalars -> Python numbers rounded to 4 decimals (for JSON)."""
    value = value.item() if hasattr(value, 'item') else value
    return round(value, 4) if isinstance(value, float) else value


def train_and_evaluate(cfg, study: Dict[str, Any]) -> Dict[str, Any]:
    """Train one run with the mmengine ``Runner`` and evaluate it at every ladder scale.

    Returns:
        ``dict(train_seconds, eval_seconds, params, eval={scale: {metric: value}})``.
    """
    from mmengine.logging import print_log
    from mmengine.runner import Runner, ValLoop

    runner = Runner.from_cfg(cfg)
    start = time.time()
    runner.train()
    train_seconds = time.time() - start
    model = runner.model.module if hasattr(runner.model, 'module') else runner.model
    params = sum(p.numel() for p in model.parameters())
    results: Dict[str, Dict[str, Any]] = {}
    start = time.time()
    for scale in study['scales']:
        loop = ValLoop(runner, ladder_dataloader(cfg, study, scale), ladder_evaluator(cfg))
        metrics = {k: _plain(v) for k, v in loop.run().items()}
        results[f'{scale:g}'] = metrics
        print_log(f'[study] {cfg.model.backbone.pos_encoding} scale {scale:g}: '
                  f'{study["metric"]} {metrics.get(study["metric"])}', logger='current')
    eval_seconds = time.time() - start
    del runner, loop, model
    gc.collect()
    return dict(train_seconds=round(train_seconds, 1), eval_seconds=round(eval_seconds, 1),
                params=params, eval=results)


def versions() -> Dict[str, str]:
    """Python, torch, mmengine, mmseg and lookhere-dense versions, machine, torch threads
    and device: stored in every report."""
    import mmengine
    import mmseg
    import torch

    import lookhere_dense
    return dict(python=platform.python_version(), torch=torch.__version__,
                mmengine=mmengine.__version__, mmseg=mmseg.__version__,
                lookhere_dense=lookhere_dense.__version__, machine=platform.machine(),
                torch_threads=torch.get_num_threads(),
                device='cuda:' + torch.cuda.get_device_name(0) if torch.cuda.is_available()
                else 'cpu')


def run_study(config: str = DEFAULT_CONFIG, encodings: Sequence[str] = DEFAULT_ENCODINGS,
              seeds: Sequence[int] = (0,), options: Optional[RunOptions] = None,
              work_dir: str = osp.join('work_dirs', 'extrapolation_study'),
              scales: Optional[Sequence[float]] = None, metric: Optional[str] = None,
              cfg_options: Optional[dict] = None, command: str = '') -> Dict[str, Any]:
    """Train and evaluate every (seed, encoding); returns the report dict (``command``,
    ``date``, ``wall_seconds``, ``versions``, ``settings``, ``runs``; write it with
    :func:`lookhere_dense.study.reports.write_outputs`).

    Args:
        config: mmseg config with a LookHereViT backbone (and optionally the ``relational``
            / ``extrapolation`` dicts of ``configs/study/*``). Default:
            :data:`DEFAULT_CONFIG`.
        encodings: encodings to compare (:func:`parse_encoding`). Default:
            :data:`DEFAULT_ENCODINGS`.
        seeds: one run per encoding and seed. Default: ``(0,)``.
        options: per-run overrides. Default: None (:class:`RunOptions()`).
        work_dir: runs' logs and checkpoints (``<work_dir>/<encoding>/seed<N>``).
            Default: ``work_dirs/extrapolation_study``.
        scales / metric: override the config's (:func:`study_settings`). Default: None.
        cfg_options: config overrides. Default: None.
        command: the command line, stored in the report. Default: ``''``.

    Raises:
        ValueError: a bad encoding (before any training), ladder or scale.
    """
    from mmengine.config import Config
    from mmengine.logging import print_log

    import lookhere_dense
    lookhere_dense.register_all_modules()  # the models and PerClassIoUMetric
    options = options or RunOptions()
    for spec in encodings:
        parse_encoding(spec)  # fail early, before any training
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    backbone_for(cfg.model.backbone, encodings[0])
    study = study_settings(cfg, scales, metric)
    data_meta = prepare_data(cfg, study)

    runs: List[Dict[str, Any]] = []
    total = len(encodings) * len(seeds)
    started = time.time()
    first_cfg = None
    for i, (seed, spec) in enumerate((s, e) for s in seeds for e in encodings):
        run_dir = osp.join(work_dir, spec.replace(':', '-'), f'seed{seed}')
        cfg_run = run_config(cfg, spec, seed, options, run_dir)
        first_cfg = first_cfg or cfg_run
        print_log(f'[study] run {i + 1}/{total}: encoding {spec}, seed {seed}, '
                  f'{cfg_run.train_cfg.max_iters} iters -> {run_dir}', logger='current')
        result = train_and_evaluate(cfg_run, study)
        runs.append(dict(encoding=spec, seed=seed, **result))
        print_log(f'[study] run {i + 1}/{total} done: train {result["train_seconds"]} s, '
                  f'eval {result["eval_seconds"]} s', logger='current')

    test_cfg = first_cfg.model.test_cfg
    settings = dict(
        config=osp.relpath(osp.abspath(config), _repo()), encodings=list(encodings),
        seeds=list(seeds), scales=list(study['scales']), ladder=study['ladder'],
        metric=study['metric'], train_size=list(study['train_size']),
        iters=first_cfg.train_cfg.max_iters,
        batch_size=first_cfg.train_dataloader.batch_size,
        optimizer=first_cfg.optim_wrapper.optimizer.to_dict(),
        backbone={k: v for k, v in first_cfg.model.backbone.items()
                  if k not in ('pos_encoding', 'preset', 'lh_config')},
        test_cfg=test_cfg.to_dict() if hasattr(test_cfg, 'to_dict') else test_cfg,
        cfg_options=cfg_options, dataset=data_meta)
    return dict(command=command, date=datetime.datetime.now().isoformat(timespec='seconds'),
                wall_seconds=round(time.time() - started, 1), versions=versions(),
                settings=settings, runs=runs)
