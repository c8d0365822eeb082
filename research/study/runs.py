"""The study's runs: one config per (encoding, seed) (:func:`run_config`), trained with the
mmengine ``Runner`` and evaluated at every ladder rung (:func:`train_and_evaluate`), and
the whole study (:func:`run_study`).

Every run is a real mmengine ``Runner`` on an mmseg config in which only
``model.backbone.pos_encoding`` (and, for LookHere, its preset) changes; with one seed the
runs share the trunk's initial weights (see
:func:`lookhere_dense.lookhere.pos_encoding.isolated_rng`) and the order of the training
data. After training, each test scale is evaluated in every mode of the ladder
(:func:`~research.study.ladders.ladder_modes`) with
:class:`~lookhere_dense.evaluation.metrics.PerClassIoUMetric`: zoom ladders (and their
native-aspect rows) with the segmentor's own ``test_step`` on the rung's batches through
:func:`~research.evaluate.evaluate`, the field-of-view ladder through
:func:`~research.evaluate.evaluate_loader` (whole vs sliding windows); every
rung is timed (model seconds per image) and its peak memory measured. With ``robustness``
every run is also attacked (FGSM / PGD,
:mod:`research.robustness.segmentor`) on the validation images of the 1x rung
(:func:`evaluate_robustness`).
"""

from __future__ import annotations

import copy
import datetime
import gc
import os.path as osp
import platform
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from lookhere_dense.engine.memory_guard import (
    install_memory_guard,
    parse_memory,
    remove_memory_guard,
)
from lookhere_dense.engine.ranks import unwrap_model
from lookhere_dense.engine.schedules import schedule_to
from lookhere_dense.errors import ConfigError, MemoryBudgetError
from lookhere_dense.validation import check_int, check_number

from ..evaluate import evaluate, evaluate_loader, refusal
from .aids import DEFAULT_JUMBO_TOKENS, apply_train_aids, run_specs, split_run_spec
from .encodings import DEFAULT_ENCODINGS, backbone_for, check_encoding_options
from .ladders import (
    LADDERS,
    NATIVE_ASPECT,
    ladder_dataloader,
    ladder_evaluator,
    ladder_modes,
    native_aspect_dataloader,
    prepare_data,
    slide_window,
    study_settings,
)

__all__ = [
    'DEFAULT_CONFIG',
    'LADDER_CONFIGS',
    'RunOptions',
    'run_config',
    'evaluate_rung',
    'evaluate_robustness',
    'learned_slopes',
    'train_and_evaluate',
    'versions',
    'run_study',
]


def _repo() -> str:
    from research import REPO

    return REPO


#: the CPU default of ``tools/extrapolation_study.py``: a tiny LookHereViT on the
#: relational task (``configs/study/relational_vit_tiny.py``)
DEFAULT_CONFIG = osp.join(_repo(), 'configs', 'study', 'relational_vit_tiny.py')
#: the CPU default config of each ladder (``--ladder`` without ``--config``)
LADDER_CONFIGS = {
    'rendered': DEFAULT_CONFIG,
    'fov': osp.join(_repo(), 'configs', 'study', 'fov_vit_tiny.py'),
}


@dataclass
class RunOptions:
    """What the command line changes in every run's config (None: the config's own).

    Attributes:
        iters: training iterations; iteration-based LR schedules are stretched to match
            (:func:`~lookhere_dense.engine.schedules.schedule_to`). Default: None.
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

    def __post_init__(self) -> None:
        # a 0 is not "the config's own" (the tool refuses it when parsing; so does the API)
        for name in ('iters', 'batch_size', 'val_interval'):
            if getattr(self, name) is not None:
                check_int(f'RunOptions.{name}', getattr(self, name), 1, ConfigError)
        if self.lr is not None:
            check_number('RunOptions.lr', self.lr, 0, strict=True, error=ConfigError)


def run_config(base_cfg, spec: str, seed: int, options: RunOptions, work_dir: str):
    """A deep copy of ``base_cfg`` for one run (run ``spec``: an encoding with optional
    training aids, :func:`~research.study.aids.split_run_spec`; ``seed``,
    ``options``); the encoding's options from ``extrapolation.encoding_options``."""
    encoding, aids = split_run_spec(spec)
    cfg = copy.deepcopy(base_cfg)
    cfg.model.backbone = backbone_for(
        cfg.model.backbone, encoding, (cfg.get('extrapolation') or {}).get('encoding_options')
    )
    apply_train_aids(cfg, aids)
    cfg.work_dir = work_dir
    cfg.randomness = dict(seed=seed, deterministic=False)
    if options.iters is not None:
        schedule_to(cfg, options.iters)
    if options.batch_size is not None:
        cfg.train_dataloader.batch_size = options.batch_size
    if options.lr is not None:
        cfg.optim_wrapper.optimizer.lr = options.lr
    if options.val_interval is not None:
        cfg.train_cfg.val_interval = options.val_interval
    else:  # mmengine's loop validates at the last iteration whatever the interval: no start
        cfg.train_cfg.val_interval = cfg.train_cfg.max_iters + 1
        cfg.train_cfg.val_begin = cfg.train_cfg.max_iters + 1
    if cfg.get('visualizer'):
        cfg.visualizer.pop('name', None)  # one global visualizer name per Runner
    if not options.keep_test_mode:
        cfg.model.test_cfg = dict(mode='whole')
    return cfg


