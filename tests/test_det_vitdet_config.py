"""mmdet's own ViTDet config (``projects/ViTDet/configs/vitdet_mask-rcnn_vit-b-mae_lsj-100e.py``)
with only the backbone swapped: ``type='LookHereViT'`` and its argument names
(``embed_dim`` -> ``embed_dims``, ``depth`` -> ``num_layers``; ``use_rel_pos`` dropped: the
LookHere bias is the position information). Its neck (``SimpleFPN`` with
``backbone_channel`` / per-level ``in_channels`` / ``num_outs`` / ``LN2d``) and its
``constructor='LayerDecayOptimizerConstructor'`` resolve to lookhere-dense's classes in the
mmdet scope, without mmdet's ViTDet project (which mmdet's pip package does not ship).

The model section is restated below, built on ``mmdet::_base_/models/mask-rcnn_r50_fpn.py``
as the project config is. The full-size model is built and gets its layer-decay optimizer;
one training step and a prediction run at ViT-B width on a 128 x 128 image (the step's
cost is the image size, not the config).

The same section with mmdet ``ViT``'s own argument names left in (``embed_dim``, ``depth``,
``use_rel_pos``: only ``type`` changed, what a user of the project config writes) builds
the same backbone, weight for weight, and a detector that predicts; an argument neither
class has and an argument given under both names are one-line ``ConfigError`` s.
"""

from __future__ import annotations

import math

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

from lookhere_dense.errors import USER_ERRORS, ConfigError

pytestmark = pytest.mark.usefixtures('one_torch_thread')

#: the project config's model section and optimizer, backbone type and names swapped
VITDET_CONFIG = """
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py']
custom_imports = dict(imports=['lookhere_dense.openmmlab'])

backbone_norm_cfg = dict(type='LN', requires_grad=True)
norm_cfg = dict(type='LN2d', requires_grad=True)
image_size = (1024, 1024)
batch_augments = [
    dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)
]

model = dict(
    data_preprocessor=dict(pad_size_divisor=32, batch_augments=batch_augments),
    backbone=dict(
        _delete_=True,
        type='LookHereViT',
        img_size=1024,
        patch_size=16,
        embed_dims=768,
        num_layers=12,
        num_heads=12,
        drop_path_rate=0.1,
        window_size=14,
        mlp_ratio=4,
        qkv_bias=True,
        norm_cfg=backbone_norm_cfg,
        window_block_indexes=[0, 1, 3, 4, 6, 7, 9, 10]),
    neck=dict(
        _delete_=True,
        type='SimpleFPN',
        backbone_channel=768,
        in_channels=[192, 384, 768, 768],
        out_channels=256,
        num_outs=5,
        norm_cfg=norm_cfg),
    rpn_head=dict(num_convs=2),
    roi_head=dict(
        bbox_head=dict(
            type='Shared4Conv1FCBBoxHead',
            conv_out_channels=256,
            norm_cfg=norm_cfg),
        mask_head=dict(norm_cfg=norm_cfg)))

optim_wrapper = dict(
    type='OptimWrapper',   # the project's AmpOptimWrapper needs a GPU
    constructor='LayerDecayOptimizerConstructor',
    paramwise_cfg={
        'decay_rate': 0.7,
        'decay_type': 'layer_wise',
        'num_layers': 12,
    },
    optimizer=dict(
        type='AdamW',
        lr=0.0001,
        betas=(0.9, 0.999),
        weight_decay=0.1,
    ))
"""


#: the project config's backbone under LookHereViT's names (as in VITDET_CONFIG) ...
OUR_BACKBONE = """
        embed_dims=768,
        num_layers=12,
        num_heads=12,
        drop_path_rate=0.1,
        window_size=14,
        mlp_ratio=4,
        qkv_bias=True,
        norm_cfg=backbone_norm_cfg,
        window_block_indexes=[0, 1, 3, 4, 6, 7, 9, 10]),"""
#: ... and as mmdet's project config has it (mmdet ViT's names), only ``type`` swapped
MMDET_BACKBONE = """
        embed_dim=768,
        depth=12,
        num_heads=12,
        drop_path_rate=0.1,
        window_size=14,
        mlp_ratio=4,
        qkv_bias=True,
        norm_cfg=backbone_norm_cfg,
        window_block_indexes=[0, 1, 3, 4, 6, 7, 9, 10],
        use_rel_pos=True,
        init_cfg=dict(type='Pretrained', checkpoint='mae_pretrain_vit_base.pth')),"""
