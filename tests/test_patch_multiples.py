"""Inputs that are no multiple of the patch size, for a backbone that pads them to whole
patches itself (``LookHereViT``, ``LookWhereViT``, mmseg's ``VisionTransformer``): mmseg's
head stretches the padded grid over the input, up to a patch minus one px off at the far
edge, without an error. Sliding windows and training crops of such a size are refused,
naming the key; the tools that choose whole-image inference themselves pad in the data
preprocessor, so the segmentor crops the padding off. A random-init shrunk demo model
(seconds)."""

from __future__ import annotations

import os.path as osp

import cv2
import numpy as np
import pytest
from tiny_seg import ADE_CFG, REPO, SHRINK, write_checkpoint
from tiny_seg import options as _opts

from lookhere_dense.errors import ConfigError

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _cfg(*pairs):
    from lookhere_dense.apis.cli import load_config

    return load_config(ADE_CFG, _opts(*SHRINK, *pairs))


def test_slide_windows_and_training_crops_off_the_patch_grid_are_refused():
    from lookhere_dense.config_checks import check_model_cfg

    check_model_cfg(_cfg())  # the shipped config: multiples of 16
    with pytest.raises(
        ConfigError,
        match=r"model\.test_cfg\.crop_size=100x100 is not a multiple of the backbone's 16-px "
        r'patch: each sliding window is padded to 112x112 inside the backbone .* use 96x96 '
        r'or 112x112',
    ):
        check_model_cfg(
            _cfg(
                'model.test_cfg.mode=slide',
                'model.test_cfg.crop_size=(100,100)',
                'model.test_cfg.stride=(64,64)',
            )
        )
    # training crops: for training runs (the preprocessor's size is not used in tests)
    from lookhere_dense.apis.cli import preflight
    from lookhere_dense.config_checks import check_training_crop_grid

    off = _cfg('model.data_preprocessor.size=(500,500)')
    check_model_cfg(off)
    preflight(off, ('test',), check_pretrained=False, check_data=False)
    with pytest.raises(
        ConfigError,
        match=r'model\.data_preprocessor\.size=500x500 .* every training crop is padded to '
        r'512x512 .* use 496x496 or 512x512',
    ):
        preflight(off, ('train',), check_pretrained=False, check_data=False)
    # a backbone with its own patch size: its multiples pass, others are refused
    check_training_crop_grid(
        _cfg('model.backbone.patch_size=4', 'model.data_preprocessor.size=(500,500)')
    )
    with pytest.raises(
        ConfigError, match=r'4-px patch: every training crop .* 500x500 or 504x504'
    ):
        check_training_crop_grid(
            _cfg('model.backbone.patch_size=4', 'model.data_preprocessor.size=(502,502)')
        )


def test_infer_refuses_a_slide_crop_off_the_patch_grid():
    from lookhere_dense.apis.inference import inference_test_cfg

    cfg = _cfg()
    assert inference_test_cfg(cfg, slide=True, crop=(96, 128), patch_size=16)['crop_size'] == (
        96,
        128,
    )
    with pytest.raises(ConfigError, match=r'--crop=100x100 is not a multiple .* use 96x96'):
        inference_test_cfg(cfg, slide=True, crop=(100, 100), patch_size=16)


def test_whole_frames_chosen_by_the_tools_are_padded_not_stretched(tmp_path):
    """``tools/infer.py --whole`` (and extrapolate's whole tests) on a config without a
    preprocessor ``test_cfg``: the same labels as with the shipped config's
    ``size_divisor`` (52.7% of pixels agreed before: the padded grid was stretched)."""
    from lookhere_dense.apis.inference import segment_images

    ckpt = write_checkpoint(str(tmp_path / 'ckpt' / 'iter_0.pth'))
    rng = np.random.default_rng(0)
    image = tmp_path / 'img' / 'frame.png'
    image.parent.mkdir()
    small = rng.integers(0, 255, (13, 19, 3), dtype=np.uint8)
    cv2.imwrite(str(image), cv2.resize(small, (150, 100), interpolation=cv2.INTER_CUBIC))
    labels = {}
    for name, extra in (('padded', ()), ('unpadded', ('model.data_preprocessor.test_cfg=None',))):
        segment_images(
            ADE_CFG,
            ckpt,
            str(image),
            out_dir=str(tmp_path / name),
            whole=True,
            native=True,
            save_labels=True,
            legend=False,
            cfg_options=_opts(*SHRINK, *extra),
        )
        path = osp.join(tmp_path, name, 'frame_labels.png')
        labels[name] = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    assert labels['padded'].shape == (100, 150)
    assert len(np.unique(labels['padded'])) > 1  # a prediction with something to misplace
    np.testing.assert_array_equal(labels['unpadded'], labels['padded'])


