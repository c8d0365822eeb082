"""Training on mixed crop sizes: an extrapolation aid for whole-frame inference.

``MixedCropSegDataPreProcessor`` (registered in mmseg's ``MODELS``) is mmseg's
``SegDataPreProcessor`` that, in training, crops every batch to **one** size drawn per
batch from ``crop_sizes`` (each sample at its own random position). The samples of a batch
therefore share one size (they are stacked into one tensor), and the model sees several
grids during training.

How to use it in an mmseg config: let the training pipeline's ``RandomCrop`` produce the
*largest* size, and name the sizes here::

    crop_size = (128, 128)   # the pipeline's RandomCrop: the largest of the mixed sizes
    model = dict(data_preprocessor=dict(
        type='MixedCropSegDataPreProcessor', crop_sizes=[(64, 64), (96, 96), (128, 128)],
        size=crop_size, mean=..., std=...))

Inference (validation, test) is exactly ``SegDataPreProcessor``'s. The study tool applies
it with ``--aids mixed_crops`` (:mod:`lookhere_dense.study.aids`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from mmengine.structures import PixelData
from mmseg.models.data_preprocessor import SegDataPreProcessor
from mmseg.registry import MODELS

__all__ = ['MixedCropSegDataPreProcessor', 'check_crop_sizes']

#: the per-pixel fields of a ``SegDataSample`` that are cropped with the image
_PIXEL_FIELDS = ('gt_sem_seg', 'gt_edge_map', 'gt_depth_map')


def check_crop_sizes(crop_sizes: Sequence[Any]) -> List[Tuple[int, int]]:
    """``crop_sizes`` as ``(H, W)`` int pairs (an int ``s`` is ``(s, s)``).

    Raises:
        ValueError: no sizes, or a size that is not two positive ints.
    """
    sizes: List[Tuple[int, int]] = []
    for size in crop_sizes or ():
        pair = (size, size) if isinstance(size, int) else tuple(size)
        if len(pair) != 2 or min(int(s) for s in pair) < 1:
            raise ValueError(
                f'MixedCropSegDataPreProcessor: crop size {size!r} is not '
                '(H, W) with positive ints'
            )
        sizes.append((int(pair[0]), int(pair[1])))
    if not sizes:
        raise ValueError('MixedCropSegDataPreProcessor needs at least one crop size in crop_sizes')
    return sizes


@MODELS.register_module()
class MixedCropSegDataPreProcessor(SegDataPreProcessor):
    """``SegDataPreProcessor`` that crops each training batch to one size drawn from
    ``crop_sizes`` (see :mod:`lookhere_dense.data.mixed_crops`).

    Args:
        crop_sizes: ``(H, W)`` sizes to draw from (uniformly; an int ``s`` is
            ``(s, s)``), each no larger than the batches the pipeline produces.
        seed: seed of the draws (sizes and positions; a generator of its own, so the
            global random streams are not touched). Default: None
            (``torch.initial_seed()`` at the first training batch, i.e. the run's seed
            under mmengine's ``randomness``). The generator's state is part of the
            checkpoints :class:`~lookhere_dense.engine.hooks.ExactResumeHook` writes, so
            a resumed run goes on with the draws of the uninterrupted one.
        **kwargs: ``SegDataPreProcessor``'s arguments.

    Raises:
        ValueError: see :func:`check_crop_sizes`.
    """

    def __init__(self, crop_sizes: Sequence[Any], seed: Optional[int] = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.crop_sizes = check_crop_sizes(crop_sizes)
        self.seed = seed
        self._generator: Optional[torch.Generator] = None

    def _rng(self) -> torch.Generator:
        """The preprocessor's own generator, created (and seeded) at first use."""
        if self._generator is None:
            self._generator = torch.Generator()
            self._generator.manual_seed(
                torch.initial_seed() if self.seed is None else int(self.seed)
            )
        return self._generator

    def _draw(self, high: int) -> int:
        """A uniform int in ``[0, high)`` from the preprocessor's own generator."""
        return int(torch.randint(high, (1,), generator=self._rng()))

    def get_rng_state(self) -> torch.Tensor:
        """The state of the generator of the draws (a CPU ``ByteTensor``), which
        :class:`~lookhere_dense.engine.hooks.ExactResumeHook` saves in checkpoints. Before
        the first training batch the generator is created here, seeded as that batch
        would seed it, so the state saved is the one the run goes on from."""
        return self._rng().get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Continue the draws from ``state`` (what :meth:`get_rng_state` returned), as
        :class:`~lookhere_dense.engine.hooks.ExactResumeHook` does on resume."""
        self._rng().set_state(state.detach().to('cpu', torch.uint8))

    def forward(self, data: dict, training: bool = False) -> Dict[str, Any]:
        """``SegDataPreProcessor.forward``; in training the batch is then cropped to
        one drawn size.

        Raises:
            ValueError: a drawn size larger than the batch (naming both).
        """
        out = super().forward(data, training)
        if not training:
            return out
        inputs, samples = out['inputs'], out['data_samples']
        ch, cw = self.crop_sizes[self._draw(len(self.crop_sizes))]
        height, width = inputs.shape[-2:]
        if ch > height or cw > width:
            raise ValueError(
                f'MixedCropSegDataPreProcessor: crop size {(ch, cw)} is '
                f'larger than the training batch ({height}x{width}); let the '
                'pipeline crop to the largest of crop_sizes'
            )
        crops = []
        for i, sample in enumerate(samples):
            y0, x0 = self._draw(height - ch + 1), self._draw(width - cw + 1)
            crops.append(inputs[i, :, y0 : y0 + ch, x0 : x0 + cw])
            for name in _PIXEL_FIELDS:
                if name in sample:
                    pixels = getattr(sample, name)
                    setattr(
                        sample,
                        name,
                        PixelData(
                            data=pixels.data[..., y0 : y0 + ch, x0 : x0 + cw],
                            metainfo=pixels.metainfo,
                        ),
                    )
            sample.set_metainfo(
                dict(img_shape=(ch, cw), pad_shape=(ch, cw), batch_input_shape=(ch, cw))
            )
        return dict(inputs=torch.stack(crops), data_samples=samples)
