"""SimpleFPN (ViTDet's simple feature pyramid) and the LN2d norm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmdet.registry import MODELS as MMDET_MODELS
from mmengine.registry import DefaultScope
from mmseg.registry import MODELS as MMSEG_MODELS

from lookhere_dense.models import LookHereViT
from lookhere_dense.models.necks import LayerNorm2d, SimpleFPN
from lookhere_dense.models.necks.simple_fpn import scale_steps


@pytest.fixture(scope='module')
def neck() -> SimpleFPN:
    torch.manual_seed(0)
    fpn = SimpleFPN(in_channels=32, out_channels=16, num_outs=5)
    fpn.init_weights()
    return fpn.eval()


@pytest.mark.parametrize('grid', [(8, 10), (7, 9)])
def test_levels_channels_and_sizes(neck, grid):
    h, w = grid
    outs = neck((torch.randn(2, 32, h, w),))
    assert [tuple(o.shape) for o in outs] == [
        (2, 16, 4 * h, 4 * w),
        (2, 16, 2 * h, 2 * w),
        (2, 16, h, w),
        (2, 16, h // 2, w // 2),
        (2, 16, (h // 2 + 1) // 2, (w // 2 + 1) // 2),
    ]


def test_resampling_follows_vitdet(neck):
    up4, up2, same, down2 = neck.resamplers
    assert [type(m).__name__ for m in up4] == [
        'ConvTranspose2d',
        'LayerNorm2d',
        'GELU',
        'ConvTranspose2d',
    ]
    assert (up4[0].in_channels, up4[0].out_channels, up4[3].out_channels) == (32, 16, 8)
    assert [type(m).__name__ for m in up2] == ['ConvTranspose2d'] and up2[0].out_channels == 16
    assert isinstance(same, torch.nn.Identity)
    assert [type(m).__name__ for m in down2] == ['MaxPool2d']
    assert [c.conv.in_channels for c in neck.lateral_convs] == [8, 16, 32, 32]
    assert all(
        isinstance(c.norm, LayerNorm2d) and not c.with_activation
        for c in list(neck.lateral_convs) + list(neck.output_convs)
    )


def test_one_level_by_hand(neck):
    """The stride-8 level and P6, written out with functional ops."""
    x = torch.randn(1, 32, 6, 5)
    outs = neck(x)

    def ln2d(t, norm):
        mean = t.mean(1, keepdim=True)
        var = t.var(1, unbiased=False, keepdim=True)
        return (t - mean) / torch.sqrt(var + norm.eps) * norm.weight[:, None, None] + norm.bias[
            :, None, None
        ]

    up = neck.resamplers[1][0]
    y = F.conv_transpose2d(x, up.weight, up.bias, stride=2)
    lat, out = neck.lateral_convs[1], neck.output_convs[1]
    y = ln2d(F.conv2d(y, lat.conv.weight, lat.conv.bias), lat.norm)
    y = ln2d(F.conv2d(y, out.conv.weight, out.conv.bias, padding=1), out.norm)
    torch.testing.assert_close(outs[1], y, rtol=1e-5, atol=1e-5)
    assert lat.conv.bias is None  # followed by a norm: no conv bias (mmcv 'auto')
    torch.testing.assert_close(outs[4], outs[3][:, :, ::2, ::2])


def test_gradients_reach_every_parameter(neck):
    fpn = SimpleFPN(in_channels=32, out_channels=8, num_outs=5)
    x = torch.randn(1, 32, 4, 4, requires_grad=True)
    sum(o.sum() for o in fpn([x])).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in fpn.parameters())


def test_on_lookhere_backbone_strides_4_to_32():
    backbone = LookHereViT(
        patch_size=16,
        embed_dims=24,
        num_layers=2,
        num_heads=6,
        window_size=2,
        window_block_indexes=[0],
        out_indices=(0, 1),
    )
    fpn = SimpleFPN(in_channels=24, out_channels=8)  # reads the last backbone output
    with torch.no_grad():
        outs = fpn(backbone(torch.randn(1, 3, 64, 96)))
    assert [tuple(o.shape[-2:]) for o in outs] == [(16, 24), (8, 12), (4, 6), (2, 3)]


def test_ln2d_normalises_channels_per_pixel():
    norm = LayerNorm2d(6)
    x = torch.randn(2, 6, 3, 4) * 5 + 2
    y = norm(x)
    torch.testing.assert_close(y.mean(1), torch.zeros(2, 3, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(1, unbiased=False), torch.ones(2, 3, 4), atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match=r'LN2d expects \(B, C, H, W\) maps, got shape \(2, 6\)'):
        norm(torch.randn(2, 6))


@pytest.mark.parametrize('scope', [None, 'mmdet', 'mmseg'])
def test_registered_in_both_registries_and_ln2d_resolves_in_any_scope(scope):
    cfg = dict(type='SimpleFPN', in_channels=16, out_channels=8, num_outs=5)
    for registry in (MMDET_MODELS, MMSEG_MODELS):
        assert isinstance(registry.build(cfg), SimpleFPN)
    if scope is None:
        name, layer = build_norm_layer(dict(type='LN2d'), 8)
    else:
        with DefaultScope.overwrite_default_scope(scope):
            name, layer = build_norm_layer(dict(type='LN2d'), 8)
    assert name == 'ln' and isinstance(layer, LayerNorm2d)


@pytest.mark.parametrize(
    'kwargs,match',
    [
        (dict(scale_factors=(4.0, 3.0)), r'must be powers of two .* got 3.0'),
        (dict(scale_factors=(1.0, 2.0)), r'strictly decreasing'),
        (dict(scale_factors=(-1.0,)), r'positive powers of two'),
        (dict(scale_factors=()), r'at least one scale factor'),
        (dict(in_channels=6, scale_factors=(8.0,)), r'in_channels=6 must be divisible by 8'),
        (dict(num_outs=3), r'num_outs=3 is smaller than the number of scale factors \(4\)'),
        (dict(in_channels=[32, 32]), r'in_channels must be a positive int'),
        (
            dict(in_channels=[8, 16, 32, 16], backbone_channel=32),
            r'in_channels=\[8, 16, 32, 16\] \(per level\) does not match its levels: '
            r'backbone_channel=32 .* gives \[8, 16, 32, 32\]',
        ),
        (dict(in_channels=32, backbone_channel=32), r'with backbone_channel, in_channels lists'),
        (
            dict(in_channels=[8, 16, 32, 32], backbone_channel=0),
            r'backbone_channel must be a positive int',
        ),
        (dict(out_channels=0), r'out_channels must be a positive int, got 0'),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = dict(in_channels=32, out_channels=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        SimpleFPN(**args)


def test_bad_inputs_are_named(neck):
    with pytest.raises(ValueError, match=r'built for in_channels=32, the backbone map has 24'):
        neck((torch.randn(1, 24, 4, 4),))
    with pytest.raises(ValueError, match=r'output_cls_token=False'):
        neck(([torch.randn(1, 32, 4, 4), torch.randn(1, 32)],))
    with pytest.raises(ValueError, match=r'in_index=-1 but the backbone gave 0 output'):
        neck(())
    with pytest.raises(ValueError, match=r'in_index=2 but the backbone gave 1 output'):
        SimpleFPN(in_channels=32, in_index=2)((torch.randn(1, 32, 4, 4),))
    with pytest.raises(ValueError, match=r'a tensor or a tuple of backbone outputs, got dict'):
        neck({'x': torch.randn(1, 32, 4, 4)})


def test_scale_steps():
    assert [scale_steps(s) for s in (8, 4.0, 2, 1, 0.5, 0.25)] == [3, 2, 1, 0, -1, -2]


def test_mmdet_vitdet_neck_arguments_build_the_same_neck():
    """mmdet projects/ViTDet's neck config (backbone_channel, per-level in_channels,
    out_channels, num_outs, LN2d) builds the same pyramid as ours, in both scopes."""
    vitdet = dict(
        type='SimpleFPN',
        backbone_channel=32,
        in_channels=[8, 16, 32, 32],
        out_channels=16,
        num_outs=5,
        norm_cfg=dict(type='LN2d', requires_grad=True),
    )
    ours = SimpleFPN(in_channels=32, out_channels=16, num_outs=5)
    for registry in (MMDET_MODELS, MMSEG_MODELS):
        neck = registry.build(vitdet)
        assert neck.in_channels == 32 and neck.num_outs == 5
        neck.load_state_dict(ours.state_dict())
        x = (torch.randn(1, 32, 6, 8),)
        with torch.no_grad():
            for a, b in zip(neck(x), ours(x)):
                torch.testing.assert_close(a, b)


def test_norm_cfg_none_and_conv_cfg():
    neck = SimpleFPN(in_channels=32, out_channels=8, norm_cfg=None, conv_cfg=dict(type='Conv2d'))
    assert not any(isinstance(m, (LayerNorm2d, torch.nn.LayerNorm)) for m in neck.modules())
    assert all(c.with_bias for c in neck.lateral_convs)  # no norm: the convs keep a bias
    outs = neck((torch.randn(1, 32, 4, 4),))
    assert [tuple(o.shape) for o in outs] == [
        (1, 8, 16, 16),
        (1, 8, 8, 8),
        (1, 8, 4, 4),
        (1, 8, 2, 2),
    ]


@pytest.mark.parametrize('norm_type', ['LN', 'LN2d'])
def test_a_token_layer_norm_is_refused(norm_type):
    """``norm_cfg=dict(type='LN')`` (ViTDet's backbone norm) built ``nn.LayerNorm`` in the
    neck: over an NCHW map it normalised the width -- a crash deep in torch, or, where the
    width equals the channels, features silently wrong. Refused, naming LN2d."""
    if norm_type == 'LN2d':  # the working spelling still builds and runs
        fpn = SimpleFPN(
            in_channels=32, out_channels=32, scale_factors=(1.0,), norm_cfg=dict(type='LN2d')
        )
        assert fpn((torch.randn(1, 32, 4, 32),))[0].shape == (1, 32, 4, 32)
        return
    with pytest.raises(
        ValueError, match=r"norm_cfg=\{'type': 'LN'\} builds nn.LayerNorm .*dict\(type='LN2d'\)"
    ):
        SimpleFPN(in_channels=32, out_channels=32, scale_factors=(1.0,), norm_cfg=dict(type='LN'))


def test_a_map_too_small_for_the_coarsest_level_is_refused_by_name(neck):
    """A 1-patch-high map crashed in ``max_pool2d`` ("Output size is too small") at the
    stride-32 level; 2 per side is enough for one pooling step."""
    with pytest.raises(
        ValueError,
        match=r'backbone map is 1x20; its coarsest scale factor 0.5 max-pools it by 2.*at least 2 patches per side',
    ):
        neck((torch.randn(1, 32, 1, 20),))
    assert neck((torch.randn(1, 32, 2, 20),))[3].shape[-2:] == (1, 10)
    quarter = SimpleFPN(in_channels=32, out_channels=16, scale_factors=(1.0, 0.25))
    with pytest.raises(ValueError, match='at least 4 patches per side'):
        quarter((torch.randn(1, 32, 3, 20),))
