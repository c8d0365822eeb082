"""The ``fused`` kernel's reduced-precision path: bfloat16 / float16 ``q, k, v`` are read
as they are; scores, bias, softmax and accumulators are float32, the output and the
gradients come back in the input dtype. The products are either the float32 FMA kernels
(``q, k, v`` converted as they are packed; every CPU, and float16 always) or, for bfloat16
where the CPU has AVX512-BF16, the native bfloat16 products (VDPBF16PS: bfloat16 operands,
float32 sums; ``P`` and ``dS`` rounded to bfloat16 as operands).

Tolerances (stated here, used below). The reference is :func:`reference_attention` in
float64 on the *same* rounded inputs (upcast exactly), so only the kernel's own error is
measured: the float32 arithmetic (~1e-6 relative) and one rounding of each result to the
input dtype (half an ulp: 2**-9 relative for bfloat16, 2**-12 for float16). Hence

- forward, patch queries (the kernel), float32 products: ``|out - ref| <= ULP * |ref| +
  1e-3`` per element with ``ULP`` 2**-8 for bfloat16 and 2**-11 for float16 (one ulp; the
  absolute term covers values near 0);
- forward, native bfloat16 products: in addition each probability is rounded to bfloat16
  before ``P V`` (relative error <= 2**-9 each, while the row sum uses the unrounded
  ``P``), so the error grows by at most ``2**-9 * (P |V|)``: the bound is ``ULP * |ref| +
  ULP * (P |V|) + 1e-3`` (twice the theory in the new term);
- the prefix queries (CLS) are PyTorch's flash kernel in the input dtype, which rounds its
  probabilities: ``|out - ref| <= 2e-2``;
- gradients, either product kind: ``max |g - ref| <= 2**-7 * max |ref|`` per tensor (the
  prefix tokens' share of ``dk, dv`` is added in the input dtype: two roundings; the
  native products also round ``dS``; measured at most 0.72 of the bound over the cases
  below);
- float32 products against the same kernel fed float32, result rounded: patch queries bit
  for bit (the same float32 arithmetic, rounded once, to nearest even); gradients within
  2**-7 of the largest.

The native tests are skipped where this machine has no AVX512-BF16 (the reason is printed);
the build for the other CPU capability (``ATEN_CPU_CAPABILITY=default``: no vector
instructions) runs one bfloat16 forward and backward in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from test_fused import requires_fused
from test_tiled import grid_bias, qkv

from lookhere_dense.lookhere import reference_attention
from lookhere_dense.lookhere.fused import (
    bf16_products,
    fused_attention,
    native_bf16_available,
    native_bf16_unavailable_reason,
)

pytestmark = [pytest.mark.usefixtures('one_torch_thread'), requires_fused]

#: one ulp of each reduced dtype (relative)
ULP = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
#: the prefix queries' bound (PyTorch's own flash kernel in bfloat16 / float16), as the
#: conformance suite's bfloat16 bound for SDPA
PREFIX_ATOL = 2e-2
#: small ragged tiles, blocks of one tile, one head per gathered phase
MANY = dict(tile=(2, 3), max_keys=1, gather_bytes=1)
#: the default 8 x 8 tiles in blocks of one tile: on grids of multiples of 8 the native
#: products' rows of whole 8 x 8 tiles, one pass after the first block of tiles
EIGHTS = dict(max_keys=64)


requires_native = pytest.mark.skipif(
    not native_bf16_available(),
    reason=f'native bfloat16 products: {native_bf16_unavailable_reason()}',
)


def _requires(products: str):
    """Skip where the ``products`` implementation of the native bfloat16 products cannot
    run (the reason from :func:`bf16_products`)."""
    try:
        bf16_products(products)
        why = None
    except RuntimeError as err:
        why = str(err)
    return pytest.mark.skipif(why is not None, reason=f'{products}: {why}')


#: (dtype, ``native_bf16=``): float16 always takes the float32 products; bfloat16 also on
#: each implementation of the native products (our VDPBF16PS kernels, PyTorch's brgemm:
#: oneDNN's micro-kernel, AMX tiles where the CPU has them)
DTYPE_PRODUCTS = [
    pytest.param(torch.bfloat16, False, id='bf16'),
    pytest.param(torch.bfloat16, 'vdpbf16ps', marks=_requires('vdpbf16ps'), id='bf16-vdpbf16ps'),
    pytest.param(torch.bfloat16, 'brgemm', marks=_requires('brgemm'), id='bf16-brgemm'),
    pytest.param(torch.float16, False, id='fp16'),
]


def rounded_qkv(grid, cls_token, dim, dtype, grad=False, batch=2):
    """``q, k, v`` in ``dtype`` and the same values in float64 (exact upcast)."""
    low = [t.to(dtype) for t in qkv(grid, cls_token, batch=batch, dim=dim)]
    high = [t.double() for t in low]
    return [t.requires_grad_(grad) for t in low], [t.requires_grad_(grad) for t in high]


def abs_pv(q, k, v, bias):
    """``P |V|`` in float64: the size of what a rounding of each probability can move."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5 + bias
    return torch.softmax(s, dim=-1) @ v.abs()


