"""Faults of real machines during training, with nothing lost (issue 34; the slow ones,
with torchrun, are ``tools/fault_check.py``; the table is docs/faults.md).

Real processes, real signals, real files on the tiny ADE20K-layout config:

* a checkpoint save that hits the file-size limit (``RLIMIT_FSIZE`` set on the running
  process, as a full disk does) stops with the file and the cause named, leaves no
  half-written ``iter_4.pth``, keeps the previous checkpoint (even with
  ``max_keep_ckpts=1``) and ``last_checkpoint``; ``--resume`` ends bit-identical to an
  uninterrupted run;
* SIGTERM (and SIGINT) to ``tools/train.py``: the current iteration is saved, one line says
  so, status 128 + signal; ``--resume`` ends bit-identical to the uninterrupted run;
* a work dir removed, or its file system made read-only, while the run trains;
* a second run in a work dir another live run holds is refused; a crashed run's lock is
  taken over;
* ``last_checkpoint`` naming a corrupt file: resume falls back to the previous good one.
"""

from __future__ import annotations

import glob
import os
import os.path as osp
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import List, Tuple

import cv2
import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from tiny_seg import ADE_CFG, PYTHON, REPO, SHRINK, env, make_ade, options, roots
from tiny_seg import checkpoint_weights as _weights
from tiny_seg import same_weights as _same

from lookhere_dense.apis.train import find_resume_checkpoint, train_model
from lookhere_dense.errors import (
    CheckpointSaveError,
    TrainingInterruptedError,
    WorkDirLockedError,
    WorkDirNotWritableError,
)

pytestmark = pytest.mark.usefixtures('one_torch_thread')

N = 6  # iterations
#: Randomness everywhere (augmentation, dropout, drop-path); a checkpoint every 2nd
#: iteration and only ONE kept (mmengine removes the old one before writing the new one).
RUN = [
    f'train_cfg.max_iters={N}',
    'train_cfg.val_interval=2',
    'default_hooks.checkpoint.interval=2',
    'default_hooks.checkpoint.max_keep_ckpts=1',
    'model.decode_head.dropout_ratio=0.1',
    'model.backbone.drop_path_rate=0.1',
]


def _pointer(work: str) -> str:
    with open(osp.join(work, 'last_checkpoint')) as f:
        return f.read().strip()


def _leftovers(work: str) -> list:
    return glob.glob(osp.join(work, '.*.partial-*'))


@pytest.fixture(scope='module')
def data(tmp_path_factory) -> str:
    return make_ade(tmp_path_factory.mktemp('data'))


@pytest.fixture(scope='module')
def full(data, tmp_path_factory) -> str:
    """The uninterrupted run's work dir (checkpoints 2, 4, 6 all kept)."""
    work = str(tmp_path_factory.mktemp('full'))
    opts = [*roots(data), *SHRINK, *RUN, 'default_hooks.checkpoint.max_keep_ckpts=10']
    train_model(ADE_CFG, work_dir=work, cfg_options=options(*opts))
    return work


