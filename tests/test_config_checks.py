"""What ``check_model_cfg`` refuses before the Runner builds anything (``tools/train.py``
and ``tools/test.py`` run it first): a misspelt argument of any part of the model, named
with the close ones, only where building would certainly fail; a neck that cannot read
the ``LookHereViT`` outputs."""

from __future__ import annotations

import copy
import glob
import os.path as osp

import pytest
import torch.nn as nn
from tiny_seg import assert_resume_follows_fresh

from lookhere_dense.config_checks import accepted_arguments, check_model_cfg
from lookhere_dense.errors import ConfigError

mmseg = pytest.importorskip('mmseg')

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
UPERNET = osp.join(REPO, 'configs', 'upernet_lookhere-b16_sfpn_8xb2-160k_ade20k-512x512.py')
SEGMENTER = osp.join(REPO, 'configs', 'segmenter_lookhere_vit-t_tiny-ade.py')
MASK_RCNN = osp.join(REPO, 'configs', 'mask_rcnn_lookhere-b16_sfpn_lsj-1024-100e_coco.py')


def _cfg(path: str, **options):
    from mmengine.config import Config

    cfg = Config.fromfile(path)
    cfg.merge_from_dict(options)
    return cfg


def _build_error(cfg) -> str:
    """What building ``cfg.model`` with the scope's registry raises (the Runner's way)."""
    from mmengine.registry import init_default_scope

    from lookhere_dense.config_checks import model_registry

    scope = cfg.get('default_scope') or 'mmseg'
    init_default_scope(scope)
    model = copy.deepcopy(cfg.model)
    model.pop('pretrained', None)
    model.get('backbone', {}).pop('init_cfg', None)
    with pytest.raises(TypeError) as err:
        model_registry(scope).build(model)
    return str(err.value)


@pytest.mark.parametrize(
    'path, key, typo, expected',
    [
        (UPERNET, 'model.neck', 'out_channel', 'out_channels'),
        (UPERNET, 'model.decode_head', 'pool_scale', 'pool_scales'),
        # SegmenterMaskTransformerHead hands **kwargs to BaseDecodeHead
        (SEGMENTER, 'model.decode_head', 'num_class', 'num_classes'),
        (SEGMENTER, 'model', 'test_cfgs', 'test_cfg'),
        (MASK_RCNN, 'model.neck', 'num_out', 'num_outs'),
        (MASK_RCNN, 'model.rpn_head', 'anchor_generators', 'anchor_generator'),
        # the RoI head's own parts (Shared4Conv1FCBBoxHead hands *args / **kwargs on)
        (MASK_RCNN, 'model.roi_head.bbox_head', 'num_class', 'num_classes'),
        (MASK_RCNN, 'model.roi_head.mask_roi_extractor', 'out_channel', 'out_channels'),
    ],
)
def test_a_misspelt_argument_is_named_with_the_close_ones(path, key, typo, expected):
    cfg = _cfg(path, **{f'{key}.{typo}': 1})
    check_model_cfg(_cfg(path))  # the config as shipped passes
    with pytest.raises(ConfigError) as err:
        check_model_cfg(cfg)
    msg = str(err.value)
    assert msg.startswith(f'{key}.{typo}: ')
    assert f"has no argument '{typo}'; did you mean '{expected}'" in msg
    # the check is exact: building the model would have raised the TypeError it replaces
    assert f"unexpected keyword argument '{typo}'" in _build_error(cfg)


def test_all_misspelt_keys_are_named_in_one_message():
    cfg = _cfg(UPERNET, **{'model.neck.out_channel': 1, 'model.neck.zzz_unlike_any': 2})
    with pytest.raises(ConfigError) as err:
        check_model_cfg(cfg)
    msg = str(err.value)
    assert "model.neck.out_channel: SimpleFPN has no argument 'out_channel'" in msg
    assert "model.neck.zzz_unlike_any: SimpleFPN has no argument 'zzz_unlike_any'" in msg
    assert 'SimpleFPN takes act_cfg, backbone_channel' in msg


def test_keys_merged_from_a_base_section_of_another_type_get_the_delete_hint(tmp_path):
    """A user's config swapping mmdet's ``FPN`` neck for ``SimpleFPN`` inherits the
    base's ``start_level`` / ``add_extra_convs`` (mmengine merges the dicts): each was
    named, without the way out (``_delete_=True``)."""
    from lookhere_dense.apis.cli import load_config

    path = tmp_path / 'mine.py'
    path.write_text(
        f'_base_ = [{UPERNET!r}]\nmodel = dict(neck=dict(start_level=1, add_extra_convs=True))\n'
    )
    with pytest.raises(ConfigError) as err:
        check_model_cfg(load_config(str(path)))
    msg = str(err.value)
    assert "model.neck.start_level: SimpleFPN has no argument 'start_level'" in msg
    assert msg.endswith(
        '. Keys of another type merged from a _base_ config? Replace the whole section: '
        "model.neck=dict(_delete_=True, type='SimpleFPN', ...)"
    )
    with pytest.raises(ConfigError) as err:  # a near miss: a typo, not a merged section
        check_model_cfg(_cfg(UPERNET, **{'model.neck.out_channel': 1}))
    assert '_delete_' not in str(err.value)


def test_the_tools_refuse_a_misspelt_argument_before_building(tmp_path):
    """A typo in the user's own config file (``--cfg-options`` keys are checked
    against the config before this, by ``check_cfg_options``)."""
    from lookhere_dense.apis.train import build_train_config

    path = tmp_path / 'mine.py'
    path.write_text(f'_base_ = [{UPERNET!r}]\nmodel = dict(neck=dict(out_channel=256))\n')
    with pytest.raises(ConfigError, match=r'model\.neck\.out_channel: SimpleFPN has no'):
        build_train_config(str(path), work_dir=str(tmp_path / 'work'))


