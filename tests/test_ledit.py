"""``pos_encoding='ledit'``: LEDiT's causal attention (every backend against an independent
reference), causal windows, the locality module, and the encoding inside the trunk."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn

from lookhere_dense.errors import PosEncodingError
from lookhere_dense.lookhere import create_model
from lookhere_dense.lookhere.attention.causal import (
    causal_block_mask,
    causal_chunked,
    causal_flex,
)
from lookhere_dense.lookhere.flex import flex_available
from lookhere_dense.lookhere.pos_encoding import (
    LEDiTPositionEncoding,
    LocalityConv,
    build_position_encoding,
    parse_pos_encoding,
)

needs_flex = pytest.mark.skipif(not flex_available(), reason='no flex_attention in this torch')
TINY = dict(embed_dims=32, num_layers=2, num_heads=2, patch_size=8, img_size=32, init_values=None)


# -- an independent reference: visibility written out token by token ----------------------
def visibility(grid, prefix, window=0, global_prefix=True):
    """``(T, T)`` bool, True where query token ``i`` sees key token ``j`` (prefix first)."""
    h, w = grid
    total = prefix + h * w
    vis = torch.zeros(total, total, dtype=torch.bool)
    for i in range(total):
        for j in range(total):
            if i < prefix:  # a prefix query
                vis[i, j] = True if global_prefix else j <= i
            elif j < prefix:  # every patch sees every prefix key
                vis[i, j] = True
            else:
                (yi, xi), (yj, xj) = divmod(i - prefix, w), divmod(j - prefix, w)
                if window:
                    same = (yi // window, xi // window) == (yj // window, xj // window)
                    order = (yj % window, xj % window) <= (yi % window, xi % window)
                    vis[i, j] = same and order
                else:
                    vis[i, j] = (yj, xj) <= (yi, xi)  # raster order
    return vis


def reference(q, k, v, vis):
    logits = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return logits.masked_fill(~vis, float('-inf')).softmax(-1) @ v


def qkv(grid, prefix, seed=0, dtype=torch.float64, grad=False, batch=2, heads=3, dim=8):
    g = torch.Generator().manual_seed(seed)
    total = prefix + grid[0] * grid[1]
    out = [torch.randn(batch, heads, total, dim, generator=g, dtype=dtype) for _ in range(3)]
    return [t.requires_grad_(grad) for t in out]


def encoding(backend='auto', **options):
    spec = dict(type='ledit', **options)
    return build_position_encoding(
        spec, embed_dims=16, num_heads=2, depth=2, grid_size=(4, 4), attn_backend=backend
    )


BACKENDS = ['sdpa', 'chunked', 'reference', 'auto']


# -- global causal attention ---------------------------------------------------------------
@pytest.mark.parametrize('prefix', [0, 1, 3])
@pytest.mark.parametrize('backend', BACKENDS)
def test_backends_equal_the_reference_forward_and_gradients(backend, prefix):
    grid = (3, 5)
    enc = encoding(backend)
    q, k, v = qkv(grid, prefix, grad=True)
    out = enc(q, k, v, 0, grid, prefix)
    ref = reference(q, k, v, visibility(grid, prefix))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    cot = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), cot)
    ref_grads = torch.autograd.grad(ref, (q, k, v), cot)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert enc.last_backend == ('sdpa' if backend == 'auto' else backend)


@pytest.mark.parametrize('prefix', [0, 1, 3])
@pytest.mark.parametrize('rows', [1, 4, 7, 100])
def test_chunked_blocks_of_any_size_with_and_without_autograd(rows, prefix):
    grid = (4, 5)
    q, k, v = qkv(grid, prefix)
    ref = reference(q, k, v, visibility(grid, prefix))
    with torch.no_grad():  # written straight into the result
        torch.testing.assert_close(causal_chunked(q, k, v, prefix, block_size=rows), ref)
        torch.testing.assert_close(
            causal_chunked(q, k, v, prefix, block_size=rows, recompute=True), ref
        )
    q.requires_grad_(True)
    out = causal_chunked(q, k, v, prefix, block_size=rows)  # checkpointed blocks
    torch.testing.assert_close(out, ref)
    (g,) = torch.autograd.grad(out.square().sum(), q)
    (g_ref,) = torch.autograd.grad(reference(q, k, v, visibility(grid, prefix)).square().sum(), q)
    torch.testing.assert_close(g, g_ref)


@needs_flex
@pytest.mark.parametrize('prefix', [0, 1, 3])
def test_flex_equals_the_reference_forward(prefix):
    """Eager flex on CPU (forward only; its gradients need CUDA)."""
    grid = (4, 6)
    enc = encoding('flex')
    q, k, v = qkv(grid, prefix)
    with torch.no_grad():
        out = enc(q, k, v, 0, grid, prefix)
    torch.testing.assert_close(
        out, reference(q, k, v, visibility(grid, prefix)), atol=1e-5, rtol=0
    )
    with pytest.raises(ValueError, match='cannot train on CPU'):
        enc(q.requires_grad_(True), k, v, 0, grid, prefix)
    with pytest.raises(ValueError, match='no attention dropout'), torch.no_grad():
        enc(q, k, v, 0, grid, prefix, dropout_p=0.1)


def _tiles(num, idx):
    n_q, n_k = idx.shape[-2:]
    out = torch.zeros(n_q, n_k, dtype=torch.bool)
    for i in range(n_q):
        out[i, idx[0, 0, i, : num[0, 0, i]].long()] = True
    return out


@needs_flex
@pytest.mark.parametrize(
    'tokens,prefix',
    [(t, j) for t in (1, 15, 16, 17, 50) for j in (0, 1, 3, 20) if j < t],
)
@pytest.mark.parametrize('global_prefix', [True, False])
def test_block_mask_equals_flex_create_block_mask(tokens, prefix, global_prefix):
    """Tiles of 16 tokens: whole, ragged, prefix rows spanning tiles."""
    from torch.nn.attention.flex_attention import create_block_mask

    glob = prefix if global_prefix else 0
    ref = create_block_mask(
        lambda b, h, i, j: (j <= i) | (i < glob), None, None, tokens, tokens, 'cpu', 16
    )
    mine = causal_block_mask(tokens, prefix, global_prefix, 'cpu', block=16)
    for num, idx in (('kv_num_blocks', 'kv_indices'), ('full_kv_num_blocks', 'full_kv_indices')):
        torch.testing.assert_close(
            _tiles(getattr(mine, num), getattr(mine, idx)),
            _tiles(getattr(ref, num), getattr(ref, idx)),
        )
    q, k, v = qkv((1, tokens - prefix), prefix, heads=1)
    torch.testing.assert_close(
        causal_flex(q, k, v, prefix, global_prefix, block_mask=mine),
        reference(q, k, v, visibility((1, tokens - prefix), prefix, 0, global_prefix)),
    )


@pytest.mark.parametrize('backend', BACKENDS + (['flex'] if flex_available() else []))
def test_a_later_patch_never_changes_an_earlier_patch(backend):
    """Causality: changing the key / value of patch ``m`` leaves the outputs of the patches
    before it as they were (bit for bit up to rounding), and changes patch ``m``'s."""
    grid, m = (4, 5), 11
    enc = encoding(backend)
    q, k, v = qkv(grid, 0)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, m:] += 3.0
    v2[:, :, m:] -= 5.0
    with torch.no_grad():
        a, b = enc(q, k, v, 0, grid, 0), enc(q, k2, v2, 0, grid, 0)
    torch.testing.assert_close(a[:, :, :m], b[:, :, :m], atol=1e-12, rtol=0)
    assert (a[:, :, m:] - b[:, :, m:]).abs().amax(-1).min() > 1e-3


