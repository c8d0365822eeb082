"""Caching of the LookHere engine: bounded, keyed by (grid or window, device, dtype),
shared across layers where the data is the same, and never rebuilt by a later forward."""

from __future__ import annotations

import pytest
import torch

from lookhere_dense.checkpoint import decode_extra_state
from lookhere_dense.lookhere import PRESETS, BoundedCache, LookHereAttentionEngine, LookHereConfig
from lookhere_dense.lookhere.cache import tensor_bytes
from lookhere_dense.models.backbones.lookhere_vit import LookHereViT

CPU = torch.device('cpu')


pytestmark = pytest.mark.usefixtures('one_torch_thread')  # tiny tensors: see conftest


# ----------------------------------------------------------------------------------------
# BoundedCache
# ----------------------------------------------------------------------------------------
def test_lru_order_hits_misses_and_bound():
    cache = BoundedCache(2)
    made = []

    def make(x):
        return lambda: made.append(x) or x

    assert cache.get_or_create('a', make(1)) == 1
    assert cache.get_or_create('b', make(2)) == 2
    assert cache.get_or_create('a', make(99)) == 1  # hit: not rebuilt
    cache.get_or_create('c', make(3))  # evicts 'b' (least recent)
    assert list(cache.keys()) == ['a', 'c'] and 'b' not in cache
    assert made == [1, 2, 3]
    assert cache.stats() == dict(size=2, hits=1, misses=3, evictions=1, bytes=0)
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0
    with pytest.raises(ValueError, match='maxsize'):
        BoundedCache(0)
    with pytest.raises(ValueError, match='max_bytes'):
        BoundedCache(2, max_bytes=-1)


def test_byte_bound_evicts_and_never_keeps_an_oversized_value():
    cache = BoundedCache(10, max_bytes=1000)
    cache.get_or_create('a', lambda: torch.zeros(100))  # 400 B
    cache.get_or_create('b', lambda: torch.zeros(100))  # 800 B
    cache.get_or_create('c', lambda: torch.zeros(100))  # 1200 B > 1000: 'a' goes
    assert list(cache.keys()) == ['b', 'c'] and cache.nbytes == 800
    big = cache.get_or_create('d', lambda: torch.zeros(1000))
    assert big.numel() == 1000 and 'd' not in cache and list(cache.keys()) == ['b', 'c']


def test_tensor_bytes_counts_each_storage_once():
    x = torch.zeros(10, 10)
    assert tensor_bytes(x) == 400
    assert tensor_bytes([x, x[1], x.t()]) == 400  # views share the storage
    assert tensor_bytes({'a': x, 'b': torch.zeros(5, dtype=torch.float64)}) == 440

    class Holder:
        def __init__(self):
            self.t = torch.zeros(3, dtype=torch.bool)
            self.fn = lambda: None

    assert tensor_bytes(Holder()) == 3
    assert tensor_bytes(3.0) == 0


# ----------------------------------------------------------------------------------------
# Engine caches
# ----------------------------------------------------------------------------------------
def qkv(grid, cls_token=True, batch=1, heads=12, dtype=torch.float32):
    t = grid[0] * grid[1] + int(cls_token)
    return [torch.randn(batch, heads, t, 8, dtype=dtype) for _ in range(3)]


def test_tables_are_keyed_by_grid_device_and_dtype_and_shared_by_layers():
    eng = LookHereAttentionEngine(PRESETS['lh90'], 4, 12, backend='chunked')
    grid = (5, 6)
    q, k, v = qkv(grid)
    for layer in range(4):
        eng(q, k, v, layer, grid, True)
    assert list(eng.tables.keys()) == [(grid, 'cpu', torch.float32)]
    assert eng.tables.misses == 1 and eng.tables.hits == 3
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    eng(qb, kb, vb, 0, grid, True)
    assert (grid, 'cpu', torch.bfloat16) in eng.tables and eng.tables.misses == 2
    assert len(eng.dense) == 0  # chunked never materialises a dense bias


