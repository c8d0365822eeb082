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
