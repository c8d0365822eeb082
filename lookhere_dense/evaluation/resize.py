"""The one test-time ``Resize`` rewrite of a data pipeline (plain Python, no OpenMMLab).

A test pipeline is a list of transform dicts (mmseg / mmcv style). The extrapolation report
(``tools/extrapolate.py``), the study's ``resize`` ladder and ``tools/infer.py`` all change
the size images are tested at; they do it here:

* :func:`scale_resizes` -- every ``Resize`` multiplied by a factor (its ``scale``, or its
  ``scale_factor`` when it has no scale);
* :func:`short_side_resize` / :func:`long_side_resize` / :func:`exact_resize` -- a
  ``Resize`` to a short side or to a long side (aspect kept), or to exactly ``(H, W)``;
* :func:`replace_resize` -- the first ``Resize`` replaced by another one (inserted after the
  image loading when there is none), or removed;
* :func:`check_resize_sides` -- a resize target with a side below one patch of the
  backbone refused, naming how it was given.

A transform is a ``Resize`` when its ``type`` -- a registry name, possibly scoped
(``'mmseg.Resize'``, ``'mmcv.Resize'``), or a class -- names ``Resize`` (:func:`is_resize`);
``RandomResize`` and other transforms are left alone. Every function returns a new list and
never changes the pipeline it is given.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import ConfigError

__all__ = [
    'transform_name',
    'is_resize',
    'find_resize',
    'scale_resizes',
    'short_side_resize',
    'long_side_resize',
    'exact_resize',
    'replace_resize',
    'check_resize_sides',
]

#: the ``scale`` width of a short-side resize: large enough never to be the limiting side
LONG_SIDE_UNLIMITED = 1 << 20


def transform_name(transform: Dict[str, Any]) -> str:
    """The bare type name of a transform dict: ``'mmseg.Resize'`` -> ``'Resize'``; a class
    ``type`` gives its ``__name__``; no ``type`` gives ``''``."""
    kind = transform.get('type', '')
    if not isinstance(kind, str):
        kind = getattr(kind, '__name__', str(kind))
    return kind.split('.')[-1]


def is_resize(transform: Dict[str, Any]) -> bool:
    """True for ``Resize`` transforms (``'Resize'``, ``'mmseg.Resize'``, ``'mmcv.Resize'``,
    the class), False for everything else (``'RandomResize'`` included)."""
    return transform_name(transform) == 'Resize'


def find_resize(pipeline: Sequence[Dict[str, Any]]) -> Optional[int]:
    """Index of the first ``Resize`` of ``pipeline``, or None."""
    return next((i for i, t in enumerate(pipeline) if is_resize(t)), None)


def _copy(pipeline: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [copy.deepcopy(dict(t)) for t in pipeline]


def _times(value: Any, factor: float, integer: bool) -> Any:
    """``value`` (a number or a sequence of numbers) times ``factor``; rounded to ints
    with ``integer``; sequences come back as tuples."""

    def one(v):
        return int(round(v * factor)) if integer else v * factor

    return tuple(one(v) for v in value) if isinstance(value, (list, tuple)) else one(value)


def scale_resizes(
    pipeline: Sequence[Dict[str, Any]], factor: float
) -> Tuple[List[Dict[str, Any]], int]:
    """Multiply every ``Resize`` of ``pipeline`` by ``factor``.

    A ``Resize`` with a ``scale`` gets ``round(scale * factor)`` (each side); one with only
    a ``scale_factor`` gets ``scale_factor * factor``. Every other key is kept.

    Returns:
        ``(new pipeline, number of Resize transforms scaled)``; 0 means there was nothing
        to scale (the caller says what that means for it).
    """
    out = _copy(pipeline)
    scaled = 0
    for t in out:
        if not is_resize(t):
            continue
        if t.get('scale') is not None:
            t['scale'] = _times(t['scale'], factor, integer=True)
        elif t.get('scale_factor') is not None:
            t['scale_factor'] = _times(t['scale_factor'], factor, integer=False)
        else:
            continue
        scaled += 1
    return out, scaled


def short_side_resize(short_side: int) -> Dict[str, Any]:
    """A ``Resize`` to short side ``short_side`` px, aspect ratio kept."""
    return dict(type='Resize', scale=(LONG_SIDE_UNLIMITED, int(short_side)), keep_ratio=True)


def long_side_resize(long_side: int) -> Dict[str, Any]:
    """A ``Resize`` to long side ``long_side`` px, aspect ratio kept (an image's *native*
    aspect, as when ImageNet-Val is tested at 384 px without a square crop).

    mmcv's ``Resize(scale=(N, N), keep_ratio=True)`` rescales by ``min(N / long, N / short)
    = N / long``: the longer side becomes exactly ``N`` (``int(side * N / long + 0.5)``),
    smaller images are enlarged and larger ones shrunk, the shorter side follows the aspect.
    """
    return dict(type='Resize', scale=(int(long_side), int(long_side)), keep_ratio=True)


def exact_resize(size: Tuple[int, int]) -> Dict[str, Any]:
    """A ``Resize`` to exactly ``size = (H, W)`` (mmcv's ``scale`` is ``(W, H)``)."""
    h, w = size
    return dict(type='Resize', scale=(int(w), int(h)), keep_ratio=False)


def replace_resize(
    pipeline: Sequence[Dict[str, Any]], resize: Optional[Dict[str, Any]]
) -> List[Dict[str, Any]]:
    """``pipeline`` with its first ``Resize`` replaced by ``resize``; without a ``Resize``,
    ``resize`` goes right after ``LoadImageFromFile`` (else after the first transform, the
    loader). ``resize=None`` removes the first ``Resize`` (images keep their own size)."""
    out = _copy(pipeline)
    idx = find_resize(out)
    if resize is None:
        if idx is not None:
            out.pop(idx)
        return out
    if idx is not None:
        out[idx] = dict(resize)
    else:
        load = next((i for i, t in enumerate(out) if transform_name(t) == 'LoadImageFromFile'), 0)
        out.insert(load + 1, dict(resize))
    return out


def check_resize_sides(
    what: str, target: Union[int, Sequence[int]], patch: Any = None, advice: str = 'give'
) -> None:
    """Refuse a resize target with a side of 0 px or below one patch of the backbone (the
    model would see less than one patch: a degenerate prediction, without a word).

    Args:
        what: how the target was given, named first in the message (``'--size 8x8'``,
            ``'--short-side 4'``, ``'whole@8x8: the size 8x8 px'``).
        target: ``(H, W)`` of an exact resize, or one int: the short side of a resize that
            keeps the aspect (either side of an image may be the short one, so it must hold
            a patch both ways).
        patch: the backbone's patch size in px, an int or ``(H, W)``; None (or anything
            else): only sides of 0 px are refused.
        advice: the verb of the message's advice (``'test at'`` for a test spec of
            ``tools/extrapolate.py``). Default: ``'give'``.

    Raises:
        lookhere_dense.errors.ConfigError: e.g. ``--size 8x8 has a side of 8 px, below one
            patch of the model (16 px): give 16 px or more``.
    """
    if isinstance(patch, int) and not isinstance(patch, bool):
        patch = (patch, patch)
    ok = isinstance(patch, (list, tuple)) and len(patch) == 2
    ok = ok and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in patch)
    hw = (int(patch[0]), int(patch[1])) if ok else None
    ph, pw = hw or (1, 1)
    if isinstance(target, (list, tuple)):
        h, w = (int(v) for v in target)
        if h >= ph and w >= pw:
            return
        side = h if h < ph else w
        need = f'{ph} px or more' if ph == pw else f'at least {ph}x{pw} px (H x W)'
    else:
        side = int(target)
        if side >= max(ph, pw):
            return
        need = f'{max(ph, pw)} px or more'
    if hw is None:
        raise ConfigError(f'{what} has a side of {side} px: {advice} 1 px or more')
    patch_text = f'{ph} px' if ph == pw else f'{ph}x{pw} px, H x W'
    raise ConfigError(
        f'{what} has a side of {side} px, below one patch of the model ({patch_text}): {advice} {need}'
    )
