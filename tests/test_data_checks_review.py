"""Data checks that refused correct set-ups (review faults): a custom dataset of its own
classes reduced, an ignore value other than 255 configured the mmseg way, images a little
smaller than the crop, a test split without annotations (``format_only``), and the
pre-check reading labels otherwise than the pipeline's ``LoadAnnotations``. On the tiny
ADE20K-layout data, through mmseg's own dataset classes."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image
from tiny_seg import tiny_ade_config as config

from lookhere_dense.data.checks import (
    check_crop_fits,
    check_dataset_layout,
    check_label_values,
    sync_label_checks,
)
from lookhere_dense.errors import ConfigError, CropSizeError, DataCheckWarning, LabelRangeError


def annotations(root: Path, split: str = 'training'):
    return sorted((root / 'annotations' / split).glob('*.png'))


def _rewrite(paths, change) -> None:
    """Rewrite each annotation as ``change(label map)`` (uint8)."""
    for path in paths:
        seg = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
        cv2.imwrite(str(path), change(seg).astype(np.uint8))


# ----------------------------------------------------------------------------------------
# reduce_zero_label on a custom dataset class of its own classes
# ----------------------------------------------------------------------------------------
def _own_dataset(declares_false: bool):
    """A user's ``BaseSegDataset`` subclass naming 4 classes of its own; with
    ``declares_false`` its constructor states ``reduce_zero_label=False`` itself."""
    from mmseg.datasets import BaseSegDataset

    class OwnDataset(BaseSegDataset):
        METAINFO = dict(classes=('road', 'tree', 'house', 'rare'))

        def __init__(self, **kwargs):
            super().__init__(img_suffix='.jpg', seg_map_suffix='.png', **kwargs)

    class DeclaredDataset(OwnDataset):
        def __init__(self, reduce_zero_label=False, **kwargs):
            super().__init__(reduce_zero_label=reduce_zero_label, **kwargs)

    return DeclaredDataset if declares_false else OwnDataset


def _background_and_border(seg):
    """0 = unlabelled, classes stored as 1..3 (the rare 4th in no file), 255 = a border."""
    out = np.zeros_like(seg)
    for k in (1, 2, 3):
        out[seg % 4 == k] = k
    out[:2] = 255
    return out


def _own_classes_config(ade: Path, dataset_type):
    cfg = config(ade)
    ds = cfg.train_dataloader.dataset
    ds.type = dataset_type
    ds.reduce_zero_label = True  # 0 -> 255, k -> k-1, 255 stays 255: right for these files
    cfg.model.decode_head.num_classes = 4
    return cfg


def test_a_custom_dataset_of_its_own_classes_reduced_is_warned_not_refused(ade):
    """Files whose 0 is unlabelled and 255 a border, the top class in no checked file, on
    a user's dataset class that names its own classes but inherits BaseSegDataset's
    default: reducing is right, so a warning giving both readings, not a refusal whose
    advice (reduce_zero_label=False) trains every class as its neighbour."""
    _rewrite(annotations(ade), _background_and_border)
    cfg = _own_classes_config(ade, _own_dataset(declares_false=False))
    with pytest.warns(DataCheckWarning) as caught:
        assert check_label_values(cfg, ['train']) == {'train_dataloader': 4}
    said = ' '.join(str(w.message) for w in caught)
    assert 'train_dataloader.dataset.reduce_zero_label=True, but 4 of 4' in said
    assert 'If 0 marks unlabelled pixels and the classes are stored as 1..4' in said
    assert 'reduce_zero_label=True is right' in said and '--skip-data-check' not in said
    # a class that states reduce_zero_label=False for its own classes: still refused
    cfg = _own_classes_config(ade, _own_dataset(declares_false=True))
    with pytest.raises(LabelRangeError, match=r'Set train_dataloader\.dataset\.reduce_zero_label'):
        check_label_values(cfg, ['train'])


# ----------------------------------------------------------------------------------------
# The ignore value the loss reads
# ----------------------------------------------------------------------------------------
def _ignore_100_config(ade: Path, head_ignore=100):
    """Own data of 10 classes (0..9) whose ignore value is 100, configured the mmseg way
    (``decode_head.ignore_index``, ``CheckSegLabels`` / ``RandomCrop`` / ``IoUMetric``)."""
    _rewrite(
        annotations(ade) + annotations(ade, 'validation'),
        lambda s: np.where(np.arange(s.shape[0])[:, None] < 3, 100, s % 10),
    )
    cfg = config(ade)
    for split in ('train', 'val', 'test'):
        ds = cfg[f'{split}_dataloader'].dataset
        ds.type = 'BaseSegDataset'
        ds.update(img_suffix='.jpg', seg_map_suffix='.png', reduce_zero_label=False)
        ds.metainfo = dict(classes=tuple(f'c{i}' for i in range(10)))
        for t in ds.pipeline:
            if t['type'] == 'LoadAnnotations':
                t.pop('reduce_zero_label', None)
            if t['type'] in ('CheckSegLabels', 'RandomCrop'):
                t['ignore_index'] = 100
    cfg.model.decode_head.num_classes = 10
    if head_ignore is not None:
        cfg.model.decode_head.ignore_index = head_ignore
    cfg.model.data_preprocessor.seg_pad_val = 100
    cfg.val_evaluator.ignore_index = 100
    return cfg


def test_the_ignore_value_is_the_one_the_loss_reads(ade):
    """``model.decode_head.ignore_index=100`` (what mmseg's loss ignores): the label value
    100 passes; the dataset's ``ignore_index`` (stored, read by neither the loss nor the
    metric) alone does not make it ignored, and the message says which key to set."""
    cfg = _ignore_100_config(ade)
    assert check_label_values(cfg, ['train', 'val']) == {
        'train_dataloader': 4,
        'val_dataloader': 2,
    }
    cfg = _ignore_100_config(ade, head_ignore=None)
    cfg.train_dataloader.dataset.ignore_index = 100
    with pytest.raises(LabelRangeError) as err:
        check_label_values(cfg, ['train'])
    msg = str(err.value)
    assert 'has label values [100] outside the classes 0..9' in msg
    assert '(ignore index 255, default of model.decode_head.ignore_index)' in msg
    assert 'train_dataloader.dataset.ignore_index=100 is read by neither the loss' in msg
    assert 'set model.decode_head.ignore_index=100' in msg


def test_heads_that_ignore_different_values_are_refused(ade):
    cfg = _ignore_100_config(ade)
    cfg.model.auxiliary_head = dict(type='FCNHead', in_channels=192, channels=8, num_classes=10)
    with pytest.raises(
        ConfigError,
        match=r'model\.decode_head\.ignore_index=100, model\.auxiliary_head\.ignore_index=255 '
        r"\(FCNHead's default\)",
    ):
        check_label_values(cfg, ['train'])


def test_label_checks_follow_the_heads_ignore_index(ade):
    """``sync_label_checks`` gives every ``CheckSegLabels`` the loss's ignore value, as it
    gives them the head's class count."""
    cfg = config(ade)
    cfg.model.decode_head.ignore_index = 100
    notes = sync_label_checks(cfg, ['train', 'val'])
    steps = [
        t
        for split in ('train', 'val')
        for t in cfg[f'{split}_dataloader'].dataset.pipeline
        if t['type'] == 'CheckSegLabels'
    ]
    assert [t['ignore_index'] for t in steps] == [100, 100]
    assert any('ignore_index=100, the value the loss ignores' in n for n in notes)
    cfg.model.decode_head.pop('ignore_index')  # the head's default again: 255
    sync_label_checks(cfg, ['train'])
    assert [t['ignore_index'] for t in steps[:1]] == [255]


