"""The Segmenter configs: they load through the ``mmseg::`` bases, build, switch presets
with one key, and the ADE20K config starts training on an ADE20K folder as it is."""

from __future__ import annotations

import glob
import os.path as osp

import pytest
import torch

from lookhere_dense.apis.train import train_model
from lookhere_dense.errors import ConfigError
from lookhere_dense.lookhere import PRESETS
from lookhere_dense.swap import check_model_cfg, drop_missing_pretrained

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
# the LookHere Segmenter configs (segmenter_lookwhere_*.py has another backbone, LookWhereViT:
# tests/test_lookwhere.py builds and trains it)
CONFIGS = sorted(
    osp.basename(p) for p in glob.glob(osp.join(REPO, 'configs', 'segmenter_lookhere*.py'))
)


# one PyTorch thread for the whole module (see conftest.one_torch_thread)
pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _cfg(name: str, **options):
    from mmengine.config import Config

    cfg = Config.fromfile(osp.join(REPO, 'configs', name))
    if options:
        cfg.merge_from_dict(options)
    return cfg


def _build(cfg, keep_pretrained: bool = False):
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    init_default_scope('mmseg')
    model_cfg = cfg.model
    if not keep_pretrained:  # the ViT-B configs name a file that is not here
        model_cfg.pop('pretrained', None)
    return MODELS.build(model_cfg)


def test_the_issue_configs_exist():
    for name in (
        'segmenter_lookhere_ade20k.py',
        'segmenter_lookhere_linear_ade20k.py',
        'segmenter_lookhere_vit-s_ade20k.py',
        'segmenter_lookhere_vit-t_ade20k.py',
        'segmenter_lookhere_vit-s_linear_ade20k.py',
        'segmenter_lookhere_vit-t_linear_ade20k.py',
        'segmenter_lookhere_cityscapes.py',
        'segmenter_lookhere_linear_cityscapes.py',
        'segmenter_lookhere_cityscapes_whole.py',
        'segmenter_lookhere_linear_cityscapes_whole.py',
    ):
        assert name in CONFIGS


@pytest.mark.parametrize('name', CONFIGS)
def test_config_builds_and_segments(name):
    cfg = _cfg(name, **{'model.backbone.num_layers': 1})
    assert cfg.model.backbone.type == 'LookHereViT'
    assert 'lookhere_dense.openmmlab' in cfg.custom_imports.imports
    check_model_cfg(cfg)
    model = _build(cfg).eval()
    assert model.decode_head.num_classes == (19 if 'cityscapes' in name else 150)
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 48, 80), mode='tensor')
    assert logits.shape[:2] == (1, model.decode_head.num_classes)


def test_recipes_follow_segmenter():
    ade = _cfg('segmenter_lookhere_ade20k.py')
    assert ade.optim_wrapper.optimizer.type == 'SGD' and ade.optim_wrapper.optimizer.lr == 1e-3
    assert ade.param_scheduler[0].type == 'PolyLR' and ade.train_cfg.max_iters == 160000
    assert ade.model.test_cfg == dict(mode='slide', crop_size=(512, 512), stride=(480, 480))
    assert ade.train_dataloader.dataset.data_root == 'data/ade/ADEChallengeData2016'
    city = _cfg('segmenter_lookhere_cityscapes.py')
    assert city.model.data_preprocessor.size == (768, 768)
    assert city.model.test_cfg.mode == 'slide' and city.model.test_cfg.crop_size == (768, 768)
    crops = [t for t in city.train_dataloader.dataset.pipeline if t.type == 'RandomCrop']
    assert crops[0].crop_size == (768, 768)
    whole = _cfg('segmenter_lookhere_cityscapes_whole.py')
    assert whole.model.test_cfg == dict(mode='whole')
    resize = [t for t in whole.test_dataloader.dataset.pipeline if t.type == 'Resize'][0]
    assert resize.scale == (2048, 1024) and resize.keep_ratio  # whole 1024x2048 frames
    linear = _cfg('segmenter_lookhere_linear_ade20k.py')
    assert linear.model.decode_head.type == 'FCNHead' and linear.model.decode_head.num_convs == 0


@pytest.mark.parametrize('preset', ['lh180', 'lh90', 'lh45'])
@pytest.mark.parametrize(
    'name', ['segmenter_lookhere_vit-t_ade20k.py', 'segmenter_lookhere_vit-s_linear_ade20k.py']
)
def test_one_key_selects_the_preset(name, preset):
    cfg = _cfg(name, **{'model.backbone.preset': preset, 'model.backbone.num_layers': 2})
    model = _build(cfg)
    assert model.backbone.lh_config == PRESETS[preset]