# accepted_arguments: only what would certainly raise ------------------------------------


class _Base(nn.Module):
    def __init__(self, a: int = 1, b: int = 2):
        super().__init__()


class _HandsOn(_Base):
    def __init__(self, c: int = 3, **kwargs):
        super().__init__(b=4, **kwargs)


class _UsesKwargs(_Base):
    def __init__(self, c: int = 3, **kwargs):
        self.d = kwargs.pop('d', None)
        super().__init__(**kwargs)


def _renaming(init):
    def wrapper(self, *args, **kwargs):
        if 'old_a' in kwargs:
            kwargs['a'] = kwargs.pop('old_a')
        return init(self, *args, **kwargs)

    wrapper.__wrapped__ = init
    return wrapper


class _Decorated(_Base):
    @_renaming
    def __init__(self, a: int = 1):
        super().__init__(a=a)


class _NotAModule:  # mmdet's BaseReID without mmpretrain: raises its own error first
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)


def test_accepted_arguments_follow_kwargs_only_into_super():
    assert accepted_arguments(_Base) == {'a', 'b'}
    assert accepted_arguments(_HandsOn) == {'a', 'b', 'c'}
    # what it refuses, Python refuses
    with pytest.raises(TypeError, match="unexpected keyword argument 'e'"):
        _HandsOn(e=1)
    # **kwargs read by the class itself, a decorated __init__, not a class: unknown
    assert accepted_arguments(_UsesKwargs) is None
    _UsesKwargs(d=1)
    assert accepted_arguments(_Decorated) is None
    _Decorated(old_a=1)
    assert accepted_arguments(_NotAModule) is None
    assert accepted_arguments(lambda **kw: None) is None


def test_the_stock_configs_of_mmseg_pass():
    """Shipped mmseg configs of several families (heads that hand on **kwargs, necks,
    auxiliary heads) pass unchanged: no valid argument is called unknown."""
    from mmengine.config import Config

    root = osp.join(osp.dirname(mmseg.__file__), '.mim', 'configs')
    for rel in (
        'segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py',
        'vit/vit_vit-b16_mln_upernet_8xb2-80k_ade20k-512x512.py',
        'deeplabv3plus/deeplabv3plus_r50-d8_4xb2-40k_cityscapes-512x1024.py',
        'pspnet/pspnet_r50-d8_4xb2-40k_cityscapes-512x1024.py',
        'setr/setr_vit-l_pup_8xb2-160k_ade20k-512x512.py',
        'dpt/dpt_vit-b16_8xb2-160k_ade20k-512x512.py',
        'segformer/segformer_mit-b0_8xb2-160k_ade20k-512x512.py',
        'ocrnet/ocrnet_hr18_4xb2-40k_cityscapes-512x1024.py',
    ):
        check_model_cfg(Config.fromfile(osp.join(root, rel)))


# necks that cannot read the backbone's outputs ------------------------------------------


@pytest.mark.parametrize(
    'options, match',
    [
        (
            {'model.neck.in_channels': 384},
            r'model\.neck\.in_channels=384 but LookHereViT gives 768',
        ),
        ({'model.neck.in_index': 3}, r'model\.neck\.in_index=3 but the backbone gives 1 output'),
    ],
)
def test_a_simple_fpn_that_does_not_fit_the_backbone_is_refused(options, match):
    check_model_cfg(_cfg(UPERNET, **{'model.neck.in_index': -1}))
    with pytest.raises(ConfigError, match=match):
        check_model_cfg(_cfg(UPERNET, **options))


def test_a_multi_level_neck_that_does_not_fit_the_backbone_is_refused():
    from mmengine.config import Config

    from lookhere_dense.swap import swap_backbone

    root = osp.join(osp.dirname(mmseg.__file__), '.mim', 'configs')
    cfg = swap_backbone(
        Config.fromfile(osp.join(root, 'vit/vit_vit-b16_mln_upernet_8xb2-80k_ade20k-512x512.py'))
    )
    assert cfg.model.neck.type == 'MultiLevelNeck'
    check_model_cfg(cfg)
    cfg.model.backbone.out_indices = (5, 8, 11)
    with pytest.raises(ConfigError, match=r'lists 4 map\(s\) but the backbone gives 3'):
        check_model_cfg(cfg)
    cfg.model.backbone.out_indices = (2, 5, 8, 11)
    cfg.model.neck.in_channels = [768, 768, 768, 384]
    with pytest.raises(ConfigError, match=r'LookHereViT gives 768-channel maps'):
        check_model_cfg(cfg)


# mmseg test_cfg: what would fail only at the first test image ---------------------------


def test_a_test_mode_typo_is_named_before_anything_runs():
    cfg = _cfg(SEGMENTER, **{'model.test_cfg.mode': 'Whole'})
    with pytest.raises(ConfigError, match=r"mode='Whole' is not one of .*did you mean 'whole'"):
        check_model_cfg(cfg)


def _slide(model, crop, stride):
    """mmseg's own sliding inference of ``model`` on one 64x96 image."""
    import torch
    from mmengine.config import ConfigDict

    model.test_cfg = ConfigDict(mode='slide', crop_size=crop, stride=stride)
    meta = dict(img_shape=(64, 96), ori_shape=(64, 96), pad_shape=(64, 96))
    with torch.no_grad():
        return model.inference(torch.randn(1, 3, 64, 96), [meta])