# ----------------------------------------------------------------------------------------
# Crops a little larger than an image
# ----------------------------------------------------------------------------------------
def _shrink_first_pair(ade: Path, size_hw) -> None:
    img = sorted((ade / 'images' / 'training').glob('*.jpg'))[0]
    ann = ade / 'annotations' / 'training' / (img.stem + '.png')
    h, w = size_hw
    Image.open(img).resize((w, h)).save(img)
    Image.open(ann).resize((w, h), Image.NEAREST).save(ann)


def test_a_crop_a_little_larger_than_an_image_is_warned_not_refused(ade):
    """No resize, a 120x200 image under a 128x128 crop: 6% of the crop is padding (mmseg
    trains on it); refused only when more than half of the crop would be padding."""
    _shrink_first_pair(ade, (120, 200))
    cfg = config(ade)
    pipeline = cfg.train_dataloader.dataset.pipeline
    cfg.train_dataloader.dataset.pipeline = [t for t in pipeline if t['type'] != 'RandomResize']
    with pytest.warns(DataCheckWarning, match=r'larger than 1 of the 4 checked images.*6% of a'):
        check_crop_fits(cfg)
    _shrink_first_pair(ade, (60, 200))  # 1 - 60 / 128 = 53% padding
    with pytest.raises(CropSizeError, match=r'mostly padding \(53% of its area, more than half'):
        check_crop_fits(cfg)


