"""Multi-process training with ``torchrun`` (``launcher='pytorch'``) on a CPU-only machine:
two Gloo processes train the tiny model for 2 iterations through the training API (what
``tools/train.py --launcher pytorch`` calls); both ranks end with identical weights, and
the checkpoint rank 0 wrote loads (strictly) into the config's model with those weights."""
from __future__ import annotations

import json
import os.path as osp
import subprocess

import pytest
import torch

from tiny_seg import ADE_CFG, PYTHON, REPO, SHRINK, env, make_ade, options, roots

_DRIVER = r"""
import json, os, sys
import torch
torch.set_num_threads(1)
from lookhere_dense.apis.train import train_model
from lookhere_dense.cli import parse_cfg_options
cfg, work, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
runner = train_model(cfg, work_dir=work, launcher='pytorch', cfg_options=parse_cfg_options(opts))
model = runner.model.module if hasattr(runner.model, 'module') else runner.model
rank = os.environ['RANK']
torch.save({k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)},
           os.path.join(work, f'rank{rank}.pth'))
with open(os.path.join(work, f'rank{rank}.json'), 'w') as f:
    json.dump(dict(wrapper=type(runner.model).__name__, iter=runner.iter,
                   world_size=runner.world_size, backend=runner.cfg.env_cfg.dist_cfg.backend), f)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason='tests the CPU (Gloo) path')
def test_two_cpu_processes_train_in_step(tmp_path):
    root = make_ade(tmp_path / 'data', num_train=4, num_val=2)
    work = tmp_path / 'work'
    work.mkdir()
    driver = tmp_path / 'driver.py'
    driver.write_text(_DRIVER)
    opts = [*roots(root), *SHRINK, 'train_cfg.max_iters=2', 'train_cfg.val_interval=2']
    res = subprocess.run(
        [PYTHON, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
         str(driver), ADE_CFG, str(work), json.dumps(opts)],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    info = [json.loads((work / f'rank{r}.json').read_text()) for r in (0, 1)]
    for i in info:
        assert i == dict(wrapper='MMDistributedDataParallel', iter=2, world_size=2,
                         backend='gloo')
    w0, w1 = (torch.load(work / f'rank{r}.pth', weights_only=True) for r in (0, 1))
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)

    from lookhere_dense.cli import build_model_from_checkpoint, load_config
    cfg = load_config(ADE_CFG, options(*SHRINK))
    model, _ = build_model_from_checkpoint(cfg, str(work / 'iter_2.pth'))
    sd = model.state_dict()
    assert all(torch.equal(sd[k], w0[k]) for k in w0)
    # rank 0 alone printed the checks; the ranks' terminal lines are not doubled
    assert res.stdout.count('data check passed: train_dataloader') == 1
    assert osp.isfile(work / 'iter_2.pth')