def test_a_slide_stride_longer_than_the_window_is_refused_where_mmseg_fails():
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from lookhere_dense.apis.inference import inference_test_cfg

    cfg = _cfg(
        SEGMENTER,
        **{'model.test_cfg': dict(mode='slide', crop_size=(32, 32), stride=(48, 48))},
    )
    with pytest.raises(ConfigError) as err:
        check_model_cfg(cfg)
    assert str(err.value).startswith(
        'model.test_cfg.stride=48x48 with model.test_cfg.crop_size=32x32: sliding windows '
        'must step by 1 px to the window size at most'
    )
    # what the check stands for: mmseg's sliding inference fails on it, not on a stride of
    # the window's size
    init_default_scope('mmseg')
    model_cfg = cfg.model
    model_cfg.backbone.num_layers = 1
    model = MODELS.build(model_cfg).eval()
    with pytest.raises(AssertionError):
        _slide(model, (32, 32), (48, 48))
    assert _slide(model, (32, 32), (32, 32)).shape[-2:] == (64, 96)
    check_model_cfg(_cfg(SEGMENTER, **{'model.test_cfg.mode': 'whole'}))
    # tools/infer.py --crop / --stride
    with pytest.raises(ConfigError, match=r'^--stride=48x48 with --crop=32x32'):
        inference_test_cfg(cfg, slide=True, crop=(32, 32), stride=(48, 48))
    assert inference_test_cfg(cfg, slide=True, crop=(32, 32), stride=(32, 16))['stride'] == (
        32,
        16,
    )
    # --crop / --stride with whole-image inference were accepted and ignored
    with pytest.raises(
        ConfigError,
        match=r'^--crop set the sliding windows, but this run predicts whole images \(--whole\): add --slide',
    ):
        inference_test_cfg(cfg, whole=True, crop=(32, 32))
    whole = _cfg(SEGMENTER, **{'model.test_cfg.mode': 'whole'})
    with pytest.raises(
        ConfigError, match=r"^--crop / --stride set .*\(the config test_cfg mode 'whole'\)"
    ):
        inference_test_cfg(whole, crop=(32, 32), stride=(16, 16))
    assert inference_test_cfg(whole, slide=True, crop=(32, 32))['mode'] == 'slide'


# --cfg-options: a list where OpenMMLab takes one number or several -----------------------


def test_cfg_options_take_a_list_where_openmmlab_takes_one_or_several_numbers():
    from lookhere_dense.apis.cli import load_config

    cfg = load_config(
        SEGMENTER,
        {'model.backbone.out_indices': (2, 5, 8, 11), 'model.decode_head.in_index': [3]},
    )
    assert tuple(cfg.model.backbone.out_indices) == (2, 5, 8, 11)
    # mmdet ViTDet's per-level form of SimpleFPN's in_channels, where the config has an int
    cfg = load_config(
        MASK_RCNN,
        {'model.neck.in_channels': [192, 384, 768, 768], 'model.neck.backbone_channel': 768},
    )
    check_model_cfg(cfg)
    with pytest.raises(ConfigError, match=r'train_cfg.max_iters=\[1, 2\]: expected a number'):
        load_config(SEGMENTER, {'train_cfg.max_iters': [1, 2]})
    with pytest.raises(ConfigError, match=r"out_indices=\['a'\]: expected a number"):
        load_config(SEGMENTER, {'model.backbone.out_indices': ['a']})


# what the review of these checks found -------------------------------------------------


def test_other_segmentors_keep_their_own_test_modes():
    """mmseg's DepthEstimator (VPD configs) takes 'slide_flip': not refused."""
    from mmengine.config import Config

    from lookhere_dense.config_checks import SEG_TEST_MODES, seg_test_modes

    root = osp.join(osp.dirname(mmseg.__file__), '.mim', 'configs')
    vpd = Config.fromfile(osp.join(root, 'vpd/vpd_sd_4xb8-25k_nyu-480x480.py'))
    assert vpd.model.test_cfg.mode == 'slide_flip'
    assert seg_test_modes(vpd.model) is None
    check_model_cfg(vpd)
    assert seg_test_modes(_cfg(SEGMENTER).model) == SEG_TEST_MODES
    # a slide window given as one int: mmseg's sliding inference unpacks (H, W)
    cfg = _cfg(SEGMENTER, **{'model.test_cfg': dict(mode='slide', crop_size=32, stride=16)})
    with pytest.raises(ConfigError, match=r'as \(H, W\) ints, got crop_size=32, stride=16'):
        check_model_cfg(cfg)


class _Skipping(_HandsOn):
    def __init__(self, **kwargs):
        super(_HandsOn, self).__init__(**kwargs)  # skips _HandsOn: its c is not taken


class _Named(_HandsOn):
    def __init__(self, **kwargs):
        super(_Named, self).__init__(**kwargs)


def test_accepted_arguments_follow_only_the_next_init_of_the_mro():
    assert accepted_arguments(_Skipping) is None
    assert accepted_arguments(_Named) == {'a', 'b', 'c'}


def test_a_neck_given_as_a_class_is_checked_too():
    from lookhere_dense.models import SimpleFPN

    cfg = _cfg(UPERNET)
    cfg.model.neck.type = SimpleFPN
    cfg.model.neck.in_channels = 384
    with pytest.raises(ConfigError, match=r'model\.neck\.in_channels=384 but LookHereViT'):
        check_model_cfg(cfg)


def test_cfg_options_refuse_a_list_where_openmmlab_takes_one_number():
    from lookhere_dense.apis.cli import load_config

    for key, value in (
        ('train_dataloader.batch_size', [2, 2]),
        ('model.decode_head.num_classes', [1, 2]),
        ('model.backbone.patch_size', [16, 16]),
        ('model.backbone.out_indices', [2.5]),
    ):
        with pytest.raises(ConfigError, match='expected a number'):
            load_config(SEGMENTER, {key: value})


