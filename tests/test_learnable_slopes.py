"""Learnable LookHere slopes (``lh_config=dict(..., learnable_slopes=True)``): the config key,
exact initialisation, gradients through every backend (checked against finite differences
and across backends), caches, checkpoints (round trip, official / fixed-slope files into a
learnable model, learned slopes into a fixed one), layer decay, the logging hook, the plot,
the study's way in, and a tiny training run through the real mmengine Runner that moves
the slopes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from test_fused import requires_fused
from test_layer_decay import optim_cfg

from lookhere_dense.checkpoint import decode_extra_state, load_state_dict_strict
from lookhere_dense.errors import CheckpointError
from lookhere_dense.lookhere import (
    LookHereAttentionEngine,
    LookHereConfig,
    LookHereSlopes,
    resolve_lh_config,
)
from lookhere_dense.lookhere.attention import flex as flex_module
from lookhere_dense.lookhere.config import layer_slopes
from lookhere_dense.lookhere.flex import flex_slope_grads_available
from lookhere_dense.lookhere.loading import load_model_weights
from lookhere_dense.lookhere.weights import save_backbone_checkpoint, vit_key_hints
from lookhere_dense.models.backbones import LookHereViT

REPO = Path(__file__).resolve().parents[1]
TINY = dict(img_size=32, patch_size=8, embed_dims=48, num_layers=3, num_heads=12, init_values=0.1)
DEPTH, HEADS = 3, 12
CPU = torch.device('cpu')

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def backbone(lh_config=None, **kwargs) -> LookHereViT:
    torch.manual_seed(0)
    model = LookHereViT(**{**TINY, **kwargs}, lh_config=lh_config)
    model.init_weights()
    return model


def learnable(config: LookHereConfig) -> LookHereConfig:
    return resolve_lh_config({**config.to_dict(), 'learnable_slopes': True})


def perturb(slopes: LookHereSlopes, seed: int = 1, scale: float = 0.3) -> None:
    """Move every log-ratio away from 0 (a 'trained' state)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in slopes.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)


# ----------------------------------------------------------------------------------------
# The config key
# ----------------------------------------------------------------------------------------
def test_config_key_is_validated_and_fixed_configs_write_what_they_wrote():
    fixed = resolve_lh_config(preset='lh45')
    assert fixed.learnable_slopes is False
    assert 'learnable_slopes' not in fixed.to_dict()  # fixed-slope files are unchanged
    cfg = resolve_lh_config({'learnable_slopes': True}, preset='lh45')
    assert cfg.learnable_slopes and cfg.layer_slopes == (2.0, 0.5)
    assert cfg.to_dict()['learnable_slopes'] is True
    assert resolve_lh_config(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="learnable_slopes must be True or False, got 'yes'"):
        LookHereConfig(learnable_slopes='yes')
    with pytest.raises(ValueError, match=r'needs slopes > 0.*global_slope=0\.0'):
        LookHereConfig(global_slope=0.0, learnable_slopes=True)
    with pytest.raises(ValueError, match=r'needs slopes > 0.*layer_slopes=\[1\.0, 0\.0\]'):
        LookHereConfig(layer_slopes=(1.0, 0.0), learnable_slopes=True)
    LookHereConfig(global_slope=0.0)  # fixed slopes may still be 0


# ----------------------------------------------------------------------------------------
# Step 0 is the fixed-slope model
# ----------------------------------------------------------------------------------------
CONFIGS = {
    'lh45': resolve_lh_config(preset='lh45'),
    'center_sqrt': LookHereConfig(
        'corners-center', 0.7, (1.3, 0.2), distance='sqrt', bias_rounding='none'
    ),  # slopes with no short binary form
    'odd_bf16': LookHereConfig('halves-none', 0.9, (1.7, 0.3)),
    'fill_max': LookHereConfig('triangles-none', fill_with='max', bias_rounding='none'),
    'fill_zero': LookHereConfig('halves-none1zero3', fill_with='zero', distance='square'),
    'per_layer': LookHereConfig(('halves-none', 'eighths1-eighths2-none', 'diagonals-center')),
}


