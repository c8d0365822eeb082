"""The ``tiled`` backend's own cases: its plan and its threads.

The cases every backend shares (presets, every direction type, prefix tokens, square /
rectangular / 1xN grids, float32 / float64 / bfloat16 / float16, batch > 1, views of one
``qkv`` projection, a tiny ViT forward and backward) are the conformance suite's,
``tests/test_backends.py``. Here, against :func:`reference_attention` with the dense bias
of the grid: a fine plan (tiny blocks, 1-wide strips, short key runs: many merges and many
queries that see nothing of a call) in float64, forward and gradients, and grids smaller
than a tile. The plan itself is checked pair by pair: every visible (query, key) pair of
every head group is computed by exactly one call, and the queries marked empty are exactly
those that see none of their call's keys. Then the scheduler's threads, split head groups,
the plan cache, the refusals, and ``auto``'s choice (with learnable slopes too).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
import torch

from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine, reference_attention, tiled
from lookhere_dense.lookhere.bias import GridBias
from lookhere_dense.lookhere.tiled import (
    TileOptions,
    get_plan,
    plan_tiles,
    split_heads,
    table_bytes,
    tiled_attention,
)

HEADS = 12
DEPTH = 3
#: every direction type of ``directions.DIRECTION_TYPES`` (listed here: that module's
#: names are being moved; :func:`test_every_direction_type_is_listed` compares when it can)
TYPES = (
    'none',
    'zero',
    'none1zero3',
    'none2zero2',
    'none3zero1',
    'center',
    'halves',
    'corners',
    'triangles',
    'diagonals',
    'eighths1',
    'eighths2',
    'zerohalves',
    'zerocorners',
    'zerotriangles',
)


def config(head_directions, **kw):
    """A LookHere config (built from a preset, whose class is the config class)."""
    return replace(PRESETS['lh180'], head_directions=head_directions, **kw)


CONFIGS = {
    'lh180': PRESETS['lh180'],
    'lh90': PRESETS['lh90'],
    'lh45': PRESETS['lh45'],
    'center_mix': config('corners-center'),
    'zero_mix': config('zerohalves-none1zero3'),
    'fill_zero': config('halves-none', fill_with='zero'),
    'fill_max': config('triangles-none', fill_with='max', distance='sqrt'),
    'per_layer': config(('halves-none', 'eighths1-eighths2-none', 'corners-none')),
    'no_rounding': config('diagonals-zerocorners-none', bias_rounding='none'),
    **{f'type_{t}': config(t) for t in TYPES},  # 12 heads of one type
}
GRIDS = [((5, 7), True), ((6, 4), False), ((1, 9), True), ((8, 1), False), ((9, 16), True)]
TINY = [((1, 1), True), ((1, 1), False), ((2, 3), True), ((3, 2), False), ((1, 2), True)]
#: a plan with tiny blocks: many calls, merges, 1-wide strips, empty queries
FINE = TileOptions(rows=2, max_keys=6, min_cols=2, strips=(1, 2, 3), call_cost=0)
ATOL = {torch.float64: 1e-11, torch.float32: 1e-5, torch.bfloat16: 6e-2, torch.float16: 1e-2}

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def qkv(grid, cls_token, batch=2, dim=8, dtype=torch.float32, seed=0, grad=False):
    """Random ``q, k, v`` (scaled so that softmaxes are peaky and the bias matters)."""
    gen = torch.Generator().manual_seed(seed)
    t = grid[0] * grid[1] + int(cls_token)
    return [
        (2 * torch.randn(batch, HEADS, t, dim, generator=gen, dtype=torch.float64))
        .to(dtype)
        .requires_grad_(grad)
        for _ in range(3)
    ]


def grid_bias(name, grid, dtype=torch.float32):
    return LookHereAttentionEngine(CONFIGS[name], DEPTH, HEADS).grid_bias(
        grid, torch.device('cpu'), dtype
    )


def check(out, ref, dtype=torch.float32):
    """The one comparison with the reference: max |error| <= ``ATOL[dtype]``."""
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=ATOL[dtype], rtol=0)


def check_keeps_what_sdpa_keeps(attention, dim: int = 4):
    """Run ``attention(q, k, v, grid_bias, 0, True)`` on a 12x12 ``lh90`` grid with CLS
    (batch 1, head size ``dim``) and assert what backward keeps: five tensors, ``q, k, v``,
    the output and the log-sum-exp (nothing with ``T x T`` elements); then backward gives
    finite gradients. Returns ``(out, saved, (q, k, v))`` for backend-specific checks."""
    grid, cls_token = (12, 12), True
    gb = grid_bias('lh90', grid)
    q, k, v = qkv(grid, cls_token, batch=1, dim=dim, grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = attention(q, k, v, gb, 0, cls_token)
    t = q.shape[2]
    assert len(saved) == 5
    assert sum(s.numel() for s in saved) == 4 * q.numel() + q.numel() // q.shape[-1]
    assert max(s.numel() for s in saved) < t * t
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))
    return out, saved, (q, k, v)


def check_cpu_refusals(attention):
    """``attention(q, k, v, grid_bias, layer, cls_token, ...)`` of a CPU-only backend
    refuses dropout, other devices, a grid that does not match the tokens and a bias table
    that wants a gradient, each by name; with no grad it runs with such a table."""
    grid = (3, 4)
    gb = grid_bias('lh90', grid)
    q, k, v = qkv(grid, True)
    with pytest.raises(ValueError, match='no attention dropout'):
        attention(q, k, v, gb, 0, True, dropout_p=0.1)
    with pytest.raises(ValueError, match='CPU only'):
        attention(*(t.to('meta') for t in (q, k, v)), gb, 0, True)
    with pytest.raises(ValueError, match='for grid'):
        attention(q, k, v, gb, 0, False)
    learnable = GridBias(gb.grid_size, gb.table.clone().requires_grad_(), None, gb.visible)
    with pytest.raises(ValueError, match='no gradient to the bias table'):
        attention(q, k, v, learnable, 0, True)
    with torch.no_grad():  # inference with a table that requires grad is fine
        check(
            attention(q, k, v, learnable, 0, True), reference_attention(q, k, v, gb.dense(0, True))
        )


# ----------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    'name',
    [
        'lh180',
        'lh90',
        'lh45',
        'center_mix',
        'zero_mix',
        'per_layer',
        'type_diagonals',
        'type_eighths2',
    ],
)
@pytest.mark.parametrize('grid,cls_token', GRIDS + TINY)
def test_fine_plan_matches_reference_float64(name, grid, cls_token):
    """Tiny blocks and 1-wide strips: hundreds of merges and empty partials, checked in
    float64 so that nothing hides in the float32 tolerance."""
    gb = grid_bias(name, grid, torch.float64)
    q, k, v = qkv(grid, cls_token, dtype=torch.float64)
    for layer in range(DEPTH):
        ref = reference_attention(q, k, v, gb.dense(layer, cls_token))
        for options in (None, FINE):
            check(
                tiled_attention(q, k, v, gb, layer, cls_token, options=options), ref, torch.float64
            )


@pytest.mark.parametrize('grid,cls_token', TINY)
def test_grids_smaller_than_a_tile(grid, cls_token):
    for name in ('lh45', 'center_mix', 'type_triangles'):
        gb = grid_bias(name, grid)
        q, k, v = qkv(grid, cls_token, batch=3)
        ref = reference_attention(q, k, v, gb.dense(1, cls_token))
        check(tiled_attention(q, k, v, gb, 1, cls_token), ref)


# ----------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'name',
    ['lh180', 'lh90', 'lh45', 'center_mix', 'zero_mix', 'fill_max', 'per_layer', 'type_diagonals'],
)
@pytest.mark.parametrize('grid,cls_token', GRIDS[:4] + TINY[:3])
@pytest.mark.parametrize('options', [FINE], ids=['fine'])
def test_gradients_match_reference_float64(name, grid, cls_token, options):
    gb = grid_bias(name, grid, torch.float64)
    q, k, v = qkv(grid, cls_token, dtype=torch.float64, grad=True)
    gen = torch.Generator().manual_seed(1)
    for layer in (0, 2):
        ref = reference_attention(q, k, v, gb.dense(layer, cls_token))
        grad = torch.randn(ref.shape, generator=gen, dtype=ref.dtype)
        want = torch.autograd.grad(ref, (q, k, v), grad)
        out = tiled_attention(q, k, v, gb, layer, cls_token, options=options)
        check(out, ref.detach(), torch.float64)
        got = torch.autograd.grad(out, (q, k, v), grad)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_backward_keeps_what_plain_sdpa_keeps():
    """Saved for backward: ``q, k, v``, the output and the log-sum-exp; no bias, no
    attention matrix (nothing with ``T x T`` elements)."""
    out, _, _ = check_keeps_what_sdpa_keeps(tiled_attention)
    # laid out (B, T, heads, d) like SDPA's output: the model's transpose + reshape to
    # (B, T, C) is a view, so the output projection keeps no second copy
    assert out.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize('mode', ['grad', 'no_grad', 'inference_mode'])
def test_two_workers_match_reference(mode):
    """With two torch threads the units of the plan run on two Python threads (one
    intra-op thread each): same result, and the caller's thread count is restored."""
    grid, cls_token = (9, 16), True
    gb = grid_bias('lh45', grid, torch.float64)
    q, k, v = qkv(grid, cls_token, dtype=torch.float64, grad=mode == 'grad')
    ref = reference_attention(q, k, v, gb.dense(1, cls_token))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        if mode == 'grad':
            out = tiled_attention(q, k, v, gb, 1, cls_token, options=FINE)
            grad = torch.randn(
                ref.shape, generator=torch.Generator().manual_seed(4), dtype=ref.dtype
            )
            got = torch.autograd.grad(out, (q, k, v), grad)
            want = torch.autograd.grad(ref, (q, k, v), grad)
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
        else:
            with getattr(torch, mode)():
                out = tiled_attention(q, k, v, gb, 1, cls_token, options=FINE)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    check(out.detach(), ref.detach(), torch.float64)


