"""The attention backends agree with the reference, forward and backward.

``reference`` (materialised bias + plain softmax in float32/float64) is the ground truth;
``sdpa``, ``chunked`` and ``flex`` (eager on CPU: forward only) must match it on
rectangular grids, with and without CLS, in float32 / bfloat16 / float16, for batch > 1,
centre heads, ``fill_with`` zero/max and per-layer head strings. The bias pieces the fast
paths are built from (:func:`gather_block`, the tile-row ``BlockMask``, the head runs)
are checked against their plain definitions. Every comparison with the reference goes
through one check function, and ``test_a_perturbed_fast_path_fails_its_check`` shows that
each check fails when the fast path's output is off by 1e-3.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch

from lookhere_dense.lookhere import (
    PRESETS,
    LookHereAttentionEngine,
    LookHereConfig,
    build_grid_bias,
    chunked_attention,
)
from lookhere_dense.lookhere.attention import reference_attention
from lookhere_dense.lookhere.bias import gather_block, gather_rows, offset_index
from lookhere_dense.lookhere.chunked import auto_block_rows, head_runs, key_row_groups
from lookhere_dense.lookhere.flex import (
    flex_attention_lookhere,
    flex_available,
    flex_mask_mod,
    lookhere_block_mask,
    tile_order,
)

CONFIGS = {
    'lh180': PRESETS['lh180'],
    'lh90': PRESETS['lh90'],
    'lh45': PRESETS['lh45'],
    'center': LookHereConfig('corners-center'),
    'fill_zero': LookHereConfig('halves-none', fill_with='zero'),
    'fill_max': LookHereConfig('triangles-none', fill_with='max', distance='sqrt'),
    'per_layer': LookHereConfig(('halves-none', 'eighths1-eighths2-none', 'corners-none')),
}
DEPTH = 3
HEADS = 12
#: max |error| vs the reference for outputs of size ~1 (inputs are randn)
ATOL = {torch.float32: 2e-5, torch.bfloat16: 6e-2, torch.float16: 1e-2, torch.float64: 1e-12}
needs_flex = pytest.mark.skipif(not flex_available(), reason='no flex_attention in this torch')


def qkv(grid, cls_token, batch=2, dim=16, dtype=torch.float32, seed=0, grad=False):
    """Random ``q, k, v`` ``(batch, heads, T, dim)`` for a grid (scaled to give peaky
    softmaxes, so that the bias matters)."""
    gen = torch.Generator().manual_seed(seed)
    t = grid[0] * grid[1] + int(cls_token)
    out = [
        (2 * torch.randn(batch, HEADS, t, dim, generator=gen, dtype=torch.float64))
        .to(dtype)
        .requires_grad_(grad)
        for _ in range(3)
    ]
    return out


def engine(name, **kw):
    return LookHereAttentionEngine(CONFIGS[name], DEPTH, HEADS, **kw)


def assert_matches(out, ref, dtype=torch.float32):
    """The one comparison with the reference: max |error| <= ``ATOL[dtype]``."""
    torch.testing.assert_close(out, ref, atol=ATOL[dtype], rtol=0)


pytestmark = pytest.mark.usefixtures('one_torch_thread')  # tiny tensors: see conftest


# ----------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------


def test_low_precision_tables_are_cast_once_from_float64():
    eng = engine('lh45')
    for dtype in (torch.bfloat16, torch.float16):
        gb = eng.grid_bias((5, 4), torch.device('cpu'), dtype)
        assert gb.table.dtype == dtype
        ref = build_grid_bias(CONFIGS['lh45'], (5, 4), DEPTH, HEADS, dtype=torch.float64)
        torch.testing.assert_close(gb.table, ref.table.to(dtype), atol=0, rtol=0)
        assert torch.equal(gb.visible, ref.visible)  # -inf survives the cast


@needs_flex
@pytest.mark.skipif(
    os.environ.get('LOOKHERE_SLOW') != '1',
    reason='compiles flex_attention on CPU (~30 s); set LOOKHERE_SLOW=1',
)
def test_compiled_flex_on_cpu_matches_reference_and_compiles_once():
    """The CUDA code path (compiled flex, tile order, block mask), run on CPU; layers
    (different captured tables) and later forwards reuse the one compiled kernel."""
    import torch._dynamo

    eng = engine('lh90', flex_compile=True)
    grid = (8, 8)
    q, k, v = qkv(grid, True, batch=1, dim=16)
    for layer in list(range(DEPTH)) + [0]:
        ref = eng(q, k, v, layer, grid, True, backend='reference')
        with torch._dynamo.config.patch(error_on_recompile=layer > 0):
            out = eng(q, k, v, layer, grid, True, backend='flex')
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------


def test_chunked_recompute_keeps_no_attention_matrix_and_matches():
    """Checkpointed blocks: the saved tensors of the graph are O(T), not O(T^2)."""
    grid = (6, 8)
    q, k, v = qkv(grid, True, batch=1, dtype=torch.float64, grad=True)
    gb = build_grid_bias(CONFIGS['lh90'], grid, DEPTH, HEADS, dtype=torch.float64)
    t = q.shape[-2]
    saved = []

    def pack(x):
        saved.append(x.numel())
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        out = chunked_attention(q, k, v, gb, 0, True, block_size=8)
    assert max(saved) <= q.numel() + 2 * HEADS * t  # q/k/v-sized, no heads x T x T
    ref = reference_attention(q, k, v, gb.dense(0, True))
    g1 = torch.autograd.grad(out.sum(), (q, k, v))
    g2 = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_dropout_runs_in_sdpa_and_chunked_and_flex_refuses_it():
    grid = (4, 5)
    eng = engine('lh90', block_size=6)
    q, k, v = qkv(grid, True, grad=True)
    for backend in ('sdpa', 'chunked'):
        torch.manual_seed(0)
        out = eng(q, k, v, 0, grid, True, dropout_p=0.5, backend=backend)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
        q.grad = None
    with pytest.raises(ValueError, match='no attention dropout'):
        eng(q, k, v, 0, grid, True, dropout_p=0.1, backend='flex')


def test_flex_training_on_cpu_is_refused_by_name():
    grid = (4, 5)
    eng = engine('lh90', block_size=6)
    q, k, v = qkv(grid, True, grad=True)
    with pytest.raises(ValueError, match="attn_backend='flex' cannot train on CPU"):
        eng(q, k, v, 0, grid, True, backend='flex')
    with torch.no_grad():  # inference is fine
        assert torch.isfinite(eng(q, k, v, 0, grid, True, backend='flex')).all()


# ----------------------------------------------------------------------------------------
# Building blocks
# ----------------------------------------------------------------------------------------
def _dense_by_index(gb, layer, cls_token):
    """The dense bias straight from :func:`offset_index` (the plain definition)."""
    n = gb.num_patches
    idx = torch.arange(n)
    out = gb.table[layer].flatten(1)[:, offset_index(gb.grid_size, idx, idx)]
    if gb.key_term is not None:
        out = out + gb.key_term[layer][:, None, :]
    return torch.nn.functional.pad(out, (1, 0, 1, 0)) if cls_token else out


@pytest.mark.parametrize('name', ['lh45', 'center'])
@pytest.mark.parametrize('grid', [(1, 1), (1, 6), (5, 1), (4, 7)])
def test_gather_block_is_a_slice_of_the_dense_bias(name, grid):
    gb = build_grid_bias(CONFIGS[name], grid, DEPTH, HEADS, dtype=torch.float64)
    height, width = grid
    n = height * width
    for cls_token in (False, True):
        dense = _dense_by_index(gb, 2, cls_token)
        assert torch.equal(gb.dense(2, cls_token), dense)
        assert torch.equal(
            gather_rows(
                gb.table[2],
                grid,
                0,
                n + cls_token,
                cls_token,
                None if gb.key_term is None else gb.key_term[2],
            ),
            dense,
        )
    dense = _dense_by_index(gb, 2, False)
    kt = None if gb.key_term is None else gb.key_term[2]
    for (s, e), (r0, r1), cls_key, rev in itertools.product(
        [(0, n), (1, max(1, n - 1)), (n // 2, n)],
        [(0, height), (height // 2, height), (0, (height + 1) // 2)],
        [None, 'first', 'last'],
        [False, True],
    ):
        got = gather_block(
            gb.table[2], grid, s, e, (r0, r1), cls_key, kt, cls_value=-7.0, reverse_queries=rev
        )
        want = dense[:, s:e, r0 * width : r1 * width]
        if cls_key == 'first':
            want = torch.nn.functional.pad(want, (1, 0), value=-7.0)
        elif cls_key == 'last':
            want = torch.nn.functional.pad(want, (0, 1), value=-7.0)
        assert torch.equal(got.flip(1) if rev else got, want), (s, e, r0, r1, cls_key, rev)


def test_gather_block_validates_its_arguments():
    gb = build_grid_bias(CONFIGS['lh90'], (3, 4), DEPTH, HEADS)
    with pytest.raises(ValueError, match='outside'):
        gather_block(gb.table[0], (3, 4), 0, 13, (0, 3))
    with pytest.raises(ValueError, match='key rows'):
        gather_block(gb.table[0], (3, 4), 0, 2, (1, 4))
    with pytest.raises(ValueError, match='cls_key'):
        gather_block(gb.table[0], (3, 4), 0, 2, (0, 3), cls_key='middle')
    with pytest.raises(ValueError, match='out must be'):
        gather_block(gb.table[0], (3, 4), 0, 2, (0, 3), out=torch.empty(12, 2, 5))


@needs_flex
@pytest.mark.parametrize(
    'name,grid,cls_token,block',
    [
        ('lh90', (12, 13), True, 16),
        ('lh45', (9, 9), False, 16),
        ('lh180', (5, 7), True, 8),
        ('per_layer', (7, 10), False, 32),
    ],
)
@pytest.mark.parametrize('tiles', [False, True])
def test_tile_row_block_mask_equals_create_block_mask(name, grid, cls_token, block, tiles):
    from torch.nn.attention.flex_attention import create_block_mask

    gb = build_grid_bias(CONFIGS[name], grid, DEPTH, HEADS)
    t = grid[0] * grid[1] + int(cls_token)
    order = tile_order(grid, cls_token, tile=(2, block // 2)) if tiles else None
    for layer in range(DEPTH):
        ours = lookhere_block_mask(gb, layer, cls_token, block=block, order=order)
        theirs = create_block_mask(
            flex_mask_mod(gb, layer, cls_token, order),
            None,
            HEADS,
            t,
            t,
            device='cpu',
            BLOCK_SIZE=block,
        )
        for attr in ('kv_num_blocks', 'kv_indices', 'full_kv_num_blocks', 'full_kv_indices'):
            assert torch.equal(getattr(ours, attr), getattr(theirs, attr)), attr
        # directed heads skip tiles (counted here: torch 2.11's sparsity() is negative
        # where the last tile is ragged)
        n_tiles = -(-t // block)
        assert int(ours.kv_num_blocks.sum() + ours.full_kv_num_blocks.sum()) < HEADS * n_tiles**2


def test_tile_order_is_a_permutation_with_cls_last_and_skips_more_tiles():
    order = tile_order((3, 5), True, tile=(2, 2))
    # tiles of 2x2 patches (token = 1 + y*5 + x), ragged at the right/bottom; CLS last
    assert order.tolist() == [1, 2, 6, 7, 3, 4, 8, 9, 5, 10, 11, 12, 13, 14, 15, 0]
    assert sorted(tile_order((7, 9), False).tolist()) == list(range(63))
    gb = build_grid_bias(CONFIGS['lh90'], (32, 32), 1, HEADS)
    rows = lookhere_block_mask(gb, 0, True).sparsity()
    tiles = lookhere_block_mask(gb, 0, True, order=tile_order((32, 32), True)).sparsity()
    assert tiles > rows + 5  # 8x16 tiles: quadrant heads skip ~3/4 of the tiles, not ~1/2


def test_block_masks_are_shared_by_layers_with_the_same_head_string():
    eng = engine('per_layer')
    masks = [eng.block_mask(layer, (9, 9), True, torch.device('cpu')) for layer in range(3)]
    assert len(eng.block_masks) == 3
    eng2 = engine('lh90')
    shared = {
        id(eng2.block_mask(layer, (9, 9), True, torch.device('cpu'))) for layer in range(DEPTH)
    }
    assert len(shared) == 1 and len(eng2.block_masks) == 1
    assert masks[0] is not masks[1]


@needs_flex
@pytest.mark.parametrize('tiles', [False, True])
def test_flex_runs_with_a_given_block_mask_and_order(tiles):
    grid = (6, 5)
    gb = build_grid_bias(CONFIGS['lh45'], grid, DEPTH, HEADS)
    q, k, v = qkv(grid, True, batch=1)
    ref = reference_attention(q, k, v, gb.dense(1, True))
    order = tile_order(grid, True, tile=(2, 4)) if tiles else None
    mask = lookhere_block_mask(gb, 1, True, block=8, order=order)
    out = flex_attention_lookhere(
        q, k, v, gb, 1, True, block_mask=mask, compiled=False, order=order
    )
    torch.testing.assert_close(out, ref, atol=ATOL[torch.float32], rtol=0)
    eng = engine('lh45', flex_tiles=tiles)
    torch.testing.assert_close(
        eng(q, k, v, 1, grid, True, backend='flex'), ref, atol=ATOL[torch.float32], rtol=0
    )
    assert (eng.flex_order(grid, True, q.device) is None) == (not tiles)


def test_head_runs_split_heads_by_vertical_field_of_view():
    h = 8
    runs = {
        name: head_runs(build_grid_bias(CONFIGS[name], (h, h), 1, HEADS).visible[0])
        for name in ('lh180', 'lh90', 'lh45', 'fill_zero', 'center')
    }
    up, down, both = (-(h - 1), 0), (0, h - 1), (-(h - 1), h - 1)
    assert runs['lh90'] == [(0, 2, *up), (2, 4, *down), (4, 6, *up), (6, 8, *down), (8, 12, *both)]
    assert runs['lh180'][:3] == [(0, 1, *up), (1, 2, *down), (2, 4, *both)]
    assert runs['fill_zero'] == [(0, 12, *both)]  # nothing blocked: one run, no copies
    assert runs['center'] == runs['lh90']  # corners + centre heads (see all)
    for rs in runs.values():  # runs tile the heads in order
        assert [r[0] for r in rs] == [0] + [r[1] for r in rs[:-1]] and rs[-1][1] == HEADS
    groups = key_row_groups(build_grid_bias(CONFIGS['lh90'], (h, h), 1, HEADS).visible[0])
    assert groups[0] == ((0, 1, 4, 5), *up)


def test_auto_block_rows_follow_the_mlp_activation_and_grid_rows():
    q = torch.empty(1, 12, 8193, 64)
    assert auto_block_rows(q, 4, 128) == 768  # 4 * 768 channels / 4 heads, whole rows
    assert auto_block_rows(q, 12, 128) == 256
    assert auto_block_rows(torch.empty(2, 12, 10, 64), 4, 2000) == 1536  # under one row
    assert auto_block_rows(torch.empty(1, 2, 10, 2), 2, 3) == 66  # 64 -> whole rows of 3


# ----------------------------------------------------------------------------------------
# Engine
# ----------------------------------------------------------------------------------------
def test_auto_policy():
    eng = engine('lh90', max_dense_mb=1)
    cpu, cuda = torch.device('cpu'), torch.device('cuda')
    small = 50  # 3 layers x 12 heads x 50^2 x 4 B = 0.34 MiB <= 1 MiB
    big = 200  # 5.5 MiB
    assert eng.choose_backend(small, cpu) == 'sdpa'
    assert eng.choose_backend(big, cpu) == 'chunked'
    assert eng.choose_backend(big, cuda) == ('flex' if flex_available() else 'chunked')
    assert eng.choose_backend(big, cuda, dropout_p=0.1) == 'chunked'
    # budget counted in the compute dtype: bf16 halves the dense bytes
    mid = 100  # 1.37 MiB in float32, 0.69 MiB in bfloat16
    assert eng.choose_backend(mid, cpu) == 'chunked'
    assert eng.choose_backend(mid, cpu, torch.bfloat16) == 'sdpa'
    grid = (14, 14)
    q, k, v = qkv(grid, True, batch=1)
    eng(q, k, v, 0, grid, True)
    assert eng.last_backend == 'chunked' and len(eng.dense) == 0
    fixed = engine('lh90', backend='reference')
    assert fixed.choose_backend(big, cuda) == 'reference'


@pytest.mark.parametrize(
    'kwargs,match',
    [
        (dict(backend='fast'), 'unknown LookHere attention backend'),
        (dict(block_size=-1), 'block_size must be None or an int'),
        (dict(max_dense_mb=-1), 'max_dense_mb'),
    ],
)
def test_engine_arguments_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        engine('lh90', **kwargs)


def test_engine_call_is_validated():
    eng = engine('lh90')
    q, k, v = qkv((3, 4), True)
    with pytest.raises(ValueError, match='needs 13'):
        eng(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], 0, (3, 4), True)
    with pytest.raises(ValueError, match='heads'):
        eng(q[:, :6], k[:, :6], v[:, :6], 0, (3, 4), True)
    with pytest.raises(ValueError, match='layer 3 out of range'):
        eng(q, k, v, 3, (3, 4), True)
    with pytest.raises(ValueError, match='unknown LookHere attention backend'):
        eng(q, k, v, 0, (3, 4), True, backend='auto')


def test_sdpa_masks_are_four_dimensional():
    """A 3-D attn_mask sends CPU SDPA to the slow math kernel; the engine passes 4-D."""
    seen = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((q.dim(), None if attn_mask is None else attn_mask.dim()))
        return original(q, k, v, attn_mask=attn_mask, **kw)

    eng = engine('lh90', block_size=5)
    q, k, v = qkv((4, 5), True)
    torch.nn.functional.scaled_dot_product_attention = spy
    try:
        for backend in ('sdpa', 'chunked'):
            eng(q, k, v, 0, (4, 5), True, backend=backend)
        eng.window_attention(q, k, v, 0, (4, 5), 3, True)
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    assert seen and all(qd == 4 and md in (None, 4) for qd, md in seen), seen