@pytest.mark.parametrize('name', sorted(CONFIGS))
@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
def test_initial_tables_equal_the_fixed_tables_bit_for_bit(name, dtype):
    cfg = learnable(CONFIGS[name])
    eng = LookHereAttentionEngine(cfg, DEPTH, HEADS)
    slopes = LookHereSlopes(cfg, DEPTH, HEADS)
    fixed = eng.grid_bias((5, 4), CPU, dtype)
    for layer in range(DEPTH):
        got = eng.slope_bias(layer, (5, 4), CPU, dtype, slopes)
        assert torch.equal(got.table[0], fixed.table[layer])
        assert torch.equal(got.visible[0], fixed.visible[layer])
        if fixed.key_term is not None and 'center' in cfg.layer_direction(layer):
            assert torch.equal(got.key_term[0], fixed.key_term[layer])
        for cls in (False, True):
            assert torch.equal(got.dense(0, cls), fixed.dense(layer, cls))


def test_initial_model_equals_the_fixed_model():
    fixed = backbone(
        dict(head_directions='corners-center'), window_size=2, window_block_indexes=[1]
    )
    model = backbone(
        dict(head_directions='corners-center', learnable_slopes=True),
        window_size=2,
        window_block_indexes=[1],
    )
    assert model.load_state_dict(fixed.state_dict(), strict=False).missing_keys == [
        n for n, _ in model.named_parameters() if '.slopes.' in n
    ]
    x = torch.randn(2, 3, 40, 24)
    for backend in ('reference', 'sdpa', 'chunked', 'flex'):
        for m in (fixed, model):
            m.pos_enc.engine.backend = backend
        with torch.no_grad():  # the same kernels: the same bits
            assert torch.equal(model(x)[0], fixed(x)[0]), backend
        if backend != 'flex':  # with grad, SDPA takes another kernel for a mask with grad
            torch.testing.assert_close(model(x)[0], fixed(x)[0], atol=1e-5, rtol=0)


