"""Interruption and resume: a training process killed with SIGKILL and resumed with
``--resume`` ends with exactly the weights of an uninterrupted run (CPU, num_workers=0,
with dropout, drop-path, validation after each checkpoint, a damaged newest checkpoint and a
random seed in the resumed run),
and the resume choices (fallback, nothing readable, empty work dir) say what they do."""

from __future__ import annotations

import glob
import os
import os.path as osp
import shutil
import signal
import subprocess
import time

import pytest
from tiny_seg import ADE_CFG, PYTHON, REPO, SHRINK, env, make_ade, options, roots
from tiny_seg import checkpoint_weights as _weights
from tiny_seg import same_weights as _same

from lookhere_dense.apis.train import build_train_config, find_resume_checkpoint, train_model
from lookhere_dense.errors import ToolError, WorkDirNotWritableError

pytestmark = pytest.mark.usefixtures('one_torch_thread')

N = 6  # iterations of the full run
#: Randomness everywhere: augmentation (numpy / random), dropout and drop-path (torch);
#: a checkpoint and a validation after every iteration (so the resumed run starts where
#: the uninterrupted one validated).
RUN = [
    f'train_cfg.max_iters={N}',
    'train_cfg.val_interval=1',
    'default_hooks.checkpoint.interval=1',
    'default_hooks.checkpoint.max_keep_ckpts=10',
    'model.decode_head.dropout_ratio=0.1',
    'model.backbone.drop_path_rate=0.1',
]


def _latest(work: str) -> int:
    """The iteration ``last_checkpoint`` names; -1 while mmengine is (re)writing it (the
    file is empty or partial for a moment: polling it can land there)."""
    with open(osp.join(work, 'last_checkpoint')) as f:
        text = f.read().strip()
    try:
        return int(text.rsplit('_', 1)[1][: -len('.pth')])
    except (IndexError, ValueError):
        return -1


def _newest_complete(work: str) -> int:
    """The newest complete checkpoint after a kill: the one ``last_checkpoint`` names, or,
    when the kill hit while that file was rewritten, the newest ``iter_*.pth`` (mmengine
    writes a checkpoint before naming it there)."""
    named = _latest(work)
    if named >= 0:
        return named
    return max(
        int(osp.basename(p)[len('iter_') : -len('.pth')])
        for p in glob.glob(osp.join(work, 'iter_*.pth'))
    )


def _train(work: str, opts: list, err) -> subprocess.Popen:
    """``python tools/train.py`` (one thread) in a subprocess."""
    return subprocess.Popen(
        [
            PYTHON,
            'tools/train.py',
            ADE_CFG,
            '--work-dir',
            work,
            '--threads',
            '1',
            '--cfg-options',
            *opts,
        ],
        cwd=REPO,
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=err,
    )


def _kill_after_checkpoint(work: str, opts: list, k: int) -> int:
    """Run ``tools/train.py`` in a subprocess and SIGKILL it as soon as checkpoint ``k`` is
    complete (mmengine writes ``last_checkpoint`` after the file). Returns the newest
    complete checkpoint's iteration."""
    err = open(osp.join(osp.dirname(work), 'child.err'), 'w')
    child = _train(work, opts, err)
    deadline = time.time() + 240
    try:
        while time.time() < deadline and child.poll() is None:
            if osp.isfile(osp.join(work, 'last_checkpoint')) and _latest(work) >= k:
                break
            time.sleep(0.02)
        assert child.poll() is None, open(err.name).read()[-3000:]
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
        err.close()
    return _newest_complete(work)


