"""The ``fused`` backend (the compiled CPU kernel) is exact: forward and gradients equal the
reference, and its plan is exact at tile granularity.

The cases every backend shares (presets, direction types, prefix tokens, grids, dtypes,
views, a tiny ViT) are the conformance suite's, ``tests/test_backends.py``. Here what is the
kernel's own, against :func:`reference_attention` with the dense bias of the grid: head
dimensions that fill the kernel's vectors and ones it pads (8, 24), the default tiles and
small ragged ones, blocks of one tile (many online-softmax rescales) and one head per
gathered phase; the plan; threads; the engine's ``auto`` choice (and its fallback where the
kernel is not built), the refusals and the build.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from test_tiled import (
    CONFIGS,
    GRIDS,
    HEADS,
    TINY,
    check,
    check_keeps_what_sdpa_keeps,
    grid_bias,
    qkv,
)

from lookhere_dense.lookhere import LookHereAttentionEngine, reference_attention
from lookhere_dense.lookhere.engine import FUSED_MIN_TOKENS
from lookhere_dense.lookhere.fused import (
    fused_attention,
    fused_available,
    fused_unavailable_reason,
    plan_fused,
    tile_layout,
)

#: skip where the kernel is not built (with ``LOOKHERE_REQUIRE_FUSED`` set: run, and fail)
requires_fused = pytest.mark.skipif(
    not fused_available() and not os.environ.get('LOOKHERE_REQUIRE_FUSED'),
    reason=f'fused kernel not built: {fused_unavailable_reason()}',
)

pytestmark = [pytest.mark.usefixtures('one_torch_thread'), requires_fused]

#: small ragged tiles: many tiles, partly visible ones, padded slots
SMALL = dict(tile=(2, 3))
#: blocks of one tile and one head per gathered phase: every online-softmax rescale path
MANY = dict(tile=(2, 3), max_keys=1, gather_bytes=1)


def with_prefix(t, count):
    """``t`` with ``count`` prefix tokens at the front (copies of its first tokens)."""
    t = t.detach()
    return torch.cat([t[:, :, :count], t], 2) if count else t


def qkv_prefix(grid, count, dim, dtype, grad=False, batch=2, seed=0):
    q, k, v = qkv(grid, False, batch=batch, dim=dim, dtype=dtype, seed=seed)
    return [with_prefix(t, count).requires_grad_(grad) for t in (q, k, v)]


# ----------------------------------------------------------------------------------------
# Plan
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', ['lh180', 'lh90', 'lh45', 'center_mix', 'type_diagonals'])
@pytest.mark.parametrize('grid', [(5, 7), (9, 16), (1, 9), (8, 1)])
@pytest.mark.parametrize('tile', [(2, 3), (4, 4), (8, 8)])
def test_plan_holds_exactly_the_tile_pairs_with_a_visible_pair(name, grid, tile):
    gb = grid_bias(name, grid)
    plan = plan_fused(gb.visible[0], grid, tile)
    y0, x0, rows, cols, start, order = tile_layout(grid, tile)
    n_tiles = len(y0)
    assert sorted(order.tolist()) == list(range(grid[0] * grid[1]))
    width = grid[1]
    vis = gb.visible[0].numpy()
    for h in range(HEADS):
        g = int(plan.head_group[h])
        for qt in range(n_tiles):
            got = set()
            for r in range(int(plan.run_ptr[g, qt]), int(plan.run_ptr[g, qt + 1])):
                a, b = plan.runs[r].tolist()
                assert a < b
                got.update(range(a, b))
            qs = order[start[qt] : start[qt + 1]]
            want = set()
            for kt in range(n_tiles):
                ks = order[start[kt] : start[kt + 1]]
                dy = ks[None, :] // width - qs[:, None] // width + grid[0] - 1
                dx = ks[None, :] % width - qs[:, None] % width + width - 1
                if vis[h, dy, dx].any():
                    want.add(kt)
            assert got == want, (h, qt)


def test_plan_fractions_count_pairs():
    grid = (9, 16)
    gb = grid_bias('lh90', grid)
    plan = plan_fused(gb.visible[0], grid, (8, 8))
    n = grid[0] * grid[1]
    dense = gb.dense(0, False)
    visible = torch.isfinite(dense).sum().item() / (HEADS * n * n)
    assert plan.visible == pytest.approx(visible)
    assert visible <= plan.computed <= 1


# ----------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    'name', ['lh180', 'lh90', 'lh45', 'center_mix', 'zero_mix', 'per_layer', 'type_eighths2']
)
@pytest.mark.parametrize('grid,cls_token', GRIDS + TINY)
@pytest.mark.parametrize('dim', [8, 24])
def test_forward_matches_reference_float64(name, grid, cls_token, dim):
    """Padded head dimensions and tiny blocks, in float64 so that nothing hides in the
    float32 tolerance."""
    gb = grid_bias(name, grid, torch.float64)
    q, k, v = qkv(grid, cls_token, dim=dim, dtype=torch.float64)
    for layer in range(3):
        ref = reference_attention(q, k, v, gb.dense(layer, cls_token))
        for options in ({}, SMALL, MANY):
            check(fused_attention(q, k, v, gb, layer, cls_token, **options), ref, torch.float64)


# ----------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'name',
    ['lh180', 'lh90', 'lh45', 'center_mix', 'zero_mix', 'fill_max', 'per_layer', 'type_diagonals'],
)
@pytest.mark.parametrize('grid,cls_token', GRIDS[:4] + TINY[:3])
@pytest.mark.parametrize('options', [MANY], ids=['many'])
def test_gradients_match_reference_float64(name, grid, cls_token, options):
    gb = grid_bias(name, grid, torch.float64)
    q, k, v = qkv(grid, cls_token, dim=8, dtype=torch.float64, grad=True)
    gen = torch.Generator().manual_seed(1)
    for layer in (0, 2):
        ref = reference_attention(q, k, v, gb.dense(layer, cls_token))
        grad = torch.randn(ref.shape, generator=gen, dtype=ref.dtype)
        want = torch.autograd.grad(ref, (q, k, v), grad)
        out = fused_attention(q, k, v, gb, layer, cls_token, **options)
        check(out, ref.detach(), torch.float64)
        got = torch.autograd.grad(out, (q, k, v), grad)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize('name', ['lh180', 'lh90', 'lh45', 'center_mix'])
@pytest.mark.parametrize('dim', [16, 24])
def test_gradients_match_reference_float32(name, dim):
    grid, cls_token = (9, 16), True
    gb = grid_bias(name, grid)
    q, k, v = qkv(grid, cls_token, dim=dim, grad=True)
    ref = reference_attention(q, k, v, gb.dense(1, cls_token))
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2))
    want = torch.autograd.grad(ref, (q, k, v), grad)
    got = torch.autograd.grad(fused_attention(q, k, v, gb, 1, cls_token), (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=5e-5, rtol=2e-5)  # gradients reach ~30


@pytest.mark.parametrize('name', ['lh90', 'center_mix'])
@pytest.mark.parametrize('grid', [(9, 16), (9, 13)])
@pytest.mark.parametrize('cls_token', [False, True])
def test_bias_far_below_zero_changes_nothing(name, grid, cls_token):
    """The softmax pass reads the bias straight from the table (two 8-patch tile rows per
    vector with AVX-512; masked vectors for the narrower edge tiles of a 13-patch row;
    the odd last tile row of a 9-row grid with its padding): every patch bias shifted by
    -200, past the float32 exponential's range, gives the reference's output and
    gradients. A padded or masked lane counted as a score of 0 in a row's maximum, or a
    padded slot left visible, underflows or shifts the row."""
    from lookhere_dense.lookhere.bias import GridBias

    gb = grid_bias(name, grid)
    shifted = GridBias(grid, gb.table - 200.0, gb.key_term, gb.visible)
    q, k, v = qkv(grid, cls_token, dim=16, grad=True)
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(3))
    ref = reference_attention(q, k, v, shifted.dense(1, cls_token))
    want = torch.autograd.grad(ref, (q, k, v), grad)
    out = fused_attention(q, k, v, shifted, 1, cls_token)
    # scores near -200 keep 16 fewer bits of their exponents: looser than the other tests
    torch.testing.assert_close(out, ref.detach(), atol=2e-4, rtol=1e-3)
    got = torch.autograd.grad(out, (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)


def test_backward_keeps_what_plain_sdpa_keeps():
    """Saved for backward: ``q, k, v``, the output and the log-sum-exp; no bias, no
    attention matrix."""
    check_keeps_what_sdpa_keeps(fused_attention, dim=8)


@pytest.mark.parametrize('mode', ['grad', 'inference_mode'])
def test_two_threads_give_the_same_result_bit_for_bit(mode):
    """Work items go to whichever thread is free; each item is computed by one thread in
    a fixed order, so the thread count does not change one bit (without prefix tokens:
    their queries go through PyTorch's own kernel, whose sums depend on the threads)."""
    grid, cls_token = (9, 16), False
    gb = grid_bias('lh45', grid)
    q, k, v = qkv(grid, cls_token, dim=16, grad=mode == 'grad')
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(4))

    def run():
        if mode == 'grad':
            out = fused_attention(q, k, v, gb, 1, cls_token, **SMALL)
            return (out.detach(), *torch.autograd.grad(out, (q, k, v), grad))
        with torch.inference_mode():
            return (fused_attention(q, k, v, gb, 1, cls_token, **SMALL),)

    one = run()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for _ in range(3):
            for a, b in zip(run(), one):
                assert torch.equal(a, b)
    finally:
        torch.set_num_threads(before)
    check(one[0], reference_attention(q, k, v, gb.dense(1, cls_token)).detach())