# ----------------------------------------------------------------------------------------
# Gradients
# ----------------------------------------------------------------------------------------
def attention_case(cfg: LookHereConfig, grid=(4, 5), cls=True, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1] + int(cls)
    q, k, v = (torch.randn(2, HEADS, n, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    weight = torch.randn(2, HEADS, n, 8, generator=gen, dtype=torch.float64)
    slopes = LookHereSlopes(cfg, DEPTH, HEADS).double()
    perturb(slopes)
    return q, k, v, weight, slopes


def slope_grads(eng, slopes, q, k, v, weight, grid, cls, backend=None, window=0):
    slopes.zero_grad()
    loss = 0
    for layer in range(DEPTH):
        if window:
            out = eng.window_attention(q, k, v, layer, grid, window, cls, slopes=slopes)
        else:
            out = eng(q, k, v, layer, grid, cls, backend=backend, slopes=slopes)
        loss = loss + (out * weight).sum()
    loss.backward()
    return {n: p.grad.clone() for n, p in slopes.named_parameters()}


@pytest.mark.parametrize('name', ['lh45', 'center_sqrt', 'fill_max', 'per_layer'])
def test_gradients_reach_every_slope_and_agree_across_backends(name):
    cfg = learnable(resolve_lh_config({**CONFIGS[name].to_dict(), 'bias_rounding': 'none'}))
    grid, cls = (4, 5), True
    eng = LookHereAttentionEngine(cfg, DEPTH, HEADS, block_size=3)
    q, k, v, weight, slopes = attention_case(cfg, grid, cls)
    for t in (q, k, v):
        t.requires_grad_(True)
    ref = slope_grads(eng, slopes, q, k, v, weight, grid, cls, 'reference')
    for pname, g in ref.items():  # every slope moves the loss
        assert g.abs().min() > 0, pname
    for backend in ('sdpa', 'chunked'):
        got = slope_grads(eng, slopes, q, k, v, weight, grid, cls, backend)
        for pname in ref:
            torch.testing.assert_close(
                got[pname], ref[pname], rtol=1e-9, atol=1e-12, msg=f'{backend} {pname}'
            )
    # flex: PyTorch's flex_attention has no CPU backward for q/k/v, but it gives captured
    # tensors (the slope table) gradients in eager mode: check those with fixed q/k/v
    q0, k0, v0 = (t.detach() for t in (q, k, v))
    ref0 = slope_grads(eng, slopes, q0, k0, v0, weight, grid, cls, 'reference')
    flex = slope_grads(eng, slopes, q0, k0, v0, weight, grid, cls, 'flex')
    for pname in ref0:
        torch.testing.assert_close(
            flex[pname],
            ref0[pname],
            rtol=1e-5,
            atol=1e-6,  # float32
            msg=f'flex {pname}',
        )


@requires_fused
@pytest.mark.parametrize('name', ['lh45', 'center_sqrt', 'fill_max', 'per_layer'])
def test_fused_gives_the_table_and_the_key_term_their_gradients(name):
    """The fused kernel's backward adds each score's dS to the table entry (and, for
    ``center`` heads, the key-term entry) its bias came from: in float64 the slope
    gradients equal the reference's, with q, k, v trained beside the slopes and with them
    fixed (only the table needs a gradient), and so do q, k, v's own."""
    cfg = learnable(resolve_lh_config({**CONFIGS[name].to_dict(), 'bias_rounding': 'none'}))
    grid, cls = (4, 5), True
    eng = LookHereAttentionEngine(cfg, DEPTH, HEADS)
    q, k, v, weight, slopes = attention_case(cfg, grid, cls)
    for trained in (True, False):
        x = [t.detach().requires_grad_(trained) for t in (q, k, v)]
        ref = slope_grads(eng, slopes, *x, weight, grid, cls, 'reference')
        ref_x = [t.grad for t in x] if trained else []
        for t in x:
            t.grad = None
        got = slope_grads(eng, slopes, *x, weight, grid, cls, 'fused')
        assert eng.last_backend == 'fused'
        for pname in ref:
            torch.testing.assert_close(
                got[pname], ref[pname], rtol=1e-9, atol=1e-12, msg=f'{pname}, q/k/v {trained}'
            )
        for t, want in zip(x, ref_x):
            torch.testing.assert_close(t.grad, want, rtol=1e-9, atol=1e-12)


def test_gradients_equal_finite_differences():
    """The gradient of the slopes against central differences of the loss (float64, no
    rounding): an independent check of the differentiable gather and table."""
    cfg = learnable(LookHereConfig('corners-center', 0.8, (1.5, 0.5), bias_rounding='none'))
    grid, cls = (3, 4), True
    eng = LookHereAttentionEngine(cfg, DEPTH, HEADS)
    q, k, v, weight, slopes = attention_case(cfg, grid, cls)
    grads = slope_grads(eng, slopes, q, k, v, weight, grid, cls, 'reference')

    def loss() -> float:
        with torch.no_grad():
            return sum(
                float(
                    (
                        eng(q, k, v, layer, grid, cls, backend='reference', slopes=slopes) * weight
                    ).sum()
                )
                for layer in range(DEPTH)
            )

    eps = 1e-6
    params = dict(slopes.named_parameters())
    for pname, index in [
        ('global_log_ratio', ()),
        ('layer_log_ratio.1', ()),
        ('head_log_ratio.0', (2,)),
        ('head_log_ratio.2', (9,)),
        ('head_log_ratio.2', (1,)),
    ]:
        p = params[pname]
        with torch.no_grad():
            p[index] += eps
            up = loss()
            p[index] -= 2 * eps
            down = loss()
            p[index] += eps
        assert grads[pname][index].item() == pytest.approx(
            (up - down) / (2 * eps), rel=1e-5, abs=1e-9
        ), pname


def test_window_attention_gradients_equal_the_dense_definition():
    """Window blocks: the window-sized bias at the current slopes, with grad."""
    cfg = learnable(CONFIGS['lh45'])
    grid, ws = (4, 4), 2
    eng = LookHereAttentionEngine(cfg, DEPTH, HEADS)
    q, k, v, weight, slopes = attention_case(cfg, grid, cls=False)
    got = slope_grads(eng, slopes, q, k, v, weight, grid, False, window=ws)
    # the same windows by hand: each 2x2 window is a 2x2 grid, bias of that grid
    slopes.zero_grad()
    loss = 0

    def part(t):
        return (
            t.view(2, HEADS, 2, ws, 2, ws, 8)
            .permute(0, 2, 4, 1, 3, 5, 6)
            .reshape(8, HEADS, ws * ws, 8)
        )

    for layer in range(DEPTH):
        out = eng(
            part(q), part(k), part(v), layer, (ws, ws), False, backend='reference', slopes=slopes
        )
        loss = loss + (out * part(weight)).sum()
    loss.backward()
    for pname, p in slopes.named_parameters():
        torch.testing.assert_close(got[pname], p.grad, rtol=1e-9, atol=1e-12, msg=pname)
        assert got[pname].abs().min() > 0, pname


def test_bfloat16_rounding_passes_gradients_straight_through():
    """Forward: the official bf16-rounded bias; backward: the gradient of the unrounded
    one at the rounded point (straight-through), close to the unrounded model's."""
    base = CONFIGS['lh45']
    grads = {}
    for rounding in ('bfloat16', 'none'):
        cfg = learnable(resolve_lh_config({**base.to_dict(), 'bias_rounding': rounding}))
        eng = LookHereAttentionEngine(cfg, DEPTH, HEADS)
        q, k, v, weight, slopes = attention_case(cfg, (4, 4), True)
        grads[rounding] = slope_grads(eng, slopes, q, k, v, weight, (4, 4), True, 'sdpa')
    for pname, g in grads['none'].items():  # (the rounded forward moves them a little)
        assert grads['bfloat16'][pname].abs().min() > 0
        torch.testing.assert_close(grads['bfloat16'][pname], g, rtol=0.1, atol=1e-3)


def test_zero_heads_learn_nothing_and_blocked_keys_stay_blocked():
    cfg = learnable(LookHereConfig('halves-none1zero3'))
    eng = LookHereAttentionEngine(cfg, 1, HEADS)
    slopes = LookHereSlopes(cfg, 1, HEADS).double()
    gen = torch.Generator().manual_seed(0)
    q, k, v, w = (
        torch.randn(1, HEADS, 10, 8, generator=gen, dtype=torch.float64) for _ in range(4)
    )
    (eng(q, k, v, 0, (3, 3), True, backend='chunked', slopes=slopes) * w).sum().backward()
    g = slopes.head_log_ratio[0].grad
    # heads 8-11: none1zero3 = one 'none' head, three 'zero' heads (no distance penalty)
    assert (g[:9] != 0).all() and (g[9:] == 0).all() and torch.isfinite(g).all()
    perturb(slopes, scale=2.0)
    table = eng.slope_bias(0, (3, 3), CPU, torch.float64, slopes).table[0]
    assert torch.equal(
        torch.isneginf(table), torch.isneginf(eng.grid_bias((3, 3), CPU, torch.float64).table[0])
    )


def test_flex_is_guarded_where_torch_cannot_train_its_table(monkeypatch):
    assert flex_slope_grads_available('2.6.0') and not flex_slope_grads_available('2.5.1')
    cfg = learnable(CONFIGS['lh45'])
    eng = LookHereAttentionEngine(cfg, DEPTH, HEADS, max_dense_mb=0)
    assert eng.choose_backend(400, torch.device('cuda'), slope_grads=True) == 'flex'
    monkeypatch.setattr(flex_module, 'flex_slope_grads_available', lambda: False)
    assert eng.choose_backend(400, torch.device('cuda'), slope_grads=True) == 'chunked'
    assert eng.choose_backend(400, torch.device('cuda'), slope_grads=False) == 'flex'
    q, k, v, _, slopes = attention_case(cfg, (2, 2), False)
    with pytest.raises(ValueError, match='cannot train learnable LookHere slopes with torch'):
        eng(q, k, v, 0, (2, 2), False, backend='flex', slopes=slopes)
    with torch.no_grad():  # evaluation needs no gradients: flex runs
        eng(q, k, v, 0, (2, 2), False, backend='flex', slopes=slopes)


@pytest.mark.skipif(
    os.environ.get('LOOKHERE_SLOW') != '1',
    reason='compiles flex_attention on CPU (~10 s); set LOOKHERE_SLOW=1',
)
def test_compiled_flex_reuses_one_kernel_while_the_slopes_change():
    """The CUDA code path (compiled flex) on CPU, without gradients (the CPU kernel has no
    backward): every call builds a fresh score_mod around the current table, and the one
    compiled kernel serves every layer and every slope update (no recompilation)."""
    import torch._dynamo

    cfg = learnable(resolve_lh_config(dict(head_directions='corners-none', bias_rounding='none')))
    eng = LookHereAttentionEngine(cfg, 2, HEADS, flex_compile=True)
    q, k, v, _, slopes = attention_case(cfg, (8, 8), True)
    q, k, v = (t.float() for t in (q, k, v))
    slopes.float()
    with torch.no_grad():
        for step in range(4):
            perturb(slopes, seed=step)
            ref = eng(q, k, v, step % 2, (8, 8), True, backend='reference', slopes=slopes)
            with torch._dynamo.config.patch(error_on_recompile=step > 0):
                out = eng(q, k, v, step % 2, (8, 8), True, backend='flex', slopes=slopes)
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    slopes.zero_grad()
    with pytest.raises(ValueError, match='compiled flex_attention cannot train'):
        eng(q, k, v, 0, (8, 8), True, backend='flex', slopes=slopes)


def test_activation_checkpointing_gives_the_same_gradients():
    grads = []
    for with_cp in (False, True):
        model = backbone(dict(learnable_slopes=True), with_cp=with_cp)
        perturb(model.pos_enc.slopes)
        model.train()
        model(torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3)))[
            0
        ].square().mean().backward()
        grads.append({n: p.grad for n, p in model.pos_enc.slopes.named_parameters()})
    for pname, g in grads[0].items():
        assert g.abs().sum() > 0
        torch.testing.assert_close(grads[1][pname], g, rtol=1e-5, atol=1e-9)


