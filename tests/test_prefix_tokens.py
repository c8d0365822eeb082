"""``J >= 0`` global prefix tokens (CLS is ``J = 1``, Jumbo tokens ``J``) in every backend.

Every attention path takes ``cls_token`` as the number ``J`` of global prefix tokens at the
front of ``[p_0..p_{J-1}, patch_0, ..., patch_{N-1}]``: no LookHere mask, bias 0 to and
from them, not rotated by RoPE / no PaPE features, every patch query sees all of them and
their queries attend to every token (also in window blocks). For ``J`` in 0..3 each path
is compared with a plain reference built here, independently of the code under test: the
patch-to-patch bias read from the relative table at :func:`offset_index` (plus the
``center`` key term), zero-padded by ``J`` rows and columns, window blocks as ``-inf``
across windows, then softmax attention in float64. Forward in float32 to 1e-5, gradients
of ``q, k, v`` in float64 to 1e-9.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_backends import HEADS
from test_backends import qkv as backends_qkv

from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine, LookHereConfig
from lookhere_dense.lookhere.bias import (
    GridBias,
    build_grid_bias,
    gather_block,
    gather_rows,
    num_prefix_tokens,
    offset_index,
)
from lookhere_dense.lookhere.chunked import chunked_attention
from lookhere_dense.lookhere.export import StaticGridAttention
from lookhere_dense.lookhere.flex import flex_available, tile_order
from lookhere_dense.lookhere.pos_encoding.base import NoPositionEncoding
from lookhere_dense.lookhere.pos_encoding.pape import ParabolicPositionEncoding
from lookhere_dense.lookhere.pos_encoding.rope import AxialRoPE2d, MixedRoPE2d
from lookhere_dense.lookhere.tiled import TileOptions

DEPTH = 2
DIM = 8
CONFIGS = {
    'lh180': PRESETS['lh180'],
    'lh90': PRESETS['lh90'],
    'lh45': PRESETS['lh45'],
    'none': LookHereConfig('none'),
    'center': LookHereConfig('corners-center'),
}
GRIDS = [(3, 4), (5, 5), (4, 7)]
PREFIX = [0, 1, 2, 3]
#: tiny tiled blocks: many calls and merges, 1- and 2-wide strips, empty queries
FINE = TileOptions(rows=2, max_keys=6, min_cols=2, strips=(1, 2), call_cost=0)

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def qkv(grid, prefix, batch=2, dtype=torch.float32, seed=0, grad=False):
    """The conformance suite's random ``q, k, v`` ``(batch, heads, J + H*W, DIM)`` (peaky
    softmaxes: the bias matters), another draw per prefix count."""
    return backends_qkv(grid, prefix, batch, DIM, dtype, grad, seed + 7 * prefix)


def patch_bias(gb: GridBias, layer: int) -> torch.Tensor:
    """The ``(heads, N, N)`` patch bias straight from the relative table (float64)."""
    n = gb.num_patches
    idx = torch.arange(n)
    out = gb.table[layer].double().flatten(1)[:, offset_index(gb.grid_size, idx, idx)]
    if gb.key_term is not None:
        out = out + gb.key_term[layer].double()[:, None, :]
    return out


def with_prefix(bias: torch.Tensor, prefix: int) -> torch.Tensor:
    """``J`` zero rows and columns in front: no bias to or from the prefix tokens."""
    return F.pad(bias, (prefix, 0, prefix, 0))


def window_patch_bias(window_gb: GridBias, layer: int, grid, ws: int) -> torch.Tensor:
    """The ``(heads, N, N)`` bias of window attention over the whole grid: the window
    grid's bias between patches of one window, ``-inf`` across windows (float64)."""
    wb = patch_bias(window_gb, layer)
    n = grid[0] * grid[1]
    ys, xs = torch.arange(n) // grid[1], torch.arange(n) % grid[1]
    win = (ys // ws) * 1000 + xs // ws
    local = (ys % ws) * ws + xs % ws
    bias = wb[:, local[:, None], local[None, :]]
    return bias.masked_fill(win[:, None] != win[None, :], -math.inf)


def plain_attention(q, k, v, bias=None):
    """softmax(q k^T / sqrt(d) + bias) v in float64, returned in ``q``'s dtype."""
    qd, kd, vd = (t.double() for t in (q, k, v))
    logits = qd @ kd.transpose(-2, -1) * q.shape[-1] ** -0.5
    if bias is not None:
        logits = logits + bias.double()
    return (logits.softmax(-1) @ vd).to(q.dtype)


def grads(out, inputs, seed=1):
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    return torch.autograd.grad((out * weight).sum(), inputs)


def engine(name, **kw):
    return LookHereAttentionEngine(CONFIGS[name], DEPTH, HEADS, **kw)


def run_backend(eng, backend, q, k, v, layer, grid, prefix):
    if backend == 'tiled':
        from lookhere_dense.lookhere.tiled import tiled_attention

        gb = eng.grid_bias(grid, q.device, q.dtype)
        return tiled_attention(q, k, v, gb, layer, prefix, options=FINE)
    if backend == 'tiled-default':
        backend = 'tiled'
    if backend == 'chunked-rows':  # blocks of whole grid rows
        gb = eng.grid_bias(grid, q.device, q.dtype)
        return chunked_attention(q, k, v, gb, layer, prefix, block_size=grid[1])
    return eng(q, k, v, layer, grid, prefix, backend=backend)


GLOBAL_BACKENDS = ['reference', 'sdpa', 'chunked', 'chunked-rows', 'tiled', 'tiled-default']


# ----------------------------------------------------------------------------------------
# The argument
# ----------------------------------------------------------------------------------------
def test_cls_token_is_a_prefix_count():
    assert [num_prefix_tokens(x) for x in (False, True, 0, 1, 2, 5)] == [0, 1, 0, 1, 2, 5]
    with pytest.raises(ValueError, match='>= 0'):
        num_prefix_tokens(-1)
    with pytest.raises(TypeError, match='number of global prefix'):
        num_prefix_tokens(1.5)
    eng = engine('lh90')
    q, k, v = qkv((3, 4), 2)
    with pytest.raises(ValueError, match=r'grid \(3, 4\) with 3 prefix tokens needs 15'):
        eng(q, k, v, 0, (3, 4), 3)
    with pytest.raises(ValueError, match='with 1 prefix token needs 13'):
        eng.window_attention(q, k, v, 0, (3, 4), 2, True)
    with pytest.raises(ValueError, match='without prefix tokens needs 12'):
        NoPositionEncoding()(q, k, v, 0, (3, 4), 0)
    # keys of another length than the queries: the error names the keys' length
    with pytest.raises(ValueError, match=r'attention got 13 tokens but grid \(3, 4\) with 2'):
        eng(q, k[:, :, :13], v[:, :, :13], 0, (3, 4), 2)


# ----------------------------------------------------------------------------------------
# The bias
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', ['lh45', 'center'])
@pytest.mark.parametrize('grid', [(1, 1), (3, 4), (4, 7)])
@pytest.mark.parametrize('prefix', PREFIX)
def test_dense_bias_and_row_blocks_have_zero_prefix_rows_and_columns(name, grid, prefix):
    gb = build_grid_bias(CONFIGS[name], grid, DEPTH, HEADS, dtype=torch.float64)
    want = with_prefix(patch_bias(gb, 1), prefix)
    assert torch.equal(gb.dense(1, prefix), want)
    total = gb.num_patches + prefix
    kt = None if gb.key_term is None else gb.key_term[1]
    for start, stop in [(0, total), (0, 1), (1, 2), (0, prefix), (1, total), (2, total - 1)]:
        start, stop = min(start, total), max(min(stop, total), min(start, total))
        got = gather_rows(gb.table[1], grid, start, stop, prefix, kt, cls_value=-3.0)
        rows = want[:, start:stop].clone()
        rows[:, :, :prefix] = -3.0
        rows[:, : max(0, min(stop, prefix) - start)] = -3.0
        assert torch.equal(got, rows), (start, stop)


@pytest.mark.parametrize('prefix', PREFIX)
@pytest.mark.parametrize('requires_grad', [False, True])
def test_gather_block_puts_the_prefix_columns_first_or_last(prefix, requires_grad):
    grid = (4, 5)
    gb = build_grid_bias(CONFIGS['center'], grid, DEPTH, HEADS, dtype=torch.float64)
    table = gb.table[0].clone().requires_grad_(requires_grad)
    kt = gb.key_term[0].clone().requires_grad_(requires_grad)
    dense = patch_bias(gb, 0)
    for (s, e), (r0, r1), where, rev in [
        ((0, 20), (0, 4), 'first', False),
        ((3, 17), (1, 3), 'last', True),
        ((5, 11), (2, 4), 'last', False),
        ((0, 9), (0, 2), 'first', True),
    ]:
        got = gather_block(
            table, grid, s, e, (r0, r1), where, kt, -5.0, reverse_queries=rev, num_prefix=prefix
        )
        block = dense[:, s:e, r0 * 5 : r1 * 5]
        pad = (prefix, 0) if where == 'first' else (0, prefix)
        want = F.pad(block, pad, value=-5.0)
        assert torch.equal(got.detach().flip(1) if rev else got.detach(), want)
        if requires_grad:  # the autograd path gives the table its gradient
            g_key = torch.autograd.grad(got.sum(), kt)[0]  # e - s queries per seen key
            seen = torch.zeros(20, dtype=torch.float64)
            seen[r0 * 5 : r1 * 5] = e - s
            assert torch.equal(g_key, seen.expand(HEADS, -1))


# ----------------------------------------------------------------------------------------
# Global attention
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', sorted(CONFIGS))
@pytest.mark.parametrize('prefix', PREFIX)
def test_global_backends_match_the_plain_reference_float32(name, prefix):
    eng = engine(name, block_size=5)  # blocks not aligned to grid rows or prefix counts
    for grid in GRIDS:
        gb = eng.grid_bias(grid, torch.device('cpu'), torch.float64)
        q, k, v = qkv(grid, prefix)
        for layer in range(DEPTH):
            ref = plain_attention(q, k, v, with_prefix(patch_bias(gb, layer), prefix))
            for backend in GLOBAL_BACKENDS:
                out = run_backend(eng, backend, q, k, v, layer, grid, prefix)
                torch.testing.assert_close(
                    out, ref, atol=1e-5, rtol=0, msg=lambda m, at=f'{backend} {grid}': f'{at}: {m}'
                )


@pytest.mark.skipif(not flex_available(), reason='no flex_attention in this torch')
@pytest.mark.parametrize('name', ['lh90', 'lh45', 'center', 'none'])
@pytest.mark.parametrize('prefix', PREFIX)
@pytest.mark.parametrize('tiles', [False, True])
def test_eager_flex_matches_the_plain_reference(name, prefix, tiles):
    """Eager flex on CPU (forward only): score_mod, mask_mod, BlockMask and tile order."""
    eng = engine(name, flex_tiles=tiles)
    for grid in [(3, 4), (4, 7)]:
        gb = eng.grid_bias(grid, torch.device('cpu'), torch.float64)
        q, k, v = qkv(grid, prefix, batch=1)
        for layer in range(DEPTH):
            ref = plain_attention(q, k, v, with_prefix(patch_bias(gb, layer), prefix))
            with torch.no_grad():
                out = eng(q, k, v, layer, grid, prefix, backend='flex')
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


def test_tile_order_puts_the_prefix_tokens_last():
    order = tile_order((3, 5), 3, tile=(2, 2))
    assert order.tolist()[-3:] == [0, 1, 2]
    assert sorted(order.tolist()) == list(range(18))
    assert torch.equal(tile_order((3, 5), True, tile=(2, 2))[:-1] + 2, order[:-3])


@pytest.mark.parametrize('name', ['lh90', 'lh45', 'center', 'none'])
@pytest.mark.parametrize('prefix', PREFIX)
def test_global_gradients_match_the_plain_reference_float64(name, prefix):
    eng = engine(name, block_size=4)
    for grid in [(3, 4), (4, 7)]:
        gb = eng.grid_bias(grid, torch.device('cpu'), torch.float64)
        q, k, v = qkv(grid, prefix, dtype=torch.float64, grad=True)
        ref = plain_attention(q, k, v, with_prefix(patch_bias(gb, 1), prefix))
        want = (ref,) + grads(ref, (q, k, v))
        for backend in ('reference', 'sdpa', 'chunked', 'chunked-rows', 'tiled'):
            out = run_backend(eng, backend, q, k, v, 1, grid, prefix)
            got = (out,) + grads(out, (q, k, v))
            for what, a, b in zip(('out', 'dq', 'dk', 'dv'), got, want):
                torch.testing.assert_close(
                    a,
                    b,
                    atol=1e-9,
                    rtol=0,
                    msg=lambda m, at=f'{backend} {grid} {what}': f'{at}: {m}',
                )


@pytest.mark.parametrize('prefix', PREFIX)
def test_chunked_gives_a_table_that_requires_grad_its_gradient(prefix):
    """Learnable slopes: the chunked blocks gather the bias with autograd (prefix columns
    included) and the table's gradient equals the plain reference's."""
    grid = (4, 5)
    base = build_grid_bias(CONFIGS['center'], grid, DEPTH, HEADS, dtype=torch.float64)
    table = base.table.clone().requires_grad_(True)
    key = base.key_term.clone().requires_grad_(True)
    gb = GridBias(grid, table, key, base.visible)
    q, k, v = qkv(grid, prefix, dtype=torch.float64, grad=True)
    out = chunked_attention(q, k, v, gb, 1, prefix, block_size=3)
    got = (out,) + grads(out, (q, k, v, table, key))
    ref = plain_attention(q, k, v, with_prefix(patch_bias(gb, 1), prefix))
    want = (ref,) + grads(ref, (q, k, v, table, key))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)


