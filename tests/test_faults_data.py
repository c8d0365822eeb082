"""Fault battery, segmentation data: every broken dataset ends in a message naming the file
(at check time, :func:`check_seg_data`, and where possible at load time, the
``CheckSegLabels`` pipeline step), or trains correctly. On the tiny ADE20K-layout data,
through mmseg's own dataset class and transforms.
"""

from __future__ import annotations

import copy
import os.path as osp
import re
import shutil
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image
from tiny_seg import tiny_ade_config as config

from lookhere_dense.data.checks import check_dataset_layout, check_seg_data, image_size
from lookhere_dense.data.transforms import CheckSegLabels
from lookhere_dense.errors import (
    DataCheckWarning,
    DatasetLayoutError,
    LabelRangeError,
    LabelSizeError,
    UnreadableFileError,
)

REPO = Path(__file__).resolve().parents[1]


def files(root: Path, split: str = 'training', i: int = 2):
    name = f'ADE_{"train" if split == "training" else "val"}_{i:08d}'
    return (root / 'images' / split / f'{name}.jpg', root / 'annotations' / split / f'{name}.png')


TRAIN_STEPS = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegLabels', num_classes=150),
]
#: mmseg's test order: the image is resized before the annotation is loaded
TEST_STEPS = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(512, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegLabels', num_classes=150),
]


def load_pair(root: Path, index: int, split: str = 'training', steps=TRAIN_STEPS):
    """Load one pair through mmseg's dataset and the config's first pipeline steps."""
    from mmengine.registry import DefaultScope
    from mmseg.datasets import ADE20KDataset

    with DefaultScope.overwrite_default_scope('mmseg'):
        ds = ADE20KDataset(
            data_root=str(root),
            data_prefix=dict(img_path=f'images/{split}', seg_map_path=f'annotations/{split}'),
            pipeline=steps,
        )
        return ds[index]


def test_the_tiny_data_passes(ade):
    assert check_seg_data(config(ade), ['train', 'val']) == {
        'train_dataloader': 4,
        'val_dataloader': 2,
    }


def test_images_whose_suffix_differs_only_in_spelling_are_named(ade):
    """``.JPG`` / ``.jpeg`` images with annotations are not read by a ``.jpg`` dataset
    (mmseg drops them): the check said 'passed' over half the data."""
    for i, suffix in ((1, '.JPG'), (2, '.jpeg')):
        img, _ = files(ade, i=i)
        img.rename(img.with_suffix(suffix))
    with pytest.warns(DataCheckWarning) as seen:
        sizes = check_seg_data(config(ade), ['train'])
    assert sizes == {'train_dataloader': 2}
    msgs = [str(w.message) for w in seen if 'img_suffix' in str(w.message)]
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith(
        'train_dataloader: 2 image(s) with an annotation are not read because their names do '
        "not end in img_suffix='.jpg', e.g. "
    )
    assert 'ADE_train_00000001.JPG' in msgs[0]
    assert 'set train_dataloader.dataset.img_suffix (training uses the 2 others)' in msgs[0]


def test_an_image_in_another_format_is_named(ade):
    """An image saved as ``.png`` beside its annotation is left out by mmseg (it lists
    ``.jpg``): the check passed over it without a word."""
    img, _ = files(ade, i=1)
    Image.open(img).save(img.with_suffix('.png'))
    img.unlink()
    with pytest.warns(DataCheckWarning) as seen:
        sizes = check_seg_data(config(ade), ['train'])
    assert sizes == {'train_dataloader': 3}
    msgs = [str(w.message) for w in seen if 'another format' in str(w.message)]
    assert len(msgs) == 1, [str(w.message) for w in seen]
    assert msgs[0].startswith(
        'train_dataloader: 1 image(s) with an annotation are not read because they are saved '
        "in another format than img_suffix='.jpg', e.g. "
    )
    assert 'ADE_train_00000001.png' in msgs[0] and 'the run uses the 3 images' in msgs[0]


