"""One conformance suite for every registered attention backend.

Parametrised over :data:`~lookhere_dense.lookhere.attention.chooser.REGISTRY` (every
backend but ``reference``, the ground truth) and asked through each backend's own
``can_run`` (a backend that cannot run a case, e.g. ``fused`` without a compiler or
``flex`` training on CPU, is skipped with its reason): forward and gradients against
:func:`reference_attention` with the grid's dense bias, for square, rectangular and 1xN /
Nx1 grids, no prefix / CLS / three Jumbo tokens, every preset, every direction type
alone and the configurations that stress the tables (per-key ``center`` term,
``fill_with``, per-layer head strings), float32 / float64 / bfloat16 / float16, batch > 1
and non-contiguous ``q, k, v`` (views of one ``qkv`` projection), and a tiny LookHere ViT
forward and backward. Then the two paths outside the registry: ViTDet windows (the
engine's ``window_attention``) and LEDiT's causal attention (:mod:`.attention.causal`),
each against its own reference. Last, the suite can fail: a backend whose output is off
by 1e-3 fails its forward case, one per backend.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_tiled import TYPES  # every direction type

from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine, create_model
from lookhere_dense.lookhere.attention import (
    AUTO_ORDER,
    REGISTRY,
    AttentionRequest,
    backend_summary,
    causal,
    explain_backend,
    reference_attention,
)
from lookhere_dense.lookhere.attention import fused as fused_module

HEADS = 12
DEPTH = 2
CPU = torch.device('cpu')
BACKENDS = sorted(name for name in REGISTRY if name != 'reference')
CONFIGS = {
    **PRESETS,
    'center': replace(PRESETS['lh180'], head_directions='corners-center'),
    'fill_max': replace(
        PRESETS['lh180'], head_directions='triangles-none', fill_with='max', distance='sqrt'
    ),
    'per_layer': replace(PRESETS['lh180'], head_directions=('halves-none', 'eighths1-none')),
    'zero_mix': replace(PRESETS['lh180'], head_directions='zerohalves-none1zero3'),
}
CONFIGS.update({f'type_{t}': replace(PRESETS['lh180'], head_directions=t) for t in TYPES})
#: (config, grid, prefix tokens): every config on one grid, then the grids and prefixes
CASES = [(name, (3, 5), 1) for name in CONFIGS] + [
    ('lh90', (4, 4), 0),
    ('lh90', (1, 7), 1),
    ('lh45', (6, 1), 3),
    ('center', (5, 4), 3),
    ('per_layer', (2, 9), 0),
]
ATOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.bfloat16: 6e-2, torch.float16: 1e-2}

pytestmark = pytest.mark.usefixtures('one_torch_thread')  # tiny tensors: see conftest


def case_id(case) -> str:
    name, grid, prefix = case
    return f'{name}-{grid[0]}x{grid[1]}-J{prefix}'


def qkv(grid, prefix, batch=2, dim=8, dtype=torch.float32, grad=False, seed=0):
    """Random ``q, k, v`` ``(batch, heads, J + H*W, dim)``, scaled for peaky softmaxes (so
    that the bias matters)."""
    gen = torch.Generator().manual_seed(seed)
    t = grid[0] * grid[1] + prefix
    return [
        (2 * torch.randn(batch, HEADS, t, dim, generator=gen, dtype=torch.float64))
        .to(dtype)
        .requires_grad_(grad)
        for _ in range(3)
    ]


def skip_unless_runs(backend, tokens, dtype=torch.float32, training=False):
    """Skip with the backend's own reason when its ``can_run`` refuses the case."""
    request = AttentionRequest(tokens, CPU, dtype, training=training, auto=False)
    reason = REGISTRY[backend].can_run(request)
    if reason is not None:
        pytest.skip(f'{backend}: {reason}')


def reference(eng, q, k, v, layer, grid, prefix):
    """The ground truth: the dense bias of the grid and a plain float32/64 softmax."""
    bias = eng.grid_bias(grid, CPU, torch.float64).dense(layer, prefix)
    return reference_attention(q, k, v, bias)


def test_every_backend_has_the_interface_and_auto_asks_them_in_order():
    for name, module in REGISTRY.items():
        assert module.NAME == name and callable(module.can_run) and callable(module.attend)
    assert set(AUTO_ORDER) <= set(REGISTRY) and AUTO_ORDER[-1] == 'chunked'
    anything = AttentionRequest(10**6, torch.device('cuda'), dropout_p=0.1, slope_grads=True)
    assert REGISTRY['chunked'].can_run(anything) is None  # the last resort runs anything


