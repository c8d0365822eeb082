"""Swapping a config file's backbone (``tools/swap_backbone.py``:
:func:`lookhere_dense.apis.swap.swap_config_file`) and the smaller pieces of
``lookhere_dense.swap``."""

from __future__ import annotations

import pytest

from lookhere_dense.apis.cli import resolve_config_path
from lookhere_dense.apis.swap import swap_config_file
from lookhere_dense.errors import ConfigError
from lookhere_dense.swap import check_model_cfg, drop_missing_pretrained, lookhere_backbone_cfg

SOURCE = 'mmseg::vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py'


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
    # mmseg's config tests whole 512x683 frames unpadded: the swap pads them to patches
    # (the backbone padded them and the head stretched the padded grid over the image)
    from lookhere_dense.data.checks import whole_frame_pad_note

    source = Config.fromfile(resolve_config_path(SOURCE))
    assert whole_frame_pad_note(source, ('test',)) is not None
    assert cfg.model.data_preprocessor.test_cfg == dict(size_divisor=16)
    assert whole_frame_pad_note(cfg, ('test',)) is None
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


def _lh90_vit_s(path) -> str:
    """A converted-style backbone file (``save_backbone_checkpoint``) of a ViT-S/16 trained
    with lh90, as ``tools/convert_checkpoint.py`` writes one."""
    import torch

    from lookhere_dense.lookhere import create_model
    from lookhere_dense.lookhere.weights import save_backbone_checkpoint

    torch.manual_seed(0)
    trunk = create_model(embed_dims=384, num_layers=12, num_heads=6, preset='lh90')
    save_backbone_checkpoint(str(path), trunk.state_dict(), trunk.lh_config.to_dict(), 'test')
    return str(path)