def _tool(work: str, data: str) -> subprocess.Popen:
    """``python tools/train.py`` on the tiny run, in a subprocess (one thread)."""
    return subprocess.Popen(
        [PYTHON, 'tools/train.py', ADE_CFG, '--work-dir', work, '--threads', '1']
        + ['--cfg-options', *roots(data), *SHRINK, *RUN],
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_checkpoint(child: subprocess.Popen, work: str, timeout: float = 240) -> None:
    """Until ``last_checkpoint`` names a checkpoint (the child keeps training)."""
    deadline = time.time() + timeout
    while time.time() < deadline and child.poll() is None:
        if osp.isfile(osp.join(work, 'last_checkpoint')) and _pointer(work):
            return
        time.sleep(0.02)
    out, err = child.communicate(timeout=60) if child.poll() is not None else ('', '')
    raise AssertionError(f'no checkpoint appeared (rc={child.poll()}): {err[-3000:]}')


def _resume_matches(work: str, data: str, full: str) -> None:
    runner = train_model(
        ADE_CFG, work_dir=work, resume='auto', cfg_options=options(*roots(data), *SHRINK, *RUN)
    )
    assert runner.iter == N
    assert _same(
        _weights(osp.join(work, f'iter_{N}.pth')), _weights(osp.join(full, f'iter_{N}.pth'))
    )


# ----------------------------------------------------------------------------------------
# a full disk (file-size limit) during a save
# ----------------------------------------------------------------------------------------
def test_a_save_that_hits_the_file_size_limit_loses_nothing(data, full, tmp_path):
    work = str(tmp_path / 'work')
    size = osp.getsize(osp.join(full, 'iter_2.pth'))
    child = _tool(work, data)
    try:
        _wait_for_checkpoint(child, work)  # iter_2.pth is complete and named
        # as if the disk filled up now: no file of this process may grow beyond half a
        # checkpoint (Python ignores SIGXFSZ, so the write fails with EFBIG)
        resource.prlimit(child.pid, resource.RLIMIT_FSIZE, (size // 2, size // 2))
        out, err = child.communicate(timeout=240)
    finally:
        child.kill()
    assert child.returncode == 2, err[-3000:]
    final = osp.join(work, 'iter_4.pth')
    assert f"error: checkpoint '{final}' could not be saved: the file-size limit was hit" in err
    assert (
        f'the previous checkpoint {osp.join(work, "iter_2.pth")} and last_checkpoint are ' in err
    )
    assert 'Traceback' not in err
    assert not osp.exists(final) and not _leftovers(work)
    assert _pointer(work) == osp.join(work, 'iter_2.pth')
    assert _same(_weights(osp.join(work, 'iter_2.pth')), _weights(osp.join(full, 'iter_2.pth')))
    _resume_matches(work, data, full)


def test_a_resumed_runs_failed_save_names_the_checkpoint_it_resumed_from(data, full, tmp_path):
    """mmengine's hook forgets its last save on resume: a resumed run whose first save
    failed said "no earlier checkpoint ... start the run again" (a review), while the
    checkpoint it resumed from and last_checkpoint were there."""
    work = tmp_path / 'w'
    work.mkdir()
    shutil.copy(osp.join(full, 'iter_2.pth'), work / 'iter_2.pth')
    (work / 'last_checkpoint').write_text(str(work / 'iter_2.pth'))
    size = osp.getsize(work / 'iter_2.pth')
    cfg = _config_with(tmp_path, f'fsize:{size // 2}', str(work))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        with pytest.raises(CheckpointSaveError) as exc:
            train_model(
                cfg,
                work_dir=str(work),
                resume='auto',
                cfg_options=options(*roots(data), *SHRINK, *RUN),
            )
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    msg = str(exc.value)
    assert f"checkpoint '{work / 'iter_4.pth'}' could not be saved" in msg, msg
    assert f'the previous checkpoint {work / "iter_2.pth"} and last_checkpoint are ' in msg
    assert msg.endswith('then continue with --resume.'), msg


def test_a_failed_pointer_write_leaves_no_checkpoint_resume_would_skip(
    data, tmp_path, monkeypatch
):
    """The disk fills up between publishing ``iter_4.pth`` and writing ``last_checkpoint``
    (ENOSPC from the pointer's write, our own function failing as the file system would):
    the message said "nothing was written under that name" beside a complete
    ``iter_4.pth``, which ``--resume`` then passed over silently (it follows the pointer,
    still ``iter_2``). The published file is removed, so the message is true."""
    import errno

    import lookhere_dense.engine.checkpointing as checkpointing

    real, calls = checkpointing.atomic_write_text, []

    def pointer_write(path, text):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, 'No space left on device', path)
        return real(path, text)

    monkeypatch.setattr(checkpointing, 'atomic_write_text', pointer_write)
    work = str(tmp_path / 'work')
    with pytest.raises(CheckpointSaveError) as exc:
        train_model(ADE_CFG, work_dir=work, cfg_options=options(*roots(data), *SHRINK, *RUN))
    final = osp.join(work, 'iter_4.pth')
    assert f"checkpoint '{final}' could not be saved: the disk is full" in str(exc.value)
    assert 'Nothing was written under that name' in str(exc.value)
    assert not osp.exists(final) and not _leftovers(work)
    assert _pointer(work) == osp.join(work, 'iter_2.pth')


# ----------------------------------------------------------------------------------------
# SIGTERM / SIGINT
# ----------------------------------------------------------------------------------------
def test_sigterm_saves_the_current_iteration_and_resume_loses_nothing(data, full, tmp_path):
    sig = signal.SIGTERM
    work = str(tmp_path / 'work')
    child = _tool(work, data)
    try:
        _wait_for_checkpoint(child, work)
        sent = time.time()
        child.send_signal(sig)
        out, err = child.communicate(timeout=120)
        stopped_in = time.time() - sent
    finally:
        child.kill()
    assert child.returncode == 128 + sig, err[-3000:]
    assert stopped_in < 30
    lines = [line for line in err.splitlines() if line.startswith('error:')]
    assert len(lines) == 1 and 'Traceback' not in err, err[-3000:]
    saved = _pointer(work)
    it = int(osp.basename(saved)[len('iter_') : -len('.pth')])
    assert 2 <= it < N
    assert lines[0] == (
        f'error: training stopped by {sig.name} after iteration {it}/{N}: saved {saved}. '
        f'Continue with --resume (same --work-dir {work}).'
    )
    _resume_matches(work, data, full)


@pytest.mark.parametrize('name', ['SIGINT', 'SIGHUP', 'SIGUSR1'])
def test_ctrl_c_saves_the_current_iteration_and_restores_the_handler(data, tmp_path, name):
    """SIGINT to this very process (sent by a hook after iteration 3); the same for a
    closed terminal (SIGHUP: the run ended with status 129 and nothing saved) and Slurm's
    ``--signal=USR1`` warning."""
    sig = getattr(signal, name)

    def unhandled(signum, frame):  # what runs if the hook did not take the signal
        pass

    # a handler of ours (not SIG_IGN, which nohup leaves for SIGHUP and the hook keeps)
    outer = signal.signal(sig, unhandled) if sig != signal.SIGINT else None
    before = signal.getsignal(sig)
    work = str(tmp_path / 'work')
    cfg = _config_with(tmp_path, name, '')
    try:
        with pytest.raises(TrainingInterruptedError) as exc:
            train_model(cfg, work_dir=work, cfg_options=options(*roots(data), *SHRINK, *RUN))
    finally:
        after = signal.getsignal(sig)
        if outer is not None:
            signal.signal(sig, outer)
    saved = osp.join(work, 'iter_3.pth')
    assert str(exc.value) == (
        f'training stopped by {name} after iteration 3/{N}: saved {saved}. Continue with '
        f'--resume (same --work-dir {work}).'
    )
    assert exc.value.exit_status == 128 + sig
    assert _pointer(work) == saved
    assert glob.glob(osp.join(work, '*.pth')) == [saved]  # max_keep_ckpts=1, after the save
    assert after is before


def test_ctrl_c_in_the_last_validation_is_acknowledged_and_said(data, tmp_path, capfd):
    """A SIGINT while the last validation runs: the run had nothing left to stop, ended
    with status 0 and said nothing (the README promises one line); now the signal is
    acknowledged when it arrives and the end of the run says what happened."""
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN in a background job (CI)
    work = str(tmp_path / 'work')
    cfg = tmp_path / 'sigint_val.py'
    cfg.write_text(
        f'_base_ = [{ADE_CFG!r}]\n'
        f'custom_hooks = [dict(type={_BreakWorkDirHook.__name__!r}, at={N}, '
        "action='SIGINT-val', path='')]\n"
    )
    runner = train_model(str(cfg), work_dir=work, cfg_options=options(*roots(data), *SHRINK, *RUN))
    assert runner.iter == N
    err = capfd.readouterr().err
    assert 'SIGINT received: the run saves and stops after the current training iteration' in err
    log = open(glob.glob(osp.join(work, '*', '*.log'))[0]).read()
    assert 'SIGINT received after the last training iteration: training had ended' in log
    assert signal.getsignal(signal.SIGINT) is before


def test_a_signal_mid_accumulation_trains_on_to_the_step_and_resume_loses_nothing(data, tmp_path):
    """With ``accumulative_counts=2`` a SIGINT after iteration 3 saved iteration 3: the
    gradient summed in it was in no checkpoint, and the resumed run ended up to 3e-3 away
    from the uninterrupted one (a review). The run trains on to iteration 4, the step."""
    acc = 'optim_wrapper = dict(accumulative_counts=2)\n'
    opts = options(*roots(data), *SHRINK, *RUN, 'default_hooks.checkpoint.max_keep_ckpts=10')
    base = str(tmp_path / 'base')
    base_cfg = tmp_path / 'acc.py'
    base_cfg.write_text(f'_base_ = [{ADE_CFG!r}]\n' + acc)
    train_model(str(base_cfg), work_dir=base, cfg_options=opts)
    work = str(tmp_path / 'work')
    cfg = _config_with(tmp_path, 'SIGINT', '', extra=acc)
    with pytest.raises(TrainingInterruptedError) as exc:
        train_model(cfg, work_dir=work, cfg_options=opts)
    saved = osp.join(work, 'iter_4.pth')
    assert str(exc.value).startswith(
        f'training stopped by SIGINT after iteration 4/{N}: saved {saved}.'
    ), str(exc.value)
    runner = train_model(str(base_cfg), work_dir=work, resume='auto', cfg_options=opts)
    assert runner.iter == N
    assert _same(
        _weights(osp.join(work, f'iter_{N}.pth')), _weights(osp.join(base, f'iter_{N}.pth'))
    )


def test_a_sighup_ignored_by_nohup_stays_ignored():
    """Under ``nohup`` (SIGHUP ignored) the hook leaves SIGHUP alone: logging out must not
    stop the run."""
    from lookhere_dense.engine.preemption import SignalCheckpointHook

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    hook = SignalCheckpointHook()
    try:
        hook.before_train(None)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == hook._handle
    finally:
        hook.restore_handlers()
        signal.signal(signal.SIGHUP, before)


def test_the_acknowledgement_promises_a_save_only_where_one_happens(capfd):
    """Without an iteration-based checkpoint hook (epoch-based loops) nothing is saved at
    the stop: the line said it would be."""
    from lookhere_dense.engine.preemption import SignalCheckpointHook

    hook = SignalCheckpointHook()
    hook.before_train(None)  # no checkpoint hook
    try:
        hook._handle(signal.SIGTERM, None)
    finally:
        hook.restore_handlers()
    err = capfd.readouterr().err
    assert 'SIGTERM received: the run stops (keeping its last checkpoint) after the' in err


# ----------------------------------------------------------------------------------------
# the work dir removed / read-only while the run trains
# ----------------------------------------------------------------------------------------
@HOOKS.register_module(force=True)
class _BreakWorkDirHook(Hook):
    """Test-only: after iteration ``at`` (checkpoint 2 saved), run ``action`` on the folder
    ``path``: ``'remove'`` (rm -rf) or ``'read-only'`` (remount its file system read-only);
    or ``'SIGINT'``: send it to this process; or ``'fsize:N'``: limit this process's files
    to ``N`` bytes (the caller restores the limit)."""

    priority = 'LOWEST'

    def __init__(self, at: int, action: str, path: str):
        self.at, self.action, self.path = at, action, path

    def before_val_iter(self, runner, batch_idx, data_batch=None):
        if self.action == 'SIGINT-val' and runner.iter == self.at and batch_idx == 0:
            os.kill(os.getpid(), signal.SIGINT)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 != self.at or self.action == 'SIGINT-val':
            return
        if self.action == 'remove':
            shutil.rmtree(self.path)
        elif self.action.startswith('SIG'):
            os.kill(os.getpid(), getattr(signal, self.action))
        elif self.action.startswith('fsize:'):
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (int(self.action[6:]), hard))
        else:
            subprocess.run(['mount', '-o', 'remount,ro', self.path], check=True)


def _config_with(tmp_path, action: str, path: str, extra: str = '') -> str:
    cfg = tmp_path / f'break_{action}.py'
    cfg.write_text(
        f'_base_ = [{ADE_CFG!r}]\n'
        f'custom_hooks = [dict(type={_BreakWorkDirHook.__name__!r}, at=3, action={action!r}, '
        f'path={path!r})]\n' + extra
    )
    return str(cfg)


def test_a_work_dir_removed_while_training_is_an_error_naming_it(data, tmp_path):
    """... and the run that raised leaves the process's SIGINT / SIGTERM handlers as they
    were (the signal hook's after_train is never reached)."""
    before = [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)]
    work = str(tmp_path / 'work')
    cfg = _config_with(tmp_path, 'remove', work)
    with pytest.raises(CheckpointSaveError) as exc:
        train_model(cfg, work_dir=work, cfg_options=options(*roots(data), *SHRINK, *RUN))
    assert str(exc.value).startswith(
        f"the folder '{work}' no longer exists (removed while training ran?): training "
        'stopped before iteration 4 and nothing more is written.'
    )
    assert not osp.exists(work)  # not silently created again
    assert [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)] == before