def test_cityscapes_images_misspelt_and_in_another_format_are_told_apart(tmp_path):
    """Cityscapes names images ``*_leftImg8bit.png``: ``*_leftImg8bit.PNG`` is the same
    format spelt otherwise, ``*_leftImg8bit.jpg`` another format; mmseg reads neither and
    says nothing. One walk of the annotation folder names each in its own warning."""
    from mmengine.config import Config

    from research.datasets.synthetic_seg import make_cityscapes_like

    root = make_cityscapes_like(tmp_path, num_train=3, num_val=1)
    images = sorted((root / 'leftImg8bit' / 'train').rglob('*_leftImg8bit.png'))
    assert len(images) == 3
    images[0].rename(images[0].with_suffix('.PNG'))
    Image.open(images[1]).save(images[1].with_suffix('.jpg'))
    images[1].unlink()
    cfg = Config.fromfile(str(REPO / 'configs' / 'segmenter_lookhere_vit-t_tiny-cityscapes.py'))
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = str(root)
    with pytest.warns(DataCheckWarning) as seen:
        assert check_seg_data(cfg, ['train']) == {'train_dataloader': 1}
    msgs = [str(w.message) for w in seen if 'not read because' in str(w.message)]
    assert len(msgs) == 2, msgs
    msgs.sort(key=lambda m: 'another format' not in m)  # the other-format one first
    assert "another format than img_suffix='_leftImg8bit.png'" in msgs[0]
    assert images[1].with_suffix('.jpg').name in msgs[0]
    assert images[0].with_suffix('.PNG').name not in msgs[0]
    assert "names do not end in img_suffix='_leftImg8bit.png'" in msgs[1]
    assert images[0].with_suffix('.PNG').name in msgs[1]
    assert images[1].with_suffix('.jpg').name not in msgs[1]


def _reduce_zero_label(cfg, value: bool):
    """``reduce_zero_label`` on every split's dataset, as a hand-written config sets it."""
    for split in ('train', 'val', 'test'):
        ds = cfg[f'{split}_dataloader'].dataset
        ds.reduce_zero_label = value
        for t in ds.pipeline:
            t.pop('reduce_zero_label', None)
    return cfg


def test_ade20k_files_without_reduce_zero_label_are_refused(ade):
    """ADE20K's own files (0 = "other", class k stored as k+1) with
    ``reduce_zero_label=False``: every value is in range on the tiny data (and on real
    ADE20K until a file holds 150), so every class trained as its neighbour."""
    with pytest.raises(
        LabelRangeError,
        match=r'train_dataloader\.dataset\.reduce_zero_label=False on ADE20KDataset \(whose '
        r'default is True\), but \d of 4 checked label files hold 0 and none holds 255',
    ):
        check_seg_data(_reduce_zero_label(config(ade), False), ['train'])
    # files reduced already (255 marks what was 0) train with reduce_zero_label=False
    for i in range(1, 5):
        _, ann = files(ade, i=i)
        seg = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED)
        cv2.imwrite(str(ann), np.where(seg == 0, 255, seg - 1).astype(np.uint8))
    assert check_seg_data(_reduce_zero_label(config(ade), False), ['train']) == {
        'train_dataloader': 4
    }


def test_cityscapes_train_ids_with_reduce_zero_label_are_refused(tmp_path):
    """Cityscapes trainIds (0 = road, 255 = ignore) with ``reduce_zero_label=True``: road
    became ignored and every class its neighbour, all in range, without a word."""
    from mmengine.config import Config

    from research.datasets.synthetic_seg import make_cityscapes_like

    root = make_cityscapes_like(tmp_path, num_train=2, num_val=1)
    cfg = Config.fromfile(str(REPO / 'configs' / 'segmenter_lookhere_vit-t_tiny-cityscapes.py'))
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.data_root = str(root)
    assert check_seg_data(copy.deepcopy(cfg), ['train', 'val']) == {
        'train_dataloader': 2,
        'val_dataloader': 1,
    }
    with pytest.raises(
        LabelRangeError,
        match=r'train_dataloader\.dataset\.reduce_zero_label=True, but 2 of 2 checked label '
        r'files already hold 255 .*Cityscapes trainIds: 0 = road.*--skip-data-check',
    ):
        check_seg_data(_reduce_zero_label(cfg, True), ['train', 'val'])


