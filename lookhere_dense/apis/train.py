"""Train a segmentor (mmseg config) or detector (mmdet config) with mmengine's Runner
(``tools/train.py``).

Before the Runner is built the config is checked (:func:`lookhere_dense.apis.cli.preflight`):
unknown model types, heads that cannot read the backbone, missing dataset folders, label
values outside the classes and crops larger than the images stop with a message that says
what to fix. Pretrained files the config names but that are not there stop the run too
(``allow_random_init``: dropped with a warning, training starts from random weights).

Every run also gets (:mod:`lookhere_dense.engine.hooks`): a stop at the first NaN / Inf
loss, bit-exact resume (RNG and sampler state in the checkpoints), strict checkpoint
loading on resume, loss lines at least every tenth of a short schedule and about ten
progress lines per validation; a backbone that learns its LookHere slopes
(``lh_config.learnable_slopes=True``) also gets their report
(:class:`~lookhere_dense.engine.slope_logging.LookHereSlopeLoggerHook`). The terminal shows what a person acts on; the run's log
file keeps everything mmengine logs (:mod:`lookhere_dense.engine.terminal`).

``--resume`` (``resume='auto'``) continues from the newest readable checkpoint of the work
dir: an unreadable (truncated, corrupt) newest checkpoint is skipped with a warning, and a
work dir without any checkpoint starts from iteration 0 with a warning (as mmengine does,
so a job script can always pass ``--resume``); a work dir whose checkpoints are all
unreadable is an error. Only the work dir's own checkpoints count: a ``last_checkpoint``
naming a file in another folder (a work dir copied with ``cp -r``) is ignored with a
warning naming both. ``--resume PATH`` of a file without the optimizer's state (a
``save_best`` file: its warm-up would restart) is refused, naming ``load_from=`` for a new
run from its weights; a local ``load_from`` file that is missing or cannot be read stops
before the Runner, in one line.

Faults of real machines lose nothing (``docs/faults.md``): checkpoints and
``last_checkpoint`` are written atomically (a full disk, a file-size limit, a read-only or
removed folder leave the previous ones intact, with an error naming the file and the
cause); SIGTERM / SIGINT save the iteration that ends and stop with one line (status
128 + signal); a second run in the work dir of a live one is refused (``share_work_dir``);
a training step or validation pass whose estimated peak memory exceeds what is left (or
``max_memory``) is refused before it allocates; a rank or dataloader worker that dies ends
the run in one line naming the last checkpoint.

``launcher='pytorch'`` (``torchrun``) trains with NCCL on GPUs and with Gloo on CPU-only
machines (the process group is set up before the Runner, so mmengine's CUDA-only set-up is
not used there).
"""

from __future__ import annotations

import glob
import logging
import os
import os.path as osp
import re
from typing import List, Mapping, Optional, Tuple, Union

from ..errors import CheckpointError, ConfigError, ToolError
from ..registry import type_names
from ..validation import path_inside, positive_pair

__all__ = [
    'build_train_config',
    'build_runner',
    'apply_amp',
    'train_model',
    'find_resume_checkpoint',
    'earlier_run_note',
    'checkpoint_folder',
    'init_distributed',
    'check_launcher',
    'announce_log_file',
    'learns_slopes',
    'lock_work_dir',
    'launcher_rank',
    'TRAIN_HOOKS',
    'SLOPE_HOOK',
]

#: The hooks every training run gets (unless the config already has them).
TRAIN_HOOKS = (
    'FiniteLossHook',
    'ExactResumeHook',
    'CheckpointFitHook',
    'SignalCheckpointHook',
    'EvalBatchCheckHook',
)
#: The hook a run whose backbone learns its LookHere slopes gets too
#: (:mod:`lookhere_dense.engine.slope_logging`).
SLOPE_HOOK = 'LookHereSlopeLoggerHook'
#: Environment variables ``torchrun`` sets for ``launcher='pytorch'``.
TORCHRUN_ENV = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
#: Where each launcher's processes find their rank before mmengine's ``init_dist`` sets
#: ``RANK`` (``mmengine.dist.utils``: ``_init_dist_pytorch`` / ``_slurm`` / ``_mpi``):
#: torchrun's ``RANK``, srun's ``SLURM_PROCID``, Open MPI's ``OMPI_COMM_WORLD_RANK``
#: (``PMI_RANK``: MPICH, Intel MPI); the first one set counts.
LAUNCHER_RANK_ENV = {
    'pytorch': ('RANK',),
    'slurm': ('SLURM_PROCID',),
    'mpi': ('OMPI_COMM_WORLD_RANK', 'PMI_RANK'),
}


def _warn(msg: str) -> None:
    from .cli import log_rank0

    log_rank0(msg, logging.WARNING)


def _checkpoint_number(path: str) -> int:
    m = re.search(r'(\d+)\.pth$', osp.basename(path))
    return int(m.group(1)) if m else -1