assert OUR_BACKBONE in VITDET_CONFIG
#: the project config with mmdet ViT's argument names
VITDET_MMDET_NAMES_CONFIG = VITDET_CONFIG.replace(OUR_BACKBONE, MMDET_BACKBONE)


def _config(tmp_path, text: str, name: str = 'vitdet.py') -> Config:
    path = tmp_path / name
    path.write_text(text)
    return Config.fromfile(str(path))


def _build(cfg_node):
    from mmdet.registry import MODELS

    with DefaultScope.overwrite_default_scope('mmdet'):
        torch.manual_seed(0)
        return MODELS.build(cfg_node)


@pytest.fixture
def logged(monkeypatch):
    """The messages LookHereViT logs through mmengine's ``print_log``."""
    from lookhere_dense.models.backbones import lookhere_vit

    out = []
    monkeypatch.setattr(lookhere_vit, 'print_log', lambda msg, **kw: out.append(msg))
    return out


@pytest.fixture(scope='module')
def vitdet(tmp_path_factory):
    path = tmp_path_factory.mktemp('vitdet') / 'vitdet_mask-rcnn_lookhere-b_lsj-100e.py'
    path.write_text(VITDET_CONFIG)
    cfg = Config.fromfile(str(path))
    from mmdet.registry import MODELS

    with DefaultScope.overwrite_default_scope('mmdet'):
        torch.manual_seed(0)
        model = MODELS.build(cfg.model)
        model.init_weights()
        optim = build_optim_wrapper(model, cfg.optim_wrapper)
    return cfg, model, optim


def _batch(size: int = 128):
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=g)
    masks = torch.zeros(2, size, size, dtype=torch.uint8)
    masks[0, 10:60, 20:90] = 1
    masks[1, 70:120, 40:100] = 1
    sample = DetDataSample(
        metainfo=dict(img_shape=(size, size), ori_shape=(size, size), scale_factor=(1.0, 1.0))
    )
    sample.gt_instances = InstanceData(
        bboxes=torch.tensor([[20.0, 10.0, 90.0, 60.0], [40.0, 70.0, 100.0, 120.0]]),
        labels=torch.tensor([3, 17]),
        masks=BitmapMasks(masks.numpy(), size, size),
    )
    return dict(inputs=[img], data_samples=[sample])


def test_the_vitdet_model_section_builds_with_lookhere(vitdet):
    from lookhere_dense.engine import ViTDetLayerDecayOptimizerConstructor
    from lookhere_dense.models import LookHereViT, SimpleFPN

    cfg, model, optim = vitdet
    assert isinstance(model.backbone, LookHereViT) and isinstance(model.neck, SimpleFPN)
    assert model.backbone.window_block_indexes == [0, 1, 3, 4, 6, 7, 9, 10]
    assert model.neck.in_channels == 768 and model.neck.num_outs == 5
    assert [c.conv.in_channels for c in model.neck.lateral_convs] == [192, 384, 768, 768]
    # the layer-decay constructor of the config resolved to ours in the mmdet scope
    from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS

    with DefaultScope.overwrite_default_scope('mmdet'):
        assert (
            OPTIM_WRAPPER_CONSTRUCTORS.get('LayerDecayOptimizerConstructor')
            is ViTDetLayerDecayOptimizerConstructor
        )
    lr = {g['layer_id']: g['lr'] for g in optim.optimizer.param_groups}
    assert sorted(lr) == list(range(14))
    for layer, value in lr.items():
        assert value == pytest.approx(1e-4 * 0.7 ** (13 - layer), rel=1e-9)
    names = {n: g['layer_id'] for g in optim.optimizer.param_groups for n in g['param_names']}
    assert names['backbone.patch_embed.proj.weight'] == 0
    assert names['backbone.blocks.11.attn.qkv.weight'] == 12
    assert names['neck.lateral_convs.0.conv.weight'] == 13