def test_two_workers_give_the_same_forward_every_time():
    """The forward hands units to whichever worker is free; every unit writes its own
    output rows, so which worker ran what does not change one bit of the result."""
    grid, cls_token = (9, 16), True
    gb = grid_bias('lh45', grid, torch.float64)
    q, k, v = qkv(grid, cls_token, dtype=torch.float64)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first = tiled_attention(q, k, v, gb, 1, cls_token, options=FINE)
        check(first, reference_attention(q, k, v, gb.dense(1, cls_token)), torch.float64)
        for _ in range(5):
            assert torch.equal(tiled_attention(q, k, v, gb, 1, cls_token, options=FINE), first)
    finally:
        torch.set_num_threads(before)


def _schedule(groups, units_per_group, fail_make=None, fail_unit=None, dynamic=True):
    """Run the tiled scheduler on dummy units on two workers; what it did."""
    units = [(float(u + 1), g, [(g, u)]) for g in range(groups) for u in range(units_per_group)]
    lock = threading.Lock()
    log = {'made': [], 'builders': set(), 'done': [], 'ran': [], 'live': 0, 'most': 0}

    def make(gi):
        if gi == fail_make:
            raise RuntimeError(f'make {gi} failed')
        with lock:
            log['made'].append(gi)
            log['builders'].add(threading.get_ident())
            log['live'] += 1
            log['most'] = max(log['most'], log['live'])
        time.sleep(0.002)
        return ('state', gi)

    def done(gi, state):
        assert state == ('state', gi)
        with lock:
            log['done'].append(gi)
            log['live'] -= 1

    def fn(worker, calls, state):
        assert state == ('state', calls[0][0])
        if calls[0] == fail_unit:
            raise RuntimeError(f'unit {fail_unit} failed')
        time.sleep(0.001)
        with lock:
            log['ran'].extend(calls)

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        tiled._run_units(units, fn, tiled._GroupStates(units, make, done), dynamic=dynamic)
    finally:
        torch.set_num_threads(before)
    return units, log