def check_forward(out, ref, dtype, off, pv=None):
    """Patch queries (the kernel) within one ulp, plus ``ULP * pv`` where ``pv`` (``P |V|``,
    the native products' rounding of ``P``) is given; the ``off`` prefix queries
    (PyTorch's flash kernel in ``dtype``, which rounds its probabilities) within
    PREFIX_ATOL."""
    assert out.dtype == dtype and out.shape == ref.shape
    out = out.double()
    err = (out[:, :, off:] - ref[:, :, off:]).abs()
    bound = ULP[dtype] * ref[:, :, off:].abs() + 1e-3
    if pv is not None:
        bound = bound + ULP[dtype] * pv[:, :, off:]
    assert bool((err <= bound).all()), (
        f'{int((err > bound).sum())} elements out of bound, worst excess '
        f'{float((err - bound).max()):.3g}, worst error {float(err.max()):.3g}'
    )
    torch.testing.assert_close(out[:, :, :off], ref[:, :, :off], rtol=0, atol=PREFIX_ATOL)


@pytest.mark.parametrize('dtype,native', DTYPE_PRODUCTS)
@pytest.mark.parametrize('name', ['lh180', 'lh90', 'center_mix', 'per_layer'])
@pytest.mark.parametrize(
    'grid,cls_token', [((9, 16), True), ((5, 7), False), ((1, 9), True), ((16, 24), False)]
)
@pytest.mark.parametrize('dim', [64, 24])
def test_forward_matches_float64_reference(dtype, name, grid, cls_token, dim, native):
    gb = grid_bias(name, grid, torch.float64)
    (q, k, v), (q64, k64, v64) = rounded_qkv(grid, cls_token, dim, dtype)
    for layer in (0, 2):
        bias = gb.dense(layer, cls_token)
        ref = reference_attention(q64, k64, v64, bias)
        pv = abs_pv(q64, k64, v64, bias) if native else None
        for options in ({}, MANY, EIGHTS):
            out = fused_attention(q, k, v, gb, layer, cls_token, native_bf16=native, **options)
            check_forward(out, ref, dtype, int(cls_token), pv)


