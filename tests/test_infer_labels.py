"""``tools/infer.py --save-labels`` numbers classes as the dataset's annotation files and
``tools/test.py --out`` do: for a ``reduce_zero_label`` dataset (ADE20K layout) the
model's class ``k`` is written as ``k + 1`` (0 is the files' ignore value), for the others
as ``k``. A tiny ADE20K-layout dataset and a random-init shrunk demo model (a few
seconds)."""

from __future__ import annotations

import glob
import os.path as osp

import cv2
import numpy as np
import pytest
from tiny_seg import ADE_CFG, SHRINK, make_ade, write_checkpoint
from tiny_seg import options as _opts
from tiny_seg import roots as _roots

pytestmark = pytest.mark.usefixtures('one_torch_thread')

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def test_infer_labels_are_the_ids_test_out_writes(tmp_path):
    from lookhere_dense.apis.inference import segment_images
    from lookhere_dense.apis.test import evaluate_checkpoint

    root = make_ade(tmp_path / 'data', num_train=1, num_val=2)
    ckpt = write_checkpoint(str(tmp_path / 'ckpt' / 'iter_0.pth'))
    opts = (*_roots(root), *SHRINK, 'model.test_cfg.mode=whole')
    preds = tmp_path / 'preds'
    evaluate_checkpoint(
        ADE_CFG, ckpt, work_dir=str(tmp_path / 'w'), out=str(preds), cfg_options=_opts(*opts)
    )
    result = segment_images(
        ADE_CFG,
        ckpt,
        osp.join(root, 'images', 'validation'),
        out_dir=str(tmp_path / 'infer'),
        save_labels=True,
        legend=False,
        cfg_options=_opts(*opts),
    )
    assert result.label_offset == 1
    outs = sorted(glob.glob(str(preds / '*.png')))
    assert len(outs) == 2
    for out in outs:
        stem = osp.splitext(osp.basename(out))[0]
        ours = cv2.imread(str(tmp_path / 'infer' / f'{stem}_labels.png'), cv2.IMREAD_UNCHANGED)
        theirs = cv2.imread(out, cv2.IMREAD_UNCHANGED)
        np.testing.assert_array_equal(ours, theirs)  # same image, checkpoint, numbering
        assert ours.min() >= 1  # 0 is the annotation files' ignore value


def _cfg(path, *pairs):
    from lookhere_dense.apis.cli import load_config

    return load_config(path, _opts(*pairs) if pairs else None)


def test_offset_follows_the_config_test_dataset():
    import lookhere_dense
    from lookhere_dense.apis.inference import saved_label_offset

    lookhere_dense.register_all_modules()
    ade = _cfg(ADE_CFG)
    assert saved_label_offset(ade) == 1  # LoadAnnotations(reduce_zero_label=True)
    city = _cfg(osp.join(REPO, 'configs', 'segmenter_lookhere_cityscapes.py'))
    assert saved_label_offset(city) == 0
    # the dataset's own key, else its class's default (ADE20KDataset: True)
    ade.test_dataloader.dataset.reduce_zero_label = False
    assert saved_label_offset(ade) == 0
    bare = dict(type='ADE20KDataset', pipeline=[dict(type='LoadImageFromFile')])
    ade.test_dataloader.dataset = bare
    assert saved_label_offset(ade) == 1
    ade.test_dataloader.dataset = dict(type='RepeatDataset', times=2, dataset=bare)
    assert saved_label_offset(ade) == 1
    # no test dataset: the checkpoint's dataset_meta, else 0
    ade.test_dataloader = None
    assert saved_label_offset(ade, {'reduce_zero_label': True}) == 1
    assert saved_label_offset(ade, {}) == saved_label_offset(ade) == 0


def test_saved_labels_shift_and_widen():
    from lookhere_dense.apis.inference import _saved_labels

    pred = np.array([[0, 3], [130, 254]])
    out = _saved_labels(pred, 1)
    assert out.dtype == np.uint8 and out.tolist() == [[1, 4], [131, 255]]
    assert _saved_labels(np.array([[255]]), 1).dtype == np.uint16  # no wrap-around to 0
    assert _saved_labels(pred, 0).tolist() == pred.tolist()


def test_save_labels_help_says_the_numbering(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        'infer_tool', osp.join(REPO, 'tools', 'infer.py')
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with pytest.raises(SystemExit):
        tool.parse_args(['--help'])
    text = ' '.join(capsys.readouterr().out.split())
    assert 'reduce_zero_label' in text and 'k+1' in text and 'test.py --out' in text


def test_grayscale_images_are_named_as_read_in_colour(tmp_path):
    """A grayscale file was read as 3 equal channels without a word (a new-user trial: its
    predictions were far worse than the colour image's); infer lists such files and the tool
    says so. Colour files are not listed."""
    from lookhere_dense.apis.inference import segment_images

    root = make_ade(tmp_path / 'data', num_train=1, num_val=2)
    ckpt = write_checkpoint(str(tmp_path / 'ckpt' / 'iter_0.pth'))
    images = tmp_path / 'images'
    images.mkdir()
    colour = sorted(glob.glob(osp.join(root, 'images', 'validation', '*.jpg')))[0]
    bgr = cv2.imread(colour)
    cv2.imwrite(str(images / 'a_colour.png'), bgr)
    cv2.imwrite(str(images / 'b_gray.png'), cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY))
    cv2.imwrite(
        str(images / 'c_gray16.png'),
        cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY).astype(np.uint16) * 257,
    )
    result = segment_images(
        ADE_CFG, ckpt, str(images), out_dir=str(tmp_path / 'o'), cfg_options=_opts(*SHRINK)
    )
    assert len(result.paths) == 3
    assert [osp.basename(p) for p in result.gray] == ['b_gray.png', 'c_gray16.png']
