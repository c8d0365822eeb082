"""The flex backend in bfloat16 and float16 against the float64 reference, on CPU (issue 31
item 3).

What torch 2.14.1's ``flex_attention`` runs on CPU (docs/gpu.md, "flex on CPU"): the
forward in eager mode, compiled with ``aot_eager`` and with inductor (its C++ kernel), in
float32 / bfloat16 / float16; gradients of tensors captured by the ``score_mod`` (the
learnable-slope table) eagerly and with ``aot_eager``, not with inductor; gradients of
``q, k, v`` nowhere (torch refuses them on CPU before tracing). Each of those that runs is
checked here at lh90 (block mask, tile order, CLS) on a 6x10 grid: flex in the low dtype
against :func:`reference_attention` in float64 on the same rounded inputs.

Forward bound, per element: ``|flex - ref| <= FORWARD_TOL * u * (P |V|)``, ``u`` the unit
roundoff of the dtype (2^-8 bfloat16, 2^-11 float16) and ``P |V|`` the reference's
attention of ``|v|`` (the size of the terms summed). Flex keeps the modified score and the
softmax in float32 and rounds twice: the probabilities before ``P V`` (at most
``u * P|V|``) and the output (at most ``u * |out| <= u * P|V|``): 2, plus float32 noise;
``FORWARD_TOL = 2.5``. Measured 1.47-1.69 (seeds 0-2, both dtypes, eager and aot_eager;
inductor 1.38 / 1.22 at seed 0). Adding the bias to a score rounded to the low dtype
(:func:`low_precision_sum`) gives 6.8-14, the bias read one offset off (:func:`shifted`)
above 5000.

Gradient bound, per slope parameter: ``|a - b| / |b| <= GRAD_TOL`` (2-norms). Flex's CPU
backward recomputes the scores in float32 but takes the rounded output into
``sum(out * grad_out)``; measured (seeds 0-2) up to 2.0e-2 in bfloat16 and 5.9e-3 in
float16; the bounds are twice those. The shifted bias gives 0.35 and more. (A score
rounded to the low dtype changes the gradients by less than this noise allows to tell
apart: 1.6e-2-1.0e-1 bfloat16, 3.8e-3-8.9e-3 float16; the forward check is its test.)

Measured with the computations of :func:`forward_error` and :func:`slope_grad_errors` over
seeds 0-2 (a throwaway script), 2 cores shared. In the inductor kernel the low-precision
sum gives NaN (bfloat16) or errors of order 1 (float16): one more reason the score_mod
returns float32.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, List, Optional

import pytest
import torch
from torch import Tensor

from lookhere_dense.lookhere import LookHereAttentionEngine, resolve_lh_config
from lookhere_dense.lookhere.attention import reference_attention
from lookhere_dense.lookhere.attention.flex import (
    flex_attention_lookhere,
    flex_available,
    flex_score_mod,
    flex_slope_grads_available,
)
from lookhere_dense.lookhere.bias import GridBias
from lookhere_dense.lookhere.slopes import LookHereSlopes

GRID, CLS, HEADS, DIM = (6, 10), 1, 12, 16
CPU = torch.device('cpu')
DTYPES = {'bfloat16': torch.bfloat16, 'float16': torch.float16}
#: ``|flex - ref| / (u * P|V|)``, per element (module docstring)
FORWARD_TOL = 2.5
#: ``|a - b| / |b|`` per slope parameter (module docstring)
GRAD_TOL = {'bfloat16': 4e-2, 'float16': 1.2e-2}
#: the modes flex runs in on CPU within the default suite's time (inductor: LOOKHERE_SLOW)
MODES = ('eager', 'aot_eager')

pytestmark = [
    pytest.mark.usefixtures('one_torch_thread'),
    pytest.mark.skipif(not flex_available(), reason='no torch.nn.attention.flex_attention'),
]
slow = pytest.mark.skipif(
    os.environ.get('LOOKHERE_SLOW') != '1',
    reason="compiles flex_attention with inductor's C++ kernel (~35 s); set LOOKHERE_SLOW=1",
)


@pytest.fixture(scope='module', autouse=True)
def fresh_dynamo():
    """aot_eager / inductor compile per dtype and score_mod: start and leave dynamo clean."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def make_engine(preset: str = 'lh90') -> LookHereAttentionEngine:
    """One layer of ``preset`` with 12 heads, the flex backend."""
    return LookHereAttentionEngine(resolve_lh_config(preset), 1, HEADS, 'flex')


