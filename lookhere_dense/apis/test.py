"""Test (and evaluate) a checkpoint with mmengine's Runner: mmseg or mmdet configs
(``tools/test.py``). The model and test data are checked before the Runner is built
(unknown types, missing folders, label values outside the classes); the checkpoint must
be readable and fit the model exactly
(:class:`~lookhere_dense.engine.hooks.CheckpointFitHook`: missing, unexpected and wrongly
shaped keys are named), and progress is logged about ten times per pass."""

from __future__ import annotations

import os
import time
from typing import List, Optional, Union

from ..errors import ConfigError, ToolError
from ..registry import type_names
from ..validation import path_inside

__all__ = [
    'build_test_config',
    'evaluate_checkpoint',
    'remove_incomplete_output',
    'use_amp_test_loop',
]


def use_amp_test_loop(cfg, dtype: Optional[str] = None) -> None:
    """Make ``cfg.test_cfg`` an :class:`~lookhere_dense.engine.amp.AmpTestLoop`: the model
    predicts under ``torch.autocast`` of ``dtype`` (on the device mmengine puts it on),
    and the predictions are scored and written in float32.

    Args:
        cfg: the config (changed in place).
        dtype: ``'bfloat16'`` or ``'float16'`` (CUDA only). Default: None (bfloat16).

    Raises:
        lookhere_dense.errors.ConfigError: float16 without CUDA, an unknown dtype, or a
            config whose ``test_cfg`` is another loop than mmengine's ``TestLoop``.
    """
    from ..engine.amp import accelerator_available, amp_dtype

    dtype = dtype or 'bfloat16'
    amp_dtype(dtype, 'cuda' if accelerator_available() else 'cpu', '--amp-dtype', training=False)
    test_cfg = dict(cfg.get('test_cfg') or {})
    kind = str(test_cfg.pop('type', 'TestLoop')).split('.')[-1]
    if kind not in ('TestLoop', 'AmpTestLoop'):
        raise ConfigError(f'--amp works with test_cfg type TestLoop, the config has {kind!r}')
    test_cfg.pop('fp16', None)
    cfg.test_cfg = dict(test_cfg, type='AmpTestLoop', dtype=dtype)


def _enable_visualization(
    cfg, show: bool, show_dir: Optional[str], show_interval: int, wait_time: float
) -> None:

    hook = cfg.get('default_hooks', {}).get('visualization')
    if hook is None:
        raise ConfigError(
            '--show / --show-dir need a visualization hook in default_hooks '
            '(mmseg: SegVisualizationHook, mmdet: DetVisualizationHook)'
        )
    hook['draw'] = True
    hook['interval'] = show_interval
    if show:
        hook['show'] = True
        hook['wait_time'] = wait_time
    if show_dir:
        # absolute: mmdet's hook joined a relative one to <work_dir>/<timestamp>/
        show_dir = os.path.abspath(show_dir)
        from ..checkpoint.atomic import check_output_folder

        check_output_folder(show_dir, '--show-dir')  # else a traceback from mmengine
        if cfg.get('default_scope') == 'mmdet':
            hook['test_out_dir'] = show_dir
        else:
            cfg.visualizer['save_dir'] = show_dir


