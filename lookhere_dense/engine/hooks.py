"""mmengine hooks that make a training run safe to trust and to interrupt.

The training API (:func:`lookhere_dense.apis.train.train_model`, ``tools/train.py``) adds
the first four to every run; ``tools/test.py`` adds :class:`CheckpointFitHook` and
:class:`EvalBatchCheckHook`. In your
own mmseg / mmdet config (with ``custom_imports=dict(imports=['lookhere_dense.openmmlab'])``)::

    custom_hooks = [dict(type='FiniteLossHook'), dict(type='ExactResumeHook'),
                    dict(type='CheckpointFitHook'), dict(type='EvalBatchCheckHook')]

* :class:`FiniteLossHook` stops training at the first NaN / Inf loss, naming the
  iteration and the loss, instead of running (and saving) a diverged model to the end.
* :class:`ExactResumeHook` makes ``--resume`` continue **bit-exactly** (CPU,
  ``num_workers=0``): the RNG states of torch (and CUDA), numpy and ``random``, the
  model's own generators (``MixedCropSegDataPreProcessor``'s crop draws) and the
  train sampler's seed are saved in every checkpoint and restored where the interrupted
  run would have drawn its next batch; validation no longer moves the training RNG; and the
  resumed loop skips the already-trained batches by advancing the sampler only (no image is
  loaded again).
* :class:`CheckpointFitHook` refuses a resumed (or, with ``strict_load_from``, a tested)
  checkpoint that does not fit the model: missing, unexpected and wrongly shaped keys and
  other head counts are named (mmengine itself loads such a checkpoint with warnings
  only); the loader is :func:`lookhere_dense.lookhere.loading.load_model_weights`.
* :class:`OptimizerStateCheckHook` refuses a resumed checkpoint whose optimizer state is
  another optimizer type's (AdamW's in an SGD run, AdamW's in an Adam run), before the
  first step, naming what each holds (the training API adds it to resumed runs).
* :class:`EvalBatchCheckHook` stops a validation / test batch of images of different
  sizes (mmseg predicts one size per batch) with the loader's ``batch_size`` and the fix,
  instead of mmseg's bare assertion.
* :class:`ProgressLoggerHook` is mmengine's ``LoggerHook`` with a separate interval for
  the validation / test progress lines (about ten lines per pass by default), so a short
  training interval does not print one line per validation image.

Importing this module also registers the fault-handling hooks the training API adds:
:class:`~lookhere_dense.engine.checkpointing.AtomicCheckpointHook` (replaces
``default_hooks.checkpoint``: a failed save never damages the previous checkpoint or
``last_checkpoint``) and :class:`~lookhere_dense.engine.preemption.SignalCheckpointHook`
(SIGTERM / SIGINT: save the current iteration, then stop) and
:class:`~lookhere_dense.engine.memory_guard.MemoryGuardHook` (a pass whose estimated peak
memory exceeds what is left is refused before it allocates).

Registered in mmengine's root ``HOOKS`` registry, so mmseg and mmdet configs find them.
"""

from __future__ import annotations

import math
import os
import os.path as osp
import random
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from mmengine.hooks import Hook, LoggerHook
from mmengine.registry import HOOKS

from ..checkpoint import training_meta
from ..errors import CheckpointError, ConfigError, TrainingDivergedError
from ..lookhere.layers import weights_caused
from .checkpointing import AtomicCheckpointHook, read_pointer
from .memory_guard import MemoryGuardHook
from .preemption import SignalCheckpointHook
from .ranks import unwrap_model
from .schedules import keep_config_schedule

__all__ = [
    'FiniteLossHook',
    'ExactResumeHook',
    'CheckpointFitHook',
    'OptimizerStateCheckHook',
    'optimizer_state_problem',
    'EvalBatchCheckHook',
    'ProgressLoggerHook',
    'AtomicCheckpointHook',
    'SignalCheckpointHook',
    'MemoryGuardHook',
    'capture_rng_state',
    'restore_rng_state',
    'nothing_left_to_train',
    'training_precision',
    'RESUME_STATE_KEY',
]

#: The checkpoint key :class:`ExactResumeHook` writes.
RESUME_STATE_KEY = 'lookhere_resume_state'