def test_vit_b_configs_name_the_official_checkpoint():
    cfg = _cfg('segmenter_lookhere_ade20k.py')
    assert cfg.model.pretrained == 'checkpoints/LH_180_weights_and_config.pth'
    warnings = []
    dropped = drop_missing_pretrained(cfg, warnings.append)
    assert dropped == ['checkpoints/LH_180_weights_and_config.pth']
    assert cfg.model.pretrained is None
    assert 'RANDOM weights' in warnings[0] and 'model.pretrained=None' in warnings[0]


def test_official_checkpoint_loads_through_model_pretrained(reference_dir, tmp_path):
    """The mmseg ``model.pretrained`` route ends in LookHereViT's official-format loader
    (the shared reference file is a tiny model in the official checkpoint format)."""
    ckpt = str(reference_dir / 'official_tiny_halves_none.pth')
    cfg = _cfg(
        'segmenter_lookhere_vit-t_tiny-ade.py',
        **{
            'model.pretrained': ckpt,
            'model.backbone.embed_dims': 96,
            'model.backbone.num_layers': 3,
            'model.backbone.init_values': 0.1,
            'model.decode_head.in_channels': 96,
        },
    )
    model = _build(cfg, keep_pretrained=True)
    model.init_weights()
    state = torch.load(ckpt, map_location='cpu', weights_only=False)['weights']
    assert torch.equal(model.backbone.blocks[2].attn.qkv.weight, state['blocks.2.attn.qkv.weight'])


def test_unknown_backbone_is_named_with_close_matches():
    cfg = _cfg('segmenter_lookhere_vit-t_tiny-ade.py', **{'model.backbone.type': 'LookHereVit'})
    with pytest.raises(ConfigError) as err:
        check_model_cfg(cfg)
    msg = str(err.value)
    assert "model.backbone.type='LookHereVit'" in msg and "'LookHereViT'" in msg
    assert "custom_imports=dict(imports=['lookhere_dense.openmmlab'])" in msg


def test_head_channel_mismatch_is_named():
    cfg = _cfg('segmenter_lookhere_vit-t_tiny-ade.py', **{'model.decode_head.in_channels': 384})
    with pytest.raises(ConfigError, match=r'model.decode_head.in_channels=384 .* 192-channel'):
        check_model_cfg(cfg)


def test_head_layout_that_does_not_fit_is_named():
    cfg = _cfg('segmenter_lookhere_vit-t_tiny-ade.py', **{'model.backbone.num_heads': 3})
    with pytest.raises(
        ConfigError,
        match=r'does not fit num_heads=3.*Set model.backbone.'
        r'num_heads to one that fits',
    ):
        check_model_cfg(cfg)


@pytest.mark.parametrize('encoding', ['abs', 'rope2d', 'rope2d_mixed', 'none'])
def test_baseline_encodings_need_no_lookhere_head_layout(encoding):
    cfg = _cfg(
        'segmenter_lookhere_vit-t_tiny-ade.py',
        **{'model.backbone.num_heads': 8, 'model.backbone.pos_encoding': encoding},
    )
    check_model_cfg(cfg)
    cfg = _cfg(
        'segmenter_lookhere_vit-t_tiny-ade.py',
        **{'model.backbone.num_heads': 8, 'model.backbone.pos_encoding': 'alibi2d'},
    )
    check_model_cfg(cfg)  # 'none' heads: any multiple of 4
    cfg = _cfg(
        'segmenter_lookhere_vit-t_tiny-ade.py',
        **{'model.backbone.num_heads': 6, 'model.backbone.pos_encoding': 'alibi2d'},
    )
    with pytest.raises(ConfigError, match=r"'none'.*does not fit num_heads=6"):
        check_model_cfg(cfg)


def test_a_zero_width_under_mmdets_name_is_named_by_it():
    """ViTDet's ``embed_dim`` (LookHereViT takes it too): its key in the message."""
    cfg = _cfg('segmenter_lookhere_vit-t_tiny-ade.py')
    cfg.model.backbone.pop('embed_dims')
    cfg.model.backbone.embed_dim = 0
    with pytest.raises(ConfigError, match=r'^model\.backbone\.embed_dim must be a positive int'):
        check_model_cfg(cfg)


