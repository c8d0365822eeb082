"""Data-check pipeline transforms (registered in mmseg's ``TRANSFORMS``)."""
from __future__ import annotations

import warnings
from typing import Any, Dict

from mmcv.transforms import BaseTransform
from mmseg.registry import TRANSFORMS

from ..errors import DataCheckWarning, LabelRangeError, LabelSizeError
from ..validation import check_int
from .labels import (all_ignored_message, bad_label_values, channels_message, label_message,
                     size_message)

__all__ = ['CheckSegLabels']


@TRANSFORMS.register_module()
class CheckSegLabels(BaseTransform):
    """Pipeline transform: fail clearly when a loaded annotation has a label value the
    model cannot take. Put it right after ``LoadAnnotations``.

    Keys: ``gt_seg_map`` (and ``seg_map_path`` for the message). A sample without an
    annotation (no ``gt_seg_map`` and no ``seg_map_path``: an inference pipeline, where
    mmseg's ``inference_model`` and ``MMSegInferencer`` drop ``LoadAnnotations``) passes
    unchanged; one whose annotation file is named but not loaded is a misplaced transform.

    Args:
        num_classes: valid class ids are ``0..num_classes-1``.
        ignore_index: the one other allowed value. Default: 255.

    Raises:
        LabelRangeError: naming the file, the bad values and what to change.
    """

    def __init__(self, num_classes: int, ignore_index: int = 255):
        check_int('CheckSegLabels: num_classes', num_classes)
        self.num_classes = num_classes
        self.ignore_index = ignore_index
        self._warned: set = set()

    def transform(self, results: Dict[str, Any]) -> Dict[str, Any]:
        """Check ``results['gt_seg_map']`` (values; its size against the loaded image's,
        ``ori_shape``, when an image is loaded; a warning, once per file, when it holds only
        the ignore index); return ``results`` unchanged.

        Raises:
            LabelRangeError: a value outside the classes and the ignore index.
            LabelSizeError: the annotation's size differs from the image's.
        """
        seg = results.get('gt_seg_map')
        if seg is None:
            if results.get('seg_map_path') is None:  # no annotation: nothing to check
                return results
            raise KeyError('CheckSegLabels needs gt_seg_map: put it after LoadAnnotations '
                           f"(the annotation {results['seg_map_path']!r} is not loaded yet)")
        path = results.get('seg_map_path', '<unknown file>')
        if seg.ndim != 2:
            raise LabelRangeError(channels_message('CheckSegLabels', path, seg.shape))
        bad = bad_label_values(seg, self.num_classes, self.ignore_index)
        if bad:
            raise LabelRangeError(label_message(
                path, bad, self.num_classes, self.ignore_index,
                results.get('reduce_zero_label')))
        img = results.get('img')
        if img is not None:
            # the loaded size (ori_shape) or, when both were resized together, the image's
            sizes = {tuple(img.shape[:2]), tuple(results.get('ori_shape') or img.shape[:2])}
            if tuple(seg.shape[:2]) not in sizes:
                raise LabelSizeError(size_message(
                    'CheckSegLabels', results.get('img_path', '<unknown image>'),
                    tuple(results.get('ori_shape') or img.shape[:2]), path,
                    tuple(seg.shape[:2])))
        if seg.size and path not in self._warned and bool((seg == self.ignore_index).all()):
            self._warned.add(path)
            warnings.warn(DataCheckWarning(all_ignored_message([path], self.ignore_index)))
        return results

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(num_classes={self.num_classes}, '
                f'ignore_index={self.ignore_index})')


# ----------------------------------------------------------------------------------------
# Config walking