@pytest.mark.parametrize('global_prefix', [True, False])
def test_prefix_queries_are_global_or_causal(global_prefix):
    grid, prefix = (3, 3), 2
    enc = encoding('sdpa', global_prefix=global_prefix)
    q, k, v = qkv(grid, prefix)
    out = enc(q, k, v, 0, grid, prefix)
    ref = reference(q, k, v, visibility(grid, prefix, 0, global_prefix))
    torch.testing.assert_close(out, ref)
    v2 = v.clone()
    v2[:, :, -1] += 1.0  # the last patch
    moved = (enc(q, k, v2, 0, grid, prefix) - out)[:, :, :prefix].abs().max()
    assert (moved > 1e-6) == global_prefix


def test_cls_token_takes_bools_and_counts_and_checks_the_length():
    enc = encoding()
    grid = (2, 3)
    q, k, v = qkv(grid, 1)
    torch.testing.assert_close(enc(q, k, v, 0, grid, True), enc(q, k, v, 0, grid, 1))
    q0, k0, v0 = qkv(grid, 0)
    torch.testing.assert_close(enc(q0, k0, v0, 0, grid, False), enc(q0, k0, v0, 0, grid, 0))
    with pytest.raises(ValueError, match=r'with 2 prefix tokens needs 8'):
        enc(q, k, v, 0, grid, 2)
    with pytest.raises(TypeError, match='bool or an int'):
        enc(q, k, v, 0, grid, 1.0)