@pytest.mark.parametrize('dynamic', [True, False])
def test_scheduler_runs_every_unit_once_with_one_state_per_group(dynamic):
    units, log = _schedule(6, 5, dynamic=dynamic)
    assert sorted(log['ran']) == sorted(c for _, _, calls in units for c in calls)
    assert sorted(log['made']) == list(range(6)) and sorted(log['done']) == list(range(6))
    assert log['most'] <= 3  # the workers' groups (and the next one, prefetched)
    assert threading.get_ident() in log['builders'], 'the calling thread prefetched nothing'


def _raises_without_hanging(**kwargs):
    """The scheduler's error (run in a thread so that a hang fails the test)."""
    errors = []

    def run():
        try:
            _schedule(6, 5, **kwargs)
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), f'the scheduler hung after a failure ({kwargs})'
    return errors


@pytest.mark.parametrize('dynamic', [True, False])
def test_scheduler_raises_the_first_failure_and_does_not_hang(dynamic):
    assert _raises_without_hanging(fail_make=3, dynamic=dynamic) == ['make 3 failed']
    assert _raises_without_hanging(fail_unit=(2, 1), dynamic=dynamic) == ['unit (2, 1) failed']


# ----------------------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------------------
def coverage(plan, visible):
    """Per head group: how often each (query patch, key patch) pair is computed, and
    whether the empty flags are exact."""
    height, width = plan.grid_size
    n = height * width
    y = torch.arange(n) // width
    x = torch.arange(n) % width
    dy = (y[None, :] - y[:, None]) + height - 1
    dx = (x[None, :] - x[:, None]) + width - 1
    out = []
    for group in plan.groups:
        seen = visible[group.heads[0]][dy, dx]  # (N, N) query x key
        count = torch.zeros(n, n, dtype=torch.int64)
        for c in group.calls:
            qs = (
                torch.arange(c.y0, c.y1)[:, None] * width + torch.arange(c.x0, c.x1)[None, :]
            ).flatten()
            kx = torch.arange(c.strip * group.strip, (c.strip + 1) * group.strip)
            ks = (torch.arange(c.r0, c.r1)[:, None] * width + kx[None, :]).flatten()
            count[qs[:, None], ks[None, :]] += 1
            sees = seen[qs[:, None], ks[None, :]].any(1).view(c.y1 - c.y0, c.x1 - c.x0)
            empty = torch.zeros_like(sees) if c.empty is None else c.empty[0]
            assert torch.equal(empty, ~sees), 'empty flags'
        out.append((group, seen, count))
    return out


