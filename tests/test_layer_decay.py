"""Layer-wise lr decay constructor: layer ids, lr scales, weight-decay exemptions, registry."""

from __future__ import annotations

import pytest
import torch
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from mmseg.registry import MODELS as MMSEG_MODELS

from lookhere_dense.engine import (
    LookHereLayerDecayOptimizerConstructor,
    backbone_layer_id,
    find_lookhere_backbone,
)
from lookhere_dense.models import LookHereViT

L = 3
BASE_LR, BASE_WD, RATE = 1e-3, 0.05, 0.7


def segmentor(**backbone):
    args = dict(
        type='LookHereViT',
        patch_size=8,
        embed_dims=24,
        num_layers=L,
        num_heads=6,
        out_indices=(L - 1,),
        window_size=2,
        window_block_indexes=[0, 1],
    )
    args.update(backbone)
    norm = dict(type='BN', requires_grad=True)
    with DefaultScope.overwrite_default_scope('mmseg'):
        return MMSEG_MODELS.build(
            dict(
                type='EncoderDecoder',
                data_preprocessor=dict(type='SegDataPreProcessor', mean=[0, 0, 0], std=[1, 1, 1]),
                backbone=args,
                neck=dict(type='SimpleFPN', in_channels=24, out_channels=8),
                decode_head=dict(
                    type='FCNHead',
                    in_channels=8,
                    in_index=0,
                    channels=8,
                    num_convs=1,
                    num_classes=3,
                    norm_cfg=norm,
                ),
                train_cfg=dict(),
                test_cfg=dict(mode='whole'),
            )
        )


@pytest.fixture(scope='module')
def model():
    return segmentor()


def optim_cfg(num_layers: int = L, decay_rate: float = RATE, **paramwise) -> dict:
    """The layer-decay ``optim_wrapper`` config (AdamW at ``BASE_LR`` / ``BASE_WD``);
    ``paramwise``: more ``paramwise_cfg`` keys."""
    return dict(
        type='OptimWrapper',
        constructor='LookHereLayerDecayOptimizerConstructor',
        optimizer=dict(type='AdamW', lr=BASE_LR, weight_decay=BASE_WD),
        paramwise_cfg=dict(num_layers=num_layers, decay_rate=decay_rate, **paramwise),
    )


@pytest.mark.parametrize(
    'name,layer',
    [
        ('patch_embed.proj.weight', 0),
        ('patch_embed.proj.bias', 0),
        ('cls_token', 0),
        ('pre_ln.weight', 0),
        ('blocks.0.attn.qkv.weight', 1),
        ('blocks.0.ls1.gamma', 1),
        ('blocks.2.mlp.fc2.bias', 3),
        ('blocks.11.norm1.weight', 12),
        ('norm.weight', L + 1),
        (None, L + 1),
    ],
)
def test_layer_ids(name, layer):
    assert backbone_layer_id(name, L if layer <= L + 1 else 12) == layer


def expected(name: str, param) -> tuple:
    """(lr, weight decay) of a parameter of the test segmentor, spelled out."""
    if name.startswith('backbone.'):
        rel = name[len('backbone.') :]
        if rel.startswith(('patch_embed.', 'cls_token')):
            layer = 0
        elif rel.startswith('blocks.'):
            layer = int(rel.split('.')[1]) + 1
        else:
            assert rel.startswith('norm.'), rel
            layer = L + 1
    else:
        layer = L + 1
    no_decay = (
        name.endswith('.bias')
        or '.norm' in name
        or '.bn.' in name
        or '.ln.' in name
        or name.endswith(('gamma', 'cls_token'))
        or '.resamplers.0.1.' in name
    )  # the LN2d between the transposed convs
    return BASE_LR * RATE ** (L + 1 - layer), 0.0 if no_decay else BASE_WD


@pytest.mark.parametrize('scope', ['mmseg', 'mmdet'])
def test_lr_and_weight_decay_of_every_parameter(model, scope):
    with DefaultScope.overwrite_default_scope(scope):
        wrapper = build_optim_wrapper(model, optim_cfg())
    groups = wrapper.optimizer.param_groups
    seen = {}
    for g in groups:
        for p in g['params']:
            assert id(p) not in seen, 'a parameter is in two groups'
            seen[id(p)] = g
    names = dict(model.named_parameters())
    assert len(seen) == len(names)
    for name, p in names.items():
        lr, wd = expected(name, p)
        g = seen[id(p)]
        assert g['lr'] == pytest.approx(lr, rel=1e-12), name
        assert g['weight_decay'] == wd, name
        assert name in g['param_names']
    assert groups[0]['lr'] == BASE_LR  # the lr mmengine logs is the base lr
    assert sorted({g['layer_id'] for g in groups}) == list(range(L + 2))