def _encoding_name(cfg) -> str:
    """The run's ``pos_encoding`` name (the dict form's ``type``)."""
    name = cfg.model.backbone.pos_encoding
    return name if isinstance(name, str) else str(name.get('type'))


def _plain(value: Any) -> Any:
    """numpy / float32 scalars -> Python numbers rounded to 4 decimals (for JSON)."""
    value = value.item() if hasattr(value, 'item') else value
    return round(value, 4) if isinstance(value, float) else value


def evaluate_rung(runner, cfg, study: Dict[str, Any], scale: float, mode: str) -> Dict[str, Any]:
    """The metrics of rung ``scale`` predicted in ``mode`` (:func:`ladder_modes`):

    * ``'test'`` -- the run's ``test_cfg`` on the rung's batches (zoom ladders), the
      segmentor's own ``test_step`` (what mmengine's ``ValLoop`` runs) through
      :func:`~research.evaluate.evaluate`, which also times the model and
      meters the peak memory (the keys of ``'whole'`` below);
    * ``'native_aspect'`` -- the same on the native-aspect rung (images at their own aspect,
      long side ``scale`` times the training side; one image per batch,
      :func:`~research.study.ladders.native_aspect_dataloader`);
    * ``'whole'`` / ``'slide'`` -- the whole frame in one pass / mmseg's sliding windows of
      the training crop (:func:`slide_window`), one frame per batch, through
      :func:`~research.evaluate.evaluate_loader`: the metrics plus
      ``input_h`` / ``input_w`` (the median frame), ``sec_per_img`` (model time),
      ``peak_mem_mb``, ``mem_rise_mb`` (the peak above the memory in use when the loop
      started) and ``memory_kind``;
    * ``'log_n'`` -- the ladder's first mode with the backbone's ``log_n_scaling`` on.
    """

    model = unwrap_model(runner.model)
    if mode == 'log_n':
        backbone = model.backbone
        before = backbone.log_n_scaling
        backbone.log_n_scaling = True
        try:
            return evaluate_rung(runner, cfg, study, scale, LADDERS[study['ladder']].modes[0])
        finally:
            backbone.log_n_scaling = before
    device = 'cuda' if next(model.parameters()).is_cuda else 'cpu'
    model.eval()
    if mode in ('test', NATIVE_ASPECT):
        import torch

        def step(data):
            with torch.no_grad():
                return model.test_step(data)

        if mode == NATIVE_ASPECT:
            dataloader = native_aspect_dataloader(cfg, study, scale)
        else:
            dataloader = ladder_dataloader(cfg, study, scale)
        dataloader.update(num_workers=0, persistent_workers=False)
        result = evaluate(model, dataloader, ladder_evaluator(cfg), step, device, f'x{scale:g}')
    else:
        dataloader = ladder_dataloader(cfg, study, scale)
        dataloader.update(batch_size=1, num_workers=0, persistent_workers=False)
        before = model.test_cfg
        try:
            result = evaluate_loader(
                model,
                dataloader,
                ladder_evaluator(cfg),
                mode,
                device,
                slide_window(study) if mode == 'slide' else None,
                f'{mode}@x{scale:g}',
            )
        finally:
            model.test_cfg = before
    seconds, shapes = result['seconds'], sorted(result['shapes'])
    metrics = {k: _plain(v) for k, v in result['metrics'].items()}
    metrics.update(
        input_h=shapes[len(shapes) // 2][0],
        input_w=shapes[len(shapes) // 2][1],
        sec_per_img=_plain(sum(seconds) / max(1, len(seconds))),
        peak_mem_mb=round(result['peak_mem_mb'], 1),
        mem_rise_mb=round(result['mem_rise_mb'], 1),
        memory_kind=result['memory_kind'],
        images=len(result['shapes']),
    )
    return metrics


def evaluate_robustness(runner, cfg, study: Dict[str, Any]) -> Dict[str, Any]:
    """Attack the run's model with ``study['robustness']`` (FGSM / PGD,
    :func:`~research.robustness.segmentor.robustness_sweep`) on the validation
    images
    of the 1x rung (the training size), predicted whole, scored with the ladder's
    evaluator.

    Returns:
        ``{'clean': row, attack: {eps: row}}`` (rows: the metrics plus ``loss``,
        ``max_linf``, ``images``, ``seconds``).
    """
    from mmengine.logging import print_log

    from ..robustness import robustness_sweep, settings_from_dict

    model = unwrap_model(runner.model)
    device = 'cuda' if next(model.parameters()).is_cuda else 'cpu'
    dataloader = ladder_dataloader(cfg, study, 1.0)
    dataloader.update(num_workers=0, persistent_workers=False)
    return robustness_sweep(
        model,
        dataloader,
        ladder_evaluator(cfg),
        settings_from_dict(study['robustness']),
        device,
        lambda line: print_log(f'[study] {line}', logger='current'),
        label=_encoding_name(cfg),
        metric=study.get('metric', 'mIoU'),
    )


def learned_slopes(model) -> Optional[Dict[str, Any]]:
    """The learned LookHere slopes of ``model`` (``global`` and per-``layer`` values,
    rounded to 4 decimals), or None when it has no learnable slopes."""
    from lookhere_dense.lookhere.slopes import LookHereSlopes

    found = [m for m in model.modules() if isinstance(m, LookHereSlopes)]
    if not found:
        return None
    values = found[0].values()
    return dict(
        global_slope=round(float(values['global']), 4),
        layer=[round(float(v), 4) for v in values['layer']],
    )


def train_and_evaluate(
    cfg, study: Dict[str, Any], max_memory: Union[None, str, int] = None
) -> Dict[str, Any]:
    """Train one run with the mmengine ``Runner`` and evaluate it at every ladder scale in
    every mode (:func:`evaluate_rung`), then, with ``study['robustness']``, under attack
    (:func:`evaluate_robustness`).

    The evaluations run under the memory guard
    (:func:`lookhere_dense.engine.memory_guard.install_memory_guard`, budget
    ``max_memory``, ``'8G'`` or bytes; default: the memory left): a rung whose pass is
    estimated above it is refused before it allocates and recorded as
    :func:`~research.evaluate.refusal`'s dict (no metric: a ``refused`` cell in the
    tables, no point in the plots); the other rungs run. The ``robustness`` attacks run
    after the guard is removed (they take gradients through the model in eval mode, which
    the guard would estimate as inference): unguarded.

    Returns:
        ``dict(train_seconds, eval_seconds, params, eval={scale: {metric: value}})`` with
        the ladder's first mode in ``eval``, plus ``modes={mode: {scale: {metric:
        value}}}`` for the other modes (none for a zoom ladder without aids or native
        aspect), ``robustness`` (see :func:`evaluate_robustness`) and ``robustness_seconds``
        when attacked, ``slopes`` (:func:`learned_slopes`) when the slopes were learned.
    """
    from mmengine.logging import print_log

    from lookhere_dense.apis.train import build_runner
    from lookhere_dense.engine.terminal import warnings_to_run_log

    # the tools' Runner: the run header, config dump, per-class tables and library warnings
    # go to each run's log file (a 3-run study printed 2,400 lines on the terminal)
    with warnings_to_run_log():
        runner = build_runner(cfg)
        start = time.time()
        runner.train()
    train_seconds = time.time() - start
    model = unwrap_model(runner.model)
    params = sum(p.numel() for p in model.parameters())
    modes = ladder_modes(study)
    results: Dict[str, Dict[str, Dict[str, Any]]] = {mode: {} for mode in modes}
    start = time.time()
    install_memory_guard(
        model, None if max_memory is None else parse_memory(max_memory), slide_window(study)[0]
    )
    try:
        for scale in study['scales']:
            for mode in modes:
                try:
                    metrics = evaluate_rung(runner, cfg, study, scale, mode)
                    shown = f'{study["metric"]} {metrics.get(study["metric"])}'
                except MemoryBudgetError as err:
                    metrics = refusal(err)
                    shown = str(err)
                results[mode][f'{scale:g}'] = metrics
                print_log(
                    f'[study] {_encoding_name(cfg)} scale {scale:g} {mode}: {shown}',
                    logger='current',
                )
    finally:
        remove_memory_guard(model)
    eval_seconds = time.time() - start
    robustness = None
    if study.get('robustness'):
        start = time.time()
        robustness = evaluate_robustness(runner, cfg, study)
        robustness_seconds = time.time() - start
    slopes = learned_slopes(model)
    del runner, model
    gc.collect()
    out = dict(
        train_seconds=round(train_seconds, 1),
        eval_seconds=round(eval_seconds, 1),
        params=params,
        eval=results.pop(modes[0]),
    )
    if results:
        out['modes'] = results
    if robustness is not None:
        out.update(robustness=robustness, robustness_seconds=round(robustness_seconds, 1))
    if slopes is not None:
        out['slopes'] = slopes
    return out


def versions() -> Dict[str, str]:
    """Python, torch, mmengine, mmseg and lookhere-dense versions, machine, torch threads
    and device: stored in every report."""
    import mmengine
    import mmseg
    import torch

    import lookhere_dense

    return dict(
        python=platform.python_version(),
        torch=torch.__version__,
        mmengine=mmengine.__version__,
        mmseg=mmseg.__version__,
        lookhere_dense=lookhere_dense.__version__,
        machine=platform.machine(),
        torch_threads=torch.get_num_threads(),
        device='cuda:' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu',
    )


def run_study(
    config: Optional[str] = None,
    encodings: Optional[Sequence[str]] = None,
    seeds: Sequence[int] = (0,),
    options: Optional[RunOptions] = None,
    work_dir: str = osp.join('work_dirs', 'extrapolation_study'),
    scales: Optional[Sequence[float]] = None,
    metric: Optional[str] = None,
    cfg_options: Optional[dict] = None,
    command: str = '',
    ladder: Optional[str] = None,
    aids: Optional[Sequence[str]] = None,
    native_aspect: Optional[bool] = None,
    robustness: bool = False,
    max_memory: Union[None, str, int] = None,
) -> Dict[str, Any]:
    """Train and evaluate every (seed, run); returns the report dict (``command``,
    ``date``, ``wall_seconds``, ``versions``, ``settings``, ``runs``; write it with
    :func:`research.study.reports.write_outputs`).

    Args:
        config: mmseg config with a LookHereViT backbone (and optionally the generated
            dataset and ``extrapolation`` dicts of ``configs/study/*``). Default: None (the
            ladder's CPU default, :data:`LADDER_CONFIGS`; :data:`DEFAULT_CONFIG` without
            a ladder).
        encodings: encodings (or run specs with training aids,
            :func:`~research.study.aids.split_run_spec`) to compare. Default: None
            (the config's ``extrapolation.encodings``, else :data:`DEFAULT_ENCODINGS`).
        seeds: one run per encoding and seed. Default: ``(0,)``.
        options: per-run overrides. Default: None (:class:`RunOptions()`).
        work_dir: runs' logs and checkpoints (``<work_dir>/<run>/seed<N>``).
            Default: ``work_dirs/extrapolation_study``.
        scales / metric: override the config's (:func:`study_settings`). Default: None.
        cfg_options: config overrides. Default: None.
        command: the command line, stored in the report. Default: ``''``.
        ladder: override the config's ``extrapolation.ladder``. Default: None.
        aids: extrapolation aids for every run (:mod:`research.study.aids`),
            replacing the config's ``extrapolation.aids``. Default: None (the config's).
        native_aspect: add the native-aspect rows (zoom ladders; see
            :mod:`research.study.ladders`). Default: None (the config's
            ``extrapolation.native_aspect``, else off).
        robustness: attack every run (FGSM / PGD at the settings of
            ``extrapolation.robustness``, default
            :data:`~research.study.ladders.STUDY_ROBUSTNESS`). Default: False.
        max_memory: the memory budget of one evaluation pass (``'8G'``): a rung whose
            estimated peak exceeds it (without one: the memory left) is refused before it
            allocates and reported as ``refused`` (:func:`train_and_evaluate`).
            Default: None.

    Raises:
        lookhere_dense.errors.ConfigError: a ``max_memory`` that is no size (before any
            training).
        ValueError: a bad encoding, aid, encoding option (before any training), ladder,
            scale, native-aspect or robustness setting; a ladder without a CPU default
            config and no ``config``.
    """
    from mmengine.config import Config
    from mmengine.logging import print_log

    import lookhere_dense

    lookhere_dense.register_all_modules()  # the models and PerClassIoUMetric
    options = options or RunOptions()
    if config is None:
        if ladder is not None and ladder not in LADDER_CONFIGS:
            raise ConfigError(
                f'ladder {ladder!r} has no CPU default config: give one (e.g. '
                'configs/study/segmenter_vit-b_ade20k_ladder.py for resize)'
            )
        config = LADDER_CONFIGS.get(ladder, DEFAULT_CONFIG)
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    ext = cfg.get('extrapolation') or {}
    encodings = list(encodings or ext.get('encodings') or DEFAULT_ENCODINGS)
    all_aids = list(ext.get('aids', ()) if aids is None else aids)
    specs = run_specs(encodings, all_aids)  # fail early, before any training
    encoding_options = check_encoding_options(ext.get('encoding_options'))
    backbone_for(cfg.model.backbone, split_run_spec(specs[0])[0], encoding_options)
    study = study_settings(cfg, scales, metric, ladder, all_aids, native_aspect, robustness)
    budget = None if max_memory is None else parse_memory(max_memory)  # before any training
    data_meta = prepare_data(cfg, study)

    runs: List[Dict[str, Any]] = []
    total = len(specs) * len(seeds)
    started = time.time()
    first_cfg = None
    for i, (seed, spec) in enumerate((s, e) for s in seeds for e in specs):
        run_dir = osp.join(work_dir, spec.replace(':', '-'), f'seed{seed}')
        cfg_run = run_config(cfg, spec, seed, options, run_dir)
        first_cfg = first_cfg or cfg_run
        print_log(
            f'[study] run {i + 1}/{total}: {spec}, seed {seed}, '
            f'{cfg_run.train_cfg.max_iters} iters -> {run_dir}',
            logger='current',
        )
        result = train_and_evaluate(cfg_run, study, budget)
        runs.append(dict(encoding=spec, seed=seed, **result))
        print_log(
            f'[study] run {i + 1}/{total} done: train {result["train_seconds"]} s, '
            f'eval {result["eval_seconds"]} s',
            logger='current',
        )

    test_cfg = first_cfg.model.test_cfg
    settings = dict(
        config=osp.relpath(osp.abspath(config), _repo()),
        encodings=specs,
        seeds=list(seeds),
        scales=list(study['scales']),
        ladder=study['ladder'],
        metric=study['metric'],
        train_size=list(study['train_size']),
        iters=first_cfg.train_cfg.max_iters,
        batch_size=first_cfg.train_dataloader.batch_size,
        optimizer=first_cfg.optim_wrapper.optimizer.to_dict(),
        backbone={  # the base config's: the training aids of a run (jumbo) are its name
            k: v
            for k, v in cfg.model.backbone.items()
            if k not in ('pos_encoding', 'preset', 'lh_config')
        },
        test_cfg=test_cfg.to_dict() if hasattr(test_cfg, 'to_dict') else test_cfg,
        cfg_options=cfg_options,
        dataset=data_meta,
    )
    if encoding_options:
        settings['encoding_options'] = encoding_options
    if any('jumbo' in split_run_spec(spec)[1] for spec in specs):
        settings['jumbo_tokens'] = ext.get('jumbo_tokens', DEFAULT_JUMBO_TOKENS)
    modes = ladder_modes(study)
    if modes != ('test',):
        settings['modes'] = list(modes)
    if study.get('native_aspect'):
        settings['native_aspect'] = dict(
            long_side_at_1x=max(study['train_size']),
            aspect_ratios=((data_meta or {}).get('settings') or {}).get('aspect_ratios'),
            split=study['aspect_prefix'] if study['ladder'] == 'rendered' else None,
        )
    if study.get('robustness'):
        settings['robustness'] = dict(
            study['robustness'],
            rung=1.0,
            space='L-inf, 0-255 pixel units; clipped to valid pixels',
        )
    if study['ladder'] == 'fov':
        crop, stride = slide_window(study)
        settings['slide'] = dict(crop=list(crop), stride=list(stride))
    return dict(
        command=command,
        date=datetime.datetime.now().isoformat(timespec='seconds'),
        wall_seconds=round(time.time() - started, 1),
        versions=versions(),
        settings=settings,
        runs=runs,
    )
