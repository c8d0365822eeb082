"""Interruption and resume: a training process killed with SIGKILL and resumed with
``--resume`` ends with exactly the weights of an uninterrupted run (CPU, num_workers=0,
with dropout, drop-path, validation after each checkpoint, a damaged newest checkpoint and a
random seed in the resumed run),
and the resume choices (fallback, nothing readable, empty work dir) say what they do."""

from __future__ import annotations

import glob
import os
import os.path as osp
import signal
import subprocess
import time

import pytest
from tiny_seg import ADE_CFG, PYTHON, REPO, SHRINK, env, make_ade, options, roots
from tiny_seg import checkpoint_weights as _weights
from tiny_seg import same_weights as _same

from lookhere_dense.apis.train import build_train_config, find_resume_checkpoint, train_model
from lookhere_dense.errors import ToolError

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