# ----------------------------------------------------------------------------------------
# Caches
# ----------------------------------------------------------------------------------------
def test_a_changed_slope_changes_the_next_forward_and_fixed_slopes_keep_their_caches():
    x = torch.randn(1, 3, 32, 24)
    model = backbone(dict(learnable_slopes=True)).eval()
    fixed = backbone().eval()
    for backend in ('sdpa', 'chunked'):
        model.pos_enc.engine.backend = fixed.pos_enc.engine.backend = backend
        with torch.no_grad():
            before = model(x)[0]
            model.pos_enc.slopes.head_log_ratio[1][3] += 0.5
            after = model(x)[0]
            model.pos_enc.slopes.head_log_ratio[1][3] -= 0.5
            again = model(x)[0]
        assert not torch.allclose(before, after), backend
        assert torch.equal(before, again), backend
    info = model.pos_enc.engine.cache_info()
    assert info['dense']['size'] == info['tables']['size'] == 0  # nothing slope-dependent
    assert info['distances']['hits'] > 0  # the slope-free tables are reused
    with torch.no_grad():
        fixed.pos_enc.engine.backend = 'sdpa'
        fixed(x)
        first = fixed.pos_enc.engine.cache_info()
        fixed(x)
        second = fixed.pos_enc.engine.cache_info()
    assert second['dense']['hits'] - first['dense']['hits'] == DEPTH
    assert second['dense']['misses'] == first['dense']['misses']
    assert second['distances']['size'] == 0  # the fixed path never builds them


