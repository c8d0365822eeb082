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
from lookhere_dense.lookhere.flex import flex_available

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


def test_compiled_training_through_several_sizes_with_dynamic_false():
    """Training at one size, another and the first again (multi-resolution fine-tuning):
    with ``dynamic=False`` (one compilation per shape, the documented way) the gradients
    are eager's at every size. The default (automatic dynamic shapes) fails on the third
    step in torch 2.14 for any model with a graph break -- a stale stride assertion in the
    compiled backward of the graph before it (docs/performance.md, "torch.compile")."""
    torch.manual_seed(0)
    model = create_model(embed_dims=48, num_layers=2, num_heads=12, preset='lh90')
    compiled = torch.compile(model, dynamic=False)
    weight = model.blocks[0].attn.qkv.weight
    for shape in ((2, 3, 64, 64), (2, 3, 64, 96), (2, 3, 64, 64)):
        x = torch.randn(*shape)
        grads = []
        for run in (compiled, model):
            model.zero_grad()
            run(x)[0].square().mean().backward()
            grads.append(weight.grad.clone())
        torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4, msg=str(shape))


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


@pytest.mark.skipif(not flex_available(), reason='no flex_attention in this torch')
def test_compiled_flex_compiles_once_for_all_layers_of_a_shape():
    """Each layer has its own score_mod (its own table); the compiled kernel must still be
    one graph per shape, not one per layer (torch's recompile limit would otherwise send
    layers past the eighth back to eager). Padding: 65 tokens, not a multiple of 128."""
    from torch._dynamo.utils import counters

    from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine

    torch._dynamo.reset()
    counters.clear()
    eng = LookHereAttentionEngine(PRESETS['lh90'], 3, 12, backend='flex', flex_compile=True)
    grid = (8, 8)
    q, k, v = (torch.randn(1, 12, 65, 16) for _ in range(3))
    with torch.no_grad():
        for layer in range(3):
            ref = eng(q, k, v, layer, grid, True, backend='reference')
            torch.testing.assert_close(eng(q, k, v, layer, grid, True), ref, atol=2e-5, rtol=0)
    assert len(eng.score_mods) == 3  # three different functions ...
    assert counters['stats']['unique_graphs'] == 1  # ... one compiled graph


@pytest.mark.parametrize(
    'grid', [(1, 1), (3, 5), (7, 9), (8, 16), (13, 17), (64, 128), (128, 256)]
)
@pytest.mark.parametrize('prefix', [0, 1, 4])
@pytest.mark.parametrize('tiles', [False, True])
def test_flex_indices_stay_in_the_tables_for_every_reachable_pair(grid, prefix, tiles):
    """Our flex compiles drop inductor's bounds checks on the callbacks' gathers
    (FLEX_INDUCTOR_OPTIONS), so every (query, key) position a kernel tile can reach --
    prefix tokens and the padding of a ragged last tile included -- must read inside the
    arrays and the tables. The table index of a pair is ``c(k) - c(q) + centre`` with
    ``c(x)`` the index of the pair (0, x), so its extremes over all pairs come from the
    extremes of ``c``: checked exactly, at every position up to the last 128-token tile."""
    from lookhere_dense.lookhere.attention.common import FLEX_BLOCK, flex_compile_options
    from lookhere_dense.lookhere.flex import flex_index, tile_order

    assert flex_compile_options() == {'assert_indirect_indexing': False}
    assert flex_compile_options('aot_eager') is None
    height, width = grid
    total = prefix + height * width
    order = tile_order(grid, prefix) if tiles else None
    index = flex_index(grid, prefix, order)
    reach = -(-total // FLEX_BLOCK) * FLEX_BLOCK  # positions of the last tile (exclusive)
    pos = torch.arange(reach, dtype=torch.int32)
    zero = torch.zeros_like(pos)
    _, c, key_patch = index(zero, pos)  # raises if an array is shorter than the reach
    centre = int(index(zero[:1], zero[:1])[1])
    table = (2 * height - 1) * (2 * width - 1)
    assert int(c.max()) - int(c.min()) + centre < table
    assert int(c.min()) - int(c.max()) + centre >= 0
    assert 0 <= int(key_patch.min()) and int(key_patch.max()) < height * width
    _, c_q, _ = index(pos, zero)  # the query side reads the same arrays
    assert torch.equal(c_q, 2 * centre - c)


def test_flex_function_compiles_with_our_inductor_options(monkeypatch: pytest.MonkeyPatch):
    """What FLEX_INDUCTOR_OPTIONS promises reaches torch.compile: ``options=`` for
    inductor (no bounds asserts), none for other backends (they take no options)."""
    from lookhere_dense.lookhere.attention import common

    calls = []
    monkeypatch.setattr(common, '_compiled_flex', {})
    monkeypatch.setattr(torch, 'compile', lambda fn, **kw: calls.append(kw) or fn)
    common.flex_function(True, 'inductor')
    common.flex_function(True, 'aot_eager')
    assert calls[0]['options'] == {'assert_indirect_indexing': False}
    assert calls[0]['backend'] == 'inductor' and calls[0]['dynamic'] is False
    assert calls[1]['options'] is None and calls[1]['backend'] == 'aot_eager'


def test_flex_index_stays_in_range_at_32k_tokens():
    """The flex callbacks' index arithmetic at a 128x256 grid + CLS (32769 tokens) in the
    int32 that flex passes: every pair's table index equals the int64 pair index."""
    from lookhere_dense.lookhere.bias import pair_index
    from lookhere_dense.lookhere.flex import flex_index, tile_order

    grid = (128, 256)
    n = grid[0] * grid[1]
    order = tile_order(grid, True)
    index = flex_index(grid, True, order)
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, n + 1, (4096,), generator=g, dtype=torch.int32)
    kv = torch.randint(0, n + 1, (4096,), generator=g, dtype=torch.int32)
    q[:2], kv[:2] = torch.tensor([n, 0]), torch.tensor([0, n])  # the last token, both ways
    is_cls, t, _ = index(q, kv)
    qp, kp = order[q.long()].long() - 1, order[kv.long()].long() - 1
    patches = (qp >= 0) & (kp >= 0)
    assert torch.equal(is_cls, ~patches)
    expected = pair_index(grid, qp[patches], kp[patches])
    assert torch.equal(t[patches].long(), expected)
    assert int(t.max()) < (2 * grid[0] - 1) * (2 * grid[1] - 1) and int(t.min()) >= 0