# mmdet: the pyramid the heads expect, the classes ------------------------------------


def _stock_det(rel: str, **backbone):
    """A stock mmdet config with a small LookHereViT as its backbone."""
    from lookhere_dense.apis.cli import load_config

    cfg = load_config(f'mmdet::{rel}')
    cfg.model.backbone = dict(
        type='LookHereViT', embed_dims=96, num_layers=2, num_heads=6, preset='lh90', **backbone
    )
    return cfg


def test_neck_strides_that_are_not_the_heads_are_refused_with_the_settings_that_fit():
    """The silent failures of a detector on a plain ViT: anchors / RoIs on levels of
    another stride (patch 8 under the stock SimpleFPN; RetinaNet's P3-P7 under the
    default SimpleFPN, which gives P2-P6); the settings the message offers pass."""
    check_model_cfg(_cfg(MASK_RCNN))
    with pytest.raises(
        ConfigError,
        match=r'model\.rpn_head\.anchor_generator\.strides=\[4, 8, 16, 32, 64\] but the neck '
        r'gives maps at strides \[2, 4, 8, 16, 32\] \(SimpleFPN scale_factors \(4\.0, 2\.0, '
        r'1\.0, 0\.5\) on the stride-8 map .*\(here: model\.neck\.scale_factors=\(2\.0, 1\.0, '
        r'0\.5\), model\.neck\.num_outs=5\)',
    ):
        check_model_cfg(_cfg(MASK_RCNN, **{'model.backbone.patch_size': 8}))
    cfg = _stock_det('retinanet/retinanet_r50_fpn_1x_coco.py')
    cfg.model.neck = dict(type='SimpleFPN', in_channels=96, out_channels=256, num_outs=5)
    with pytest.raises(ConfigError, match=r'bbox_head\.anchor_generator\.strides=\[8, 16, 32'):
        check_model_cfg(cfg)
    cfg.model.neck.scale_factors = (2.0, 1.0, 0.5)
    check_model_cfg(cfg)


def test_mmdets_fpn_on_a_plain_vit_is_refused_naming_simple_fpn():
    """mmdet's FPN keeps its inputs' strides: on a plain ViT every level is stride 16,
    and its channels / map count are checked against the backbone's."""
    cfg = _stock_det('mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', out_indices=(0, 1))
    with pytest.raises(ConfigError, match=r'lists 4 map\(s\) but the backbone gives 2'):
        check_model_cfg(cfg)
    cfg.model.backbone.out_indices = (0, 1, 1, 1)
    with pytest.raises(ConfigError, match=r'\[256, 512, 1024, 2048\] but LookHereViT gives 96'):
        check_model_cfg(cfg)
    cfg.model.neck.in_channels = [96] * 4
    with pytest.raises(
        ConfigError,
        match=r'strides \[16, 16, 16, 16, 32\] \(mmdet\'s FPN keeps each input\'s stride.*'
        r'use SimpleFPN',
    ):
        check_model_cfg(cfg)


@pytest.mark.parametrize(
    'options, match',
    [
        (
            {'model.neck.out_channels': 128},
            r'model\.rpn_head\.in_channels=256 but the neck gives 128',
        ),
        (
            {'model.roi_head.bbox_roi_extractor.out_channels': 128},
            r'bbox_roi_extractor\.out_channels=128 but the neck gives 256',
        ),
    ],
)
def test_head_channels_that_are_not_the_necks_are_refused(options, match):
    with pytest.raises(ConfigError, match=match):
        check_model_cfg(_cfg(MASK_RCNN, **options))


def test_cascade_roi_extractor_lists_are_checked_stage_by_stage():
    """A cascade RoI head may give one extractor per stage (a list): each stage's
    ``out_channels`` is checked against the neck, named by its index."""
    cfg = _cfg(MASK_RCNN)
    ext = dict(cfg.model.roi_head.bbox_roi_extractor)
    cfg.model.roi_head.bbox_roi_extractor = [dict(ext), dict(ext, out_channels=128)]
    with pytest.raises(
        ConfigError, match=r'model\.roi_head\.bbox_roi_extractor\[1\]\.out_channels=128 but'
    ):
        check_model_cfg(cfg)
    cfg.model.roi_head.bbox_roi_extractor = [dict(ext), dict(ext)]
    check_model_cfg(cfg)


def test_num_classes_that_are_not_the_datasets_are_refused():
    """Fewer classes than the dataset trains the rest as background without an error; the
    count comes from metainfo.classes, else the dataset class (COCO: 80)."""
    with pytest.raises(
        ConfigError,
        match=r'model\.roi_head\.bbox_head\.num_classes=2 but the dataset has 80 classes '
        r"\(CocoDataset's classes .*set model\.roi_head\.bbox_head\.num_classes, "
        r'model\.roi_head\.mask_head\.num_classes to 80',
    ):
        check_model_cfg(_cfg(MASK_RCNN, **{'model.roi_head.bbox_head.num_classes': 2}))
    three = {'train_dataloader.dataset.metainfo': dict(classes=('a', 'b', 'c'))}
    with pytest.raises(ConfigError, match=r'has 3 classes \(train_dataloader\.dataset'):
        check_model_cfg(_cfg(MASK_RCNN, **three))
    fits = {'model.roi_head.bbox_head.num_classes': 3, 'model.roi_head.mask_head.num_classes': 3}
    check_model_cfg(_cfg(MASK_RCNN, **three, **fits))