# ----------------------------------------------------------------------------------------
# Checkpoints
# ----------------------------------------------------------------------------------------
def test_state_dict_round_trip_restores_the_learned_slopes(tmp_path):
    src = backbone(dict(head_directions='corners-none', learnable_slopes=True))
    perturb(src.pos_enc.slopes)
    sd = src.state_dict()
    assert decode_extra_state(sd['_extra_state'])['lh_config']['learnable_slopes'] is True
    assert sd['pos_enc.slopes.head_log_ratio.2'].shape == (HEADS,)
    dst = backbone(dict(learnable_slopes=True))  # default (lh180) config: gives way
    report = load_state_dict_strict(dst, sd, 'memory')
    assert report['from_config'] == [] and report['missing'] == []
    assert dst.lh_config == src.lh_config
    for (n, a), (_, b) in zip(
        src.pos_enc.slopes.named_parameters(), dst.pos_enc.slopes.named_parameters()
    ):
        assert torch.equal(a, b), n
    x = torch.randn(1, 3, 24, 32)
    with torch.no_grad():
        assert torch.equal(src.eval()(x)[0], dst.eval()(x)[0])
    torch.save({'state_dict': sd}, tmp_path / 'whole.pth')  # tools/test.py's loader
    again = backbone(dict(learnable_slopes=True))
    load_model_weights(again, str(tmp_path / 'whole.pth'))
    assert torch.equal(
        again.pos_enc.slopes.values()['effective'], src.pos_enc.slopes.values()['effective']
    )


