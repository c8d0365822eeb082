"""Swapping a config file's backbone (``tools/swap_backbone.py``:
:func:`lookhere_dense.apis.swap.swap_config_file`) and the smaller pieces of
``lookhere_dense.swap``."""

from __future__ import annotations

import pytest

from lookhere_dense.apis.cli import resolve_config_path
from lookhere_dense.apis.swap import swap_config_file
from lookhere_dense.errors import ConfigError
from lookhere_dense.swap import check_model_cfg, drop_missing_pretrained, lookhere_backbone_cfg


def test_swap_tool_writes_a_config_train_can_load(tmp_path):
    from mmengine.config import Config

    out = tmp_path / 'upernet_lookhere_deit-s.py'
    swap_config_file(
        'mmseg::vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py', str(out), preset='lh90'
    )
    cfg = Config.fromfile(str(out))
    bb = cfg.model.backbone
    assert bb.type == 'LookHereViT' and bb.preset == 'lh90'
    assert (bb.embed_dims, bb.num_heads, tuple(bb.out_indices)) == (384, 6, (2, 5, 8, 11))
    assert 'lookhere_dense.openmmlab' in cfg.custom_imports.imports
    assert cfg.model.decode_head.type == 'UPerHead'
    check_model_cfg(cfg)
    with pytest.raises(ValueError, match="must end in .py, got 'x.txt'"):
        swap_config_file('mmseg::vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py', 'x.txt')


def test_package_config_paths_resolve():
    path = resolve_config_path('mmseg::segmenter/segmenter_vit-b_mask_8xb1-160k_ade20k-512x512.py')
    assert path.endswith('segmenter_vit-b_mask_8xb1-160k_ade20k-512x512.py')
    with pytest.raises(FileNotFoundError, match='looked for'):
        resolve_config_path('mmseg::segmenter/nope.py')


def test_backbone_cfg_rules():
    cfg = lookhere_backbone_cfg(
        dict(
            type='VisionTransformer',
            embed_dims=384,
            num_heads=6,
            interpolate_mode='bicubic',
            patch_bias=False,
        ),
        checkpoint='lh.pth',
        init_values=None,
    )
    assert cfg['init_cfg'] == dict(type='Pretrained', checkpoint='lh.pth')
    assert cfg['final_norm'] is False  # VisionTransformer's default, carried over
    assert 'patch_bias' not in cfg and 'interpolate_mode' not in cfg
    assert cfg['init_values'] is None
    with pytest.raises(ConfigError, match=r"\['use_rel_pos'\] have no LookHereViT"):
        lookhere_backbone_cfg(dict(type='VisionTransformer', use_rel_pos=True))
    with pytest.raises(ConfigError, match="cannot swap backbone type 'ResNetV1c'"):
        lookhere_backbone_cfg(dict(type='ResNetV1c'))


def test_missing_pretrained_in_init_cfg_is_dropped_with_a_warning(tmp_path):
    present = tmp_path / 'w.pth'
    present.write_bytes(b'x')
    cfg = dict(
        model=dict(
            backbone=dict(
                type='LookHereViT', init_cfg=dict(type='Pretrained', checkpoint='nope/w.pth')
            )
        )
    )
    warnings = []
    assert drop_missing_pretrained(cfg, warnings.append) == ['nope/w.pth']
    assert cfg['model']['backbone']['init_cfg'] is None
    assert 'model.backbone.init_cfg=None' in warnings[0]
    kept = dict(model=dict(pretrained=str(present), backbone=dict(type='LookHereViT')))
    assert drop_missing_pretrained(kept, warnings.append) == []
    assert kept['model']['pretrained'] == str(present)


def test_swap_tool_names_its_flags_and_prints_the_optimizer_rewrite(tmp_path):
    """On the command line the head-count error names --num-heads / --preset (the user
    cannot set model.backbone.* of a config that does not exist yet), and a BEiT config's
    mmseg layer-decay constructor is rewritten for LookHereViT and said so."""
    from mmengine.config import Config
    from tiny_seg import run_tools

    vit_t = 'mmseg::segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py'
    beit = 'mmseg::beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py'
    outs = [tmp_path / 'vit_t.py', tmp_path / 'beit.py', tmp_path / 'vit_t_12.py']
    res = run_tools(
        [
            ('swap_backbone', [vit_t, str(outs[0])]),
            ('swap_backbone', [beit, str(outs[1])]),
            ('swap_backbone', [vit_t, str(outs[2]), '--num-heads', '12']),
        ]
    )
    assert [r['rc'] for r in res] == [2, 0, 0], res
    err = res[0]['stderr']
    assert err.startswith('error: ') and err.count('\n') == 1 and 'num_heads=3' in err, err
    assert 'Set --num-heads to one that fits' in err and 'another preset with --preset' in err
    assert 'model.backbone.num_heads' not in err and not outs[0].exists()
    out = res[1]['stdout']
    assert "optim_wrapper: constructor='LayerDecayOptimizerConstructor'" in out, out
    assert "-> constructor='LookHereLayerDecayOptimizerConstructor'" in out
    cfg = Config.fromfile(str(outs[1]))
    assert cfg.optim_wrapper.constructor == 'LookHereLayerDecayOptimizerConstructor'
    assert cfg.optim_wrapper.paramwise_cfg == dict(decay_rate=0.9, num_layers=12)
    assert 'optim_wrapper' not in res[2]['stdout']  # Segmenter: the default constructor