def inputs(dtype: torch.dtype, seed: int = 0) -> List[Tensor]:
    """``q, k, v`` and an output gradient ``(1, 12, 61, 16)`` in ``dtype`` (float64 draws
    times 2: scores of about 4 standard deviations, where the bias matters)."""
    gen = torch.Generator().manual_seed(seed)
    n = CLS + GRID[0] * GRID[1]
    return [
        (2 * torch.randn(1, HEADS, n, DIM, generator=gen, dtype=torch.float64)).to(dtype)
        for _ in range(4)
    ]


def low_precision_sum(score_mod: Callable, dtype: torch.dtype) -> Callable:
    """A perturbed ``score_mod``: the bias added to the score rounded to ``dtype`` and the
    sum rounded again (what a score_mod computing in the input dtype would do)."""

    def mod(score, b, h, q_idx, kv_idx):
        return score_mod(score.to(dtype), b, h, q_idx, kv_idx).to(dtype)

    return mod


def shifted(tables: GridBias) -> GridBias:
    """A perturbed table: every bias read one horizontal offset off (the fields of view
    kept)."""
    return dataclasses.replace(tables, table=tables.table.roll(1, -1))


def run_flex(
    eng: LookHereAttentionEngine,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mode: str,
    tables: Optional[GridBias] = None,
    wrap: Callable[[Callable], Callable] = lambda mod: mod,
) -> Tensor:
    """Flex of layer 0 as the engine runs it (block mask, tile order), eager or compiled
    with ``mode`` as backend; ``tables``: the bias (default: the config's, float32);
    ``wrap``: applied to the score_mod (the perturbations)."""
    order = eng.flex_order(GRID, CLS, CPU)
    mask = eng.block_mask(0, GRID, CLS, CPU)
    tables = eng.grid_bias(GRID, CPU) if tables is None else tables
    mod = wrap(flex_score_mod(tables, 0, CLS, order))
    compiled = mode != 'eager'
    backend = 'inductor' if mode == 'eager' else mode
    return flex_attention_lookhere(
        q, k, v, tables, 0, CLS, mask, compiled, mod, order, compile_backend=backend
    )


def forward_error(eng: LookHereAttentionEngine, out: Tensor, q: Tensor, k: Tensor, v: Tensor):
    """``max |out - ref| / (u * P|V|)`` against the float64 reference on the same rounded
    inputs (``u``: the unit roundoff of ``out``'s dtype)."""
    q64, k64, v64 = (t.double() for t in (q, k, v))
    dense = eng.grid_bias(GRID, CPU, torch.float64).dense(0, CLS)
    ref = reference_attention(q64, k64, v64, dense)
    size = reference_attention(q64, k64, v64.abs(), dense)
    unit = torch.finfo(out.dtype).eps / 2
    return ((out.double() - ref).abs() / (unit * size)).max().item()