def test_official_file_loads_into_a_learnable_model(official_tiny):
    path, io = official_tiny.path, official_tiny.io
    model = LookHereViT(
        **official_tiny.vit_kwargs,
        lh_config=dict(learnable_slopes=True),
        init_cfg=dict(type='Pretrained', checkpoint=str(path)),
    )
    perturb(model.pos_enc.slopes)  # whatever they were: the file's config wins
    report = model.load_pretrained(str(path))
    assert report['from_config'] == sorted(
        n for n, _ in model.named_parameters() if '.slopes.' in n
    )
    assert model.lh_config.learnable_slopes and model.lh_config.head_directions == 'halves-none'
    file_cfg = resolve_lh_config(torch.load(path, weights_only=True)['config'])
    assert torch.equal(
        model.pos_enc.slopes.values()['layer'],
        torch.tensor(layer_slopes(file_cfg, io['model']['depth']), dtype=torch.float64),
    )
    case = io['cases']['128x96']
    with torch.no_grad():
        feats = model.eval().forward_features(case['input'])
    torch.testing.assert_close(feats, case['forward_features'], atol=1e-4, rtol=0)


def test_fixed_slope_file_initialises_the_slopes_from_its_config(tmp_path):
    src = backbone(dict(head_directions='eighths1-eighths2-none', layer_slopes=(2.0, 0.5)))
    path = tmp_path / 'lh45.pth'
    save_backbone_checkpoint(str(path), src.state_dict(), src.lh_config.to_dict(), 'test')
    model = LookHereViT(
        **TINY,
        lh_config=dict(learnable_slopes=True),
        init_cfg=dict(type='Pretrained', checkpoint=str(path)),
    )
    model.init_weights()
    assert model.lh_config == learnable(src.lh_config)
    assert torch.equal(
        model.pos_enc.slopes.values()['effective'], model.pos_enc.slopes.configured()['effective']
    )
    # a whole-model file (tools/test.py, --resume) without slopes: the same
    torch.save({'state_dict': src.state_dict()}, tmp_path / 'whole.pth')
    again = backbone(dict(learnable_slopes=True))
    perturb(again.pos_enc.slopes)
    load_model_weights(again, str(tmp_path / 'whole.pth'))
    assert again.lh_config == learnable(src.lh_config)
    assert all((p == 0).all() for p in again.pos_enc.slopes.parameters())
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(again.eval()(x)[0], src.eval()(x)[0])
    # weights without any LookHere config (a timm-style state_dict): the model's own
    plain = {k: v for k, v in src.state_dict().items() if k != '_extra_state'}
    perturb(again.pos_enc.slopes)
    report = load_state_dict_strict(again, plain, 'timm-like')
    assert len(report['from_config']) == 1 + 2 * DEPTH
    assert all((p == 0).all() for p in again.pos_enc.slopes.parameters())


def test_only_whole_slope_groups_may_be_missing():
    src = backbone(dict(learnable_slopes=True))
    sd = src.state_dict()
    del sd['pos_enc.slopes.head_log_ratio.1']
    with pytest.raises(
        CheckpointError,
        match=r'lacks backbone parameters.*'
        r'pos_enc\.slopes\.head_log_ratio\.1',
    ):
        load_state_dict_strict(backbone(dict(learnable_slopes=True)), sd, 'f.pth', what='backbone')
    sd = backbone().state_dict()  # fixed file: the slopes may be missing, nothing else
    del sd['blocks.0.norm1.weight']
    with pytest.raises(
        CheckpointError,
        match=r"lacks backbone parameters.*\['blocks\.0\."
        r"norm1\.weight'\]",
    ):
        load_state_dict_strict(backbone(dict(learnable_slopes=True)), sd, 'f.pth', what='backbone')


def test_learned_slopes_into_a_fixed_model_name_the_key_to_set(tmp_path):
    src = backbone(dict(learnable_slopes=True))
    perturb(src.pos_enc.slopes)
    path = tmp_path / 'learned.pth'
    save_backbone_checkpoint(str(path), src.state_dict(), src.lh_config.to_dict(), 'test')
    key = r'model\.backbone\.lh_config\.learnable_slopes=True'
    for strict in (True, False):
        fixed = LookHereViT(
            **TINY, init_cfg=dict(type='Pretrained', checkpoint=str(path), strict=strict)
        )
        with pytest.raises(CheckpointError, match=key):
            fixed.init_weights()
    torch.save({'state_dict': src.state_dict()}, tmp_path / 'whole.pth')
    with pytest.raises(CheckpointError, match=key):
        load_model_weights(backbone(), str(tmp_path / 'whole.pth'))
    with pytest.raises(CheckpointError, match=key):
        load_model_weights(backbone(), str(tmp_path / 'whole.pth'), strict=False)