def build_test_config(
    config: str,
    checkpoint: str,
    work_dir: Optional[str] = None,
    out: Optional[str] = None,
    show_dir: Optional[str] = None,
    show: bool = False,
    show_interval: int = 1,
    wait_time: float = 2,
    tta: bool = False,
    cfg_options: Optional[dict] = None,
    launcher: str = 'none',
    check_data: Union[bool, str] = True,
    max_memory: Optional[str] = None,
    amp: bool = False,
    amp_dtype: Optional[str] = None,
):
    """The config to test ``checkpoint`` with: the file + ``cfg_options`` + the options,
    checked.

    Args:
        config: config file (``mmseg::`` / ``mmdet::`` paths allowed).
        checkpoint: the checkpoint (a file, or a URL).
        work_dir: log and metrics JSON. Default: None (as :mod:`.train`).
        out: mmseg: folder for the predicted label maps; mmdet: a ``.pkl`` file for the
            raw results. Default: None.
        show_dir: folder for painted predictions. Default: None.
        show: show the painted predictions in a window. Default: False.
        show_interval: paint every N-th test batch (every N-th image at batch size 1;
            mmseg's hook counts batches; mmdet's paints every image). Default: 1.
        wait_time: seconds each shown image stays up. Default: 2.
        tta: the config's ``tta_pipeline`` / ``tta_model``. Default: False.
        cfg_options: config overrides. Default: None.
        launcher: job launcher. Default: ``'none'``.
        check_data: run the data checks on a sample of each split's files (True), on
            every file (``'all'``: every image and annotation decoded) or not (False).
            Default: True.
        max_memory: the memory budget of one test pass (``'8G'``, bytes); a whole frame
            whose estimated peak exceeds it (or, without a budget, the memory left) is
            refused before it allocates
            (:class:`~lookhere_dense.engine.memory_guard.MemoryGuardHook`). Default: None.
        amp: predict in mixed precision (:func:`use_amp_test_loop`). Default: False.
        amp_dtype: with ``amp``: ``'bfloat16'`` or ``'float16'`` (CUDA only). Default:
            None (bfloat16).

    Raises:
        lookhere_dense.errors.ConfigError, lookhere_dense.errors.DataCheckError,
        FileNotFoundError: saying what to fix.
    """
    from ..checkpoint import checkpoint_problem
    from .cli import load_config, preflight, set_work_dir
    from .train import check_launcher

    if '://' not in checkpoint:
        if not os.path.exists(checkpoint):
            raise FileNotFoundError(f'checkpoint {checkpoint!r} not found')
        problem = checkpoint_problem(checkpoint)
        if problem:
            raise ToolError(f'checkpoint {checkpoint!r} cannot be read: {problem}')
    check_launcher(launcher)
    cfg = load_config(config, cfg_options)
    cfg.launcher = launcher
    set_work_dir(cfg, work_dir, config)
    cfg.load_from = checkpoint
    if isinstance(cfg.get('visualizer'), dict):
        cfg.visualizer.pop('name', None)  # one visualizer per run (see apis/train.py)
    if show or show_dir:
        _enable_visualization(cfg, show, show_dir, show_interval, wait_time)
    if tta:
        if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
            raise ConfigError('--tta needs tta_model and tta_pipeline in the config')
        cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline
        cfg.tta_model.module = cfg.model
        cfg.model = cfg.tta_model
    if amp:
        use_amp_test_loop(cfg, amp_dtype)
    if out is not None:
        if cfg.get('default_scope') == 'mmdet':
            if not out.endswith(('.pkl', '.pickle')):
                raise ConfigError(f'--out for an mmdet config is a .pkl file, got {out!r}')
        else:
            from ..data.checks import check_output_outside_data

            check_output_outside_data(out, cfg, ('test',))
            cfg.test_evaluator['output_dir'] = out
            cfg.test_evaluator['keep_results'] = True
    hooks = list(cfg.get('custom_hooks') or [])
    present = type_names(hooks)
    hooks.append(dict(type='CheckpointFitHook', strict_load_from=True))
    if 'EvalBatchCheckHook' not in present:
        hooks.append(dict(type='EvalBatchCheckHook'))
    if 'MemoryGuardHook' not in present:
        from ..engine.memory_guard import parse_memory

        budget = None if max_memory is None else parse_memory(max_memory)
        hooks.append(dict(type='MemoryGuardHook', max_memory=budget))
    cfg.custom_hooks = hooks
    logger = (cfg.get('default_hooks') or {}).get('logger')
    if isinstance(logger, dict) and str(logger.get('type', '')).split('.')[-1] == 'LoggerHook':
        logger['type'] = 'ProgressLoggerHook'  # ~10 progress lines per pass
    # the model is loaded from the checkpoint: pretrained files are irrelevant here
    preflight(cfg, ('test',), check_pretrained=False, check_data=check_data)
    # a test builds no training loop: mmseg's SegVisualizationHook reads runner.iter,
    # which built the train loop and its dataset (a missing training folder stopped
    # --show-dir); mmengine takes these four all None together
    for key in ('train_dataloader', 'train_cfg', 'optim_wrapper', 'param_scheduler'):
        cfg[key] = None
    return cfg