# ----------------------------------------------------------------------------------------
# NaN / Inf
# ----------------------------------------------------------------------------------------
@HOOKS.register_module()
class FiniteLossHook(Hook):
    """Stop training at the first iteration whose losses (the logged values whose name
    contains ``loss``, as mmseg / mmdet name them) are not all finite.

    Raises :class:`TrainingDivergedError` naming the iteration, the loss and its value,
    and the last checkpoint saved (or, where that checkpoint already holds the weights
    that gave non-finite features, an older one); where a LookHere backbone found its
    features already NaN / infinite in that iteration's forward (``nonfinite_features``, training on CPU),
    their cause (huge inputs, weights grown huge, NaN weights) instead of the usual list.
    It runs before the logger and the checkpoint hooks, so no diverged checkpoint is
    written.

    Args:
        interval: check every ``interval`` iterations. Default: 1.
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self, interval: int = 1):
        if interval < 1:
            raise ValueError(f'FiniteLossHook: interval must be >= 1, got {interval}')
        self.interval = interval

    def after_train_iter(
        self, runner, batch_idx: int, data_batch=None, outputs: Optional[Mapping[str, Any]] = None
    ) -> None:
        if not outputs or not self.every_n_train_iters(runner, self.interval):
            return
        bad = {}
        for name, value in outputs.items():
            if 'loss' not in name:  # accuracies and other logged values may be NaN
                continue
            if isinstance(value, torch.Tensor):
                if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                    bad[name] = float(value.detach().float().mean())
            elif isinstance(value, float) and not math.isfinite(value):
                bad[name] = value
        if not bad:
            return
        it = runner.iter + 1
        total = getattr(runner, 'max_iters', None)
        # the named losses first: the total ``loss`` only repeats them
        first = sorted(bad, key=lambda k: k == 'loss')[0]
        others = ', '.join(f'{k} = {v}' for k, v in bad.items() if k != first)
        cause = _features_cause(runner.model)
        raise TrainingDivergedError(
            f'training stopped at iteration {it}'
            + (f'/{total}' if total else '')
            + f': loss {first!r} is {bad[first]}'
            + (f' (also {others})' if others else '')
            + '. The weights are no longer usable, so nothing more is saved'
            + _checkpoints_note(read_pointer(runner.work_dir), it, weights_caused(cause))
            + (
                f". The backbone's features were already not finite: {cause}."
                if cause
                else '. Usual causes: '
                'a learning rate too high for the schedule (optim_wrapper.optimizer.lr), no '
                'gradient clipping (optim_wrapper.clip_grad=dict(max_norm=1.0)), bad labels, '
                'or invalid model options.'
            )
        )


def _checkpoints_note(last: Optional[str], it: int, weights_bad: bool) -> str:
    """What the divergence message says of the checkpoints: the last one; where the weights
    that entered iteration ``it`` already gave non-finite features (``weights_bad``) and
    that checkpoint was saved after iteration ``it - 1``, that it holds those weights, and
    the newest older one in its folder (``iter_N.pth`` / ``epoch_N.pth``, by the iteration
    its ``meta`` records) to resume from instead."""
    if not last:
        return ''
    meta = training_meta(last) if weights_bad else None
    if not meta or meta.get('iter') != it - 1:
        return f'; the last checkpoint is {last}'
    folder = osp.dirname(last)
    older = []
    for name in os.listdir(folder) if osp.isdir(folder) else ():
        if not re.fullmatch(r'(iter|epoch)_\d+\.pth', name):
            continue
        path = osp.join(folder, name)
        done = (training_meta(path) or {}).get('iter')  # epoch files: their iteration too
        if isinstance(done, int) and done < it - 1:
            older.append((done, path))
    return (
        f'; the last checkpoint, {last}, holds the weights of after iteration {it - 1}, '
        'which gave these non-finite features: '
        + (
            f'resume from an older one (--resume {max(older)[1]}) or start again'
            if older
            else 'no older checkpoint is kept, start again'
        )
    )


def _features_cause(model: torch.nn.Module) -> Optional[str]:
    """The cause a LookHere backbone found for its last forward's non-finite features
    (``nonfinite_features``, kept in training on CPU); None when no module has one."""
    for module in model.modules():
        message = getattr(module, 'nonfinite_features', None)
        if isinstance(message, str):
            return message
    return None


# ----------------------------------------------------------------------------------------
# RNG and sampler state
# ----------------------------------------------------------------------------------------
#: The key of :func:`capture_rng_state`'s states of the model's own generators.
_MODULE_RNG_KEY = 'modules'


def _modules_with_rng(model: Any) -> Dict[str, Any]:
    """The modules of ``model`` (inside a DDP / FSDP wrapper) that draw from a generator
    of their own and offer its state (``get_rng_state()`` / ``set_rng_state(state)``:
    :class:`~lookhere_dense.data.mixed_crops.MixedCropSegDataPreProcessor`, at
    ``data_preprocessor``), by their names in the model."""
    model = unwrap_model(model) if model is not None else None
    if not isinstance(model, torch.nn.Module):
        return {}
    return {
        name: module
        for name, module in model.named_modules()
        if callable(getattr(module, 'get_rng_state', None))
        and callable(getattr(module, 'set_rng_state', None))
    }


def capture_rng_state(model: Any = None) -> Dict[str, Any]:
    """The states of torch's CPU (and CUDA) generators, numpy's global generator and
    Python's ``random``, and (``model`` given) of the generators of ``model``'s own
    modules (:func:`_modules_with_rng`, under ``'modules'`` by module name), in types that
    load with ``torch.load(weights_only=True)``."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = dict(
        torch=torch.get_rng_state(),
        numpy=dict(
            name=str(name),
            keys=torch.from_numpy(keys.astype(np.int64)),
            pos=int(pos),
            has_gauss=int(has_gauss),
            cached=float(cached),
        ),
        random=_random_state_to_lists(random.getstate()),
    )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    modules = _modules_with_rng(model)
    if modules:
        state[_MODULE_RNG_KEY] = {name: m.get_rng_state() for name, m in modules.items()}
    return state