@pytest.mark.parametrize(
    'dtype,native', [pytest.param(torch.float32, None, id='fp32'), *DTYPE_PRODUCTS]
)
@pytest.mark.parametrize('where', ['q', 'k', 'v', 'k_inf'])
@pytest.mark.parametrize('grid', [(9, 16), (16, 16)])
def test_nan_and_inf_reach_the_output_rows_they_reach_in_the_reference(dtype, native, where, grid):
    """One NaN in ``q``, ``k`` or ``v`` (or an infinite key: ``inf`` scores meet ``-inf``
    bias) makes exactly the output rows NaN that it makes NaN in the reference, through
    every product implementation; it never turns into zeros (the bf16 path once took a
    row of NaN scores for a row that sees nothing and wrote zeros). The patch rows: the
    CLS query is PyTorch's SDPA (in bf16 it does not make the ``inf`` key's NaN). The
    16 x 16 grid in blocks of one tile takes the native products' one-pass rows too."""
    gb = grid_bias('lh180', grid)
    q, k, v = qkv(grid, True, dim=16)
    target = dict(q=q, k=k, v=v, k_inf=k)[where]
    target[1, 2, 40, 3] = float('inf') if where == 'k_inf' else float('nan')
    ref_nan = reference_attention(q, k, v, gb.dense(1, True)).isnan().any(-1)[:, :, 1:]
    low = [t.to(dtype) for t in (q, k, v)]
    assert 0 < int(ref_nan.sum()) < ref_nan.numel()
    for options in ({}, EIGHTS):
        out = fused_attention(*low, gb, 1, True, native_bf16=native, **options)[:, :, 1:]
        assert torch.equal(out.isnan().any(-1), ref_nan)
        assert torch.isfinite(out[~ref_nan]).all()


@requires_native
@pytest.mark.parametrize('native', ['vdpbf16ps', 'brgemm'])
@pytest.mark.parametrize('name', ['lh180', 'lh90', 'center_mix'])
def test_one_pass_rows_redo_a_block_whose_maximum_outgrows_the_running_one(native, name):
    """After the first block of tiles the native products' rows take exp(S - m) against
    the running maximum m in one pass; a block whose own maximum exceeds m by more than
    LAZY_RESCALE (here keys far from the queries score ~200 above the rest: e^200
    overflows float32) is redone with its maximum. The forward within the module's bound
    of the float64 reference (the gradients of such scores are beyond the bfloat16
    bound with or without the one pass: the backward rounds dS)."""
    if native == 'brgemm':
        try:
            bf16_products('brgemm')
        except RuntimeError as err:
            pytest.skip(str(err))
    grid, dim = (24, 32), 64
    gb = grid_bias(name, grid, torch.float64)
    gen = torch.Generator().manual_seed(5)
    u = torch.randn(dim, generator=gen)
    q = u.expand(1, 12, 1 + grid[0] * grid[1], dim).clone() + 0.1 * torch.randn(
        1, 12, 1 + grid[0] * grid[1], dim, generator=gen
    )
    k = torch.randn(q.shape, generator=gen)
    v = torch.randn(q.shape, generator=gen)
    far = 1 + torch.arange(grid[1])  # the keys of the first patch row (the first tile row)
    k[:, :, far] = 1600 * u / u.dot(u)  # q . k ~ 1600: ~200 above the rest once scaled
    low = [t.to(torch.bfloat16) for t in (q, k, v)]
    high = [t.double() for t in low]
    bias = gb.dense(1, True)
    ref = reference_attention(*high, bias)
    for options in ({}, EIGHTS):
        out = fused_attention(*low, gb, 1, True, native_bf16=native, **options)
        check_forward(out, ref, torch.bfloat16, 1, abs_pv(*high, bias))


@pytest.mark.parametrize('name', ['lh180', 'lh90'])
@pytest.mark.parametrize('cls_token', [True, False])
def test_bf16_equals_the_float32_compute_path(name, cls_token):
    """Patch queries bit for bit; the prefix queries (PyTorch's flash kernel, in bfloat16
    here) within the forward tolerance."""
    grid = (9, 16)
    gb = grid_bias(name, grid)
    (q, k, v), _ = rounded_qkv(grid, cls_token, 64, torch.bfloat16)
    got = fused_attention(q, k, v, gb, 1, cls_token, native_bf16=False)
    want = fused_attention(q.float(), k.float(), v.float(), gb, 1, cls_token)
    off = int(cls_token)
    assert torch.equal(got[:, :, off:], want[:, :, off:].bfloat16())
    check_forward(got, want.double(), torch.bfloat16, off)