def _tmpfs(path: str, size: str = '64m') -> bool:
    os.makedirs(path)
    try:
        res = subprocess.run(
            ['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', path], capture_output=True
        )
    except OSError:
        return False
    return res.returncode == 0


def test_a_checkpoint_folder_turned_read_only_keeps_the_previous_checkpoint(data, full, tmp_path):
    """Checkpoints on their own file system (``default_hooks.checkpoint.out_dir``; a busy
    log file would keep the work dir's file system from being remounted), remounted
    read-only after checkpoint 2, as a failing network mount is."""
    mnt = str(tmp_path / 'mnt')
    if not _tmpfs(mnt):
        pytest.skip('needs mount (root with CAP_SYS_ADMIN) for a real read-only file system')
    work = str(tmp_path / 'work')
    ckpts = osp.join(mnt, 'work')  # mmengine: out_dir + the work dir's name
    try:
        cfg = _config_with(
            tmp_path, 'read-only', mnt, f'default_hooks = dict(checkpoint=dict(out_dir={mnt!r}))\n'
        )
        with pytest.raises(CheckpointSaveError) as exc:
            train_model(cfg, work_dir=work, cfg_options=options(*roots(data), *SHRINK, *RUN))
        assert str(exc.value).startswith(
            f"checkpoint '{osp.join(ckpts, 'iter_4.pth')}' could not be saved: the file system "
            'is read-only (EROFS)'
        )
        assert _pointer(work) == osp.join(ckpts, 'iter_2.pth')
        assert not osp.exists(osp.join(ckpts, 'iter_4.pth')) and not _leftovers(ckpts)
        assert _same(
            _weights(osp.join(ckpts, 'iter_2.pth')), _weights(osp.join(full, 'iter_2.pth'))
        )
    finally:
        subprocess.run(['umount', '-l', mnt])


def test_test_out_on_a_full_disk_leaves_no_truncated_prediction(data, full, tmp_path):
    """``tools/test.py --out`` on a file system with no room: mmseg's PNG write fails at the
    buffered file's ``close`` (PIL removes a file only when its writer fails), which left a
    0-byte ``<image>.png`` beside the error: it is removed and named; an older file there
    is not touched."""
    from lookhere_dense.apis.test import evaluate_checkpoint
    from lookhere_dense.errors import ToolError

    mnt = str(tmp_path / 'mnt')
    if not _tmpfs(mnt, '64k'):
        pytest.skip('needs mount (root with CAP_SYS_ADMIN) for a small file system')
    try:
        old = osp.join(mnt, 'older.png')
        with open(old, 'wb') as f:
            f.write(b"not a png, and not this run's")
        os.utime(old, (time.time() - 3600,) * 2)
        with open(osp.join(mnt, 'filler'), 'wb', buffering=0) as f:  # the rest of the room
            try:
                while True:
                    f.write(b'x' * 4096)
            except OSError:
                pass
        with pytest.raises(ToolError) as exc:
            evaluate_checkpoint(
                ADE_CFG,
                osp.join(full, 'iter_6.pth'),
                out=mnt,
                work_dir=str(tmp_path / 'test'),
                cfg_options=options(*roots(data), *SHRINK),
            )
        msg = str(exc.value)
        truncated = osp.join(mnt, 'ADE_val_00000001.png')
        assert msg.startswith(f'--out {mnt!r}: could not write the predictions: '), msg
        assert 'the disk is full (ENOSPC)' in msg, msg
        assert msg.endswith(f'the incomplete {truncated!r} is removed'), msg
        assert sorted(os.listdir(mnt)) == ['filler', 'older.png']
    finally:
        subprocess.run(['umount', '-l', mnt])


def test_only_this_runs_incomplete_output_is_removed(tmp_path):
    """mmdet's results dump (``--out`` a file) written by the failed run is removed, an
    older one is not; in a folder, a complete newest PNG stays."""
    import numpy as np
    from PIL import Image

    from lookhere_dense.apis.test import remove_incomplete_output

    dump = tmp_path / 'results.pkl'
    dump.write_bytes(b'half a pickle')
    start = time.time()
    assert remove_incomplete_output(str(dump), start - 10) == str(dump) and not dump.exists()
    dump.write_bytes(b'an earlier run')
    assert remove_incomplete_output(str(dump), time.time() + 10) is None and dump.exists()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(tmp_path / 'a.png')
    assert remove_incomplete_output(str(tmp_path), start - 10) is None
    assert (tmp_path / 'a.png').exists()


# ----------------------------------------------------------------------------------------
# two runs in one work dir
# ----------------------------------------------------------------------------------------
_HOLDER = r"""
import sys, time
from lookhere_dense.engine.workdir_lock import WorkDirLock
WorkDirLock(sys.argv[1]).acquire()
print('locked', flush=True)
time.sleep(600)
"""