def test_dropout_runs_in_sdpa_and_chunked():
    grid = (3, 4)
    for backend in ('sdpa', 'chunked'):
        q, k, v = qkv(grid, 1, dtype=torch.float32, grad=True)
        out = encoding(backend)(q, k, v, 0, grid, 1, dropout_p=0.5)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()


# -- windows -------------------------------------------------------------------------------
@pytest.mark.parametrize('prefix', [0, 1, 3])
@pytest.mark.parametrize('grid,ws', [((5, 7), 3), ((4, 4), 2), ((2, 3), 4)])
def test_window_attention_equals_the_reference(grid, ws, prefix):
    """Causal inside each window (the window's raster order), padded keys of border windows
    masked, prefix keys seen by every patch, prefix queries global; float64 gradients."""
    enc = encoding()
    q, k, v = qkv(grid, prefix, grad=True)
    out = enc.window_attention(q, k, v, 0, grid, ws, prefix)
    ref = reference(q, k, v, visibility(grid, prefix, window=ws))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    cot = torch.randn_like(out)
    for a, b in zip(
        torch.autograd.grad(out, (q, k, v), cot), torch.autograd.grad(ref, (q, k, v), cot)
    ):
        assert torch.isfinite(a).all()  # padded rows: no NaN
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_a_window_covering_the_grid_is_global_causal_attention():
    enc = encoding()
    grid = (5, 7)
    q, k, v = qkv(grid, 1)
    torch.testing.assert_close(
        enc.window_attention(q, k, v, 0, grid, 8, 1), enc(q, k, v, 0, grid, 1)
    )


# -- the locality module -------------------------------------------------------------------
@pytest.mark.parametrize('grid', [(1, 1), (1, 7), (5, 1), (4, 6)])
@pytest.mark.parametrize('dilations', [(1,), (1, 2)])
def test_locality_is_a_residual_depthwise_convolution_at_any_grid(grid, dilations):
    torch.manual_seed(0)
    mod = LocalityConv(6, 3, dilations, zero_init=False)
    x = torch.randn(2, grid[0] * grid[1], 6, requires_grad=True)
    out = mod(x, grid)
    assert out.shape == x.shape
    img = x.transpose(1, 2).reshape(2, 6, *grid)
    ref = img.clone()
    for i, d in enumerate(dilations):
        conv = nn.Conv2d(6, 6, 3, padding=d, dilation=d, groups=6, bias=False)
        conv.weight.data.copy_(mod.weight[i])
        ref = ref + conv(img)
    ref = ref + mod.bias[:, None, None]
    torch.testing.assert_close(out, ref.flatten(2).transpose(1, 2))
    out.square().sum().backward()
    assert mod.weight.grad.abs().sum() > 0 and mod.bias.grad.abs().sum() > 0