def explain_model():
    from lookhere_dense.lookhere import create_model

    return create_model(
        embed_dims=48,
        num_layers=4,
        num_heads=12,
        preset='lh90',
        window_size=7,
        window_block_indexes=[0, 2],
    ).eval()


def test_explain_backend_names_each_layer_and_why_the_faster_ones_were_skipped():
    model = explain_model()
    lines = explain_backend(model, 224, print_fn=None)
    assert lines[0].startswith('attention backends at 224x224 (grid 14x14, 197 tokens,')
    # an image batch where the size goes: its size (a bare torch error before)
    assert explain_backend(model, torch.zeros(1, 3, 224, 224), print_fn=None) == lines
    assert explain_backend(model, np.array([224, 224]), print_fn=None) == lines
    with pytest.raises(ValueError, match=r'image_size must be H or \(H, W\) .*got \(224, 0\)'):
        explain_backend(model, (224, 0), print_fn=None)
    assert ', float32, cpu, inference' in lines[0]
    with torch.autocast('cpu', dtype=torch.bfloat16):  # the dtype the model computes in
        assert ', bfloat16, cpu, inference' in explain_backend(model, 224, print_fn=None)[0]
    assert (
        lines[1] == 'layer 0 (window 7): windows (sdpa per window, the dense bias of one window)'
    )
    assert lines[2] == (
        'layer 1: sdpa (skipped fused: 197 tokens < FUSED_MIN_TOKENS (400); '
        'tiled: 197 tokens < TILED_MIN_TOKENS (1024))'
    )
    model.blocks[3].attn.attn_drop = 0.1  # training with attention dropout: chunked
    engine = model.pos_enc.engine
    engine.max_dense_bytes = 0
    lines = explain_backend(model, 512, training=True, print_fn=None)
    assert lines[4].startswith('layer 3: chunked (skipped fused: has no attention dropout;')
    # nothing skipped: the first of the order, or the config's fixed backend, says so
    assert lines[2] == "layer 1: fused (the first of auto's order that runs here)", lines[2]
    assert engine.choose_backend(1025, CPU, dropout_p=0.1, training=True) == 'chunked'
    assert backend_summary(model, 512, training=True).startswith(
        'LookHere attention at 512x512 (grid 32x32, 1025 tokens, batch 1, float32, cpu, '
        'training): windows x 2, '
    )
    assert backend_summary(model, 512, training=True, batch=4).startswith(
        'LookHere attention at 512x512 (grid 32x32, 1025 tokens, batch 4, float32, cpu, '
    )
    assert backend_summary(model, 512, training=True, batch=None).startswith(
        'LookHere attention at 512x512 (grid 32x32, 1025 tokens, float32, cpu, training)'
    )
    # another position encoding is not called LookHere attention (it was, for rope2d / none)
    from lookhere_dense.lookhere import create_model as _create

    rope = _create(embed_dims=48, num_layers=2, num_heads=12, pos_encoding='rope2d')
    assert backend_summary(rope, 64).startswith(
        'attention (pos_encoding rope2d) at 64x64 (grid 4x4, 17 tokens, batch 1, float32, '
        'cpu, training): sdpa x 2'
    ), backend_summary(rope, 64)
    if fused_module.fused_available():  # in bfloat16 the line names the fused kernel's products
        line = backend_summary(model, 512, training=True, dtype=torch.bfloat16)
        products = fused_module.bf16_products()
        says = '(lookhere_dense.lookhere.explain_backend(model, size) says why)'
        assert f'(bf16 products: {products}) {says}' in line, line
        assert 'bf16 products' not in backend_summary(model, 512, training=True)


def test_explain_backend_says_when_the_configured_backend_cannot_run_here():
    """A fixed ``attn_backend`` that cannot run (triton on a CPU) was explained as if it
    ran; the forward then refused it."""
    model = create_model(embed_dims=24, num_layers=1, num_heads=6, attn_backend='triton')
    line = explain_backend(model.eval(), 128, print_fn=None)[1]
    assert line.startswith("layer 0: triton (attn_backend='triton', which cannot run here: "), line
    assert 'CUDA' in line, line
    fine = create_model(embed_dims=24, num_layers=1, num_heads=6, attn_backend='chunked')
    assert explain_backend(fine.eval(), 128, print_fn=None)[1] == (
        "layer 0: chunked (attn_backend='chunked')"
    )


