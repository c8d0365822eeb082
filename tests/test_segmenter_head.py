"""LeanSegmenterMaskTransformerHead and LeanEncoderDecoder: drop-ins for mmseg's
SegmenterMaskTransformerHead / EncoderDecoder with the same weights and outputs, without
the (heads, N+K, N+K) attention matrix or a second full-resolution copy of the logits."""

from __future__ import annotations

import os.path as osp
from typing import List, Tuple

import pytest
import torch
from mmengine.config import Config, ConfigDict
from mmengine.structures import PixelData
from torch.utils._python_dispatch import TorchDispatchMode

from lookhere_dense.apis.cli import resolve_config_path
from lookhere_dense.models.heads import FusedSelfAttention, LeanSegmenterMaskTransformerHead
from research.benchmark.segmenter import (
    MMSEG_ORIGINALS,
    mmseg_original_cfg,
    segmenter_case,
)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
TINY = osp.join(REPO, 'configs', 'segmenter_lookhere_vit-t_tiny-cityscapes.py')

# one PyTorch thread for the whole module (see conftest.one_torch_thread)
pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _build(cfg: dict):
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    init_default_scope('mmseg')
    return MODELS.build(ConfigDict(cfg))


def _head_cfg(type_: str, **kw) -> dict:
    cfg = dict(
        type=type_,
        in_channels=48,
        channels=48,
        num_classes=5,
        num_layers=2,
        num_heads=4,
        embed_dims=32,
        dropout_ratio=0.0,
        drop_path_rate=0.0,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    )
    cfg.update(kw)
    return cfg


def _randomise(module: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial values for every parameter (LayerNorms included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.ndim == 1 else 0.0))


def _pair(**kw) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """mmseg's head with random weights and ours with the same weights (strict load)."""
    theirs = _build(_head_cfg('SegmenterMaskTransformerHead', **kw))
    _randomise(theirs)
    ours = _build(_head_cfg('LeanSegmenterMaskTransformerHead', **kw))
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return theirs, ours


# ----------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------
def test_same_parameters_names_and_init_as_mmseg():
    torch.manual_seed(3)
    theirs = _build(_head_cfg('SegmenterMaskTransformerHead'))
    torch.manual_seed(3)
    ours = _build(_head_cfg('LeanSegmenterMaskTransformerHead'))
    a, b = theirs.state_dict(), ours.state_dict()
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert 'layers.0.attn.attn.in_proj_weight' in b
    assert all(isinstance(layer.attn, FusedSelfAttention) for layer in ours.layers)


