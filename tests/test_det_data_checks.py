"""The COCO-format annotation check before a detection run (``check_coco_annotations``,
run by the tools' preflight): class names the file lacks and images it lists that are
missing are named before anything is built (mmdet trained on nothing, dropped a
misspelt class's annotations without a word, or stopped at the first missing image
mid-training)."""

from __future__ import annotations

import os

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


def test_an_image_the_file_lists_but_the_folder_lacks_is_named_before_training(coco):
    cfg, ds, root = coco
    ds.metainfo = dict(classes=SHAPE_CLASSES)
    missing = sorted((root / 'train2017').iterdir())[1]
    missing.unlink()
    with pytest.raises(DatasetLayoutError) as exc:
        check_coco_annotations(cfg, ('train',))
    assert '1 of the 3 images' in str(exc.value) and repr(str(missing)) in str(exc.value)


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
