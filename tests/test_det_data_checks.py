"""The COCO-format annotation check before a detection run (``check_coco_annotations``,
run by the tools' preflight): class names the file lacks and images it lists that are
missing are named before anything is built (mmdet trained on nothing, dropped a
misspelt class's annotations without a word, or stopped at the first missing image
mid-training)."""

from __future__ import annotations

import copy
import os
import pathlib

import pytest
from mmengine.config import Config

from lookhere_dense.apis.cli import preflight
from lookhere_dense.data.checks import check_coco_annotations
from lookhere_dense.errors import DatasetLayoutError
from lookhere_dense.registry import register_all_modules
from research import REPO
from research.datasets.synthetic_coco import SHAPE_CLASSES, make_coco_instances

COCO_CFG = os.path.join(REPO, 'configs', 'mask_rcnn_lookhere-b16_sfpn_lsj-1024-100e_coco.py')


@pytest.fixture()
def coco(tmp_path):
    register_all_modules()
    anns = make_coco_instances(tmp_path, splits={'train2017': 3}, seed=0)
    cfg = Config.fromfile(COCO_CFG)
    ds = cfg.train_dataloader.dataset
    ds.update(data_root=str(tmp_path), ann_file=str(anns['train2017']))
    return cfg, ds, tmp_path


def test_a_coco_file_with_the_datasets_classes_passes_and_is_counted(coco):
    cfg, ds, _ = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    (images, annotations) = check_coco_annotations(cfg, ('train',))['train_dataloader']
    assert images == 3 and annotations > 0
    cfg.model.roi_head.bbox_head.num_classes = cfg.model.roi_head.mask_head.num_classes = 3
    preflight(cfg, ('train',), check_pretrained=False)  # the tools' checks: it passes there


def test_classes_the_file_lacks_are_named_with_the_files_close_names(coco):
    cfg, ds, _ = coco
    ds.metainfo = dict(classes=('box', 'disc', 'Triangle'))  # a capital: silently dropped
    with pytest.raises(DatasetLayoutError) as exc:
        check_coco_annotations(cfg, ('train',))
    msg = str(exc.value)
    assert msg.startswith('train_dataloader: 1 of the 3 classes the dataset trains on are no ')
    assert "'Triangle' (the file has 'triangle')" in msg
    assert '"train_dataloader.dataset.metainfo.classes=(...)"' in msg
    ds.metainfo = None  # the type's 80 COCO classes on a file of three others: empty
    with pytest.raises(DatasetLayoutError, match=r'80 of the 80 classes .*\'person\''):
        check_coco_annotations(cfg, ('train',))


def test_classes_in_another_order_than_the_files_categories_are_refused(coco):
    """mmdet numbers the labels in the file's category order whatever the order of
    ``metainfo.classes``: listed otherwise, each class was shown and scored under another's
    name, without a word."""
    cfg, ds, _ = coco
    ds.metainfo = dict(classes=tuple(reversed(SHAPE_CLASSES)))
    with pytest.raises(DatasetLayoutError) as exc:
        check_coco_annotations(cfg, ('train',))
    msg = str(exc.value)
    assert msg.startswith(
        f'train_dataloader: the classes {tuple(reversed(SHAPE_CLASSES))} are listed in '
        'another order than the categories of '
    )
    assert f'"train_dataloader.dataset.metainfo.classes={tuple(SHAPE_CLASSES)!r}"' in msg
    ds.metainfo = dict(classes=SHAPE_CLASSES[:1])  # a subset in the file's order: fine
    check_coco_annotations(cfg, ('train',))
    ds.metainfo = dict(classes=(SHAPE_CLASSES[2], SHAPE_CLASSES[0]))  # a subset, reordered
    with pytest.raises(DatasetLayoutError, match='another order'):
        check_coco_annotations(cfg, ('train',))


