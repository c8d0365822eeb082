"""The tiny segmentation set-up the tool tests share (not a test module): the demo config
shrunk so that a training step takes a fraction of a second, a tiny ADE20K-layout
dataset, and checkpoints written the way mmengine's Runner writes them."""

from __future__ import annotations

import functools
import json
import os
import os.path as osp
import subprocess
import sys
from typing import Dict, List, Sequence

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
ADE_CFG = osp.join(REPO, 'configs', 'segmenter_lookhere_vit-t_tiny-ade.py')
#: Shrinks the demo model and loaders (2 layers, 96 dims, one process per loader).
SHRINK: List[str] = [
    'model.backbone.num_layers=2',
    'model.backbone.embed_dims=96',
    'model.decode_head.in_channels=96',
    'model.decode_head.channels=96',
    'model.decode_head.embed_dims=96',
    'model.decode_head.num_heads=2',
    'train_dataloader.batch_size=2',
    'train_dataloader.num_workers=0',
    'train_dataloader.persistent_workers=False',
    'val_dataloader.num_workers=0',
    'val_dataloader.persistent_workers=False',
    'test_dataloader.num_workers=0',
    'test_dataloader.persistent_workers=False',
]


def make_ade(folder, num_train: int = 4, num_val: int = 2) -> str:
    """A tiny ADE20K-layout dataset under ``folder``; returns its root."""
    from research.datasets.synthetic_seg import make_ade20k_like

    make_ade20k_like(str(folder), num_train=num_train, num_val=num_val)
    return osp.join(str(folder), 'ade', 'ADEChallengeData2016')


def roots(data_root: str) -> List[str]:
    """``--cfg-options`` pointing every split at ``data_root``."""
    return [f'{s}_dataloader.dataset.data_root={data_root}' for s in ('train', 'val', 'test')]


def options(*pairs: str) -> Dict:
    """``KEY=VALUE`` pairs read as a tool's ``--cfg-options`` reads them."""
    from lookhere_dense.apis.cli import parse_cfg_options

    return parse_cfg_options(pairs)


def write_checkpoint(path: str, extra: Sequence[str] = ()) -> str:
    """Build the shrunk model (plus ``extra`` overrides) and save its weights as a Runner
    checkpoint (``state_dict`` + ``meta``)."""
    import torch
    from mmengine.registry import init_default_scope

    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.swap import model_registry

    init_default_scope('mmseg')
    cfg = load_config(ADE_CFG, options(*SHRINK, *extra))
    model = model_registry('mmseg').build(cfg.model)
    os.makedirs(osp.dirname(path), exist_ok=True)
    torch.save({'state_dict': model.state_dict(), 'meta': {'iter': 0, 'epoch': 0}}, path)
    return path


def checkpoint_weights(path: str) -> dict:
    """The tensors of a Runner checkpoint's ``state_dict``."""
    import torch

    sd = torch.load(path, map_location='cpu', weights_only=False)['state_dict']
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def same_weights(a: dict, b: dict) -> bool:
    """Bit-identical weights (same keys, equal tensors)."""
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def env() -> Dict[str, str]:
    """Environment for a tool subprocess: this checkout first on ``PYTHONPATH``, one
    thread."""
    return dict(
        os.environ,
        PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''),
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1',
    )


PYTHON = sys.executable


#: Runs tool command lines as ``python tools/<tool>.py ARGS`` would, one after the other in
#: ONE fresh interpreter (so the OpenMMLab imports are paid once): stdout, stderr and the
#: exit status of each, as JSON on the real stdout.
_DRIVER = r"""
import contextlib, io, json, os, runpy, sys, traceback
results = []
for tool, args in json.loads(sys.argv[1]):
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [os.path.join('tools', tool + '.py'), *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_path(sys.argv[0], run_name='__main__')
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
                code = 1
            else:
                code = exc.code or 0
        except Exception:
            traceback.print_exc()
            code = 1
    results.append(dict(rc=code, stdout=out.getvalue(), stderr=err.getvalue()))
print('\n@@RESULTS@@' + json.dumps(results))
"""


def run_tools(calls) -> list:
    """``[(tool, [args...]), ...]`` -> ``[dict(rc, stdout, stderr), ...]`` (see _DRIVER)."""
    res = subprocess.run(
        [PYTHON, '-c', _DRIVER, json.dumps(calls)],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert '@@RESULTS@@' in res.stdout, res.stderr
    return json.loads(res.stdout.split('@@RESULTS@@')[-1])


def study_report(seed: int, value: float, iters: int = 10) -> Dict:
    """A one-run relational-study report (encoding ``abs``, one scale, ``seed``), the
    shape :func:`research.study.reports.merge_reports` reads; ``value``: its mIoU."""
    return dict(
        command='x',
        date='d',
        wall_seconds=1.0,
        versions={},
        settings=dict(
            config='c.py',
            encodings=['abs'],
            seeds=[seed],
            scales=[1.0],
            ladder='rendered',
            metric='mIoU',
            train_size=[32, 32],
            iters=iters,
        ),
        runs=[
            dict(
                encoding='abs',
                seed=seed,
                train_seconds=1.0,
                eval={'1': {'mIoU': value, 'aAcc': 90.0}},
            )
        ],
    )


def write_study_reports(folder, runs: Sequence[Sequence]) -> List[str]:
    """Write :func:`study_report` ``(seed, value[, iters])`` of each of ``runs`` to
    ``folder/r{i}.json``; returns the paths in order."""
    paths = []
    for i, run in enumerate(runs):
        paths.append(osp.join(str(folder), f'r{i}.json'))
        with open(paths[-1], 'w') as f:
            json.dump(study_report(*run), f)
    return paths


def assert_resume_follows_fresh(wrapper, schedulers, checkpoint, fresh, fresh_schedulers, end):
    """Load ``checkpoint``'s optimizer and scheduler states as ``Runner.resume`` does, then
    step both runs to ``end``: every group's ``lr`` and ``betas`` equal the fresh run's
    (``fresh`` / ``fresh_schedulers``, built at the resume step) at every step."""
    wrapper.load_state_dict(checkpoint['optimizer'])
    for sch, state in zip(schedulers, checkpoint['param_schedulers']):
        sch.load_state_dict(state)
    for step in range(6, end):
        for ours, theirs in zip(wrapper.param_groups, fresh.param_groups):
            assert (ours['lr'], ours['betas']) == (theirs['lr'], theirs['betas']), step
        for run in (schedulers, fresh_schedulers):
            for sch in run:
                sch.step()


@functools.lru_cache(maxsize=1)
def _parsed_ade_config():
    from mmengine.config import Config

    return Config.fromfile(ADE_CFG)


def tiny_ade_config(data_root) -> 'Config':  # noqa: F821 - mmengine's, imported lazily
    """The tiny ADE20K config (:data:`ADE_CFG`, parsed once) with every split's
    ``data_root`` set to ``data_root``: a copy, free to change."""
    import copy

    cfg = copy.deepcopy(_parsed_ade_config())
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = str(data_root)
    return cfg
