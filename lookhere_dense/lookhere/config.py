"""The LookHere configuration: the official ``lh_config`` keys, the presets, and how a head
string expands into per-head fields of view and slopes (the official head-layout rules).

A :class:`LookHereConfig` says *which* bias a model has; :mod:`.bias` computes it (the
relative-offset tables); :mod:`.slopes` makes its slopes learnable. Torch alone.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor

from ..validation import check_bool, is_number
from .directions import NONE_LIKE_TYPES, HeadSpec, heads_of_type

__all__ = [
    'LookHereConfig',
    'PRESETS',
    'preset_name',
    'resolve_lh_config',
    'head_layout',
    'layer_slopes',
    'DISTANCES',
    'FILLS',
    'BIAS_ROUNDINGS',
    'OFFICIAL_KEYS',
]

#: The keys of the official ``lh_config`` (``bias_rounding`` and ``learnable_slopes`` are
#: ours: how the bias is computed and trained, not which bias it is).
OFFICIAL_KEYS = ('head_directions', 'global_slope', 'layer_slopes', 'distance', 'fill_with')
DISTANCES = ('linear', 'sqrt', 'square')
FILLS = ('inf', 'zero', 'max')
BIAS_ROUNDINGS = ('bfloat16', 'none')
#: Head counts the official head-layout rules cover, per number of direction types.
_LAYOUTS = {1: 'any multiple of 4', 2: (6, 12, 16), 3: (12, 16), 4: (16,)}


def _check_slope(name: str, value: Any, whole: Any = None) -> None:
    """A slope is a finite number >= 0 (0: the fields of view without distance penalty)."""
    if not (is_number(value) and math.isfinite(value) and value >= 0):
        shown = f'{value!r}' + (f' (layer_slopes={whole!r})' if whole is not None else '')
        raise ValueError(
            f'LookHere {name} must be a finite number >= 0 (0 keeps the fields '
            f'of view and drops the distance penalty), got {shown}'
        )


@dataclass(frozen=True)
class LookHereConfig:
    """A LookHere configuration, with the official ``lh_config`` keys.

    Args:
        head_directions: a head string such as ``'halves-none'`` (direction types joined
            by ``-``, see :data:`.directions.DIRECTION_TYPES`), or one such string per
            layer. Default: ``'halves-none'``.
        global_slope: multiplies every layer's slope. Default: 1.0.
        layer_slopes: ``(first, last)``; layer ``l`` uses ``linspace(first, last, depth)[l]``.
            Default: ``(1.5, 0.5)``.
        distance: ``'linear'``, ``'sqrt'`` or ``'square'`` of the Euclidean patch distance.
            Default: ``'linear'``.
        fill_with: what blocked keys get: ``'inf'`` (blocked), ``'zero'`` (distance 0) or
            ``'max'`` (the largest distance on the grid). Default: ``'inf'``.
        bias_rounding: ``'bfloat16'`` rounds the bias to bfloat16 like the official code
            (so official checkpoints see exactly the bias they were trained with);
            ``'none'`` keeps float64 precision until the compute dtype. Not an official key.
            Default: ``'bfloat16'``.
        learnable_slopes: the global, layer and head slopes become parameters of the
            position encoding (:class:`~.slopes.LookHereSlopes`), initialised to this
            config's values; they must then be > 0. Not an official key. Default: False.
    """

    head_directions: Union[str, Tuple[str, ...]] = 'halves-none'
    global_slope: float = 1.0
    layer_slopes: Tuple[float, float] = (1.5, 0.5)
    distance: str = 'linear'
    fill_with: str = 'inf'
    bias_rounding: str = 'bfloat16'
    learnable_slopes: bool = False

    def __post_init__(self):
        hd = self.head_directions
        if isinstance(hd, (list, tuple)):
            if not hd or not all(isinstance(s, str) for s in hd):
                raise ValueError(
                    'head_directions must be a string or a non-empty list of '
                    f'strings (one per layer), got {hd!r}'
                )
            object.__setattr__(self, 'head_directions', tuple(hd))
        elif not isinstance(hd, str):
            raise ValueError(f'head_directions must be a string or a list of strings, got {hd!r}')
        for s in self.direction_strings:
            for t in s.split('-'):
                heads_of_type(t)  # raises with the allowed names
        ls = self.layer_slopes
        if not isinstance(ls, (list, tuple)) or len(ls) != 2:
            raise ValueError(f'layer_slopes must be a pair (first, last), got {ls!r}')
        _check_slope('global_slope', self.global_slope)
        for name, value in zip(('first', 'last'), ls):
            _check_slope(f'layer_slopes {name} value', value, ls)
        object.__setattr__(self, 'layer_slopes', (float(ls[0]), float(ls[1])))
        object.__setattr__(self, 'global_slope', float(self.global_slope))
        for name, allowed in (
            ('distance', DISTANCES),
            ('fill_with', FILLS),
            ('bias_rounding', BIAS_ROUNDINGS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f'unknown LookHere {name} {getattr(self, name)!r}; allowed: {list(allowed)}'
                )
        check_bool('LookHere learnable_slopes', self.learnable_slopes)
        if self.learnable_slopes:
            zero = ([f'global_slope={self.global_slope!r}'] if self.global_slope == 0 else []) + (
                [f'layer_slopes={list(self.layer_slopes)}'] if 0 in self.layer_slopes else []
            )
            if zero:
                raise ValueError(
                    'LookHere learnable_slopes=True needs slopes > 0 (each is '
                    'learned as the log of its ratio to the initial value, which '
                    f'0 has not), got {" and ".join(zero)}'
                )

    @property
    def direction_strings(self) -> Tuple[str, ...]:
        """The distinct head strings this config uses (one, unless it varies per layer)."""
        hd = self.head_directions
        return tuple(dict.fromkeys(hd)) if isinstance(hd, tuple) else (hd,)

    def layer_direction(self, layer: int) -> str:
        """The head string of ``layer``."""
        hd = self.head_directions
        return hd[layer] if isinstance(hd, tuple) else hd

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> 'LookHereConfig':
        """Build from an official ``lh_config`` dict (extra keys are an error, by name)."""
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(cfg) - names)
        if unknown:
            raise ValueError(f'unknown LookHere config keys {unknown}; allowed: {sorted(names)}')
        return cls(**dict(cfg))

    def to_dict(self) -> Dict[str, Any]:
        """The official ``lh_config`` dict (plus ``bias_rounding``, and
        ``learnable_slopes=True`` when set: fixed-slope configs write the same dict as
        before that key existed)."""
        hd = self.head_directions
        out = dict(
            head_directions=list(hd) if isinstance(hd, tuple) else hd,
            global_slope=self.global_slope,
            layer_slopes=list(self.layer_slopes),
            distance=self.distance,
            fill_with=self.fill_with,
            bias_rounding=self.bias_rounding,
        )
        if self.learnable_slopes:
            out['learnable_slopes'] = True
        return out

    def validate(self, num_heads: int, depth: int) -> None:
        """Check that this config fits a ``depth``-layer model with ``num_heads`` heads."""
        hd = self.head_directions
        if isinstance(hd, tuple) and len(hd) != depth:
            raise ValueError(
                f'head_directions lists {len(hd)} strings but the model has '
                f'{depth} layers; give one string per layer or a single string'
            )
        for s in self.direction_strings:
            head_layout(s, num_heads)

    def differences(self, other: 'LookHereConfig') -> List[str]:
        """Human-readable ``key: mine != other`` lines where two configs differ."""
        return [
            f'{f.name}: {getattr(self, f.name)!r} != {getattr(other, f.name)!r}'
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


#: Named presets. With 12 heads each has 8 directed heads and 4 unrestricted ("none")
#: heads, as in the paper's LH-180 / LH-90 / LH-45 models:
#:
#: * ``lh180``: ``'halves-none'``  -- heads 0-7 look up/down/left/right (180 deg), two
#:   groups with head slopes 1/2 and 1/4; heads 8-11 see everything with slopes
#:   1/4, 1/16, 1/64, 1/256. ``layer_slopes=(1.5, 0.5)``.
#: * ``lh90``: ``'corners-none'`` -- 90 deg quadrants, same slopes. ``layer_slopes=(1.5, 0.5)``.
#: * ``lh45``: ``'eighths1-eighths2-none'`` -- eight 45 deg wedges (slope 1/2 each),
#:   4 unrestricted heads. ``layer_slopes=(2.0, 0.5)``.
#:
#: All use ``global_slope=1.0``, ``distance='linear'``, ``fill_with='inf'``. A checkpoint's
#: own ``config`` always wins when official weights are loaded.
PRESETS: Dict[str, LookHereConfig] = {
    'lh180': LookHereConfig('halves-none', 1.0, (1.5, 0.5)),
    'lh90': LookHereConfig('corners-none', 1.0, (1.5, 0.5)),
    'lh45': LookHereConfig('eighths1-eighths2-none', 1.0, (2.0, 0.5)),
}


def preset_name(config: LookHereConfig) -> Optional[str]:
    """The name of the preset whose official keys (:data:`OFFICIAL_KEYS`) ``config`` has,
    else None (``bias_rounding`` and ``learnable_slopes`` are not compared)."""
    for name, preset in PRESETS.items():
        if all(getattr(config, k) == getattr(preset, k) for k in OFFICIAL_KEYS):
            return name
    return None


def resolve_lh_config(
    lh_config: Union[None, str, Mapping[str, Any], LookHereConfig] = None,
    preset: Optional[str] = None,
) -> LookHereConfig:
    """One :class:`LookHereConfig` from a preset name and/or an ``lh_config``.

    ``lh_config`` may be a dict (official keys), a :class:`LookHereConfig`, or a preset
    name. When both are given, ``lh_config`` entries override the preset's.
    With neither, ``lh180`` is used.
    """
    if isinstance(lh_config, str):
        if preset is not None:
            raise ValueError('give the preset either as preset= or as lh_config=, not both')
        preset, lh_config = lh_config, None
    base = None
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f'unknown LookHere preset {preset!r}; allowed: {sorted(PRESETS)}')
        base = PRESETS[preset]
    if lh_config is None:
        return base if base is not None else PRESETS['lh180']
    if isinstance(lh_config, LookHereConfig):
        return (
            lh_config
            if base is None
            else replace(base, **{f.name: getattr(lh_config, f.name) for f in fields(lh_config)})
        )
    if isinstance(lh_config, Mapping):
        if base is None:
            return LookHereConfig.from_dict(lh_config)
        return LookHereConfig.from_dict({**base.to_dict(), **dict(lh_config)})
    raise TypeError(
        f'lh_config must be a dict, a preset name or a LookHereConfig, '
        f'got {type(lh_config).__name__}'
    )


# ----------------------------------------------------------------------------------------
# Heads and slopes
# ----------------------------------------------------------------------------------------
def _none_slopes(n: int) -> List[float]:
    """Official slopes of ``n`` consecutive unrestricted heads (``get_none_slopes``)."""
    base = [0.25, 0.0625, 0.015625, 0.00390625]
    if n == 2:
        return base[:2]
    if n == 4:
        return base
    return [s for s in base for _ in range(n // 4)]


def _directed_slopes(n: int) -> List[float]:
    """Official slopes of ``n`` consecutive directed heads (``get_slopes``): 1/2 x4, 1/4 x4, ..."""
    return [2.0**-i for i in range(1, math.ceil(n / 4) + 1) for _ in range(4)]


def head_layout(direction_string: str, num_heads: int) -> Tuple[List[HeadSpec], Tensor, List[str]]:
    """Expand a head string into per-head fields of view and slopes (official rules).

    ======  =========  ==========================================================
    types   heads      layout
    ======  =========  ==========================================================
    1       4k         the type's four heads repeated k times
    2       6          4 heads of type 1, the first 2 heads of type 2
    2       12 / 16    8 heads of type 1 (repeated), then 4 / 8 of type 2
    3       12         4 + 4 + 4
    3       16         8 (type 1 repeated) + 4 + 4
    4       16         4 + 4 + 4 + 4
    ======  =========  ==========================================================

    Consecutive heads of the same type share a slope schedule: directed types get
    1/2, 1/2, 1/2, 1/2, 1/4, ... ; unrestricted types (``none``, ``zero*``, ``center``)
    get 1/4, 1/16, 1/64, 1/256 (each repeated ``n // 4`` times; for two heads 1/4, 1/16).

    Returns:
        ``(specs, slopes, type_names)``: ``num_heads`` head specs, a float64 tensor of
        ``num_heads`` head slopes, and each head's direction type.

    Raises:
        ValueError: unknown type, or a head count the official rules do not cover.
    """
    if not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f'num_heads must be a positive int, got {num_heads!r}')
    types = direction_string.split('-')
    groups = [heads_of_type(t) for t in types]
    n = len(types)

    def unsupported() -> ValueError:
        allowed = '; '.join(
            f'{k} type(s): {v if isinstance(v, str) else list(v)} heads'
            for k, v in _LAYOUTS.items()
        )
        fits = _LAYOUTS.get(n)
        hint = (
            f' (e.g. num_heads={fits[-2] if len(fits) > 1 else fits[0]}; a ViT-T with '
            '3 heads fits no LookHere layout)'
            if isinstance(fits, tuple)
            else ''
        )
        return ValueError(
            f'LookHere head_directions {direction_string!r} ({n} direction '
            f'type(s)) does not fit num_heads={num_heads}{hint}; supported: '
            f'{allowed}'
        )

    if num_heads == 6 and n == 2:
        names = [types[0]] * 4 + [types[1]] * 2
        specs = groups[0] + groups[1][:2]
    elif n == 1 and num_heads % 4 == 0:
        names = [types[0]] * num_heads
        specs = groups[0] * (num_heads // 4)
    elif n == 2 and num_heads in (12, 16):
        rep = 1 if num_heads == 12 else 2
        names = [types[0]] * 8 + [types[1]] * (4 * rep)
        specs = groups[0] * 2 + groups[1] * rep
    elif n == 3 and num_heads in (12, 16):
        rep = 1 if num_heads == 12 else 2
        names = [types[0]] * (4 * rep) + [types[1]] * 4 + [types[2]] * 4
        specs = groups[0] * rep + groups[1] + groups[2]
    elif n == 4 and num_heads == 16:
        names = [t for t in types for _ in range(4)]
        specs = [s for g in groups for s in g]
    else:
        raise unsupported()

    slopes: List[float] = []
    for name, run in itertools.groupby(names):
        count = len(list(run))
        slopes += _none_slopes(count) if name in NONE_LIKE_TYPES else _directed_slopes(count)
    if len(slopes) != num_heads:
        raise ValueError(
            f'LookHere head_directions {direction_string!r} with num_heads='
            f'{num_heads}: the official slope rules give {len(slopes)} head slopes '
            f'for {num_heads} heads (consecutive groups {names}); use a layout '
            'whose groups are multiples of 4 heads (2 for the last group of 6)'
        )
    return list(specs), torch.tensor(slopes, dtype=torch.float64), names


def layer_slopes(config: LookHereConfig, depth: int) -> List[float]:
    """``linspace(first, last, depth)`` computed like ``numpy.linspace`` (bit-exact)."""
    first, last = config.layer_slopes
    if depth == 1:
        return [first]
    step = (last - first) / (depth - 1)
    values = [i * step + first for i in range(depth)]
    values[-1] = last
    return values