def _random_state_to_lists(state) -> List[Any]:
    version, internal, gauss = state
    return [int(version), list(internal), gauss]


def restore_rng_state(state: Mapping[str, Any], model: Any = None) -> None:
    """Restore what :func:`capture_rng_state` captured (with ``model``: also the states of
    its modules' generators that ``state`` holds; a module whose state it lacks, as in a
    checkpoint written before these were saved, keeps its generator:
    :func:`_unsaved_module_rngs`)."""
    torch.set_rng_state(state['torch'])
    npst = state['numpy']
    np.random.set_state(
        (
            npst['name'],
            npst['keys'].numpy().astype(np.uint32),
            npst['pos'],
            npst['has_gauss'],
            npst['cached'],
        )
    )
    version, internal, gauss = state['random']
    random.setstate((version, tuple(internal), gauss))
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])
    saved = state.get(_MODULE_RNG_KEY) or {}
    for name, module in _modules_with_rng(model).items():
        if name in saved:
            module.set_rng_state(saved[name])


def _unsaved_module_rngs(state: Mapping[str, Any], model: Any) -> List[str]:
    """The modules of ``model`` with generators of their own whose state ``state`` (a
    :func:`capture_rng_state`) does not hold, as ``'name (Type)'``."""
    saved = state.get(_MODULE_RNG_KEY) or {}
    return [
        f'model.{name} ({type(module).__name__})'
        for name, module in _modules_with_rng(model).items()
        if name not in saved
    ]


def _train_sampler(dataloader) -> Any:
    sampler = getattr(dataloader, 'sampler', None)
    batch_sampler = getattr(dataloader, 'batch_sampler', None)
    if batch_sampler is not None and hasattr(batch_sampler, 'sampler'):
        sampler = batch_sampler.sampler
    return sampler


def _skip_batch(iterator) -> None:
    """Advance mmengine's infinite train iterator by one batch. With ``num_workers=0`` only
    the batch sampler moves (no image is read); otherwise the batch is loaded and dropped,
    as mmengine's own resume does."""
    inner = getattr(iterator, '_iterator', None)
    if (
        inner is not None
        and getattr(inner, '_num_workers', 1) == 0
        and hasattr(inner, '_next_index')
    ):
        try:
            inner._next_index()
            inner._num_yielded += 1
            return
        except StopIteration:  # end of a finite sampler: next() starts the next epoch
            pass
    next(iterator)


class _ResumedIterator:
    """Stands in for the train loop's iterator after a resume: the ``skip`` batches the
    loop replays are skipped cheaply (:func:`_skip_batch`), then ``on_first_batch`` runs
    right before the first batch that is trained on."""

    def __init__(self, iterator, skip: int, on_first_batch):
        self._iterator = iterator
        self._skip = skip
        self._on_first_batch = on_first_batch

    def __iter__(self):
        return self

    def __next__(self):
        if self._skip > 0:
            self._skip -= 1
            _skip_batch(self._iterator)
            return None  # the loop drops replayed batches
        if self._on_first_batch is not None:
            callback, self._on_first_batch = self._on_first_batch, None
            callback()
        return next(self._iterator)


#: How :func:`training_precision`'s values read in the resume note.
_PRECISION_NAMES = {
    'float32': 'float32',
    'bfloat16': 'bfloat16 mixed precision',
    'float16': 'float16 mixed precision',
}


def training_precision(runner) -> Optional[str]:
    """What the run's optimizer wrapper trains in: ``'float32'``, or the autocast dtype
    of an ``AmpOptimWrapper`` (``MixedPrecisionOptimWrapper`` included; mmengine's
    default float16 where it has none); None for another wrapper (an
    ``OptimWrapperDict``)."""
    from mmengine.optim import AmpOptimWrapper, OptimWrapper

    wrapper = getattr(runner, 'optim_wrapper', None)
    if isinstance(wrapper, AmpOptimWrapper):
        dtype = getattr(wrapper, 'cast_dtype', None)
        return str(dtype or torch.float16).replace('torch.', '')
    return 'float32' if isinstance(wrapper, OptimWrapper) else None


