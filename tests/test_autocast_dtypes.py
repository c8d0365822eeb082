"""No silent float32 copies in the attention paths under bfloat16 autocast (issue 31 item 2).

Every attention path runs one call (and, where it has a backward, that call's backward)
under ``torch.autocast('cpu', torch.bfloat16)`` with bfloat16 ``q, k, v``, inside
:class:`~lookhere_dense.lookhere.attention.dtype_audit.DtypeAudit`, which records every
tensor the operations return. The check: no new float32 tensor larger than the path's
stated bound (:data:`BOUNDS`), and that bound is below the size of ``q``
(``B * heads * T * d``) -- so nothing of activation size is float32 -- except for the two
paths that compute in float32 on purpose (:data:`FP32_BY_DESIGN`: the ``reference``
ground truths, and PaPE's parabola features), whose bounds are stated too.

The float32 tensors each path is allowed (all bounded, see docs/mixed_precision.md):

- the log-sum-exp of PyTorch's CPU flash kernel (``B x heads x T``, always float32);
- ``tiled``: the online-softmax accumulator of one unit (a head group x ``tile_rows``
  query rows: ``g x tile_rows x W x d``) and the prefix keys' partial on a float32 copy of
  the unit's queries (same size), its key / value gradient strips in training
  (``g x N x d`` per worker thread);
- ``flex``: not audited (see :func:`test_flex_cannot_be_audited_on_cpu`);
- ``fused``: the bias tables in float32 (``depth x heads x (2H-1) x (2W-1)``), cached;
- RoPE: the rotation angles (``heads x N x d/2``) before their cos / sin are cast;
  DINOv3 RoPE its ``(N, 2d)`` sin / cos table;
- PaPE (by design): the parabola features ``B x heads x N x (2P+1)``, cast to bfloat16
  before they join ``q, k``.

Sizes are tiny (bfloat16 matmuls are emulated on AVX2 CPUs). The grid has two row blocks
of the tiled plan (16 x 8 patches), so its per-unit bound is below one image's size.
"""

from __future__ import annotations

import os
from typing import Callable

import pytest
import torch

from lookhere_dense.lookhere import create_model
from lookhere_dense.lookhere.attention.dtype_audit import DtypeAudit
from lookhere_dense.lookhere.attention.fused import fused_available
from lookhere_dense.lookhere.attention.tiled import TileOptions, get_plan

pytestmark = pytest.mark.usefixtures('one_torch_thread')  # tiled runs on this thread

requires_fused = pytest.mark.skipif(
    not fused_available() and not os.environ.get('LOOKHERE_REQUIRE_FUSED'),
    reason='the fused CPU kernel is not built here',
)

#: 2 blocks, 12 heads of 8 channels (LookHere layouts need 12 or 16 heads)
ARCH = dict(embed_dims=96, num_layers=2, num_heads=12, patch_size=8, init_values=None)
B, HEADS, D = 2, 12, 8
GRID = (16, 8)
N = GRID[0] * GRID[1]
#: one CLS token
T = N + 1
Q_NUMEL = B * HEADS * T * D
#: the flash kernel's log-sum-exp
LSE = B * HEADS * T
#: its log-sum-exp over a batch of windows (CLS in each window): 5 x 5 windows on the
#: 16 x 8 grid (padded to 20 x 10) are 4 x 2 windows of 26 tokens (4 x 4: 17 tokens)
WINDOW_LSE = B * 8 * HEADS * 26
#: paths that compute in float32 on purpose (their bounds exceed ``q``'s size)
FP32_BY_DESIGN = ('reference', 'causal reference', 'pape')


def tiled_bounds() -> tuple:
    """``(forward, training)`` float32 bounds of ``tiled`` on :data:`GRID` (lh180): one
    unit's accumulator; in training also the key / value gradient strips of the
    largest head group."""
    model = create_model(preset='lh180', attn_backend='tiled', **ARCH)
    gb = model.lookhere.grid_bias(GRID, torch.device('cpu'), torch.bfloat16)
    plan = get_plan(gb, 0, TileOptions())
    g = max(len(group.heads) for group in plan.groups)
    unit = g * min(plan.tile_rows, GRID[0]) * GRID[1] * D
    return max(LSE, unit), max(LSE, unit, g * N * D)