@pytest.mark.parametrize(
    'options, match',
    [
        (
            {'model.test_cfg.mode': 'slide'},
            r"model\.test_cfg\.mode='slide': mmdet detectors \(MaskRCNN\) have no whole / "
            r'sliding-window test modes .*Resize scale sets its size',
        ),
        (
            {'model.test_cfg.score_thr': 0.3},
            r'model\.test_cfg\.score_thr: MaskRCNN \(a two-stage detector\) reads only rpn, '
            r'rcnn from model\.test_cfg and would ignore it; .*model\.test_cfg\.rcnn',
        ),
        (
            {'model.train_cfg.rcn': {}},
            r'model\.train_cfg\.rcn: .*reads only rpn, rpn_proposal, rcnn .*did you mean '
            r'model\.train_cfg\.rcnn\?',
        ),
    ],
)
def test_a_detector_loop_cfg_key_it_never_reads_is_refused(options, match):
    """A segmentation ``test_cfg.mode`` on a Mask R-CNN, and a two-stage detector's
    ``test_cfg`` / ``train_cfg`` key beside ``rpn`` / ``rcnn``, were accepted and ignored."""
    check_model_cfg(_cfg(MASK_RCNN, **{'model.test_cfg.rcnn.score_thr': 0.3}))
    with pytest.raises(ConfigError, match=match):
        check_model_cfg(_cfg(MASK_RCNN, **options))


def test_a_mode_on_a_single_stage_detector_is_refused_and_its_own_keys_are_not():
    """A single-stage detector hands its whole ``test_cfg`` to its head (no key list to
    check), and a panoptic two-stage detector reads ``test_cfg.panoptic`` itself."""
    cfg = _stock_det('retinanet/retinanet_r50_fpn_1x_coco.py')
    cfg.model.neck = dict(
        type='SimpleFPN',
        in_channels=96,
        out_channels=256,
        num_outs=5,
        scale_factors=(2.0, 1.0, 0.5),
    )
    cfg.model.test_cfg.score_thr = 0.3
    check_model_cfg(cfg)
    cfg.model.test_cfg.mode = 'whole'
    with pytest.raises(
        ConfigError, match=r"model\.test_cfg\.mode='whole': mmdet detectors \(Retina"
    ):
        check_model_cfg(cfg)
    from lookhere_dense.apis.cli import load_config

    check_model_cfg(load_config('mmdet::panoptic_fpn/panoptic-fpn_r50_fpn_1x_coco.py'))


def test_the_stock_configs_of_mmdet_pass():
    """Stock mmdet families (two-stage, cascade, single-stage, anchor-free, DETR-like,
    panoptic, open-vocabulary) pass the classes check as shipped."""
    from lookhere_dense.apis.cli import load_config

    for rel in (
        'mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
        'cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py',
        'retinanet/retinanet_r50_fpn_1x_coco.py',
        'fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py',
        'dino/dino-4scale_r50_8xb2-12e_coco.py',
        'panoptic_fpn/panoptic-fpn_r50_fpn_1x_coco.py',
        'cityscapes/mask-rcnn_r50_fpn_1x_cityscapes.py',
        'pascal_voc/faster-rcnn_r50_fpn_1x_voc0712.py',
    ):
        check_model_cfg(load_config(f'mmdet::{rel}'))


def test_cfg_options_set_a_dict_where_the_config_has_none():
    """``--cfg-options`` values written as a config writes a dict (mmengine's parser
    recursed on them until Python gave up), and keys set below an entry the config leaves
    None (``init_cfg=None``; mmengine's merge refused both): the entry becomes that dict."""
    import argparse

    from lookhere_dense.apis.cli import load_config, parse_cfg_options

    whole = parse_cfg_options(
        ["model.backbone.init_cfg=dict(type='Pretrained', checkpoint='w.pth', prefix=None)"]
    )
    assert whole == {  # given whole, it replaces the config's entry
        'model.backbone.init_cfg': dict(
            type='Pretrained', checkpoint='w.pth', prefix=None, _delete_=True
        )
    }
    assert load_config(SEGMENTER).model.backbone.init_cfg is None
    cfg = load_config(SEGMENTER, whole)
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint='w.pth', prefix=None)
    keys = ['model.backbone.init_cfg.type=Pretrained', 'model.backbone.init_cfg.checkpoint=w.pth']
    cfg = load_config(SEGMENTER, parse_cfg_options(keys))
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint='w.pth')
    nested = parse_cfg_options(['x=dict(a=[1, (2, 3)], b=dict(c=-1.5))', 'y=[1,2]'])
    assert nested == {'x': dict(a=[1, (2, 3)], b=dict(c=-1.5), _delete_=True), 'y': [1, 2]}
    # replaced, not merged into the config's dict (its checkpoint would have stayed)
    cfg = load_config(UPERNET, parse_cfg_options(["model.backbone.init_cfg=dict(type='Kaiming')"]))
    assert cfg.model.backbone.init_cfg == dict(type='Kaiming')
    # values that only contain the letters: mmengine's reading
    paths = parse_cfg_options(['work_dir=runs/predict(v2)', 'load_from=/c/predict(old).pth'])
    assert paths == {'work_dir': 'runs/predict(v2)', 'load_from': '/c/predict(old).pth'}
    # a key alone below an init_cfg=None: Pretrained with a checkpoint, else its type asked
    cfg = load_config(SEGMENTER, {'model.backbone.init_cfg.checkpoint': 'w.pth'})
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained', checkpoint='w.pth')
    with pytest.raises(
        ConfigError, match=r'init_cfg\.strict: the config has .*init_cfg=None.*type'
    ):
        load_config(SEGMENTER, {'model.backbone.init_cfg.strict': False})
    hooks = parse_cfg_options(["custom_hooks=[dict(type='LookHereSlopeLoggerHook')]"])
    assert hooks == {'custom_hooks': [dict(type='LookHereSlopeLoggerHook')]}  # was a str
    with pytest.raises(argparse.ArgumentError, match=r'cannot be read as dict\(key=value'):
        parse_cfg_options(['k=dict(type=Pretrained)'])


