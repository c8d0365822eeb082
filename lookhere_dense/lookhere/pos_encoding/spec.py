"""THE parser of a ``pos_encoding`` spec, and the catalogue of encodings it knows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Type, Union

from lookhere_dense.errors import PosEncodingError

from ..config import OFFICIAL_KEYS, PRESETS, LookHereConfig, resolve_lh_config
from .absolute import AbsolutePositionEncoding
from .base import NoPositionEncoding, PositionEncoding
from .dinov3 import DinoV3RoPE2d
from .ledit import LEDiTPositionEncoding
from .lookhere import LOOKHERE_BIAS_ENCODINGS, LookHerePositionEncoding, alibi2d_config
from .pape import ParabolicPositionEncoding
from .rope import AxialRoPE2d, MixedRoPE2d

__all__ = [
    'ENCODINGS',
    'POS_ENCODINGS',
    'POS_ENCODING_OPTIONS',
    'PosEncodingSpec',
    'parse_pos_encoding',
    'bias_config',
]

#: Every ``pos_encoding`` name and the class that implements it (``lookhere`` and
#: ``alibi2d`` share one: the LookHere engine computes both biases).
ENCODINGS: Dict[str, Type[PositionEncoding]] = {
    'lookhere': LookHerePositionEncoding,
    'abs': AbsolutePositionEncoding,
    'rope2d': AxialRoPE2d,
    'rope2d_mixed': MixedRoPE2d,
    'rope_dinov3': DinoV3RoPE2d,
    'pape': ParabolicPositionEncoding,
    'alibi2d': LookHerePositionEncoding,
    'ledit': LEDiTPositionEncoding,
    'none': NoPositionEncoding,
}
#: Every value ``pos_encoding`` accepts.
POS_ENCODINGS: Tuple[str, ...] = tuple(ENCODINGS)
#: The options each encoding takes in the dict form ``dict(type=NAME, **options)``, as its
#: class declares them (:attr:`PositionEncoding.options`).
POS_ENCODING_OPTIONS: Dict[str, Tuple[str, ...]] = {
    name: cls.options for name, cls in ENCODINGS.items()
}


def bias_config(
    encoding: str,
    lh_config: Union[None, str, Mapping[str, Any], LookHereConfig] = None,
    preset: Optional[str] = None,
) -> Optional[LookHereConfig]:
    """The LookHere config the bias of ``encoding`` is computed from: ``lh_config`` /
    ``preset`` for ``'lookhere'``, :func:`alibi2d_config` for ``'alibi2d'``, None for the
    encodings without a LookHere bias. Part of :func:`parse_pos_encoding` (call that).

    Raises:
        PosEncodingError: an unknown preset or option, a preset for ``'alibi2d'``, or
            ``lh_config`` / ``preset`` for an encoding that has no LookHere bias; ``key``
            names the argument at fault.
    """
    if encoding == 'lookhere':
        try:
            return resolve_lh_config(lh_config, preset)
        except ValueError as err:
            bad_preset = preset is not None and preset not in PRESETS
            raise PosEncodingError(str(err), 'preset' if bad_preset else 'lh_config') from None
    if encoding == 'alibi2d':
        if preset is not None:
            raise PosEncodingError(
                "pos_encoding='alibi2d' takes no LookHere preset (it has "
                'no direction masks); give slopes with lh_config=dict(...)',
                'preset',
            )
        try:
            return alibi2d_config(lh_config)
        except ValueError as err:
            raise PosEncodingError(str(err), 'lh_config') from None
    if lh_config is not None or preset is not None:
        raise PosEncodingError(
            f'preset / lh_config configure LookHere; they do not apply to '
            f'pos_encoding={encoding!r} (allowed with '
            f'{list(LOOKHERE_BIAS_ENCODINGS)})',
            'preset' if preset is not None else 'lh_config',
        )
    return None


@dataclass(frozen=True)
class PosEncodingSpec:
    """A parsed ``pos_encoding``: what :func:`parse_pos_encoding` returns.

    Attributes:
        name: one of :data:`POS_ENCODINGS`.
        options: the encoding's own options (checked against
            :data:`POS_ENCODING_OPTIONS`), e.g. ``{'theta': 10.0}``. Default: none.
        preset: the LookHere preset, from the spec (``'lookhere:lh45'``) or from
            ``preset=``; None when none was named. Default: None.
        lh_config: the :class:`LookHereConfig` of the bias of ``'lookhere'`` /
            ``'alibi2d'`` (the default one when neither preset nor lh_config was given);
            None for the encodings without a LookHere bias. Default: None.
        explicit: a preset, or an lh_config with one of the official keys
            (:data:`~lookhere_dense.lookhere.config.OFFICIAL_KEYS`), was given. Only a
            default (not explicit) config gives way to the one stored in a checkpoint, so
            ``lh_config=dict(learnable_slopes=True)`` (or ``bias_rounding`` alone) still
            takes a checkpoint's head directions and slopes. Default: False.
    """

    name: str
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    preset: Optional[str] = None
    lh_config: Optional[LookHereConfig] = None
    explicit: bool = False


def parse_pos_encoding(
    spec: Union[str, Mapping[str, Any], PosEncodingSpec] = 'lookhere',
    lh_config: Union[None, str, Mapping[str, Any], LookHereConfig] = None,
    preset: Optional[str] = None,
) -> PosEncodingSpec:
    """THE parser of a ``pos_encoding`` spec (with the backbone's ``preset`` /
    ``lh_config``), used by the backbone, the config checks, the benchmark and the study.

    Spec forms:

    * a name of :data:`POS_ENCODINGS`: ``'rope2d'``;
    * ``'lookhere:PRESET'``: LookHere with a preset, e.g. ``'lookhere:lh45'`` (the study's
      short form; the same as ``'lookhere'`` with ``preset='lh45'``);
    * ``dict(type=NAME, **options)`` with the options of :data:`POS_ENCODING_OPTIONS`, e.g.
      ``dict(type='rope2d', theta=10.0)``;
    * a :class:`PosEncodingSpec` (returned as it is; then no ``lh_config`` / ``preset``).

    Args:
        spec: the encoding. Default: ``'lookhere'``.
        lh_config: LookHere config (official keys, a :class:`LookHereConfig` or a preset
            name) for ``'lookhere'``, or slopes for ``'alibi2d'``; overrides the preset's
            entries. Default: None.
        preset: LookHere preset (``'lh180'``, ``'lh90'``, ``'lh45'``). Default: None.

    Returns:
        The :class:`PosEncodingSpec`, with the resolved LookHere config.

    Raises:
        PosEncodingError: an unknown name, option or preset, a preset for an encoding
            other than ``'lookhere'``, two different presets, lh_config for an encoding
            without a LookHere bias, an lh_config ``'alibi2d'`` cannot have; the message
            names the allowed values and ``key`` the argument at fault.
        TypeError: a spec that is neither a string, a dict nor a :class:`PosEncodingSpec`.
    """
    if isinstance(spec, PosEncodingSpec):
        if lh_config is not None or preset is not None:
            raise TypeError(
                'parse_pos_encoding: a PosEncodingSpec is already parsed; it '
                'takes no further lh_config / preset'
            )
        return spec
    spec_preset = None
    if isinstance(spec, str):
        name, colon, spec_preset = spec.partition(':')
        options: dict = {}
        shown = spec
    elif isinstance(spec, Mapping):
        options = dict(spec)
        name, colon = options.pop('type', None), ''
        shown = name
    else:
        raise TypeError(f'pos_encoding must be a name or a dict with "type", got {spec!r}')
    if name not in POS_ENCODINGS:
        raise PosEncodingError(
            f'unknown pos_encoding {shown!r}; allowed: '
            f'{list(POS_ENCODINGS)} (a LookHere preset as '
            "'lookhere:PRESET', e.g. 'lookhere:lh45')"
        )
    if colon:
        if name != 'lookhere':
            raise PosEncodingError(
                f'pos_encoding {spec!r}: only lookhere takes a preset '
                f"('lookhere:PRESET'); use {name!r}"
            )
        if not spec_preset:
            raise PosEncodingError(
                f'pos_encoding {spec!r} names no preset; allowed: {sorted(PRESETS)}'
            )
        if preset is not None and preset != spec_preset:
            raise PosEncodingError(
                f'pos_encoding {spec!r} and preset={preset!r} name two '
                'different presets; give the preset once',
                'preset',
            )
        preset = spec_preset
    unknown = sorted(set(options) - set(POS_ENCODING_OPTIONS[name]))
    if unknown:
        raise PosEncodingError(
            f'pos_encoding {name!r} has no options {unknown}; allowed: '
            f'{list(POS_ENCODING_OPTIONS[name])}'
        )
    try:
        config = bias_config(name, lh_config, preset)
    except PosEncodingError as err:
        if spec_preset and err.key == 'preset':  # the preset came with the spec
            err.key = 'pos_encoding'
        raise
    explicit = preset is not None or (
        lh_config is not None
        and (not isinstance(lh_config, Mapping) or bool(set(lh_config) & set(OFFICIAL_KEYS)))
    )
    return PosEncodingSpec(name, options, preset, config, explicit=explicit)
