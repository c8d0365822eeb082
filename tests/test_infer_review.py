"""``tools/infer.py`` refusals found in review, each made before any image is predicted:

* two outputs with one file name (``--save-labels`` on a folder holding ``a.jpg`` and an
  earlier run's ``a_labels.png``: ``a.jpg``'s label map was overwritten by the overlay of
  ``a_labels.png`` without a word);
* a ``--size`` / ``--short-side`` below one patch of the backbone (the model saw less than
  one patch and an overlay was written);
* an image the prediction's reader cannot decode, such as a float32 TIFF (named with its
  type; it was listed as an image and failed only after earlier overlays were written).

A random-init shrunk demo model (:mod:`tiny_seg`), one checkpoint for the module.
"""

from __future__ import annotations

import os.path as osp
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from tiny_seg import ADE_CFG, REPO, SHRINK, make_ade, write_checkpoint
from tiny_seg import options as _opts

pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """``(checkpoint, a colour validation image as BGR)``."""
    tmp = tmp_path_factory.mktemp('infer_review')
    root = make_ade(tmp / 'data', num_train=1, num_val=1)
    ckpt = write_checkpoint(str(tmp / 'ckpt' / 'iter_0.pth'))
    image = cv2.imread(osp.join(root, 'images', 'validation', 'ADE_val_00000001.jpg'))
    return ckpt, image


def _segment(ckpt, input, out_dir, **kw):
    from lookhere_dense.apis.inference import segment_images

    kw.setdefault('legend', False)
    return segment_images(
        ADE_CFG, ckpt, str(input), out_dir=str(out_dir), cfg_options=_opts(*SHRINK), **kw
    )


def _pngs(folder):
    return sorted(p.name for p in folder.glob('*.png')) if folder.is_dir() else []


# --- 4: two outputs, one file name -------------------------------------------------------


def test_save_labels_refuses_an_input_named_like_another_images_label_map(tmp_path, tiny):
    """``a.jpg`` and ``a_labels.png`` with ``--save-labels``: the label map of ``a.jpg`` and
    the overlay of ``a_labels.png`` are both ``a_labels.png``. Refused with both images and
    the file named, before the model is built (the checkpoint is not even read) and before
    anything is written; without ``--save-labels`` there is no clash and both images are
    segmented."""
    from lookhere_dense.errors import ToolError

    ckpt, image = tiny
    coll = tmp_path / 'coll'
    coll.mkdir()
    cv2.imwrite(str(coll / 'a.jpg'), image)
    cv2.imwrite(str(coll / 'a_labels.png'), np.zeros(image.shape[:2], np.uint8))
    out = tmp_path / 'out'
    for checkpoint in (ckpt, str(tmp_path / 'missing.pth')):
        with pytest.raises(ToolError) as err:
            _segment(checkpoint, coll, out, save_labels=True)
        msg = str(err.value)
        assert "two outputs would be written as 'a_labels.png'" in msg, msg
        assert f'the label map of {str(coll / "a.jpg")!r}' in msg, msg
        assert f'the overlay of {str(coll / "a_labels.png")!r}' in msg, msg
        assert '--save-labels' in msg and 'nothing was predicted' in msg, msg
        assert not out.exists()  # nothing written, not even the folder
    result = _segment(ckpt, coll, out)
    assert [osp.basename(p) for p in result.paths] == ['a.png', 'a_labels.png']


def test_the_tool_names_the_clash_in_one_line_and_writes_nothing(tmp_path, tiny, capsys):
    """The reviewer's repro through ``tools/infer.py``: status 2, one ``error:`` line; the
    output folder (an earlier run's, holding ``a_labels.png``) keeps its files."""
    import runpy

    ckpt, image = tiny
    coll = tmp_path / 'coll'
    coll.mkdir()
    cv2.imwrite(str(coll / 'a.jpg'), image)
    labels = np.full(image.shape[:2], 3, np.uint8)
    cv2.imwrite(str(coll / 'a_labels.png'), labels)
    out = tmp_path / 'out'
    out.mkdir()
    cv2.imwrite(str(out / 'a_labels.png'), labels)
    tool = runpy.run_path(osp.join(REPO, 'tools', 'infer.py'), run_name='infer_tool')
    from lookhere_dense.apis.cli import run_main

    argv = [ADE_CFG, ckpt, str(coll), '--out-dir', str(out), '--save-labels', '--threads', '1']
    with pytest.raises(SystemExit) as exc:
        run_main(tool['main'], [*argv, '--cfg-options', *SHRINK])
    assert exc.value.code == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith('error: ')]
    assert len(err) == 1 and "written as 'a_labels.png'" in err[0], err
    assert _pngs(out) == ['a_labels.png']
    assert np.array_equal(cv2.imread(str(out / 'a_labels.png'), cv2.IMREAD_UNCHANGED), labels)