def test_a_killed_run_resumes_bit_exactly(tmp_path):
    root = make_ade(tmp_path / 'data')
    opts = [*roots(root), *SHRINK, *RUN]
    full = str(tmp_path / 'full')
    train_model(ADE_CFG, work_dir=full, cfg_options=options(*opts))  # uninterrupted

    work = str(tmp_path / 'killed')
    newest = _kill_after_checkpoint(work, opts, 2)
    assert 2 <= newest < N
    # the killed process wrote the same checkpoints as the uninterrupted one
    assert _same(
        _weights(osp.join(work, f'iter_{newest - 1}.pth')),
        _weights(osp.join(full, f'iter_{newest - 1}.pth')),
    )
    # the newest checkpoint is damaged (as if the kill had hit it while written)
    newest_path = osp.join(work, f'iter_{newest}.pth')
    with open(newest_path, 'r+b') as f:
        f.truncate(os.path.getsize(newest_path) // 2)

    # resumed with a random seed: the sampler seed must come from the checkpoint too
    runner = train_model(
        ADE_CFG, work_dir=work, resume='auto', cfg_options=options(*opts, 'randomness.seed=None')
    )
    assert runner.iter == N
    log = open(sorted(glob.glob(osp.join(work, '*', '*.log')))[-1]).read()
    assert f'skipped unreadable checkpoint(s) {newest_path}' in log
    assert f'resumed epoch: 0, iter: {newest - 1}' in log
    assert _same(
        _weights(osp.join(work, f'iter_{N}.pth')), _weights(osp.join(full, f'iter_{N}.pth'))
    )


def test_resume_without_a_readable_checkpoint_is_an_error(tmp_path):
    work = tmp_path / 'w'
    work.mkdir()
    (work / 'iter_3.pth').write_bytes(b'PK\x03\x04 not really a zip')
    (work / 'iter_2.pth').write_bytes(b'')
    (work / 'last_checkpoint').write_text(str(work / 'iter_3.pth'))
    with pytest.raises(ToolError, match='no readable checkpoint in') as exc:
        find_resume_checkpoint(str(work))
    assert 'iter_3.pth' in str(exc.value) and 'iter_2.pth (empty file)' in str(exc.value)


def test_resume_in_an_empty_work_dir_starts_at_iteration_0_and_says_so(tmp_path):
    path, notes = find_resume_checkpoint(str(tmp_path / 'nothing_here'))
    assert path is None
    assert notes == [
        f'--resume: no checkpoint in {str(tmp_path / "nothing_here")!r}, so '
        'training starts from iteration 0 (check --work-dir if you expected to '
        'continue a run)'
    ]
    cfg, warned = build_train_config(
        ADE_CFG,
        work_dir=str(tmp_path / 'nothing_here'),
        resume='auto',
        check_data=False,
        cfg_options=options(*SHRINK, 'load_from=init.pth'),
    )
    assert cfg.resume is False and cfg.load_from == 'init.pth'  # the config's own init stays
    assert notes[0] in warned


# ----------------------------------------------------------------------------------------
# a work dir copied from another run's (``cp -r``): its last_checkpoint names the original
# ----------------------------------------------------------------------------------------
def _tiny_checkpoint(path) -> str:
    """A small readable Runner-like checkpoint (no model build)."""
    import torch

    torch.save({'state_dict': {'w': torch.zeros(2)}, 'meta': {'iter': 0}}, str(path))
    return str(path)


def _copied_work_dir(tmp_path):
    """``ref`` with iter_2 / iter_4; ``dmg`` a copy of it whose iter_4 is truncated and
    whose last_checkpoint (copied) still names ``ref/iter_4.pth``."""
    ref, dmg = tmp_path / 'ref', tmp_path / 'dmg'
    for work in (ref, dmg):
        work.mkdir()
        for n in (2, 4):
            _tiny_checkpoint(work / f'iter_{n}.pth')
        (work / 'last_checkpoint').write_text(str(ref / 'iter_4.pth'))
    size = (dmg / 'iter_4.pth').stat().st_size
    with open(dmg / 'iter_4.pth', 'r+b') as f:
        f.truncate(size // 2)
    return ref, dmg


def test_resume_ignores_a_last_checkpoint_that_names_another_work_dir(tmp_path):
    ref, dmg = _copied_work_dir(tmp_path)
    path, notes = find_resume_checkpoint(str(dmg))
    assert path == str(dmg / 'iter_2.pth')  # not ref/iter_4.pth
    ignored = [n for n in notes if str(ref / 'iter_4.pth') in n]
    assert len(ignored) == 1 and '\n' not in ignored[0]
    assert f"outside the work dir '{dmg}'" in ignored[0]
    assert ignored[0].endswith(f'ignored; resuming from {dmg / "iter_2.pth"}')
    assert any(f'skipped unreadable checkpoint(s) {dmg / "iter_4.pth"}' in n for n in notes)
    # what tools/train.py --resume builds
    cfg, warned = build_train_config(
        ADE_CFG,
        work_dir=str(dmg),
        resume='auto',
        check_data=False,
        cfg_options=options(*SHRINK),
    )
    assert cfg.resume is True and cfg.load_from == str(dmg / 'iter_2.pth')
    assert ignored[0] in warned


def test_resume_with_nothing_readable_in_the_copied_work_dir_is_an_error(tmp_path):
    ref, dmg = _copied_work_dir(tmp_path)
    (dmg / 'iter_2.pth').write_bytes(b'')
    with pytest.raises(ToolError, match='no readable checkpoint in') as exc:
        find_resume_checkpoint(str(dmg))
    assert str(ref / 'iter_4.pth') in str(exc.value) and 'not used' in str(exc.value)
    # only the pointer, no checkpoint of its own: an error that says how to use the file
    for n in (2, 4):
        (dmg / f'iter_{n}.pth').unlink()
    with pytest.raises(ToolError, match='no checkpoint in') as exc:
        find_resume_checkpoint(str(dmg))
    assert f'pass --resume {ref / "iter_4.pth"}' in str(exc.value)


def test_resume_follows_last_checkpoint_into_the_configs_checkpoint_out_dir(tmp_path):
    from mmengine.config import Config

    from lookhere_dense.apis.train import checkpoint_folder

    work, out = tmp_path / 'run1', tmp_path / 'ckpts'
    work.mkdir()
    (out / 'run1').mkdir(parents=True)
    named = _tiny_checkpoint(out / 'run1' / 'iter_3.pth')
    (work / 'last_checkpoint').write_text(named)
    cfg = Config(dict(work_dir=str(work), default_hooks=dict(checkpoint=dict(out_dir=str(out)))))
    assert checkpoint_folder(cfg) == str(out / 'run1')  # as mmengine's CheckpointHook
    assert find_resume_checkpoint(str(work), checkpoint_folder(cfg)) == (named, [])


# ----------------------------------------------------------------------------------------
# a work dir that cannot be written
# ----------------------------------------------------------------------------------------
def test_an_unwritable_work_dir_is_one_error_line_naming_it(tmp_path, capsys):
    """A work dir under a regular file cannot be created, even by root (chmod would not
    stop root)."""
    from lookhere_dense.apis.cli import run_main
    from lookhere_dense.train import main

    root = make_ade(tmp_path / 'data')
    (tmp_path / 'plain_file').write_text('')
    work = str(tmp_path / 'plain_file' / 'wd')
    argv = [ADE_CFG, '--work-dir', work, '--threads', '1', '--cfg-options']
    with pytest.raises(SystemExit) as exc:
        run_main(main, argv + [*roots(root), *SHRINK])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and 'Traceback' not in err[0], err
    assert err[0].startswith(f'error: work dir {work!r} cannot be written: ')
    assert 'not a folder' in err[0] and '--work-dir' in err[0]


def test_a_work_dir_that_refuses_new_files_is_refused_before_the_lock(tmp_path, monkeypatch):
    """``chattr +i`` / a read-only mount: the folder exists but no file can be created in
    it (simulated: creating files there fails with EPERM)."""
    import errno

    from lookhere_dense.apis.train import lock_work_dir

    work = tmp_path / 'ro'
    work.mkdir()
    real_open = os.open

    def refusing_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT and osp.dirname(str(path)) == str(work):
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, 'open', refusing_open)
    for share in (False, True):  # --share-work-dir takes no lock but still needs the folder
        with pytest.raises(WorkDirNotWritableError) as exc:
            lock_work_dir(str(work), share=share)
        assert str(exc.value).startswith(
            f'work dir {str(work)!r} cannot be written: operation not permitted (EPERM)'
        )
    assert os.listdir(work) == []


# ----------------------------------------------------------------------------------------
# max_iters / max_epochs for the other kind of training loop
# ----------------------------------------------------------------------------------------
def test_max_iters_on_an_epoch_based_loop_names_max_epochs_and_the_reverse(tmp_path):
    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.errors import ConfigError

    # mmdet's LSJ configs train with EpochBasedTrainLoop
    epoch_cfg = 'mmdet::common/lsj-100e_coco-instance.py'
    with pytest.raises(ConfigError) as exc:
        load_config(epoch_cfg, options('train_cfg.max_iters=2'))
    msg = str(exc.value)
    assert msg.startswith('--cfg-options train_cfg.max_iters=2: ')
    assert 'EpochBasedTrainLoop' in msg and 'set train_cfg.max_epochs instead' in msg
    assert load_config(epoch_cfg, options('train_cfg.max_epochs=2')).train_cfg.max_epochs == 2
    # switching the loop type in the options: max_iters is right, but the config's
    # max_epochs stays (the loop would refuse it)
    switch = options('train_cfg.type=IterBasedTrainLoop', 'train_cfg.max_iters=2')
    with pytest.raises(ConfigError, match='has max_epochs=25, which IterBasedTrainLoop does'):
        load_config(epoch_cfg, switch)

    with pytest.raises(ConfigError, match='set train_cfg.max_iters instead') as exc:
        load_config(ADE_CFG, options('train_cfg.max_epochs=2'))
    assert 'IterBasedTrainLoop' in str(exc.value)
    # a loop given by ``by_epoch`` (no type)
    (tmp_path / 'by_epoch.py').write_text('train_cfg = dict(by_epoch=True, max_epochs=3)\n')
    with pytest.raises(ConfigError, match='max_iter.*set train_cfg.max_epochs instead'):
        load_config(str(tmp_path / 'by_epoch.py'), options('train_cfg.max_iter=2'))


# ----------------------------------------------------------------------------------------
# what mmengine resumes in silence: nothing left to train, another precision
# ----------------------------------------------------------------------------------------
def _run_log(runner) -> str:
    return open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()


def test_resume_says_when_nothing_is_left_and_when_the_precision_changes(tmp_path):
    root = make_ade(tmp_path / 'data', num_train=2, num_val=1)
    work = str(tmp_path / 'w')
    base = [*roots(root), *SHRINK, 'train_cfg.val_interval=100']
    train_model(ADE_CFG, work_dir=work, cfg_options=options(*base, 'train_cfg.max_iters=1'))

    # resumed from its last checkpoint with the same max_iters: mmengine ends at once
    done = train_model(
        ADE_CFG, work_dir=work, resume='auto', cfg_options=options(*base, 'train_cfg.max_iters=1')
    )
    assert done.iter == 1
    assert (
        f'nothing to train: the run starts at iteration 1 (resumed from '
        f'{osp.join(work, "iter_1.pth")}) and train_cfg.max_iters=1. To train longer raise '
        'it, e.g. --cfg-options train_cfg.max_iters=2; to evaluate the finished run (its last '
        f'validation may not have ended): tools/test.py CONFIG {osp.join(work, "iter_1.pth")}'
    ) in _run_log(done)
    assert 'resume: the checkpoint was trained in' not in _run_log(done)  # same precision

    # resumed longer with --amp: trains, and says the precision changed
    amp = train_model(
        ADE_CFG,
        work_dir=work,
        resume='auto',
        amp=True,
        cfg_options=options(*base, 'train_cfg.max_iters=2'),
    )
    assert amp.iter == 2
    log = _run_log(amp)
    assert 'nothing to train' not in log
    assert (
        'resume: the checkpoint was trained in float32, this run trains in bfloat16 mixed '
        'precision'
    ) in log
    assert 'train_dataloader.batch_size' not in log  # the same batch size: no note

    # resumed longer with another batch size: trains, and says what that changes
    bigger = train_model(
        ADE_CFG,
        work_dir=work,
        resume='auto',
        amp=True,
        cfg_options=options(*base, 'train_cfg.max_iters=3', 'train_dataloader.batch_size=4'),
    )
    assert bigger.iter == 3
    log = _run_log(bigger)
    saved = [ln for ln in log.splitlines() if 'resume: the checkpoint was trained with' in ln]
    assert len(saved) == 1, log[-3000:]
    assert 'train_dataloader.batch_size=2, this run uses 4 (per process)' in saved[0]
    assert '2x the images' in saved[0] and 'train_dataloader.batch_size=2 to continue' in saved[0]


def test_a_run_without_resume_in_a_used_work_dir_says_what_it_replaces(tmp_path):
    """mmengine starts again from iteration 0 beside the earlier run's checkpoints and
    repoints last_checkpoint without a word."""
    from lookhere_dense.apis.train import earlier_run_note
    from lookhere_dense.engine.checkpointing import read_pointer

    work = tmp_path / 'w'
    work.mkdir()
    assert earlier_run_note(str(work)) is None  # a fresh work dir
    newest = _tiny_checkpoint(work / 'iter_60.pth')
    (work / 'last_checkpoint').write_text(newest)
    cfg, warned = build_train_config(
        ADE_CFG, work_dir=str(work), check_data=False, cfg_options=options(*SHRINK)
    )
    note = (
        f'the work dir {str(work)!r} holds checkpoints of an earlier run (the newest: '
        f'{newest}); this run starts from iteration 0 without --resume'
    )
    assert any(n.startswith(note) for n in warned), warned
    _, resumed = build_train_config(
        ADE_CFG, work_dir=str(work), resume='auto', check_data=False, cfg_options=options(*SHRINK)
    )
    assert not any('earlier run' in n for n in resumed)  # --resume continues it: no note
    # the config's own resume=True (mmengine resumes from last_checkpoint): no note either
    cfg, by_config = build_train_config(
        ADE_CFG, work_dir=str(work), check_data=False, cfg_options=options(*SHRINK, 'resume=True')
    )
    assert cfg.resume is True and not any('earlier run' in n for n in by_config), by_config
    # a copy of another run's work dir: its pointer names the other folder's file; the
    # note named that file (a checkpoint of another folder) -- it names this folder's
    copied = tmp_path / 'copy'
    shutil.copytree(work, copied)
    for n in (4, 8):
        _tiny_checkpoint(copied / f'iter_{n}.pth')
    assert read_pointer(str(copied)) == newest
    # checkpoints in mmengine's out_dir: the pointer in the work dir names a file there
    out_work, out_dir = tmp_path / 'ow' / 'work', tmp_path / 'ow' / 'out' / 'work'
    out_work.mkdir(parents=True)
    out_dir.mkdir(parents=True)
    elsewhere = _tiny_checkpoint(out_dir / 'iter_4.pth')
    (out_work / 'last_checkpoint').write_text(elsewhere)
    assert f'(the newest: {elsewhere})' in earlier_run_note(str(out_work), str(out_dir))
    assert earlier_run_note(str(copied)).startswith(
        f'the work dir {str(copied)!r} holds checkpoints of an earlier run (the newest: '
        f'{copied / "iter_60.pth"});'
    )
