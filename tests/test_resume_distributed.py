"""Resume of a 2-process (Gloo, CPU) run is bit-exact: two uninterrupted runs give the same
weights, and a run resumed from the uninterrupted run's checkpoint of iteration ``K`` ends
with exactly its final weights, because every rank's generators (torch, numpy, random) are
part of the checkpoint (:class:`lookhere_dense.engine.hooks.ExactResumeHook`). With
augmentation, dropout and drop-path, so each rank draws random numbers every iteration.
One process resuming the 2-process checkpoint finishes, restoring rank 0's generators, and
logs that the world size differs."""

from __future__ import annotations

import glob
import json
import os
import os.path as osp
import shutil
import socket
import subprocess

import pytest
import torch
from tiny_seg import ADE_CFG, PYTHON, REPO, SHRINK, env, make_ade, options, roots
from tiny_seg import checkpoint_weights as _weights
from tiny_seg import same_weights as _same

from lookhere_dense.apis.train import train_model
from lookhere_dense.engine.hooks import RESUME_STATE_KEY

N, K = 4, 2  # iterations of a run; the checkpoint resumed from

_DRIVER = r"""
import json, multiprocessing, os, shutil, sys
import torch
torch.set_num_threads(1)
import lookhere_dense
lookhere_dense.register_all_modules()
import mmseg.models  # the heavy imports once, before the ranks are forked
from lookhere_dense.apis.train import train_model
from lookhere_dense.apis.cli import parse_cfg_options
cfg, runs, opts, port = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])


def rank(r, work, resume, port):
    # what torchrun --nproc_per_node=2 sets for each process
    os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE='2', LOCAL_WORLD_SIZE='2',
                      MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    train_model(cfg, work_dir=work, launcher='pytorch', resume='auto' if resume else None,
                cfg_options=parse_cfg_options(opts))


for i, (work, start) in enumerate(runs):
    resume = start is not None
    if resume:  # resume from a copy of another run's checkpoint
        os.makedirs(work, exist_ok=True)
        dst = os.path.join(work, os.path.basename(start))
        shutil.copy(start, dst)
        with open(os.path.join(work, 'last_checkpoint'), 'w') as f:
            f.write(dst)
    ctx = multiprocessing.get_context('fork')
    ranks = [ctx.Process(target=rank, args=(r, work, resume, port + i)) for r in (0, 1)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(300)
    if any(p.exitcode for p in ranks):
        sys.exit(1)
"""

RUN = [
    f'train_cfg.max_iters={N}',
    'train_cfg.val_interval=100',
    'default_hooks.checkpoint.interval=1',
    'default_hooks.checkpoint.max_keep_ckpts=10',
    'model.decode_head.dropout_ratio=0.1',
    'model.backbone.drop_path_rate=0.1',
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _run(tmp_path, runs) -> list:
    """The driver over ``runs`` (``[work, checkpoint to resume from or None]``); returns
    the ``--cfg-options`` the runs had."""
    root = make_ade(tmp_path / 'data', num_train=4, num_val=2)
    driver = tmp_path / 'driver.py'
    driver.write_text(_DRIVER)
    opts = [*roots(root), *SHRINK, *RUN]
    cmd = [PYTHON, str(driver), ADE_CFG, json.dumps(runs), json.dumps(opts), str(_port())]
    res = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return opts


@pytest.mark.usefixtures('one_torch_thread')
@pytest.mark.skipif(torch.cuda.is_available(), reason='tests the CPU (Gloo) path')
def test_a_resumed_two_process_run_ends_with_the_uninterrupted_weights(tmp_path):
    full, again, resumed = (str(tmp_path / n) for n in ('full', 'again', 'resumed'))
    start = os.path.join(full, f'iter_{K}.pth')
    opts = _run(tmp_path, [[full, None], [again, None], [resumed, start]])
    final = _weights(os.path.join(full, f'iter_{N}.pth'))
    # the runs are deterministic: an uninterrupted run again gives the same weights
    assert _same(_weights(os.path.join(again, f'iter_{N}.pth')), final)
    assert _same(_weights(os.path.join(resumed, f'iter_{N}.pth')), final)
    assert len(torch.load(start, weights_only=True)[RESUME_STATE_KEY]['ranks']) == 2

    # one process resumes the 2-process checkpoint: rank 0's generators, and it says so
    single = tmp_path / 'single'
    single.mkdir()
    shutil.copy(start, single / osp.basename(start))
    (single / 'last_checkpoint').write_text(str(single / osp.basename(start)))
    runner = train_model(ADE_CFG, work_dir=str(single), resume='auto', cfg_options=options(*opts))
    assert runner.iter == N
    log = open(sorted(glob.glob(str(single / '*' / '*.log')))[-1]).read()
    assert 'the checkpoint holds the generators of 2 rank(s) and this run has 1' in log