def test_dense_biases_are_cached_per_layer_and_reused():
    eng = LookHereAttentionEngine(PRESETS['lh45'], 3, 12, backend='sdpa')
    grid = (4, 4)
    q, k, v = qkv(grid)
    first = [eng.dense_bias(layer, grid, True, CPU, torch.float32) for layer in range(3)]
    for _ in range(2):
        for layer in range(3):
            eng(q, k, v, layer, grid, True)
    assert eng.dense.misses == 3 and len(eng.dense) == 3
    for layer in range(3):
        assert eng.dense_bias(layer, grid, True, CPU, torch.float32) is first[layer]
    assert eng.tables.misses == 1  # all layers' dense biases come from one table entry


def test_dense_cache_respects_the_byte_budget():
    eng = LookHereAttentionEngine(PRESETS['lh90'], 2, 12, backend='sdpa', max_dense_mb=0.05)
    grid = (6, 6)  # 12 x 37 x 37 x 4 B = 64 KiB per layer > 50 KiB
    q, k, v = qkv(grid)
    ref = eng(q, k, v, 0, grid, True, backend='reference')
    out = eng(q, k, v, 0, grid, True)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=0)
    assert len(eng.dense) == 0 and eng.dense.nbytes == 0  # built, used, not kept


def test_flex_pieces_are_cached_and_shared():
    eng = LookHereAttentionEngine(
        LookHereConfig(('halves-none', 'halves-none', 'corners-none')), 3, 12, backend='flex'
    )
    grid = (6, 5)
    masks = [eng.block_mask(layer, grid, True, CPU) for layer in range(3)]
    assert masks[0] is masks[1] and masks[2] is not masks[0]
    assert len(eng.block_masks) == 2  # one per head string
    mods = [eng.score_mod(layer, grid, True, CPU) for layer in range(3)]
    assert eng.score_mod(1, grid, True, CPU) is mods[1]  # same function object: no recompile
    assert len({id(m) for m in mods}) == 3
    assert len(eng.orders) == 1  # one token order per grid
    assert eng.flex_order(grid, True, CPU) is eng.flex_order(grid, True, CPU)


def test_reset_drops_everything_and_switches_config():
    eng = LookHereAttentionEngine(PRESETS['lh90'], 2, 12)
    q, k, v = qkv((3, 3))
    eng(q, k, v, 0, (3, 3), True)
    assert len(eng.tables) and len(eng.dense)
    eng.reset(PRESETS['lh45'])
    assert eng.config is PRESETS['lh45']
    assert all(info['size'] == 0 for info in eng.cache_info().values())


def test_caches_stay_bounded_over_many_grids():
    eng = LookHereAttentionEngine(PRESETS['lh180'], 2, 12, cache_size=2)
    for w in range(1, 12):
        q, k, v = qkv((2, w))
        for layer in range(2):
            eng(q, k, v, layer, (2, w), True)
            eng.window_attention(q, k, v, layer, (2, w), 2, True)
    for name, cache in eng._caches().items():
        assert len(cache) <= cache.maxsize, name
    assert eng.tables.evictions > 0 and eng.dense.evictions > 0


# ----------------------------------------------------------------------------------------
# Through the backbone
# ----------------------------------------------------------------------------------------
def tiny(**kw):
    kw = dict(dict(embed_dims=48, num_layers=3, num_heads=12, preset='lh90'), **kw)
    return LookHereViT(**kw).eval()


@pytest.mark.parametrize('backend,window', [('auto', 0), ('chunked', 0), ('auto', 2)])
def test_backbone_forwards_never_rebuild_cached_data(backend, window):
    model = tiny(
        attn_backend=backend,
        window_size=window,
        **(dict(global_attn_indexes=[2]) if window else {}),
    )
    eng = model.pos_enc.engine
    x = torch.randn(2, 3, 80, 112)  # grid 5 x 7: windows of 2 need padding
    with torch.no_grad():
        first = model(x)[0]
        misses = {name: info['misses'] for name, info in eng.cache_info().items()}
        second = model(x)[0]
    assert torch.equal(first, second)
    assert {name: info['misses'] for name, info in eng.cache_info().items()} == misses
    assert misses['tables'] <= 2  # the grid (and the window grid)
    if backend == 'chunked':
        assert misses['dense'] == 0
    elif window:
        assert {k[1] for k in eng.dense.keys() if k[0] != 'window_pad'} == {(2, 2), (5, 7)}
    else:
        assert misses['dense'] == 3  # one per layer, then reused
    # no bias tensor in the state_dict: parameters, plus the config as plain data
    sd = model.state_dict()
    assert set(sd) == {name for name, _ in model.named_parameters()} | {'_extra_state'}
    assert decode_extra_state(sd['_extra_state'])['pos_encoding'] == 'lookhere'