def test_a_category_name_listed_twice_is_named_not_called_another_order(coco):
    """A category name the file lists twice (another id): refused as "another order" with
    the advice to list four classes, one twice (a review). mmdet labels only a name's
    first id as its class: a repeat no annotation uses is a warning, one annotations use
    is refused (mmdet gave them a label past the classes: background, without a word)."""
    import warnings as _warnings

    from lookhere_dense.errors import DataCheckWarning

    cfg, ds, _ = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    first = SHAPE_CLASSES[0]
    _rewrite(
        pathlib.Path(ds.ann_file), lambda d: d['categories'].append({'id': 99, 'name': first})
    )
    with _warnings.catch_warnings(record=True) as caught:
        _warnings.simplefilter('always')
        (images, _) = check_coco_annotations(cfg, ('train',))['train_dataloader']
    assert images == 3
    said = [str(w.message) for w in caught if issubclass(w.category, DataCheckWarning)]
    assert len(said) == 1 and f'the categories {first!r} (ids [' in said[0], said
    assert said[0].endswith('no annotation uses the repeats, so nothing is lost'), said

    def use_99(d):
        d['annotations'][0]['category_id'] = 99

    _rewrite(pathlib.Path(ds.ann_file), use_99)
    with pytest.raises(DatasetLayoutError) as exc:
        check_coco_annotations(cfg, ('train',))
    assert '1 annotations use a repeated id and would be dropped without a word' in str(exc.value)
    assert 'another order' not in str(exc.value)


def test_an_image_entry_without_file_name_is_named(coco):
    """An ``images`` entry without ``file_name`` passed the check (every listed image must
    exist) and stopped mmdet mid-run with ``KeyError: 'file_name'``."""
    cfg, ds, _ = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)

    def drop(d):
        del d['images'][1]['file_name']

    _rewrite(pathlib.Path(ds.ann_file), drop)
    with pytest.raises(
        DatasetLayoutError,
        match=r'1 of the 3 images .* have no file_name, e\.g\. images\[1\] \(id ',
    ):
        check_coco_annotations(cfg, ('train',))


def test_an_image_the_file_lists_but_the_folder_lacks_is_named_before_training(coco):
    cfg, ds, root = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    missing = sorted((root / 'train2017').iterdir())[1]
    missing.unlink()
    with pytest.raises(DatasetLayoutError) as exc:
        check_coco_annotations(cfg, ('train',))
    assert '1 of the 3 images' in str(exc.value) and repr(str(missing)) in str(exc.value)


def test_an_image_resized_on_disk_after_the_file_was_written_is_named(coco):
    """An image resized (or replaced) on disk with the COCO file keeping its old
    width/height: mmdet loaded it at its new size with the boxes and masks in the file's
    coordinates (all in the wrong place) and trained on it without a word."""
    from PIL import Image

    cfg, ds, root = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    check_coco_annotations(cfg, ('train',))  # the images as written: passes
    small = sorted((root / 'train2017').iterdir())[1]
    with Image.open(small) as im:
        assert im.size == (160, 128)
        im.resize((80, 64)).save(small)
    with pytest.raises(DatasetLayoutError) as exc:
        check_coco_annotations(cfg, ('train',))
    assert str(exc.value) == (
        f'train_dataloader: 1 of 3 images checked (of the 3 with a width/height '
        f'{ds.ann_file!r} lists) have another size on disk than the file says, e.g. '
        f"'{root}/train2017/{small.name}': 80x64 on disk, 160x128 (width x height) in the "
        'file. mmdet loads an image at its size on disk but keeps its boxes and masks in the '
        "file's coordinates, so they would land in the wrong place without a word. Export "
        'the annotations again at the new sizes, or restore the original images.'
    )
    _rewrite(  # an entry without width/height is not checked
        pathlib.Path(ds.ann_file),
        lambda data: [im.pop('width') for im in data['images'] if im['file_name'] == small.name],
    )
    check_coco_annotations(cfg, ('train',))


def test_the_size_after_the_exif_orientation_mmcv_applies_is_compared(coco):
    """mmcv 2's ``imfrombytes`` with the default ``flag='color'`` turns an image by its EXIF
    orientation (cv2 and pillow backends): a file of the turned size passes, one of the
    stored (unturned) size is refused, unless the loader ignores the orientation."""
    from PIL import Image

    cfg, ds, root = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    turned = sorted((root / 'train2017').iterdir())[0]
    with Image.open(turned) as im:  # stored 128 wide, 160 high; shown 160x128 (as listed)
        exif = Image.Exif()
        exif[0x0112] = 6
        im.transpose(Image.Transpose.ROTATE_90).save(turned, exif=exif.tobytes())
    check_coco_annotations(cfg, ('train',))

    def stored_size(data):
        data['images'][0].update(width=128, height=160)

    _rewrite(pathlib.Path(ds.ann_file), stored_size)
    with pytest.raises(
        DatasetLayoutError, match=r': 160x128 on disk after its EXIF orientation, 128x160 \('
    ):
        check_coco_annotations(cfg, ('train',))
    for step in ds.pipeline:
        if step['type'] == 'LoadImageFromFile':
            step['color_type'] = 'color_ignore_orientation'
    check_coco_annotations(cfg, ('train',))