def test_alibi2d_slopes_can_be_learned_too():
    model = backbone(dict(learnable_slopes=True), pos_encoding='alibi2d')
    assert model.lh_config.head_directions == 'none' and model.pos_enc.slopes is not None
    model(torch.randn(1, 3, 16, 16))[0].sum().backward()
    assert model.pos_enc.slopes.global_log_ratio.grad.abs() > 0


# ----------------------------------------------------------------------------------------
# Layer decay, study, plot, and a tiny training run
# ----------------------------------------------------------------------------------------
def test_layer_decay_keeps_slopes_out_of_weight_decay_with_their_layer_ids():
    from mmengine.optim import build_optim_wrapper

    model = backbone(dict(learnable_slopes=True))
    wrapper = build_optim_wrapper(model, optim_cfg(num_layers=DEPTH, decay_rate=0.5))
    where = {name: g for g in wrapper.optimizer.param_groups for name in g['param_names']}
    expect = {'pos_enc.slopes.global_log_ratio': DEPTH + 1}
    for l in range(DEPTH):
        expect[f'pos_enc.slopes.layer_log_ratio.{l}'] = l + 1
        expect[f'pos_enc.slopes.head_log_ratio.{l}'] = l + 1
    for name, layer in expect.items():
        assert where[name]['layer_id'] == layer, name
        assert where[name]['weight_decay'] == 0.0, name
        assert where[name]['lr'] == pytest.approx(1e-3 * 0.5 ** (DEPTH + 1 - layer))
    assert where['blocks.1.attn.qkv.weight']['weight_decay'] == 0.05


def test_the_study_reaches_the_option_through_cfg_options():
    from research.study.encodings import backbone_for

    cfg = Config.fromfile(str(REPO / 'configs' / 'study' / 'relational_vit_tiny.py'))
    cfg.merge_from_dict({'model.backbone.lh_config.learnable_slopes': True})
    spec = backbone_for(cfg.model.backbone.to_dict(), 'lookhere')
    model = LookHereViT(**{k: v for k, v in spec.items() if k != 'type'})
    assert model.lh_config.learnable_slopes and model.lh_config.head_directions == 'halves-none'
    assert model.pos_enc.slopes is not None
    # the baselines of the same study drop it with the rest of the LookHere config
    assert 'lh_config' not in backbone_for(cfg.model.backbone.to_dict(), 'rope2d')


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A 2-layer Segmenter with learnable slopes, 6 iterations through the real Runner
    (layer decay, the slope logger, one validation, a checkpoint)."""
    from mmengine.runner import Runner

    from research.datasets.synthetic_seg import make_ade20k_like

    root = tmp_path_factory.mktemp('slopes')
    data = make_ade20k_like(root / 'data', num_train=4, num_val=1, short_side=(64, 80))
    cfg = Config.fromfile(str(REPO / 'configs' / 'segmenter_lookhere_vit-t_tiny-ade.py'))
    cfg.merge_from_dict(
        {
            'model.backbone.num_layers': 2,
            'model.backbone.embed_dims': 96,
            'model.backbone.lh_config': dict(learnable_slopes=True),
            'model.decode_head.in_channels': 96,
            'model.decode_head.channels': 96,
            'model.decode_head.embed_dims': 96,
            'model.decode_head.num_heads': 2,
            'train_dataloader.batch_size': 2,
            'train_dataloader.num_workers': 0,
            'train_dataloader.persistent_workers': False,
            'val_dataloader.num_workers': 0,
            'val_dataloader.persistent_workers': False,
            'test_dataloader.num_workers': 0,
            'test_dataloader.persistent_workers': False,
            'train_cfg.max_iters': 6,
            'train_cfg.val_interval': 6,
            'default_hooks.logger.interval': 2,
            # the tools' LoggerHook (a subclass): the slope logger follows its interval too
            'default_hooks.logger.type': 'ProgressLoggerHook',
            'default_hooks.checkpoint.interval': 6,
            'param_scheduler': [],
            'optim_wrapper': dict(
                type='OptimWrapper',
                constructor=('LookHereLayerDecayOptimizerConstructor'),
                optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.05),
                paramwise_cfg=dict(num_layers=2, decay_rate=0.9),
            ),
            'custom_hooks': [dict(type='LookHereSlopeLoggerHook')],
        }
    )
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = str(data)
    cfg.work_dir = str(root / 'work')
    cfg.visualizer.pop('name', None)
    runner = Runner.from_cfg(cfg)
    runner.train()
    return dict(runner=runner, work=root / 'work', ckpt=root / 'work' / 'iter_6.pth')


def test_a_tiny_training_run_moves_the_slopes_and_logs_them(trained):
    slopes = trained['runner'].model.backbone.pos_enc.slopes
    moved = [p.abs().max().item() for p in slopes.parameters()]
    assert min(moved) > 1e-3, moved  # every slope tensor was trained
    values = slopes.values()
    assert not torch.allclose(values['effective'], slopes.configured()['effective'])
    work = trained['work']
    record = json.loads((work / 'lookhere_slopes.json').read_text())
    assert record['iter'] == 6 and record['when'].startswith('end of training')
    logged = record['slopes']['backbone.pos_enc.slopes']
    torch.testing.assert_close(
        torch.tensor(logged['effective'], dtype=torch.float64), values['effective']
    )
    log = next(work.glob('*/*.log')).read_text()
    assert 'LookHere slopes, iter 2 (backbone.pos_enc.slopes): global ' in log
    assert 'validation at iter 6' in log and 'effective slope per head' in log
    scalars = [
        json.loads(line)
        for line in next(work.glob('*/vis_data/scalars.json')).read_text().splitlines()
    ]
    steps = {s['step'] for s in scalars if 'lookhere_slopes/global' in s}
    assert {2, 4, 6} <= steps and any('lookhere_slopes/l1_h11' in s for s in scalars)


def test_training_adds_the_slope_logger_when_slopes_learn(tmp_path):
    """tools/train.py (build_train_config) adds LookHereSlopeLoggerHook for
    ``lh_config.learnable_slopes=True``, once, and keeps the config's own."""
    from tiny_seg import ADE_CFG, SHRINK, options

    from lookhere_dense.apis.train import build_train_config

    def hooks(**extra) -> list:
        cfg, _ = build_train_config(
            ADE_CFG,
            work_dir=str(tmp_path),
            check_data=False,
            cfg_options={**options(*SHRINK), **extra},
        )
        return [h for h in cfg.custom_hooks if h['type'] == 'LookHereSlopeLoggerHook']

    assert hooks() == []
    assert hooks(**{'model.backbone.lh_config': dict(learnable_slopes=False)}) == []
    learn = {
        'model.backbone.lh_config': dict(head_directions='corners-none', learnable_slopes=True)
    }
    assert hooks(**learn) == [dict(type='LookHereSlopeLoggerHook')]
    own = dict(type='LookHereSlopeLoggerHook', interval=3)
    assert hooks(**learn, custom_hooks=[own]) == [own]