def test_a_dict_option_for_a_key_the_config_leaves_to_the_default_builds():
    """``model.backbone.lh_config=dict(...)`` / ``pos_encoding=dict(...)`` where the config
    does not write the key: mmengine's merge kept the ``_delete_`` the option adds, and the
    backbone refused the key ``_delete_`` the user never wrote."""
    from mmseg.registry import MODELS

    from lookhere_dense.apis.cli import load_config, parse_cfg_options

    tiny = osp.join(REPO, 'configs', 'segmenter_lookhere_vit-t_tiny-ade.py')
    cfg = load_config(tiny)
    assert 'lh_config' not in cfg.model.backbone and 'pos_encoding' not in cfg.model.backbone
    options = parse_cfg_options(
        [
            "model.backbone.lh_config=dict(head_directions='halves-none', global_slope=1.0)",
            "model.backbone.pos_encoding=dict(type='lookhere')",
        ]
    )
    cfg = load_config(tiny, options)
    assert cfg.model.backbone.lh_config == dict(head_directions='halves-none', global_slope=1.0)
    assert cfg.model.backbone.pos_encoding == dict(type='lookhere')
    backbone = MODELS.build(cfg.model.backbone)
    assert backbone.lh_config.head_directions == 'halves-none'
    # a list element given whole replaces it (mmengine merged it key by key, _delete_ too)
    step = "dict(type='RandomResize', scale=(64, 64), keep_ratio=True)"
    cfg = load_config(tiny, parse_cfg_options([f'train_dataloader.dataset.pipeline.3={step}']))
    assert cfg.train_dataloader.dataset.pipeline[3] == dict(
        type='RandomResize', scale=(64, 64), keep_ratio=True
    )


def test_preprocessor_statistics_on_the_0_1_scale_are_named():
    """timm's ImageNet mean / std (0..1) in an mmseg data preprocessor: the images are
    0..255, so the model saw inputs ~255x too large and trained to a few % mIoU without a
    word. The shipped configs and mmseg's own (ImageNet on 0..255, or 127.5) pass."""
    from lookhere_dense.apis.cli import load_config, preflight
    from lookhere_dense.config_checks import preprocessor_scale_note

    timm_stats = {
        'model.data_preprocessor.mean': [0.485, 0.456, 0.406],
        'model.data_preprocessor.std': [0.229, 0.224, 0.225],
    }
    notes: list = []
    preflight(load_config(SEGMENTER, timm_stats), ('test',), False, False, False, notes=notes)
    assert any(
        n.startswith(
            'model.data_preprocessor mean=[0.485, 0.456, 0.406] std=[0.229, 0.224, '
            '0.225] are on the 0..1 scale, but the images are loaded as 0..255'
        )
        for n in notes
    ), notes
    for path in sorted(glob.glob(osp.join(REPO, 'configs', '*.py'))) + [
        'mmseg::segmenter/segmenter_vit-b_mask_8xb1-160k_ade20k-512x512.py',
        'mmseg::vit/vit_vit-b16_mln_upernet_8xb2-160k_ade20k-512x512.py',
    ]:
        assert preprocessor_scale_note(load_config(path)) is None, path


def test_a_top_level_data_root_option_warns_that_it_moves_no_dataset():
    from lookhere_dense.apis.cli import check_cfg_options, load_config

    cfg = load_config(SEGMENTER)
    notes = []
    check_cfg_options(cfg, {'data_root': '/elsewhere'}, notes.append)
    (note,) = notes
    assert note.startswith("--cfg-options data_root='/elsewhere' changes the config's top-level")
    assert 'train_dataloader.dataset.data_root=PATH val_dataloader.dataset.data_root=PATH' in note
    notes.clear()
    check_cfg_options(cfg, {'train_dataloader.dataset.data_root': '/elsewhere'}, notes.append)
    assert notes == []


def test_an_option_on_a_copied_variable_names_the_copies():
    """``--cfg-options train_pipeline.2.scale=...``: the dataloader had copied the
    pipeline when the file was read, so the run was as before, without a word (a new-user
    trial); the keys that do change it are named."""
    from lookhere_dense.apis.cli import check_cfg_options, load_config

    cfg = load_config(SEGMENTER)
    notes = []
    check_cfg_options(cfg, {'train_pipeline.2.scale': (150, 115)}, notes.append)
    assert notes == [
        '--cfg-options train_pipeline.2.scale: train_pipeline is a variable of the config '
        'file, which train_dataloader.dataset.pipeline copied when the file was read: '
        'changing it changes no copy, and the run is as before. Set '
        'train_dataloader.dataset.pipeline.2.scale instead.'
    ]
    notes.clear()
    check_cfg_options(cfg, {'test_pipeline.1.scale': (64, 64)}, notes.append)
    assert (
        'Set val_dataloader.dataset.pipeline.1.scale test_dataloader.dataset.pipeline'
        in (notes[0])
    )
    notes.clear()  # the sections the run reads: no note
    check_cfg_options(cfg, {'train_dataloader.dataset.pipeline.2.scale': (150, 115)}, notes.append)
    check_cfg_options(cfg, {'model.backbone.num_layers': 2}, notes.append)
    both = {'train_pipeline.2.scale': (1, 1), 'train_dataloader.dataset.pipeline.2.scale': (1, 1)}
    check_cfg_options(cfg, both, notes.append)  # the copy set beside it: no note
    assert notes == []