def test_locality_starts_as_the_identity_and_its_parameters_get_gradients():
    mod = LocalityConv(4)
    x = torch.randn(1, 12, 4)
    out = mod(x, (3, 4))
    torch.testing.assert_close(out, x, rtol=0, atol=0)
    out.sin().sum().backward()
    assert mod.weight.grad.abs().sum() > 0 and mod.bias.grad.abs().sum() > 0
    full = LocalityConv(4, 5, depthwise=False)
    assert full.weight.shape == (1, 4, 4, 5, 5)
    with pytest.raises(ValueError, match=r'expected \(B, 4\*4, 4\) for the grid \(4, 4\)'):
        mod(x, (4, 4))


def test_patch_zero_sees_its_neighbours_only_through_the_locality_module():
    """In the causal trunk (no CLS), the top-left patch attends only to itself; with the
    locality module its output depends on the patches right of / below it."""
    torch.manual_seed(0)
    model = create_model(**TINY, with_cls_token=False, pos_encoding='ledit').eval()
    x = torch.randn(1, 3, 32, 32)
    shifted = x.clone()
    shifted[..., 8:16, 8:16] += 1.0  # patch (1, 1)
    with torch.no_grad():
        same = (model(x)[0] - model(shifted)[0])[..., 0, 0].abs().max()
        model.pos_enc.locality.weight.normal_()
        moved = (model(x)[0] - model(shifted)[0])[..., 0, 0].abs().max()
    assert same < 1e-6  # zero-initialised: the identity, patch 0 sees only itself
    assert moved > 1e-3


def test_trunk_without_cls_is_causal_end_to_end():
    """A later patch's pixels change no earlier patch two rows above it (the 3x3 locality
    module reaches one row up; causal attention never looks forward)."""
    torch.manual_seed(0)
    model = create_model(**TINY, with_cls_token=False, pos_encoding='ledit').eval()
    with torch.no_grad():
        model.pos_enc.locality.weight.normal_()
        x = torch.randn(1, 3, 32, 40)  # 4x5 grid
        later = x.clone()
        later[..., 24:32, 32:40] += 1.0  # the last patch (3, 4)
        diff = (model(x)[0] - model(later)[0]).abs().amax(1)[0]  # (4, 5)
    assert diff[:2].max() < 1e-5  # rows 0-1: before the last patch's neighbourhood
    assert diff[3, 4] > 1e-3


# -- the encoding in the trunk ---------------------------------------------------------------
@pytest.mark.parametrize('with_cls', [True, False])
@pytest.mark.parametrize('window', [0, 2])
def test_trunk_forward_backward_any_size_and_state_dict_round_trip(with_cls, window):
    kw = dict(window_size=window, window_block_indexes=[0]) if window else {}

    def build():
        return create_model(
            embed_dims=64,
            num_layers=2,
            num_heads=2,
            patch_size=16,
            img_size=64,
            pos_encoding='ledit',
            with_cls_token=with_cls,
            **kw,
        )

    torch.manual_seed(0)
    model = build()
    assert [n for n, _ in model.pos_enc.named_parameters()] == ['locality.weight', 'locality.bias']
    for size, grid in (((64, 64), (4, 4)), ((96, 160), (6, 10)), ((48, 80), (3, 5))):
        out = model(torch.randn(2, 3, *size))[0]
        assert out.shape == (2, 64, *grid) and torch.isfinite(out).all()
        out.mean().backward()
    assert model.pos_enc.locality.weight.grad.abs().sum() > 0
    clone = build()
    clone.load_state_dict(model.state_dict())
    x = torch.randn(1, 3, 96, 160)
    with torch.no_grad():
        torch.testing.assert_close(clone.eval()(x)[0], model.eval()(x)[0], rtol=0, atol=0)


