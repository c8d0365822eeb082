"""SIGTERM / SIGINT (and SIGHUP, SIGUSR1: :data:`HANDLED_SIGNALS`) during training: finish
the iteration, save it, stop with one line (:class:`SignalCheckpointHook`).

A scheduler that preempts a job sends SIGTERM and kills it a grace period later (Slurm:
``KillWait``, 30 s by default; torchrun: 30 s after forwarding the signal to its workers).
mmengine's Runner dies at the signal and loses every iteration since its last checkpoint.
With this hook the first SIGTERM, SIGUSR1, SIGHUP or SIGINT (Ctrl-C) only sets a flag; when the current
training iteration ends (with gradient accumulation, ``optim_wrapper.accumulative_counts
= k``: the iteration of the next optimizer step, up to ``k - 1`` iterations later, since the
summed gradients are in no checkpoint), the checkpoint of that iteration is written (atomically, by the
run's :class:`~lookhere_dense.engine.checkpointing.AtomicCheckpointHook`; it is kept as is
if that iteration was just saved) and the run raises
:class:`~lookhere_dense.errors.TrainingInterruptedError` naming the signal, the iteration
and the checkpoint; ``tools/train.py`` prints it as one ``error:`` line. ``--resume``
then loses nothing.

In a multi-process run every rank takes part in a tiny ``all_reduce`` of the flag after
each iteration, so all ranks stop after the same iteration even when the signal reached
them at different moments (or reached one of them only); rank 0 saves, the others wait for
it at a barrier, then all stop.

A second SIGINT stops at once (``KeyboardInterrupt``: a person pressing Ctrl-C twice means
it); repeated SIGTERMs are ignored, since schedulers and torchrun may each deliver one.
A signal is acknowledged on stderr when it arrives; one during validation is acted on
after the next training iteration (during the last validation the run ends normally, with
a warning saying so). Epoch-based loops keep the last epoch checkpoint (mmengine resumes them
at epoch boundaries only) and stop at once after the current iteration.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Dict, Optional

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..errors import TrainingInterruptedError
from .checkpointing import read_pointer
from .ranks import barrier, world_max

__all__ = ['SignalCheckpointHook', 'HANDLED_SIGNALS']

#: The signals the hook turns into "save and stop": a scheduler's preemption (SIGTERM;
#: SIGUSR1, what Slurm's ``--signal=USR1@90`` sends before the end of a job's time),
#: Ctrl-C (SIGINT) and a closed terminal or ssh session (SIGHUP; left ignored under
#: ``nohup``, which ignores it).
HANDLED_SIGNALS = tuple(
    getattr(signal, name)
    for name in ('SIGTERM', 'SIGINT', 'SIGHUP', 'SIGUSR1')
    if hasattr(signal, name)
)


@HOOKS.register_module()
class SignalCheckpointHook(Hook):
    """Turn SIGTERM / SIGINT into "finish this iteration, save it, stop" (see the module
    docstring). Handlers are installed in ``before_train`` (main thread only) and the
    previous ones restored in ``after_train`` or when the run stops."""

    priority = 'LOWEST'  # after the checkpoint and logger hooks of the same iteration

    def __init__(self):
        self._received: int = 0
        self._deferred = False
        self._saves = True  # whether a signal's stop saves the iteration (before_train)
        self._previous: Dict[int, object] = {}

    # handlers ----------------------------------------------------------------------------
    def _handle(self, signum: int, frame) -> None:
        if self._received and signum == signal.SIGINT:
            self.restore_handlers()
            raise KeyboardInterrupt
        if not self._received:
            self._received = signum
            # acknowledged at once (a validation running now finishes first, which may take
            # minutes); os.write: no buffered stream is re-entered from a signal handler
            again = ' (Ctrl-C again stops at once)' if signum == signal.SIGINT else ''
            act = 'saves and stops' if self._saves else 'stops (keeping its last checkpoint)'
            note = (
                f'{signal.Signals(signum).name} received: the run {act} after the current '
                f'training iteration; a validation running now finishes first{again}\n'
            )
            try:
                os.write(2, note.encode())
            except OSError:
                pass

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in HANDLED_SIGNALS:
            if sig != signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:
                continue  # ignored by the parent (nohup: SIGHUP): the run keeps ignoring it
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore_handlers(self) -> None:
        """Put back the handlers :meth:`before_train` replaced (nothing when none are
        installed: safe to call twice)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    # hook points -------------------------------------------------------------------------
    def before_train(self, runner) -> None:
        self._received = 0
        self._deferred = False
        hook = self._checkpoint_hook(runner)
        self._saves = hook is not None and not hook.by_epoch  # as _save decides
        self._install()

    def after_train(self, runner) -> None:
        if self._received:  # during the last validation, or after the last iteration
            runner.logger.warning(
                f'{signal.Signals(self._received).name} received after the last training '
                'iteration: training had ended, and the run finishes as it would have '
                '(its checkpoints are complete)'
            )
        self.restore_handlers()

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        signum = world_max(self._received)
        if not signum:
            return
        pending = accumulating_iterations(runner)
        if pending:  # the gradients summed since the last step are in no checkpoint
            if not self._deferred:
                runner.logger.warning(
                    f'{signal.Signals(signum).name} received: training on to the end of the '
                    f'gradient accumulation ({pending} more iteration(s)) before saving'
                )
            self._deferred = True
            return
        saved = self._save(runner)
        barrier()
        self.restore_handlers()
        raise TrainingInterruptedError(self._message(runner, signum, saved), signum)

    # saving ------------------------------------------------------------------------------
    def _checkpoint_hook(self, runner):
        from .checkpointing import AtomicCheckpointHook

        for hook in getattr(runner, 'hooks', ()):
            if isinstance(hook, AtomicCheckpointHook):
                return hook
        return None

    def _save(self, runner) -> Optional[str]:
        hook = self._checkpoint_hook(runner)
        if hook is None or hook.by_epoch:
            return None
        return hook.save_now(runner)

    @staticmethod
    def _message(runner, signum: int, saved: Optional[str]) -> str:
        name = signal.Signals(signum).name
        it = runner.iter + 1
        total = getattr(runner, 'max_iters', None)
        where = f'iteration {it}' + (f'/{total}' if total else '')
        if saved:
            kept = f'saved {saved}'
        else:
            last = read_pointer(runner.work_dir)
            kept = f'kept the last checkpoint {last}' if last else 'no checkpoint was saved'
        return (
            f'training stopped by {name} after {where}: {kept}. Continue with --resume '
            f'(same --work-dir {runner.work_dir}).'
        )


