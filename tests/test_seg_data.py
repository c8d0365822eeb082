"""The tiny ADE20K / Cityscapes-layout datasets and the data checks, through mmseg's own
dataset classes and transforms."""

from __future__ import annotations

import glob
import os.path as osp
import re

import cv2
import numpy as np
import pytest

from lookhere_dense.data.checks import check_crop_fits, check_dataset_layout, check_label_values
from lookhere_dense.data.transforms import CheckSegLabels
from lookhere_dense.errors import CropSizeError, DatasetLayoutError, LabelRangeError
from research.datasets.synthetic_seg import (
    ADE_CLASSES,
    CITYSCAPES_CLASSES,
    make_ade20k_like,
    make_cityscapes_like,
)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('data')
    ade = make_ade20k_like(root, num_train=6, num_val=3)
    city = make_cityscapes_like(root, num_train=4, num_val=2)
    return root, ade, city


def _tiny_cfg(name: str, data_root):
    from mmengine.config import Config

    cfg = Config.fromfile(osp.join(REPO, 'configs', name))
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = str(data_root)
    return cfg


def test_ade20k_layout_matches_mmseg(data):
    _, ade, _ = data
    imgs = sorted(glob.glob(str(ade / 'images' / 'training' / '*.jpg')))
    anns = sorted(glob.glob(str(ade / 'annotations' / 'training' / '*.png')))
    assert len(imgs) == len(anns) == 6
    assert osp.basename(imgs[0]) == 'ADE_train_00000001.jpg'
    assert len(glob.glob(str(ade / 'images' / 'validation' / 'ADE_val_*.jpg'))) == 3
    ann = cv2.imread(anns[0], cv2.IMREAD_UNCHANGED)
    assert ann.dtype == np.uint8 and ann.ndim == 2
    allowed = {0} | {v + 1 for v in ADE_CLASSES.values()}
    values = set()
    for a in anns:
        values |= set(np.unique(cv2.imread(a, cv2.IMREAD_UNCHANGED)).tolist())
    assert values <= allowed and len(values) >= 6


def test_cityscapes_layout_matches_mmseg(data):
    _, _, city = data
    imgs = sorted(glob.glob(str(city / 'leftImg8bit' / 'train' / '*' / '*_leftImg8bit.png')))
    assert len(imgs) == 4
    assert re.match(r'synthtown_\d{6}_\d{6}_leftImg8bit\.png', osp.basename(imgs[0]))
    for img in imgs:
        lab = img.replace('leftImg8bit', 'gtFine', 1).replace(
            '_leftImg8bit.png', '_gtFine_labelTrainIds.png'
        )
        seg = cv2.imread(lab, cv2.IMREAD_UNCHANGED)
        assert seg.shape == (128, 256) and cv2.imread(img).shape == (128, 256, 3)
        assert set(np.unique(seg).tolist()) <= set(CITYSCAPES_CLASSES.values()) | {255}


def test_generation_is_deterministic(tmp_path):
    a = make_ade20k_like(tmp_path / 'a', num_train=2, num_val=1, seed=3)
    b = make_ade20k_like(tmp_path / 'b', num_train=2, num_val=1, seed=3)
    c = make_ade20k_like(tmp_path / 'c', num_train=2, num_val=1, seed=4)
    name = 'annotations/training/ADE_train_00000002.png'
    read = lambda root: cv2.imread(str(root / name), cv2.IMREAD_UNCHANGED)  # noqa: E731
    assert np.array_equal(read(a), read(b))
    assert read(a).shape != read(c).shape or not np.array_equal(read(a), read(c))


def test_mmseg_datasets_read_the_tiny_data(data):
    from mmengine.registry import init_default_scope
    from mmseg.datasets import ADE20KDataset, CityscapesDataset

    init_default_scope('mmseg')
    _, ade, city = data
    ds = ADE20KDataset(
        data_root=str(ade),
        data_prefix=dict(img_path='images/validation', seg_map_path='annotations/validation'),
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations'),
            dict(type='CheckSegLabels', num_classes=150),
        ],
    )
    assert len(ds) == 3
    seg = ds[0]['gt_seg_map']
    assert set(np.unique(seg).tolist()) <= set(ADE_CLASSES.values()) | {255}
    cs = CityscapesDataset(
        data_root=str(city),
        data_prefix=dict(img_path='leftImg8bit/val', seg_map_path='gtFine/val'),
        pipeline=[],
    )
    assert len(cs) == 2


def test_check_labels_transform_names_the_file():
    t = CheckSegLabels(num_classes=19)
    ok = dict(gt_seg_map=np.array([[0, 18], [255, 3]], np.uint8), seg_map_path='ok.png')
    assert t(ok) is ok
    bad = dict(
        gt_seg_map=np.array([[0, 19], [200, 3]], np.uint8),
        seg_map_path='x/bad.png',
        reduce_zero_label=False,
    )
    with pytest.raises(LabelRangeError, match=r'x/bad.png.*\[19, 200\].*0\.\.18'):
        t(bad)
    with pytest.raises(ValueError, match='positive int'):
        CheckSegLabels(num_classes=0)