def test_files_whose_0_and_255_are_both_ignored_pass_with_reduce_zero_label(ade):
    """mmseg keeps 255 ignored when it reduces: files whose 0 is an ignored background and
    255 a void border (a VOC-style set without its background class) are right with
    ``reduce_zero_label=True`` and pass -- they hold the value num_classes, which only
    reducing fits (Cityscapes trainIds do not)."""
    for i in range(1, 5):
        _, ann = files(ade, i=i)
        seg = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED)
        seg[:2] = 255  # a void border
        seg[2, :] = 150  # the top class, stored as 150
        cv2.imwrite(str(ann), seg)
    with warnings.catch_warnings():
        warnings.simplefilter('error', DataCheckWarning)  # not even a warning
        assert check_seg_data(config(ade), ['train']) == {'train_dataloader': 4}


def test_a_reduced_dataset_of_its_own_classes_is_warned_not_refused():
    """Files whose 0 is an ignored background and 255 a border, with the top class missing
    from the checked sample, look like Cityscapes trainIds reduced: on a dataset class of
    its own classes that is an error (Cityscapes), on a custom one a warning."""
    from lookhere_dense.data.labels import reduce_zero_label_verdict

    args = ('train_dataloader.dataset', True, False, 'BaseSegDataset', 4, 4, 4, 20, 21, False)
    msg, error = reduce_zero_label_verdict(*args, type_classes=False)
    assert not error and 'reduce_zero_label=True, but 4 of 4' in msg
    assert '--skip-data-check' not in msg
    msg, error = reduce_zero_label_verdict(*args, type_classes=True)
    assert error and msg.endswith('--skip-data-check skips the data checks')
    # the top class among the checked files: reducing is what makes it fit
    assert reduce_zero_label_verdict(*args[:7], 21, 21, False, True) == (None, False)


def test_a_16_bit_annotation_above_255_is_refused(ade):
    """mmseg casts label maps to uint8: class 300 of a 16-bit PNG trained as 44, and the
    label checks (after the cast) passed."""
    _, ann = files(ade)
    seg = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED).astype(np.uint16)
    seg[0, 0] = 300
    cv2.imwrite(str(ann), seg)
    with pytest.raises(
        LabelRangeError,
        match=rf"annotation '{ann}' is a uint16 map holding label values up to 300: .* "
        'would become 44',
    ):
        check_seg_data(config(ade), ['train'])
    seg[0, 0] = 511  # 255 after the cast too, but a class: it would be ignored silently
    cv2.imwrite(str(ann), seg)
    with pytest.raises(LabelRangeError, match='holding label values up to 511'):
        check_seg_data(config(ade), ['train'])
    seg[0, 0] = 65535  # the 16-bit ignore value: 255 after the cast, as meant
    cv2.imwrite(str(ann), seg)
    check_seg_data(config(ade), ['train'])


@pytest.mark.parametrize('classes', [30, 171])
def test_the_label_check_follows_the_heads_class_count(ade, classes):
    """``--cfg-options model.decode_head.num_classes=N``: the pipeline's
    ``CheckSegLabels(num_classes=150)`` follows (label 40 passed it with 30 classes and
    training died in the loss; 171 classes had label 160 refused as outside "the model's
    150 classes")."""
    from lookhere_dense.apis.cli import preflight

    cfg = config(ade)
    cfg.model.decode_head.num_classes = classes
    preflight(cfg, ('train', 'val'), check_pretrained=False, check_data=False)
    steps = [s for s in cfg.train_dataloader.dataset.pipeline if s['type'] == 'CheckSegLabels']
    assert [s['num_classes'] for s in steps] == [classes]
    _, ann = files(ade)
    label = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED)
    label[0, 0] = 161  # class 160 after reduce_zero_label
    cv2.imwrite(str(ann), label)
    first = cfg.train_dataloader.dataset.pipeline[:3]
    assert first[-1]['type'] == 'CheckSegLabels'
    if classes == 171:
        load_pair(ade, 1, steps=first)
    else:
        with pytest.raises(LabelRangeError, match=r'model has 30 classes'):
            load_pair(ade, 1, steps=first)