def test_one_training_step_and_a_prediction(vitdet):
    cfg, model, optim = vitdet
    model.data_preprocessor.batch_augments[0].size = (128, 128)  # LSJ pad at 128, not 1024
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = model.train_step(_batch(), optim)
    for key in ('loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_bbox', 'loss_mask'):
        assert math.isfinite(losses[key].item()), key
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    for part in (
        'backbone.patch_embed.',
        'backbone.blocks.0.attn.',
        'backbone.blocks.11.',
        'neck.lateral_convs.0.',
        'rpn_head.',
        'roi_head.mask_head.',
    ):
        assert any(n.startswith(part) for n in moved), f'{part} did not train'
    model.eval()
    with torch.no_grad():
        (pred,) = model.test_step(_batch())
    inst = pred.pred_instances
    assert inst.bboxes.shape[1] == 4 and len(inst.bboxes) == len(inst.scores) == len(inst.labels)
    assert inst.masks.shape[1:] == (128, 128)
    assert torch.isfinite(inst.bboxes).all()


def test_importing_mmdets_vitdet_project_does_not_clash():
    """What ``import projects.ViTDet.vitdet`` does (mmdet's pip package does not ship it):
    register ``SimpleFPN``, ``LN2d`` and ``LayerDecayOptimizerConstructor`` in mmdet's
    registries without ``force``. That must not fail after lookhere-dense registered, and
    the project's classes then win in the mmdet scope; mmseg keeps its own constructor."""
    from mmdet.registry import MODELS, OPTIM_WRAPPER_CONSTRUCTORS
    from mmengine.optim import DefaultOptimWrapperConstructor
    from mmseg.registry import MODELS as SEG_MODELS
    from mmseg.registry import OPTIM_WRAPPER_CONSTRUCTORS as SEG_CONSTRUCTORS

    from lookhere_dense.models import SimpleFPN

    class ProjectSimpleFPN(torch.nn.Module):
        pass

    class ProjectLayerDecay(DefaultOptimWrapperConstructor):
        pass

    added = [
        (MODELS, 'SimpleFPN'),
        (MODELS, 'LN2d'),
        (OPTIM_WRAPPER_CONSTRUCTORS, 'LayerDecayOptimizerConstructor'),
    ]
    try:
        MODELS.register_module('SimpleFPN', module=ProjectSimpleFPN)
        MODELS.register_module('LN2d', module=torch.nn.LayerNorm)
        OPTIM_WRAPPER_CONSTRUCTORS.register_module(
            'LayerDecayOptimizerConstructor', module=ProjectLayerDecay
        )
        with DefaultScope.overwrite_default_scope('mmdet'):
            assert MODELS.get('SimpleFPN') is ProjectSimpleFPN
            assert (
                OPTIM_WRAPPER_CONSTRUCTORS.get('LayerDecayOptimizerConstructor')
                is ProjectLayerDecay
            )
        with DefaultScope.overwrite_default_scope('mmseg'):
            assert SEG_MODELS.get('SimpleFPN') is SimpleFPN
            assert SEG_CONSTRUCTORS.get('LayerDecayOptimizerConstructor').__module__.startswith(
                'mmseg.'
            )
    finally:
        for registry, name in added:
            registry._module_dict.pop(name, None)


def test_mmdet_vit_argument_names_build_the_same_backbone(tmp_path, logged):
    """The project's backbone dict with mmdet ViT's names (embed_dim, depth, use_rel_pos)
    builds the LookHereViT that LookHereViT's names build: same blocks, windows, keys,
    shapes and (same seed) weights; use_rel_pos is dropped with one logged note."""
    ours = _build(_config(tmp_path, VITDET_CONFIG, 'ours.py').model.backbone)
    assert logged == []
    mmdet_cfg = _config(tmp_path, VITDET_MMDET_NAMES_CONFIG, 'mmdet_names.py')
    assert 'embed_dim' in mmdet_cfg.model.backbone and 'embed_dims' not in mmdet_cfg.model.backbone
    theirs = _build(mmdet_cfg.model.backbone)
    assert type(theirs) is type(ours)
    for attr in ('embed_dims', 'num_layers', 'num_heads', 'window_size', 'window_block_indexes'):
        assert getattr(theirs, attr) == getattr(ours, attr), attr
    assert (theirs.embed_dims, theirs.num_layers) == (768, 12)
    assert [b.window_size for b in theirs.blocks] == [b.window_size for b in ours.blocks]
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    for key in a:
        assert a[key].shape == b[key].shape and torch.equal(a[key], b[key]), key
    assert theirs.init_cfg == dict(type='Pretrained', checkpoint='mae_pretrain_vit_base.pth')
    (note,) = logged
    assert "ignores mmdet ViT's use_rel_pos=True" in note and '\n' not in note
    # in_chans -> in_channels (the project config leaves it at 3)
    tiny = dict(type='LookHereViT', img_size=32, patch_size=8, embed_dims=48, num_layers=1)
    one, other = (
        _build(dict(tiny, **kw)).state_dict() for kw in ({'in_chans': 1}, {'in_channels': 1})
    )
    assert {k: v.shape for k, v in one.items()} == {k: v.shape for k, v in other.items()}
    assert one['patch_embed.proj.weight'].shape[1] == 1