def checkpoint_folder(cfg) -> Optional[str]:
    """Where the config's checkpoint hook writes when it is not the work dir: mmengine's
    ``default_hooks.checkpoint.out_dir`` joined with the work dir's last folder name (None
    without an ``out_dir``)."""
    hook = (cfg.get('default_hooks') or {}).get('checkpoint')
    out_dir = hook.get('out_dir') if isinstance(hook, dict) else None
    if not out_dir:
        return None
    work_dir = osp.abspath(cfg.work_dir)
    if out_dir == work_dir:
        return None
    name = osp.basename(work_dir.rstrip(osp.sep))
    return f'{out_dir.rstrip("/")}/{name}' if '://' in out_dir else osp.join(out_dir, name)


def _resume_refusal(path: str) -> Optional[str]:
    """Why ``--resume path`` (readable: :func:`~lookhere_dense.checkpoint.checkpoint_problem`)
    cannot resume a run, or None; the file's head is read once, its tensors memory-mapped:

    * no ``meta`` (a weights-only file: mmengine failed with ``KeyError: 'meta'``);
    * neither the optimizer's nor the LR schedulers' state (a ``CheckpointHook``'s
      ``save_best`` file: mmengine would resume with a fresh optimizer and restart the
      warm-up, silently). A ``save_optimizer=False`` checkpoint of the run keeps its
      schedulers: mmengine resumes it (a fresh optimizer state, the LR schedule where it
      was), as it always did.
    """
    from ..checkpoint import checkpoint_head

    ckpt = checkpoint_head(path)
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get('meta'), dict):
        return (
            f'--resume checkpoint {path!r} holds weights only (no iteration, optimizer '
            "or schedule: not a training run's iter_N.pth): to train from these weights, "
            f'start a new run with --cfg-options load_from={path}'
        )
    if 'optimizer' not in ckpt and 'param_schedulers' not in ckpt:
        return (
            f'--resume checkpoint {path!r} holds no optimizer or LR scheduler state (weights '
            'only, as a save_best file: the LR schedule would restart): resume from one of the '
            "run's iteration checkpoints (WORK_DIR/iter_N.pth), or start a new run from its "
            f'weights with --cfg-options load_from={path}'
        )
    return None


def _check_load_from(cfg) -> None:
    """A local ``load_from`` file that is missing or cannot be read is an error naming
    ``load_from`` (:func:`~lookhere_dense.checkpoint.checkpoint_problem`: the reader
    ``--resume`` uses), before the Runner starts."""
    from ..checkpoint import checkpoint_problem

    path = cfg.get('load_from')
    if not isinstance(path, str) or not path or '://' in path:
        return
    path = osp.expanduser(path)  # as mmengine's local loader does
    if not osp.exists(path):
        raise FileNotFoundError(f'load_from checkpoint {path!r} not found')
    problem = checkpoint_problem(path)
    if problem:
        raise ToolError(f'load_from checkpoint {path!r} cannot be read: {problem}')


def find_resume_checkpoint(
    work_dir: str, checkpoint_dir: Optional[str] = None
) -> Tuple[Optional[str], List[str]]:
    """The checkpoint ``--resume`` continues from: the one mmengine's ``last_checkpoint``
    names, else the newest ``iter_*.pth`` / ``epoch_*.pth``; unreadable ones
    (:func:`lookhere_dense.checkpoint.checkpoint_problem`) are skipped for the next older
    one -- older than the one ``last_checkpoint`` names: files numbered after it are an
    earlier run's (a fresh run in the same work dir leaves them), not this run's. Only
    checkpoints of this work dir count: a ``last_checkpoint`` that names a file
    elsewhere (a work dir copied or moved from another run's) is ignored with a note.

    Args:
        work_dir: the work dir.
        checkpoint_dir: where the checkpoints are written when that is not the work dir
            (:func:`checkpoint_folder`: mmengine's ``out_dir``). Default: None.

    Returns:
        ``(path or None, warnings)``.

    Raises:
        lookhere_dense.apis.cli.ToolError: the work dir has checkpoints but none is
            readable, or only a ``last_checkpoint`` that names a file elsewhere.
    """
    from ..checkpoint import checkpoint_problem
    from ..engine.checkpointing import POINTER_FILE, read_pointer

    folders = [work_dir] + ([checkpoint_dir] if checkpoint_dir else [])
    candidates: List[str] = []
    ignored = None  # the file last_checkpoint names when it is outside this work dir
    last = osp.join(work_dir, POINTER_FILE)
    named = read_pointer(work_dir)
    if named:
        if path_inside(named, folders):
            candidates.append(named)
        else:
            ignored = named
    numbered = []
    for folder in folders:
        if '://' not in folder:
            numbered += glob.glob(osp.join(folder, 'iter_*.pth'))
            numbered += glob.glob(osp.join(folder, 'epoch_*.pth'))
    # the run last_checkpoint names wrote nothing numbered after it: higher numbers are
    # an earlier run's (a fresh run in its work dir), not this run's state to fall back to
    limit = _checkpoint_number(candidates[0]) if candidates else -1
    later: List[str] = []
    for path in sorted(numbered, key=_checkpoint_number, reverse=True):
        if not any(osp.abspath(path) == osp.abspath(c) for c in candidates):
            (later if 0 <= limit <= _checkpoint_number(path) else candidates).append(path)
    where = ' or '.join(repr(f) for f in folders)
    notes: List[str] = []
    outside = (
        f'{last} names {ignored}, which is outside the work dir {where} (copied or moved '
        "from another run's work dir?)"
    )
    earlier_run = (
        f'not from {", ".join(osp.basename(p) for p in later)}: numbered after '
        f'{osp.basename(candidates[0])}, which {last} names, so left from an earlier run'
        if later
        else ''
    )
    skipped: List[str] = []
    for path in candidates:
        problem = checkpoint_problem(path)
        if problem is None:
            if ignored:
                notes.append(f'--resume: {outside}: ignored; resuming from {path}')
            if skipped:
                notes.append(
                    f'--resume: skipped unreadable checkpoint(s) {"; ".join(skipped)}'
                    f'; resuming from {path}' + (f' ({earlier_run})' if later else '')
                )
            return path, notes
        skipped.append(f'{path} ({problem})')
    if skipped:
        raise ToolError(
            f'--resume: no readable checkpoint in {where}: '
            + '; '.join(skipped)
            + (f' (and {outside}: not used)' if ignored else '')
            + (f' ({earlier_run})' if later else '')
            + '. Resume from a good file with --resume '
            'PATH, or remove the broken ones to start from iteration 0.'
        )
    if ignored:
        raise ToolError(
            f'--resume: no checkpoint in {where}, and {outside}. To continue from that '
            f'file pass --resume {ignored}; to start from iteration 0 remove {last}.'
        )
    notes.append(
        f'--resume: no checkpoint in {work_dir!r}, so training starts from '
        'iteration 0 (check --work-dir if you expected to continue a run)'
    )
    return None, notes