def test_image_size_is_the_size_mmcv_loads_for_a_turned_tiff_and_jpeg(tmp_path):
    """Pillow gives a TIFF's size after its EXIF orientation already (a JPEG's before):
    turning it again refused a valid TIFF listed at the size mmcv loads it."""
    import mmcv
    from PIL import Image

    from lookhere_dense.data.checks import image_size

    stored = Image.new('RGB', (160, 128))  # 160 wide, 128 high as stored
    exif = Image.Exif()
    exif[0x0112] = 6
    for name, kw in (('o6.tif', dict(tiffinfo={0x0112: 6})), ('o6.jpg', dict(exif=exif))):
        path = str(tmp_path / name)
        stored.save(path, **kw)
        loaded = mmcv.imfrombytes(pathlib.Path(path).read_bytes()).shape[:2]
        assert loaded == (160, 128), name  # mmcv turns both
        assert image_size(path, apply_orientation=True) == loaded, name
        assert image_size(path) == (128, 160) or name.endswith('.tif'), name


def test_decoders_that_ignore_the_exif_orientation_are_known():
    """mmcv's ``turbojpeg`` and ``tifffile`` decoders do not turn an image by its EXIF
    orientation (``imfrombytes``): the size checks compare the stored size for them."""
    from lookhere_dense.data.checks import _orientation_applied

    def loader(**kw):
        return dict(pipeline=[dict(type='LoadImageFromFile', **kw)])

    assert _orientation_applied(loader())
    assert _orientation_applied(loader(imdecode_backend='pillow'))
    assert not _orientation_applied(loader(imdecode_backend='turbojpeg'))
    assert not _orientation_applied(loader(imdecode_backend='tifffile'))
    assert not _orientation_applied(loader(color_type='unchanged'))


def _rewrite(path, change):
    import json

    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_annotations_of_unknown_category_ids_are_named(coco):
    """Categories renumbered from 0 with the annotations left 1-based: mmdet dropped the
    annotations of id 3 (one class had none, the others' labels moved) and the check said
    'passed'."""

    cfg, ds, _ = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    path = pathlib.Path(ds.ann_file)

    def zero_based(data):
        for c in data['categories']:
            c['id'] -= 1

    _rewrite(path, zero_based)
    with pytest.raises(
        DatasetLayoutError,
        match=r'train_dataloader: \d+ of the \d+ annotations of .* have a category_id that is '
        r"no category's id in the file \(\[3\]; the categories' ids: \[0, 1, 2\]\): mmdet "
        r'drops them without a word',
    ):
        check_coco_annotations(cfg, ('train',))


def test_a_training_file_without_annotations_is_refused_and_a_test_file_warned(coco):
    """``"annotations": []``: training stopped late on mmengine's 'need at least one array
    to concatenate', a test scored -1 everywhere, both after 'data check passed'."""
    import warnings

    from lookhere_dense.errors import DataCheckWarning

    cfg, ds, _ = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    before = check_coco_annotations(cfg, ('train',))['train_dataloader']
    path = pathlib.Path(ds.ann_file)
    _rewrite(path, lambda data: data.update(annotations=[]))
    with pytest.raises(DatasetLayoutError, match=r'holds no annotation of the classes'):
        check_coco_annotations(cfg, ('train',))
    ds.filter_cfg = dict(filter_empty_gt=False)  # images kept (a semi-supervised set's part)
    assert check_coco_annotations(cfg, ('train',))['train_dataloader'] == (before[0], 0)
    test = cfg.test_dataloader.dataset
    test.update(data_root=ds.data_root, ann_file=ds.ann_file, data_prefix=ds.data_prefix)
    test.metainfo = dict(classes=SHAPE_CLASSES)
    with pytest.warns(DataCheckWarning, match=r'every metric would be -1.*format_only=True'):
        assert check_coco_annotations(cfg, ('test',))['test_dataloader'] == (before[0], 0)
    cfg.test_evaluator.format_only = True  # test-dev: predictions written, no metrics
    with warnings.catch_warnings():
        warnings.simplefilter('error', DataCheckWarning)
        check_coco_annotations(cfg, ('test',))