def test_mmseg_segmenter_head_state_dict_loads_strictly():
    """The head of mmseg's own Segmenter ViT-T config, built as ours, takes its weights."""
    cfg = Config.fromfile(
        resolve_config_path('mmseg::segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py')
    )
    head = cfg.model.decode_head.to_dict()
    assert head['type'] == 'SegmenterMaskTransformerHead'
    theirs = _build(head)
    ours = _build(dict(head, type='LeanSegmenterMaskTransformerHead'))
    result = ours.load_state_dict(theirs.state_dict(), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    theirs.load_state_dict(ours.state_dict(), strict=True)  # and back


def test_mmseg_segmenter_checkpoint_loads_into_our_config(tmp_path):
    """A checkpoint of mmseg's classes loads into our config's model through mmengine's
    loader with strict=True (and the reverse)."""
    from mmengine.runner import load_checkpoint

    model_cfg = _tiny_model_cfg()
    original, swapped = mmseg_original_cfg(model_cfg)
    assert sorted(swapped) == sorted(f'{k} -> {v}' for k, v in MMSEG_ORIGINALS.items())
    theirs, ours = _build(original), _build(model_cfg)
    _randomise(theirs)
    path = str(tmp_path / 'mmseg_segmenter.pth')
    torch.save(dict(state_dict=theirs.state_dict(), meta=dict()), path)
    load_checkpoint(ours, path, map_location='cpu', strict=True)
    a, b = theirs.state_dict(), ours.state_dict()
    assert list(a) == list(b)
    assert all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


# ----------------------------------------------------------------------------------------
# Numbers
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'kw', [dict(), dict(qkv_bias=False, num_fcs=3, mlp_ratio=2)], ids=['default', 'no-qkv-bias']
)
def test_eval_outputs_equal_mmseg(kw):
    theirs, ours = _pair(**kw)
    theirs.eval(), ours.eval()
    x = torch.randn(2, 48, 6, 9, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = theirs([x]), ours([x])
    assert a.shape == b.shape == (2, 5, 6, 9)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


def _samples(n: int, size: Tuple[int, int], classes: int) -> list:
    from mmseg.structures import SegDataSample

    g = torch.Generator().manual_seed(2)
    out = []
    for _ in range(n):
        s = SegDataSample(metainfo=dict(img_shape=size, pad_shape=size, ori_shape=size))
        label = torch.randint(0, classes, (1, *size), generator=g)
        label[0, :2] = 255  # some ignored pixels
        s.gt_sem_seg = PixelData(data=label)
        out.append(s)
    return out


def test_training_step_equals_mmseg():
    """Same loss and gradients (parameters and input) as mmseg's head, dropouts off."""
    theirs, ours = _pair()
    theirs.train(), ours.train()
    x0 = torch.randn(2, 48, 6, 9, generator=torch.Generator().manual_seed(4))
    samples = _samples(2, (24, 36), 5)
    losses, grads = [], []
    for head in (theirs, ours):
        x = x0.clone().requires_grad_(True)
        loss = head.loss([x], samples, dict())['loss_ce']
        loss.backward()
        losses.append(loss.detach())
        grads.append({'input': x.grad, **{n: p.grad for n, p in head.named_parameters()}})
    torch.testing.assert_close(losses[1], losses[0], atol=1e-5, rtol=0)
    assert list(grads[0]) == list(grads[1])
    for name, g in grads[0].items():
        assert g is not None and g.abs().sum() > 0, name
        torch.testing.assert_close(grads[1][name], g, atol=1e-5, rtol=0, msg=name)


def test_attention_dropout_reaches_sdpa():
    """attn_drop_rate is the dropout of the attention weights in training, none in eval."""
    _, ours = _pair(attn_drop_rate=0.5)
    x = torch.randn(1, 48, 4, 4, generator=torch.Generator().manual_seed(5))
    ours.eval()
    with torch.no_grad():
        assert torch.equal(ours([x]), ours([x]))
    ours.train()
    with torch.no_grad():
        torch.manual_seed(0)
        a = ours([x])
        torch.manual_seed(1)
        b = ours([x])
    assert not torch.allclose(a, b)


def test_fused_attention_refuses_what_it_does_not_compute():
    _, ours = _pair()
    attn = ours.layers[0].attn
    q = torch.randn(1, 7, 32)
    with pytest.raises(ValueError, match='attn_mask'):
        attn(q, attn_mask=torch.zeros(7, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match='key'):
        attn(q, key=torch.randn(1, 3, 32))
    assert attn(q, key=q, value=q).shape == q.shape  # self-attention spelled out is fine


# ----------------------------------------------------------------------------------------
# What is allocated: no (heads, T, T) attention; one full-resolution copy of the logits
# ----------------------------------------------------------------------------------------
class OutputShapes(TorchDispatchMode):
    """Records every tensor an ATen op returns -- shape, dtype and the address of its
    storage (views share their base's) -- without timing or RSS."""

    def __init__(self):
        super().__init__()
        self.outputs: List[Tuple[Tuple[int, ...], torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.outputs.append((tuple(t.shape), t.dtype, t.untyped_storage().data_ptr()))
        return out

    def largest(self) -> int:
        return max(int(torch.Size(s).numel()) for s, _, _ in self.outputs)


def test_no_attention_matrix_is_materialised():
    theirs, ours = _pair()
    theirs.eval(), ours.eval()
    x = torch.randn(1, 48, 16, 16)
    tokens = 16 * 16 + 5
    attention = 4 * tokens * tokens  # heads x T x T
    for head, expect in ((theirs, True), (ours, False)):
        with torch.no_grad(), OutputShapes() as rec:
            head([x])
        assert (rec.largest() >= attention) is expect, type(head).__name__


# ----------------------------------------------------------------------------------------
# The predict path
# ----------------------------------------------------------------------------------------
def _tiny_model_cfg(mode: str = 'whole') -> dict:
    cfg = Config.fromfile(TINY)
    cfg.merge_from_dict({'model.backbone.num_layers': 1})
    model = cfg.model.to_dict()
    model.pop('pretrained', None)
    if mode == 'whole':
        model['test_cfg'] = dict(mode='whole')
    return model


def _frames(model, size, ori_shape=None, flip=None, n=1):
    """Random uint8 frames of ``size`` through the model's data preprocessor; metainfo as
    the test pipeline makes it (``ori_shape`` before a test-time resize, flips)."""
    from mmseg.structures import SegDataSample

    g = torch.Generator().manual_seed(7)
    imgs, samples = [], []
    for _ in range(n):
        imgs.append(torch.randint(0, 256, (3, *size), generator=g, dtype=torch.uint8))
        meta = dict(ori_shape=tuple(ori_shape or size), img_shape=tuple(size))
        if flip:
            meta.update(flip=True, flip_direction=flip)
        samples.append(SegDataSample(metainfo=meta))
    data = model.data_preprocessor(dict(inputs=imgs, data_samples=samples), training=False)
    return data['inputs'], data['data_samples']


def _models(mode: str = 'whole'):
    """(ours, mmseg's originals, ours-with-mmseg's-head) with the same weights."""
    cfg = _tiny_model_cfg(mode)
    if mode == 'slide':
        cfg['test_cfg'] = dict(mode='slide', crop_size=(48, 48), stride=(32, 32))
    original, _ = mmseg_original_cfg(cfg)
    theirs = _build(original)
    _randomise(theirs, seed=11)
    ours = _build(cfg)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    mixed = _build(dict(cfg, decode_head=original['decode_head']))
    mixed.load_state_dict(theirs.state_dict(), strict=True)
    for m in (ours, theirs, mixed):
        m.eval()
    assert type(ours).__name__ == 'LeanEncoderDecoder'
    assert type(ours.decode_head) is LeanSegmenterMaskTransformerHead
    assert type(theirs).__name__ == 'EncoderDecoder'
    return ours, theirs, mixed


CASES = {
    'same-size': dict(size=(64, 96)),  # logits already at ori_shape
    'padded': dict(size=(60, 90)),  # size_divisor=16 pads to 64x96
    'resized': dict(size=(64, 96), ori_shape=(100, 150)),  # test-time Resize undone
    'flipped': dict(size=(60, 90), flip='horizontal'),
    'batch': dict(size=(64, 96), n=2),
}


@pytest.mark.parametrize('case', list(CASES))
def test_whole_predict_equals_mmseg(case):
    ours, theirs, mixed = _models('whole')
    inputs, samples = _frames(theirs, **CASES[case])
    with torch.no_grad():
        a = theirs.predict(inputs, [s.clone() for s in samples])
        b = ours.predict(inputs, [s.clone() for s in samples])
        c = mixed.predict(inputs, [s.clone() for s in samples])
    for ra, rb, rc in zip(a, b, c):
        # our segmentor vs mmseg's, same head: the very same values
        assert torch.equal(rc.seg_logits.data, ra.seg_logits.data)
        assert torch.equal(rc.pred_sem_seg.data, ra.pred_sem_seg.data)
        assert rc.seg_logits.data.is_contiguous()
        # our whole model vs mmseg's: logits to 1e-5, the same predictions
        torch.testing.assert_close(rb.seg_logits.data, ra.seg_logits.data, atol=1e-5, rtol=0)
        assert torch.equal(rb.pred_sem_seg.data, ra.pred_sem_seg.data)
        assert rb.pred_sem_seg.data.dtype == ra.pred_sem_seg.data.dtype
        assert rb.pred_sem_seg.data.shape[-2:] == tuple(ra.metainfo['ori_shape'])


def test_slide_predict_is_mmseg_slide():
    ours, theirs, mixed = _models('slide')
    inputs, samples = _frames(theirs, size=(64, 96))
    with torch.no_grad():
        a = theirs.predict(inputs, [s.clone() for s in samples])
        c = mixed.predict(inputs, [s.clone() for s in samples])
        b = ours.predict(inputs, [s.clone() for s in samples])
    assert torch.equal(c[0].seg_logits.data, a[0].seg_logits.data)
    torch.testing.assert_close(b[0].seg_logits.data, a[0].seg_logits.data, atol=1e-5, rtol=0)
    assert torch.equal(b[0].pred_sem_seg.data, a[0].pred_sem_seg.data)


def test_predict_without_data_samples_equals_mmseg():
    ours, theirs, mixed = _models('whole')
    inputs, _ = _frames(theirs, size=(64, 96))
    with torch.no_grad():
        a, c = theirs.predict(inputs), mixed.predict(inputs)
    assert torch.equal(c[0].seg_logits.data, a[0].seg_logits.data)
    assert torch.equal(c[0].pred_sem_seg.data, a[0].pred_sem_seg.data)


def test_whole_predict_makes_one_full_resolution_copy():
    """mmseg upsamples the logits to the padded frame and resizes them again to the same
    ori_shape; ours makes the first copy only."""
    ours, theirs, mixed = _models('whole')
    size = (64, 96)
    inputs, samples = _frames(theirs, size=size)

    def full_res_float_outputs(model) -> int:
        """Distinct float storages of (..., H, W) tensors made during predict."""
        with torch.no_grad(), OutputShapes() as rec:
            model.predict(inputs, [s.clone() for s in samples])
        return len(
            {
                ptr
                for shape, dtype, ptr in rec.outputs
                if dtype.is_floating_point and shape[-2:] == size
            }
        )

    assert full_res_float_outputs(theirs) == 2
    assert full_res_float_outputs(mixed) == 1
    assert full_res_float_outputs(ours) == 1


# ----------------------------------------------------------------------------------------
# The measurement (in this process, tiny; the real numbers come from the benchmark)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('case', ['backbone', 'model', 'mmseg'])
def test_whole_frame_memory_case_runs(case):
    res = segmenter_case(
        dict(
            config=TINY,
            cfg_options={'model.backbone.num_layers': 1},
            case=case,
            size=[64, 96],
            device='cpu',
            threads=None,
        )
    )
    assert res['peak_bytes'] >= res['start_bytes'] > 0
    assert res['seconds'] > 0
    expect = {
        'backbone': 'LookHereViT',
        'model': 'LeanSegmenterMaskTransformerHead',
        'mmseg': 'SegmenterMaskTransformerHead',
    }[case]
    assert expect in res['types'].values()


def test_mmseg_original_cfg_leaves_other_types():
    cfg = dict(
        type='LeanEncoderDecoder',
        backbone=dict(type='LookHereViT'),
        decode_head=dict(type='FCNHead'),
        auxiliary_head=[dict(type='FCNHead')],
    )
    out, swapped = mmseg_original_cfg(cfg)
    assert out == dict(
        type='EncoderDecoder',
        backbone=dict(type='LookHereViT'),
        decode_head=dict(type='FCNHead'),
        auxiliary_head=[dict(type='FCNHead')],
    )
    assert swapped == ['LeanEncoderDecoder -> EncoderDecoder']
    assert cfg['type'] == 'LeanEncoderDecoder'  # the input is not changed
    assert mmseg_original_cfg(out)[1] == []


def test_our_segmenter_configs_use_the_lean_drop_ins():
    import glob

    names = sorted(glob.glob(osp.join(REPO, 'configs', 'segmenter_*.py')))
    assert len(names) >= 10
    for name in names:
        model = Config.fromfile(name).model
        assert model.type == 'LeanEncoderDecoder', name
        assert model.decode_head.type in ('LeanSegmenterMaskTransformerHead', 'FCNHead'), name


def test_case_ratios():
    from research.benchmark.segmenter import case_ratios

    res = dict(
        backbone=dict(peak_bytes=100, rise_bytes=40),
        model=dict(peak_bytes=120, rise_bytes=50),
        mmseg=dict(error='timed out after 1 s'),
    )
    assert case_ratios(res) == dict(model_peak=1.2, model_rise=1.25)
    assert case_ratios(dict(model=dict(peak_bytes=1, rise_bytes=1))) == {}


def test_whole_frame_memory_in_child_processes():
    """The real entry: fresh child processes (benchmark.child, kind 'segmenter'), JSON
    back, ratios and the target verdict."""
    from research.benchmark.report import format_segmenter
    from research.benchmark.segmenter import whole_frame_memory

    res = whole_frame_memory(
        TINY,
        size=(32, 64),
        cases=('backbone', 'model'),
        cfg_options={'model.backbone.num_layers': 1},
        timeout=600,
    )
    assert 'error' not in res['cases']['backbone'], res['cases']['backbone']
    assert 'error' not in res['cases']['model'], res['cases']['model']
    assert res['cases']['model']['types']['segmentor'] == 'LeanEncoderDecoder'
    assert set(res['ratios']) == {'model_peak', 'model_rise'}
    assert res['meets_target'] == (res['ratios']['model_peak'] <= 1.3)
    assert 'model' in format_segmenter(res)
    with pytest.raises(ValueError, match='unknown cases'):
        whole_frame_memory(TINY, cases=('head',))