def check_launcher(launcher: str) -> None:
    """A launcher whose environment is missing is an error naming what to run.

    Raises:
        lookhere_dense.apis.cli.ToolError: ``'pytorch'`` outside torchrun, ``'slurm'`` outside
            srun.
    """
    if launcher == 'pytorch':
        missing = [k for k in TORCHRUN_ENV if k not in os.environ]
        if missing:
            raise ToolError(
                f'--launcher pytorch must run under torchrun (the variables {missing} that '
                'torchrun sets are missing), e.g. torchrun --nproc_per_node=2 tools/train.py '
                'CONFIG --launcher pytorch; for one process use --launcher none'
            )
    elif launcher == 'slurm' and 'SLURM_PROCID' not in os.environ:
        raise ToolError('--launcher slurm must run under srun (SLURM_PROCID is not set)')


def learns_slopes(cfg) -> bool:
    """Whether the config's backbone learns its LookHere slopes
    (``model.backbone.lh_config.learnable_slopes=True``)."""
    model = cfg.get('model') or {}
    backbone = model.get('backbone') if isinstance(model, dict) else None
    lh_config = backbone.get('lh_config') if isinstance(backbone, dict) else None
    return isinstance(lh_config, dict) and lh_config.get('learnable_slopes') is True


def _add_hooks(cfg) -> None:
    """:data:`TRAIN_HOOKS`, and :data:`SLOPE_HOOK` when the backbone learns its slopes,
    unless the config has them already."""
    hooks = list(cfg.get('custom_hooks') or [])
    present = type_names(hooks)
    wanted = TRAIN_HOOKS + ((SLOPE_HOOK,) if learns_slopes(cfg) else ())
    hooks += [dict(type=name) for name in wanted if name not in present]
    cfg.custom_hooks = hooks


def _atomic_checkpoints(cfg) -> None:
    """mmengine's ``CheckpointHook`` in ``default_hooks.checkpoint`` becomes
    :class:`~lookhere_dense.engine.checkpointing.AtomicCheckpointHook` (same options;
    writes to a temporary name, fsync, rename; old checkpoints removed only after the new
    one is complete)."""
    hook = (cfg.get('default_hooks') or {}).get('checkpoint')
    if isinstance(hook, dict) and str(hook.get('type', '')).split('.')[-1] == 'CheckpointHook':
        hook['type'] = 'AtomicCheckpointHook'


def _add_memory_guard(cfg, max_memory) -> None:
    """:class:`~lookhere_dense.engine.memory_guard.MemoryGuardHook` with the budget (unless
    the config has one): every training step and validation pass is checked against the
    memory left (or ``max_memory``) before it allocates."""
    hooks = list(cfg.get('custom_hooks') or [])
    if 'MemoryGuardHook' not in type_names(hooks):
        hooks.append(dict(type='MemoryGuardHook', max_memory=max_memory))
    cfg.custom_hooks = hooks