def test_backbone_training_step_with_chunked_backend_matches_sdpa():
    torch.manual_seed(0)
    model = tiny(attn_backend='sdpa', init_values=1.0).train()
    x = torch.randn(2, 3, 48, 64)
    grads = {}
    for backend in ('sdpa', 'chunked'):
        model.pos_enc.engine.backend = backend
        model.zero_grad()
        model(x)[0].square().mean().backward()
        grads[backend] = [p.grad.clone() for p in model.parameters()]
    for a, b in zip(grads['sdpa'], grads['chunked']):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


# ----------------------------------------------------------------------------------------
# inference mode, then training
# ----------------------------------------------------------------------------------------
def test_a_value_first_built_under_inference_mode_is_a_normal_tensor():
    cache = BoundedCache(2)
    with torch.inference_mode():
        made = cache.get_or_create('a', lambda: torch.arange(4))
    assert not made.is_inference()
    assert not cache.get_or_create('a', lambda: None).is_inference()


@pytest.mark.parametrize(
    'backend, pos_encoding',
    [
        ('auto', None),
        ('sdpa', None),
        ('chunked', None),
        ('fused', None),
        ('auto', 'rope2d'),
        ('auto', 'pape'),
        ('auto', 'rope_dinov3'),
        ('auto', 'ledit'),
    ],
)
def test_training_after_inference_mode_on_the_same_grid(backend, pos_encoding):
    """Inference under ``torch.inference_mode()`` first (tools, demos, a user's eval loop),
    then a training step on the same frame size: the caches filled during inference (token
    orders, dense biases, RoPE / PaPE tables) must not hold inference tensors, which
    autograd refuses to save ("Inference tensors cannot be saved for backward": the sdpa
    path's dense bias, flex's token order in the first GPU run)."""
    from lookhere_dense.lookhere import create_model

    arch = dict(img_size=64, patch_size=16, embed_dims=96, num_layers=2, num_heads=12)
    if pos_encoding is None:
        arch.update(preset='lh90', attn_backend=backend)
    else:
        arch.update(pos_encoding=pos_encoding)
    torch.manual_seed(0)
    model = create_model(**arch)
    x = torch.randn(1, 3, 64, 64)
    with torch.inference_mode():
        model(x)
    out = model(x)
    out = out[-1] if isinstance(out, (tuple, list)) else out
    out.float().square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_flex_with_learnable_slopes_reuses_the_index_arrays():
    """A learnable-slopes step builds a fresh ``score_mod`` per layer (the table changes);
    the per-token index arrays around it come from the engine's cache, built once per
    grid (eager flex on CPU: the slopes' gradients, ``q, k, v`` without)."""
    from lookhere_dense.lookhere.slopes import LookHereSlopes

    eng = LookHereAttentionEngine(PRESETS['lh90'], 2, 12, backend='flex', flex_compile=False)
    slopes = LookHereSlopes(eng.config, 2, 12)
    q, k, v = (torch.randn(1, 12, 33, 16) for _ in range(3))
    for _ in range(2):
        for layer in range(2):
            out = eng(q, k, v, layer, (4, 8), True, slopes=slopes)
            out.sum().backward()
    assert all(p.grad is not None for p in slopes.parameters())
    assert eng.cache_info()['flex_indices']['misses'] == 1
    assert eng.cache_info()['flex_indices']['hits'] >= 4