def test_missing_dataset_folder_says_where_and_what(tmp_path):
    cfg = _tiny_cfg('segmenter_lookhere_vit-t_tiny-ade.py', tmp_path / 'nowhere')
    with pytest.raises(DatasetLayoutError) as err:
        check_dataset_layout(cfg)
    msg = str(err.value)
    assert 'nowhere' in msg and 'data_root' in msg
    assert 'ADE20K layout' in msg and 'tools/demo.py --data-only' in msg
    (tmp_path / 'half' / 'images' / 'training').mkdir(parents=True)
    cfg = _tiny_cfg('segmenter_lookhere_vit-t_tiny-ade.py', tmp_path / 'half')
    with pytest.raises(DatasetLayoutError, match='seg_map_path folder .*annotations/training'):
        check_dataset_layout(cfg)


def test_label_scan_finds_out_of_range_values_and_missing_annotations(tmp_path):
    root = tmp_path / 'data'
    ade = make_ade20k_like(root, num_train=3, num_val=1)
    cfg = _tiny_cfg('segmenter_lookhere_vit-t_tiny-ade.py', ade)
    assert check_label_values(cfg) == {'train_dataloader': 3, 'val_dataloader': 1}
    bad = ade / 'annotations' / 'training' / 'ADE_train_00000002.png'
    seg = cv2.imread(str(bad), cv2.IMREAD_UNCHANGED)
    seg[:4, :4] = 200  # class 199 after reduce_zero_label; ADE20K has 150
    cv2.imwrite(str(bad), seg)
    with pytest.raises(LabelRangeError) as err:
        check_label_values(cfg)
    assert 'ADE_train_00000002.png' in str(err.value) and '199' in str(err.value)
    assert 'reduce_zero_label' in str(err.value)
    bad.unlink()
    with pytest.raises(DatasetLayoutError, match='1 of 3 images have no annotation file'):
        check_label_values(cfg)


def test_crop_larger_than_every_resized_image_is_an_error(data):
    _, ade, _ = data
    cfg = _tiny_cfg('segmenter_lookhere_vit-t_tiny-ade.py', ade)
    check_crop_fits(cfg)  # the demo config fits: crop 128, short side up to 256
    for t in cfg.train_dataloader.dataset.pipeline:
        if t['type'] == 'RandomCrop':
            t['crop_size'] = (600, 600)
    with pytest.raises(CropSizeError) as err:
        check_crop_fits(cfg)
    msg = str(err.value)
    assert 'crop_size=(600, 600)' in msg and 'at most' in msg and 'Lower crop_size' in msg


def test_cityscapes_small_objects_keep_their_pixel_size():
    """cityscapes_scene(small_objects=n): round(n * H * W / (256 * 512)) traffic lights whose
    size in pixels does not grow with the frame (detail a lower resolution loses); 0 is the
    scene without them, draw for draw; a negative or non-finite count is refused."""
    from research.datasets.synthetic_seg import SMALL_OBJECT_PX, cityscapes_scene

    light = CITYSCAPES_CLASSES['traffic light']
    plain = cityscapes_scene(128, 256, np.random.default_rng(3))
    zero = cityscapes_scene(128, 256, np.random.default_rng(3), small_objects=0)
    assert all(np.array_equal(a, b) for a, b in zip(plain, zero))
    assert not (plain[1] == light).any()
    for size in ((256, 512), (1024, 2048)):
        _, lab = cityscapes_scene(*size, np.random.default_rng(3), small_objects=2)
        n = round(2 * size[0] * size[1] / (256 * 512))
        count, _, stats, _ = cv2.connectedComponentsWithStats((lab == light).astype(np.uint8))
        widths = stats[1:, cv2.CC_STAT_WIDTH]
        assert 0.6 * n <= count - 1 <= n, (size, count - 1, n)  # some overlap or are covered
        assert SMALL_OBJECT_PX[0] - 1 <= np.median(widths) <= SMALL_OBJECT_PX[1] + 1, widths
    for bad in (-1, float('nan')):
        with pytest.raises(ValueError, match='small_objects=.* is not >= 0'):
            cityscapes_scene(64, 128, np.random.default_rng(0), small_objects=bad)


def test_a_crop_the_data_preprocessor_pads_up_is_warned_about(data, tmp_path):
    """The crop lowered (``--cfg-options train_dataloader.dataset.pipeline.N.crop_size``)
    and ``data_preprocessor.size`` left: every crop trains part padding, silently before."""
    from lookhere_dense.apis.train import build_train_config
    from lookhere_dense.data.checks import crop_padding_note

    _, ade, _ = data
    cfg = _tiny_cfg('segmenter_lookhere_vit-t_tiny-ade.py', ade)
    assert crop_padding_note(cfg) is None  # the config as shipped: crop = size
    size = tuple(cfg.model.data_preprocessor.size)
    index = [t['type'] for t in cfg.train_dataloader.dataset.pipeline].index('RandomCrop')
    small = (size[0] // 2, size[1] // 2)
    cfg.train_dataloader.dataset.pipeline[index]['crop_size'] = small
    expected = (
        f'train_dataloader: RandomCrop crop_size={small} is smaller than '
        f'model.data_preprocessor.size={size}: every training crop is padded to '
        f'{size[0]}x{size[1]} (75% padding, label 255)'
    )
    assert crop_padding_note(cfg).startswith(expected)
    roots = {
        f'{split}_dataloader.dataset.data_root': str(ade) for split in ('train', 'val', 'test')
    }
    key = f'train_dataloader.dataset.pipeline.{index}.crop_size'
    _, notes = build_train_config(
        osp.join(REPO, 'configs', 'segmenter_lookhere_vit-t_tiny-ade.py'),
        work_dir=str(tmp_path / 'w'),
        cfg_options={**roots, key: small},
    )
    assert any(n.startswith(expected) for n in notes), notes