# ----------------------------------------------------------------------------------------
# Image / annotation sizes
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('resize', ['other_size', 'transposed'])
def test_an_annotation_of_another_size_is_named(ade, resize):
    img, ann = files(ade)
    seg = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED)
    h, w = seg.shape
    new = (w // 2, h // 2) if resize == 'other_size' else (h, w)  # cv2 takes (W, H)
    cv2.imwrite(str(ann), cv2.resize(seg, new, interpolation=cv2.INTER_NEAREST))
    want = (
        f"image '{img}' is {h}x{w} px (H x W) but its annotation '{ann}' is {new[1]}x{new[0]} px"
    )
    with pytest.raises(LabelSizeError) as err:
        check_seg_data(config(ade), ['train'])
    assert want in str(err.value) and 'train_dataloader' in str(err.value)
    for steps in (TRAIN_STEPS, TEST_STEPS):  # at load time too
        load_pair(ade, 0, steps=steps)
        with pytest.raises(
            LabelSizeError,
            match=rf"CheckSegLabels: image '.*{img.name}' is "
            rf'{h}x{w} px',
        ):
            load_pair(ade, 1, steps=steps)


def test_several_mismatches_are_counted(ade):
    for i in (1, 3):
        _, ann = files(ade, i=i)
        seg = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED)
        cv2.imwrite(str(ann), seg[:-8])
    with pytest.raises(LabelSizeError, match=r'ADE_train_00000001.png.*\(1 more pairs differ\)'):
        check_seg_data(config(ade), ['train'])


def test_exif_rotated_photos_are_compared_as_loaded(ade):
    """A JPEG stored landscape with EXIF orientation 6 is loaded (by mmcv) portrait: its
    annotation must have the loaded size, not the stored one."""
    img, ann = files(ade)
    rgb = np.asarray(Image.open(img))
    seg = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to view
    Image.fromarray(np.ascontiguousarray(np.rot90(rgb, 1))).save(img, exif=exif.tobytes())
    assert image_size(str(img)) == seg.shape[::-1]
    assert image_size(str(img), apply_orientation=True) == seg.shape
    check_seg_data(config(ade), ['train'])  # the annotation fits the loaded image
    assert load_pair(ade, 1)['img'].shape[:2] == seg.shape
    cv2.imwrite(str(ann), np.ascontiguousarray(seg.T))  # fits the stored image only
    with pytest.raises(LabelSizeError):
        check_seg_data(config(ade), ['train'])
    with pytest.raises(LabelSizeError):
        load_pair(ade, 1)


# ----------------------------------------------------------------------------------------
# Files that cannot be read
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'which,damage',
    [
        ('image', 'garbage'),
        ('image', 'truncated'),
        ('annotation', 'garbage'),
        ('annotation', 'empty'),
    ],
)
def test_unreadable_files_are_named(ade, which, damage):
    img, ann = files(ade)
    path = img if which == 'image' else ann
    data = path.read_bytes()
    path.write_bytes(
        {'garbage': b'\x89PNG not really' * 8, 'empty': b'', 'truncated': data[: len(data) // 2]}[
            damage
        ]
    )
    with pytest.raises(UnreadableFileError, match=rf"cannot read {which} file '{path}'"):
        check_seg_data(config(ade), ['train'])


# ----------------------------------------------------------------------------------------
# Empty splits, annotations with nothing to learn, colour annotations
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('split,loader', [('training', 'train'), ('validation', 'val')])
def test_an_empty_split_says_no_images(ade, split, loader):
    for folder in ('images', 'annotations'):
        for f in (ade / folder / split).iterdir():
            f.unlink()
    with pytest.raises(
        DatasetLayoutError,
        match=rf'{loader}_dataloader: no images ending in '
        rf"'.jpg' under '.*{split}'",
    ):
        check_seg_data(config(ade), ['train', 'val'])


def test_annotations_with_only_the_ignore_index_are_reported(ade):
    _, ann = files(ade)
    seg = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(ann), np.zeros_like(seg))  # 0 = "other" -> 255 after reduce_zero
    with pytest.warns(
        DataCheckWarning,
        match=rf'train_dataloader: 1 of 4 checked annotation'
        rf'\(s\) hold only the ignore index 255 '
        rf"\('{ann}'\).*acc_seg reports 100",
    ):
        check_seg_data(config(ade), ['train'])
    t = CheckSegLabels(num_classes=150)  # at load time: once per file
    results = dict(gt_seg_map=np.full((4, 4), 255, np.uint8), seg_map_path='x/all255.png')
    with pytest.warns(DataCheckWarning, match=r"'x/all255.png'"):
        t(dict(results))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        t(dict(results))
    for i in (1, 3, 4):
        _, other = files(ade, i=i)
        cv2.imwrite(str(other), np.zeros_like(cv2.imread(str(other), cv2.IMREAD_UNCHANGED)))
    with pytest.raises(LabelRangeError, match=r'4 of 4 checked annotation.*Nothing to train'):
        check_seg_data(config(ade), ['train'])


