"""The generated COCO / Cityscapes instance datasets are valid, consistent and reproducible."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
from pycocotools.coco import COCO

from research.datasets.synthetic_coco import (
    CITYSCAPES_THING_IDS,
    SHAPE_CLASSES,
    make_cityscapes_instances,
    make_coco_instances,
    polygon_area,
    shape_polygon,
)


def test_coco_layout_masks_boxes_and_areas_agree(tmp_path):
    anns = make_coco_instances(tmp_path, {'train2017': 3, 'val2017': 2}, image_size=(96, 64))
    assert set(anns) == {'train2017', 'val2017'}
    ids = []
    for split, ann_file in anns.items():
        coco = COCO(str(ann_file))
        assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(SHAPE_CLASSES)
        for img in coco.loadImgs(coco.getImgIds()):
            ids.append(img['id'])
            pixels = cv2.imread(str(tmp_path / split / img['file_name']))
            assert pixels.shape == (64, 96, 3)
            anns_ = coco.loadAnns(coco.getAnnIds(imgIds=img['id']))
            assert 1 <= len(anns_) <= 3
            for a in anns_:
                mask = coco.annToMask(a)
                x, y, w, h = a['bbox']
                ys, xs = np.nonzero(mask)
                assert x - 1 <= xs.min() and xs.max() <= x + w + 1
                assert y - 1 <= ys.min() and ys.max() <= y + h + 1
                assert mask.sum() == pytest.approx(a['area'], rel=0.2)
    assert sorted(ids) == list(range(1, 6))  # unique across splits


def test_same_seed_same_files(tmp_path):
    a = make_coco_instances(tmp_path / 'a', {'val2017': 2}, image_size=(64, 48), seed=5)
    b = make_coco_instances(tmp_path / 'b', {'val2017': 2}, image_size=(64, 48), seed=5)
    c = make_coco_instances(tmp_path / 'c', {'val2017': 2}, image_size=(64, 48), seed=6)
    assert a['val2017'].read_text() == b['val2017'].read_text() != c['val2017'].read_text()
    image = '000000000001.png'
    assert (tmp_path / 'a/val2017' / image).read_bytes() == (
        tmp_path / 'b/val2017' / image
    ).read_bytes()


def test_cityscapes_layout(tmp_path):
    anns = make_cityscapes_instances(tmp_path, {'val': 1}, image_size=(256, 128))
    data = json.loads(anns['val'].read_text())
    assert anns['val'].name == 'instancesonly_filtered_gtFine_val.json'
    assert [c['id'] for c in data['categories']] == list(CITYSCAPES_THING_IDS)
    name = data['images'][0]['file_name']
    assert name == 'synthcity/synthcity_000000_000019_leftImg8bit.png'
    assert (tmp_path / 'leftImg8bit' / 'val' / name).is_file()


def test_shapes_and_errors(tmp_path):
    box = shape_polygon('box', (0, 0, 4, 2))
    assert polygon_area(box) == 8
    assert polygon_area(shape_polygon('triangle', (0, 0, 4, 2))) == 4
    with pytest.raises(ValueError, match=r"unknown shape kind 'star'"):
        shape_polygon('star', (0, 0, 1, 1))
    with pytest.raises(ValueError, match=r'image_size must be at least 16x16'):
        make_coco_instances(tmp_path, {'x': 1}, image_size=(8, 8))