@pytest.mark.parametrize('dtype,native', DTYPE_PRODUCTS)
@pytest.mark.parametrize('name', ['lh180', 'lh90', 'center_mix'])
@pytest.mark.parametrize('grid,cls_token', [((9, 16), True), ((6, 4), False), ((16, 16), True)])
def test_gradients_match_float64_reference(dtype, name, grid, cls_token, native):
    gb = grid_bias(name, grid, torch.float64)
    low, high = rounded_qkv(grid, cls_token, 24, dtype, grad=True)
    bias = gb.dense(1, cls_token)
    ref = reference_attention(*high, bias)
    pv = abs_pv(*(t.detach() for t in high), bias) if native else None
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    want = torch.autograd.grad(ref, high, grad)
    for options in ({}, MANY, EIGHTS):
        out = fused_attention(*low, gb, 1, cls_token, native_bf16=native, **options)
        check_forward(out, ref.detach(), dtype, int(cls_token), pv)
        got = torch.autograd.grad(out, low, grad.to(dtype))
        for g, w in zip(got, want):
            assert g.dtype == dtype
            err = (g.double() - w).abs().max().item()
            assert err <= 2**-7 * w.abs().max().item(), (err, w.abs().max().item())


def test_bf16_gradients_near_the_float32_compute_path():
    """No prefix token: dq, dk, dv within 2**-7 of the largest gradient of the
    float32 path's (not bit for bit: the backward reads the output as saved, in bfloat16,
    for ``delta = rowsum(dO * O)``, as PyTorch's flash backward does)."""
    grid = (9, 16)
    gb = grid_bias('lh90', grid)
    low, _ = rounded_qkv(grid, False, 64, torch.bfloat16, grad=True)
    high = [t.detach().float().requires_grad_() for t in low]
    grad = torch.randn(low[0].shape, generator=torch.Generator().manual_seed(4)).bfloat16()
    got = torch.autograd.grad(fused_attention(*low, gb, 1, False, native_bf16=False), low, grad)
    want = torch.autograd.grad(fused_attention(*high, gb, 1, False), high, grad.float())
    for g, w in zip(got, want):
        assert (g.float() - w).abs().max() <= 2**-7 * w.abs().max()


def test_no_float32_copy_of_the_inputs_is_saved():
    """The autograd node keeps ``q, k, v`` and the output in bfloat16 (the log-sum-exp in
    float32), not float32 copies."""
    grid = (5, 7)
    gb = grid_bias('lh180', grid)
    low, _ = rounded_qkv(grid, True, 16, torch.bfloat16, grad=True)
    out = fused_attention(*low, gb, 1, True)
    saved = out.grad_fn.saved_tensors
    assert [t.dtype for t in saved] == [torch.bfloat16] * 4 + [torch.float32]
    assert saved[0].data_ptr() == low[0].data_ptr()


_CHILD = """
import torch
from test_tiled import grid_bias, qkv
from test_fused_bf16 import rounded_qkv, check_forward
from lookhere_dense.lookhere import reference_attention
from lookhere_dense.lookhere.fused import _capability, fused_attention, load_fused_ops
load_fused_ops()
gb = grid_bias('lh90', (9, 16), torch.float64)
low, high = rounded_qkv((9, 16), True, 24, torch.bfloat16, grad=True, batch=1)
ref = reference_attention(*high, gb.dense(1, True))
out = fused_attention(*low, gb, 1, True)
check_forward(out, ref.detach(), torch.bfloat16, 1)
want = torch.autograd.grad(ref, high, torch.ones_like(ref))
got = torch.autograd.grad(out, low, torch.ones_like(out))
for g, w in zip(got, want):
    assert (g.double() - w).abs().max() <= 2**-7 * w.abs().max()
assert not load_fused_ops().brgemm_bf16()  # brgemm's operands need the AVX-512 build
print('ok', _capability())
"""