def test_colour_annotations_are_refused(ade):
    _, ann = files(ade)
    seg = cv2.imread(str(ann), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(ann), np.stack([seg] * 3, axis=-1))
    with pytest.raises(
        LabelRangeError,
        match=rf"annotation '{ann}' has shape \(\d+, \d+, 3\), "
        r'not \(H, W\): a colour image',
    ):
        check_seg_data(config(ade), ['train'])
    with pytest.raises(LabelRangeError, match=r'CheckSegLabels: .* not \(H, W\)'):
        load_pair(ade, 1)


def test_data_root_with_a_file_instead_of_images(ade):
    """A non-image file with an image extension among the images is named."""
    bogus = ade / 'images' / 'training' / 'ADE_train_00000009.jpg'
    bogus.write_text('<html>404</html>')
    shutil.copy(files(ade)[1], ade / 'annotations' / 'training' / 'ADE_train_00000009.png')
    with pytest.raises(UnreadableFileError, match=rf"cannot read image file '{bogus}'"):
        check_seg_data(config(ade), ['train'])
    assert osp.exists(bogus)


# ----------------------------------------------------------------------------------------
# A missing dataset: the exact --cfg-options key, through dataset wrappers
# ----------------------------------------------------------------------------------------
def suggested(msg: str, path: Path) -> dict:
    """The ``--cfg-options`` a missing-data_root message suggests, with PATH = ``path``."""
    found = re.search(r'--cfg-options ((?:\S+=\S+ )+)\(PATH', msg)
    assert found, msg
    return dict(kv.replace('=PATH', f'={path}', 1).split('=', 1) for kv in found[1].split())


def layout_error(cfg) -> str:
    with pytest.raises(DatasetLayoutError) as err:
        check_dataset_layout(cfg)
    return str(err.value)