def test_auto_passes_over_a_backend_that_failed_in_this_model():
    """The engine records a FALLIBLE backend that raised when ``auto`` chose it; the
    chooser passes over it from then on (one place, not each backend's ``can_run``)."""
    from lookhere_dense.lookhere.attention import chooser

    request = AttentionRequest(2048, CPU, torch.float32)
    first = chooser.choose(request)
    steps = chooser.explain(replace(request, failed=(first,)))
    assert steps[0] == (first, chooser.FAILED) and steps[-1][0] != first


def test_a_retired_backend_name_runs_its_successor_with_a_warning():
    """``attn_backend='buffered'`` (removed: it won nowhere against tiled / fused) in an
    old config or checkpoint still builds; the engine says what runs instead."""
    with pytest.warns(UserWarning, match="'buffered' was removed; 'tiled' runs in its place"):
        engine = LookHereAttentionEngine(PRESETS['lh90'], DEPTH, HEADS, backend='buffered')
    assert engine.backend == 'tiled' and 'buffered' not in REGISTRY
    with pytest.raises(ValueError, match="unknown LookHere attention backend 'bufferd'"):
        LookHereAttentionEngine(PRESETS['lh90'], DEPTH, HEADS, backend='bufferd')


@pytest.mark.parametrize(
    'pos_encoding,inside',
    [
        ('ledit', "sdpa per window, causal in the window's raster order; pos_encoding ledit"),
        ('rope2d', 'sdpa per window; pos_encoding rope2d: no LookHere bias'),
    ],
)
def test_explain_backend_says_what_runs_inside_the_windows(pos_encoding, inside):
    model = create_model(
        embed_dims=24,
        num_layers=2,
        num_heads=2,
        pos_encoding=pos_encoding,
        window_size=4,
        window_block_indexes=[0],
    ).eval()
    lines = explain_backend(model, 128, print_fn=None)
    assert lines[1] == f'layer 0 (window 4): windows ({inside})'
    assert not lines[2].startswith('layer 1 (window')


@pytest.mark.usefixtures('without_fused')
def test_explain_backend_gives_the_kernels_reason_where_it_is_not_built(monkeypatch):
    monkeypatch.setattr(fused_module, 'fused_unavailable_reason', lambda: 'no compiler (test)')
    lines = explain_backend(explain_model(), 512, print_fn=None)
    assert lines[2] == 'layer 1: tiled (skipped fused: no compiler (test))'


# ----------------------------------------------------------------------------------------
# Forward and gradients against the reference
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('case', CASES, ids=case_id)
@pytest.mark.parametrize('backend', BACKENDS)
def test_forward_matches_reference(backend, case):
    check_forward(backend, case)


def check_forward(backend, case, dtype=torch.float32):
    name, grid, prefix = case
    q, k, v = qkv(grid, prefix, dtype=dtype)
    skip_unless_runs(backend, q.shape[-2], dtype)
    eng = LookHereAttentionEngine(CONFIGS[name], DEPTH, HEADS, block_size=4)
    for layer in range(DEPTH):
        out = eng(q, k, v, layer, grid, prefix, backend=backend)
        assert eng.last_backend == backend and out.dtype == dtype and torch.isfinite(out).all()
        ref = reference(eng, q, k, v, layer, grid, prefix)
        torch.testing.assert_close(out, ref, atol=ATOL[dtype], rtol=0)