# ----------------------------------------------------------------------------------------
# A test split without annotations
# ----------------------------------------------------------------------------------------
def _unlabelled_test_config(ade: Path, format_only: bool = True):
    """mmseg's set-up for a test set without labels: no LoadAnnotations in the test
    pipeline, ``test_evaluator.format_only=True``."""
    cfg = config(ade)
    ds = cfg.test_dataloader.dataset
    ds.pipeline = [
        t for t in ds.pipeline if t['type'] not in ('LoadAnnotations', 'CheckSegLabels')
    ]
    cfg.test_evaluator = dict(
        type='IoUMetric', format_only=format_only, output_dir=str(ade.parent / 'out')
    )
    return cfg


def test_a_test_split_without_annotations_passes_with_format_only(ade):
    folder = ade / 'annotations' / 'validation'
    shutil.rmtree(folder)
    check_dataset_layout(_unlabelled_test_config(ade), ['test'])
    folder.mkdir()  # an empty annotation folder: no image has its annotation
    unlabelled = {}
    assert check_label_values(_unlabelled_test_config(ade), ['test'], images_only=unlabelled) == {}
    assert unlabelled == {'test_dataloader': 2}
    # an evaluator that scores against the annotations needs them: said so
    scoring = _unlabelled_test_config(ade, format_only=False)
    said = (
        r'test_dataloader: the pipeline loads no annotations \(no LoadAnnotations\), but '
        r'test_evaluator scores the predictions against them.*test_evaluator\.format_only=True'
    )
    with pytest.raises(ConfigError, match=said):
        check_label_values(scoring, ['test'])
    folder.rmdir()
    with pytest.raises(ConfigError, match=said):
        check_dataset_layout(scoring, ['test'])


# ----------------------------------------------------------------------------------------
# Labels read as the pipeline's LoadAnnotations reads them
# ----------------------------------------------------------------------------------------
def _palette(paths) -> None:
    """Save each annotation as a palette PNG of the same indices (colours other than
    them)."""
    for path in paths:
        seg = np.array(Image.open(path))
        im = Image.frombytes('P', seg.shape[::-1], seg.tobytes())
        im.putpalette([(i * 37) % 256 for i in range(768)])
        im.save(path)


def test_labels_are_read_with_the_pipelines_load_annotations(ade):
    """Palette PNGs of class ids pass with mmseg's default decoder (pillow: the indices);
    ``LoadAnnotations(imdecode_backend='cv2')`` reads their colours, and training stopped
    on the first one while the pre-check, reading with pillow, passed."""
    _palette(annotations(ade))
    cfg = config(ade)
    assert check_label_values(cfg, ['train']) == {'train_dataloader': 4}
    for t in cfg.train_dataloader.dataset.pipeline:
        if t['type'] == 'LoadAnnotations':
            t['imdecode_backend'] = 'cv2'
    with pytest.raises(LabelRangeError, match=r"is a palette PNG .*imdecode_backend='cv2'"):
        check_label_values(cfg, ['train'])


