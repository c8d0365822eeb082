"""``torch.jit.trace`` and mmengine's FLOP counter (which traces with it) on LookHere ViTs:
the grid comes from the traced input as plain ints (the graph is specialised to the traced
size, as timm's ViT is), the cached bias tables enter the graph as constants, and
``auto`` skips the backends the tracer cannot record. Tiny models, a few seconds."""

from __future__ import annotations

import warnings

import pytest
import torch

from lookhere_dense.lookhere import create_model
from lookhere_dense.lookhere.bias import build_grid_bias
from lookhere_dense.lookhere.config import PRESETS

TINY = dict(embed_dims=48, num_layers=2, num_heads=12, patch_size=8)


def _flat(outs):
    return [t for o in outs for t in (o if isinstance(o, (list, tuple)) else [o])]


def _trace(model, x):
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # TracerWarnings: the graph is size-specialised
        return torch.jit.trace(model, (x,))


@pytest.mark.parametrize(
    'arch',
    [
        dict(),
        dict(preset='lh45', num_layers=4, window_size=3, window_block_indexes=(0, 2)),
        dict(pos_encoding='rope2d', with_cls_token=False, init_values=None),
        dict(jumbo_tokens=2, with_cls_token=False),
        dict(lh_config=dict(learnable_slopes=True)),
    ],
    ids=['lh180', 'lh45_windows', 'rope2d', 'jumbo', 'learnable_slopes'],
)
def test_traced_model_reproduces_eager_outputs_at_the_traced_size(arch):
    torch.manual_seed(0)
    model = create_model(**{**TINY, **arch}).eval()
    x, other = torch.randn(2, 3, 64, 80), torch.randn(2, 3, 64, 80)
    with torch.no_grad():
        traced = _trace(model, x)  # torch.jit.trace's own check traces twice: one graph
        for inputs in (x, other):  # the graph computes, it did not store x's answer
            for t, e in zip(_flat(traced(inputs)), _flat(model(inputs)), strict=True):
                torch.testing.assert_close(t, e, rtol=0, atol=1e-5)


@pytest.mark.parametrize('backend', ['sdpa', 'chunked', 'tiled', 'reference'])
def test_every_traceable_backend_traces(backend):
    torch.manual_seed(0)
    model = create_model(**TINY, attn_backend=backend).eval()
    x, other = torch.randn(1, 3, 48, 64), torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        traced = _trace(model, x)
        torch.testing.assert_close(traced(other)[0], model(other)[0], rtol=0, atol=1e-5)


def test_auto_skips_the_fused_kernel_under_tracing():
    from lookhere_dense.lookhere.attention.fused import FUSED_MIN_TOKENS, fused_available
    from lookhere_dense.lookhere.engine import UNTRACEABLE

    assert set(UNTRACEABLE) == {'fused', 'flex', 'triton'}
    torch.manual_seed(0)
    model = create_model(**TINY).eval()
    side = 8 * 21  # 441 tokens >= FUSED_MIN_TOKENS: eager auto picks the kernel if built
    assert 21 * 21 >= FUSED_MIN_TOKENS
    x = torch.randn(1, 3, side, side)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter('ignore')
        # check_trace=False: torch.jit.trace's check also runs the model eagerly
        traced = torch.jit.trace(model, (x,), check_trace=False)
        assert model.pos_enc.engine.last_backend not in UNTRACEABLE  # the trace's choice
        expected = model(x)[0]
        if fused_available():
            assert model.pos_enc.engine.last_backend == 'fused'  # eager: the kernel
        torch.testing.assert_close(traced(x)[0], expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize('backend', ['fused', 'flex', 'triton'])
def test_a_fixed_untraceable_backend_is_replaced_in_the_trace_with_a_warning(backend):
    from lookhere_dense.lookhere.attention.fused import fused_available

    if backend == 'fused' and not fused_available():
        pytest.skip('fused kernel not built')
    torch.manual_seed(0)
    model = create_model(**TINY, attn_backend=backend).eval()
    x = torch.randn(1, 3, 48, 64)
    # triton runs eagerly on CUDA only (here: the trace's check and the eager reference
    # run another backend)
    eager = backend != 'triton'
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        traced = torch.jit.trace(model, (x,), check_trace=eager)
    ours = [str(w.message) for w in caught if f'backend {backend!r}' in str(w.message)]
    assert len(ours) == 1 and 'torch.jit.trace' in ours[0], ours  # once per engine
    if not eager:
        model.pos_enc.engine.backend = 'reference'
    with torch.no_grad():
        torch.testing.assert_close(traced(x)[0], model(x)[0], rtol=0, atol=1e-5)


def test_mmengine_flop_counter_counts_the_mmseg_backbone():
    pytest.importorskip('mmseg')
    from mmengine.analysis import get_model_complexity_info

    from lookhere_dense.models.backbones import LookHereViT

    torch.manual_seed(0)
    model = LookHereViT(**TINY).eval()
    x = torch.randn(1, 3, 64, 64)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        info = get_model_complexity_info(model, inputs=(x,), show_table=False, show_arch=False)
    d, tokens = 48, 1 + 8 * 8
    linear = 2 * tokens * 12 * d * d  # qkv, proj and the MLP (ratio 4) of both layers
    assert info['flops'] >= linear, info['flops']
    assert info['params'] == sum(p.numel() for p in model.parameters())


def test_timm_model_traces():
    timm = pytest.importorskip('timm')
    import lookhere_dense.timm_models  # noqa: F401  (registers the models)

    model = timm.create_model('lookhere_vit_tiny_patch16_224.lh180', num_classes=5).eval()
    x, other = torch.randn(1, 3, 64, 96), torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        traced = _trace(model, x)
        torch.testing.assert_close(traced(other), model(other), rtol=0, atol=1e-5)


@pytest.mark.parametrize('grid', [(8.0, 8), (0, 8), (8,), (torch.tensor(8), 8), (True, 8)])
def test_bad_grid_sizes_are_still_refused_by_name(grid):
    with pytest.raises(ValueError, match='grid_size must be'):  # the tracing fix kept this
        build_grid_bias(PRESETS['lh180'], grid, 2, 12)