def accumulating_iterations(runner) -> int:
    """How many more iterations the run's optimizer wrapper(s) sum gradients over before
    their next step (``optim_wrapper.accumulative_counts``); 0 at a step. A checkpoint holds
    the weights and the optimizer, not the gradients summed since the last step: saved in
    between, ``--resume`` would lose them (mmengine warns "gradient of some iterations is
    lost")."""
    wrapper = getattr(runner, 'optim_wrapper', None)
    wrappers = wrapper.values() if hasattr(wrapper, 'values') else [wrapper]
    pending = 0
    for w in wrappers:
        counts = int(getattr(w, '_accumulative_counts', 1) or 1)
        inner = int(getattr(w, '_inner_count', 0))
        left = counts - inner % counts if inner % counts else 0
        max_counts = getattr(w, '_max_counts', None)
        if max_counts is not None and max_counts >= 0:  # mmengine steps at the last one too
            left = min(left, max(0, int(max_counts) - inner))
        pending = max(pending, left)
    return pending


def release_signal_handlers(runner) -> None:
    """Put back the SIGTERM / SIGINT handlers that ``runner``'s :class:`SignalCheckpointHook`
    installed. The hook does so in ``after_train``, which a run that raised (a failed save,
    a NaN loss, a lost rank) never reaches: without this, the process would keep the hook's
    handler, and the next Ctrl-C (in a notebook, a test session) would be swallowed."""
    for hook in getattr(runner, 'hooks', []):
        if isinstance(hook, SignalCheckpointHook):
            hook.restore_handlers()