# ----------------------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------------------
def test_refusals_name_the_problem():
    grid = (4, 5)
    gb = grid_bias('lh90', grid)
    q, k, v = qkv(grid, True, dim=16)
    with pytest.raises(ValueError, match='fused.*attention dropout'):
        fused_attention(q, k, v, gb, 0, True, dropout_p=0.1)
    with pytest.raises(ValueError, match='fused attention got 20 queries'):
        fused_attention(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], gb, 0, True)
    with pytest.raises(ValueError, match='max_keys must be a positive int'):
        fused_attention(q, k, v, gb, 0, True, max_keys=0)
    with pytest.raises(ValueError, match='tile must be two positive ints'):
        fused_attention(q, k, v, gb, 0, True, tile=(0, 4))


def test_a_table_that_requires_grad_gets_its_gradient():
    """Learnable slopes while they train: the table is no longer refused; its gradient (per
    sample, summed) equals autograd's through the dense reference (float32 here; float64
    with every learnable config in tests/test_learnable_slopes.py)."""
    from lookhere_dense.lookhere.bias import GridBias

    grid = (4, 5)
    gb = grid_bias('lh90', grid)
    q, k, v = qkv(grid, True, dim=16)
    grads = []
    for attend in ('fused', 'reference'):
        table = gb.table.clone().requires_grad_()
        tables = GridBias(grid, table, None, gb.visible)
        if attend == 'fused':
            out = fused_attention(q, k, v, tables, 0, True)
        else:
            out = reference_attention(q, k, v, tables.dense(0, True))
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        grads.append(table.grad)
    assert grads[0][0].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-5)


