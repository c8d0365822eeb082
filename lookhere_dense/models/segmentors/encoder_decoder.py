"""``LeanEncoderDecoder``: mmseg's ``EncoderDecoder`` without the identity resize of its
post-processing.

mmseg's ``BaseSegmentor.postprocess_result`` crops the padding off each image's logits
and then always calls ``F.interpolate`` to ``ori_shape`` -- also when the cropped logits
already have that shape (a whole frame tested at its own size, e.g. Cityscapes
1024x2048 with ``size_divisor=16``). A bilinear resize to the same size is the identity
but allocates a new full-resolution ``(C, H, W)`` float tensor while the batch logits are
still alive: at 1024x2048 with 19 classes, 152 MiB more at the very end of inference.
This segmentor skips that one call; everything else (whole and sliding-window inference,
training, flips, the sigmoid branch, what the data samples hold) is mmseg's, and the
results are the same values.
"""

from __future__ import annotations

from mmengine.structures import PixelData
from mmseg.models.segmentors import EncoderDecoder
from mmseg.models.utils import resize
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample
from mmseg.utils import OptSampleList, SampleList
from torch import Tensor

__all__ = ['LeanEncoderDecoder']


@MODELS.register_module()
class LeanEncoderDecoder(EncoderDecoder):
    """mmseg's ``EncoderDecoder`` whose post-processing resizes only when the size changes.

    The drop-in for ``type='EncoderDecoder'`` (same arguments, same state_dict, same
    predictions): ``postprocess_result`` returns what mmseg's returns, but a bilinear
    resize to the shape the logits already have (the identity for finite logits) is not
    run, so no second full-resolution copy of the logits is made. Cropped (padded)
    logits are still made contiguous, as mmseg's resize would.
    Only registered in mmseg's ``MODELS``.
    """

    def postprocess_result(
        self, seg_logits: Tensor, data_samples: OptSampleList = None
    ) -> SampleList:
        """Logits ``(B, C, H, W)`` -> data samples with ``seg_logits`` and ``pred_sem_seg``
        (see mmseg's ``BaseSegmentor.postprocess_result``)."""
        batch_size, C, H, W = seg_logits.shape
        only_prediction = data_samples is None
        if only_prediction:
            data_samples = [SegDataSample() for _ in range(batch_size)]
        for i in range(batch_size):
            if only_prediction:
                i_seg_logits = seg_logits[i]
            else:
                img_meta = data_samples[i].metainfo
                padding_size = img_meta.get(
                    'img_padding_size', img_meta.get('padding_size', [0] * 4)
                )
                left, right, top, bottom = padding_size
                i_seg_logits = seg_logits[i : i + 1, :, top : H - bottom, left : W - right]
                flip = img_meta.get('flip', None)
                if flip:
                    direction = img_meta.get('flip_direction', None)
                    assert direction in ['horizontal', 'vertical']
                    i_seg_logits = i_seg_logits.flip(
                        dims=(3,) if direction == 'horizontal' else (2,)
                    )
                ori_shape = tuple(int(s) for s in img_meta['ori_shape'][:2])
                if tuple(i_seg_logits.shape[2:]) == ori_shape:
                    i_seg_logits = i_seg_logits.contiguous().squeeze(0)
                else:
                    i_seg_logits = resize(
                        i_seg_logits,
                        size=img_meta['ori_shape'],
                        mode='bilinear',
                        align_corners=self.align_corners,
                        warning=False,
                    ).squeeze(0)
            if C > 1:
                i_seg_pred = i_seg_logits.argmax(dim=0, keepdim=True)
            else:
                i_seg_logits = i_seg_logits.sigmoid()
                i_seg_pred = (i_seg_logits > self.decode_head.threshold).to(i_seg_logits)
            data_samples[i].set_data(
                {
                    'seg_logits': PixelData(**{'data': i_seg_logits}),
                    'pred_sem_seg': PixelData(**{'data': i_seg_pred}),
                }
            )
        return data_samples
