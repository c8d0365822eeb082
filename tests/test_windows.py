"""ViTDet-style window attention with the LookHere bias.

The ground truth is computed the slow way: full attention over the whole sequence with
the *full-grid* LookHere bias, where a patch may only attend to the patches of its own
window (and to the CLS token, bias 0), and the CLS query attends to everything (bias 0).
For translation-equivariant head types that is exactly "the bias of a window-sized grid
inside each window", so the engine's padded, partitioned, cached computation must match it
in the forward pass and in the gradients, for grids that are not multiples of the window.
"""

from __future__ import annotations

import collections
import copy
import functools
import math

import pytest
import torch

from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine, lookhere_bias
from lookhere_dense.lookhere.pos_encoding import PositionEncoding
from lookhere_dense.lookhere.windows import (
    padded_grid,
    window_key_mask,
    window_partition,
    window_unpartition,
)
from lookhere_dense.models import LookHereViT

DEPTH = 3
HEADS = {'lh180': 6, 'lh90': 6, 'lh45': 12}  # lh45 has 3 direction types: 12 or 16 heads
# (grid, window): both sides padded, one side padded, window larger than the grid on one
# side, window larger than the whole grid, and a divisible control case.
GRIDS = [((5, 7), 3), ((6, 4), 3), ((3, 5), 4), ((4, 5), 6), ((4, 8), 4)]


def window_of(index: int, width: int, ws: int):
    y, x = divmod(index, width)
    return y // ws, x // ws


@functools.lru_cache(maxsize=None)
def full_bias(config, grid, heads):
    """``(depth, heads, N, N)`` float64 full-grid bias (the lead's tested dense definition)."""
    return lookhere_bias(config, grid, DEPTH, heads, dtype=torch.float64)


@functools.lru_cache(maxsize=None)
def same_window(grid, ws):
    """``(N, N)`` bool: patches ``i`` and ``j`` lie in the same window (one pair at a time)."""
    n, w = grid[0] * grid[1], grid[1]
    return torch.tensor(
        [[window_of(i, w, ws) == window_of(j, w, ws) for j in range(n)] for i in range(n)]
    )


def slow_attention(q, k, v, config, layer, grid, cls_token, ws=None):
    """Reference: dense float64 attention with the full-grid bias; with ``ws``, pairs of
    patches in different windows are blocked."""
    bias = full_bias(config, tuple(grid), q.shape[1])[layer]
    if ws is not None:
        bias = bias.masked_fill(~same_window(tuple(grid), ws), -math.inf)
    if cls_token:  # CLS row and column: 0 (CLS sees every token, every token sees CLS)
        bias = torch.nn.functional.pad(bias, (1, 0, 1, 0))
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias
    return logits.softmax(-1) @ v


def slow_window_attention(q, k, v, config, layer, grid, ws, cls_token):
    return slow_attention(q, k, v, config, layer, grid, cls_token, ws)


def qkv(batch, heads, tokens, dim=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(
            batch, heads, tokens, dim, generator=g, dtype=torch.float64, requires_grad=True
        )
        for _ in range(3)
    ]


@pytest.mark.parametrize('cls_token', [False, True], ids=['nocls', 'cls'])
@pytest.mark.parametrize('grid,ws', GRIDS, ids=[f'{g[0]}x{g[1]}-ws{w}' for g, w in GRIDS])
@pytest.mark.parametrize('preset', sorted(HEADS))
def test_window_attention_equals_full_attention_restricted_to_windows(preset, grid, ws, cls_token):
    config, heads = PRESETS[preset], HEADS[preset]
    engine = LookHereAttentionEngine(config, DEPTH, heads)
    n = grid[0] * grid[1] + int(cls_token)
    q, k, v = qkv(2, heads, n)
    upstream = torch.randn(
        2, heads, n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )
    for layer in range(DEPTH):  # each layer has its own slope
        out = engine.window_attention(q, k, v, layer, grid, ws, cls_token)
        ref = slow_window_attention(q, k, v, config, layer, grid, ws, cls_token)
        assert out.shape == ref.shape == (2, heads, n, 4)
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
        grads = torch.autograd.grad(out, (q, k, v), upstream)
        ref_grads = torch.autograd.grad(ref, (q, k, v), upstream)
        for name, g, r in zip('qkv', grads, ref_grads):
            assert torch.isfinite(g).all(), name
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10, msg=f'grad of {name}')