def _holder(work: str, script: str = _HOLDER) -> Tuple[subprocess.Popen, List[str]]:
    """A process running ``script`` on ``work`` once it printed ``locked`` (and the words
    after it, returned)."""
    child = subprocess.Popen(
        [sys.executable, '-c', script, work],
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    first, *rest = child.stdout.readline().split()
    assert first == 'locked'
    return child, rest


def test_a_second_run_in_a_held_work_dir_is_refused_and_a_dead_holder_is_not(data, tmp_path):
    work = str(tmp_path / 'work')
    opts = options(*roots(data), *SHRINK, *RUN, 'train_cfg.max_iters=2')
    holder, _ = _holder(work)
    try:
        with pytest.raises(WorkDirLockedError) as exc:
            train_model(ADE_CFG, work_dir=work, cfg_options=opts)
        msg = str(exc.value)
        assert f"work dir '{work}' is in use by another training run (pid {holder.pid} on " in msg
        assert '--share-work-dir' in msg
        assert sorted(os.listdir(work)) == ['.lookhere_train.lock']  # nothing written
    finally:
        holder.kill()  # SIGKILL: the lock file stays, the kernel drops the lock
        holder.wait()
    runner = train_model(ADE_CFG, work_dir=work, cfg_options=opts)
    assert runner.iter == 2
    log = open(glob.glob(osp.join(work, '*', '*.log'))[0]).read()
    assert f'the previous run (pid {holder.pid} on ' in log and 'takes it over' in log
    with open(osp.join(work, '.lookhere_train.lock')) as f:
        assert f.read() == ''  # released at the end


_HOLDER_WITH_WORKER = r"""
import multiprocessing as mp, sys, time
from lookhere_dense.engine.workdir_lock import WorkDirLock
WorkDirLock(sys.argv[1]).acquire()
worker = mp.get_context('fork').Process(target=time.sleep, args=(600,))  # a dataloader worker
worker.start()
print('locked', worker.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_runs_lingering_workers_do_not_hold_its_lock(tmp_path):
    """A run SIGKILLed while a forked worker of it lives on: the lock is free at once (the
    worker closed its copy when forked); ``--resume`` right after the kill was refused as
    "in use by another training run" until the workers were gone."""
    from lookhere_dense.engine.workdir_lock import WorkDirLock

    work = str(tmp_path / 'work')
    child, (worker,) = _holder(work, _HOLDER_WITH_WORKER)
    child.kill()
    child.wait()
    try:
        os.kill(int(worker), 0)  # the worker outlives its parent
        lock = WorkDirLock(work).acquire()  # and does not hold the lock
        assert any(f'pid {child.pid} on ' in n for n in lock.notes), lock.notes
        lock.release()
    finally:
        os.kill(int(worker), signal.SIGKILL)


def test_a_forked_child_releasing_the_lock_changes_nothing(tmp_path):
    """A forked child that unwinds through ``release()`` (its copy of the lock was closed at
    the fork and the number may be reused) neither drops the lock nor empties its file."""
    from lookhere_dense.engine.workdir_lock import WorkDirLock

    work = str(tmp_path / 'work')
    lock = WorkDirLock(work).acquire()
    try:
        before = open(lock.path).read()
        other = tmp_path / 'other.txt'
        other.write_text('data')
        pid = os.fork()
        if pid == 0:  # the child: a file of its own takes the closed number, then release
            code = 1
            try:
                fd = os.open(str(other), os.O_RDWR)
                lock.release()
                code = 0 if os.fstat(fd).st_size == 4 else 3  # not truncated
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert open(lock.path).read() == before and str(os.getpid()) in before
        with pytest.raises(WorkDirLockedError):
            WorkDirLock(work).acquire()  # still held here
    finally:
        lock.release()


def test_sharing_a_held_work_dir_takes_no_lock(tmp_path):
    from lookhere_dense.apis.train import lock_work_dir

    work = str(tmp_path / 'work')
    holder, _ = _holder(work)
    try:
        assert lock_work_dir(work, share=True) is None  # --share-work-dir: no refusal
        with pytest.raises(WorkDirLockedError, match=f'pid {holder.pid} on '):
            lock_work_dir(work)
    finally:
        holder.kill()
        holder.wait()
    lock = lock_work_dir(work)
    assert lock is not None and 'takes it over' in lock.notes[0]
    lock.release()


# ----------------------------------------------------------------------------------------
# a corrupt checkpoint named by last_checkpoint
# ----------------------------------------------------------------------------------------
def test_a_killed_saves_partial_file_is_removed_by_the_next_run(data, full, tmp_path):
    """``kill -9`` during a save left ``.iter_N.pth.partial-<host>-<pid>`` (a checkpoint's size)
    in the work dir for good: the next run removes those whose writer is gone, says so, and
    leaves a live writer's alone."""
    from lookhere_dense.checkpoint.atomic import remove_stale_partials

    gone = subprocess.Popen([PYTHON, '-c', 'pass'])
    gone.wait()  # a pid no process has now
    work = tmp_path / 'w'
    shutil.copytree(full, work)
    host = socket.gethostname()
    stale = work / f'.iter_6.pth.partial-{host}-{gone.pid}'
    stale.write_bytes(b'\0' * 4096)
    live = work / f'.iter_6.pth.partial-{host}-{os.getppid()}'  # a live writer, maybe
    live.write_bytes(b'\0' * 10)
    # another machine's writer on a shared file system: its pid means nothing here
    other = work / f'.iter_6.pth.partial-elsewhere-{gone.pid}'
    other.write_bytes(b'\0' * 10)
    assert remove_stale_partials(str(tmp_path)) == []  # nothing there
    opts = [*roots(data), *SHRINK, *RUN, f'train_cfg.max_iters={N + 2}']
    train_model(ADE_CFG, work_dir=str(work), resume='auto', cfg_options=options(*opts))
    assert not stale.exists() and live.exists() and other.exists()
    logs = ''.join(p.read_text() for p in work.glob('*/*.log'))
    assert (
        'removed 1 unfinished checkpoint file(s) of a run killed while saving (4.0 KiB): '
        f'.iter_6.pth.partial-{host}-{gone.pid}'
    ) in logs


def _damaged_work_dir(full, tmp_path):
    """A work dir with a good iter_2 and a truncated iter_4 that last_checkpoint names."""
    work = tmp_path / 'w'
    work.mkdir()
    shutil.copy(osp.join(full, 'iter_2.pth'), work / 'iter_2.pth')
    data = open(osp.join(full, 'iter_4.pth'), 'rb').read()
    (work / 'iter_4.pth').write_bytes(data[: len(data) // 3])  # truncated
    (work / 'last_checkpoint').write_text(str(work / 'iter_4.pth'))
    return work


def test_a_corrupt_named_checkpoint_falls_back_to_the_previous_good_one(full, tmp_path):
    work = _damaged_work_dir(full, tmp_path)
    path, notes = find_resume_checkpoint(str(work))
    assert path == str(work / 'iter_2.pth')
    assert notes[0].startswith(
        f'--resume: skipped unreadable checkpoint(s) {work / "iter_4.pth"} ('
    )
    assert notes[0].endswith(f'; resuming from {work / "iter_2.pth"}')


def test_a_corrupt_named_checkpoint_does_not_fall_back_to_an_earlier_runs_later_one(
    full, tmp_path
):
    """A fresh run in a work dir that holds an earlier run's iter_30: its own newest
    checkpoint (the one last_checkpoint names) truncated, --resume resumed iter_30 of the
    other run and found nothing to train."""
    work = _damaged_work_dir(full, tmp_path)
    shutil.copy(osp.join(full, 'iter_4.pth'), work / 'iter_30.pth')  # the earlier run's
    path, notes = find_resume_checkpoint(str(work))
    assert path == str(work / 'iter_2.pth')
    assert len(notes) == 1 and notes[0].endswith(
        f'; resuming from {work / "iter_2.pth"} (not from iter_30.pth: numbered after '
        f'iter_4.pth, which {work / "last_checkpoint"} names, so left from an earlier run)'
    )
    (work / 'iter_2.pth').write_bytes(b'')  # nothing of this run readable: an error
    from lookhere_dense.errors import ToolError

    with pytest.raises(ToolError, match=r'no readable checkpoint in .*not from iter_30\.pth'):
        find_resume_checkpoint(str(work))
    (work / 'last_checkpoint').unlink()  # no record of the run: the newest readable file
    assert find_resume_checkpoint(str(work))[0] == str(work / 'iter_30.pth')


# ----------------------------------------------------------------------------------------
# the memory guard
# ----------------------------------------------------------------------------------------
_MEASURE = r"""
import json, sys, torch
torch.set_num_threads(1)
from lookhere_dense.engine.memory_guard import _pass_info, estimate_peak, install_memory_guard
from lookhere_dense.errors import MemoryBudgetError
from lookhere_dense.lookhere.vit import LookHereVisionTransformer
from research.memory import PeakMemory, free_memory

out = {}
m = LookHereVisionTransformer(img_size=64, embed_dims=384, num_layers=2, num_heads=6)
opt = torch.optim.AdamW(m.parameters())
m(torch.randn(1, 3, 64, 64))[0].sum().backward()  # kernels and buffers warm
opt.zero_grad(set_to_none=True)
for mode, size in (('inference', (1, 3, 1024, 1024)), ('training', (2, 3, 512, 768))):
    x = torch.randn(size)
    m.train(mode == 'training')
    with torch.set_grad_enabled(mode == 'training'):
        est = estimate_peak(**_pass_info(m, x, 0, None)['args'])['total']
    rises = []
    # training: one full step, the first (Adam's moments appear); inference: 3 passes, of
    # which the smallest is the pass's own (glibc's heap keeps part of what earlier passes
    # freed: single passes ranged 0.87-1.6x the estimate)
    for _ in range(1 if mode == 'training' else 3):
        free_memory()
        with PeakMemory('cpu') as mem:
            if mode == 'training':
                m(x)[0].sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                with torch.no_grad():
                    m(x)
        rises.append(mem.rise_bytes)
    out[mode] = dict(estimate=est, rise=min(rises), rises=rises)
if 'refuse' not in sys.argv:
    print('@@' + json.dumps(out))
    sys.exit()
# refused before it allocates: a budget just below the estimate
m.eval()
x = torch.randn(1, 3, 1024, 1024)
install_memory_guard(m, max_memory=int(out['inference']['estimate'] * 0.95))
free_memory()
with PeakMemory('cpu') as mem, torch.no_grad():
    try:
        m(x)
    except MemoryBudgetError as err:
        out['refused'] = dict(message=str(err), rise=mem.rise_bytes)
print('@@' + json.dumps(out))
"""


#: Fresh processes the memory is measured in. What glibc's heap keeps resident from earlier
#: passes settles per process: after its first pass a process repeats one level (the pass's
#: own peak, or that plus one to four 6 MiB activations: 0.87-1.27x the estimate over 20
#: processes), so more passes in one process do not find the pass's own peak, more
#: processes do.
MEASURE_PROCESSES = 3


@pytest.fixture(scope='module')
def measured() -> dict:
    """Estimates and measured peaks (rise of the peak RSS) of a width-384 trunk, each in
    ``MEASURE_PROCESSES`` fresh processes: whole 1024x1024 inference (4,097 tokens; the
    smallest of 3 passes per process) and a training step (batch 2, 512x768, with AdamW);
    ``rise`` is the smallest over the processes, ``rises`` every pass. The first process
    also runs a pass refused by a budget 5 % below its estimate (``refused``)."""
    import json

    runs = []
    for i in range(MEASURE_PROCESSES):
        args = [PYTHON, '-c', _MEASURE] + (['refuse'] if i == 0 else [])
        res = subprocess.run(
            args, cwd=REPO, env=env(), capture_output=True, text=True, timeout=300
        )
        assert '@@' in res.stdout, res.stderr[-3000:]
        runs.append(json.loads(res.stdout.split('@@')[-1]))
    out = dict(refused=runs[0]['refused'])
    for mode in ('inference', 'training'):
        estimates = {run[mode]['estimate'] for run in runs}
        assert len(estimates) == 1, estimates  # the estimate is the same in every process
        out[mode] = dict(
            estimate=estimates.pop(),
            rise=min(run[mode]['rise'] for run in runs),
            per_process=[run[mode]['rises'] for run in runs],
        )
    return out


@pytest.mark.parametrize('mode', ['inference', 'training'])
def test_the_memory_estimate_is_within_25_percent_of_the_measured_peak(measured, mode):
    ratio = measured[mode]['rise'] / measured[mode]['estimate']
    assert 0.75 <= ratio <= 1.25, measured[mode]
    # what glibc keeps on top of the pass's own peak stays bounded: in a typical process
    # (the median of the processes' largest passes)
    largest = sorted(max(rises) for rises in measured[mode]['per_process'])
    assert largest[len(largest) // 2] <= 1.6 * measured[mode]['estimate'], measured[mode]


def test_a_pass_over_the_budget_is_refused_before_it_allocates(measured):
    from lookhere_dense.engine.memory_guard import format_size

    refused = measured['refused']
    est = measured['inference']['estimate']
    assert refused['rise'] < 0.05 * est  # nothing of the pass was allocated
    msg = refused['message']
    assert msg.startswith('inference of a (1, 3, 1024, 1024) input refused before it allocates:')
    assert f'its estimated peak is {format_size(est)} (activations ' in msg
    assert f'the --max-memory budget is {format_size(int(0.95 * est))}. Cheaper: ' in msg
    assert '4097 tokens x 1, width 384, depth 2, backend ' in msg
    assert 'a frame 0.9' in msg and 'bfloat16' in msg and '--max-memory SIZE' in msg


def test_the_guard_refuses_above_the_line_and_never_at_or_below_it():
    from lookhere_dense.engine.memory_guard import (
        _pass_info,
        estimate_peak,
        install_memory_guard,
    )
    from lookhere_dense.errors import MemoryBudgetError
    from lookhere_dense.lookhere.vit import LookHereVisionTransformer

    m = LookHereVisionTransformer(img_size=64, embed_dims=96, num_layers=1, num_heads=6).eval()
    x = torch.randn(1, 3, 256, 256)
    with torch.no_grad():
        est = estimate_peak(**_pass_info(m, x, 0, None)['args'])['total']
        install_memory_guard(m, max_memory=est)  # exactly the estimate: runs
        assert m(x)[0].shape == (1, 96, 16, 16)
        install_memory_guard(m, max_memory=est - 1)  # one byte less: refused
        with pytest.raises(MemoryBudgetError, match='refused before it allocates'):
            m(x)
        install_memory_guard(m)  # the machine's limit: a small frame fits
        assert m(x)[0].shape == (1, 96, 16, 16)


def test_a_dense_bias_backend_is_refused_with_a_streaming_one_offered():
    from lookhere_dense.engine.memory_guard import estimate_peak, install_memory_guard
    from lookhere_dense.errors import MemoryBudgetError
    from lookhere_dense.lookhere.vit import LookHereVisionTransformer

    m = LookHereVisionTransformer(
        img_size=64, embed_dims=96, num_layers=2, num_heads=6, attn_backend='sdpa'
    ).eval()
    x = torch.randn(1, 3, 1024, 1024)  # 4097 tokens: 2 x 6 x 4097^2 float32 = 805 MB of bias
    budget = 2 * estimate_peak(4097, 96, 2, 6, 'tiled')['total']
    install_memory_guard(m, max_memory=budget)
    with pytest.raises(MemoryBudgetError) as exc, torch.no_grad():
        m(x)
    assert 'backend sdpa' in str(exc.value) and "attn_backend='fused'" in str(exc.value)


def test_training_over_the_budget_is_refused_at_its_first_step(data, tmp_path):
    from lookhere_dense.errors import ConfigError, MemoryBudgetError

    opts = options(*roots(data), *SHRINK, *RUN)
    with pytest.raises(MemoryBudgetError) as exc:
        train_model(ADE_CFG, work_dir=str(tmp_path / 'w'), max_memory='2M', cfg_options=opts)
    assert str(exc.value).startswith('training of a (2, 3, 128, 128) input refused before it')
    assert 'the --max-memory budget is 2.0 MiB' in str(exc.value)
    # the cheaper options name their setting and say when they still do not fit
    assert 'batch size 1 (train_dataloader.batch_size=1; ~' in str(exc.value)
    assert 'bfloat16 activations (--amp; ~' in str(exc.value)
    assert str(exc.value).count('still above the budget') == 2
    with pytest.raises(ConfigError, match="--max-memory '2 apples' is not a size"):
        train_model(ADE_CFG, work_dir=str(tmp_path / 'w'), max_memory='2 apples', cfg_options=opts)


def test_the_test_infer_and_extrapolate_tools_refuse_a_frame_over_their_budget(data, tmp_path):
    from tiny_seg import run_tools, write_checkpoint

    ckpt = write_checkpoint(str(tmp_path / 'model.pth'), SHRINK)
    image = sorted(glob.glob(osp.join(data, 'images', 'validation', '*.jpg')))[0]
    results = run_tools(
        [
            (
                'test',
                [ADE_CFG, ckpt, '--work-dir', str(tmp_path / 't'), '--max-memory', '3M']
                + ['--cfg-options', *roots(data), *SHRINK],
            ),
            (
                'infer',
                [ADE_CFG, ckpt, image, '--whole', '--out-dir', str(tmp_path / 'o')]
                + ['--max-memory', '3M', '--cfg-options', *SHRINK],
            ),
            (
                'extrapolate',
                [ADE_CFG, ckpt, '--tests', 'whole@x2', '--max-images', '1']
                + ['--out-dir', str(tmp_path / 'x'), '--max-memory', '3M']
                + ['--cfg-options', *roots(data), *SHRINK],
            ),
        ]
    )
    for res in results:
        assert res['rc'] == 2, res['stderr'][-3000:]
        err = res['stderr'].strip().splitlines()[-1]
        assert err.startswith('error: inference of a (1, 3, ') and 'refused before it' in err
        assert 'the --max-memory budget is 3.0 MiB' in err
    assert not glob.glob(str(tmp_path / 'o' / '*.png'))
    # a large photo seen small: the scores at its own size are the cost, and it says so
    big = str(tmp_path / 'big.jpg')
    cv2.imwrite(big, cv2.resize(cv2.imread(image), (1600, 1200)))
    (res,) = run_tools(
        [
            (
                'infer',
                [ADE_CFG, ckpt, big, '--short-side', '64', '--out-dir', str(tmp_path / 'o2')]
                + ['--max-memory', '200M', '--cfg-options', *SHRINK],
            )
        ]
    )
    err = res['stderr'].strip().splitlines()[-1]
    assert res['rc'] == 2 and 'refused before it' in err, res['stderr'][-3000:]
    assert "a smaller image file: the prediction is returned at the image's own size " in err
    assert '(1200x1600), whose 150 class scores alone take ~1.09 GiB' in err


def test_infer_refuses_a_frame_over_the_budget_before_it_resizes_the_image(data, tmp_path):
    """``tools/infer.py --size 8192x16384`` was refused only when the frame reached the
    model: the resized image and its float copies were in memory by then (a new user's
    16384x32768 reached 21.5 GB of a 24 GB machine before the refusal). The frame's size is
    checked before the pipeline resizes it: the refusal costs nothing."""
    from tiny_seg import write_checkpoint

    from lookhere_dense.apis.inference import segment_images
    from lookhere_dense.errors import MemoryBudgetError
    from research.memory import PeakMemory, free_memory

    ckpt = write_checkpoint(str(tmp_path / 'model.pth'), SHRINK)
    image = sorted(glob.glob(osp.join(data, 'images', 'validation', '*.jpg')))[0]
    free_memory()
    with PeakMemory('cpu') as mem, pytest.raises(MemoryBudgetError) as err:
        segment_images(
            ADE_CFG,
            ckpt,
            image,
            str(tmp_path / 'o'),
            whole=True,
            size=(8192, 16384),
            max_memory='1G',
            cfg_options=options(*SHRINK),
        )
    assert str(err.value).startswith(
        'inference of a (1, 3, 8192, 16384) input refused before it allocates'
    )
    # the resized frame alone is 384 MiB as uint8 pixels, 1.5 GiB as float32
    assert mem.rise_bytes < 150 * 2**20, mem.rise_bytes


def test_test_refuses_a_frame_over_the_budget_before_it_resizes_an_image(data, tmp_path):
    """The same for ``tools/test.py`` (mmengine's test loop): its largest frame, from the
    files' headers and the pipeline's resize, is checked before the first image loads
    (the guard saw it only in the model, the resized frame and its copies in memory)."""
    from tiny_seg import write_checkpoint

    from lookhere_dense.apis.test import evaluate_checkpoint
    from lookhere_dense.errors import MemoryBudgetError
    from research.memory import PeakMemory, free_memory

    ckpt = write_checkpoint(str(tmp_path / 'model.pth'), SHRINK)
    resize = ['test_dataloader.dataset.pipeline.1.scale=(16384,8192)']
    resize += ['test_dataloader.dataset.pipeline.1.keep_ratio=False']
    resize += ['test_dataloader.num_workers=0', 'test_dataloader.persistent_workers=False']
    free_memory()
    with PeakMemory('cpu') as mem, pytest.raises(MemoryBudgetError) as err:
        evaluate_checkpoint(
            ADE_CFG,
            ckpt,
            work_dir=str(tmp_path / 't'),
            max_memory='1G',
            cfg_options=options(*roots(data), *SHRINK, *resize),
        )
    assert str(err.value).startswith(  # the config's sliding windows, the frame's logits
        'inference of a (1, 3, 8192, 16384) input in sliding 128x128 windows refused before'
    )
    # the resized frame alone is 384 MiB as uint8 pixels, 1.5 GiB as float32
    assert mem.rise_bytes < 150 * 2**20, mem.rise_bytes
    # a resize it cannot size (mmseg's ResizeToMultiple, test-time augmentation) is left to
    # the guard in the model: not sized as the file's own size
    from mmseg.registry import DATASETS

    from lookhere_dense.data.checks import largest_frame

    dataset = DATASETS.build(
        dict(
            type='ADE20KDataset',
            data_root=data,
            data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        )
    )
    resize = dict(type='Resize', scale=(512, 128), keep_ratio=True)
    assert largest_frame(dataset, [dict(type='LoadImageFromFile'), resize]) is not None
    for other in (dict(type='ResizeToMultiple', size_divisor=32), dict(type='TestTimeAug')):
        assert largest_frame(dataset, [dict(type='LoadImageFromFile'), resize, other]) is None


def test_extrapolate_refuses_a_test_over_the_budget_before_it_resizes_an_image(data, tmp_path):
    """The same for the extrapolation report: its tests (``whole@8192x16384``) were refused
    when the first frame reached the model, the resized frame and its copies in memory;
    the largest frame a test gives is checked from the files' headers first."""
    from tiny_seg import write_checkpoint

    from lookhere_dense.errors import MemoryBudgetError
    from research.extrapolation import extrapolation_report
    from research.memory import PeakMemory, free_memory

    ckpt = write_checkpoint(str(tmp_path / 'model.pth'), SHRINK)
    free_memory()
    with PeakMemory('cpu') as mem, pytest.raises(MemoryBudgetError) as err:
        extrapolation_report(
            ADE_CFG,
            ckpt,
            tests=['whole@8192x16384'],
            split='val',
            max_images=1,
            out_dir=str(tmp_path / 'x'),
            device='cpu',
            cfg_options=options(*roots(data), *SHRINK),
            log=lambda *a: None,
            max_memory='1G',
        )
    assert str(err.value).startswith(
        'inference of a (1, 3, 8192, 16384) input refused before it allocates'
    )
    assert mem.rise_bytes < 150 * 2**20, mem.rise_bytes


def test_load_from_backbone_only_weights_is_refused_instead_of_training_from_random(
    data, tmp_path
):
    """mmengine's ``load_from`` of a file that shares no key with the model (backbone-only
    weights) listed every key as missing and trained from random weights; the training
    tools refuse it and point to the backbone's ``init_cfg``. A whole-model file loads."""
    from tiny_seg import write_checkpoint

    from lookhere_dense.errors import CheckpointError

    whole = write_checkpoint(str(tmp_path / 'model.pth'), SHRINK)
    state = torch.load(whole, weights_only=False)['state_dict']
    backbone = {k[len('backbone.') :]: v for k, v in state.items() if k.startswith('backbone.')}
    torch.save({'state_dict': backbone}, str(tmp_path / 'backbone.pth'))
    opts = [*roots(data), *SHRINK, *RUN, 'train_cfg.max_iters=1']
    with pytest.raises(
        CheckpointError,
        match=r"checkpoint '.*backbone\.pth' has none of the model's keys .* backbone-only "
        r'weights \(pretrained\): give them to the backbone, model\.backbone\.init_cfg',
    ):
        train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'w'),
            cfg_options=options(*opts, f'load_from={tmp_path / "backbone.pth"}'),
        )
    assert not glob.glob(str(tmp_path / 'w' / 'iter_*.pth'))
    train_model(
        ADE_CFG, work_dir=str(tmp_path / 'ok'), cfg_options=options(*opts, f'load_from={whole}')
    )
    assert osp.exists(tmp_path / 'ok' / 'iter_1.pth')


def test_a_new_max_iters_moves_the_lr_schedule_also_on_resume(data, tmp_path):
    """``--cfg-options train_cfg.max_iters=N``: the schedulers written with the config's
    length (PolyLR ``end=max_iters``) end at N, a warm-up longer than N is clipped; a run
    resumed to train longer follows the new schedule exactly as a fresh run of that length
    (mmengine restores the checkpoint's ``begin`` / ``end`` and steps from the last value:
    the LR stayed at its floor, or rose past the peak where a warm-up had ended early)."""
    from lookhere_dense.apis.cli import load_config

    cfg = load_config(ADE_CFG, {'train_cfg.max_iters': 80})
    assert [(p['begin'], p['end']) for p in cfg.param_scheduler] == [(0, 30), (30, 80)]
    cfg = load_config(ADE_CFG, {'train_cfg.max_iters': 4})
    assert [(p['begin'], p['end']) for p in cfg.param_scheduler] == [(0, 4), (3, 4)]
    cfg = load_config(ADE_CFG, {'train_cfg.max_iters': 80, 'param_scheduler': None})
    assert cfg.param_scheduler is None  # an explicit option wins

    keep = ['default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=10']
    opts = [*roots(data), *SHRINK, *RUN, 'train_cfg.val_interval=100', *keep]

    def run(work: str, iters: int, resume: bool = False):
        train_model(
            ADE_CFG,
            work_dir=str(tmp_path / work),
            resume='auto' if resume else None,
            cfg_options=options(*opts, f'train_cfg.max_iters={iters}'),
        )

    def saved(work: str, it: int):
        ckpt = torch.load(str(tmp_path / work / f'iter_{it}.pth'), weights_only=False)
        return ckpt['param_schedulers'], [g['lr'] for g in ckpt['optimizer']['param_groups']]

    def note(work: str) -> str:
        log = open(sorted(glob.glob(str(tmp_path / work / '*' / '*.log')))[-1]).read()
        return next(ln for ln in log.splitlines() if 'resume: the LR schedule' in ln)

    run('fresh', 36)  # the reference: a fresh run of the new length
    assert [(p['begin'], p['end']) for p in saved('fresh', 36)[0]] == [(0, 30), (30, 36)]
    # ended at its floor (PolyLR 30-32), resumed to 36: the decay of a 36-long run, not
    # the floor mmengine's restored end kept
    run('short', 32)
    assert [(p['begin'], p['end']) for p in saved('short', 32)[0]] == [(0, 30), (30, 32)]
    run('short', 36, resume=True)
    # resumed after the warm-up had ended early (a 20-long run: LinearLR 0-20, PolyLR
    # clipped to 19-20) to 36: the LR went on rising past the config's peak (LinearLR
    # stretched to 30 kept multiplying its last value) and never decayed (PolyLR kept 19-20)
    run('warm', 20)
    assert [(p['begin'], p['end']) for p in saved('warm', 20)[0]] == [(0, 20), (19, 20)]
    run('warm', 36, resume=True)
    # every kept checkpoint after the resume points (the last 10): the fresh run's state
    for work, first in (('short', 33), ('warm', 27)):
        for it in range(first, 37):
            assert saved(work, it) == saved('fresh', it), (work, it)
    assert 'replayed to iteration 32: param_scheduler[1] PolyLR: end 32 -> 36' in note('short')
    text = note('warm')
    assert 'param_scheduler[0] LinearLR: end 20 -> 30; param_scheduler[1] PolyLR: begin 19' in text
    assert "at iteration 20 the lr is the new schedule's" in text


def test_resuming_with_another_optimizer_constructor_names_the_cause(data, tmp_path):
    """A checkpoint of a plain AdamW run resumed with layer-wise lr decay (other parameter
    groups) stopped in torch's optimizer with 'different number of parameter groups'."""
    from lookhere_dense.errors import CheckpointError

    work = str(tmp_path / 'w')
    opts = [*roots(data), *SHRINK, *RUN, 'train_cfg.max_iters=2']
    train_model(ADE_CFG, work_dir=work, cfg_options=options(*opts))
    decay = [
        'train_cfg.max_iters=4',
        'optim_wrapper.constructor=LookHereLayerDecayOptimizerConstructor',
        'optim_wrapper.paramwise_cfg.decay_rate=0.9',
    ]
    with pytest.raises(
        CheckpointError,
        match=r"--resume: the optimizer state in '.*iter_2\.pth' has another number of "
        r'parameter groups .* another optim_wrapper constructor or paramwise_cfg',
    ):
        train_model(ADE_CFG, work_dir=work, resume='auto', cfg_options=options(*opts, *decay))


def test_resuming_without_the_pretrained_file_is_not_refused(data, tmp_path):
    """The pretrained file of a run, deleted before it is resumed: the resumed checkpoint
    replaces those weights, so it resumes with a note (it was refused, naming
    --allow-random-init, which then warned of RANDOM weights)."""
    from tiny_seg import write_checkpoint

    whole = write_checkpoint(str(tmp_path / 'model.pth'), SHRINK)
    state = torch.load(whole, weights_only=False)['state_dict']
    backbone = {k[len('backbone.') :]: v for k, v in state.items() if k.startswith('backbone.')}
    pretrained = tmp_path / 'pretrained.pth'
    torch.save({'state_dict': backbone}, str(pretrained))
    work = str(tmp_path / 'w')
    opts = [*roots(data), *SHRINK, *RUN, f'model.backbone.init_cfg.checkpoint={pretrained}']
    opts.append('model.backbone.init_cfg.type=Pretrained')
    train_model(ADE_CFG, work_dir=work, cfg_options=options(*opts, 'train_cfg.max_iters=2'))
    pretrained.unlink()
    runner = train_model(
        ADE_CFG, work_dir=work, resume='auto', cfg_options=options(*opts, 'train_cfg.max_iters=4')
    )
    assert runner.iter == 4 and osp.exists(osp.join(work, 'iter_4.pth'))
    log = open(glob.glob(osp.join(work, '*', '*.log'))[-1]).read()
    assert f"pretrained file '{pretrained}' not found: not needed, the weights come from" in log
    assert 'RANDOM' not in log


def test_a_refused_extrapolation_test_is_a_row_and_the_other_tests_run(data, tmp_path):
    """A budget between the estimates of a 0.5x and a 3x whole frame: the 3x test is
    refused before it allocates and reported as a ``refused`` row (JSON, table, plot); the
    0.5x test runs and is scored. All refused: the first refusal, no report."""
    import json

    from tiny_seg import write_checkpoint

    from lookhere_dense.errors import MemoryBudgetError
    from research.extrapolation import extrapolation_report

    ckpt = write_checkpoint(str(tmp_path / 'model.pth'), SHRINK)
    lines = []
    kwargs = dict(
        max_images=1,
        out_dir=str(tmp_path / 'x'),
        cfg_options=options(*roots(data), *SHRINK),
        max_memory='40M',
        log=lines.append,
    )
    report = extrapolation_report(ADE_CFG, ckpt, ['whole@x0.5', 'whole@x3'], **kwargs)
    small, big = report['rows']
    assert 'refused' not in small and 0 <= small['mIoU'] <= 100 and small['images'] == 1
    assert big['refused'].startswith('inference of a (1, 3, ')
    assert 'the --max-memory budget is 40.0 MiB' in big['refused']
    assert big['limit_mb'] == 40.0 and big['estimate_mb'] > 40.0
    assert big['limit_source'] == 'the --max-memory budget'
    on_disk = json.loads(open(report['json']).read())
    assert on_disk['rows'][1]['refused'] == big['refused']
    assert osp.getsize(report['png']) > 0
    log = '\n'.join(lines)
    assert 'whole@x3: refused before it allocated (estimated peak ' in log
    assert '| whole@x3 | - | - | refused | - | - | est. ' in log
    assert (
        'refused: whole@x3: the memory guard estimated the rise of memory of their pass above'
        in log
    )
    with pytest.raises(MemoryBudgetError, match='the --max-memory budget is 40.0 MiB'):
        extrapolation_report(ADE_CFG, ckpt, ['whole@x3', 'whole@x4'], **dict(kwargs, name='all'))
    assert not osp.exists(str(tmp_path / 'x' / 'all.json'))


def test_a_refused_test_leaves_nothing_to_the_next_rows_memory(data, tmp_path):
    """The refused pass's input (its enlarged images) was held by the kept refusal's
    traceback while the next test ran: whole@x1 after a refused whole@x40 measured 1458 MB
    of peak against 955 MB alone. Now within a few per cent."""
    from tiny_seg import write_checkpoint

    from research.extrapolation import extrapolation_report

    ckpt = write_checkpoint(str(tmp_path / 'model.pth'), SHRINK)
    kwargs = dict(
        max_images=1,
        cfg_options=options(*roots(data), *SHRINK),
        max_memory='300M',
        log=lambda line: None,
    )
    alone = extrapolation_report(
        ADE_CFG, ckpt, ['whole@x1'], out_dir=str(tmp_path / 'a'), **kwargs
    )
    after = extrapolation_report(
        ADE_CFG, ckpt, ['whole@x40', 'whole@x1'], out_dir=str(tmp_path / 'b'), **kwargs
    )
    assert after['rows'][0].get('refused')
    peak_alone, peak_after = alone['rows'][0]['peak_mem_mb'], after['rows'][1]['peak_mem_mb']
    assert peak_after < 1.25 * peak_alone, (peak_alone, peak_after)  # the leak: +54 %


def test_an_eval_batch_of_mixed_sizes_names_the_batch_size_and_the_images(data, tmp_path):
    """mmseg predicts one size per batch: a test batch of 2 keep-ratio images of other
    aspects stops naming ``test_dataloader.batch_size``, the sizes and the files (was
    mmseg's bare assertion); the same batch size with one size per batch runs; training's
    validation batches are checked the same way."""
    from tiny_seg import write_checkpoint

    from lookhere_dense.apis.test import evaluate_checkpoint
    from lookhere_dense.errors import ConfigError

    ckpt = write_checkpoint(str(tmp_path / 'model.pth'), SHRINK)
    two = [*roots(data), *SHRINK, 'test_dataloader.batch_size=2']
    pattern = (
        r'test_dataloader.batch_size=2: test batch 0 holds images of different sizes '
        r"\(171x128 \('.*ADE_val_00000001.jpg'\) and 128x163 .*Set --cfg-options "
        r'test_dataloader.batch_size=1'
    )
    with pytest.raises(ConfigError, match=pattern):
        evaluate_checkpoint(ADE_CFG, ckpt, work_dir=str(tmp_path / 't'), cfg_options=options(*two))
    # a batch size above the dataset's: the configured one is named, not the images held
    big = [*roots(data), *SHRINK, 'test_dataloader.batch_size=64']
    with pytest.raises(ConfigError, match=r'test_dataloader.batch_size=64: test batch 0 holds'):
        evaluate_checkpoint(ADE_CFG, ckpt, work_dir=str(tmp_path / 'b'), cfg_options=options(*big))
    mixed = [  # a preprocessor built on mmseg's (the study's mixed-crops aid): checked too
        'model.data_preprocessor.type=MixedCropSegDataPreProcessor',
        'model.data_preprocessor.crop_sizes=[64]',
    ]
    with pytest.raises(ConfigError, match=pattern):
        evaluate_checkpoint(
            ADE_CFG, ckpt, work_dir=str(tmp_path / 'm'), cfg_options=options(*two, *mixed)
        )
    fixed = options(*two, 'test_dataloader.dataset.pipeline.1.keep_ratio=False')
    metrics = evaluate_checkpoint(ADE_CFG, ckpt, work_dir=str(tmp_path / 'f'), cfg_options=fixed)
    assert 0 <= metrics['mIoU'] <= 100
    with pytest.raises(ConfigError, match=r'val_dataloader.batch_size=2: val batch 0 holds'):
        train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'w'),
            cfg_options=options(*roots(data), *SHRINK, *RUN, 'val_dataloader.batch_size=2'),
        )


# ----------------------------------------------------------------------------------------
# data faults mid-run (the dataloader-worker kill and resized labels: tools/fault_check.py)
# ----------------------------------------------------------------------------------------
def test_images_deleted_after_the_dataset_was_listed_stop_naming_the_file(tmp_path):
    root = make_ade(tmp_path / 'data')
    images = osp.join(root, 'images', 'training')
    cfg = _config_with(tmp_path, 'remove', images)
    with pytest.raises(FileNotFoundError) as exc:
        train_model(
            cfg, work_dir=str(tmp_path / 'w'), cfg_options=options(*roots(root), *SHRINK, *RUN)
        )
    assert osp.join(images, 'ADE_train_0000') in str(exc.value)
    assert _pointer(str(tmp_path / 'w')) == str(tmp_path / 'w' / 'iter_2.pth')


def _checkpoints_on_a_small_disk(tmp_path, full: str, checkpoints: float):
    """A tmpfs with room for ``checkpoints`` of the run's checkpoints, and a config saving
    its checkpoints there: ``(mount point, bytes, config path)``; skips without mount."""
    mnt = str(tmp_path / 'mnt')
    room = int(checkpoints * osp.getsize(osp.join(full, 'iter_2.pth')))
    if not _tmpfs(mnt, f'{room // 4096 * 4}k'):
        pytest.skip('needs mount (root with CAP_SYS_ADMIN) for a real small file system')
    cfg = tmp_path / 'small_disk.py'
    cfg.write_text(
        f'_base_ = [{ADE_CFG!r}]\ndefault_hooks = dict(checkpoint=dict(out_dir={mnt!r}))\n'
    )
    return mnt, room, str(cfg)


def test_no_room_for_a_checkpoint_or_for_the_run_is_refused_before_training(data, full, tmp_path):
    """A checkpoint folder with less room than one checkpoint (here more than the weights,
    less than weights and AdamW's state): refused before the first iteration, naming the
    sizes (it was only warned about, with "the previous checkpoint is kept", and the run
    trained until its first save and lost it all); a work dir with no room at all: one
    line naming the disk (a traceback from the lock or config write before)."""
    mnt, room, cfg = _checkpoints_on_a_small_disk(tmp_path, full, 0.6)
    work = str(tmp_path / 'work')
    try:
        with pytest.raises(CheckpointSaveError) as exc:
            train_model(cfg, work_dir=work, cfg_options=options(*roots(data), *SHRINK, *RUN))
        msg = str(exc.value)
        assert msg.startswith(f"the checkpoint folder '{osp.join(mnt, 'work')}' has ")
        assert 'less than one checkpoint of this run (about ' in msg, msg
        assert "and the optimizer's state): the first save at iteration" in msg
        assert not osp.exists(osp.join(work, 'last_checkpoint'))  # nothing trained
        with open(osp.join(mnt, 'fill'), 'wb') as f:  # now no room at all: the work dir there
            try:
                f.write(b'\0' * room * 2)
            except OSError:
                pass
        with pytest.raises(WorkDirNotWritableError, match=r'the disk is full \(ENOSPC\)'):
            train_model(ADE_CFG, work_dir=osp.join(mnt, 'w2'), cfg_options=options(*roots(data)))
    finally:
        subprocess.run(['umount', '-l', mnt])


def test_a_file_size_limit_below_a_checkpoint_is_refused_before_training(data, full, tmp_path):
    """``ulimit -f`` below one checkpoint: the first save fails with EFBIG and loses every
    iteration before it, so the run is refused before the first iteration."""
    size = osp.getsize(osp.join(full, 'iter_2.pth'))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(0.6 * size), hard))
    try:
        with pytest.raises(CheckpointSaveError) as exc:
            train_model(
                ADE_CFG,
                work_dir=str(tmp_path / 'w'),
                cfg_options=options(*roots(data), *SHRINK, *RUN),
            )
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    msg = str(exc.value)
    assert msg.startswith('the file-size limit of this process (ulimit -f) is '), msg
    assert 'less than one checkpoint of this run' in msg and 'ulimit -f unlimited' in msg
    assert not osp.exists(tmp_path / 'w' / 'last_checkpoint')


def test_a_full_disk_keeps_the_previous_checkpoint(data, full, tmp_path):
    """Checkpoints on a real file system with room for 1.5 checkpoints: the second save
    (the first is still there: it is removed only after the new one is complete) fills the
    disk (ENOSPC)."""
    mnt, _, cfg = _checkpoints_on_a_small_disk(tmp_path, full, 1.5)
    work = str(tmp_path / 'work')
    ckpts = osp.join(mnt, 'work')
    try:
        with pytest.raises(CheckpointSaveError) as exc:
            train_model(cfg, work_dir=work, cfg_options=options(*roots(data), *SHRINK, *RUN))
        assert str(exc.value).startswith(
            f"checkpoint '{osp.join(ckpts, 'iter_4.pth')}' could not be saved: the disk is "
            'full (ENOSPC)'
        )
        assert _pointer(work) == osp.join(ckpts, 'iter_2.pth')
        assert os.listdir(ckpts) == ['iter_2.pth']  # no partial file left
        assert _same(
            _weights(osp.join(ckpts, 'iter_2.pth')), _weights(osp.join(full, 'iter_2.pth'))
        )
    finally:
        subprocess.run(['umount', '-l', mnt])