def rope_bound() -> int:
    return max(WINDOW_LSE, HEADS * N * D // 2)


#: the largest float32 tensor each path may make (elements), forward and training
BOUNDS = {
    'sdpa': (LSE, LSE),
    'chunked': (LSE, LSE),
    'tiled': tiled_bounds(),
    'tiled jumbo': tuple(max(b, B * HEADS * (N + 3)) for b in tiled_bounds()),
    'fused': (max(LSE, 2 * HEADS * 31 * 15),) * 2,
    'window': (WINDOW_LSE, WINDOW_LSE),
    'window padded': (WINDOW_LSE, WINDOW_LSE),
    'causal sdpa': (WINDOW_LSE, WINDOW_LSE),
    'causal chunked': (WINDOW_LSE, WINDOW_LSE),
    'rope2d': (rope_bound(),) * 2,
    'rope2d_mixed': (rope_bound(),) * 2,
    'rope_dinov3': (max(WINDOW_LSE, N * 2 * D),) * 2,
    'abs': (WINDOW_LSE, WINDOW_LSE),
    'none': (WINDOW_LSE, WINDOW_LSE),
    'alibi2d': (LSE, LSE),
    # float32 by design: the whole computation / the parabola features (P = 50)
    'reference': (B * HEADS * T * T,) * 2,
    'causal reference': (B * HEADS * T * T,) * 2,
    'pape': (B * HEADS * N * 101,) * 2,
}


def qkv(train: bool, tokens: int = T) -> tuple:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(3):
        t = torch.randn(B, HEADS, tokens, D, generator=g).bfloat16()
        out.append(t.requires_grad_(train))
    return tuple(out)


def audit(fn: Callable, train: bool, tokens: int = T) -> tuple:
    """``fn(q, k, v)`` (and its backward when ``train``) under bfloat16 autocast and a
    :class:`DtypeAudit`: ``(out, audit)``."""
    q, k, v = qkv(train, tokens)
    with torch.autocast('cpu', torch.bfloat16), torch.set_grad_enabled(train):
        with DtypeAudit() as rec:
            out = fn(q, k, v)
            if train:
                out.backward(torch.ones_like(out))
    return out, rec


def check(name: str, out: torch.Tensor, rec: DtypeAudit, train: bool) -> None:
    bound = BOUNDS[name][1 if train else 0]
    if name not in FP32_BY_DESIGN:
        assert bound < Q_NUMEL, f'{name}: the stated bound {bound} is not below q ({Q_NUMEL})'
    assert out.dtype == torch.bfloat16, f'{name}: output {out.dtype}'
    big = rec.allocations(torch.float32, min_numel=bound + 1)
    assert not big, (
        f'{name} ({"training" if train else "forward"}): float32 tensors above the bound '
        f'of {bound} elements (q has {Q_NUMEL}):\n' + rec.summary(torch.float32, bound + 1)
    )
    # the bound is met, not just loose: a path's largest float32 tensor is named here
    assert rec.largest(torch.float32) <= bound


def lookhere_call(backend: str, cls: int = 1, window: int = 0, pos_encoding: str = 'lookhere'):
    preset = {'preset': 'lh180'} if pos_encoding == 'lookhere' else {}
    model = create_model(attn_backend=backend, pos_encoding=pos_encoding, **preset, **ARCH)
    pe = model.pos_enc
    if window:
        return lambda q, k, v: pe.window_attention(q, k, v, 0, GRID, window, cls, 0.0)
    return lambda q, k, v: pe(q, k, v, 0, GRID, cls, 0.0)


CASES = {
    'reference': lambda: lookhere_call('reference'),
    'sdpa': lambda: lookhere_call('sdpa'),
    'chunked': lambda: lookhere_call('chunked'),
    'tiled': lambda: lookhere_call('tiled'),
    'window': lambda: lookhere_call('sdpa', window=4),
    'window padded': lambda: lookhere_call('sdpa', window=5),
    'alibi2d': lambda: lookhere_call('auto', pos_encoding='alibi2d'),
}


@pytest.mark.parametrize('train', [False, True], ids=['forward', 'training'])
@pytest.mark.parametrize('name', sorted(CASES))
def test_lookhere_paths_make_no_float32_frame(name: str, train: bool):
    out, rec = audit(CASES[name](), train)
    check(name, out, rec, train)


@pytest.mark.parametrize('train', [False, True], ids=['forward', 'training'])
def test_tiled_with_jumbo_prefix_tokens(train: bool):
    """``J = 3`` global prefix tokens: their keys' partial and its gradient go through the
    flash kernel per unit (no float32 copy of the queries)."""
    out, rec = audit(lookhere_call('tiled', cls=3), train, tokens=N + 3)
    check('tiled jumbo', out, rec, train)


@requires_fused
@pytest.mark.parametrize('train', [False, True], ids=['forward', 'training'])
def test_fused(train: bool):
    out, rec = audit(lookhere_call('fused'), train)
    check('fused', out, rec, train)


def test_flex_cannot_be_audited_on_cpu():
    """Not audited: ``flex_attention`` is a higher-order operator the recorder has no rule
    for, and with one (``supports_higher_order_operators``) PyTorch's eager CPU flex wraps
    itself in ``torch.compile(fullgraph=True)``, which refuses a Python dispatch mode
    (``non-infra torch dispatch mode present``; tried). This test notices when that changes, so
    that ``flex`` can join the audited paths; its bf16 accuracy is checked in
    ``tests/test_bf16_accuracy.py``."""
    with pytest.raises(RuntimeError, match='flex_attention'):
        audit(lookhere_call('flex'), train=False)


@pytest.mark.parametrize('train', [False, True], ids=['forward', 'training'])
@pytest.mark.parametrize('backend', ['sdpa', 'chunked', 'reference'])
def test_causal_ledit_paths(backend: str, train: bool):
    """LEDiT's causal attention (``pos_encoding='ledit'``), global and windowed."""
    out, rec = audit(lookhere_call(backend, pos_encoding='ledit'), train)
    check(f'causal {backend}', out, rec, train)
    if backend != 'reference':
        out, rec = audit(lookhere_call(backend, window=5, pos_encoding='ledit'), train)
        check(f'causal {backend}', out, rec, train)


@pytest.mark.parametrize('train', [False, True], ids=['forward', 'training'])
@pytest.mark.parametrize('pos_encoding', ['rope2d', 'rope2d_mixed', 'rope_dinov3', 'abs', 'none'])
def test_other_encodings(pos_encoding: str, train: bool):
    """The encodings with their own attention path (rotations, no bias), global and
    windowed."""
    for window in (0, 4, 5):  # global; 4 x 4 windows; 5 x 5, padded
        out, rec = audit(lookhere_call('auto', window=window, pos_encoding=pos_encoding), train)
        check(pos_encoding, out, rec, train)


@pytest.mark.parametrize('train', [False, True], ids=['forward', 'training'])
def test_pape(train: bool):
    """PaPE: the parabola features are computed in float32 on purpose (the expanded
    square loses digits in bfloat16), then cast; nothing larger is float32, and
    ``q, k, v`` are never copied to float32 (no float32 tensor of their shape)."""
    model = create_model(pos_encoding='pape', **ARCH)
    tokens = torch.randn(B, T, ARCH['embed_dims'], generator=torch.Generator().manual_seed(3))

    def fn(q, k, v):
        return model.pos_enc(q, k, v, 0, GRID, 1, 0.0, tokens=tokens)

    out, rec = audit(fn, train)
    check('pape', out, rec, train)
    copies = [
        r
        for r in rec.allocations(torch.float32)
        if len(r.shape) == 4 and r.shape[:3] == (B, HEADS, T)
    ]
    assert not copies, 'pape: float32 copies of q/k/v:\n' + '\n'.join(map(str, copies))


def test_audit_sees_an_upcast():
    """The recorder itself: a float32 copy of ``q`` under autocast is seen, as a new
    tensor; a view of it is not counted as another."""
    q = torch.randn(B, HEADS, T, D).bfloat16()
    with torch.autocast('cpu', torch.bfloat16), DtypeAudit() as rec:
        f = q.float()
        f.view(-1)
        f.add_(1)
    new = rec.allocations(torch.float32)
    assert [r.op for r in new] == ['aten._to_copy.default'] and new[0].numel == Q_NUMEL
    assert len(rec.records) == 3


#: the attention output's relative error (against float64) that rounding the bias to
#: bfloat16 may add under ``bias_rounding='none'`` (measured 0.00019 / 0.00045 / 0.00014
#: on layers 0 / 6 / 11, over a floor of 0.002 that bfloat16 outputs have anyway)
MAX_BIAS_ROUNDING_EXCESS = 0.001


def test_bias_in_the_compute_dtype():
    """Why the bias tables are bfloat16 under bfloat16 autocast (every path but
    ``fused``, whose kernel reads them in float32): with ``bias_rounding='bfloat16'``
    (the default, the official code's) every table entry is a bfloat16 number, so the
    bfloat16 table is exact; with ``'none'`` rounding the bias costs a little accuracy on
    the attention output, stated here. One ViT-B LookHere layout (12 layers x 12 heads,
    lh180), 16 x 16 grid + CLS, bfloat16 ``q, k, v``, the CPU flash kernel with the bias
    as a bfloat16 or a float32 mask, against float64 attention with the exact bias."""
    from lookhere_dense.lookhere.attention.common import FLASH

    grid, t, d = (16, 16), 257, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 12, t, d, generator=g).bfloat16() for _ in range(3))
    for rounding in ('bfloat16', 'none'):
        model = create_model(
            embed_dims=12 * d, num_layers=12, num_heads=12, lh_config=dict(bias_rounding=rounding)
        )
        exact = model.lookhere.grid_bias(grid, torch.device('cpu'), torch.float64)
        if rounding == 'bfloat16':
            assert torch.equal(exact.table.bfloat16().double(), exact.table)
            continue
        excess = []
        for layer in (0, 6, 11):
            bias = exact.dense(layer, 1)
            logits = (q.double() * d**-0.5) @ k.double().transpose(-1, -2) + bias
            ref = logits.softmax(-1) @ v.double()

            def error(mask: torch.Tensor, ref: torch.Tensor) -> float:
                out = FLASH(q, k, v, attn_mask=mask[None])[0].double()
                return float((out - ref).norm() / ref.norm())

            excess.append(error(bias.bfloat16(), ref) - error(bias.float(), ref))
        print(f'bias_rounding=none: bf16 bias adds {excess} relative error (layers 0, 6, 11)')
        assert max(excess) <= MAX_BIAS_ROUNDING_EXCESS