def test_windows_restrict_attention():
    """Sanity of the reference itself: a window changes the result of global attention,
    and perturbing a token only changes the outputs of its own window (and CLS)."""
    config, grid, ws = PRESETS['lh180'], (5, 7), 3
    engine = LookHereAttentionEngine(config, DEPTH, 6)
    q, k, v = (t.detach() for t in qkv(1, 6, 36))
    windowed = engine.window_attention(q, k, v, 0, grid, ws, True)
    global_ = slow_attention(q, k, v, config, 0, grid, True)
    assert not torch.allclose(windowed, global_)
    v2 = v.clone()
    v2[:, :, 1 + 0] += 1.0  # patch (0, 0): window (0, 0)
    changed = engine.window_attention(q, k, v2, 0, grid, ws, True) - windowed
    changed = changed.abs().amax((0, 1, 3))
    in_window = {1 + i for i in range(35) if window_of(i, 7, ws) == (0, 0)}
    for t in range(36):
        assert (changed[t] > 0) == (t == 0 or t in in_window), t


@pytest.mark.parametrize('cls_token', [False, True])
def test_a_window_covering_the_grid_is_global_attention(cls_token):
    """Translation equivariance: one (padded) window over the whole grid gives global
    LookHere attention."""
    config, grid = PRESETS['lh90'], (4, 5)
    engine = LookHereAttentionEngine(config, DEPTH, 6)
    q, k, v = qkv(1, 6, 20 + int(cls_token))
    out = engine.window_attention(q, k, v, 2, grid, 7, cls_token)
    ref = slow_attention(q, k, v, config, 2, grid, cls_token)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    'lh_config', [dict(fill_with='max'), dict(head_directions='halves-center')]
)
def test_a_window_bias_that_depends_on_the_window_grid_keeps_its_window(lh_config):
    """``center`` heads (distance from the window's centre) and ``fill_with='max'``
    (blocked keys get the window's largest distance): a cut window has another bias (a
    review found outputs ~1 apart), so these keep ``window_size``."""
    from lookhere_dense.lookhere import create_model, explain_backend

    model = create_model(
        img_size=96,
        patch_size=16,
        embed_dims=128,
        num_layers=1,
        num_heads=16,
        window_size=64,
        window_block_indexes=[0],
        lh_config=lh_config,
    ).eval()
    line = explain_backend(model, (96, 160), print_fn=None)[1]
    assert line.startswith('layer 0 (window 64): windows'), line
    seen = []
    real = type(model.pos_enc).window_attention

    def record(self, q, k, v, layer, grid, ws, *args, **kwargs):
        seen.append(ws)
        return real(self, q, k, v, layer, grid, ws, *args, **kwargs)

    type(model.pos_enc).window_attention = record
    try:
        with torch.no_grad():
            model(torch.randn(1, 3, 96, 160))
    finally:
        type(model.pos_enc).window_attention = real
    assert seen == [64]