def nothing_left_to_train(runner) -> Optional[str]:
    """The warning for a training loop that starts at or past its end (a run resumed from
    its last checkpoint, or ``max_iters=0``): mmengine then ends at once, with status 0
    and no word. None when there is something to train."""
    from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

    loop = runner.train_loop
    if isinstance(loop, IterBasedTrainLoop) and loop.iter >= loop.max_iters:
        at, end, key = f'iteration {loop.iter}', loop.max_iters, 'max_iters'
    elif isinstance(loop, EpochBasedTrainLoop) and loop.epoch >= loop.max_epochs:
        at, end, key = f'epoch {loop.epoch}', loop.max_epochs, 'max_epochs'
    else:
        return None
    source = getattr(runner, '_load_from', None) if getattr(runner, '_resume', False) else None
    return (
        f'nothing to train: the run starts at {at}'
        + (f' (resumed from {source})' if source else '')
        + f' and train_cfg.{key}={end}. To train longer raise it, e.g. --cfg-options '
        f'train_cfg.{key}={max(2 * end, 1)}'
        + (
            f'; to evaluate the finished run (its last validation may not have ended): '
            f'tools/test.py CONFIG {source}'
            if source
            else ''
        )
    )


@HOOKS.register_module()
class ExactResumeHook(Hook):
    """Save the RNG and sampler state in checkpoints; restore it on resume so the resumed
    run draws exactly the batches, augmentations and dropout masks the uninterrupted run
    would have (bit-exact on CPU with ``num_workers=0``; with worker processes the
    workers' own generators are re-seeded by PyTorch).

    The generators are torch's (CPU and CUDA), numpy's, Python's ``random`` and those of
    the model's modules that keep one of their own (``get_rng_state`` /
    ``set_rng_state``: ``MixedCropSegDataPreProcessor``, whose crop sizes and positions
    would otherwise start again from its seed); a checkpoint written before the latter
    were saved still resumes, with a note that those draws start again.

    In a multi-process run every rank's generators are saved: when a checkpoint is saved,
    the ranks gather their states to rank 0 (:meth:`gather_rank_states`, called on every
    rank by :class:`~lookhere_dense.engine.checkpointing.AtomicCheckpointHook`), which
    writes them under ``ranks`` beside its own; on resume rank ``r`` restores entry ``r``.
    A resume with another world size restores rank 0's generators on rank 0 only (the
    other ranks keep mmengine's seeding, and the data shards differ anyway) and says so.
    With mmengine's own ``CheckpointHook`` (nothing gathers), checkpoints hold rank 0's
    generators only and a multi-process resume takes the same path.

    Also makes validation RNG-neutral: the states are saved before a validation pass and
    restored after it, so training does not depend on whether (or how often) it validates.

    Says on resume what mmengine passes over in silence: a loop with nothing left to train
    (:func:`nothing_left_to_train`; the run ends at once), and a run that trains in
    another precision than the checkpoint's (``--amp`` switched on or off; the
    checkpoints record :func:`training_precision`) or with another train batch size (the
    checkpoints record ``train_dataloader.batch_size``). A run resumed with another length
    follows its config's LR schedule, not the checkpoint's
    (:func:`~lookhere_dense.engine.schedules.keep_config_schedule`, with a note).
    """

    priority = 'VERY_HIGH'

    def __init__(self):
        self._pending: Optional[Dict[str, Any]] = None
        self._before_val: Optional[Dict[str, Any]] = None
        self._ranks: Optional[List[Dict[str, Any]]] = None
        self._model: Any = None  # the run's model: its modules' own generators

    def before_run(self, runner) -> None:
        self._model = runner.model

    # saving ------------------------------------------------------------------------------
    def _rng(self) -> Dict[str, Any]:
        """The generators a checkpoint saved now records (those before a running
        validation, which is RNG-neutral), the model's own modules' included."""
        if self._before_val is not None:
            return self._before_val
        return capture_rng_state(self._model)

    def gather_rank_states(self) -> None:
        """Collect every rank's generators on rank 0 for the checkpoint about to be saved
        (a collective: call it on every rank; nothing to do in a single process)."""
        from mmengine.dist import all_gather_object, get_world_size

        if get_world_size() > 1:
            self._ranks = all_gather_object(self._rng())

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self._model = runner.model
        loader = getattr(runner.train_loop, 'dataloader', None)
        sampler = _train_sampler(loader)
        checkpoint[RESUME_STATE_KEY] = dict(
            rng=self._rng(),
            sampler=dict(
                type=type(sampler).__name__,
                seed=getattr(sampler, 'seed', None),
                batch_size=getattr(loader, 'batch_size', None),
            ),
            precision=training_precision(runner),
        )
        ranks, self._ranks = self._ranks, None
        if ranks is not None:
            checkpoint[RESUME_STATE_KEY]['ranks'] = ranks

    def before_val(self, runner) -> None:
        self._before_val = capture_rng_state(runner.model)

    def after_val(self, runner) -> None:
        if self._before_val is not None:
            restore_rng_state(self._before_val)
            self._before_val = None

    # resuming ----------------------------------------------------------------------------
    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if getattr(runner, '_resume', False):
            note = keep_config_schedule(runner, checkpoint)
            if note:
                runner.logger.warning(f'resume: {note}')
        if getattr(runner, '_resume', False) and RESUME_STATE_KEY in checkpoint:
            meta = checkpoint.get('meta') or {}
            # where the Runner resumes: mmengine's own counters in the checkpoint
            self._pending = dict(
                checkpoint[RESUME_STATE_KEY], iter=meta.get('iter'), epoch=meta.get('epoch')
            )

    def before_train(self, runner) -> None:
        state, self._pending = self._pending, None
        left = nothing_left_to_train(runner)
        if left:
            runner.logger.warning(left)
        if state is None:
            return
        saved, now = state.get('precision'), training_precision(runner)
        if not left and saved is not None and now is not None and saved != now:
            runner.logger.warning(
                f'resume: the checkpoint was trained in {_PRECISION_NAMES.get(saved, saved)}, '
                f'this run trains in {_PRECISION_NAMES.get(now, now)} (--amp / '
                'optim_wrapper); weights and optimizer state carry over, the losses may '
                'shift a little at the switch'
            )
        note = _batch_size_change(state, runner.train_loop)
        if not left and note:
            runner.logger.warning(note)
        from mmengine.dist import get_rank
        from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

        loop = runner.train_loop
        iterator_rebuilt = self._restore_sampler_seed(runner, state)
        state = dict(state, rng=self._rank_rng(runner, state, get_rank()))
        model = runner.model
        exact = isinstance(loop, IterBasedTrainLoop) and state['iter'] == loop.iter
        by_epoch = (
            isinstance(loop, EpochBasedTrainLoop)
            and state['epoch'] == loop.epoch
            and state['iter'] == loop.epoch * len(loop.dataloader)
        )
        unsaved = _unsaved_module_rngs(state['rng'], model)
        if not left and (exact or by_epoch) and unsaved:
            runner.logger.warning(
                f'resume: the checkpoint holds no state of the own generator of '
                f'{", ".join(unsaved)} (it was written before these were saved): its draws '
                '(MixedCropSegDataPreProcessor: the crop sizes and positions) start again '
                'from its seed, so they repeat those of the first iterations instead of '
                'continuing the run'
            )
        if exact:
            if iterator_rebuilt:
                from mmengine.runner.loops import _InfiniteDataloaderIterator

                loop.dataloader_iterator = _InfiniteDataloaderIterator(loop.dataloader)
            loop.dataloader_iterator = _ResumedIterator(
                loop.dataloader_iterator,
                loop.iter,
                lambda: restore_rng_state(state['rng'], model),
            )
        elif by_epoch:
            self._epoch_rng = state['rng']  # restored in before_train_epoch
        else:
            runner.logger.warning(
                'ExactResumeHook: the checkpoint was not saved at a point this loop resumes '
                f'from exactly ({type(loop).__name__}); the RNG state is not restored'
            )

    def before_train_epoch(self, runner) -> None:
        rng = getattr(self, '_epoch_rng', None)
        if rng is not None:
            self._epoch_rng = None
            restore_rng_state(rng, runner.model)

    @staticmethod
    def _rank_rng(runner, state: Mapping[str, Any], rank: int) -> Dict[str, Any]:
        """The generators rank ``rank`` resumes with: its own entry of the checkpoint's
        ``ranks`` when the world size is the one saved; otherwise rank 0's on rank 0 and
        the rank's current (mmengine-seeded) ones elsewhere."""
        from mmengine.dist import get_world_size

        ranks = state.get('ranks')
        world = get_world_size()
        if ranks is not None and len(ranks) == world:
            return ranks[rank]
        if world > 1 or ranks is not None:
            saved = len(ranks) if ranks is not None else 'rank 0 only'
            runner.logger.warning(
                f'ExactResumeHook: the checkpoint holds the generators of {saved} rank(s) and '
                f"this run has {world}: rank 0 restores rank 0's, the other ranks keep their "
                'own seeding (the run resumes, but not bitwise)'
            )
        return state['rng'] if rank == 0 else capture_rng_state(runner.model)

    @staticmethod
    def _restore_sampler_seed(runner, state: Mapping[str, Any]) -> bool:
        """Give the train sampler the seed of the interrupted run (it differs when
        ``randomness.seed`` is None); True when the sampler was changed."""
        saved = (state.get('sampler') or {}).get('seed')
        sampler = _train_sampler(runner.train_loop.dataloader)
        if saved is None or getattr(sampler, 'seed', saved) == saved:
            return False
        sampler.seed = saved
        if hasattr(sampler, '_indices_of_rank'):  # InfiniteSampler: its index stream
            sampler.indices = sampler._indices_of_rank()
        runner.logger.info(f'resume: train sampler seed restored to {saved}')
        return True