@pytest.mark.parametrize('capability', ['default', 'avx2'])
def test_other_capability_builds(capability):
    """The builds for CPUs without AVX-512 (``ATEN_CPU_CAPABILITY=avx2``) and without vector
    instructions (``=default``): bfloat16 forward and backward against the reference, on the
    float32 products, brgemm's off (compiled once per machine, ~1 min each)."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS='1')
    env['PYTHONPATH'] = os.pathsep.join([os.path.dirname(__file__), env.get('PYTHONPATH', '')])
    res = subprocess.run(
        [sys.executable, '-c', _CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split() == ['ok', capability.upper()]


def test_the_engine_hands_the_kernel_a_float32_table():
    """Through the engine (as the model calls it), bf16 ``q`` gets the float32 bias table:
    a table rounded to bf16 (ulp 0.125 at |bias| >= 16) would miss the one-ulp bound."""
    from test_tiled import CONFIGS, DEPTH, HEADS

    from lookhere_dense.lookhere import LookHereAttentionEngine

    grid = (24, 24)  # bias_rounding='none': the presets round the bias to bf16 themselves
    eng = LookHereAttentionEngine(CONFIGS['no_rounding'], DEPTH, HEADS)
    (q, k, v), high = rounded_qkv(grid, True, 16, torch.bfloat16, batch=1)
    dense = eng.grid_bias(grid, q.device, torch.float64).dense(1, True)
    assert dense[torch.isfinite(dense)].abs().max() > 16  # the bf16 table would be coarse
    out = eng(q, k, v, 1, grid, True, backend='fused')
    assert eng.last_backend == 'fused'
    pv = abs_pv(*high, dense) if native_bf16_available() else None
    check_forward(out, reference_attention(*high, dense), torch.bfloat16, 1, pv)


@requires_native
@pytest.mark.parametrize('grad', [False, True])
def test_native_products_are_the_default_where_available(grad):
    """bfloat16 calls take the native products by default where the CPU has them (what
    the model runs under autocast): bit for bit the ``native_bf16=True`` call, forward and
    gradients, and not the float32 products' result."""
    grid = (9, 16)
    gb = grid_bias('lh90', grid)
    low, _ = rounded_qkv(grid, True, 64, torch.bfloat16, grad=grad, batch=1)
    outs, grads = {}, {}
    for native in (None, True, False):
        out = fused_attention(*low, gb, 1, True, native_bf16=native)
        outs[native] = out.detach()
        if grad:
            grads[native] = torch.autograd.grad(out, low, torch.ones_like(out))
    assert torch.equal(outs[None], outs[True])
    assert not torch.equal(outs[None], outs[False])
    for a, b in zip(grads.get(None, ()), grads.get(True, ())):
        assert torch.equal(a, b)


def test_native_bf16_switch_is_checked():
    """``native_bf16`` must be None / True / False; True where the machine has none is a
    clear error, not a silent float32 run."""
    grid = (3, 4)
    gb = grid_bias('lh90', grid)
    (q, k, v), _ = rounded_qkv(grid, True, 16, torch.bfloat16, batch=1)
    with pytest.raises(ValueError, match="native_bf16 must be None, True, False or one of 'vdp"):
        fused_attention(q, k, v, gb, 1, True, native_bf16='yes')
    if not native_bf16_available():
        with pytest.raises(RuntimeError, match='native_bf16=True, but'):
            fused_attention(q, k, v, gb, 1, True, native_bf16=True)