def slope_grad_errors(
    eng: LookHereAttentionEngine,
    dtype: torch.dtype,
    mode: str,
    perturb: Optional[Callable[[GridBias], GridBias]] = None,
) -> List[float]:
    """``|a - b| / |b|`` of each slope parameter's gradient: flex in ``dtype`` (learnable
    slopes, the table captured by the score_mod) against the float64 reference."""
    q, k, v, gout = inputs(dtype)
    slopes = LookHereSlopes(eng.config, 1, HEADS)
    tables = eng.slope_bias(0, GRID, CPU, torch.float32, slopes)
    if perturb is not None:
        tables = perturb(tables)
    out = run_flex(eng, q, k, v, mode, tables)
    assert out.dtype == dtype
    got = torch.autograd.grad(out, list(slopes.parameters()), gout)
    ref_slopes = LookHereSlopes(eng.config, 1, HEADS).double()
    q64, k64, v64 = (t.double() for t in (q, k, v))
    ref = eng(q64, k64, v64, 0, GRID, CLS, backend='reference', slopes=ref_slopes)
    want = torch.autograd.grad(ref, list(ref_slopes.parameters()), gout.double())
    return [((a.double() - b).norm() / b.norm()).item() for a, b in zip(got, want)]


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('dtype', list(DTYPES))
def test_flex_forward_in_low_precision_is_two_roundings_from_the_float64_reference(dtype, mode):
    eng = make_engine()
    q, k, v, _ = inputs(DTYPES[dtype])
    with torch.no_grad():
        out = run_flex(eng, q, k, v, mode)
    assert out.dtype == DTYPES[dtype]
    assert forward_error(eng, out, q, k, v) <= FORWARD_TOL


def test_flex_forward_with_a_per_key_center_term_in_bfloat16():
    """``center`` heads add a per-key term to the table's bias (also float32)."""
    eng = LookHereAttentionEngine(
        dataclasses.replace(resolve_lh_config('lh180'), head_directions='corners-center'),
        1,
        HEADS,
        'flex',
    )
    assert eng.grid_bias(GRID, CPU).key_term is not None
    q, k, v, _ = inputs(torch.bfloat16, seed=1)
    with torch.no_grad():
        out = run_flex(eng, q, k, v, 'eager')
    assert forward_error(eng, out, q, k, v) <= FORWARD_TOL


@pytest.mark.parametrize('mode', MODES)
def test_the_forward_check_rejects_a_low_precision_sum_and_a_shifted_bias(mode):
    """The bound above can fail: the score_mod perturbed two ways misses it in both dtypes."""
    eng = make_engine()
    for dtype in DTYPES.values():
        q, k, v, _ = inputs(dtype)
        with torch.no_grad():
            low = run_flex(eng, q, k, v, mode, wrap=lambda m, d=dtype: low_precision_sum(m, d))
            off = run_flex(eng, q, k, v, mode, tables=shifted(eng.grid_bias(GRID, CPU)))
        assert forward_error(eng, low, q, k, v) > 2 * FORWARD_TOL
        assert forward_error(eng, off, q, k, v) > 100 * FORWARD_TOL


@pytest.mark.skipif(not flex_slope_grads_available(), reason='torch < 2.6: no table gradients')
@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('dtype', list(DTYPES))
def test_flex_learnable_slope_gradients_in_low_precision_match_the_float64_reference(dtype, mode):
    errors = slope_grad_errors(make_engine(), DTYPES[dtype], mode)
    assert len(errors) == 3  # global, layer 0, heads of layer 0
    assert max(errors) <= GRAD_TOL[dtype], errors


@pytest.mark.skipif(not flex_slope_grads_available(), reason='torch < 2.6: no table gradients')
def test_the_gradient_check_rejects_a_shifted_bias():
    eng = make_engine()
    for name, dtype in DTYPES.items():
        errors = slope_grad_errors(eng, dtype, 'eager', perturb=shifted)
        assert max(errors) > 5 * GRAD_TOL[name], errors


def captured_tensors(score_mod: Callable) -> List[Tensor]:
    """The tensors a ``score_mod`` closes over."""
    cells = [c.cell_contents for c in score_mod.__closure__ or ()]
    return [t for t in cells if isinstance(t, Tensor)]


