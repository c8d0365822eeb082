"""Fault battery, model side: every bad option or input of ``LookHereViT`` / the LookHere
config ends in a message that names the key and value (or the dtype / layout), and the
legal-but-unusual cases give the correct result. None of these may produce NaN features or
train on silently.
"""

from __future__ import annotations

import math

import pytest
import torch

from lookhere_dense.lookhere import LookHereAttentionEngine, LookHereConfig
from lookhere_dense.models import LookHereViT

pytestmark = pytest.mark.usefixtures('one_torch_thread')

TINY = dict(img_size=32, patch_size=8, embed_dims=48, num_layers=3, num_heads=12)
NAN, INF = float('nan'), float('inf')


def tiny(**kwargs) -> LookHereViT:
    torch.manual_seed(0)
    model = LookHereViT(**{**TINY, **kwargs})
    model.init_weights()
    return model.eval()


# ----------------------------------------------------------------------------------------
# Options: a message naming the key and the value
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'kwargs,match',
    [
        (dict(img_size=(32, 32, 3)), r'img_size must be .*\(H, W\).*got \(32, 32, 3\)'),
        (dict(img_size=0), r'img_size must be .* got 0'),
        (dict(img_size='224'), r"img_size must be .* got '224'"),
        (dict(img_size=(32.5, 32)), r'img_size must be .* got \(32.5, 32\)'),
        (dict(patch_size=0), r'patch_size must be a positive int, got 0'),
        (dict(patch_size=8.0), r'patch_size must be a positive int, got 8.0'),
        (dict(in_channels=0), r'in_channels must be a positive int, got 0'),
        (dict(embed_dims=-48), r'embed_dims must be a positive int, got -48'),
        (dict(num_layers=0), r'num_layers must be a positive int, got 0'),
        (dict(num_heads=True), r'num_heads must be a positive int, got True'),
        (dict(drop_rate=1.5), r'drop_rate must be a probability in \[0, 1\), got 1.5'),
        (dict(drop_rate=-0.1), r'drop_rate must be a probability in \[0, 1\), got -0.1'),
        (dict(attn_drop_rate=NAN), r'attn_drop_rate must be a probability .* got nan'),
        (dict(drop_path_rate=1.0), r'drop_path_rate must be a probability .* got 1.0'),
        (dict(mlp_ratio=0), r'mlp_ratio must be a finite number > 0, got 0'),
        (dict(mlp_ratio=NAN), r'mlp_ratio must be a finite number > 0, got nan'),
        (dict(mlp_ratio=0.001), r'mlp_ratio=0.001 gives an MLP of 0 channels'),
        (dict(init_values=NAN), r'init_values must be a finite number, got nan'),
        (dict(init_values=INF), r'init_values must be a finite number, got inf'),
        (dict(window_size=2.5), r'window_size must be >= 0 \(an int\), got 2.5'),
        (dict(attn_block_size=-1), r'attn_block_size must be >= 0 \(an int\), got -1'),
        (dict(max_dense_bias_mb=NAN), r'max_dense_bias_mb must be a number >= 0, got nan'),
        (dict(max_dense_bias_mb=-1), r'max_dense_bias_mb must be a number >= 0, got -1'),
        (
            dict(out_indices=['2']),
            r'out_indices must be an int or a non-empty list of ints, '
            r"got \['2'\]",
        ),
        (
            dict(out_indices=[]),
            r'out_indices must be an int or a non-empty list of ints, got \[\]',
        ),
        (
            dict(window_size=2, window_block_indexes='01'),
            r'window_block_indexes must be a list '
            r"of block indexes \(ints\), got '01'",
        ),
        (
            dict(frozen_exclude=['blocks.9']),
            r"frozen_exclude entries \['blocks.9'\] match no "
            r'parameter',
        ),
        (
            dict(pos_encoding=dict(type='rope2d', theta=0)),
            r'pos_encoding theta must be a finite '
            r'number > 0, got 0',
        ),
        (dict(pos_encoding=dict(type='rope2d_mixed', theta=NAN)), r'theta .* got nan'),
        (
            dict(pos_encoding=dict(type='abs', init_std=-0.02)),
            r'pos_encoding init_std must be a '
            r'finite number >= 0, got -0.02',
        ),
    ],
)
def test_bad_backbone_options_name_key_and_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LookHereViT(**{**TINY, **kwargs})


SLOPE_CASES = [
    (dict(global_slope=NAN), r'global_slope must be a finite number >= 0 .* got nan'),
    (dict(global_slope=INF), r'global_slope must be a finite number >= 0 .* got inf'),
    (dict(global_slope=-1.0), r'global_slope must be a finite number >= 0 .* got -1.0'),
    (dict(global_slope='1'), r"global_slope must be a finite number >= 0 .* got '1'"),
    (dict(global_slope=True), r'global_slope must be a finite number >= 0 .* got True'),
    (
        dict(layer_slopes=(NAN, 0.5)),
        r'layer_slopes first value must be .* got nan '
        r'\(layer_slopes=\(nan, 0.5\)\)',
    ),
    (dict(layer_slopes=[1.5, -0.5]), r'layer_slopes last value .* got -0.5'),
    (dict(layer_slopes=(1.5, INF)), r'layer_slopes last value .* got inf'),
]