def test_bias_decay_option_and_frozen_parameters():
    model = segmentor(frozen_exclude=['blocks.2', 'norm'])  # freeze patch embed, blocks 0-1
    wrapper = build_optim_wrapper(model, optim_cfg(bias_decay=True))
    by_param = {id(p): g for g in wrapper.optimizer.param_groups for p in g['params']}
    named = dict(model.named_parameters())
    for name, p in named.items():
        assert (id(p) in by_param) == p.requires_grad, name
    assert by_param[id(named['backbone.blocks.2.attn.qkv.bias'])]['weight_decay'] == BASE_WD
    assert by_param[id(named['backbone.blocks.2.norm1.bias'])]['weight_decay'] == 0.0
    assert by_param[id(named['backbone.blocks.2.ls1.gamma'])]['weight_decay'] == 0.0
    assert by_param[id(named['backbone.blocks.2.mlp.fc1.weight'])]['weight_decay'] == BASE_WD


def test_rms_norm_weights_get_no_weight_decay():
    """``norm_cfg=dict(type=nn.RMSNorm)`` (a norm LookHereViT takes): its weights were
    decayed as if they were a linear layer's."""
    model = segmentor(norm_cfg=dict(type=torch.nn.RMSNorm))
    wrapper = build_optim_wrapper(model, optim_cfg())
    by_param = {id(p): g for g in wrapper.optimizer.param_groups for p in g['params']}
    norms = [n for n, _ in model.backbone.named_modules() if n.endswith(('norm1', 'norm2'))]
    assert len(norms) == 2 * L and isinstance(model.backbone.blocks[0].norm1, torch.nn.RMSNorm)
    for name, p in model.named_parameters():
        if name.startswith('backbone.') and 'norm' in name.split('.')[-2]:
            assert by_param[id(p)]['weight_decay'] == 0.0, name


def test_num_layers_is_inferred_and_the_optimizer_steps(model):
    wrapper = build_optim_wrapper(
        model,
        dict(
            constructor='LookHereLayerDecayOptimizerConstructor',
            optimizer=dict(type='SGD', lr=BASE_LR),
            paramwise_cfg=dict(decay_rate=0.5),
        ),
    )
    lrs = {g['layer_id']: g['lr'] for g in wrapper.optimizer.param_groups}
    assert lrs == {i: pytest.approx(BASE_LR * 0.5 ** (L + 1 - i)) for i in range(L + 2)}
    # SGD without momentum: the update of a parameter is lr_scale * base_lr * grad
    p = model.backbone.patch_embed.proj.weight
    before = p.detach().clone()
    p.grad = torch.ones_like(p)
    wrapper.step()
    torch.testing.assert_close(before - p.detach(), torch.full_like(p, BASE_LR * 0.5**4))
    wrapper.zero_grad()


@pytest.mark.parametrize(
    'paramwise,error,match',
    [
        (dict(num_layers=L), ValueError, r'needs paramwise_cfg=dict\(decay_rate='),
        (dict(decay_rate=1.5), ValueError, r'decay_rate must be in \(0, 1\], got 1.5'),
        (
            dict(decay_rate=0.7, layer_decay_rate=0.7),
            ValueError,
            r"unknown paramwise_cfg keys \['layer_decay_rate'\]; allowed",
        ),
        (dict(decay_rate=0.7, decay_type='stage_wise'), ValueError, r"only 'layer_wise'"),
        (
            dict(decay_rate=0.7, num_layers=12),
            ValueError,
            r'num_layers=12 but the LookHereViT backbone has 3 blocks',
        ),
    ],
)
def test_bad_paramwise_cfg_is_named(model, paramwise, error, match):
    cfg = dict(
        constructor='LookHereLayerDecayOptimizerConstructor',
        optimizer=dict(type='AdamW', lr=BASE_LR),
        paramwise_cfg=paramwise,
    )
    with pytest.raises(error, match=match):
        build_optim_wrapper(model, cfg)


def test_models_without_one_lookhere_backbone_are_refused():
    with pytest.raises(ValueError, match=r'has no LookHereViT backbone \(Linear\)'):
        find_lookhere_backbone(torch.nn.Linear(2, 2))
    two = torch.nn.ModuleDict(
        dict(
            a=LookHereViT(embed_dims=24, num_layers=1, num_heads=6),
            b=LookHereViT(embed_dims=24, num_layers=1, num_heads=6),
        )
    )
    with pytest.raises(ValueError, match=r"2 LookHereViT modules \(\['a', 'b'\]\)"):
        find_lookhere_backbone(two)
    alone = LookHereViT(embed_dims=24, num_layers=1, num_heads=6)
    assert find_lookhere_backbone(alone) == ('', alone)


def test_registered_for_both_scopes():
    from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS as DET
    from mmseg.registry import OPTIM_WRAPPER_CONSTRUCTORS as SEG

    for registry in (DET, SEG):
        assert (
            registry.get('LookHereLayerDecayOptimizerConstructor')
            is LookHereLayerDecayOptimizerConstructor
        )


@pytest.mark.parametrize(
    'encoding,param', [('abs', 'pos_enc.pos_embed'), ('rope2d_mixed', 'pos_enc.freqs')]
)
def test_position_encoding_parameters_are_layer_0_without_decay(encoding, param):
    model = segmentor(pos_encoding=encoding, img_size=32)
    wrapper = build_optim_wrapper(model, optim_cfg())
    group = next(
        g for g in wrapper.optimizer.param_groups if f'backbone.{param}' in g['param_names']
    )
    assert group['layer_id'] == 0 and group['weight_decay'] == 0.0
    assert group['lr'] == pytest.approx(BASE_LR * RATE ** (L + 1))