def remove_incomplete_output(out: str, since: float) -> Optional[str]:
    """After a failed ``--out`` write: remove the output this run left incomplete and
    return its path (None when there is none). ``out`` as a file (mmdet's results dump)
    written since ``since`` (``time.time()``) is incomplete; in an ``out`` folder (mmseg's
    ``<image>.png`` maps), the newest PNG written since then that PIL cannot read whole
    (PIL removes a file it fails to write, but a buffered write that fails at ``close``
    on a full disk leaves it truncated). Files older than ``since`` are never touched."""
    from PIL import Image

    def fresh(path: str) -> bool:
        try:
            return os.path.getmtime(path) >= since - 1.0  # coarse file-system clocks
        except OSError:
            return False

    if os.path.isfile(out):
        candidate = out if fresh(out) else None
    elif os.path.isdir(out):
        pngs = [
            os.path.join(out, f)
            for f in os.listdir(out)
            if f.endswith('.png') and fresh(os.path.join(out, f))
        ]
        candidate = max(pngs, key=os.path.getmtime, default=None)
        if candidate is not None:
            try:
                with Image.open(candidate) as image:
                    image.load()
                candidate = None  # complete
            except (OSError, SyntaxError, ValueError):
                pass
    else:
        candidate = None
    if candidate is None:
        return None
    try:
        os.remove(candidate)
    except OSError:
        return None
    return candidate


def painted_images(folder: str, since: float) -> List[str]:
    """The images written under ``folder`` (any depth: mmseg's visualizer writes
    ``<folder>/vis_data/vis_image/``, mmdet's hook ``<folder>/``) since ``since``."""
    found = []
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            if name.lower().endswith(('.png', '.jpg', '.jpeg')):
                try:
                    if os.path.getmtime(path) >= since - 1.0:
                        found.append(path)
                except OSError:
                    continue
    return sorted(found)


def _log_painted(show_dir: str, since: float) -> None:
    from mmengine.logging import print_log

    images = painted_images(os.path.abspath(show_dir), since)
    where = os.path.dirname(images[0]) if images else os.path.abspath(show_dir)
    print_log(
        f'--show-dir: {len(images)} painted images in {where}'
        + ('' if images else ' (none written: check --show-interval and the hook)'),
        logger='current',
    )


def evaluate_checkpoint(
    config: str, checkpoint: str, out: Optional[str] = None, verbose: bool = False, **options
) -> dict:
    """Test: :func:`build_test_config` (``options`` are its other arguments), build the
    Runner, ``runner.test()`` (mmdet with ``out``: also dump the raw results).

    Args:
        verbose: show everything mmengine logs on the terminal too (default: the run
            header and library noise go to the log file only; the per-class table is
            shown). Default: False.

    Returns:
        The metrics dict.
    """
    import lookhere_dense

    lookhere_dense.register_all_modules()

    from ..engine.terminal import terminal_filter_of, warnings_to_run_log
    from .train import announce_log_file, build_runner, init_distributed

    cfg = build_test_config(config, checkpoint, out=out, **options)
    created = init_distributed(cfg)
    try:
        with warnings_to_run_log():
            runner = build_runner(cfg, quiet=not verbose)
            flt = terminal_filter_of(runner.logger)
            if flt is not None:
                flt.class_table = True  # the test's result: shown once
            announce_log_file(runner)
            if out is not None and cfg.get('default_scope') == 'mmdet':
                from mmdet.evaluation import DumpDetResults

                runner.test_evaluator.metrics.append(DumpDetResults(out_file_path=out))
            started = time.time()
            try:
                metrics = runner.test()
                painted = options.get('show_dir')
                if painted:
                    _log_painted(painted, started)
                return metrics
            except OSError as err:  # writing --out: a full disk, a folder gone, ...
                if out is None or err.errno is None:
                    raise
                name = getattr(err, 'filename', None)
                if name and not path_inside(str(name), [out]):
                    raise  # another file (an image, the checkpoint): not the output's fault
                from ..checkpoint.atomic import describe_os_error

                broken = remove_incomplete_output(out, started)
                raise ToolError(
                    f'--out {out!r}: could not write the predictions: '
                    f'{describe_os_error(err)}; '
                    + (
                        f'the incomplete {broken!r} is removed'
                        if broken
                        else 'no incomplete file is left there'
                    )
                ) from None
    finally:
        if created:
            import torch.distributed as dist

            dist.destroy_process_group()