@pytest.mark.parametrize('dtype,native', DTYPE_PRODUCTS)
def test_table_gradient_matches_float64_reference(dtype, native):
    """Learnable slopes in mixed precision: the bias table's gradient (the sum of dS over
    every pair that read an entry) within 2**-7 of the largest entry, as the other
    gradients."""
    from lookhere_dense.lookhere.bias import GridBias

    grid = (9, 16)
    gb = grid_bias('lh90', grid, torch.float64)
    low, high = rounded_qkv(grid, True, 24, dtype)
    grad = torch.randn(
        2,
        gb.table.shape[1],
        grid[0] * grid[1] + 1,
        24,
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(5),
    )
    got, want = None, None
    for which in ('kernel', 'reference'):
        table = (
            gb.table.clone().float().requires_grad_()
            if which == 'kernel'
            else gb.table.clone().requires_grad_()
        )
        tables = GridBias(grid, table, None, gb.visible)
        if which == 'kernel':
            out = fused_attention(*low, tables, 1, True, native_bf16=native)
            out.backward(grad.to(dtype))
            got = table.grad
        else:
            reference_attention(*high, tables.dense(1, True)).backward(grad)
            want = table.grad
    assert got[1].abs().max() > 0
    err = (got.double() - want).abs().max().item()
    assert err <= 2**-7 * want.abs().max().item(), (err, want.abs().max().item())


def test_bf16_products_choice(monkeypatch):
    """Which implementation bfloat16 runs on: brgemm where the CPU has AMX tiles (and brgemm
    takes bfloat16), else our VDPBF16PS kernels; ``LOOKHERE_FUSED_BF16`` names one, ``0``
    turns both off, anything else is refused by name; an explicit argument wins."""
    from lookhere_dense.lookhere.attention import fused

    monkeypatch.setattr(fused, 'brgemm_bf16_available', lambda: True)
    monkeypatch.setattr(fused, '_vdpbf16ps_available', lambda: True)
    monkeypatch.setattr(fused, 'amx_bf16_available', lambda: True)
    monkeypatch.delenv('LOOKHERE_FUSED_BF16', raising=False)
    assert bf16_products() == bf16_products(True) == 'brgemm'
    monkeypatch.setattr(fused, 'amx_bf16_available', lambda: False)
    assert bf16_products() == 'vdpbf16ps' and bf16_products(False) == 'float32'
    monkeypatch.setenv('LOOKHERE_FUSED_BF16', 'brgemm')
    assert bf16_products() == 'brgemm' and bf16_products('vdpbf16ps') == 'vdpbf16ps'
    monkeypatch.setenv('LOOKHERE_FUSED_BF16', '0')
    assert bf16_products() == 'float32' and bf16_products(True) == 'vdpbf16ps'
    monkeypatch.setenv('LOOKHERE_FUSED_BF16', 'amx')
    from lookhere_dense.errors import ConfigError

    with pytest.raises(  # a ConfigError: the tools print it as one line
        ConfigError,
        match=r"^LOOKHERE_FUSED_BF16='amx': expected one of 1, 0, vdpbf16ps, brgemm \(or unset\); "
        'also spelt 1: true, yes, on / 0: false, no, off$',
    ):
        bf16_products()
    monkeypatch.setenv('LOOKHERE_FUSED_BF16', '')  # NAME= in a shell line: unset
    assert bf16_products() == 'vdpbf16ps'
    monkeypatch.setenv('LOOKHERE_FUSED_BF16', 'off')
    assert bf16_products() == 'float32'
    monkeypatch.setenv('LOOKHERE_FUSED_BF16', '1')
    monkeypatch.setattr(fused, 'brgemm_bf16_available', lambda: False)
    with pytest.raises(RuntimeError, match="native_bf16='brgemm', but at::native::cpublas"):
        bf16_products('brgemm')
    monkeypatch.setattr(fused, '_vdpbf16ps_available', lambda: False)
    assert bf16_products() == 'float32'
    with pytest.raises(RuntimeError, match='native_bf16=True, but'):
        bf16_products(True)