@pytest.mark.parametrize('backend', ['sdpa', 'chunked', 'window'])
def test_learnable_slopes_while_training(backend: str):
    """Learnable slopes that train: the bias needs a gradient, which PyTorch's CPU flash
    kernel does not give (SDPA would take its math kernel: float32 copies of q, k, v and
    ``B*h*T^2`` float32 scores). ``biased_sdpa`` keeps the flash kernel and computes the
    bias gradient per head in blocks of ``d`` query rows (float32 temporaries of one head's
    keys / values and one block's scores: below the log-sum-exp bound here)."""
    model = create_model(
        preset='lh180',
        attn_backend='sdpa' if backend == 'window' else backend,
        lh_config=dict(learnable_slopes=True),
        **ARCH,
    )
    pe = model.pos_enc
    if backend == 'window':
        out, rec = audit(lambda q, k, v: pe.window_attention(q, k, v, 0, GRID, 4, 1, 0.0), True)
    else:
        out, rec = audit(lambda q, k, v: pe(q, k, v, 0, GRID, 1, 0.0), train=True)
    check(backend, out, rec, True)
    # the slopes did get their gradient (layer 0's and the shared ones)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in pe.slopes.parameters())


@requires_fused
def test_learnable_slopes_while_training_fused():
    """The fused kernel gives the table its gradient itself (per sample, summed over the
    batch): training learnable slopes stays in bf16 there, as sdpa / chunked above."""
    model = create_model(
        preset='lh180', attn_backend='fused', lh_config=dict(learnable_slopes=True), **ARCH
    )
    pe = model.pos_enc
    out, rec = audit(lambda q, k, v: pe(q, k, v, 0, GRID, 1, 0.0), train=True)
    assert pe.engine.last_backend == 'fused'
    check('fused', out, rec, True)


@pytest.mark.parametrize('backend', ['sdpa', 'chunked'])
def test_learnable_slopes_in_inference(backend: str):
    """Learnable slopes outside training: the bias needs no gradient, the flash kernel
    runs as with fixed slopes."""
    model = create_model(
        preset='lh180', attn_backend=backend, lh_config=dict(learnable_slopes=True), **ARCH
    )
    pe = model.pos_enc
    out, rec = audit(lambda q, k, v: pe(q, k, v, 0, GRID, 1, 0.0), train=False)
    check(backend, out, rec, False)