def test_a_config_file_that_cannot_be_read_is_one_error_naming_it(tmp_path):
    """A syntax error, and a child config putting a dict where its base has None (the
    natural init_cfg of a fine-tuning config), were mmengine tracebacks."""
    from lookhere_dense.apis.cli import load_config

    bad = tmp_path / 'bad.py'
    bad.write_text("model = dict(type='X'\n")
    with pytest.raises(ConfigError, match=r"config '.*bad\.py' .*is not valid Python: .*line 1"):
        load_config(str(bad))
    on_bad = tmp_path / 'on_bad.py'
    on_bad.write_text(f"_base_ = ['{bad}']\n")
    with pytest.raises(ConfigError, match=r'on_bad\.py.* \(or one of its _base_ files\)'):
        load_config(str(on_bad))
    child = tmp_path / 'child.py'
    child.write_text(
        f"_base_ = ['{SEGMENTER}']\n"
        "model = dict(backbone=dict(init_cfg=dict(type='Pretrained', checkpoint='w.pth')))\n"
    )
    with pytest.raises(
        ConfigError, match=r"child\.py'.*cannot inherit from base.*init_cfg=dict\(_delete_=True"
    ):
        load_config(str(child))


def test_a_config_with_an_import_on_an_old_style_base_is_one_error(tmp_path):
    """``import torch`` + ``dtype = torch.float16`` in a config with ``_base_ = [...]``:
    mmengine's ConfigParsingError traceback (lazy-import vs old-style configs) before."""
    from lookhere_dense.apis.cli import load_config

    child = tmp_path / 'child.py'
    child.write_text(f"import torch\n_base_ = ['{SEGMENTER}']\ndtype = torch.float16\n")
    with pytest.raises(
        ConfigError,
        match=r"child\.py' \(or one of its _base_ files\) cannot be read: .*lazy_import.*"
        r"drop the import and write values as plain text \(dtype='float16', not "
        r'torch\.float16\)$',
    ):
        load_config(str(child))


def test_optional_keys_of_openmmlab_sections_are_not_taken_for_misspellings():
    """``paramwise_cfg.decay_type`` (taken by the layer-decay constructors) next to the
    config's ``decay_rate`` was refused as a misspelling of it."""
    from lookhere_dense.apis.cli import load_config

    cfg = load_config(UPERNET, {'optim_wrapper.paramwise_cfg.decay_type': 'layer_wise'})
    assert cfg.optim_wrapper.paramwise_cfg.decay_type == 'layer_wise'
    with pytest.raises(
        ConfigError,
        match=r"no 'decay_rat' in optim_wrapper.paramwise_cfg; did you mean decay_rate",
    ):
        load_config(UPERNET, {'optim_wrapper.paramwise_cfg.decay_rat': 0.5})


@pytest.mark.parametrize(
    'key, typo, match',
    [
        (
            'model.backbone.init_cfg',
            dict(type='Pretrain', checkpoint='w.pth'),
            r"model\.backbone\.init_cfg\.type='Pretrain' is not registered in the mmseg weight "
            r"initializer registry; did you mean 'Pretrained'",
        ),
        (
            'optim_wrapper.constructor',
            'LookHereLayerDecayOptimizerConstructer',
            r"optim_wrapper\.constructor='LookHereLayerDecayOptimizerConstructer' is not "
            r"registered .*did you mean 'LookHereLayerDecayOptimizerConstructor'",
        ),
        (
            'custom_hooks',
            [dict(type='LookHereSlopeLogerHook')],
            r"custom_hooks\[0\]\.type='LookHereSlopeLogerHook' .*'LookHereSlopeLoggerHook'",
        ),
        (
            'param_scheduler',
            [dict(type='PolyLr', by_epoch=False)],
            r"param_scheduler\[0\]\.type='PolyLr' .*did you mean 'PolyLR'",
        ),
        (  # mmdet's ViTDet config's hook (its projects/, not pip-installed): the way out
            'custom_hooks',
            [dict(type='Fp16CompresssionHook')],
            r"custom_hooks\[0\]\.type='Fp16CompresssionHook' is not registered in the mmseg "
            r'hook registry\. Import the module that registers it \(custom_imports=.*'
            r'Or drop the hook: --cfg-options custom_hooks=\[\] \(all of them\)\.$',
        ),
        (
            'param_scheduler',
            [dict(type='Cosinus', by_epoch=False)],
            r"type='Cosinus' is not registered in the mmseg parameter scheduler registry\. "
            r'Import the module that registers it \(custom_imports=dict\(imports=\[MODULE\]\)\)\.$',
        ),
    ],
)
def test_a_misspelt_type_of_another_section_is_named_before_the_run(key, typo, match):
    """Built by mmengine after start-up: a typo was a KeyError traceback (backbone types
    already had a suggestion)."""
    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.config_checks import check_section_types

    check_section_types(load_config(SEGMENTER))
    with pytest.raises(ConfigError, match=match):
        check_section_types(load_config(SEGMENTER, {key: typo}))