@pytest.mark.parametrize('case', CASES[:3] + CASES[-5:], ids=case_id)
@pytest.mark.parametrize('backend', BACKENDS)
def test_gradients_match_reference_float64(backend, case):
    name, grid, prefix = case
    q, k, v = qkv(grid, prefix, dtype=torch.float64, grad=True)
    skip_unless_runs(backend, q.shape[-2], torch.float64, training=True)
    eng = LookHereAttentionEngine(CONFIGS[name], DEPTH, HEADS, block_size=4)
    weight = torch.randn(q.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = eng(q, k, v, 1, grid, prefix, backend=backend)
    want = reference(eng, q, k, v, 1, grid, prefix)
    for a, b in zip(
        (got,) + torch.autograd.grad((got * weight).sum(), (q, k, v)),
        (want,) + torch.autograd.grad((want * weight).sum(), (q, k, v)),
    ):
        torch.testing.assert_close(a, b, atol=ATOL[torch.float64], rtol=0)


@pytest.mark.parametrize('name', ['lh90', 'center', 'fill_max'])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('backend', BACKENDS)
def test_low_precision_forward_matches_reference_without_nan(backend, dtype, name):
    check_forward(backend, (name, (4, 5), 1), dtype)


@pytest.mark.parametrize('backend', BACKENDS)
def test_views_of_one_qkv_projection_batch_three(backend):
    """``q, k, v`` as the model makes them: non-contiguous views of one ``(B, T, 3, heads,
    d)`` projection, batch 3; forward and (where the backend trains) gradients."""
    grid, prefix, batch, dim = (4, 6), 3, 3, 8
    t = grid[0] * grid[1] + prefix
    training = REGISTRY[backend].can_run(AttentionRequest(t, CPU, training=True, auto=False))
    skip_unless_runs(backend, t)
    gen = torch.Generator().manual_seed(2)
    x = (2 * torch.randn(batch, t, 3, HEADS, dim, generator=gen)).requires_grad_(training is None)
    q, k, v = x.permute(2, 0, 3, 1, 4).unbind(0)
    assert not q.is_contiguous()
    eng = LookHereAttentionEngine(PRESETS['lh45'], DEPTH, HEADS, block_size=5)
    out = eng(q, k, v, 0, grid, prefix, backend=backend)
    ref = reference(eng, q, k, v, 0, grid, prefix)
    torch.testing.assert_close(out, ref, atol=ATOL[torch.float32], rtol=0)
    if training is None:
        (g,) = torch.autograd.grad(out.square().sum(), x)
        (g_ref,) = torch.autograd.grad(ref.square().sum(), x)
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize('preset', ['lh180', 'lh45'])
@pytest.mark.parametrize('backend', BACKENDS)
def test_backbone_forward_and_backward_equal_reference(backend, preset):
    """The torch-only LookHere ViT (train mode) through ``backend`` equals the same model
    through ``reference``: every output map and every parameter's gradient."""
    from lookhere_dense.lookhere import create_model

    skip_unless_runs(backend, 5 * 7 + 1, training=True)
    torch.manual_seed(0)
    model = create_model(
        embed_dims=48, num_layers=3, num_heads=12, preset=preset, init_values=1.0
    ).train()
    x = torch.randn(2, 3, 80, 112)  # grid 5 x 7 + CLS
    results = {}
    for name in ('reference', backend):
        model.pos_enc.engine.backend = name
        model.zero_grad()
        outs = model(x)
        sum(o.square().mean() for o in outs).backward()
        assert model.pos_enc.engine.last_backend == name
        results[name] = ([o.detach() for o in outs], [p.grad.clone() for p in model.parameters()])
    for a, b in zip(results[backend][0], results['reference'][0]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    for a, b in zip(results[backend][1], results['reference'][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------------------
# ViTDet windows (the engine's window_attention)
# ----------------------------------------------------------------------------------------
def window_reference(eng, q, k, v, layer, grid, ws, prefix):
    """Full attention whose bias is the ``(ws, ws)`` grid's bias inside each window and
    blocked across windows (padded border windows: their real patches only); the prefix
    tokens see and are seen by every token with bias 0."""
    wb = eng.grid_bias((ws, ws), CPU, torch.float64).dense(layer)
    n = grid[0] * grid[1]
    bias = torch.full((HEADS, n, n), -math.inf, dtype=torch.float64)
    cells = [divmod(i, grid[1]) for i in range(n)]
    for i, (yi, xi) in enumerate(cells):
        for j, (yj, xj) in enumerate(cells):
            if (yi // ws, xi // ws) == (yj // ws, xj // ws):
                bias[:, i, j] = wb[:, (yi % ws) * ws + xi % ws, (yj % ws) * ws + xj % ws]
    bias = torch.nn.functional.pad(bias, (prefix, 0, prefix, 0))
    return reference_attention(q, k, v, bias)


@pytest.mark.parametrize(
    'grid,ws,prefix,dtype',
    [
        ((6, 6), 3, 1, torch.float64),
        ((5, 7), 3, 0, torch.float64),
        ((4, 5), 4, 3, torch.float64),
        ((1, 7), 2, 1, torch.float64),
        ((5, 7), 3, 1, torch.bfloat16),
    ],
)
def test_windows_match_reference(grid, ws, prefix, dtype):
    eng = LookHereAttentionEngine(PRESETS['lh45'], DEPTH, HEADS)
    q, k, v = qkv(grid, prefix, batch=2, dtype=dtype, grad=dtype == torch.float64)
    out = eng.window_attention(q, k, v, 1, grid, ws, prefix)
    ref = window_reference(eng, q, k, v, 1, grid, ws, prefix)
    torch.testing.assert_close(out, ref, atol=ATOL[dtype], rtol=0)
    if dtype == torch.float64:
        g = torch.autograd.grad(out.sum(), (q, k, v))
        g_ref = torch.autograd.grad(ref.sum(), (q, k, v))
        for a, b in zip(g, g_ref):
            torch.testing.assert_close(a, b, atol=ATOL[dtype], rtol=0)


# ----------------------------------------------------------------------------------------
# LEDiT's causal attention
# ----------------------------------------------------------------------------------------
CAUSAL = [b for b in causal.CAUSAL_BACKENDS if b not in ('auto', 'reference')]


@pytest.mark.parametrize(
    'grid,prefix,global_prefix',
    [((4, 4), 0, True), ((3, 5), 1, True), ((1, 7), 3, False), ((6, 1), 3, True)],
)
@pytest.mark.parametrize('backend', CAUSAL)
def test_causal_matches_reference(backend, grid, prefix, global_prefix):
    tokens = grid[0] * grid[1] + prefix
    request = causal.CausalRequest(
        tokens, CPU, torch.float64, training=True, auto=False, variant=backend
    )
    trains = causal.can_run(request) is None
    if causal.can_run(replace(request, training=False)) is not None:
        pytest.skip(causal.can_run(replace(request, training=False)))
    q, k, v = qkv(grid, prefix, dtype=torch.float64, grad=trains)
    args = (prefix, global_prefix)
    kw = dict(block_size=5) if backend == 'chunked' else {}
    out = causal.causal_attention(q, k, v, *args, backend=backend, **kw)
    ref = causal.causal_reference(q, k, v, *args)
    torch.testing.assert_close(out, ref, atol=ATOL[torch.float64], rtol=0)
    if trains:
        for a, b in zip(
            torch.autograd.grad(out.sum(), (q, k, v)), torch.autograd.grad(ref.sum(), (q, k, v))
        ):
            torch.testing.assert_close(a, b, atol=ATOL[torch.float64], rtol=0)


# ----------------------------------------------------------------------------------------
# The suite can fail
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_backend_off_by_a_little_fails_the_suite(backend, monkeypatch):
    """Every backend's output shifted by 1e-3 (its ``attend`` wrapped) fails the forward
    case the suite runs for it (mutations inside the backends: see the commit that added
    this file)."""
    case = ('lh90', (3, 5), 1)
    check_forward(backend, case)  # passes as it is
    module = REGISTRY[backend]
    attend = module.attend
    monkeypatch.setattr(module, 'attend', lambda call: attend(call) + 1e-3)
    with pytest.raises(AssertionError, match='Tensor-likes are not close'):
        check_forward(backend, case)


def test_explain_backend_finds_the_trunk_in_timm_and_mmseg_wrappers():
    """A timm ``features_only`` model (the trunk in ``.model``) and mmseg's
    ``TIMMBackbone`` around one (``.timm_model.model``) were refused: 'has no LookHere ViT'
    (a new-user trial)."""
    import timm
    from mmseg.models.backbones import TIMMBackbone

    import lookhere_dense  # noqa: F401 - registers the timm models

    name = 'lookhere_vit_tiny_patch16_224'
    plain = timm.create_model(name, depth=2).eval()
    want = explain_backend(plain, 64, print_fn=None)
    feats = timm.create_model(name, depth=2, features_only=True, out_indices=(1,)).eval()
    assert explain_backend(feats, 64, print_fn=None) == want
    wrapped = TIMMBackbone(name, pretrained=False, features_only=True, out_indices=(1,), depth=2)
    assert explain_backend(wrapped.eval(), 64, print_fn=None) == want