def test_trunk_with_jumbo_prefix_tokens():
    from lookhere_dense.lookhere.vit import LookHereVisionTransformer

    if 'jumbo_tokens' not in inspect.signature(LookHereVisionTransformer).parameters:
        pytest.skip('this trunk has no Jumbo tokens')
    model = create_model(**TINY, with_cls_token=False, jumbo_tokens=3, pos_encoding='ledit')
    out = model(torch.randn(1, 3, 40, 24))[0]
    assert out.shape == (1, 32, 5, 3) and torch.isfinite(out).all()


def test_backends_in_the_trunk_agree():
    torch.manual_seed(0)
    outs = {}
    x = torch.randn(1, 3, 40, 48)
    backends = ['auto', 'sdpa', 'chunked', 'reference'] + (['flex'] if flex_available() else [])
    for backend in backends:
        torch.manual_seed(0)
        model = create_model(**TINY, pos_encoding='ledit', attn_backend=backend).eval()
        with torch.no_grad():
            outs[backend] = model(x)[0]
    for backend in backends:
        torch.testing.assert_close(outs[backend], outs['reference'], atol=1e-5, rtol=1e-4)
    chunked = create_model(**TINY, pos_encoding='ledit', attn_backend='chunked', attn_block_size=3)
    assert chunked.pos_enc.block_size == 3


# -- options and errors ----------------------------------------------------------------------
def test_options_build_the_module_they_name():
    enc = encoding(kernel_size=5, dilations=[1, 2], zero_init=False)
    assert enc.locality.weight.shape == (2, 16, 1, 5, 5) and enc.locality.weight.abs().sum() > 0
    assert encoding(dilations=2).locality.dilations == (2,)
    bare = encoding(locality=False)
    assert bare.locality is None and list(bare.parameters()) == []
    x = torch.randn(1, 6, 16)
    assert bare.add_to_tokens(x, (2, 3)) is x
    spec = parse_pos_encoding(dict(type='ledit', kernel_size=5))
    assert spec.name == 'ledit' and spec.options == {'kernel_size': 5}
    assert isinstance(
        build_position_encoding('ledit', embed_dims=8, num_heads=2, depth=1, grid_size=(2, 2)),
        LEDiTPositionEncoding,
    )


@pytest.mark.parametrize(
    'options,match',
    [
        (dict(kernel_size=4), 'kernel_size must be odd'),
        (dict(kernel_size=0), 'kernel_size must be a positive int'),
        (dict(dilations=[]), 'dilations must be a positive int or a non-empty list'),
        (dict(dilations=[1, 0]), 'dilations entry must be a positive int, got 0'),
        (dict(dilations=[2, 2]), 'repeat a rate'),
        (dict(depthwise=1), 'depthwise must be True or False, got 1'),
        (dict(locality='yes'), 'locality must be True or False'),
        (dict(global_prefix=None), 'global_prefix must be True or False'),
    ],
)
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        encoding(**options)


def test_unknown_options_and_backends_are_named():
    with pytest.raises(PosEncodingError, match=r"has no options \['theta'\]"):
        parse_pos_encoding(dict(type='ledit', theta=1.0))
    with pytest.raises(ValueError, match="cannot run attn_backend='tiled'"):
        create_model(**TINY, pos_encoding='ledit', attn_backend='tiled')
    with pytest.raises(ValueError, match="unknown LookHere attention backend 'bogus'"):
        create_model(**TINY, pos_encoding='ledit', attn_backend='bogus')


def test_locality_parameters_are_not_reinitialised_by_the_trunk():
    """``init_weights`` re-initialises Linear / LayerNorm layers only; the locality module
    keeps its own (zero) initialisation, drawn from the encoding's RNG stream."""
    model = create_model(**TINY, pos_encoding='ledit')
    model.init_weights()
    assert model.pos_enc.locality.weight.abs().sum() == 0
