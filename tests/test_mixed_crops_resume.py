"""Resume of a run trained on mixed crop sizes (``MixedCropSegDataPreProcessor``): the
preprocessor draws the crop sizes and positions from a generator of its own, which
``ExactResumeHook`` saves in every checkpoint and restores on resume, so a resumed run
draws the crops the uninterrupted run drew and ends with its weights bitwise (CPU,
``num_workers=0``). A checkpoint written before that state was saved still resumes, with a
note that the crops start again from the preprocessor's seed."""

from __future__ import annotations

import glob
import os
import os.path as osp
import shutil

import pytest
import torch
from tiny_seg import ADE_CFG, SHRINK, make_ade, options, roots
from tiny_seg import checkpoint_weights as _weights
from tiny_seg import same_weights as _same

from lookhere_dense.apis.train import train_model
from lookhere_dense.data.mixed_crops import MixedCropSegDataPreProcessor
from lookhere_dense.engine.hooks import RESUME_STATE_KEY, capture_rng_state, restore_rng_state

pytestmark = pytest.mark.usefixtures('one_torch_thread')

N, K = 6, 3  # iterations of the run; the checkpoint resumed from
RUN = [
    f'train_cfg.max_iters={N}',
    f'train_cfg.val_interval={10 * N}',  # no validation: only the crops matter here
    'default_hooks.checkpoint.interval=1',
    'default_hooks.checkpoint.max_keep_ckpts=10',
    'model.data_preprocessor.type=MixedCropSegDataPreProcessor',
    'model.data_preprocessor.crop_sizes=[32,64,96,128]',
]


@pytest.fixture
def draws(monkeypatch):
    """Every value the mixed-crop preprocessors draw (per training batch: the size index,
    then each sample's top and left), in order."""
    seen = []
    draw = MixedCropSegDataPreProcessor._draw

    def recording(self, high):
        value = draw(self, high)
        seen.append((high, value))
        return value

    monkeypatch.setattr(MixedCropSegDataPreProcessor, '_draw', recording)
    return seen


def _resume_from(checkpoint, work: str, opts: list):
    """Resume ``opts``' run in ``work`` from a copy of ``checkpoint`` (a path, or a
    checkpoint dict of iteration ``K``), with a random seed: everything must come from the
    checkpoint."""
    os.makedirs(work)
    dst = osp.join(work, f'iter_{K}.pth')
    if isinstance(checkpoint, dict):
        torch.save(checkpoint, dst)
    else:
        shutil.copy(checkpoint, dst)
    with open(osp.join(work, 'last_checkpoint'), 'w') as f:
        f.write(dst)
    return train_model(
        ADE_CFG, work_dir=work, resume='auto', cfg_options=options(*opts, 'randomness.seed=None')
    )


def _log(work: str) -> str:
    return open(sorted(glob.glob(osp.join(work, '*', '*.log')))[-1]).read()


def test_a_resumed_mixed_crop_run_draws_the_crops_of_the_uninterrupted_run(tmp_path, draws):
    root = make_ade(tmp_path / 'data')
    opts = [*roots(root), *SHRINK, *RUN]
    full = str(tmp_path / 'full')
    train_model(ADE_CFG, work_dir=full, cfg_options=options(*opts))  # uninterrupted
    per_iter = len(draws) // N  # one size and two positions per sample
    assert len(draws) == N * per_iter and per_iter == 1 + 2 * 2
    full_draws, draws[:] = list(draws), []
    sizes = [value for high, value in full_draws[::per_iter]]
    assert len(set(sizes)) > 1, sizes  # the run does mix crop sizes

    start = osp.join(full, f'iter_{K}.pth')
    resumed = str(tmp_path / 'resumed')
    assert _resume_from(start, resumed, opts).iter == N
    assert draws == full_draws[K * per_iter :]  # iterations K+1..N, not 1..N-K again
    assert _same(
        _weights(osp.join(resumed, f'iter_{N}.pth')), _weights(osp.join(full, f'iter_{N}.pth'))
    )
    assert 'own generator' not in _log(resumed)
    saved = torch.load(start, weights_only=True)[RESUME_STATE_KEY]['rng']
    assert set(saved['modules']) == {'data_preprocessor'}  # loads with weights_only

    # a checkpoint written before the preprocessor's state was saved: resumes, and says
    # that the crops start again from the preprocessor's seed
    old = torch.load(start, weights_only=False)
    del old[RESUME_STATE_KEY]['rng']['modules']
    draws[:] = []
    legacy = str(tmp_path / 'legacy')
    assert _resume_from(old, legacy, opts).iter == N
    assert len(draws) == (N - K) * per_iter
    note = (
        'resume: the checkpoint holds no state of the own generator of '
        'model.data_preprocessor (MixedCropSegDataPreProcessor)'
    )
    assert note in _log(legacy)


def test_the_preprocessor_generator_is_captured_even_before_its_first_draw():
    """A state saved before the first training batch is the one that batch would seed
    (the generator is created and seeded as ``_draw`` would); restoring it continues the
    draws exactly."""
    from mmengine.model import BaseModel

    class Tiny(BaseModel):
        def __init__(self, seed=None):
            super().__init__(
                data_preprocessor=MixedCropSegDataPreProcessor(crop_sizes=[8, 16], seed=seed)
            )

        def forward(self, *args, **kwargs):  # pragma: no cover - not called
            raise NotImplementedError

    model = Tiny(seed=5)
    pre = model.data_preprocessor
    assert pre._generator is None
    state = capture_rng_state(model)
    first = [pre._draw(1000) for _ in range(4)]
    restore_rng_state(state, model)
    assert [pre._draw(1000) for _ in range(4)] == first
    fresh = Tiny(seed=5)  # a fresh preprocessor draws as the captured one would
    assert [fresh.data_preprocessor._draw(1000) for _ in range(4)] == first
    assert 'modules' not in capture_rng_state()  # without a model: the global ones only