def test_the_environment_switch_leaves_float32_alone(monkeypatch):
    """``LOOKHERE_FUSED_BF16=vdpbf16ps`` (a job script from an AVX-512 machine) on a CPU
    without those products refused *float32* inference with an error naming
    ``native_bf16=``: the choice is asked for bfloat16 calls only, and its refusal names
    the variable."""
    from test_tiled import CONFIGS, DEPTH, HEADS

    from lookhere_dense.lookhere import LookHereAttentionEngine
    from lookhere_dense.lookhere.attention import fused

    monkeypatch.setattr(fused, 'brgemm_bf16_available', lambda: False)
    monkeypatch.setattr(fused, '_vdpbf16ps_available', lambda: False)
    grid = (9, 16)
    eng = LookHereAttentionEngine(CONFIGS['no_rounding'], DEPTH, HEADS)
    high, _ = rounded_qkv(grid, True, 64, torch.float32, batch=1)
    want = eng(*high, 1, grid, True, backend='fused')
    for products in fused.BF16_PRODUCTS:
        monkeypatch.setenv('LOOKHERE_FUSED_BF16', products)
        assert torch.equal(eng(*high, 1, grid, True, backend='fused'), want)
        low = tuple(t.to(torch.bfloat16) for t in high)
        with pytest.raises(RuntimeError, match=rf"LOOKHERE_FUSED_BF16='{products}', but"):
            eng(*low, 1, grid, True, backend='fused')
        assert not fused.native_bf16_available()  # False, not the refusal
        assert f"LOOKHERE_FUSED_BF16='{products}', but" in fused.native_bf16_unavailable_reason()
    from lookhere_dense.errors import ConfigError

    monkeypatch.setenv('LOOKHERE_FUSED_BF16', 'vdpbf16')  # a misspelling: refused in any dtype
    with pytest.raises(ConfigError, match="LOOKHERE_FUSED_BF16='vdpbf16'"):
        eng(*high, 1, grid, True, backend='fused')


@_requires('brgemm')
@_requires('vdpbf16ps')
def test_the_environment_switch_reaches_the_kernel(monkeypatch):
    """``LOOKHERE_FUSED_BF16`` decides what the engine's fused calls (the model's) hand the
    kernel, forward and backward: brgemm, our kernels, or the float32 products."""
    from test_tiled import CONFIGS, DEPTH, HEADS

    from lookhere_dense.lookhere import LookHereAttentionEngine
    from lookhere_dense.lookhere.attention import fused

    ops = fused.load_fused_ops()
    seen = []

    class Recording:  # the kernel's ops, recording (native_bf16, brgemm) of each call
        def forward(self, *args):
            seen.append(('forward', args[-2], args[-1]))
            return ops.forward(*args)

        def backward(self, *args):
            seen.append(('backward', args[-3], args[-1]))
            return ops.backward(*args)

    monkeypatch.setattr(fused, 'load_fused_ops', lambda *a, **k: Recording())
    monkeypatch.setattr(fused, 'fused_available', lambda: True)
    monkeypatch.setattr(fused, 'brgemm_bf16_available', lambda: bool(ops.brgemm_bf16()))
    monkeypatch.setattr(fused, '_vdpbf16ps_available', lambda: bool(ops.native_bf16()))
    monkeypatch.setattr(fused, 'amx_bf16_available', lambda: bool(ops.amx_bf16()))
    grid = (9, 16)
    eng = LookHereAttentionEngine(CONFIGS['no_rounding'], DEPTH, HEADS)
    low, _ = rounded_qkv(grid, True, 64, torch.bfloat16, grad=True, batch=1)
    for env, flags in (
        ('brgemm', (True, True)),
        ('vdpbf16ps', (True, False)),
        ('0', (False, False)),
    ):
        monkeypatch.setenv('LOOKHERE_FUSED_BF16', env)
        seen.clear()
        out = eng(*low, 1, grid, True, backend='fused')
        out.sum().backward()
        assert seen == [('forward', *flags), ('backward', *flags)], (env, seen)