def test_the_kernel_checks_its_inputs():
    """The operator itself refuses inconsistent calls with a message (not a crash)."""
    from lookhere_dense.lookhere.fused import load_fused_ops

    ops = load_fused_ops()
    grid = (4, 5)
    gb = grid_bias('lh90', grid)
    q, k, v = qkv(grid, True, dim=16)
    plan = plan_fused(gb.visible[0], grid, (8, 8))
    args = (plan.run_ptr, plan.runs, plan.head_group, 4, 5, 8, 8, 1, 0.25, 512, 2**20)
    ops.forward(q, k, v, gb.table[0].contiguous(), None, *args)  # fine
    with pytest.raises(RuntimeError, match='tokens, the grid needs'):
        ops.forward(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], gb.table[0].contiguous(), None, *args)
    with pytest.raises(RuntimeError, match='runs out of range'):
        bad = plan.runs.clone()
        bad[0, 1] = 99
        ops.forward(q, k, v, gb.table[0].contiguous(), None, plan.run_ptr, bad, *args[2:])
    with pytest.raises(RuntimeError, match='share a dtype'):
        ops.forward(q.double(), k, v, gb.table[0].contiguous(), None, *args)


# ----------------------------------------------------------------------------------------
# Engine and model
# ----------------------------------------------------------------------------------------
def test_engine_backend_and_auto_choice():
    eng = LookHereAttentionEngine(CONFIGS['lh90'], 3, HEADS)
    grid = (24, 24)
    q, k, v = qkv(grid, True, batch=1, dim=16)
    ref = reference_attention(q, k, v, eng.grid_bias(grid, q.device).dense(1, True))
    check(eng(q, k, v, 1, grid, True, backend='fused'), ref)
    assert eng.last_backend == 'fused'
    check(eng(q, k, v, 1, grid, True), ref)
    assert eng.last_backend == 'fused'
    assert eng.choose_backend(FUSED_MIN_TOKENS, torch.device('cpu')) == 'fused'
    assert eng.choose_backend(8193, torch.device('cpu'), training=True) == 'fused'
    # what fused cannot do goes elsewhere
    assert eng.choose_backend(8193, torch.device('cpu'), dropout_p=0.1) == 'chunked'
    # learnable slopes that train: fused gives the table its gradient
    assert eng.choose_backend(8193, torch.device('cpu'), slope_grads=True) == 'fused'
    assert eng.choose_backend(FUSED_MIN_TOKENS - 1, torch.device('cpu')) == 'sdpa'
    assert eng.cache_info()['fused_plans']['size'] == 1


