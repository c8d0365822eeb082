"""Frozen settings dataclasses built from config dicts (torch-free).

The generated datasets (:mod:`lookhere_dense.data.relational`,
:mod:`lookhere_dense.data.fov_scenes`) and the attacks
(:mod:`lookhere_dense.evaluation.robustness`) keep their options in dataclasses; configs
give them as plain dicts. :func:`settings_from_dict` is the one conversion, so an unknown key
is refused by name everywhere in the same words.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Type, TypeVar

__all__ = ['settings_from_dict']

T = TypeVar('T')


def settings_from_dict(cls: Type[T], cfg: Optional[Dict[str, Any]], what: str) -> T:
    """``cls(**cfg)`` for a dataclass ``cls``, refusing keys it does not have.

    Args:
        cls: the settings dataclass.
        cfg: its options (``None`` = all defaults).
        what: how the error names the settings, e.g. ``'relational dataset settings'``.

    Raises:
        ValueError: ``unknown {what} [keys]; allowed: [fields]``; and whatever the
            dataclass's own validation raises for a bad value.
    """
    cfg = dict(cfg or {})
    allowed = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(cfg) - allowed)
    if unknown:
        raise ValueError(f'unknown {what} {unknown}; allowed: {sorted(allowed)}')
    return cls(**cfg)