@pytest.mark.parametrize(
    'key,value,match',
    [
        ('model.backbone.pos_encoding', 'rope', r"model.backbone.pos_encoding: .*'rope'.*rope2d"),
        ('model.backbone.attn_backend', 'fast', r"attn_backend='fast' is not one of"),
        ('model.backbone.preset', 'lh30', r"unknown LookHere preset 'lh30'"),
        ('model.backbone.embed_dims', 200, r'embed_dims=200 is not divisible by num_heads=12'),
        ('model.backbone.num_heads', 0, r'model.backbone.num_heads must be a positive int, got 0'),
        ('model.backbone.embed_dims', 0, r'backbone.embed_dims must be a positive int, got 0'),
        ('model.backbone.num_heads', 4.0, r'backbone.num_heads must be a positive int, got 4.0'),
    ],
)
def test_backbone_typos_are_config_errors(key, value, match):
    cfg = _cfg('segmenter_lookhere_vit-t_tiny-ade.py', **{key: value})
    with pytest.raises(ConfigError, match=match) as info:
        check_model_cfg(cfg)
    assert 'Set model.backbone.num_heads' not in str(info.value)


def test_ade20k_config_starts_training_on_an_ade20k_folder_as_is(tmp_path, monkeypatch):
    """``python tools/train.py configs/segmenter_lookhere_ade20k.py`` in a folder that has
    ``data/ade/ADEChallengeData2016`` (here: the tiny one) trains the ViT-B/16 model: one
    iteration of the real recipe, everything else as in the file."""
    from research.datasets.synthetic_seg import make_ade20k_like

    make_ade20k_like(tmp_path / 'data', num_train=2, num_val=1)
    monkeypatch.chdir(tmp_path)
    runner = train_model(
        osp.join(REPO, 'configs', 'segmenter_lookhere_ade20k.py'),
        allow_random_init=True,  # the LH_180 file is not here
        cfg_options={
            'train_cfg.max_iters': 1,
            'train_dataloader.num_workers': 0,
            'train_dataloader.persistent_workers': False,
        },
    )
    assert runner.iter == 1
    assert type(runner.model.backbone).__name__ == 'LookHereViT'
    assert runner.model.backbone.embed_dims == 768 and len(runner.model.backbone.blocks) == 12
    assert osp.isfile(osp.join('work_dirs', 'segmenter_lookhere_ade20k', 'iter_1.pth'))
    logs = glob.glob(osp.join('work_dirs', 'segmenter_lookhere_ade20k', '*', '*.log'))
    text = open(logs[0]).read()
    assert (
        "'checkpoints/LH_180_weights_and_config.pth' not found: the backbone starts "
        'from RANDOM weights' in text
    )
    assert 'Iter(val)' in text and 'mIoU' in text  # validated with IoUMetric at the end


def test_whole_frame_configs_pad_test_images_to_patch_multiples():
    """Whole-image evaluation without ``size_divisor`` (the UPerNet configs, the study's
    ViT-B ladder) let the backbone pad a 512x683 ADE frame and the head stretch the padded
    grid over it: predictions up to 15 px off. Every shipped mmseg config pads in the
    preprocessor (or slides); a config that does not is warned about before the run."""
    from mmengine.config import Config

    from lookhere_dense.data.checks import whole_frame_pad_note

    configs = [
        p
        for p in glob.glob(osp.join(REPO, 'configs', '**', '*.py'), recursive=True)
        if '_base_' not in p
    ]
    checked = 0
    for path in sorted(configs):
        cfg = Config.fromfile(path)
        if (cfg.get('default_scope') or 'mmseg') != 'mmseg':
            continue
        checked += 1
        assert whole_frame_pad_note(cfg, ('val', 'test')) is None, path
    assert checked >= 20
    cfg = Config.fromfile(
        osp.join(REPO, 'configs', 'upernet_lookhere-b16_sfpn_8xb2-160k_ade20k-512x512.py')
    )
    cfg.model.data_preprocessor.test_cfg = None
    note = whole_frame_pad_note(cfg, ('train', 'val'))
    assert note.startswith("model.test_cfg mode='whole' without model.data_preprocessor")
    assert 'Set model.data_preprocessor.test_cfg=dict(size_divisor=16)' in note
    assert whole_frame_pad_note(cfg, ('train',)) is None  # no evaluation
    cfg.model.backbone.patch_size = 8
    cfg.model.data_preprocessor.test_cfg = dict(size_divisor=4)  # not a patch multiple
    assert 'dict(size_divisor=8)' in whole_frame_pad_note(cfg, ('test',))
    cfg.model.test_cfg = dict(mode='slide', crop_size=(512, 512), stride=(341, 341))
    assert whole_frame_pad_note(cfg, ('test',)) is None