@pytest.mark.parametrize('cfg,match', SLOPE_CASES)
def test_bad_slopes_are_refused_by_the_config(cfg, match):
    """torch-only: the config itself refuses them (the engine, the benchmark, the study)."""
    with pytest.raises(ValueError, match=match):
        LookHereConfig(**cfg)


@pytest.mark.parametrize('encoding', ['lookhere', 'alibi2d'])
@pytest.mark.parametrize('cfg,match', SLOPE_CASES[:3] + SLOPE_CASES[5:7])
def test_bad_slopes_are_refused_by_the_backbone(encoding, cfg, match):
    with pytest.raises(ValueError, match=match):
        LookHereViT(**TINY, pos_encoding=encoding, lh_config=cfg)


def test_slopes_too_large_for_float32_are_an_error_not_blocked_keys():
    model = tiny(lh_config=dict(global_slope=1e35))  # finite, but x distance overflows
    with pytest.raises(
        ValueError,
        match=r'slopes too large: global_slope \* layer slope = '
        r'1.5e\+35',
    ):
        model(torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize(
    'kwargs,match',
    [
        (dict(max_dense_mb=NAN), r'max_dense_mb must be >= 0, got nan'),
        (dict(cache_size=0), r'cache_size must be a positive int, got 0'),
        (dict(block_size=-4), r'block_size must be None or an int >= 0'),
    ],
)
def test_engine_options_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LookHereAttentionEngine(LookHereConfig(), depth=3, num_heads=12, **kwargs)


# ----------------------------------------------------------------------------------------
# Legal options: the correct result
# ----------------------------------------------------------------------------------------
def test_zero_slopes_keep_the_fields_of_view_and_stay_finite():
    """Slope 0 is legal (documented): no distance penalty, the directional masks stay."""
    zero = tiny(lh_config=dict(global_slope=0.0))
    flat = tiny(lh_config=dict(layer_slopes=(0.0, 0.0)))
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        a, b = zero(x)[0], flat(x)[0]
    assert torch.isfinite(a).all()
    torch.testing.assert_close(a, b)
    table = zero.pos_enc.engine.grid_bias((4, 5), torch.device('cpu')).table
    assert torch.isneginf(table).any() and (table[torch.isfinite(table)] == 0).all()


def test_frozen_exclude_as_one_string_is_one_name():
    by_str = tiny(frozen_exclude='all')
    assert all(p.requires_grad for p in by_str.parameters())
    one = tiny(frozen_exclude='blocks.2')
    trainable = {n for n, p in one.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith('blocks.2.') for n in trainable)


def test_img_size_one_element_sequence_like_mmseg():
    assert LookHereViT(**{**TINY, 'img_size': (48,)}).img_size == (48, 48)
    assert LookHereViT(**{**TINY, 'img_size': [48, 64]}).img_size == (48, 64)


# ----------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'x,error,match',
    [
        (
            torch.zeros(1, 3, 32, 32, dtype=torch.uint8),
            ValueError,
            r'expects float images .* got dtype torch.uint8: .* x.float\(\)',
        ),
        (torch.zeros(1, 3, 32, 32, dtype=torch.int64), ValueError, r'got dtype torch.int64'),
        (torch.zeros(1, 3, 32, 32, dtype=torch.bool), ValueError, r'got dtype torch.bool'),
        (
            torch.zeros(1, 32, 40, 3),
            ValueError,
            r'got \(1, 32, 40, 3\), which looks like '
            r'\(B, H, W, C\) .* x.permute\(0, 3, 1, 2\)',
        ),
        (
            torch.zeros(1, 3, 32, 32, dtype=torch.float64),
            ValueError,
            r'weights are torch.float32 but the images are torch.float64',
        ),
        (
            torch.zeros(3, 32, 32),
            ValueError,
            r'expects images of shape \(B, C, H, W\), got '
            r'\(3, 32, 32\)',
        ),
        ([torch.zeros(3, 32, 32)], TypeError, r'expects a tensor of images .* got list'),
    ],
)
def test_bad_inputs_are_named(x, error, match):
    with pytest.raises(error, match=match):
        tiny()(x)


@pytest.mark.parametrize('encoding', ['lookhere', 'rope2d', 'abs', 'alibi2d', 'none'])
def test_channels_last_memory_format_gives_the_same_result(encoding):
    model = tiny(pos_encoding=encoding, window_size=2, window_block_indexes=[0])
    x = torch.randn(2, 3, 40, 56)
    with torch.no_grad():
        want = model(x)[0]
        got = model(x.contiguous(memory_format=torch.channels_last))[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    'encoding,backend',
    [
        ('lookhere', 'sdpa'),
        ('lookhere', 'chunked'),
        ('lookhere', 'reference'),
        ('rope2d', 'auto'),
        ('abs', 'auto'),
        ('alibi2d', 'auto'),
        ('none', 'auto'),
    ],
)
@pytest.mark.parametrize('size', [(40, 56), (32, 32)])  # padded windows / no padding
def test_an_empty_batch_gives_empty_outputs(encoding, backend, size):
    model = tiny(
        pos_encoding=encoding,
        attn_backend=backend,
        window_size=3,
        window_block_indexes=[0, 1],
        out_indices=(0, 2),
    )
    with torch.no_grad():
        outs = model(torch.randn(0, 3, *size))
    grid = tuple(math.ceil(s / 8) for s in size)
    assert [tuple(o.shape) for o in outs] == [(0, 48, *grid)] * 2
