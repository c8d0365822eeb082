"""Chance levels of mIoU: what label-blind predictors score on a set of label maps
(numpy + Pillow; the demo reports them next to its validation mIoU)."""

from __future__ import annotations

from typing import Dict, List

import numpy as np

__all__ = ['chance_levels']


def chance_levels(
    label_files: List[str], reduce_zero_label: bool, ignore_index: int = 255
) -> Dict[str, float]:
    """Expected mIoU (%) of two label-blind predictors on these label maps, computed the
    way mmseg's IoUMetric averages (over classes with a non-empty union):

    * ``uniform``: every pixel gets one of the K classes present, uniformly at random
      (class c with pixel share p_c: IoU = (p_c / K) / (p_c + 1/K - p_c / K));
    * ``majority``: every pixel gets the most frequent class (IoU = p_max; the other
      present classes 0).

    Args:
        label_files: label PNGs.
        reduce_zero_label: labels as mmseg's ``reduce_zero_label`` reads them (0 and 255
            ignored, the others minus 1).
        ignore_index: label value that is not scored. Default: 255.

    Returns:
        ``dict(uniform=%, majority=%, classes=K)``.
    """
    from PIL import Image

    counts = np.zeros(256, np.int64)
    for f in label_files:
        seg = np.asarray(Image.open(f)).astype(np.int64)  # as mmseg (pillow): palette indices
        if reduce_zero_label:
            seg = np.where((seg == 0) | (seg == 255), 256, seg - 1)  # as mmseg: 255 stays ignored
        seg = seg[(seg != ignore_index) & (seg < 256)]
        counts += np.bincount(seg.ravel(), minlength=256)[:256]
    p = counts[counts > 0] / counts.sum()
    k = len(p)
    uniform = np.mean((p / k) / (p + 1 / k - p / k))
    majority = p.max() / k
    return dict(uniform=100 * float(uniform), majority=100 * float(majority), classes=k)