def _tune_logging(cfg) -> None:
    """Loss lines at least every tenth of the schedule (``interval = min(interval,
    max(1, max_iters // 10))`` for iteration-based loops) and about ten progress lines
    per validation (:class:`~lookhere_dense.engine.hooks.ProgressLoggerHook`)."""
    logger = (cfg.get('default_hooks') or {}).get('logger')
    if not isinstance(logger, dict) or str(logger.get('type', '')).split('.')[-1] not in (
        'LoggerHook',
        'ProgressLoggerHook',
    ):
        return
    logger['type'] = 'ProgressLoggerHook'
    train_cfg = cfg.get('train_cfg') or {}
    max_iters = train_cfg.get('max_iters')
    if isinstance(max_iters, int) and max_iters > 0:
        logger['interval'] = min(int(logger.get('interval', 10)), max(1, max_iters // 10))


#: The optimizer wrappers that train in mixed precision: mmengine's and ours (also on CPU).
AMP_WRAPPERS = ('AmpOptimWrapper', 'MixedPrecisionOptimWrapper')


def apply_amp(cfg, amp: bool = False, dtype: Optional[str] = None) -> List[str]:
    """Mixed precision in ``cfg.optim_wrapper``, the same way on every machine.

    * ``amp`` (``--amp``): an ``OptimWrapper`` becomes
      :class:`~lookhere_dense.engine.amp.MixedPrecisionOptimWrapper` with ``dtype``
      (float16 also gets a dynamic loss scale); a config that is already mixed precision
      gets ``dtype``;
    * a config's ``AmpOptimWrapper`` becomes ``MixedPrecisionOptimWrapper`` (same
      arguments), with a note: where mmengine's wrapper refuses (no CUDA, NPU, MLU, MUSA)
      it trains in bfloat16 autocast; elsewhere it is mmengine's wrapper with a detector's
      heads, boxes and losses in float32 (:func:`~..engine.amp.float32_detection_heads`);
    * the dtype is checked for the machine: float16 on CPU is refused;
    * an ``OptimWrapper`` left with a mixed-precision config's ``dtype`` / ``loss_scale``
      (switched with ``--cfg-options optim_wrapper.type=OptimWrapper``, which cannot
      remove keys) trains in float32 without them, with a note.

    Args:
        cfg: the config (changed in place).
        amp: switch mixed precision on. Default: False.
        dtype: with ``amp``: ``'bfloat16'`` or ``'float16'``. Default: None (bfloat16).

    Returns:
        Notes on what was changed (to log).

    Raises:
        lookhere_dense.errors.ConfigError: float16 on CPU, an unknown dtype, ``amp`` with
            an optimizer wrapper that is neither ``OptimWrapper`` nor mixed precision.
    """
    from ..engine.amp import accelerator_available, amp_dtype

    device_type = 'cuda' if accelerator_available() else 'cpu'
    wrapper = cfg.get('optim_wrapper')
    kind = str((wrapper or {}).get('type', 'OptimWrapper')).split('.')[-1]
    notes: List[str] = []
    if amp:
        dtype = dtype or 'bfloat16'
        amp_dtype(dtype, device_type, '--amp-dtype')
        if not isinstance(wrapper, dict):
            raise ConfigError('--amp needs an optim_wrapper section in the config')
        if kind not in AMP_WRAPPERS + ('OptimWrapper',):
            raise ConfigError(
                f'--amp works with optim_wrapper type OptimWrapper (made mixed precision) or '
                f'{" / ".join(AMP_WRAPPERS)} (its dtype set), the config has {kind!r}'
            )
        if kind in AMP_WRAPPERS and wrapper.get('dtype') not in (None, dtype):
            notes.append(f'--amp-dtype {dtype} replaces optim_wrapper.dtype={wrapper.dtype!r}')
        if kind == 'OptimWrapper':
            wrapper.type = 'MixedPrecisionOptimWrapper'
            kind = wrapper.type
        wrapper.dtype = dtype
        if dtype == 'float16':
            wrapper.setdefault('loss_scale', 'dynamic')
    if kind == 'OptimWrapper' and isinstance(wrapper, dict):
        # a mixed-precision config switched to float32 (--cfg-options
        # optim_wrapper.type=OptimWrapper, which cannot remove its dtype / loss_scale)
        left = [k for k in ('dtype', 'loss_scale') if k in wrapper]
        if left:
            notes.append(
                f'optim_wrapper.type=OptimWrapper trains in float32: '
                f'{", ".join(f"{k}={wrapper[k]!r}" for k in left)} dropped'
            )
            for key in left:
                wrapper.pop(key)
    if kind == 'ApexOptimWrapper' and not _apex_installed():
        raise ConfigError(  # mmengine: a bare 'AssertionError: Apex is not installed'
            "optim_wrapper.type='ApexOptimWrapper' needs NVIDIA apex, which is not "
            "installed: use type='AmpOptimWrapper' (PyTorch's own mixed precision; bfloat16 "
            'on CPU) or tools/train.py --amp with type=OptimWrapper'
        )
    if kind in AMP_WRAPPERS:
        amp_dtype(wrapper.get('dtype'), device_type, 'optim_wrapper.dtype')
        if device_type == 'cpu' and 'loss_scale' in wrapper:
            notes.append(
                f'optim_wrapper.loss_scale={wrapper.loss_scale!r} is not used on CPU: '
                "bfloat16 has float32's exponent range and trains without loss scaling"
            )
        if kind == 'AmpOptimWrapper':
            wrapper.type = 'MixedPrecisionOptimWrapper'
            notes.append(
                "optim_wrapper: mmengine's AmpOptimWrapper needs a GPU; on this CPU "
                'MixedPrecisionOptimWrapper trains in bfloat16 autocast instead'
                if device_type == 'cpu'
                else 'optim_wrapper: AmpOptimWrapper -> MixedPrecisionOptimWrapper '
                "(mmengine's, with a detector's heads, boxes and losses in float32)"
            )
    return notes


def _apex_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec('apex') is not None


def build_train_config(
    config: str,
    work_dir: Optional[str] = None,
    cfg_options: Optional[dict] = None,
    launcher: str = 'none',
    amp: bool = False,
    amp_dtype: Optional[str] = None,
    resume: Optional[str] = None,
    require_pretrained: bool = False,
    check_data: Union[bool, str] = True,
    allow_random_init: bool = False,
    hooks: bool = True,
    max_memory: Optional[str] = None,
) -> Tuple[object, List[str]]:
    """The config to train with: the file (``mmseg::`` / ``mmdet::`` paths allowed) +
    ``cfg_options`` + the options below, checked.

    Args:
        config: config file.
        work_dir: logs and checkpoints. Default: None (the config's ``work_dir``, else
            ``work_dirs/<config name>``).
        cfg_options: config overrides. Default: None.
        launcher: ``'none'``, ``'pytorch'`` (under torchrun), ``'slurm'`` or ``'mpi'``.
            Default: ``'none'``.
        amp: mixed precision (:func:`apply_amp`: bfloat16 autocast on CPU or CUDA,
            float16 with a dynamic loss scale on CUDA). Default: False.
        amp_dtype: with ``amp``: ``'bfloat16'`` or ``'float16'`` (CUDA only). Default:
            None (bfloat16).
        resume: ``'auto'`` (the newest readable checkpoint in the work dir:
            :func:`find_resume_checkpoint`), a checkpoint path, or None (no resume).
            Default: None.
        require_pretrained: kept for compatibility (a missing pretrained file is an error
            unless ``allow_random_init``). Default: False.
        check_data: run the data checks on a sample of each split's files (True), on
            every file (``'all'``: every image and annotation decoded) or not (False).
            Default: True.
        allow_random_init: a pretrained file the config names but that is missing is
            dropped with a warning (training from random weights) instead of an error.
            Default: False.
        hooks: add :data:`TRAIN_HOOKS` (and :data:`SLOPE_HOOK` for learnable slopes),
            atomic checkpoint writes, the memory guard and the progress logging.
            Default: True.
        max_memory: the memory budget of a pass (``'8G'``, bytes; checked by
            :class:`~lookhere_dense.engine.memory_guard.MemoryGuardHook`). Default: None
            (the memory the machine or its cgroup has left).

    Returns:
        ``(cfg, warnings)``: the config, and the warnings printed while checking it (to
        repeat in the run's log).

    Raises:
        lookhere_dense.errors.ConfigError, lookhere_dense.errors.DataCheckError,
        FileNotFoundError, lookhere_dense.apis.cli.ToolError: saying what to fix.
    """
    from ..checkpoint import checkpoint_problem
    from ..config_checks import check_optim_wrapper_keys
    from .cli import load_config, preflight, set_work_dir

    check_launcher(launcher)
    cfg = load_config(config, cfg_options)
    cfg.launcher = launcher
    set_work_dir(cfg, work_dir, config)
    if isinstance(cfg.get('visualizer'), dict):
        # mmseg / mmdet configs name their visualizer 'visualizer'; a named instance is
        # reused by every later Runner in the process (logging into the first run's
        # folder). Without the name each run gets its own, named after the experiment.
        cfg.visualizer.pop('name', None)
    notes: List[str] = apply_amp(cfg, amp, amp_dtype)
    check_optim_wrapper_keys(cfg)
    for msg in notes:
        _warn(msg)
    if resume == 'auto':
        path, found = find_resume_checkpoint(cfg.work_dir, checkpoint_folder(cfg))
        for msg in found:
            _warn(msg)
        notes += found
        cfg.resume = path is not None
        if path is not None:
            cfg.load_from = path  # else the config's load_from (if any) initialises
    elif resume is not None:
        if not osp.exists(resume):
            raise FileNotFoundError(f'--resume checkpoint {resume!r} not found')
        problem = checkpoint_problem(resume)
        if problem:
            raise ToolError(f'--resume checkpoint {resume!r} cannot be read: {problem}')
        refusal = _resume_refusal(resume)
        if refusal:
            raise ToolError(refusal)
        cfg.resume = True
        cfg.load_from = resume
    elif not cfg.get('resume'):  # the config's resume=True resumes from last_checkpoint
        earlier = earlier_run_note(cfg.work_dir, checkpoint_folder(cfg))
        if earlier:
            _warn(earlier)
            notes.append(earlier)
    if hooks:
        _add_hooks(cfg)
        _atomic_checkpoints(cfg)
        if max_memory is not None:
            from ..engine.memory_guard import parse_memory

            max_memory = parse_memory(max_memory)  # a bad size stops here
        _add_memory_guard(cfg, max_memory)
        _tune_logging(cfg)
    if cfg.get('resume') and cfg.get('load_from'):
        # the resumed checkpoint replaces the pretrained weights: a missing file is moot
        from ..config_checks import drop_missing_pretrained

        for path in drop_missing_pretrained(cfg, lambda msg: None):
            moot = (
                f'pretrained file {path!r} not found: not needed, the weights come from the '
                f'resumed checkpoint {cfg.load_from!r}'
            )
            _warn(moot)
            notes.append(moot)
    dropped = preflight(
        cfg,
        ('train', 'val'),
        require_pretrained=require_pretrained,
        check_data=check_data,
        allow_random_init=allow_random_init,
        notes=notes,
    )
    notes += [
        f'pretrained file {path!r} not found: the backbone starts from RANDOM weights '
        '(allowed by --allow-random-init)'
        for path in dropped
    ]
    return cfg, notes


def earlier_run_note(work_dir: str, checkpoint_dir: Optional[str] = None) -> Optional[str]:
    """The warning for a run started without ``--resume`` in a work dir where an earlier
    run left checkpoints (its ``last_checkpoint`` names one that exists, in the work dir or
    ``checkpoint_dir``, mmengine's ``out_dir`` folder: :func:`checkpoint_folder`; in a work
    dir copied from another run's, whose pointer names a file there, its own newest): this
    run starts from iteration 0 and its checkpoints replace that run's of the same
    iterations (as in mmengine, which says nothing). None otherwise."""
    from ..engine.checkpointing import read_pointer

    last = read_pointer(work_dir)
    if last is None or not osp.isfile(last):
        return None
    folders = [work_dir] + ([checkpoint_dir] if checkpoint_dir else [])
    if not path_inside(last, folders):  # a work dir copied from another run's
        own = [
            path
            for folder in folders
            if '://' not in folder
            for pattern in ('iter_*.pth', 'epoch_*.pth')
            for path in glob.glob(osp.join(folder, pattern))
        ]
        if not own:
            return None
        last = max(own, key=_checkpoint_number)
    return (
        f'the work dir {work_dir!r} holds checkpoints of an earlier run (the newest: '
        f'{last}); this run starts from iteration 0 without --resume and its checkpoints '
        'replace those of the same iterations. --resume continues that run; another '
        '--work-dir keeps both'
    )


def init_distributed(cfg) -> bool:
    """For ``cfg.launcher == 'pytorch'`` on a machine without CUDA: start the Gloo
    process group from torchrun's environment and make the model wrapper a CPU
    ``MMDistributedDataParallel`` (``device_ids=None``), before the Runner is built.
    mmengine then skips its own ``init_dist`` (which calls ``torch.cuda.set_device``).
    With CUDA, mmengine's set-up (NCCL by default) is used unchanged.

    Returns:
        True when this call created the process group (destroy it when done).
    """
    if cfg.get('launcher') != 'pytorch':
        return False
    import torch
    import torch.distributed as dist

    if torch.cuda.is_available():
        return False
    env_cfg = cfg.setdefault('env_cfg', {})
    dist_cfg = env_cfg.setdefault('dist_cfg', {})
    if dist_cfg.get('backend', 'nccl') != 'gloo':
        dist_cfg['backend'] = 'gloo'
    wrapper = dict(cfg.get('model_wrapper_cfg') or dict(type='MMDistributedDataParallel'))
    wrapper.setdefault('device_ids', None)
    wrapper.setdefault('broadcast_buffers', False)
    wrapper.setdefault('find_unused_parameters', bool(cfg.get('find_unused_parameters', False)))
    cfg.model_wrapper_cfg = wrapper
    if dist.is_initialized():
        return False
    import datetime

    timeout = dist_cfg.get('timeout')
    kwargs = dict(timeout=datetime.timedelta(seconds=timeout)) if timeout else {}
    dist.init_process_group(backend='gloo', **kwargs)
    return True


def build_runner(cfg, quiet: bool = True):
    """The config's ``runner_type`` (from mmengine's ``RUNNERS``), else
    :class:`~lookhere_dense.engine.runner.ToolRunner` (mmengine's Runner; ``quiet``: the run
    header, config dump and library noise go to the log file only)."""
    from ..engine.runner import ToolRunner, VerboseToolRunner
    from ..engine.terminal import attach_terminal_filter

    if 'runner_type' in cfg:
        from mmengine.registry import RUNNERS

        runner = RUNNERS.build(cfg)
        if quiet:
            attach_terminal_filter(runner.logger)
        return runner
    return (ToolRunner if quiet else VerboseToolRunner).from_cfg(cfg)


def announce_log_file(runner) -> None:
    """Tell the terminal where the full log is."""
    path = osp.join(runner.log_dir, f'{runner.timestamp}.log')
    runner.logger.info(
        f'work dir: {runner.work_dir}; full log (config, environment, per-class tables): {path}'
    )


def launcher_rank(launcher: str, environ: Optional[Mapping[str, str]] = None) -> int:
    """This process's rank in a job started by ``launcher``, read from the variable that
    launcher sets (:data:`LAUNCHER_RANK_ENV`), before mmengine's ``init_dist`` sets
    ``RANK``: ``'none'``: 0; ``'pytorch'``: ``RANK`` (torchrun); ``'slurm'``:
    ``SLURM_PROCID`` (srun); ``'mpi'``: ``OMPI_COMM_WORLD_RANK`` (Open MPI), else
    ``PMI_RANK`` (MPICH, Intel MPI). 0 where the launcher's variable is not set (one
    process).

    Args:
        launcher: ``'none'``, ``'pytorch'``, ``'slurm'`` or ``'mpi'``.
        environ: the environment. Default: None (``os.environ``).

    Raises:
        lookhere_dense.errors.ToolError: another launcher, or a rank that is not a
            number.
    """
    environ = os.environ if environ is None else environ
    if launcher == 'none':
        return 0
    if launcher not in LAUNCHER_RANK_ENV:
        raise ToolError(
            f'unknown launcher {launcher!r}: use one of '
            f'{", ".join(repr(k) for k in ("none", *LAUNCHER_RANK_ENV))}'
        )
    for name in LAUNCHER_RANK_ENV[launcher]:
        value = environ.get(name)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ToolError(
                    f'--launcher {launcher}: {name}={value!r} is not a process rank (a number)'
                ) from None
    return 0


def lock_work_dir(work_dir: str, share: bool = False, launcher: Optional[str] = None):
    """Take the work dir's lock (:class:`~lookhere_dense.engine.workdir_lock.WorkDirLock`)
    on rank 0 (:func:`launcher_rank` of ``launcher``); None when ``share`` or on other
    ranks. Rank 0 checks that the work dir can be written in any case
    (:func:`~lookhere_dense.engine.workdir_lock.check_work_dir_writable`).

    Args:
        work_dir: the work dir.
        share: take no lock (``--share-work-dir``). Default: False.
        launcher: the run's launcher (``cfg.launcher``: ``'none'``, ``'pytorch'``,
            ``'slurm'``, ``'mpi'``); the rank comes from the variable it sets (under srun or
            mpirun mmengine sets ``RANK`` only later, in ``init_dist``). Default: None
            (``RANK``, torchrun's; unset outside a job: rank 0).

    Raises:
        lookhere_dense.errors.WorkDirLockedError: another live run holds it.
        lookhere_dense.errors.ToolError: the work dir cannot be written (naming the cause),
            or :func:`launcher_rank` cannot tell the rank.
    """
    if launcher_rank('pytorch' if launcher is None else launcher) != 0:
        return None
    from ..engine.workdir_lock import WorkDirLock, check_work_dir_writable

    if share:
        check_work_dir_writable(work_dir)
        return None
    lock = WorkDirLock(work_dir).acquire()
    for msg in lock.notes:
        _warn(msg)
    return lock


def train_model(config: str, verbose: bool = False, share_work_dir: bool = False, **options):
    """Train: :func:`build_train_config` (``options`` are its arguments), lock the work
    dir (:func:`lock_work_dir`), set up distributed training (:func:`init_distributed`),
    build the Runner, repeat the checks' warnings into the run's log, ``runner.train()``.

    Args:
        config: config file.
        verbose: show everything mmengine logs on the terminal too. Default: False.
        share_work_dir: train even when another live run holds the work dir (no lock is
            taken). Default: False.
        **options: :func:`build_train_config`'s arguments.

    Returns:
        The Runner (its ``work_dir`` holds logs and checkpoints).

    Raises:
        lookhere_dense.errors.WorkDirLockedError: another run trains in the work dir.
        lookhere_dense.errors.ToolError: the work dir cannot be written (read-only,
            immutable, no permission, a path under a file).
        lookhere_dense.errors.TrainingInterruptedError: SIGTERM / SIGINT stopped the run
            (after saving the iteration it ended).
        lookhere_dense.errors.CheckpointSaveError: a checkpoint could not be written.
        FileNotFoundError, lookhere_dense.errors.ToolError: a local ``load_from`` file
            that is missing or cannot be read (truncated, corrupt), before the Runner.
        lookhere_dense.errors.CheckpointError: ``--resume`` from a checkpoint whose
            optimizer state does not fit (another number of parameter groups, another
            optimizer type: :func:`lookhere_dense.engine.hooks.optimizer_state_problem`), before the first step.
    """
    import lookhere_dense

    lookhere_dense.register_all_modules()
    cfg, notes = build_train_config(config, **options)
    _check_load_from(cfg)
    lock = lock_work_dir(cfg.work_dir, share_work_dir, launcher=cfg.get('launcher', 'none'))
    notes += lock.notes if lock is not None else []
    try:
        return _train(cfg, notes, verbose)
    finally:
        if lock is not None:
            lock.release()


#: What Gloo / NCCL say when another process of the job is gone.
_PEER_LOST = (
    'Connection closed by peer',
    'Connection reset by peer',
    'NCCL communicator was aborted',
)


def _lost_process(err: BaseException, cfg) -> Optional[str]:
    """One line for training stopped because another process died: a rank of the job (a
    collective failed) or a dataloader worker (else None)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ''
    if first.startswith('DataLoader worker (pid'):
        what = f'a dataloader worker died ({first.strip()})'
    elif cfg.get('launcher') != 'none' and any(s in str(err) for s in _PEER_LOST):
        what = (
            f'rank {os.environ.get("RANK", "?")} stopped: another process of this job died '
            f'({first[:160]}); the torchrun summary names it'
        )
    else:
        return None
    from ..engine.checkpointing import read_pointer

    last = read_pointer(cfg.work_dir)
    return f'{what}. The last complete checkpoint is ' + (
        f'{last}: continue with --resume.' if last else 'none: start again.'
    )


def training_input_size(cfg) -> Optional[Tuple[int, int]]:
    """``(H, W)`` of the images a training step feeds the model, as far as the config
    says: ``model.data_preprocessor.size`` (mmseg pads every crop to it), else a
    fixed-size batch pad (mmdet's ``BatchFixedSizePad``: LSJ), else the config's
    ``crop_size``, else the train pipeline's ``RandomCrop``; None where none says (the
    attention line is then left out)."""
    model = cfg.get('model') or {}
    pre = model.get('data_preprocessor') or {}
    pads = [
        aug.get('size')
        for aug in pre.get('batch_augments') or []
        if str(aug.get('type', '')).endswith('BatchFixedSizePad')
    ]
    dataset = (cfg.get('train_dataloader') or {}).get('dataset') or {}
    while isinstance(dataset.get('dataset'), Mapping):  # wrappers
        dataset = dataset['dataset']
    crops = [
        step.get('crop_size')
        for step in dataset.get('pipeline') or []
        if isinstance(step, Mapping) and str(step.get('type', '')).endswith('RandomCrop')
    ]
    for value in (pre.get('size'), *pads, cfg.get('crop_size'), *crops):
        size = positive_pair(value, single=True)
        if size is not None:
            return size
    return None


def _train(cfg, notes: List[str], verbose: bool):
    """Set up distributed training, build the Runner, log ``notes``, train (a resumed
    checkpoint of another optimizer type stops before the first step:
    :func:`lookhere_dense.engine.hooks.optimizer_state_problem`)."""
    from ..engine.amp import train_autocast_dtype
    from ..engine.hooks import OptimizerStateCheckHook
    from ..engine.preemption import release_signal_handlers
    from ..engine.terminal import warnings_to_run_log
    from ..lookhere.attention import backend_summary

    created = init_distributed(cfg)
    try:
        with warnings_to_run_log():
            runner = build_runner(cfg, quiet=not verbose)
            announce_log_file(runner)
            crop = training_input_size(cfg)
            if crop:  # which attention backend each layer runs, one line
                line = backend_summary(
                    runner.model,
                    crop,
                    training=True,
                    dtype=train_autocast_dtype(cfg.get('optim_wrapper')),
                    # images per step of one process; not reported where the config has none
                    batch=(cfg.get('train_dataloader') or {}).get('batch_size'),
                )
                if line:
                    runner.logger.info(line)
            for msg in notes:  # repeat the warnings where the run's log file gets them
                runner.logger.warning(msg, extra=dict(file_only=True))
            if cfg.get('resume'):
                runner.register_hook(OptimizerStateCheckHook(), priority='HIGHEST')
            try:
                runner.train()
            except RuntimeError as err:
                lost = _lost_process(err, cfg)
                if lost is None:
                    raise
                raise ToolError(lost) from err
            except ValueError as err:
                if 'different number of parameter groups' not in str(err):
                    raise
                raise CheckpointError(  # torch's optimizer, loading the resumed state
                    '--resume: the optimizer state in '
                    f'{getattr(runner, "_load_from", None) or "the checkpoint"!r} has another '
                    'number of parameter groups than this run builds: it was saved with '
                    'another optim_wrapper constructor or paramwise_cfg (layer decay, '
                    'custom_keys). Resume with the config it was trained with, or start a '
                    'new run from its weights: --cfg-options load_from=CKPT without --resume.'
                ) from err
            finally:  # a run that raised never reached the hook's after_train
                release_signal_handlers(runner)
    finally:
        if created:
            import torch.distributed as dist

            dist.destroy_process_group()
    return runner
