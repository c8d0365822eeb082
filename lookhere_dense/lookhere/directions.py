"""Fields of view of LookHere heads, as boolean masks over relative offsets.

Every function here works on *relative offsets* between a query patch ``q`` and a key
patch ``k`` on the patch grid, with image axes (y grows downwards, x to the right)::

    dy = k_y - q_y        dx = k_x - q_x

A head's field of view never depends on where the query is, only on ``(dy, dx)``. That
is what makes LookHere translation-equivariant, and what lets :mod:`.bias` keep a
``(2H-1, 2W-1)`` table per head instead of an ``N x N`` matrix.

Vocabulary (the official code's names, GreenCUBIC/lookhere ``lookhere.py``):

* *primitive directions* -- the building blocks a head combines:

  ==============  ==========================================  ========
  primitive       the head sees keys with ...                 FOV
  ==============  ==========================================  ========
  ``up``          ``dy <= 0``                                 180 deg
  ``down``        ``dy >= 0``                                 180 deg
  ``left``        ``dx <= 0``                                 180 deg
  ``right``       ``dx >= 0``                                 180 deg
  ``tri_up``      ``dy <= -|dx|``                             90 deg
  ``tri_down``    ``dy >= |dx|``                              90 deg
  ``tri_left``    ``dx <= -|dy|``                             90 deg
  ``tri_right``   ``dx >= |dy|``                              90 deg
  ``diag_A_B``    the union of ``tri_A`` and ``tri_B``        180 deg
  ``zero``        everything, and the distance is set to 0    360 deg
  ``center``      everything, distance from the grid centre   360 deg
  ==============  ==========================================  ========

  A head that lists several primitives sees the *intersection* of their fields of view
  (the official code ORs their blocked masks), e.g. ``('up', 'left')`` is the 90 deg
  up-left quadrant and ``('tri_up', 'left')`` the 45 deg wedge left of straight up.
  A head with no primitive at all sees everything (``none``).

* *direction types* -- named groups of four heads (:data:`DIRECTION_TYPES`), e.g.
  ``halves`` = up, down, left, right. A head string such as ``'halves-none'`` or
  ``'eighths1-eighths2-none'`` lists direction types; :mod:`.bias` turns it into heads.

Every field of view contains ``(0, 0)``: a query always sees itself, so no attention row
is ever fully blocked.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor

__all__ = [
    'PRIMITIVES',
    'DIRECTION_TYPES',
    'NONE_LIKE_TYPES',
    'primitive_blocked',
    'head_blocked',
    'relative_offsets',
]

HeadSpec = Tuple[str, ...]

#: The four heads of every direction type, in the official order.
DIRECTION_TYPES: Dict[str, Tuple[HeadSpec, HeadSpec, HeadSpec, HeadSpec]] = {
    'none': ((), (), (), ()),
    'zero': (('zero',),) * 4,
    'none1zero3': ((), ('zero',), ('zero',), ('zero',)),
    'none2zero2': ((), (), ('zero',), ('zero',)),
    'none3zero1': ((), (), (), ('zero',)),
    'center': (('center',),) * 4,
    'halves': (('up',), ('down',), ('left',), ('right',)),
    'corners': (('up', 'left'), ('up', 'right'), ('down', 'left'), ('down', 'right')),
    'triangles': (('tri_up',), ('tri_down',), ('tri_left',), ('tri_right',)),
    'diagonals': (
        ('diag_up_right',),
        ('diag_up_left',),
        ('diag_down_right',),
        ('diag_down_left',),
    ),
    'eighths1': (
        ('tri_up', 'left'),
        ('tri_down', 'left'),
        ('tri_left', 'up'),
        ('tri_right', 'up'),
    ),
    'eighths2': (
        ('tri_up', 'right'),
        ('tri_down', 'right'),
        ('tri_left', 'down'),
        ('tri_right', 'down'),
    ),
    'zerohalves': (('zero', 'up'), ('zero', 'down'), ('zero', 'left'), ('zero', 'right')),
    'zerocorners': (
        ('zero', 'up', 'left'),
        ('zero', 'up', 'right'),
        ('zero', 'down', 'left'),
        ('zero', 'down', 'right'),
    ),
    'zerotriangles': (
        ('zero', 'tri_up'),
        ('zero', 'tri_down'),
        ('zero', 'tri_left'),
        ('zero', 'tri_right'),
    ),
}

#: Types whose heads get the "unrestricted" slope schedule (official: names containing
#: ``zero``, ``center`` or ``none``); every other type gets the directed schedule.
NONE_LIKE_TYPES = tuple(t for t in DIRECTION_TYPES if 'zero' in t or 'center' in t or 'none' in t)

_HALF_PLANES = ('up', 'down', 'left', 'right')
_CONES = ('tri_up', 'tri_down', 'tri_left', 'tri_right')
_DIAGONALS = ('diag_up_right', 'diag_up_left', 'diag_down_right', 'diag_down_left')
#: Primitives that restrict the field of view (``zero``/``center`` change the distance).
PRIMITIVES = _HALF_PLANES + _CONES + _DIAGONALS + ('zero', 'center')


def relative_offsets(
    height: int, width: int, device: torch.device | str | None = None
) -> Tuple[Tensor, Tensor]:
    """All offsets a ``height x width`` grid can produce.

    Returns:
        ``(dy, dx)``, int64 tensors of shape ``(2*height-1, 2*width-1)`` with
        ``dy[i, j] = i - (height-1)`` and ``dx[i, j] = j - (width-1)``.
    """
    dy = torch.arange(-(height - 1), height, device=device)
    dx = torch.arange(-(width - 1), width, device=device)
    return torch.meshgrid(dy, dx, indexing='ij')


def _cone_visible(name: str, dy: Tensor, dx: Tensor) -> Tensor:
    """Visible part of a 90 deg cone ``tri_*`` (boundaries, the 45 deg diagonals, included)."""
    if name == 'tri_up':
        return dy <= -dx.abs()
    if name == 'tri_down':
        return dy >= dx.abs()
    if name == 'tri_left':
        return dx <= -dy.abs()
    if name == 'tri_right':
        return dx >= dy.abs()
    raise ValueError(f'unknown cone {name!r}; allowed: {_CONES}')


def primitive_blocked(name: str, dy: Tensor, dx: Tensor) -> Tensor:
    """Offsets a single primitive direction blocks.

    Args:
        name: one of :data:`PRIMITIVES`.
        dy, dx: integer offset tensors of one shape (key minus query).

    Returns:
        Bool tensor of that shape, True where the key is outside the field of view.
        ``zero`` and ``center`` block nothing.
    """
    if name == 'up':
        return dy > 0
    if name == 'down':
        return dy < 0
    if name == 'left':
        return dx > 0
    if name == 'right':
        return dx < 0
    if name in _CONES:
        return ~_cone_visible(name, dy, dx)
    if name in _DIAGONALS:
        _, a, b = name.split('_')
        return ~(_cone_visible('tri_' + a, dy, dx) | _cone_visible('tri_' + b, dy, dx))
    if name in ('zero', 'center'):
        return torch.zeros_like(dy, dtype=torch.bool)
    raise ValueError(f'unknown primitive direction {name!r}; allowed: {PRIMITIVES}')


def head_blocked(spec: Sequence[str], dy: Tensor, dx: Tensor) -> Tensor:
    """Offsets a head with primitives ``spec`` blocks (the OR of its primitives' masks)."""
    blocked = torch.zeros_like(dy, dtype=torch.bool)
    for name in spec:  # at most three primitives per head
        blocked |= primitive_blocked(name, dy, dx)
    return blocked


def heads_of_type(direction_type: str) -> List[HeadSpec]:
    """The four head specs of a direction type; ValueError naming the allowed types."""
    try:
        return list(DIRECTION_TYPES[direction_type])
    except KeyError:
        raise ValueError(
            f'unknown LookHere direction type {direction_type!r}; allowed: '
            f'{sorted(DIRECTION_TYPES)}'
        ) from None
