"""``torch.compile``: a compiled LookHere trunk gives the eager results and compiles once per
input shape (not per layer or per call); mmengine's ``compile`` option trains and tests a
Segmenter config.

The attention engine and the caches are not traced (``torch.compiler.disable``): their
outputs enter the compiled graph as inputs, so the caches' changing state is no guard.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lookhere_dense.lookhere import create_model

pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_trunk_gives_the_eager_results_and_compiles_once():
    torch.manual_seed(0)
    model = create_model(
        embed_dims=48,
        num_layers=3,
        num_heads=12,
        preset='lh90',
        out_indices=(1, 2),
        window_size=3,
        window_block_indexes=(0,),
    ).eval()
    x = torch.randn(2, 3, 64, 96)
    compiled = torch.compile(model)
    with torch.no_grad():
        eager = model(x)
        first = compiled(x)
        with torch._dynamo.config.patch(error_on_recompile=True):
            again = compiled(x)  # the caches changed (hits, LRU order): no recompilation
    for e, a, b in zip(eager, first, again, strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=0)
        torch.testing.assert_close(b, e, atol=1e-5, rtol=0)


@pytest.mark.parametrize('encoding', ['rope2d', 'pape'])
def test_compiled_baselines_do_not_recompile_on_their_caches(encoding):
    torch.manual_seed(0)
    model = create_model(embed_dims=48, num_layers=2, num_heads=12, pos_encoding=encoding)
    model.eval()
    x = torch.randn(1, 3, 48, 64)
    compiled = torch.compile(model, backend='aot_eager')  # traced, no code generation
    with torch.no_grad():
        eager = model(x)[0]
        compiled(x)
        with torch._dynamo.config.patch(error_on_recompile=True):
            torch.testing.assert_close(compiled(x)[0], eager, atol=1e-5, rtol=0)


def test_mmengine_compile_trains_and_tests_a_segmenter_config(tmp_path: Path):
    """The config's ``compile=dict(...)`` (mmengine compiles train_step / val_step /
    test_step); ``aot_eager`` traces forward and backward with dynamo and AOTAutograd
    without generating code, which keeps this test short (docs/performance.md measures the
    inductor compile)."""
    from tiny_seg import ADE_CFG, SHRINK, make_ade, options, roots

    from lookhere_dense.apis.test import evaluate_checkpoint
    from lookhere_dense.apis.train import train_model

    root = make_ade(tmp_path / 'data')
    opts = [*roots(root), *SHRINK, "compile.backend='aot_eager'"]
    runner = train_model(
        ADE_CFG,
        work_dir=str(tmp_path / 'work'),
        cfg_options=options(
            *opts,
            'train_cfg.max_iters=2',
            'train_cfg.val_interval=2',
            'default_hooks.checkpoint.interval=2',
        ),
    )
    assert runner.iter == 2 and (tmp_path / 'work' / 'iter_2.pth').is_file()
    assert runner.cfg.compile == dict(backend='aot_eager')
    metrics = evaluate_checkpoint(
        ADE_CFG,
        str(tmp_path / 'work' / 'iter_2.pth'),
        work_dir=str(tmp_path / 'test'),
        cfg_options=options(*opts),
    )
    assert 0.0 <= metrics['mIoU'] <= 100.0