@pytest.mark.parametrize('directions', ['lh90', 'corners-center'])
def test_a_learnable_score_mod_captures_tensors_of_their_own(directions):
    """Compiled flex in torch 2.8 to 2.13 gives a captured tensor that is a view of a
    graph value no gradient: ``loss.backward()`` leaves the slopes' ``.grad`` None (the
    learnable-slope cases of ``tools/gpu_check.sh --simulate-cpu`` under torch 2.11: "One
    of the differentiated Tensors appears to not have been used in the graph"). Torch
    2.14 has no such bug, so what the score_mod captures is checked here: where it
    requires grad (the table, the center heads' key term), a tensor that is no view; a
    fixed table as it is, uncopied."""
    config = resolve_lh_config('lh90')
    if directions != 'lh90':
        config = dataclasses.replace(resolve_lh_config('lh180'), head_directions=directions)
    eng = LookHereAttentionEngine(config, 1, HEADS, 'flex')
    slopes = LookHereSlopes(eng.config, 1, HEADS)
    tables = eng.slope_bias(0, GRID, CPU, torch.float32, slopes)
    assert tables.table[0]._base is not None  # what it is handed is a view
    learn = [t for t in captured_tensors(flex_score_mod(tables, 0, CLS)) if t.requires_grad]
    assert len(learn) == (1 if tables.key_term is None else 2)
    assert all(t._base is None and t.is_contiguous() for t in learn)
    fixed = eng.grid_bias(GRID, CPU)
    kept = {t.data_ptr() for t in captured_tensors(flex_score_mod(fixed, 0, CLS))}
    assert fixed.table[0].data_ptr() in kept


@pytest.mark.skipif(not flex_slope_grads_available(), reason='torch < 2.6: no table gradients')
def test_compiled_flex_trains_learnable_slopes_through_backward():
    """``loss.backward()`` through ``aot_eager``-compiled flex fills every slope
    parameter's ``.grad`` with eager flex's."""
    eng = make_engine()
    q, k, v, gout = inputs(torch.float32)
    grads = []
    for mode in MODES:
        slopes = LookHereSlopes(eng.config, 1, HEADS)
        tables = eng.slope_bias(0, GRID, CPU, torch.float32, slopes)
        (run_flex(eng, q, k, v, mode, tables) * gout).sum().backward()
        grads.append([p.grad for p in slopes.parameters()])
    assert all(g is not None for g in grads[1])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('mode', MODES)
def test_torch_refuses_q_k_v_gradients_of_flex_on_cpu(mode):
    """Why no test here checks the gradients of ``q, k, v`` (the GPU script does): torch
    2.14 raises before tracing. When a torch runs them, this fails: add them above."""
    eng = make_engine()
    q, k, v, _ = (t.requires_grad_() for t in inputs(torch.bfloat16))
    with pytest.raises(NotImplementedError, match='does not support backward on CPU'):
        run_flex(eng, q, k, v, mode)


@slow
@pytest.mark.parametrize('dtype', list(DTYPES))
def test_inductor_compiled_flex_forward_in_low_precision(dtype):
    """Inductor's CPU kernel (C++; a compiler needed), the forward only (its lowering returns
    no logsumexp: a captured table that requires grad fails to compile, docs/gpu.md)."""
    eng = make_engine()
    q, k, v, _ = inputs(DTYPES[dtype])
    with torch.no_grad():
        out = run_flex(eng, q, k, v, 'inductor')
    assert forward_error(eng, out, q, k, v) <= FORWARD_TOL


@slow
@pytest.mark.skipif(not flex_slope_grads_available(), reason='torch < 2.6: no table gradients')
def test_inductor_cannot_compile_flex_with_a_table_that_requires_grad_on_cpu():
    """Why learnable slopes train through eager flex on CPU (``can_run`` refuses compiled
    flex there): inductor's CPU lowering returns only the output, the training graph also
    reads the logsumexp (torch 2.14.1). When a torch compiles it, this fails: move the
    inductor case into the gradient tests above."""
    torch._dynamo.reset()  # after other compiled flex calls in the process it did not raise
    eng = make_engine()
    q, k, v, _ = inputs(torch.bfloat16)
    slopes = LookHereSlopes(eng.config, 1, HEADS)
    tables = eng.slope_bias(0, GRID, CPU, torch.float32, slopes)
    with pytest.raises(Exception, match='tuple index out of range'):
        run_flex(eng, q, k, v, 'inductor', tables)


