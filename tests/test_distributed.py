"""Multi-process training (``launcher='pytorch'``) on a CPU-only machine: two processes with
the environment ``torchrun --nproc_per_node=2`` gives them (forked from one interpreter that
paid the imports once) train the tiny model for 2 iterations with Gloo through the training
API (what ``tools/train.py --launcher pytorch`` calls); both ranks end with identical
weights, and the checkpoint rank 0 wrote loads (strictly) into the config's model with
those weights. mmengine's plain ``Runner`` (what mmseg's and mmdet's own ``tools/train.py``
build) syncs a LookHereViT's weights from rank 0 as well: every ``state_dict`` entry,
the backbone's record included, is a tensor it can broadcast."""

from __future__ import annotations

import json
import os.path as osp
import socket
import subprocess

import pytest
import torch
from tiny_seg import ADE_CFG, PYTHON, REPO, SHRINK, env, make_ade, options, roots

_DRIVER = r"""
import json, multiprocessing, os, sys
import torch
torch.set_num_threads(1)
import lookhere_dense
lookhere_dense.register_all_modules()
import mmseg.models  # the heavy imports once, before the ranks are forked
from lookhere_dense.apis.train import train_model
from lookhere_dense.apis.cli import parse_cfg_options
cfg, work, opts, port = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]


def rank(r):
    # what torchrun --nproc_per_node=2 sets for each process
    os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE='2', LOCAL_WORLD_SIZE='2',
                      MASTER_ADDR='127.0.0.1', MASTER_PORT=port)
    runner = train_model(cfg, work_dir=work, launcher='pytorch',
                         cfg_options=parse_cfg_options(opts))
    model = runner.model.module if hasattr(runner.model, 'module') else runner.model
    torch.save({k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)},
               os.path.join(work, f'rank{r}.pth'))
    with open(os.path.join(work, f'rank{r}.json'), 'w') as f:
        json.dump(dict(wrapper=type(runner.model).__name__, iter=runner.iter,
                       world_size=runner.world_size,
                       backend=runner.cfg.env_cfg.dist_cfg.backend), f)


ranks = [multiprocessing.get_context('fork').Process(target=rank, args=(r,)) for r in (0, 1)]
for p in ranks:
    p.start()
for p in ranks:
    p.join(300)
sys.exit(max(abs(p.exitcode or 0) for p in ranks))
"""


def train_two_ranks(tmp_path, cfg: str, opts) -> subprocess.CompletedProcess:
    """Run :data:`_DRIVER`: two forked ranks train ``cfg`` with ``opts`` into
    ``tmp_path / 'work'`` (Gloo, a free port)."""
    work = tmp_path / 'work'
    work.mkdir()
    driver = tmp_path / 'driver.py'
    driver.write_text(_DRIVER)
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    return subprocess.run(
        [PYTHON, str(driver), cfg, str(work), json.dumps(opts), str(port)],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=400,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason='tests the CPU (Gloo) path')
def test_two_cpu_processes_train_in_step(tmp_path):
    root = make_ade(tmp_path / 'data', num_train=4, num_val=2)
    work = tmp_path / 'work'
    opts = [*roots(root), *SHRINK, 'train_cfg.max_iters=2', 'train_cfg.val_interval=2']
    res = train_two_ranks(tmp_path, ADE_CFG, opts)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    info = [json.loads((work / f'rank{r}.json').read_text()) for r in (0, 1)]
    for i in info:
        assert i == dict(wrapper='MMDistributedDataParallel', iter=2, world_size=2, backend='gloo')
    w0, w1 = (torch.load(work / f'rank{r}.pth', weights_only=True) for r in (0, 1))
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)

    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.apis.inference import build_model_from_checkpoint

    cfg = load_config(ADE_CFG, options(*SHRINK))
    model, _ = build_model_from_checkpoint(cfg, str(work / 'iter_2.pth'))
    sd = model.state_dict()
    assert all(torch.equal(sd[k], w0[k]) for k in w0)
    # rank 0 alone prints the checks and the progress
    assert res.stdout.count('data check passed: train_dataloader') == 1
    assert res.stdout.count('Iter(train) [2/2]') == 1
    assert osp.isfile(work / 'iter_2.pth')


LOOKWHERE_CFG = osp.join(REPO, 'configs', 'segmenter_lookwhere_vit-t_tiny-ade.py')


@pytest.mark.skipif(torch.cuda.is_available(), reason='tests the CPU (Gloo) path')
@pytest.mark.parametrize('find_unused', [True, False])
def test_lookwhere_trains_in_two_processes(tmp_path, find_unused):
    """LookWhere trained from scratch gives its selector's head no gradient (top-k): DDP
    refuses such a model from the second step unless ``find_unused_parameters`` (which
    the LookWhere configs set; the claim was not run before). With it off, the run fails
    as DDP says -- the setting is what makes it train."""
    root = make_ade(tmp_path / 'data', num_train=4, num_val=2)
    work = tmp_path / 'work'
    opts = [
        *roots(root),
        *SHRINK[6:],  # the loaders; the LookWhere backbone shrinks by its own keys
        'model.backbone.extractor.num_layers=2',
        'model.backbone.selector.num_layers=1',
        'train_cfg.max_iters=2',
        'train_cfg.val_interval=2',
        f'model_wrapper_cfg.find_unused_parameters={find_unused}',
    ]
    res = train_two_ranks(tmp_path, LOOKWHERE_CFG, opts)
    out = res.stdout[-3000:] + res.stderr[-3000:]
    if not find_unused:
        assert res.returncode != 0 and 'find_unused_parameters' in out, out
        return
    assert res.returncode == 0, out
    info = [json.loads((work / f'rank{r}.json').read_text()) for r in (0, 1)]
    for i in info:
        assert i == dict(wrapper='MMDistributedDataParallel', iter=2, world_size=2, backend='gloo')
    w0, w1 = (torch.load(work / f'rank{r}.pth', weights_only=True) for r in (0, 1))
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert any(k.startswith('backbone.selector.') for k in w0)


_SYNC = r"""
import os, sys, types, torch, torch.distributed as dist
torch.set_num_threads(1)
from mmengine.runner import Runner
from lookhere_dense.models import LookHereViT
r, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=r, world_size=2)
torch.manual_seed(r)  # each rank starts from other weights
model = LookHereViT(img_size=32, patch_size=8, embed_dims=48, num_layers=2, num_heads=12,
                    preset='lh90')
model.init_weights()
torch.save(model.blocks[0].attn.qkv.weight, os.path.join(out, f'before{r}.pth'))
Runner._init_model_weights(types.SimpleNamespace(model=model))  # mmengine's sync, as is
torch.save(model.state_dict(), os.path.join(out, f'rank{r}.pth'))
dist.destroy_process_group()
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason='tests the CPU (Gloo) path')
def test_mmengine_runner_syncs_lookhere_weights_across_processes(tmp_path):
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    driver = tmp_path / 'sync.py'
    driver.write_text(_SYNC)
    procs = [
        subprocess.Popen(
            [PYTHON, str(driver), str(r), str(port), str(tmp_path)],
            cwd=REPO,
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in (0, 1)
    ]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], '\n'.join(logs)[-4000:]
    before = [torch.load(tmp_path / f'before{r}.pth', weights_only=True) for r in (0, 1)]
    assert not torch.equal(*before)  # the ranks were initialised differently
    w0, w1 = (torch.load(tmp_path / f'rank{r}.pth', weights_only=True) for r in (0, 1))
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
