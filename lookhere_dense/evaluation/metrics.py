"""Segmentation metrics (registered in mmseg's ``METRICS`` by
:func:`lookhere_dense.register_all_modules`)."""

from __future__ import annotations

from typing import Dict, Optional

from mmseg.evaluation.metrics import IoUMetric
from mmseg.registry import METRICS

__all__ = ['PerClassIoUMetric']


@METRICS.register_module()
class PerClassIoUMetric(IoUMetric):
    """mmseg's ``IoUMetric`` that also returns ``IoU.<class>`` for every class of the
    dataset (IoU in %, rounded to 2 decimals; for a class absent from predictions and
    labels alike ``100 * nan_to_num``, as mmseg's per-class table, else None). The extrapolation study scores its ladders
    with it.

    Takes the same arguments as ``IoUMetric``.
    """

    def compute_metrics(self, results: list) -> Dict[str, Optional[float]]:
        metrics = super().compute_metrics(results)
        if self.format_only:  # IoUMetric saved the predictions and returns no metrics
            return metrics
        per = tuple(zip(*results))
        inter, union = sum(per[0]), sum(per[1])
        iou = (inter / union).tolist()
        # IoUMetric replaces NaN on the 0..1 scale, then reports percent
        absent = None if self.nan_to_num is None else round(100 * self.nan_to_num, 2)
        for name, value in zip(self.dataset_meta['classes'], iou):
            metrics[f'IoU.{name}'] = round(100 * value, 2) if value == value else absent
        return metrics