def _batch_size_change(state: Mapping[str, Any], loop) -> Optional[str]:
    """The note for a resume whose train loader draws batches of another size than the
    checkpoint's run did (its ``sampler.batch_size``; None when it is the same, or either
    is unknown)."""
    saved = (state.get('sampler') or {}).get('batch_size')
    now = getattr(getattr(loop, 'dataloader', None), 'batch_size', None)
    if saved is None or now is None or saved == now:
        return None
    return (
        f'resume: the checkpoint was trained with train_dataloader.batch_size={saved}, this '
        f'run uses {now} (per process): the iterations go on counting where they stopped and '
        'the schedule is in iterations, so from here each iteration trains on '
        f'{now / saved:.3g}x the images, and the data order does not continue the '
        f"checkpoint's (not a bitwise resume). Keep --cfg-options "
        f'train_dataloader.batch_size={saved} to continue the run as it was'
    )


# ----------------------------------------------------------------------------------------
# Checkpoints that do not fit
# ----------------------------------------------------------------------------------------
@HOOKS.register_module()
class CheckpointFitHook(Hook):
    """Refuse a checkpoint that does not fit the model, naming what differs, when the
    Runner resumes from it (and, with ``strict_load_from``, when it loads ``load_from``:
    ``tools/test.py``). mmengine loads such checkpoints non-strictly, with warnings only.
    A training run's ``load_from`` may differ (a fine-tuning head) but must share keys
    with the model: backbone-only weights there would load nothing and train from random
    weights; they are refused, pointing to the backbone's ``init_cfg``.

    The check is :func:`lookhere_dense.lookhere.loading.load_model_weights` (shapes, keys both
    ways, the ``LookHereViT`` records, head counts), run on the checkpoint mmengine has
    read; it raises :class:`~lookhere_dense.errors.CheckpointError`.

    Args:
        strict_load_from: also check checkpoints loaded through ``load_from`` (keep False
            for training, where ``load_from`` initialises a fine-tuning run and may
            differ in the head on purpose). Default: False.
        checkpoint_num_heads: the head count of the checkpoint's LookHere backbone, for
            files that do not record it. Default: None.
    """

    priority = 'VERY_HIGH'

    def __init__(self, strict_load_from: bool = False, checkpoint_num_heads: Optional[int] = None):
        self.strict_load_from = strict_load_from
        self.checkpoint_num_heads = checkpoint_num_heads

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        from ..lookhere.loading import load_model_weights, model_state_dict_of

        source = getattr(runner, '_load_from', None) or 'the checkpoint'
        if not (getattr(runner, '_resume', False) or self.strict_load_from):
            # training's load_from may differ in the head, but must load something
            model_state_dict_of(unwrap_model(runner.model), checkpoint, source)
            return
        load_model_weights(
            unwrap_model(runner.model),
            checkpoint,
            source=source,
            checkpoint_num_heads=self.checkpoint_num_heads,
        )