@pytest.mark.parametrize('pos_encoding', ['lookhere', 'rope2d', 'pape', 'abs', 'none', 'ledit'])
def test_a_window_larger_than_the_grid_is_cut_to_the_grid(pos_encoding, monkeypatch):
    """``window_size=64`` on a 6x10 grid (pixels meant for patches): the blocks attend in
    one 10x10 window, not one 64x64 window of 4,090 padded tokens (~150x the time in a
    new-user trial); the result is the uncut window's up to float32 rounding (the padded
    keys' zeros change the summation order), for every position encoding (the uncut window
    called directly; LookHere's default heads here, the window-grid-dependent ones below)."""
    from lookhere_dense.lookhere import create_model
    from lookhere_dense.lookhere.attention.windows import effective_window

    assert effective_window((6, 10), 64) == 10 and effective_window((6, 10), 4) == 4
    assert effective_window((64, 64), 14) == 14
    heads = 16 if pos_encoding == 'lookhere' else 4
    torch.manual_seed(0)
    model = create_model(
        img_size=96,
        patch_size=16,
        embed_dims=heads * 8,
        num_layers=1,
        num_heads=heads,
        pos_encoding=pos_encoding,
        window_size=64,
        window_block_indexes=[0],
    ).eval()
    pos_enc = model.pos_enc
    seen, uncut = [], []
    real = type(pos_enc).window_attention

    def record(self, q, k, v, layer, grid, ws, *args, **kwargs):
        seen.append(ws)
        uncut.append(real(self, q, k, v, layer, grid, 64, *args, **kwargs))
        return real(self, q, k, v, layer, grid, ws, *args, **kwargs)

    monkeypatch.setattr(type(pos_enc), 'window_attention', record)
    hooked = []
    model.blocks[0].attn.register_forward_hook(lambda m, i, o: hooked.append(o))
    x = torch.randn(1, 3, 96, 160)
    with torch.no_grad():
        model(x)
    assert seen == [10]
    from lookhere_dense.lookhere import explain_backend

    line = explain_backend(model, (96, 160), print_fn=None)[1]
    assert line.startswith('layer 0 (window 10, cut from 64: the grid): windows')
    monkeypatch.setattr(type(pos_enc), 'window_attention', lambda self, *a, **k: uncut[0])
    with torch.no_grad():
        model(x)
    torch.testing.assert_close(hooked[0], hooked[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('grid,ws', [((5, 7), 3), ((6, 6), 3), ((2, 9), 4)])
def test_partition_round_trip_and_padding_mask(grid, ws):
    h, w = grid
    x = torch.arange(2 * 3 * h * w * 2, dtype=torch.float32).reshape(2, 3, h * w, 2)
    parts = window_partition(x, grid, ws)
    hp, wp = padded_grid(grid, ws)
    assert parts.shape == (2, (hp // ws) * (wp // ws), 3, ws * ws, 2)
    assert torch.equal(window_unpartition(parts, grid, ws), x)
    # window (r, c), slot (i, j) holds patch (r*ws + i, c*ws + j), zero where padded
    for r in range(hp // ws):
        for c in range(wp // ws):
            for i in range(ws):
                for j in range(ws):
                    y, xx = r * ws + i, c * ws + j
                    got = parts[:, r * (wp // ws) + c, :, i * ws + j]
                    want = x[:, :, y * w + xx] if y < h and xx < w else torch.zeros(2, 3, 2)
                    assert torch.equal(got, want)
    for cls in (False, True):
        mask = window_key_mask(grid, ws, cls)
        valid = (parts[0, :, 0, :, 0] != 0) | (torch.arange(ws * ws) == 0)  # patch 0 is 0
        if cls:
            valid = torch.cat([torch.ones(valid.shape[0], 1, dtype=torch.bool), valid], 1)
        t = valid.shape[1]
        assert mask.shape == (valid.shape[0], 1, t, t)
        eye = torch.eye(t, dtype=torch.bool)
        # padded keys are hidden from every other query; no row is fully hidden
        assert torch.equal(torch.isneginf(mask[:, 0]), ~valid[:, None, :] & ~eye)
        assert (~torch.isneginf(mask)).any(-1).all()


def test_bad_token_count_is_named():
    engine = LookHereAttentionEngine(PRESETS['lh180'], DEPTH, 6)
    q = torch.zeros(1, 6, 20, 4)
    with pytest.raises(ValueError, match=r'window attention got 20 tokens but grid \(4, 6\)'):
        engine.window_attention(q, q, q, 0, (4, 6), 3, False)


# ----------------------------------------------------------------------------------------
# Through the backbone
# ----------------------------------------------------------------------------------------
class SlowLookHere(PositionEncoding):
    """LookHere by its slow definitions (:func:`slow_attention`: the materialised float64
    full-grid bias, windows as a mask), as the position encoding a backbone owns. Counts
    its calls, so a test can see that the backbone really ran it."""

    name = 'lookhere'

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.calls = collections.Counter()

    @property
    def lh_config(self):
        return self.config

    def forward(self, q, k, v, layer, grid_size, cls_token, dropout_p=0.0):
        self.calls['global'] += 1
        return slow_attention(q, k, v, self.config, layer, grid_size, cls_token)

    def window_attention(self, q, k, v, layer, grid_size, window_size, cls_token, dropout_p=0.0):
        self.calls['window'] += 1
        return slow_window_attention(
            q, k, v, self.config, layer, grid_size, window_size, cls_token
        )


def tiny_windowed(**kwargs) -> LookHereViT:
    args = dict(
        patch_size=4,
        embed_dims=24,
        num_layers=DEPTH,
        num_heads=6,
        preset='lh180',
        window_size=3,
        window_block_indexes=[0, 2],
        out_indices=(0, 1, 2),
        init_values=1.0,
    )
    args.update(kwargs)
    torch.manual_seed(0)
    model = LookHereViT(**args)
    model.init_weights()
    return model.double().eval()


def assert_backbone_matches_slow_reference(cls_token: bool) -> None:
    """The backbone (window blocks 0 and 2, global block 1) against the same weights whose
    one position-encoding owner is :class:`SlowLookHere`: outputs and input gradients."""
    model = tiny_windowed(with_cls_token=cls_token)
    assert [blk.window_size for blk in model.blocks] == [3, 0, 3]
    slow = copy.deepcopy(model)
    slow.pos_enc = SlowLookHere(model.lh_config)
    img = torch.randn(
        2,
        3,
        20,
        26,
        dtype=torch.float64,
        requires_grad=True,
        generator=torch.Generator().manual_seed(3),
    )  # grid 5 x 7
    outs = model(img)
    ref = slow(img)
    assert slow.pos_enc.calls == {'window': 2, 'global': 1}  # the slow definition ran
    assert isinstance(model.pos_enc.engine, LookHereAttentionEngine)
    for o, r in zip(outs, ref):
        assert o.shape == (2, 24, 5, 7)
        torch.testing.assert_close(o, r, rtol=1e-9, atol=1e-9)
    (g,) = torch.autograd.grad(sum(o.square().sum() for o in outs), img)
    (r,) = torch.autograd.grad(sum(o.square().sum() for o in ref), img)
    assert torch.isfinite(g).all()
    torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('cls_token', [False, True], ids=['nocls', 'cls'])
def test_backbone_window_blocks_match_slow_reference(cls_token):
    assert_backbone_matches_slow_reference(cls_token)


@pytest.mark.parametrize('path', ['window_attention', '__call__'], ids=['window', 'global'])
def test_slow_reference_catches_a_perturbed_fast_path(monkeypatch, path):
    """The comparison above can fail: 1e-3 added to the engine's window (or global)
    attention output makes it fail."""
    original = getattr(LookHereAttentionEngine, path)

    def perturbed(self, *args, **kwargs):
        return original(self, *args, **kwargs) + 1e-3

    monkeypatch.setattr(LookHereAttentionEngine, path, perturbed)
    with pytest.raises(AssertionError, match='not close'):
        assert_backbone_matches_slow_reference(cls_token=True)


def test_window_bias_is_cached_once_per_window_and_layer():
    model = tiny_windowed(window_block_indexes=[0, 1], with_cls_token=True).float()
    engine = model.pos_enc.engine
    with torch.no_grad():
        model(torch.randn(1, 3, 20, 26))  # grid 5 x 7
    window_keys = {k for k in engine.dense.keys() if k[1] == (3, 3)}
    assert {k[0] for k in window_keys} == {0, 1}
    cached = {k: engine.dense.get_or_create(k, None) for k in window_keys}
    with torch.no_grad():
        model(torch.randn(1, 3, 36, 16))  # another grid: 9 x 4, same window bias
    assert {k for k in engine.dense.keys() if k[1] == (3, 3)} == window_keys
    for k, tensor in cached.items():
        assert engine.dense.get_or_create(k, None) is tensor
        assert tensor.shape == (6, 10, 10)  # (heads, 1 + 3*3, 1 + 3*3): window-sized
    # the windowed layers never asked for a full-grid dense bias
    full = [k for k in engine.dense.keys() if k[0] in (0, 1) and k[1] in ((5, 7), (9, 4))]
    assert full == []


def test_both_index_namings_and_vitdet_default():
    a = LookHereViT(
        embed_dims=24,
        num_layers=8,
        num_heads=6,
        window_size=4,
        window_block_indexes=[0, 1, 2, 4, 5, 6],
    )
    b = LookHereViT(
        embed_dims=24, num_layers=8, num_heads=6, window_size=4, global_attn_indexes=[3, 7]
    )
    d = LookHereViT(
        embed_dims=24,
        num_layers=8,
        num_heads=6,
        window_size=4,
        window_block_indexes=[0, 1, 2, 4, 5, 6],
        global_attn_indexes=[3, 7],
    )
    for m in (a, b, d):
        assert [blk.window_size for blk in m.blocks] == [4, 4, 4, 0, 4, 4, 4, 0]
    # neither list: the last block of each quarter is global (ViTDet-B: 2, 5, 8, 11)
    c = LookHereViT(embed_dims=24, num_layers=12, num_heads=6, window_size=4)
    assert [i for i, blk in enumerate(c.blocks) if not blk.window_size] == [2, 5, 8, 11]


@pytest.mark.parametrize(
    'kwargs,match',
    [
        (
            dict(window_size=4, window_block_indexes=[0, 1], global_attn_indexes=[1, 2]),
            r'must partition range\(3\)',
        ),
        (dict(window_size=4, window_block_indexes=[0, 5]), r'block indexes \[5\] out of range'),
        (dict(window_size=-2), r'window_size must be >= 0'),
        (dict(global_attn_indexes=[0]), r'need window_size > 0'),
        (
            dict(window_size=4, window_block_indexes=[0, 1, 1]),
            r'window_block_indexes=\[0, 1, 1\] lists block\(s\) \[1\] more than once',
        ),
    ],
)
def test_bad_window_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LookHereViT(embed_dims=24, num_layers=3, num_heads=6, **kwargs)