def test_a_batch_size_below_one_or_a_negative_lr_is_named():
    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.config_checks import check_loop_values

    check_loop_values(load_config(SEGMENTER))
    with pytest.raises(ConfigError, match=r'train_dataloader\.batch_size=0: images per batch'):
        check_loop_values(load_config(SEGMENTER, {'train_dataloader.batch_size': 0}))
    with pytest.raises(ConfigError, match=r'optim_wrapper\.optimizer\.lr=-1: the learning rate'):
        check_loop_values(load_config(SEGMENTER, {'optim_wrapper.optimizer.lr': -1}))
    with pytest.raises(ConfigError, match=r'train_cfg\.val_interval=0: validate every N >= 1'):
        check_loop_values(load_config(SEGMENTER, {'train_cfg.val_interval': 0}))
    # the advice: mmengine's loop validates at the last iteration whatever the interval
    with pytest.raises(ConfigError, match=r'train_cfg\.val_begin=1000000'):
        check_loop_values(load_config(SEGMENTER, {'train_cfg.val_interval': 0}))
    for lr in (float('inf'), float('nan')):  # inf trained on until it diverged
        with pytest.raises(ConfigError, match=r'lr=(inf|nan): the learning rate must be a finite'):
            check_loop_values(load_config(SEGMENTER, {'optim_wrapper.optimizer.lr': lr}))
    # a test run does not read the training settings
    check_loop_values(load_config(SEGMENTER, {'optim_wrapper.optimizer.lr': -1}), ('test',))
    check_loop_values(load_config(SEGMENTER, {'train_cfg.val_interval': 0}), ('test',))
    check_loop_values(load_config(SEGMENTER, {'train_cfg.val_interval': 1e6}))  # mmengine's float
    no_val = {'val_cfg': None, 'val_dataloader': None, 'val_evaluator': None}
    check_loop_values(load_config(SEGMENTER, {'train_cfg.val_interval': 0, **no_val}))


def test_a_longer_run_scales_multistep_milestones_and_one_cycle_steps():
    """MultiStepLR counts absolute steps and OneCycleLR refuses to step past total_steps:
    both follow a new max_iters (the milestones kept the old length's)."""
    from mmengine.config import Config

    from lookhere_dense.engine.schedules import schedule_to

    cfg = Config(
        dict(
            train_cfg=dict(max_iters=1000),
            param_scheduler=[
                dict(type='MultiStepLR', by_epoch=False, begin=0, end=1000, milestones=[800, 900]),
                dict(type='OneCycleLR', by_epoch=False, eta_max=0.1, total_steps=1000, end=1000),
                dict(type='PolyLR', by_epoch=False),
            ],
        )
    )
    notes = schedule_to(cfg, 100)
    assert cfg.param_scheduler[0].milestones == [80, 90]
    assert cfg.param_scheduler[1].total_steps == 100 and cfg.param_scheduler[2].end == 100
    assert (
        'milestones [800, 900] -> [80, 90]' in notes[0] and 'end 100 (was the length)' in notes[2]
    )


def _schedule_run(length: int, steps: int = 0):
    """mmengine's OptimWrapper over AdamW with two parameter groups (as layer decay makes:
    the wrapper adds ``base_param_settings``) and the schedulers of a ``length``-long run:
    a LinearLR warm-up to 10 (clipped to the length), PolyLR after it, and a momentum
    warm-up (on AdamW it writes ``betas``); stepped ``steps`` times like a run."""
    import torch
    from mmengine.optim import OptimWrapper
    from mmengine.optim.scheduler import LinearLR, LinearMomentum, PolyLR

    torch.manual_seed(0)
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    groups = [dict(params=a.parameters(), lr=1e-3), dict(params=b.parameters(), lr=5e-4)]
    wrapper = OptimWrapper(torch.optim.AdamW(groups, lr=1e-3))
    warm = min(10, length)
    schedulers = [
        LinearLR(wrapper, start_factor=0.1, by_epoch=False, begin=0, end=warm),
        PolyLR(wrapper, eta_min=1e-6, power=0.9, by_epoch=False, begin=warm - 1, end=length),
        LinearMomentum(wrapper, start_factor=0.8, by_epoch=False, begin=0, end=warm),
    ]
    for _ in range(steps):
        for sch in schedulers:
            sch.step()
    return wrapper, schedulers


def test_a_resume_with_another_length_replays_the_config_schedule_for_every_group():
    """The checkpoint of a 6-long run (warm-up ended at 6, the decay clipped to 5-6)
    resumed with a 30-long config: after mmengine loads the patched checkpoint, the
    optimizer (both groups, the wrapper's ``base_param_settings``, AdamW's momentum
    ``betas``) and the schedulers hold what a fresh 30-long run holds at step 6, and keep
    doing so. Before, the groups' count (the wrapper lists one more) refused the replay."""
    import types

    from lookhere_dense.engine.schedules import keep_config_schedule

    wrapper, schedulers = _schedule_run(6, steps=6)
    checkpoint = dict(
        meta=dict(iter=6),
        optimizer=wrapper.state_dict(),
        param_schedulers=[sch.state_dict() for sch in schedulers],
    )
    assert 'base_param_settings' in checkpoint['optimizer']
    wrapper, schedulers = _schedule_run(30)  # as the Runner builds them from the config
    note = keep_config_schedule(types.SimpleNamespace(param_schedulers=schedulers), checkpoint)
    assert note.startswith("the LR schedule follows this run's config, not the checkpoint's, ")
    assert 'param_scheduler[0] LinearLR: end 6 -> 10' in note
    fresh, fresh_schedulers = _schedule_run(30, steps=6)
    assert_resume_follows_fresh(wrapper, schedulers, checkpoint, fresh, fresh_schedulers, 30)


def test_an_entry_with_its_own_scope_is_left_to_that_scope():
    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.config_checks import check_section_types

    hooks = [dict(type='DetVisualizationHook', _scope_='mmdet')]
    check_section_types(load_config(SEGMENTER, {'custom_hooks': hooks}))