# ----------------------------------------------------------------------------------------
# Window attention
# ----------------------------------------------------------------------------------------
#: (grid, window): padded at the bottom and right, exact, padded at the right only
WINDOWS = [((5, 5), 3), ((4, 6), 2), ((4, 7), 4)]


@pytest.mark.parametrize('name', ['lh180', 'lh90', 'lh45', 'none', 'center'])
@pytest.mark.parametrize('prefix', PREFIX)
def test_window_attention_matches_the_plain_reference(name, prefix):
    eng = engine(name)
    for grid, ws in WINDOWS:
        wgb = eng.grid_bias((ws, ws), torch.device('cpu'), torch.float64)
        bias = with_prefix(window_patch_bias(wgb, 1, grid, ws), prefix)
        q, k, v = qkv(grid, prefix)
        ref = plain_attention(q, k, v, bias)
        out = eng.window_attention(q, k, v, 1, grid, ws, prefix)
        torch.testing.assert_close(
            out, ref, atol=1e-5, rtol=0, msg=lambda m, at=grid: f'{at}: {m}'
        )
        q, k, v = qkv(grid, prefix, dtype=torch.float64, grad=True)
        ref = plain_attention(q, k, v, bias)
        out = eng.window_attention(q, k, v, 1, grid, ws, prefix)
        for a, b in zip((out,) + grads(out, (q, k, v)), (ref,) + grads(ref, (q, k, v))):
            torch.testing.assert_close(
                a, b, atol=1e-9, rtol=0, msg=lambda m, at=grid: f'{at}: {m}'
            )