def test_swap_tool_prints_the_preset_the_model_takes_from_the_checkpoint(tmp_path, capsys):
    """Without --preset the backbone adopts the LookHere config recorded in --checkpoint:
    the tool says so (it used to print ``preset=lh180 (default)`` for an lh90 file)."""
    import importlib.util
    from pathlib import Path

    from mmengine.config import Config

    import lookhere_dense
    from lookhere_dense.lookhere.config import PRESETS
    from lookhere_dense.swap import model_registry

    ckpt = _lh90_vit_s(tmp_path / 'lh90_vit-s.pth')
    tool_path = Path(__file__).resolve().parents[1] / 'tools' / 'swap_backbone.py'
    spec = importlib.util.spec_from_file_location('swap_backbone_tool', tool_path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / 'segmenter_lookhere_vit-s.py'
    src = 'mmseg::segmenter/segmenter_vit-s_mask_8xb1-160k_ade20k-512x512.py'
    tool.main([src, str(out), '--checkpoint', ckpt])
    printed = capsys.readouterr().out
    assert f'preset=lh90 (recorded in {ckpt})' in printed, printed
    assert 'lh180' not in printed
    # what the model built from the written config really uses
    lookhere_dense.register_all_modules()
    backbone = model_registry('mmseg').build(Config.fromfile(str(out)).model.backbone)
    backbone.init_weights()
    assert backbone.lh_config == PRESETS['lh90']
    tool.main([src, str(tmp_path / 'given.py'), '--checkpoint', ckpt, '--preset', 'lh90'])
    printed = capsys.readouterr().out
    assert 'preset=lh90' in printed and 'recorded in' not in printed, printed  # given


def test_lookhere_config_summary_says_where_the_config_comes_from(tmp_path):
    import torch

    from lookhere_dense.lookhere import create_model
    from lookhere_dense.swap import lookhere_config_summary

    def bb(**kw):
        return dict(type='LookHereViT', **kw)

    def pretrained(path):
        return dict(type='Pretrained', checkpoint=str(path))

    assert lookhere_config_summary(bb()) == 'preset=lh180 (default)'
    assert lookhere_config_summary(bb(preset='lh45')) == 'preset=lh45'
    assert lookhere_config_summary(bb(lh_config='lh90')) == 'preset=lh90'
    custom = dict(head_directions='corners-none', global_slope=2.0)
    assert lookhere_config_summary(bb(lh_config=custom)) == f'lh_config={custom!r}'
    assert lookhere_config_summary(bb(pos_encoding='rope2d')) == "pos_encoding='rope2d'"
    ckpt = _lh90_vit_s(tmp_path / 'lh90.pth')
    assert lookhere_config_summary(bb(init_cfg=pretrained(ckpt))) == (
        f'preset=lh90 (recorded in {ckpt})'
    )
    assert lookhere_config_summary(bb(preset='lh90', init_cfg=pretrained(ckpt))) == 'preset=lh90'
    # a timm-style file (no LookHere config): the default, said why
    trunk = create_model(embed_dims=48, num_layers=1, num_heads=12)
    plain = tmp_path / 'plain.pth'
    torch.save({'model': {k: v for k, v in trunk.state_dict().items() if 'extra' not in k}}, plain)
    assert lookhere_config_summary(bb(init_cfg=pretrained(plain))) == (
        f'preset=lh180 (default; {plain} records no LookHere config)'
    )
    missing = lookhere_config_summary(bb(init_cfg=pretrained(tmp_path / 'nope.pth')))
    assert missing.startswith('preset=lh180 (default) unless') and 'file not found' in missing


def test_a_swap_onto_a_file_takes_its_layerscale_and_an_official_files_normalisation(
    official_tiny, tmp_path
):
    """The swap fits the config to its --checkpoint where the file decides: a timm-style
    file without LayerScale gets init_values=None (it was swapped with LayerScale 1e-4,
    which failed to load, and strict=False would have run every branch at 1e-4); an
    official file gets the ImageNet normalisation it was trained with (Segmenter's
    127.5 / 127.5 stayed); a file of another width, depth or head count is refused before
    anything is built."""
    import torch

    import lookhere_dense
    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.errors import ConfigError
    from lookhere_dense.lookhere import create_model
    from lookhere_dense.swap import IMAGENET_MEAN, IMAGENET_STD, model_registry, swap_backbone

    lookhere_dense.register_all_modules()
    src = 'mmseg::segmenter/segmenter_vit-s_mask_8xb1-160k_ade20k-512x512.py'
    small = dict(
        **{'model.backbone.num_layers': 2, 'model.backbone.out_indices': 1},
        **{'model.decode_head.num_layers': 1},
    )
    cfg = load_config(src, small)
    # a timm-style ViT-S file without LayerScale
    trunk = create_model(embed_dims=384, num_layers=2, num_heads=6, init_values=None)
    plain = tmp_path / 'vit-s_no_ls.pth'
    sd = {k: v for k, v in trunk.state_dict().items() if 'extra' not in k}
    torch.save({'model': sd}, plain)
    notes = []
    new = swap_backbone(cfg, checkpoint=str(plain), report=notes.append)
    assert new.model.backbone.init_values is None
    assert f'init_values=None: {plain} has no LayerScale (ls1 / ls2 gammas)' in notes, notes
    backbone = model_registry('mmseg').build(new.model.backbone)
    backbone.init_weights()  # loads strictly
    torch.testing.assert_close(backbone.blocks[1].attn.qkv.weight, sd['blocks.1.attn.qkv.weight'])
    assert new.model.data_preprocessor.mean == cfg.model.data_preprocessor.mean  # not official
    # an explicit init_values is the user's
    given = swap_backbone(cfg, checkpoint=str(plain), init_values=1e-5)
    assert given.model.backbone.init_values == 1e-5
    # a head count the file does not record (384 / 64 = 6 assumed) is the loader's to
    # check, where checkpoint_num_heads overrides it (a review: refused at swap time, with
    # the advice --num-heads 15 for a 960-wide file); a note says what loading assumes
    notes = []
    twelve = swap_backbone(cfg, checkpoint=str(plain), num_heads=12, report=notes.append)
    assert twelve.model.backbone.num_heads == 12
    assert any('records no head count; loading assumes 6' in n for n in notes), notes
    # the official tiny file (96 wide, 3 blocks, 12 heads, LayerScale): refused by size ...
    path = str(official_tiny.path)
    with pytest.raises(
        ConfigError,
        match=r'has embed_dims=96, the swapped backbone 384 .*'
        r'--cfg-options model.backbone.embed_dims=96',
    ):
        swap_backbone(cfg, checkpoint=path)
    tiny = {
        'model.backbone.embed_dims': 96,
        'model.decode_head.in_channels': 96,
        'model.decode_head.channels': 96,
        'model.decode_head.embed_dims': 96,
    }
    cfg = load_config(src, {**small, **tiny})
    with pytest.raises(ConfigError, match=r'has num_layers=3, the swapped backbone 2'):
        swap_backbone(cfg, checkpoint=path)
    cfg = load_config(src, {**small, **tiny, 'model.backbone.num_layers': 3})
    with pytest.raises(
        ConfigError, match=r'has 12 attention heads .* num_heads=6: set --num-heads 12'
    ):
        swap_backbone(cfg, checkpoint=path)
    # ... and in a config of its size, normalised as it was trained
    notes = []
    new = swap_backbone(cfg, checkpoint=path, num_heads=12, report=notes.append)
    assert new.model.backbone.get('init_values', 1e-4) == 1e-4  # the file's LayerScale loads
    for pre in (new.model.data_preprocessor, new.data_preprocessor):
        assert pre.mean == IMAGENET_MEAN and pre.std == IMAGENET_STD
    assert any('-> ImageNet' in n and 'official LookHere file' in n for n in notes), notes
    # already ImageNet's (a tuple): nothing said; a BGR preprocessor gets BGR's order
    for pre in (cfg.model.data_preprocessor, cfg.data_preprocessor):
        pre.mean, pre.std = tuple(IMAGENET_MEAN), tuple(IMAGENET_STD)
    notes = []
    swap_backbone(cfg, checkpoint=path, num_heads=12, report=notes.append)
    assert not any('ImageNet' in n for n in notes), notes
    cfg.model.data_preprocessor.bgr_to_rgb = False
    bgr = swap_backbone(cfg, checkpoint=path, num_heads=12)
    assert bgr.model.data_preprocessor.mean == IMAGENET_MEAN[::-1]
    backbone = model_registry('mmseg').build(new.model.backbone)
    backbone.init_weights()


def test_a_swap_without_a_file_says_it_adds_layerscale():
    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.swap import swap_backbone

    notes = []
    cfg = load_config('mmseg::segmenter/segmenter_vit-s_mask_8xb1-160k_ade20k-512x512.py')
    new = swap_backbone(cfg, report=notes.append)
    assert 'init_values' not in new.model.backbone or new.model.backbone.init_values == 1e-4
    assert any(n.startswith('init_values=0.0001: LayerScale') for n in notes), notes


def test_the_swap_tool_takes_init_values(tmp_path):
    """``init_values=None`` was reachable from Python only (``--cfg-options`` applies to
    the source config, whose VisionTransformer has no such argument): ``--init-values``."""
    from mmengine.config import Config

    src = 'mmseg::segmenter/segmenter_vit-s_mask_8xb1-160k_ade20k-512x512.py'
    tool = _tool_module()
    none = tool.main([src, str(tmp_path / 'none.py'), '--init-values', 'none'])
    assert none.model.backbone.init_values is None
    assert Config.fromfile(str(tmp_path / 'none.py')).model.backbone.init_values is None
    small = tool.main([src, str(tmp_path / 'small.py'), '--init-values', '1e-5'])
    assert small.model.backbone.init_values == 1e-5
    with pytest.raises(SystemExit):
        tool.main([src, str(tmp_path / 'bad.py'), '--init-values', 'tiny'])


def _tool_module():
    """``tools/swap_backbone.py`` as a module (its ``main`` returns the new config)."""
    import importlib.util
    from pathlib import Path

    tool_path = Path(__file__).resolve().parents[1] / 'tools' / 'swap_backbone.py'
    spec = importlib.util.spec_from_file_location('swap_backbone_tool', tool_path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool
