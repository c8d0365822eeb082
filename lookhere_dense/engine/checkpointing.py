"""Checkpoints that a failed save cannot damage: :class:`AtomicCheckpointHook`.

mmengine's ``CheckpointHook`` writes ``iter_N.pth`` straight under its final name, removes
the oldest kept checkpoint *before* saving the new one, and rewrites ``last_checkpoint`` in
place. A save that fails half-way (full disk, ``ulimit -f``, read-only or removed work dir,
SIGKILL) therefore leaves a truncated ``iter_N.pth``, can leave no good checkpoint at all
(``max_keep_ckpts=1``), and can leave an empty pointer.

:class:`AtomicCheckpointHook` is that hook with one method replaced (the one that saves
the step checkpoints and the pointer, ``_save_checkpoint_with_step``): the Runner writes the
checkpoint to a hidden temporary name in the same folder
(:func:`lookhere_dense.checkpoint.atomic.partial_name`), which is ``fsync``-ed and renamed
onto ``iter_N.pth``; then ``last_checkpoint`` is replaced the same way; only then is the
oldest checkpoint beyond ``max_keep_ckpts`` removed. A failure raises
:class:`~lookhere_dense.errors.CheckpointSaveError` naming the file and the cause, removes
the temporary file and leaves the previous checkpoint and the pointer as they were.

Why a hook subclass and not a patch of mmengine: the training API already replaces the
config's ``default_hooks.checkpoint`` type (:func:`lookhere_dense.apis.train.build_train_config`),
so every option of mmengine's hook keeps working, configs with their own ``runner_type``
get it too, and nothing global in mmengine changes (other code in the process still gets
mmengine's own behaviour). Non-local back-ends (``backend_args`` for S3, Petrel) keep
mmengine's behaviour; ``save_best`` checkpoints are still written by mmengine directly.
"""

from __future__ import annotations

import os
import os.path as osp
from typing import List, Optional

from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from ..checkpoint.atomic import (
    atomic_write_text,
    describe_os_error,
    partial_name,
    publish_file,
    remove_quietly,
    remove_stale_partials,
)
from ..checkpoint.reading import read_pointer_file
from ..errors import CheckpointSaveError
from .ranks import world_max

__all__ = ['AtomicCheckpointHook', 'POINTER_FILE', 'read_pointer']

#: The file in the work dir that names the newest checkpoint (mmengine's name).
POINTER_FILE = 'last_checkpoint'


def read_pointer(work_dir: str) -> Optional[str]:
    """The checkpoint the work dir's :data:`POINTER_FILE` names, as written (mmengine
    writes an absolute path; a relative one is taken relative to the work dir), or None:
    no pointer, an empty or unreadable one
    (:func:`~lookhere_dense.checkpoint.read_pointer_file`)."""
    return read_pointer_file(osp.join(work_dir, POINTER_FILE))


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` whose step checkpoints and ``last_checkpoint`` pointer
    are written atomically, and whose old checkpoints are removed only after the new one
    is complete (see the module docstring). Same arguments as ``CheckpointHook``."""

    def _atomic(self) -> bool:
        return isinstance(getattr(self, 'file_backend', None), LocalBackend)

    def _save_checkpoint_with_step(self, runner, step: int, meta: dict) -> None:
        _gather_rank_states(runner)
        if not self._atomic():
            return super()._save_checkpoint_with_step(runner, step, meta)
        filename = self.filename_tmpl.format(step)
        final = self.file_backend.join_path(self.out_dir, filename)
        evicted = self._plan_keep(runner, step)
        main = is_main_process()
        if main:
            self._check_folder(runner, final)
        tmp = osp.join(self.out_dir, osp.basename(partial_name(filename)))
        published = False  # a new file under the final name, removed if the pointer fails
        try:
            runner.save_checkpoint(
                self.out_dir,
                osp.basename(tmp),
                self.file_client_args,
                save_optimizer=self.save_optimizer,
                save_param_scheduler=self.save_param_scheduler,
                meta=meta,
                by_epoch=self.by_epoch,
                backend_args=self.backend_args,
                **self.args,
            )
            if main:
                published = not osp.exists(final)  # a file there before is left alone
                publish_file(tmp, final)
                atomic_write_text(osp.join(runner.work_dir, POINTER_FILE), final)
        except (OSError, RuntimeError) as err:
            if main:
                remove_quietly(tmp)
                if published:  # the pointer could not follow: --resume would not find it
                    remove_quietly(final)
            raise CheckpointSaveError(self._failure(runner, final, err)) from err
        self.last_ckpt = final
        runner.message_hub.update_info('last_ckpt', final)
        if main:
            for path in evicted:
                self._remove(path)

    def before_train(self, runner) -> None:
        super().before_train(runner)
        if self._atomic():  # the folder exists from the start, so its removal shows
            os.makedirs(self.out_dir, exist_ok=True)
            if is_main_process():  # what a run killed while saving left behind
                stale = remove_stale_partials(self.out_dir)
                if stale:
                    runner.logger.warning(
                        f'removed {len(stale)} unfinished checkpoint file(s) of a run killed '
                        f'while saving ({_size(sum(n for _, n in stale))}): '
                        + ', '.join(osp.basename(p) for p, _ in stale)
                    )
            problem = self._room_problem(runner) if is_main_process() else None
            if world_max(int(problem is not None)):  # one decision for every rank
                raise CheckpointSaveError(
                    problem or f'rank 0 found no room for a checkpoint in {self.out_dir!r}'
                )

    def _first_save(self, runner) -> Optional[int]:
        """The iteration of this run's first save (None: it saves nothing, or by epoch)."""
        if self.by_epoch:
            return None
        end = getattr(runner, 'max_iters', None)
        if self.interval > 0:
            first = (runner.iter // self.interval + 1) * self.interval
            return min(first, end) if end and self.save_last else first
        return end if self.save_last else None

    def _room_problem(self, runner) -> Optional[str]:
        """Before the first iteration: a checkpoint folder with less free space than one
        checkpoint of the run (weights and, where the optimizer's kind tells its size, its
        state; else the weights alone), or a file-size limit (``ulimit -f``) below it: the
        first save would fail and lose every iteration before it, so the refusal's
        message; room for one but not two checkpoints (the new one is written before the
        old one is removed) gets a warning. None for a run that saves nothing."""
        import resource
        import shutil

        import torch

        first = self._first_save(runner)
        if first is None and not (self.by_epoch and (self.interval > 0 or self.save_last)):
            return None  # a run that saves nothing
        try:
            free = shutil.disk_usage(self.out_dir).free
        except OSError:
            return None
        model = getattr(runner.model, 'module', runner.model)
        weights = sum(
            t.numel() * t.element_size()
            for t in model.state_dict().values()
            if isinstance(t, torch.Tensor)
        )
        state = optimizer_state_bytes(runner) if self.save_optimizer else 0
        checkpoint = weights + (state or 0)
        sure = checkpoint if state is not None else weights  # what the save needs at least
        what = (
            f'one checkpoint of this run (about {_size(checkpoint)}: the weights '
            f"{_size(weights)} and the optimizer's state)"
            if state
            else f"the model's weights alone ({_size(weights)})"
        )
        when = f' at iteration {first}' if first else ''
        lose = f'the first save{when} would fail and lose every iteration before it'
        if free < sure:
            return (
                f'the checkpoint folder {self.out_dir!r} has {_size(free)} free, less than '
                f'{what}: {lose}. Free space or choose another --work-dir (or '
                'default_hooks.checkpoint.out_dir).'
            )
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and limit < sure:
            return (
                f'the file-size limit of this process (ulimit -f) is {_size(limit)}, less than '
                f'{what}: {lose}. Raise the limit (ulimit -f unlimited) before training.'
            )
        if free < 2 * checkpoint:
            runner.logger.warning(
                f'the checkpoint folder {self.out_dir!r} has {_size(free)} free; a '
                f'checkpoint of this run is about {_size(checkpoint)} and a save needs room '
                'for the new one before the old one is removed: a save after the first '
                'may fail for space (the previous checkpoint is then kept)'
            )
        return None

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        """Stop at once when the work dir or the checkpoint folder has been removed (one
        ``stat`` per iteration): mmengine would fail on its next log write, or silently
        create the folder again for the next checkpoint."""
        for folder in {runner.work_dir, self.out_dir}:
            if folder and not osp.isdir(folder):
                raise CheckpointSaveError(
                    f'the folder {folder!r} no longer exists (removed while training ran?): '
                    f'training stopped before iteration {runner.iter + 1} and nothing more '
                    'is written. Restore the folder and continue with --resume, or start '
                    'again with another --work-dir.'
                )

    def save_now(self, runner) -> str:
        """Save the checkpoint of the iteration (or epoch) that just ended, unless this
        hook saved it already; returns its path."""
        step = runner.epoch + 1 if self.by_epoch else runner.iter + 1
        name = self.filename_tmpl.format(step)
        final = self.file_backend.join_path(self.out_dir, name)
        if self.last_ckpt != final:
            self._save_checkpoint(runner)
        return final

    # helpers ---------------------------------------------------------------------------
    def _plan_keep(self, runner, step: int) -> List[str]:
        """Record ``step`` among the kept checkpoints (saved in the checkpoint's message
        hub, as mmengine does) and return the files to remove once it is saved."""
        if self.max_keep_ckpts <= 0:
            return []
        ids = self.keep_ckpt_ids
        if ids and ids[-1] == step:
            return []
        evicted = []
        if len(ids) == self.max_keep_ckpts:
            old = ids.popleft()
            evicted.append(
                self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(old))
            )
        ids.append(step)
        runner.message_hub.update_info('keep_ckpt_ids', list(ids))
        return evicted

    def _remove(self, path: str) -> None:
        if self.file_backend.isfile(path):
            self.file_backend.remove(path)
        elif self.file_backend.isdir(path):  # deepspeed checkpoints are folders
            self.file_backend.rmtree(path)

    def _previous_file(self, runner) -> Optional[str]:
        """The complete checkpoint the work dir's ``last_checkpoint`` names (this run's last
        save, or the one a resumed run started from: mmengine's hook forgets it on
        resume), else this hook's last save; None when neither is a file."""
        for prev in (read_pointer(runner.work_dir), self.last_ckpt):
            if prev and osp.isfile(prev):
                return prev
        return None

    def _previous(self, runner) -> str:
        prev = self._previous_file(runner)
        if prev:
            return f'the previous checkpoint {prev} and {POINTER_FILE} are unchanged'
        return f'no earlier checkpoint of this run is in {runner.work_dir}'

    def _check_folder(self, runner, final: str) -> None:
        """A work dir removed while training ran is an error (mmengine would silently
        create it again, without the run's earlier checkpoints and logs)."""
        if not osp.isdir(self.out_dir):
            raise CheckpointSaveError(
                f'checkpoint {final!r} could not be saved: the folder {self.out_dir!r} no '
                'longer exists (removed while training ran?); nothing was written. '
                'Restore the folder or start again with another --work-dir.'
            )

    def _failure(self, runner, final: str, err: BaseException) -> str:
        then = (
            'then continue with --resume'
            if self._previous_file(runner)
            else 'then start the run again (there is no checkpoint to resume from)'
        )
        return (
            f'checkpoint {final!r} could not be saved: {describe_os_error(err)}. Nothing '
            f'was written under that name and {self._previous(runner)}; free space or fix '
            f'the folder, {then}.'
        )


#: state tensors per parameter, by optimizer class (torch's; float32 like the parameters)
_STATE_BUFFERS = {
    'Adam': 2,
    'AdamW': 2,
    'Adamax': 2,
    'NAdam': 2,
    'RAdam': 2,
    'Adadelta': 2,
    'Adagrad': 1,
    'ASGD': 1,
}


def _buffers_of(optimizer) -> Optional[int]:
    """State tensors per parameter of one torch optimizer (None: a kind not known here)."""
    name = type(optimizer).__name__
    groups = getattr(optimizer, 'param_groups', [])
    if name == 'SGD':
        return int(any(g.get('momentum', 0) for g in groups))
    if name == 'RMSprop':
        momentum = any(g.get('momentum', 0) for g in groups)
        centered = any(g.get('centered', False) for g in groups)
        return 1 + int(momentum) + int(centered)
    if name in ('Adam', 'AdamW') and any(g.get('amsgrad', False) for g in groups):
        return 3
    return _STATE_BUFFERS.get(name)


def optimizer_state_bytes(runner) -> Optional[int]:
    """The bytes of optimizer state a checkpoint of ``runner`` holds: per optimizer, its
    state tensors per parameter (2 for Adam / AdamW, 1 for SGD with momentum, ...) times
    the float32 size of the parameters it trains; None when an optimizer is of a kind not
    known here."""
    wrapper = getattr(runner, 'optim_wrapper', None)
    wrappers = getattr(wrapper, 'optim_wrappers', None)
    optimizers = (
        [w.optimizer for w in wrappers.values()]
        if wrappers
        else [getattr(wrapper, 'optimizer', None)]
    )
    total = 0
    for optimizer in (o for o in optimizers if o is not None):
        buffers = _buffers_of(optimizer)
        if buffers is None:
            return None
        params = {
            id(p): p.numel()
            for group in optimizer.param_groups
            for p in group['params']
            if p.requires_grad
        }
        total += buffers * 4 * sum(params.values())
    return total


def _size(n: float) -> str:
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if n < 1024 or unit == 'GiB':
            return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
        n /= 1024
    return f'{n:.1f} GiB'


def _gather_rank_states(runner) -> None:
    """Every rank's generators to rank 0 for the checkpoint about to be saved (a
    collective; this hook's save runs on every rank, mmengine's ``save_checkpoint`` on
    rank 0 only). The hooks that keep per-rank state (``ExactResumeHook``) offer a
    ``gather_rank_states()`` method; asking for the method, not the class, keeps this module
    free of an import of ``hooks`` (which imports this one)."""
    for hook in runner.hooks:
        gather = getattr(hook, 'gather_rank_states', None)
        if callable(gather):
            gather()