def test_a_repeat_dataset_detection_config_names_the_inner_data_root(tmp_path, monkeypatch):
    """mmdet's lsj-100e config wraps the COCO training set in a RepeatDataset:
    ``train_dataloader.dataset.data_root`` sets the wrapper, which passes nothing on."""
    from mmengine.config import Config

    coco = tmp_path / 'coco'
    for folder in ('annotations', 'train2017', 'val2017'):
        (coco / folder).mkdir(parents=True)
    for split in ('train', 'val'):
        (coco / 'annotations' / f'instances_{split}2017.json').write_text('{}')
    (tmp_path / 'det.py').write_text("_base_ = ['mmdet::common/lsj-100e_coco-instance.py']\n")
    monkeypatch.chdir(tmp_path)  # the config's data_root='data/coco/' is missing
    cfg = Config.fromfile(str(tmp_path / 'det.py'))
    cfg.merge_from_dict({'train_dataloader.dataset.data_root': str(coco)})  # the wrong key

    msg = layout_error(cfg)
    assert msg.startswith("train_dataloader: dataset folder data_root='data/coco/' not found")
    assert '--cfg-options train_dataloader.dataset.dataset.data_root=PATH ' in msg
    assert 'train_dataloader.dataset.dataset is the CocoDataset inside the RepeatDataset' in msg
    assert f"train_dataloader.dataset.data_root='{coco}' is set on the RepeatDataset" in msg
    assert '<data_root>/annotations/instances_train2017.json (ann_file, COCO-format' in msg
    assert '<data_root>/train2017/ (data_prefix.img)' in msg
    assert 'demo' not in msg  # tools/demo.py writes no COCO layout
    options = suggested(msg, coco)
    assert set(options) == {
        'train_dataloader.dataset.dataset.data_root',
        'val_dataloader.dataset.data_root',
        'test_dataloader.dataset.data_root',
        'val_evaluator.ann_file',
        'test_evaluator.ann_file',
    }
    assert options['val_evaluator.ann_file'] == f'{coco}/annotations/instances_val2017.json'

    cfg.merge_from_dict({'train_dataloader.dataset.dataset.data_root': str(coco)})
    msg = layout_error(cfg)  # the next one: val (and test, the same folder)
    assert msg.startswith('val_dataloader: dataset folder')
    assert '--cfg-options val_dataloader.dataset.data_root=PATH ' in msg
    assert 'test_dataloader.dataset.data_root=PATH' in msg and 'demo' not in msg

    cfg.merge_from_dict(suggested(msg, coco))
    check_dataset_layout(cfg)  # the suggested keys are the ones that work
    cfg.merge_from_dict({'val_evaluator.ann_file': str(tmp_path / 'nope.json')})
    msg = layout_error(cfg)  # CocoMetric reads its own file: named with its key
    assert msg.startswith(f"val_evaluator: the evaluator's ann_file '{tmp_path / 'nope.json'}'")
    assert '--cfg-options val_evaluator.ann_file=FILE' in msg
    check_dataset_layout(cfg, ('train',))  # not an evaluator of the splits checked
    cfg.val_evaluator.ann_file = f'{coco}/annotations/instances_val2017.json'
    shutil.rmtree(coco / 'train2017')
    msg = layout_error(cfg)
    assert 'train_dataloader.dataset.dataset.data_prefix.img=FOLDER' in msg
    assert 'demo' not in msg


@pytest.mark.parametrize('wrap', ['concat', 'repeat_of_concat'])
def test_a_concat_dataset_names_the_missing_member(ade, tmp_path, wrap):
    cfg = config(ade)
    good = copy.deepcopy(cfg.train_dataloader.dataset.to_dict())
    bad = dict(copy.deepcopy(good), data_root=str(tmp_path / 'nowhere'))
    dataset = dict(type='ConcatDataset', datasets=[good, bad])
    key = 'train_dataloader.dataset.datasets.1'
    if wrap == 'repeat_of_concat':
        dataset = dict(type='RepeatDataset', times=2, dataset=dataset)
        key = 'train_dataloader.dataset.dataset.datasets.1'
    cfg.train_dataloader.dataset = dataset
    msg = layout_error(cfg)
    assert f'--cfg-options {key}.data_root=PATH (PATH' in msg
    assert f'{key} is the ADE20KDataset inside the ConcatDataset' in msg
    assert 'ADE20K layout' in msg and 'tools/demo.py --data-only' in msg  # it writes this one
    cfg.merge_from_dict(suggested(msg, ade))
    check_dataset_layout(cfg)


def test_mmdet_cityscapes_instances_get_no_segmentation_layout(tmp_path):
    """mmdet's CityscapesDataset (instances, COCO-format JSON) is not mmseg's: neither the
    mmseg Cityscapes layout nor the demo datasets apply."""
    dataset = dict(
        type='CityscapesDataset',
        data_root=str(tmp_path / 'cityscapes'),
        ann_file='annotations/instancesonly_filtered_gtFine_train.json',
        data_prefix=dict(img='leftImg8bit/train/'),
    )
    for cfg in (
        dict(default_scope='mmdet', train_dataloader=dict(dataset=dataset)),
        dict(train_dataloader=dict(dataset=dict(dataset, type='mmdet.CityscapesDataset'))),
    ):
        msg = layout_error(cfg)
        assert 'Cityscapes layout' not in msg and 'demo' not in msg
        assert '--cfg-options train_dataloader.dataset.data_root=PATH (PATH' in msg
        assert '<data_root>/annotations/instancesonly_filtered_gtFine_train.json' in msg