def test_output_files_plans_every_name_and_refuses_any_clash():
    """Overlays and label maps planned together: the names repeated stems get (``a.jpg``,
    ``a.png`` -> ``a.jpg.png``, ``a.png.png``) are kept; a clash they make with a third
    image (``a.jpg.png``, overlay ``a.jpg.png``) is refused too, even without labels."""
    from lookhere_dense.apis.inference import output_files
    from lookhere_dense.errors import ToolError

    assert output_files(['d/a.jpg', 'd/b.png'], True) == [
        ('a.png', 'a_labels.png'),
        ('b.png', 'b_labels.png'),
    ]
    assert output_files(['d/a.jpg', 'd/a.png'], False) == [
        ('a.jpg.png', None),
        ('a.png.png', None),
    ]
    assert output_files(['d/a.jpg', 'd/a_labels.png'], False) == [
        ('a.png', None),
        ('a_labels.png', None),
    ]
    with pytest.raises(ToolError, match=r"written as 'a\.jpg\.png': the overlay of 'd/a\.jpg'"):
        output_files(['d/a.jpg', 'd/a.jpg.png', 'd/a.png'], False)


# --- 5: a resize below one patch ---------------------------------------------------------


@pytest.mark.parametrize(
    'kw, expected',
    [
        (
            dict(size=(8, 8), whole=True),
            '--size 8x8 has a side of 8 px, below one patch of the model (16 px): '
            'give 16 px or more',
        ),
        (
            dict(short_side=4),
            '--short-side 4 has a side of 4 px, below one patch of the model (16 px): '
            'give 16 px or more',
        ),
        (dict(size=(64, 15), slide=True, crop=(32, 32)), '--size 64x15 has a side of 15 px'),
        # 0 was read as "no --short-side": the config's resize, without a word
        (dict(short_side=0), '--short-side 0 has a side of 0 px, below one patch'),
    ],
    ids=['size-8x8-whole', 'short-side-4', 'size-64x15-slide', 'short-side-0'],
)
def test_a_resize_below_one_patch_is_refused_before_predicting(tmp_path, tiny, kw, expected):
    """``--size 8x8 --whole`` / ``--short-side 4`` were accepted: the model saw less than
    one 16 px patch and an overlay was written. Refused, naming the flag, the size and the
    patch of the model's backbone, before any image is predicted."""
    from lookhere_dense.errors import ConfigError

    ckpt, image = tiny
    cv2.imwrite(str(tmp_path / 'a.jpg'), image)
    out = tmp_path / 'out'
    with pytest.raises(ConfigError) as err:
        _segment(ckpt, tmp_path / 'a.jpg', out, **kw)
    assert expected in str(err.value), str(err.value)
    assert not out.exists()  # refused before the output folder is made


def test_one_patch_is_the_line(tmp_path, tiny):
    """A side of one patch is segmented (at the size given); one px less is refused."""
    from lookhere_dense.errors import ConfigError

    ckpt, image = tiny
    cv2.imwrite(str(tmp_path / 'a.jpg'), image)
    result = _segment(ckpt, tmp_path / 'a.jpg', tmp_path / 'o', size=(16, 24), whole=True)
    assert result.sizes == (image.shape[:2], (16, 24))
    assert _pngs(tmp_path / 'o') == ['a.png']
    with pytest.raises(ConfigError, match=r'--size 15x24 has a side of 15 px, below one patch'):
        _segment(ckpt, tmp_path / 'a.jpg', tmp_path / 'o2', size=(15, 24), whole=True)
    assert _pngs(tmp_path / 'o2') == []