def _optimizers(optim_wrapper) -> List[Tuple[str, object]]:
    """``(name, torch optimizer)`` of a built ``OptimWrapper`` (name ``''``) or of each
    wrapper of an ``OptimWrapperDict``."""
    wrappers = getattr(optim_wrapper, 'optim_wrappers', None)
    if isinstance(wrappers, Mapping):
        return [(name, getattr(w, 'optimizer', None)) for name, w in wrappers.items()]
    return [('', getattr(optim_wrapper, 'optimizer', None))]


def _groups_once_loaded(optimizer, saved_groups: List[Mapping]) -> Optional[List[dict]]:
    """The parameter groups ``optimizer`` would have after loading ``saved_groups``: the
    saved hyper-parameters, completed by the optimizer's own ``__setstate__`` (as torch's
    ``load_state_dict`` and unpickling do: flags newer torch versions added, e.g.
    ``fused``), on a copy without parameters or state. None where that copy cannot be
    made (an optimizer whose ``__setstate__`` needs more)."""
    cls = type(optimizer)
    groups = [
        {**{k: v for k, v in g.items() if k != 'params'}, 'params': []} for g in saved_groups
    ]
    probe = cls.__new__(cls)
    try:
        probe.__setstate__(
            {'defaults': dict(optimizer.defaults), 'state': {}, 'param_groups': groups}
        )
    except Exception:  # any optimizer class: no check rather than a crash
        return None
    return probe.param_groups