def test_pad_whole_frames_sets_the_divisor_once():
    import torch
    from mmengine.registry import init_default_scope

    from lookhere_dense.apis.inference import pad_whole_frames
    from lookhere_dense.swap import model_registry

    init_default_scope('mmseg')
    cfg = _cfg('model.data_preprocessor.test_cfg=dict(size_divisor=8)')
    model = model_registry('mmseg').build(cfg.model)
    assert model.test_cfg['mode'] == 'slide'  # the tiny config's
    assert pad_whole_frames(model) is None
    model.test_cfg = dict(mode='whole')
    note = pad_whole_frames(model)
    assert model.data_preprocessor.test_cfg == dict(size_divisor=16)  # lcm(8, 16)
    assert note.startswith('whole frames padded to multiples of 16 px in the data preprocessor')
    assert pad_whole_frames(model) is None  # padded already
    model.backbone = torch.nn.Identity()  # another backbone: left alone
    model.data_preprocessor.test_cfg = None
    assert pad_whole_frames(model) is None and model.data_preprocessor.test_cfg is None


def test_extrapolation_tests_pad_whole_frames_and_refuse_windows_off_the_grid(capsys):
    """``tools/extrapolate.py`` sets each test's mode on the built model after the
    pre-flight: its whole tests pad in the preprocessor (for that test alone), its slide
    windows are checked."""
    from mmengine.registry import init_default_scope

    from lookhere_dense.swap import model_registry
    from research.evaluate import evaluate_loader

    init_default_scope('mmseg')
    model = model_registry('mmseg').build(_cfg('model.data_preprocessor.test_cfg=None').model)
    with pytest.raises(ConfigError, match=r'the slide window=100x100 is not a multiple'):
        evaluate_loader(model, {}, {}, 'slide', 'cpu', slide=((100, 100), (64, 64)))
    with pytest.raises(KeyError):  # the empty dataloader config, read after the mode is set
        evaluate_loader(model, {}, {}, 'whole', 'cpu')
    assert 'whole frames padded to multiples of 16 px' in capsys.readouterr().err
    # the padding is the whole test's: restored after it (a slide test after a whole one
    # padded its frames, and its windows sat elsewhere than in a run of its own)
    assert model.data_preprocessor.test_cfg is None


def test_lookwhere_backbones_are_checked_on_their_extractors_patches():
    """``LookWhereViT``'s extractor pads to whole patches as ``LookHereViT`` does (its
    grid is ``ceil(side / p)``): the same refusals and whole-frame padding, with the
    extractor's patch size (the backbone was not checked before)."""
    from mmengine.registry import init_default_scope

    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.apis.inference import pad_whole_frames
    from lookhere_dense.config_checks import check_model_cfg, self_padding_patch
    from lookhere_dense.swap import model_registry

    path = osp.join(REPO, 'configs', 'segmenter_lookwhere_vit-t_tiny-ade.py')
    cfg = load_config(path, _opts())
    assert self_padding_patch(cfg.model) == 16
    check_model_cfg(cfg)  # the shipped config: multiples of 16
    eight = load_config(path, _opts('model.backbone.extractor.patch_size=8'))
    assert self_padding_patch(eight.model) == 8
    # a non-square patch: a multiple of both sides (its first side alone was taken)
    assert (
        self_padding_patch({'backbone': dict(type='VisionTransformer', patch_size=(8, 12))}) == 24
    )
    slide = ('model.test_cfg.mode=slide', 'model.test_cfg.stride=(64,64)')
    with pytest.raises(
        ConfigError, match=r"crop_size=100x100 is not a multiple of the backbone's 16-px"
    ):
        check_model_cfg(load_config(path, _opts(*slide, 'model.test_cfg.crop_size=(100,100)')))
    init_default_scope('mmseg')
    cfg = load_config(path, _opts('model.data_preprocessor.test_cfg=None'))
    model = model_registry('mmseg').build(cfg.model)
    model.test_cfg = dict(mode='whole')
    assert pad_whole_frames(model).startswith('whole frames padded to multiples of 16 px')
    assert model.data_preprocessor.test_cfg == dict(size_divisor=16)