def test_auto_falls_back_to_tiled_where_the_kernel_is_not_built():
    """``LOOKHERE_FUSED=0`` (as on a machine without a compiler): ``auto`` keeps the
    ``tiled`` backend, and forcing ``fused`` says why it cannot."""
    code = (
        'import torch\n'
        'from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine\n'
        'from lookhere_dense.lookhere.fused import fused_available, fused_unavailable_reason\n'
        "e = LookHereAttentionEngine(PRESETS['lh90'], 1, 12)\n"
        "cpu = torch.device('cpu')\n"
        'print(fused_available(), e.choose_backend(8193, cpu), '
        'e.choose_backend(1025, cpu, training=True))\n'
        'q = torch.randn(1, 12, 17, 8)\n'
        'try:\n'
        "    e(q, q, q, 0, (4, 4), True, backend='fused')\n"
        'except RuntimeError as err:\n'
        '    print(err)\n'
    )
    env = dict(os.environ, LOOKHERE_FUSED='0')
    out = subprocess.run(
        [sys.executable, '-c', code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == 'False tiled tiled'
    assert 'LOOKHERE_FUSED=0' in lines[1] and "attn_backend='auto'" in lines[1]


def test_a_failed_build_says_so_after_compiling(tmp_path):
    """'compiling the fused CPU attention kernel ...' was the last word when the build
    failed (a build folder that cannot be written: a new-user trial): attention fell back
    to another backend without a word. The outcome is printed, with the reason."""
    blocker = tmp_path / 'a_file'
    blocker.write_text('not a folder')
    env = dict(os.environ, LOOKHERE_BUILD_DIR=str(blocker / 'build'))
    res = subprocess.run(
        [
            sys.executable,
            '-c',
            'from lookhere_dense.lookhere.attention.fused import fused_available as f; print(f())',
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.stdout.strip() == 'False', res.stderr[-2000:]
    assert 'compiling the fused CPU attention kernel' in res.stderr
    assert 'lookhere-dense: the fused kernel could not be built (' in res.stderr, res.stderr
    assert 'explain_backend(model, size) says which' in res.stderr