def optimizer_state_problem(
    optimizer, saved: Mapping, source: str, name: str = ''
) -> Optional[str]:
    """Why the optimizer state ``saved`` (a ``state_dict()``) is another optimizer type's
    than ``optimizer`` (built, not loaded yet), or None when it fits. torch's
    ``Optimizer.load_state_dict`` replaces the parameter groups' hyper-parameters with the
    saved ones: the hyper-parameters of ``optimizer`` (its ``defaults``) that the saved
    groups lack end its first step in a ``KeyError`` (an AdamW state in an SGD run:
    ``KeyError: 'momentum'``), or the loading itself (an SGD state in an AdamW run:
    ``KeyError: 'step'``). Adam and AdamW hold the same keys and are told apart by
    ``decoupled_weight_decay`` where the checkpoint records it (torch >= 2.6): loaded, an
    AdamW state would silently make an Adam run decay weights as AdamW does. Flags that
    torch fills in when it loads an older state do not count.

    Args:
        optimizer: the torch optimizer the run built.
        saved: the state to load (``param_groups``, ``state``).
        source: the checkpoint, for the message.
        name: the optimizer's name in an ``OptimWrapperDict``. Default: ``''``.
    """
    saved_groups = saved.get('param_groups')
    built = getattr(optimizer, 'param_groups', None)
    defaults = getattr(optimizer, 'defaults', None)
    if not saved_groups or not built or not isinstance(defaults, Mapping):
        return None
    loaded = _groups_once_loaded(optimizer, saved_groups)
    if loaded is None:
        return None
    where = f' (optim_wrapper {name!r})' if name else ''
    load = source if source != 'the checkpoint' else 'CKPT'
    fix = (
        'Resume with the config it was trained with (its optim_wrapper.optimizer), or '
        f'start a new run from its weights: --cfg-options load_from={load} without --resume.'
    )
    flag = 'decoupled_weight_decay'  # Adam (L2 weight decay) or AdamW (decoupled)
    if flag in saved_groups[0] and flag in built[0] and saved_groups[0][flag] != built[0][flag]:
        return (
            f'--resume: the optimizer state in {source!r} was saved with '
            f'{flag}={saved_groups[0][flag]} ({_decay_kind(saved_groups[0][flag])}), '
            f"this run's {type(optimizer).__name__}{where} has {flag}={built[0][flag]} "
            f'({_decay_kind(built[0][flag])}): loaded, the run would train with the '
            f"checkpoint's weight decay rule and value under the config's optimizer name. " + fix
        )
    missing = [k for k in defaults if any(k not in g for g in loaded)]
    if not missing:
        return None
    theirs = [k for k in saved_groups[0] if k not in built[0] and k != 'params']
    state = next(iter((saved.get('state') or {}).values()), None)
    per_param = f' (per-parameter state: {", ".join(state)})' if isinstance(state, Mapping) else ''
    has = (
        f"; the checkpoint's hold {', '.join(theirs)} instead{per_param}" if theirs else per_param
    )
    return (
        f'--resume: the optimizer state in {source!r} was saved by another optimizer type: '
        f"this run's {type(optimizer).__name__}{where} needs {', '.join(missing)} in its "
        f'parameter groups{has}. ' + fix
    )


def _decay_kind(decoupled: Any) -> str:
    """``'AdamW's decoupled weight decay'`` or ``'Adam's L2 weight decay'``."""
    return "AdamW's decoupled weight decay" if decoupled else "Adam's L2 weight decay"


@HOOKS.register_module()
class OptimizerStateCheckHook(Hook):
    """Stop a resumed run whose checkpoint holds another optimizer type's state
    (:func:`optimizer_state_problem`) with a :class:`~lookhere_dense.errors.CheckpointError`
    in ``after_load_checkpoint``: before mmengine loads that state into the built
    optimizers, so before the first step. Runs only when the Runner resumes."""

    priority = 'HIGHEST'

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        saved = checkpoint.get('optimizer')
        if not getattr(runner, '_resume', False) or not isinstance(saved, Mapping):
            return
        source = getattr(runner, '_load_from', None)
        if not source:  # resume=True without load_from: mmengine's newest checkpoint
            from mmengine.runner import find_latest_checkpoint

            source = find_latest_checkpoint(runner.work_dir) or 'the checkpoint'
        for name, optimizer in _optimizers(runner.optim_wrapper):
            state = saved.get(name) if name else saved
            if isinstance(state, Mapping):
                problem = optimizer_state_problem(optimizer, state, source, name)
                if problem:
                    raise CheckpointError(problem)


# ----------------------------------------------------------------------------------------
# validation / test batches
# ----------------------------------------------------------------------------------------
#: Backbones whose attention spans the whole (batch-padded) frame: their predictions for
#: an image depend on the padding its batch-mates add (:class:`EvalBatchCheckHook`)
GLOBAL_ATTENTION_BACKBONES = ('LookHereViT', 'LookWhereViT', 'VisionTransformer')