@pytest.mark.parametrize(
    'name',
    [
        'lh180',
        'lh90',
        'lh45',
        'center_mix',
        'type_diagonals',
        'type_eighths1',
        'type_triangles',
        'fill_zero',
    ],
)
@pytest.mark.parametrize(
    'grid,options',
    [
        ((5, 7), None),
        ((8, 12), None),
        ((1, 6), None),
        ((6, 1), None),
        ((16, 24), None),
        ((5, 7), FINE),
        ((8, 12), FINE),
        ((1, 6), FINE),
        ((6, 1), FINE),
    ],
)
def test_plan_computes_every_visible_pair_exactly_once(name, grid, options):
    gb = grid_bias(name, grid)
    plan = plan_tiles(gb.visible[0], grid, options)
    heads = sorted(h for g in plan.groups for h in g.heads)
    assert heads == list(range(HEADS))
    for group, seen, count in coverage(plan, gb.visible[0]):
        assert count.max() <= 1, 'a pair computed twice'
        assert (count[seen] == 1).all(), 'a visible pair skipped'
        assert group.visible == int(seen.sum())
        assert group.computed == int(count.sum())
        assert torch.equal(
            gb.visible[0][list(group.heads)],
            gb.visible[0][group.heads[0]].expand(len(group.heads), -1, -1),
        )


def test_split_heads_makes_even_parts_within_the_budget():
    assert split_heads((8, 9, 10, 11), 10, 40) == [(8, 9, 10, 11)]
    assert split_heads((8, 9, 10, 11), 10, 20) == [(8, 9), (10, 11)]
    assert split_heads((8, 9, 10, 11), 10, 30) == [(8, 9), (10, 11)]  # even, not 3 + 1
    assert split_heads((0, 4, 8), 10, 5) == [(0,), (4,), (8,)]  # at least one head
    assert split_heads(tuple(range(7)), 10, 30) == [(0, 1, 2), (3, 4), (5, 6)]
    assert table_bytes((128, 256), 256) == 256 * 255 * 256 * 4


