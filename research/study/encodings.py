"""The position encodings the study compares: ``'rope2d'``, ``'lookhere'``,
``'lookhere:lh45'`` (LookHere with a preset), ... and the backbone config of each.

A study encoding is a spec *string* (it names the run in every report). An encoding's own
options (:data:`~lookhere_dense.lookhere.pos_encoding.POS_ENCODING_OPTIONS`, e.g. PaPE's
``parabolas``) come from the config's ``extrapolation.encoding_options``, ``{name:
{option: value}}``, and apply to every run of that encoding (:func:`backbone_for`); the
report stores them in its settings, so reports with other options do not merge.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from lookhere_dense.errors import ConfigError

__all__ = ['DEFAULT_ENCODINGS', 'parse_encoding', 'check_encoding_options', 'backbone_for']

#: the encodings a study compares when none are given
DEFAULT_ENCODINGS = (
    'lookhere',
    'rope2d',
    'rope2d_mixed',
    'rope_dinov3',
    'pape',
    'abs',
    'alibi2d',
    'none',
)


def parse_encoding(spec: str) -> Tuple[str, Optional[str]]:
    """``'rope2d'`` -> ``('rope2d', None)``; ``'lookhere:lh45'`` -> ``('lookhere', 'lh45')``.

    A study encoding is a ``pos_encoding`` spec string, parsed by the one parser
    (:func:`~lookhere_dense.lookhere.pos_encoding.parse_pos_encoding`); only the message for
    an unknown name speaks of the study's "encodings".

    Raises:
        ValueError: unknown encoding or preset, naming the allowed ones.
    """
    from lookhere_dense.lookhere.pos_encoding import POS_ENCODINGS, parse_pos_encoding

    if spec.partition(':')[0] not in POS_ENCODINGS:
        raise ConfigError(
            f'unknown encoding {spec!r}; allowed: {list(POS_ENCODINGS)} '
            "(LookHere presets as 'lookhere:PRESET')"
        )
    parsed = parse_pos_encoding(spec)
    return parsed.name, parsed.preset


def check_encoding_options(options: Optional[Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """``extrapolation.encoding_options`` checked: ``{name: {option: value}}`` with names of
    :data:`~lookhere_dense.lookhere.pos_encoding.POS_ENCODINGS` and their options (values
    are checked when the encoding is built).

    Raises:
        ValueError: not a dict of dicts, an unknown encoding or option (naming the
            allowed ones).
    """
    from lookhere_dense.lookhere.pos_encoding import POS_ENCODING_OPTIONS

    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(
            f'extrapolation.encoding_options must be a dict {{encoding: '
            f'{{option: value}}}}, got {options!r}'
        )
    out = {}
    for name, opts in options.items():
        if name not in POS_ENCODING_OPTIONS:
            raise ConfigError(
                f'extrapolation.encoding_options: unknown encoding {name!r}; '
                f'allowed: {list(POS_ENCODING_OPTIONS)}'
            )
        if not isinstance(opts, Mapping):
            raise ConfigError(
                f'extrapolation.encoding_options.{name} must be a dict of options, got {opts!r}'
            )
        unknown = sorted(set(opts) - set(POS_ENCODING_OPTIONS[name]))
        if unknown:
            raise ConfigError(
                f'extrapolation.encoding_options.{name}: unknown options '
                f'{unknown}; allowed: {list(POS_ENCODING_OPTIONS[name])}'
            )
        out[name] = dict(opts)
    return out


def backbone_for(
    backbone: Dict[str, Any], spec: str, options: Optional[Mapping[str, Any]] = None
) -> Dict[str, Any]:
    """The config's backbone dict with encoding ``spec``: LookHere keeps the config's
    ``preset`` / ``lh_config`` unless the spec names a preset; the others drop them.
    ``options`` (:func:`check_encoding_options`) with an entry for the spec's encoding make
    ``pos_encoding`` the dict form ``dict(type=NAME, **options)``.

    Raises:
        ValueError: a bad ``spec`` (:func:`parse_encoding`) or ``options``, or a backbone
            that is not ``LookHereViT``.
    """
    name, preset = parse_encoding(spec)
    own = check_encoding_options(options).get(name)
    if backbone.get('type') != 'LookHereViT':
        raise ConfigError(
            f"the study needs model.backbone.type='LookHereViT', the config has "
            f'{backbone.get("type")!r}'
        )
    out = dict(backbone)
    if name != 'lookhere' or preset:
        out.pop('preset', None)
        out.pop('lh_config', None)
    if preset:
        out['preset'] = preset
    out['pos_encoding'] = dict(type=name, **own) if own else name
    return out
