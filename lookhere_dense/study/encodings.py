"""The position encodings the study compares: ``'rope2d'``, ``'lookhere'``,
``'lookhere:lh45'`` (LookHere with a preset), ... and the backbone config of each."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

__all__ = ['DEFAULT_ENCODINGS', 'parse_encoding', 'backbone_for']

#: the encodings a study compares when none are given
DEFAULT_ENCODINGS = ('lookhere', 'rope2d', 'rope2d_mixed', 'abs', 'alibi2d', 'none')


def parse_encoding(spec: str) -> Tuple[str, Optional[str]]:
    """``'rope2d'`` -> ``('rope2d', None)``; ``'lookhere:lh45'`` -> ``('lookhere', 'lh45')``.

    A study encoding is a ``pos_encoding`` spec string, parsed by the one parser
    (:func:`~lookhere_dense.models.pos_encoding.parse_pos_encoding`); only the message for
    an unknown name speaks of the study's "encodings".

    Raises:
        ValueError: unknown encoding or preset, naming the allowed ones.
    """
    from lookhere_dense.models.pos_encoding import POS_ENCODINGS, parse_pos_encoding

    if spec.partition(':')[0] not in POS_ENCODINGS:
        raise ValueError(f'unknown encoding {spec!r}; allowed: {list(POS_ENCODINGS)} '
                         "(LookHere presets as 'lookhere:PRESET')")
    parsed = parse_pos_encoding(spec)
    return parsed.name, parsed.preset


def backbone_for(backbone: Dict[str, Any], spec: str) -> Dict[str, Any]:
    """The config's backbone dict with encoding ``spec``: LookHere keeps the config's
    ``preset`` / ``lh_config`` unless the spec names a preset; the others drop them.

    Raises:
        ValueError: a bad ``spec`` (:func:`parse_encoding`), or a backbone that is not
            ``LookHereViT``.
    """
    name, preset = parse_encoding(spec)
    if backbone.get('type') != 'LookHereViT':
        raise ValueError(f"the study needs model.backbone.type='LookHereViT', the config has "
                         f'{backbone.get("type")!r}')
    out = dict(backbone)
    if name != 'lookhere' or preset:
        out.pop('preset', None)
        out.pop('lh_config', None)
    if preset:
        out['preset'] = preset
    out['pos_encoding'] = name
    return out