# ----------------------------------------------------------------------------------------
# the CUDA kernel options (the first GPU run: inductor's Hopper tiles did not fit)
# ----------------------------------------------------------------------------------------
def test_flex_kernel_options_only_for_compiled_cuda_16_bit_calls():
    from lookhere_dense.lookhere.attention.flex import flex_kernel_options

    assert flex_kernel_options('cpu', torch.bfloat16) is None
    assert flex_kernel_options('cuda', torch.float32) is None
    assert flex_kernel_options('cuda', torch.bfloat16, compiled=False) is None
    # torch 2.5 has no fwd_ / bwd_ prefixed options: inductor's own tiles there
    assert flex_kernel_options('cuda', torch.bfloat16, version='2.5.1') is None
    assert flex_kernel_options('cuda', torch.bfloat16, version='2.11.0+cu130') is not None
    for dtype in (torch.bfloat16, torch.float16):
        options = flex_kernel_options('cuda', dtype, 64)
        assert options['fwd_BLOCK_N'] < 128 and options['fwd_num_stages'] < 3


def test_every_cuda_kernel_option_entry_fits_the_block_mask_tiles():
    """Flex needs its kernel tiles to divide the block mask's (FLEX_BLOCK = 128) and, in the
    backward, BLOCK_N1 a multiple of BLOCK_M1 and BLOCK_M2 of BLOCK_N2; each later entry
    is smaller than the one before (what the retry is for)."""
    from lookhere_dense.lookhere.attention.flex import FLEX_BLOCK, FLEX_CUDA_KERNEL_OPTIONS

    def smem_proxy(o):  # elements staged per pipeline stage, times the stages
        return o['fwd_BLOCK_M'] * o['fwd_BLOCK_N'] * o['fwd_num_stages']

    for options in FLEX_CUDA_KERNEL_OPTIONS:
        for name, size in options.items():
            if 'BLOCK' in name:
                assert FLEX_BLOCK % size == 0, (name, size)
        assert options['bwd_BLOCK_N1'] % options['bwd_BLOCK_M1'] == 0
        assert options['bwd_BLOCK_M2'] % options['bwd_BLOCK_N2'] == 0
    sizes = [smem_proxy(o) for o in FLEX_CUDA_KERNEL_OPTIONS]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)


def test_a_kernel_out_of_shared_memory_is_compiled_again_with_smaller_tiles():
    """What the compiled call raises on an H200 with tiles that do not fit (the message of
    the first GPU run): the call is repeated with the next entry, which is remembered;
    any other error, and the last entry's, is raised."""
    from lookhere_dense.lookhere.attention import flex

    message = (
        'No valid triton configs. OutOfMemoryError: out of resource: '
        'triton_tem_fused_flex_attention_0 Required: 249856 Hardware limit:232448'
    )
    q = torch.zeros(1, 2, 4, 64, dtype=torch.bfloat16)
    seen = []

    def fits_second(q, k, v, score_mod=None, block_mask=None, kernel_options=None):
        seen.append(kernel_options)
        if len(seen) == 1:
            raise RuntimeError(message)
        return q + 1

    flex._cuda_options_level.clear()
    try:
        with pytest.warns(UserWarning, match='does not fit in shared memory'):
            out = flex._call_flex(fits_second, q, q, q, None, None, True, device_type='cuda')
        assert torch.equal(out, q + 1)
        assert seen == list(flex.FLEX_CUDA_KERNEL_OPTIONS[:2])
        assert (
            flex.flex_kernel_options('cuda', torch.bfloat16, 64)
            == flex.FLEX_CUDA_KERNEL_OPTIONS[1]
        )

        def never_fits(q, k, v, score_mod=None, block_mask=None, kernel_options=None):
            raise RuntimeError(message)

        with pytest.raises(RuntimeError, match='out of resource'):
            flex._call_flex(never_fits, q, q, q, None, None, True, device_type='cuda')

        def other_error(q, k, v, score_mod=None, block_mask=None, kernel_options=None):
            seen.append(kernel_options)
            raise RuntimeError('something else')

        flex._cuda_options_level.clear()
        seen.clear()
        with pytest.raises(RuntimeError, match='something else'):
            flex._call_flex(other_error, q, q, q, None, None, True, device_type='cuda')
        assert len(seen) == 1
        # on CPU nothing is passed: inductor's own tiles
        seen.clear()
        flex._call_flex((lambda *a, **kw: seen.append(kw)), q, q, q, None, None, True)
        assert seen == [dict(score_mod=None, block_mask=None)]
    finally:
        flex._cuda_options_level.clear()