# ----------------------------------------------------------------------------------------
# Encodings without a LookHere bias
# ----------------------------------------------------------------------------------------
def window_mask(grid, ws, prefix):
    """Plain window attention without a bias: 0 inside a window and to / from the prefix
    tokens, ``-inf`` across windows."""
    n = grid[0] * grid[1]
    ys, xs = torch.arange(n) // grid[1], torch.arange(n) % grid[1]
    win = (ys // ws) * 1000 + xs // ws
    mask = torch.zeros(n, n, dtype=torch.float64).masked_fill(win[:, None] != win[None], -math.inf)
    return with_prefix(mask, prefix)


def rotate_patches_only(enc, q, k, layer, grid, prefix):
    """The encoding's rotation of the patches alone (no prefix tokens), prefix unrotated."""
    qp, kp = enc.rotate(q[:, :, prefix:], k[:, :, prefix:], layer, grid, 0)
    return torch.cat([q[:, :, :prefix], qp], 2), torch.cat([k[:, :, :prefix], kp], 2)


def rope_encodings():
    torch.manual_seed(0)
    encs = {'none': NoPositionEncoding(), 'rope2d': AxialRoPE2d(DIM)}
    encs['rope2d_mixed'] = MixedRoPE2d(DEPTH, HEADS, DIM)
    try:
        from lookhere_dense.lookhere.pos_encoding.dinov3 import DinoV3RoPE2d

        encs['rope_dinov3'] = DinoV3RoPE2d(DIM).eval()
    except ImportError:  # timm without RotaryEmbeddingDinoV3
        pass
    return encs


def test_rope_encodings_refuse_a_wrong_token_count():
    q, k, _ = qkv((3, 4), 2)
    for name, enc in rope_encodings().items():
        if name == 'none':  # no rotation, nothing to count
            continue
        with pytest.raises(ValueError, match=r'RoPE got 13 tokens but grid \(3, 4\) with 2 '):
            enc.rotate(q[:, :, :13], k[:, :, :13], 1, (3, 4), 2)


@pytest.mark.parametrize('prefix', PREFIX)
def test_rope_and_content_only_encodings_keep_the_prefix_tokens_global(prefix):
    for name, enc in rope_encodings().items():
        for grid, ws in WINDOWS:
            q, k, v = qkv(grid, prefix)
            qr, kr = rotate_patches_only(enc, q, k, 1, grid, prefix)
            ref = plain_attention(qr, kr, v)
            out = enc(q, k, v, 1, grid, prefix)
            torch.testing.assert_close(
                out, ref, atol=1e-5, rtol=0, msg=lambda m, at=name: f'{at}: {m}'
            )
            ref = plain_attention(qr, kr, v, window_mask(grid, ws, prefix))
            out = enc.window_attention(q, k, v, 1, grid, ws, prefix)
            torch.testing.assert_close(
                out, ref, atol=1e-5, rtol=0, msg=lambda m, at=name: f'{at}: {m}'
            )


@pytest.mark.parametrize('prefix', PREFIX)
def test_pape_has_no_parabola_to_or_from_the_prefix_tokens(prefix):
    torch.manual_seed(0)
    enc = ParabolicPositionEncoding(HEADS * DIM, DEPTH, HEADS, parabolas=3)
    for grid, ws in WINDOWS:
        q, k, v = qkv(grid, prefix)
        tokens = torch.randn(q.shape[0], q.shape[2], HEADS * DIM)
        qp, kp = enc.extend(q[:, :, prefix:], k[:, :, prefix:], tokens[:, prefix:], 1, grid, 0)
        extra = qp.shape[-1] - DIM  # PaPE's features (the scale is folded into qp)
        scale = math.sqrt((DIM + extra) / DIM)
        qe = torch.cat([F.pad(q[:, :, :prefix], (0, extra)) * scale, qp], 2)
        ke = torch.cat([F.pad(k[:, :, :prefix], (0, extra)), kp], 2)
        ve = F.pad(v, (0, extra))
        ref = plain_attention(qe, ke, ve)[..., :DIM]  # SDPA's scale: 1/sqrt(DIM + extra)
        out = enc(q, k, v, 1, grid, prefix, tokens=tokens)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
        ref = plain_attention(qe, ke, ve, window_mask(grid, ws, prefix))[..., :DIM]
        out = enc.window_attention(q, k, v, 1, grid, ws, prefix, tokens=tokens)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', ['lh90', 'lh45', 'center'])
@pytest.mark.parametrize('prefix', PREFIX)
def test_static_grid_export_attention_matches_the_plain_reference(name, prefix):
    eng = engine(name)
    for grid, ws in WINDOWS:
        gb = eng.grid_bias(grid, torch.device('cpu'), torch.float64)
        wgb = eng.grid_bias((ws, ws), torch.device('cpu'), torch.float64)
        q, k, v = qkv(grid, prefix)
        for budget in (1e-4, 48.0):  # one grid column per block, and one block
            static = StaticGridAttention(eng, grid, ws, prefix, budget_mb=budget)
            for layer in range(DEPTH):
                ref = plain_attention(q, k, v, with_prefix(patch_bias(gb, layer), prefix))
                out = static(q, k, v, layer, grid, prefix)
                torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
        bias = with_prefix(window_patch_bias(wgb, 1, grid, ws), prefix)
        ref = plain_attention(q, k, v, bias)
        out = static.window_attention(q, k, v, 1, grid, ws, prefix)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    other = (prefix + 1) % 4
    q, k, v = qkv(grid, other)
    with pytest.raises(ValueError, match='prepared .*prefix token.*got a call'):
        static(q, k, v, 0, grid, other)
