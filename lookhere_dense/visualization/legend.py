"""A legend drawn into a segmentation overlay: a colour swatch and the class name for
each class present in the prediction, largest area first (``tools/infer.py``). numpy and
OpenCV only.

The legend sits in the top-left corner on a dark translucent panel, so the overlay keeps
the image's size; when not every class fits, the last row says how many are left out.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ['present_classes', 'draw_legend']


def present_classes(
    labels: np.ndarray, num_classes: int, ignore_index: int = 255
) -> List[Tuple[int, int]]:
    """``(class id, pixel count)`` of the classes in ``labels`` (``(H, W)`` ids), largest
    first; ids outside ``0..num_classes-1`` and ``ignore_index`` are left out."""
    ids, counts = np.unique(labels, return_counts=True)
    keep = [
        (int(i), int(c)) for i, c in zip(ids, counts) if i != ignore_index and 0 <= i < num_classes
    ]
    return sorted(keep, key=lambda ic: (-ic[1], ic[0]))


def draw_legend(
    rgb: np.ndarray,
    labels: np.ndarray,
    palette: Sequence[Sequence[int]],
    class_names: Optional[Sequence[str]] = None,
    ignore_index: int = 255,
    max_rows: Optional[int] = None,
) -> np.ndarray:
    """Draw the legend of the classes present in ``labels`` onto a copy of ``rgb``.

    Args:
        rgb: ``(H, W, 3)`` uint8 image (the overlay).
        labels: ``(H, W)`` predicted class ids.
        palette: RGB colour of each class.
        class_names: name of each class. Default: None (``class <id>``).
        ignore_index: label not listed. Default: 255.
        max_rows: at most this many rows. Default: None (as many as fit the height).

    Returns:
        ``(H, W, 3)`` uint8, the same size as ``rgb``.
    """
    import cv2

    out = np.ascontiguousarray(rgb.copy())
    h, w = out.shape[:2]
    present = present_classes(labels, len(palette), ignore_index)
    if not present or h < 12 or w < 24:
        return out
    # row height in px: 22 up to ~700 px, then growing with the image (1/32 of its short
    # side), so that a 2048-px overlay shown on a screen keeps a legible legend
    row = int(np.clip(h // 16, 11, max(22, min(h, w) // 32)))
    scale = row / 30.0  # Hershey simplex: ~22 px at 1.0
    thick = 1 if row < 18 else 2
    pad = max(2, row // 5)
    fit = max(1, (h - 2 * pad) // row)
    if max_rows is not None:
        fit = max(1, min(fit, max_rows))
    rows = present if len(present) <= fit else present[: fit - 1]
    texts = [
        class_names[i] if class_names is not None and i < len(class_names) else f'class {i}'
        for i, _ in rows
    ]
    if len(rows) < len(present):
        texts.append(f'+{len(present) - len(rows)} more')
    swatch = row - pad - 2
    widths = [cv2.getTextSize(t, cv2.FONT_HERSHEY_SIMPLEX, scale, thick)[0][0] for t in texts]
    width = min(w, pad * 3 + swatch + max(widths))
    height = min(h, pad * 2 + row * len(texts))
    panel = out[:height, :width].astype(np.float32)
    out[:height, :width] = (panel * 0.35).astype(np.uint8)  # dark translucent panel
    for n, text in enumerate(texts):
        y0 = pad + n * row
        if n < len(rows):
            colour = tuple(int(c) for c in palette[rows[n][0]])
            cv2.rectangle(out, (pad, y0 + 1), (pad + swatch, y0 + swatch + 1), colour, -1)
            cv2.rectangle(out, (pad, y0 + 1), (pad + swatch, y0 + swatch + 1), (255, 255, 255), 1)
        cv2.putText(
            out,
            text,
            (pad * 2 + swatch, y0 + row - pad),
            cv2.FONT_HERSHEY_SIMPLEX,
            scale,
            (255, 255, 255),
            thick,
            cv2.LINE_AA,
        )
    return out