def test_the_mmdet_named_vitdet_config_builds_a_detector_that_predicts(tmp_path, logged):
    """mmdet's project config with only ``type='LookHereViT'`` swapped builds the full
    Mask R-CNN and runs one prediction (64 x 64 image, few proposals)."""
    from lookhere_dense.models import LookHereViT

    cfg = _config(tmp_path, VITDET_MMDET_NAMES_CONFIG)
    cfg.model.test_cfg.rpn.update(nms_pre=50, max_per_img=20)
    cfg.model.test_cfg.rcnn.max_per_img = 5
    model = _build(cfg.model)
    assert isinstance(model.backbone, LookHereViT) and model.backbone.num_layers == 12
    model.data_preprocessor.batch_augments[0].size = (64, 64)
    model.eval()
    with torch.no_grad():
        (pred,) = model.test_step(_batch(64))
    inst = pred.pred_instances
    assert inst.bboxes.shape[1] == 4 and len(inst.bboxes) == len(inst.scores) <= 5
    assert torch.isfinite(inst.bboxes).all()


def _one_line_config_error(excinfo) -> str:
    err = excinfo.value
    assert isinstance(err, ConfigError) and isinstance(err, USER_ERRORS)
    msg = str(err)
    assert '\n' not in msg
    return msg


def test_an_unknown_backbone_key_in_the_config_file_names_the_close_ones(tmp_path):
    """A misspelt key written in the config (not --cfg-options) is a one-line ConfigError
    with the suggestion --cfg-options gives, not a TypeError traceback."""
    text = VITDET_MMDET_NAMES_CONFIG.replace('        depth=12,', '        num_layer=12,')
    cfg = _config(tmp_path, text)
    with pytest.raises(ConfigError) as excinfo:
        _build(cfg.model.backbone)
    msg = _one_line_config_error(excinfo)
    assert "LookHereViT has no argument 'num_layer'; did you mean num_layers?" in msg
    tiny = dict(type='LookHereViT', img_size=32, patch_size=8, embed_dims=48, num_layers=1)
    with pytest.raises(ConfigError) as excinfo:
        _build(dict(tiny, dept=2, window_sizes=2, bogus_option=1))
    msg = _one_line_config_error(excinfo)
    assert "no argument 'dept'; did you mean depth?" in msg
    assert "no argument 'window_sizes'; did you mean window_size?" in msg
    assert "no argument 'bogus_option' (nor has mmdet's ViTDet ViT)" in msg


@pytest.mark.parametrize(
    'bad, words',
    [
        (dict(drop_path_rate=-0.1), 'drop_path_rate must be a probability in [0, 1), got -0.1'),
        (dict(window_size=-1), 'window_size must be >= 0'),
        (dict(img_size=-5), 'img_size'),
        (dict(out_indices=()), 'out_indices must be an int or a non-empty list of ints'),
        (dict(out_indices='2'), "out_indices must be an int or a non-empty list of ints, got '2'"),
        (
            dict(window_size=2, window_block_indexes=[0, 5]),
            'window_block_indexes / global_attn_indexes: block indexes [5] out of range',
        ),
    ],
)
def test_a_bad_backbone_value_is_a_one_line_config_error_naming_it(bad, words):
    """The trunk's argument checks (torch-only code: ValueError) reach a config as a
    one-line ConfigError naming LookHereViT, the argument and the value, which the tools
    print as one ``error:`` line (found by a new-user pass: a 55-line traceback)."""
    tiny = dict(type='LookHereViT', img_size=32, patch_size=8, embed_dims=48, num_layers=2)
    with pytest.raises(ConfigError) as excinfo:
        _build(dict(tiny, **bad))
    msg = _one_line_config_error(excinfo)
    assert msg.startswith('LookHereViT') and words in msg, msg


