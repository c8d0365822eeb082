"""The extrapolation aids: the backbone's test-time ``log_n_scaling`` and training on mixed
crop sizes (``MixedCropSegDataPreProcessor``), against independent constructions."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from lookhere_dense.models.backbones import LookHereViT

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _trained_like(model: LookHereViT) -> LookHereViT:
    """Larger qkv weights, so attention is far from uniform and a query scale shows."""
    with torch.no_grad():
        for blk in model.blocks:
            blk.attn.qkv.weight.mul_(8.0)
    return model.eval()


def _log_n_vit(img_size=32, **kwargs) -> LookHereViT:
    """A :func:`_trained_like` 2-layer, 48-dim, 12-head ViT of 8-pixel patches with
    ``log_n_scaling`` on; ``kwargs``: other backbone arguments."""
    model = LookHereViT(
        img_size=img_size,
        patch_size=8,
        embed_dims=48,
        num_layers=2,
        num_heads=12,
        init_values=None,
        log_n_scaling=True,
        **kwargs,
    )
    return _trained_like(model)


def _scaled_q_weights(model: LookHereViT, scales) -> LookHereViT:
    """A copy whose blocks' query rows of ``qkv`` (weight and bias) are multiplied by
    ``scales[i]``: scaling the queries without the option."""
    ref = copy.deepcopy(model)
    ref.log_n_scaling = False
    dim = model.embed_dims
    with torch.no_grad():
        for blk, s in zip(ref.blocks, scales):
            blk.attn.qkv.weight[:dim].mul_(s)
            blk.attn.qkv.bias[:dim].mul_(s)
    return ref


@pytest.mark.parametrize('encoding', ['lookhere', 'rope2d', 'abs', 'none', 'alibi2d'])
def test_log_n_scaling_scales_every_encodings_queries(encoding):
    torch.manual_seed(0)
    model = _log_n_vit(pos_encoding=encoding)
    x = torch.randn(2, 3, 64, 48)  # an 8x6 grid, trained on 4x4
    scale = math.log(8 * 6 + 1) / math.log(4 * 4 + 1)  # keys: patches + CLS
    assert model.attention_scale((8, 6)) == pytest.approx(scale, rel=1e-12)
    with torch.no_grad():
        got = model(x)[0]
        want = _scaled_q_weights(model, [scale, scale])(x)[0]
        plain = _scaled_q_weights(model, [1.0, 1.0])(x)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got - plain).abs().max() > 1e-2  # the option changes the output


def test_log_n_scaling_is_exactly_one_on_the_training_grid_and_off_in_training():
    torch.manual_seed(0)
    model = _log_n_vit(img_size=(32, 24))
    ref = _scaled_q_weights(model, [1.0, 1.0]).eval()
    x = torch.randn(1, 3, 32, 24)
    with torch.no_grad():
        assert torch.equal(model(x)[0], ref(x)[0])
    big = torch.randn(1, 3, 64, 64)
    model.train()
    ref.train()
    assert model.attention_scale((8, 8)) == 1.0
    torch.manual_seed(1)
    a = model(big)[0]
    torch.manual_seed(1)
    assert torch.equal(a, ref(big)[0])


def test_windowed_blocks_count_the_keys_of_one_window():
    torch.manual_seed(0)
    model = _log_n_vit(window_size=2, window_block_indexes=[0])
    # block 0: 2x2 windows on the 4x4 training grid and on the 8x8 test grid -> 1
    assert model.attention_scale((8, 8), window_size=2) == 1.0
    # a window larger than the training grid: its keys grow with the test grid
    assert model.attention_scale((8, 8), window_size=6) == pytest.approx(
        math.log(37) / math.log(17)
    )
    x = torch.randn(1, 3, 64, 64)
    scale = math.log(65) / math.log(17)
    with torch.no_grad():
        torch.testing.assert_close(
            model(x)[0], _scaled_q_weights(model, [1.0, scale])(x)[0], rtol=1e-4, atol=1e-4
        )


def test_log_n_scaling_needs_two_training_tokens():
    with pytest.raises(ValueError, match='log_n_scaling needs at least 2 tokens'):
        LookHereViT(
            img_size=8,
            patch_size=8,
            embed_dims=48,
            num_layers=1,
            num_heads=12,
            with_cls_token=False,
            log_n_scaling=True,
        )


# -- mixed crop sizes -------------------------------------------------------------------
def _mixed(**kwargs):
    """``MixedCropSegDataPreProcessor`` built from the registry (in mmseg's scope, whatever
    scope an earlier test left as the default)."""
    from mmseg.registry import MODELS

    return MODELS.build(dict(_scope_='mmseg', type='MixedCropSegDataPreProcessor', **kwargs))


def _batch(n: int = 3, size: int = 12):
    """Images whose channel 0 encodes each pixel's position, labels = the same code."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    inputs, samples = [], []
    for i in range(n):
        code = torch.arange(size * size, dtype=torch.float32).reshape(size, size) % 251 + i
        inputs.append(torch.stack([code, code * 0, code * 0]))
        sample = SegDataSample()
        sample.gt_sem_seg = PixelData(data=code[None].long())
        sample.set_metainfo(dict(img_shape=(size, size), ori_shape=(size, size)))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def test_mixed_crops_share_one_size_per_batch_and_keep_labels_aligned():
    from mmseg.registry import MODELS

    pre = _mixed(crop_sizes=[(4, 4), (6, 8), 12], seed=3, size=(12, 12), bgr_to_rgb=False)
    seen = set()
    for _ in range(12):
        out = pre(_batch(), training=True)
        inputs = out['inputs']
        h, w = inputs.shape[-2:]
        seen.add((h, w))
        for x, sample in zip(inputs, out['data_samples']):
            assert torch.equal(x[0].long(), sample.gt_sem_seg.data[0])  # same window
            assert tuple(sample.img_shape) == (h, w) == tuple(sample.gt_sem_seg.shape)
    assert seen == {(4, 4), (6, 8), (12, 12)}
    # the same seed draws the same sizes and windows
    a = _mixed(crop_sizes=[4, 6], seed=1, size=(12, 12))
    b = _mixed(crop_sizes=[4, 6], seed=1, size=(12, 12))
    for _ in range(3):
        assert torch.equal(a(_batch(), True)['inputs'], b(_batch(), True)['inputs'])
    # inference is SegDataPreProcessor's
    plain = MODELS.build(dict(_scope_='mmseg', type='SegDataPreProcessor'))
    assert torch.equal(a(_batch(), False)['inputs'], plain(_batch(), False)['inputs'])


def test_mixed_crops_errors_name_the_problem():
    with pytest.raises(ValueError, match='needs at least one crop size'):
        _mixed(crop_sizes=[])
    with pytest.raises(ValueError, match=r'crop size \(4, 0\) is not'):
        _mixed(crop_sizes=[(4, 0)])
    pre = _mixed(crop_sizes=[16], size=(12, 12))
    with pytest.raises(
        ValueError,
        match=r'crop size \(16, 16\) is larger than the training '
        r'batch \(12x12\)',
    ):
        pre(_batch(), training=True)