def test_the_flex_callbacks_per_pair_work_has_no_division_and_no_int64():
    """Flex evaluates ``score_mod`` / ``mask_mod`` on every (query, key) pair of every
    computed tile, next to a 64-wide dot product: their integer work is what a LookHere
    flex kernel pays above flash attention. Traced on one pair (as flex traces them), the
    callbacks hold no division / modulo and no int64 value: two int32 gathers of per-token
    codes and a subtraction give the table entry (the first GPU run's callbacks did two
    int64 gathers of the token order, four int64 floor divisions / modulos and clamps per
    pair; the lh90 frame ran at 12x our trunk without bias there). A test of structure
    (no GPU here to time it); the values are the reference tests' above."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from lookhere_dense.lookhere.attention.flex import flex_mask_mod, tile_order

    grid = (8, 16)
    engine = LookHereAttentionEngine(resolve_lh_config('lh90'), 1, 12, 'flex')
    tables = engine.grid_bias(grid, torch.device('cpu'))
    i32 = dict(dtype=torch.int32)
    for order in (tile_order(grid, True), None):
        mods = dict(
            score_mod=(flex_score_mod(tables, 0, True, order), (torch.zeros(1),)),
            mask_mod=(flex_mask_mod(tables, 0, True, order), ()),
        )
        for name, (fn, lead) in mods.items():
            # one-element index tensors (a 0-d index would be read as a Python int)
            pair = (torch.zeros(1, **i32), torch.ones(1, **i32), torch.tensor([5], **i32))
            graph = make_fx(fn)(*lead, *pair, torch.tensor([7], **i32)).graph
            for node in graph.nodes:
                if node.op != 'call_function':
                    continue
                op = str(node.target)
                assert not any(w in op for w in ('div', 'remainder', 'floor', 'fmod')), (name, op)
                val = node.meta.get('val')
                assert getattr(val, 'dtype', None) != torch.int64, (name, op)


def test_a_flex_order_that_does_not_put_the_prefix_last_is_refused():
    from lookhere_dense.lookhere.attention.flex import flex_index, tile_order

    grid = (8, 16)
    order = tile_order(grid, 2)
    flex_index(grid, 2, order)  # prefix last: accepted
    with pytest.raises(ValueError, match='prefix token'):
        flex_index(grid, 2, order.roll(1))
    with pytest.raises(ValueError, match='expected 130 positions'):
        flex_index(grid, 2, order[:-1])


def test_the_flex_torch_probe_reports_every_case(capsys):
    """``python -m research.benchmark.flex_torch_probe`` (docs/gpu.md): a line per view
    case, both score-rounding lines, exit 0 where our capture keeps its gradient. Torch
    2.14 keeps every gradient and rounds bfloat16 flex about 1.5 times (2.8-2.13 lose
    the views' gradients; 2.8 rounds about 10 times)."""
    from torch.torch_version import TorchVersion

    from research.benchmark import flex_torch_probe

    assert flex_torch_probe.main(['--device', 'cpu']) == 0
    lines = capsys.readouterr().out.splitlines()
    views = [line for line in lines if line.startswith('view grads')]
    assert len(views) == len(flex_torch_probe.view_cases(torch.zeros(1)))
    assert not [line for line in views if flex_torch_probe.OURS in line and 'lost' in line]
    rounds = [float(line.split(': ')[1].split()[0]) for line in lines if 'roundings' in line]
    assert len(rounds) == 2 and all(r > 0.5 for r in rounds), rounds
    if TorchVersion(torch.__version__) >= (2, 14):
        assert not [line for line in views if 'lost' in line or 'error' in line]
        assert all(r < 4 for r in rounds), rounds