def test_training_with_flex_on_cpu_is_refused_before_the_runner():
    """``attn_backend='flex'`` cannot train on CPU (no CPU backward): the training
    preflight refuses it, naming the key; inference, or CUDA, is left alone."""
    from lookhere_dense.apis.cli import check_attn_backend

    cfg = Config(dict(model=dict(backbone=dict(type='LookHereViT', attn_backend='flex'))))
    with pytest.raises(ConfigError, match=r"model.backbone.attn_backend='flex' cannot train"):
        check_attn_backend(cfg, cuda=False)
    check_attn_backend(cfg, cuda=True)
    cfg.model.backbone.attn_backend = 'fused'
    check_attn_backend(cfg, cuda=False)
    # the training preflight runs it (tools/train.py, lookhere-train); a test run does not
    import lookhere_dense
    from lookhere_dense.apis.cli import preflight

    shipped = Config.fromfile(lookhere_dense.config_path('segmenter_lookhere_vit-t_tiny-ade.py'))
    shipped.model.backbone.attn_backend = 'flex'
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match='cannot train on CPU'):
            preflight(shipped, ('train', 'val'), check_pretrained=False, check_data=False)
    preflight(shipped, ('test',), check_pretrained=False, check_data=False)


def test_the_preflight_asks_the_named_backends_can_run():
    """The pre-flight asks the backend's own ``can_run`` (it wrote flex's and triton's
    limits again, and let ``fused`` with attention dropout, or on CUDA, start and fail in
    the first step); encodings without a LookHere engine run SDPA whatever it names."""
    from lookhere_dense.apis.cli import check_attn_backend

    def check(cuda, splits=('train',), **backbone):
        cfg = Config(dict(model=dict(backbone=dict(type='LookHereViT', **backbone))))
        check_attn_backend(cfg, cuda=cuda, splits=splits)

    with pytest.raises(
        ConfigError,
        match=r"attn_backend='fused' cannot train on CPU: has no attention dropout; "
        r"train with 'auto' \(the first backend that runs here\)$",
    ):
        check(False, attn_backend='fused', attn_drop_rate=0.1)
    # a frozen backbone stays in training mode: its dropout runs
    with pytest.raises(ConfigError, match="'fused' cannot run on CPU: has no attention dropout"):
        check(False, attn_backend='fused', attn_drop_rate=0.1, frozen_exclude=[])
    check(False, ('test',), attn_backend='fused', attn_drop_rate=0.1)  # inference: no dropout
    for name in ('fused', 'tiled'):
        with pytest.raises(ConfigError, match=rf"'{name}' cannot run on CUDA: runs on CPU only"):
            check(True, ('test',), attn_backend=name)
    check(False, attn_backend='tiled')
    check(False, attn_backend='flex', pos_encoding='rope2d')  # no LookHere engine: SDPA runs
    with pytest.raises(ConfigError, match="'flex' cannot train on CPU: PyTorch's flex_attention"):
        check(False, attn_backend='flex', pos_encoding='ledit')  # LEDiT's causal flex
    check(False, attn_backend='chunked', pos_encoding='ledit', attn_drop_rate=0.1)
    check(False, attn_backend='fused', pos_encoding='ledit')  # the constructor refuses it
    with pytest.raises(ConfigError, match=r"'buffered' \(now 'tiled'\) cannot run on CUDA"):
        check(True, ('test',), attn_backend='buffered')