def test_groups_with_large_tables_run_as_fewer_heads():
    """Whole-row heads on a 128x256 grid need a 64 MiB table each: the default budget
    (32 MiB) runs them one head at a time; on 64x128 (8 MiB a head) the four
    unrestricted heads of lh180 stay one group."""
    small = plan_tiles(grid_bias('lh180', (64, 128)).visible[0], (64, 128))
    assert (8, 9, 10, 11) in [g.heads for g in small.groups]
    big = plan_tiles(grid_bias('lh180', (128, 256)).visible[0], (128, 256))
    for g in big.groups:
        per_head = table_bytes(big.grid_size, g.strip)
        assert len(g.heads) == 1 or len(g.heads) * per_head <= TileOptions().max_table_bytes
    assert [g.heads for g in big.groups if g.strip == 256][-4:] == [(8,), (9,), (10,), (11,)]


@pytest.mark.parametrize('name', ['lh180', 'lh90', 'center_mix'])
@pytest.mark.parametrize('budget', ['one head', 'two heads'])
def test_split_groups_match_reference_float64(name, budget):
    """A budget below one head's table (every head its own group, same calls) or of two
    whole-row heads' tables: forward and gradients still equal the reference, on one
    and on two workers."""
    grid, cls_token = (5, 7), True
    gb = grid_bias(name, grid, torch.float64)
    whole = plan_tiles(gb.visible[0], grid, FINE)
    options = replace(
        FINE, max_table_bytes=1 if budget == 'one head' else 2 * table_bytes(grid, 7)
    )
    plan = plan_tiles(gb.visible[0], grid, options)
    if budget == 'one head':
        assert [len(g.heads) for g in plan.groups] == [1] * HEADS
    else:
        assert len(plan.groups) > len(whole.groups)
        assert all(len(g.heads) <= 2 for g in plan.groups if g.strip == 7)
    q, k, v = qkv(grid, cls_token, dtype=torch.float64, grad=True)
    ref = reference_attention(q, k, v, gb.dense(0, cls_token))
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=ref.dtype)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            out = tiled_attention(q, k, v, gb, 0, cls_token, options=options)
            check(out.detach(), ref.detach(), torch.float64)
            for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), want):
                torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    finally:
        torch.set_num_threads(before)


def test_plans_skip_what_the_heads_cannot_see():
    """On a whole-frame grid the plan computes little more than the visible pairs
    (lh180 ~2/3 of the dense pairs, lh90 ~1/2, lh45 ~5/12)."""
    grid = (64, 128)
    for name, most in (('lh180', 0.70), ('lh90', 0.56), ('lh45', 0.50)):
        computed, visible = plan_tiles(grid_bias(name, grid).visible[0], grid).fractions()
        assert visible < computed <= most, (name, computed, visible)


def test_a_wedge_plan_has_empty_queries_and_merges():
    """The paths of partial merges and of queries that see nothing of a call are taken
    (so that the tests above exercise them)."""
    plan = plan_tiles(grid_bias('lh45', (8, 12)).visible[0], (8, 12), FINE)
    calls = [c for g in plan.groups for c in g.calls]
    assert any(c.empty is not None for c in calls)
    assert any(not c.first for c in calls) and any(c.first for c in calls)


def test_plans_are_cached_and_shared_by_layers_with_one_field_of_view():
    grid = (6, 8)
    plans = {}
    gb = grid_bias('lh90', grid)
    q, k, v = qkv(grid, True)
    for layer in range(DEPTH):
        tiled_attention(q, k, v, gb, layer, True, plans=plans)
    assert len(plans) == 1
    assert get_plan(gb, 2, cache=plans) is get_plan(gb, 0, cache=plans)
    per_layer = grid_bias('per_layer', grid)
    assert len({id(get_plan(per_layer, layer, cache=plans)) for layer in range(DEPTH)}) == 3