def test_an_mmseg_data_prefix_key_in_a_coco_dataset_is_named(coco):
    """``data_prefix=dict(img_path=...)`` (mmseg's name) stopped in mmdet with a bare
    ``KeyError: 'img'``."""
    cfg, ds, _ = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    ds.data_prefix = dict(img_path='train2017/')
    with pytest.raises(
        DatasetLayoutError, match=r"data_prefix=\{'img_path': 'train2017/'\} has no 'img'"
    ):
        check_coco_annotations(cfg, ('train',))


def test_an_mmseg_dataset_argument_in_an_mmdet_dataset_is_named(coco):
    """``reduce_zero_label=True`` (an mmseg dataset's) on mmdet's CocoDataset was a
    ``TypeError`` when the Runner built the dataloader."""
    from lookhere_dense.data.checks import check_dataset_layout
    from lookhere_dense.errors import ConfigError

    cfg, ds, _ = coco
    ds.reduce_zero_label = True
    with pytest.raises(
        ConfigError,
        match=r'train_dataloader\.dataset\.reduce_zero_label: '
        r"CocoDataset has no argument 'reduce_zero_label' \(CocoDataset takes ",
    ):
        check_dataset_layout(cfg, ('train',))


def test_a_one_class_tuple_without_its_comma_is_named(coco):
    """``classes = ('box')`` is the string ``'box'``: the checks fell back on CocoDataset's
    80 classes and sent the user from ``num_classes=1`` to ``80`` and on to "80 of the 80
    classes are no category"; now the string is named with the tuple to write. A string
    naming a file of class names (mmengine reads it, one per line) is read as mmengine does."""
    from lookhere_dense.errors import ConfigError

    cfg, ds, root = coco
    ds.metainfo = dict(classes='box')
    with pytest.raises(
        ConfigError,
        match=r"^train_dataloader\.dataset\.metainfo\.classes='box' is a string, not a tuple "
        r".* A one-class tuple needs its comma: classes=\('box',\)$",
    ):
        check_coco_annotations(cfg, ('train',))
    cfg.model.roi_head.bbox_head.num_classes = cfg.model.roi_head.mask_head.num_classes = 1
    with pytest.raises(ConfigError, match=r"classes='box' is a string"):
        preflight(cfg, ('train',), check_pretrained=False)  # before the head-count check
    ds.metainfo = dict(classes='s3://bucket/classes.txt')  # remote: mmengine reads it
    from lookhere_dense.config_checks import dataset_class_names

    assert dataset_class_names(ds, 'mmdet', 'train_dataloader.dataset') == (None, False)
    names = root / 'classes.txt'
    names.write_text('\n'.join(SHAPE_CLASSES) + '\n')
    ds.metainfo = dict(classes=str(names))
    assert check_coco_annotations(cfg, ('train',))['train_dataloader'][0] == 3


def test_a_damaged_coco_file_is_named_not_a_json_traceback(coco):
    cfg, ds, root = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    path = root / 'broken.json'
    path.write_text('{"images": [\n')  # a truncated download
    ds.ann_file = str(path)
    with pytest.raises(
        DatasetLayoutError,
        match=rf"^'{path}' is no valid JSON \(Expecting value at line 2, column 1\): a "
        'truncated or damaged COCO annotation file',
    ):
        check_coco_annotations(cfg, ('train',))
    path.write_text('[1, 2]')
    with pytest.raises(DatasetLayoutError, match='holds a JSON list, not the object'):
        check_coco_annotations(cfg, ('train',))