@HOOKS.register_module()
class EvalBatchCheckHook(Hook):
    """Stop a validation or test batch whose images differ in size, naming the loader's
    ``batch_size``, two of the images and the fix, before the model sees it.

    mmseg's ``SegDataPreProcessor`` predicts one size per batch: such a batch (a
    ``batch_size`` above 1 with a keep-ratio ``Resize`` on images of several aspects, as
    ADE20K's) ends in its bare ``AssertionError: The image size in a batch should be the
    same.``. mmdet's ``DetDataPreprocessor`` pads the batch to its largest image: a
    detector whose backbone attends over the whole padded frame (``LookHereViT``,
    ``LookWhereViT``, mmseg's ``VisionTransformer``) then predicts each image from its
    batch-mates' padding too -- results that change with ``batch_size`` and the dataset's
    order (boxes up to 145 px apart in a trial) -- and is stopped the same way. Batches of
    one size (Cityscapes' frames) pass; other detectors (CNN backbones) are not checked.
    """

    priority = 'VERY_HIGH'

    def before_val_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        self._check(runner, 'val', batch_idx, data_batch)

    def before_test_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        self._check(runner, 'test', batch_idx, data_batch)

    @staticmethod
    def _check(runner, split: str, batch_idx: int, data_batch: Any) -> None:
        inputs = data_batch.get('inputs') if isinstance(data_batch, dict) else None
        if not isinstance(inputs, (list, tuple)) or len(inputs) < 2:
            return
        model = unwrap_model(runner.model)
        pre = getattr(model, 'data_preprocessor', None)
        kinds = {c.__name__ for c in type(pre).__mro__}
        # mmseg's (or one built on it: MixedCropSegDataPreProcessor); mmdet's, for a
        # backbone whose attention reaches the padding of the whole batch
        seg = 'SegDataPreProcessor' in kinds
        det = 'DetDataPreprocessor' in kinds and (
            type(getattr(model, 'backbone', None)).__name__ in GLOBAL_ATTENTION_BACKBONES
        )
        if not (seg or det):
            return
        sizes = [tuple(x.shape[-2:]) if isinstance(x, torch.Tensor) else None for x in inputs]
        other = next((i for i, s in enumerate(sizes) if s != sizes[0]), None)
        if other is None or sizes[0] is None or sizes[other] is None:
            return
        samples = data_batch.get('data_samples') or []

        def image(i: int) -> str:
            (h, w), meta = (
                sizes[i],
                getattr(samples[i], 'metainfo', {}) if i < len(samples) else {},
            )
            path = meta.get('img_path')
            return f'{h}x{w}' + (f" ('{path}')" if path else '')

        # the configured size (a last, short batch, or a dataset smaller than the batch,
        # holds fewer images than the user set)
        loader = (getattr(runner, 'cfg', None) or {}).get(f'{split}_dataloader') or {}
        size = loader.get('batch_size', len(inputs)) if hasattr(loader, 'get') else len(inputs)
        head = (
            f'{split}_dataloader.batch_size={size}: {split} batch {batch_idx} holds '
            f'images of different sizes ({image(0)} and {image(other)})'
        )
        if seg:
            raise ConfigError(
                f"{head}, and mmseg's SegDataPreProcessor predicts one size per batch. Set "
                f"--cfg-options {split}_dataloader.batch_size=1 (as mmseg's configs do), or "
                f'a {split} pipeline that gives every image one size.'
            )
        raise ConfigError(
            f"{head}: mmdet's DetDataPreprocessor pads them to the largest, and the "
            f'{type(model.backbone).__name__} backbone attends over the padded frame, so '
            "each image's predictions would depend on the images batched with it (another "
            f'batch_size or order, other results). Set --cfg-options '
            f"{split}_dataloader.batch_size=1 (as lookhere-dense's detection configs do), or "
            f'a {split} pipeline that gives every image one size.'
        )


# ----------------------------------------------------------------------------------------
# Progress lines
# ----------------------------------------------------------------------------------------
@HOOKS.register_module()
class ProgressLoggerHook(LoggerHook):
    """mmengine's ``LoggerHook`` with its own interval for validation and test progress.

    Args:
        val_interval: log every N-th validation / test batch. Default: None (at most ten
            lines per pass: every ``ceil(len(dataloader) / 10)``-th batch).
        **kwargs: ``LoggerHook``'s arguments (``interval`` is the training interval).
    """

    def __init__(self, val_interval: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)
        if val_interval is not None and val_interval < 1:
            raise ValueError(f'ProgressLoggerHook: val_interval must be >= 1, got {val_interval}')
        self.val_interval = val_interval

    def _every(self, dataloader) -> int:
        if self.val_interval is not None:
            return self.val_interval
        try:
            return max(1, -(-len(dataloader) // 10))
        except TypeError:
            return self.interval

    def _progress(self, runner, batch_idx: int, mode: str, dataloader) -> None:
        n = self._every(dataloader)
        if self.every_n_inner_iters(batch_idx, n):
            _, log_str = runner.log_processor.get_log_after_iter(runner, batch_idx, mode)
            runner.logger.info(log_str)

    def after_val_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._progress(runner, batch_idx, 'val', runner.val_dataloader)

    def after_test_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._progress(runner, batch_idx, 'test', runner.test_dataloader)