def test_options_are_validated():
    with pytest.raises(ValueError, match='rows must be a positive int'):
        TileOptions(rows=0)
    with pytest.raises(ValueError, match='strips must be positive ints'):
        TileOptions(strips=(0,))
    with pytest.raises(ValueError, match='max_table_bytes must be a positive int'):
        TileOptions(max_table_bytes=0)


# ----------------------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------------------
def test_unsupported_uses_are_refused_by_name():
    check_cpu_refusals(tiled_attention)


# ----------------------------------------------------------------------------------------
# Through the engine and the backbone
# ----------------------------------------------------------------------------------------
def test_engine_backend_tiled_matches_reference():
    eng = LookHereAttentionEngine(CONFIGS['per_layer'], DEPTH, HEADS)
    grid = (7, 5)
    q, k, v = qkv(grid, True)
    for layer in range(DEPTH):
        ref = eng(q, k, v, layer, grid, True, backend='reference')
        check(eng(q, k, v, layer, grid, True, backend='tiled'), ref)
        assert eng.last_backend == 'tiled'
    assert eng.cache_info()['tiled_plans']['size'] == 3


@pytest.mark.usefixtures('without_fused')
def test_auto_picks_tiled_on_cpu_for_large_grids():
    from lookhere_dense.lookhere.engine import TILED_MIN_TOKENS

    eng = LookHereAttentionEngine(CONFIGS['lh90'], DEPTH, HEADS)
    cpu, cuda = torch.device('cpu'), torch.device('cuda')
    assert eng.choose_backend(TILED_MIN_TOKENS, cpu) == 'tiled'
    assert eng.choose_backend(8193, cpu, torch.bfloat16) == 'tiled'
    assert eng.choose_backend(TILED_MIN_TOKENS - 1, cpu) == 'sdpa'  # fits the budget
    assert eng.choose_backend(8193, cpu, dropout_p=0.1) == 'chunked'
    assert eng.choose_backend(8193, cpu, slope_grads=True) == 'chunked'
    assert eng.choose_backend(8193, cuda) != 'tiled'
    # 40 x 40 patches + CLS (a 640 x 640 image at patch 16), training: tiled, no dense
    # cache
    grid = (40, 40)
    q, k, v = qkv(grid, True, batch=1, dim=4, grad=True)
    eng(q, k, v, 0, grid, True).sum().backward()
    assert eng.last_backend == 'tiled' and len(eng.dense) == 0


@pytest.mark.usefixtures('without_fused')
def test_learnable_slopes_train_elsewhere_and_infer_through_tiled():
    """While the slopes train, ``auto`` routes them to a backend that gives the table
    gradients; without autograd it uses ``tiled`` at the current slopes."""
    from lookhere_dense.models.backbones.lookhere_vit import LookHereViT

    model = LookHereViT(
        embed_dims=48,
        num_layers=DEPTH,
        num_heads=HEADS,
        lh_config=dict(head_directions='corners-none', learnable_slopes=True),
    )
    eng, slopes = model.pos_enc.engine, model.pos_enc.slopes
    grid = (32, 32)
    q, k, v = qkv(grid, True, batch=1, dim=4)
    out = eng(q, k, v, 1, grid, True, slopes=slopes)
    assert eng.last_backend != 'tiled'
    out.sum().backward()
    assert slopes.global_log_ratio.grad is not None
    assert slopes.layer_log_ratio[1].grad is not None and slopes.head_log_ratio[1].grad.any()
    with torch.no_grad():
        for p in slopes.parameters():
            p.add_(0.3)  # away from the initial slopes
        ref = eng(q, k, v, 1, grid, True, backend='reference', slopes=slopes)
        check(eng(q, k, v, 1, grid, True, slopes=slopes), ref)
        assert eng.last_backend == 'tiled'


def test_every_direction_type_is_listed():
    try:
        from lookhere_dense.lookhere import DIRECTION_TYPES
    except ImportError:  # pragma: no cover - moved on main
        pytest.skip('DIRECTION_TYPES is not importable from lookhere_dense.lookhere')
    assert sorted(TYPES) == sorted(DIRECTION_TYPES)