def test_non_square_patches_are_checked_side_by_side():
    """The patch comes from the built backbone (an int, or ``(H, W)``); a short side must
    hold a patch both ways (either side of an image may be the short one)."""
    from lookhere_dense.apis.inference import _check_resize_flags
    from lookhere_dense.errors import ConfigError

    model = SimpleNamespace(backbone=SimpleNamespace(patch_size=(16, 8)))
    _check_resize_flags(model, False, None, (16, 8))
    _check_resize_flags(model, False, 16, None)
    _check_resize_flags(model, True, 4, None)  # --native: no resize
    with pytest.raises(ConfigError, match=r'--size 8x64 has a side of 8 px, below one patch '):
        _check_resize_flags(model, False, None, (8, 64))
    with pytest.raises(ConfigError, match=r'\(16x8 px, H x W\): give at least 16x8 px'):
        _check_resize_flags(model, False, None, (32, 4))
    with pytest.raises(ConfigError, match=r'--short-side 12 .* give 16 px or more'):
        _check_resize_flags(model, False, 12, None)
    lookwhere = SimpleNamespace(patch_size=99, extractor=SimpleNamespace(patch_size=16))
    lookwhere = type('LookWhereViT', (), dict(vars(lookwhere)))()
    with pytest.raises(ConfigError, match=r'\(16 px\)'):
        _check_resize_flags(SimpleNamespace(backbone=lookwhere), False, 8, None)


# --- 7: an image the prediction's reader cannot decode -----------------------------------


def _float_tiff(path):
    rng = np.random.default_rng(0)
    assert cv2.imwrite(str(path), rng.random((32, 32, 3)).astype(np.float32))


def test_a_float32_tiff_is_named_with_its_type_before_any_overlay(tmp_path, tiny):
    """A float32 3-channel TIFF was listed as an image (read unconverted) but the
    prediction (8-bit colour) could not decode it: ``corrupt or not an image``, after the
    overlays of the images before it. Named with what it is when the folder is listed."""
    from lookhere_dense.apis.inference import list_images
    from lookhere_dense.errors import ToolError

    ckpt, image = tiny
    folder = tmp_path / 'imgs'
    folder.mkdir()
    cv2.imwrite(str(folder / 'a.jpg'), image)
    _float_tiff(folder / 'f32.tiff')
    tiff = str(folder / 'f32.tiff')
    for listed in (str(folder), tiff):
        with pytest.raises(ToolError) as err:
            list_images(listed)
        msg = str(err.value)
        assert f'cannot read the image {tiff!r}' in msg, msg
        assert 'float32 3-channel TIFF (32x32 px)' in msg and 'convert it to 8- or 16-bit' in msg
    out = tmp_path / 'out'
    with pytest.raises(ToolError, match='float32 3-channel TIFF'):
        _segment(ckpt, folder, out)
    assert _pngs(out) == []  # a.png was written before


def test_listing_and_predicting_read_alike(tmp_path):
    """What the listing accepts the prediction reads (8-bit BGR): a 16-bit 4-channel PNG
    and a grayscale one are listed; a corrupt JPEG in a folder is named at listing."""
    from lookhere_dense.apis.inference import list_images, read_image
    from lookhere_dense.errors import ToolError

    rng = np.random.default_rng(0)
    cv2.imwrite(str(tmp_path / 'a16.png'), rng.integers(0, 65535, (8, 8, 4), dtype=np.uint16))
    cv2.imwrite(str(tmp_path / 'b.png'), rng.integers(0, 255, (8, 8), dtype=np.uint8))
    files = list_images(str(tmp_path))
    assert [osp.basename(f) for f in files] == ['a16.png', 'b.png']
    for f in files:
        bgr = read_image(f)
        assert bgr.dtype == np.uint8 and bgr.shape == (8, 8, 3)
    ok, jpg = cv2.imencode('.jpg', rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    (tmp_path / 'c.jpg').write_bytes(jpg.tobytes()[:200])
    with pytest.raises(ToolError, match=r"cannot decode the image .*c\.jpg' \(corrupt"):
        list_images(str(tmp_path))