def test_an_evaluator_left_on_the_old_annotation_file_is_refused(tmp_path):
    """``--cfg-options test_dataloader.dataset.data_root=NEW`` moved the images but not
    ``test_evaluator.ann_file`` (joined to the old data_root when the config was read):
    the predictions on the new images were scored against the old file's ground truth
    (a new-user trial: bbox_mAP 0.020 where the right file gives 0.004), with no word.
    Refused naming both files and the option; a copy of the dataset's file passes."""
    import shutil

    from lookhere_dense.data.checks import check_dataset_layout

    register_all_modules()
    old = make_coco_instances(tmp_path / 'old', splits={'val2017': 2}, seed=0)['val2017']
    new = make_coco_instances(tmp_path / 'new', splits={'val2017': 3}, seed=1)['val2017']
    cfg = Config.fromfile(COCO_CFG)
    cfg.test_dataloader.dataset.update(data_root=str(tmp_path / 'new'), ann_file=str(new))
    cfg.test_evaluator.ann_file = str(old)
    with pytest.raises(DatasetLayoutError) as exc:
        check_dataset_layout(cfg, ('test',))
    msg = str(exc.value)
    assert msg.startswith(
        f"test_evaluator.ann_file='{old}' is not the annotation file of "
        f"test_dataloader.dataset ('{new}') and lists other images"
    )
    assert msg.endswith(f'Set it with --cfg-options test_evaluator.ann_file={new}')
    broken = tmp_path / 'broken.json'
    broken.write_text('{"images": [')  # named as no JSON, not as "lists other images"
    cfg.test_evaluator.ann_file = str(broken)
    with pytest.raises(DatasetLayoutError, match=rf"^'{broken}' is no valid JSON"):
        check_dataset_layout(cfg, ('test',))
    copy = tmp_path / 'copy.json'
    shutil.copy(new, copy)
    cfg.test_evaluator.ann_file = str(copy)
    check_dataset_layout(cfg, ('test',))  # the same images: passes
    cfg.test_evaluator.ann_file = str(new)
    check_dataset_layout(cfg, ('test',))


def test_a_pad_in_the_test_pipeline_of_a_mask_detector_is_removed(coco):
    """mmdet's ViTDet project configs pad every test image to 1024x1024 (``Pad``): mmcv's
    Pad sets img_shape to the padded size, so boxes are clipped to the padding, and in
    new-user trials an early Mask R-CNN died in mmdet's ``_do_paste_mask`` ("upper bound
    and lower bound inconsistent with step sign") at the first validation, after the
    training (the tools only warned). The tools remove the step for the run, saying so."""
    from lookhere_dense.data.checks import drop_eval_pads

    cfg, ds, root = coco
    assert drop_eval_pads(cfg, ('train', 'val', 'test')) == []  # the project's configs
    pipeline = list(cfg.test_dataloader.dataset.pipeline)
    steps = [type_of(t) for t in pipeline]
    pipeline.insert(2, dict(type='Pad', size=(1024, 1024), pad_val=dict(img=(114, 114, 114))))
    cfg.test_dataloader.dataset.pipeline = pipeline
    box_only = copy.deepcopy(cfg)  # RTMDet / YOLOX letterbox their tests by design
    box_only.model.roi_head.mask_head = None
    assert drop_eval_pads(box_only, ('test',)) == []
    assert 'Pad' in [type_of(t) for t in box_only.test_dataloader.dataset.pipeline]
    train_pad = copy.deepcopy(cfg)
    assert drop_eval_pads(train_pad, ('train',)) == []  # training pads for the batch: fine
    (note,) = drop_eval_pads(cfg, ('test',))
    assert note.startswith('test_dataloader: pipeline[2] Pad removed for this run: it set ')
    assert [type_of(t) for t in cfg.test_dataloader.dataset.pipeline] == steps
    cfg.test_dataloader.dataset.pipeline = pipeline  # through the tools' pre-flight
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    cfg.model.roi_head.bbox_head.num_classes = cfg.model.roi_head.mask_head.num_classes = 3
    test_ds = cfg.test_dataloader.dataset
    test_ds.update(data_root=str(root), ann_file=ds.ann_file, data_prefix=dict(img='train2017/'))
    test_ds.metainfo = dict(classes=SHAPE_CLASSES)
    cfg.test_evaluator.ann_file = ds.ann_file
    notes = []
    preflight(cfg, ('test',), check_pretrained=False, notes=notes)
    assert [n for n in notes if 'pipeline[2] Pad removed for this run' in n]
    assert [type_of(t) for t in cfg.test_dataloader.dataset.pipeline] == steps
    cfg.test_dataloader.dataset.pipeline = pipeline  # --skip-data-check: removed as well
    notes.clear()
    preflight(cfg, ('test',), check_pretrained=False, check_data=False, notes=notes)
    assert [n for n in notes if 'pipeline[2] Pad removed for this run' in n]
    assert [type_of(t) for t in cfg.test_dataloader.dataset.pipeline] == steps


def type_of(step) -> str:
    return step['type'] if isinstance(step['type'], str) else step['type'].__name__