def test_the_triton_backend_is_refused_before_the_run_where_it_cannot_run(monkeypatch, tmp_path):
    """``attn_backend='triton'`` (a CUDA forward) in a training run started, then died in
    the first step with a 35-frame traceback whose advice ('train with flex') was wrong on
    CPU; ``tools/test.py`` / ``infer.py`` on CPU ended in a traceback too (a new-user
    trial). Now one error before the Runner: training anywhere, any pass without CUDA
    (outside Triton's interpreter)."""
    import lookhere_dense
    from lookhere_dense.apis.cli import check_attn_backend, preflight

    cfg = Config(dict(model=dict(backbone=dict(type='LookHereViT', attn_backend='triton'))))
    for cuda, where, frozen_hint in ((False, 'CPU', False), (True, 'CUDA', True)):
        with pytest.raises(ConfigError) as exc:
            check_attn_backend(cfg, cuda=cuda)
        assert str(exc.value).startswith(
            f"model.backbone.attn_backend='triton' cannot train on {where}: forward only "
            "(inference): no backward; train with 'auto'"
        )
        # on CUDA a frozen backbone runs it (inference); on CPU nothing does
        assert ('or freeze the backbone (frozen_exclude=[])' in str(exc.value)) == frozen_hint
    check_attn_backend(cfg, cuda=True, splits=('test',))
    frozen = Config(dict(model=dict(backbone=dict(attn_backend='triton', frozen_exclude=[]))))
    check_attn_backend(frozen, cuda=True)  # a frozen backbone: triton trains the heads
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    with pytest.raises(
        ConfigError,
        match=r"'triton' cannot run on CPU: CUDA only \(on CPU: Triton's interpreter.*\); "
        r"run with 'auto'",
    ):
        check_attn_backend(cfg, cuda=False, splits=('test',))
    from lookhere_dense.lookhere.attention import AttentionRequest, flash_triton

    request = AttentionRequest(256, torch.device('cpu'), torch.float32, auto=False)
    for spelling in ('1', 'true', 'on', 'Y'):  # Triton's own spellings of the interpreter switch
        monkeypatch.setenv('TRITON_INTERPRET', spelling)
        check_attn_backend(cfg, cuda=False, splits=('test',))
        # the backend reads it as the check does (it read only '1': the check passed, the
        # forward then refused 'true')
        assert 'CUDA only' not in str(flash_triton.can_run(request)), spelling
    monkeypatch.delenv('TRITON_INTERPRET')
    shipped = Config.fromfile(lookhere_dense.config_path('segmenter_lookhere_vit-t_tiny-ade.py'))
    shipped.model.backbone.attn_backend = 'triton'
    if not torch.cuda.is_available():
        for splits in (('train', 'val'), ('test',)):
            with pytest.raises(ConfigError, match="attn_backend='triton'"):
                preflight(shipped, splits, check_pretrained=False, check_data=False)
        import cv2
        import numpy as np

        from lookhere_dense.apis.inference import segment_images

        image = tmp_path / 'a.png'
        cv2.imwrite(str(image), np.zeros((32, 32, 3), np.uint8))
        with pytest.raises(ConfigError, match=r"'triton' cannot run on CPU: CUDA only"):
            segment_images(
                lookhere_dense.config_path('segmenter_lookhere_vit-t_tiny-ade.py'),
                str(tmp_path / 'no.pth'),
                str(image),
                str(tmp_path / 'out'),
                cfg_options={'model.backbone.attn_backend': 'triton'},
                device='cpu',
            )


@pytest.mark.parametrize(
    'mmdet_name, name, values',
    [
        ('embed_dim', 'embed_dims', (96, 48)),
        ('depth', 'num_layers', (1, 1)),
        ('in_chans', 'in_channels', (3, 1)),
    ],
)
def test_an_argument_under_both_names_is_an_error_naming_both(mmdet_name, name, values):
    tiny = dict(type='LookHereViT', img_size=32, patch_size=8, embed_dims=48, num_layers=1)
    with pytest.raises(ConfigError) as excinfo:
        _build(dict(tiny, **{mmdet_name: values[0], name: values[1]}))
    msg = _one_line_config_error(excinfo)
    assert f"{mmdet_name}={values[0]!r} (mmdet ViT's name) and {name}={values[1]!r}" in msg


def test_the_config_check_reads_the_mmdet_names():
    """``check_model_cfg`` (what ``tools/train.py`` runs before building) reads
    ``embed_dim`` / ``depth`` too: a width the heads do not divide is named before the
    build, and a valid mmdet-named size is not judged by the defaults."""
    import lookhere_dense.openmmlab  # noqa: F401  (registers, as the tools do)
    from lookhere_dense.config_checks import check_model_cfg

    def cfg(**backbone):
        model = dict(type='MaskRCNN', backbone=dict(type='LookHereViT', **backbone))
        return Config(dict(default_scope='mmdet', model=model))

    with pytest.raises(ConfigError, match=r'embed_dims=200 is not divisible by num_heads=12'):
        check_model_cfg(cfg(embed_dim=200))
    check_model_cfg(cfg(embed_dim=640, num_heads=16, depth=2, preset='lh180'))