def test_plot_draws_the_learned_slopes_of_a_checkpoint(trained, tmp_path):
    from research.head_plots import draw_learned_slopes

    out = tmp_path / 'slopes.png'
    info = draw_learned_slopes(str(trained['ckpt']), str(out))
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    slopes = trained['runner'].model.backbone.pos_enc.slopes
    torch.testing.assert_close(info['learned']['effective'], slopes.values()['effective'])
    assert info['depth'] == 2 and info['num_heads'] == 12
    assert 'effective slope per head' in info['table'] and '(x' in info['table']
    # the tool's flag, as a user runs it
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS='1')
    res = subprocess.run(
        [
            sys.executable,
            'tools/plot_heads.py',
            '--checkpoint',
            str(trained['ckpt']),
            '--out',
            str(tmp_path / 'tool.png'),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert 'global ' in res.stdout and (tmp_path / 'tool.png').stat().st_size > 10_000
    # a fixed-slope file draws its configured slopes
    src = backbone()
    fixed = tmp_path / 'fixed.pth'
    save_backbone_checkpoint(str(fixed), src.state_dict(), src.lh_config.to_dict(), 'test')
    assert draw_learned_slopes(str(fixed), str(out))['learned'] is None


def test_trained_checkpoint_into_a_fixed_model_is_refused(trained):
    model = trained['runner'].model
    cfg = trained['runner'].cfg.model.backbone.copy()
    cfg.pop('type')
    cfg['lh_config'] = None
    fixed = LookHereViT(**cfg)
    sd = {
        k[len('backbone.') :]: v
        for k, v in model.state_dict().items()
        if k.startswith('backbone.')
    }
    with pytest.raises(CheckpointError, match=r'learnable_slopes=True'):
        load_state_dict_strict(fixed, sd, str(trained['ckpt']), hints=vit_key_hints)