def test_a_load_annotations_reduce_zero_label_other_than_the_datasets_is_named(ade):
    """mmseg's LoadAnnotations asserts its reduce_zero_label equals the dataset's: the
    pre-check says so instead of passing (it read with a bare LoadAnnotations)."""
    cfg = config(ade)
    cfg.train_dataloader.dataset.reduce_zero_label = False
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', DataCheckWarning)
        with pytest.raises(
            ConfigError,
            match=r"train_dataloader\.dataset\.pipeline's LoadAnnotations has "
            r'reduce_zero_label=True, but train_dataloader\.dataset\.reduce_zero_label=False',
        ):
            check_label_values(cfg, ['train'])


def test_a_check_of_every_file_shows_progress(tmp_path, monkeypatch):
    """``--check-all-data`` decodes every image and annotation (minutes on ADE20K): the
    check says how far it is (a line every ``PROGRESS_SECONDS``; 0 here: one per file)."""
    from tiny_seg import make_ade

    from lookhere_dense.data import checks

    cfg = config(make_ade(tmp_path / 'data', num_train=3, num_val=1))
    monkeypatch.setattr(checks, 'PROGRESS_SECONDS', 0.0)
    lines = []
    sizes = checks.check_label_values(cfg, ('train',), max_files=10**9, progress=lines.append)
    assert sizes == {'train_dataloader': 3}
    assert lines == [
        f'train_dataloader: {k} of 3 images and annotations decoded' for k in (0, 1, 2)
    ]


# ----------------------------------------------------------------------------------------
# Labels saved as JPEG
# ----------------------------------------------------------------------------------------
def test_annotations_saved_as_jpeg_are_warned(ade, pristine):
    """JPEG is lossy: a label map saved as JPEG reads back with other class ids along its
    region edges, all inside the classes, so nothing else in the check can see it and mmseg
    trains on them. The check warns, naming the file and the suffix key; PNG labels pass
    without a warning."""
    changed = 0
    for path in annotations(ade):
        seg = cv2.imread(str(path), cv2.IMREAD_UNCHANGED) % 4 * 20  # ids 0, 20, 40, 60
        jpg = path.with_suffix('.jpg')
        cv2.imwrite(str(jpg), seg)
        changed += int((cv2.imread(str(jpg), cv2.IMREAD_UNCHANGED) != seg).sum())
        path.unlink()
    assert changed > 0  # the reason for the warning: the ids read back are not those saved
    cfg = config(ade)
    cfg.train_dataloader.dataset.seg_map_suffix = '.jpg'
    with pytest.warns(DataCheckWarning) as said:
        assert check_label_values(cfg, ['train']) == {'train_dataloader': 4}
    msg = [str(w.message) for w in said if 'JPEG' in str(w.message)]
    assert len(msg) == 1, [str(w.message) for w in said]
    assert msg[0].startswith(
        f"train_dataloader: 4 of 4 annotations are JPEG files, e.g. '{ade}/annotations/training/"
    )
    assert "(train_dataloader.dataset.seg_map_suffix='.jpg'): JPEG is lossy" in msg[0]
    with warnings.catch_warnings():
        warnings.simplefilter('error', DataCheckWarning)
        assert check_label_values(config(pristine), ['train']) == {'train_dataloader': 4}


def test_a_split_without_annotations_gets_its_data_check_line(ade, monkeypatch):
    """The tools say which splits passed the data check: a test split without annotations
    (``format_only``) too, with what it holds."""
    from lookhere_dense.apis import cli

    lines = []
    monkeypatch.setattr(cli, 'log_rank0', lambda msg, level=None: lines.append(msg))
    cli.preflight(_unlabelled_test_config(ade), ['test'], check_pretrained=False)
    assert [ln for ln in lines if ln.startswith('data check passed')] == [
        'data check passed: test_dataloader has 2 images (its pipeline loads no annotations: '
        'the predictions are written, not scored)'
    ]
