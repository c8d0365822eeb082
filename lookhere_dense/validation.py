"""The shared validators: every "a number but not a bool" check of the package (no imports
beyond the standard library).

Each ``check_*`` returns the value (converted where it says so) or raises an error whose
message names the argument and the value: ``NAME must be DESCRIPTION, got VALUE``. ``NAME``
is what the user wrote, with its owner when that helps (``'LookHereViT: patch_size'``,
``"pos_encoding='pape': parabolas"``). ``error`` chooses the class (default ``ValueError``;
e.g. :class:`~lookhere_dense.errors.ConfigError` in the tools, whose errors print as one
line).

``bool`` is an ``int`` in Python, so ``True`` would pass a plain ``isinstance(x, int)``
check as 1; :func:`is_int` and :func:`is_number` refuse it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import os.path as osp
from typing import Any, Dict, Iterable, List, Optional, Tuple, Type, TypeVar

__all__ = [
    'path_inside',
    'is_int',
    'is_number',
    'int_or_none',
    'check_int',
    'check_number',
    'check_rate',
    'check_bool',
    'settings_from_dict',
    'close_names',
    'keyword_arguments',
    'CLOSE_NAME_CUTOFF',
    'positive_pair',
    'env_choice',
    'env_switch',
    'ENV_ON',
    'ENV_OFF',
]

#: the spellings of an on / off environment switch (:func:`env_switch`), lower case
ENV_ON = ('1', 'true', 'yes', 'on')
ENV_OFF = ('0', 'false', 'no', 'off')

#: how alike a misspelt key and a real one must be to be suggested ("did you mean ...?")
CLOSE_NAME_CUTOFF = 0.75


def close_names(word: str, names: Iterable[str], n: int = 3) -> List[str]:
    """The at most ``n`` names of ``names`` closest to ``word`` (:mod:`difflib`, ratio
    >= :data:`CLOSE_NAME_CUTOFF`), best first: the "did you mean" of every misspelt key
    (``--cfg-options``, backbone arguments)."""
    return difflib.get_close_matches(word, list(names), n=n, cutoff=CLOSE_NAME_CUTOFF)


T = TypeVar('T')


def is_int(value: Any) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is an ``int`` or ``float`` (not a ``bool``; NaN and inf are
    numbers here, see :func:`check_number` for finiteness)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def int_or_none(value: Any) -> Optional[int]:
    """``value`` when it is an int (:func:`is_int`), else None (for optional records)."""
    return value if is_int(value) else None


def _int_description(minimum: int) -> str:
    if minimum == 1:
        return 'a positive int'
    return f'an int >= {minimum}'


def check_int(
    name: str,
    value: Any,
    minimum: Optional[int] = 1,
    error: Type[Exception] = ValueError,
    description: Optional[str] = None,
) -> int:
    """``value`` when it is an int ``>= minimum`` (None: any int).

    Args:
        name: the argument, as the message names it.
        value: what was given.
        minimum: the smallest allowed value. Default: 1.
        error: the exception class. Default: ``ValueError``.
        description: what the message says ``value`` must be. Default: ``'a positive
            int'`` for ``minimum=1``, else ``'an int >= MIN'``.

    Raises:
        error: ``NAME must be DESCRIPTION, got VALUE``.
    """
    if not is_int(value) or (minimum is not None and value < minimum):
        what = description or ('an int' if minimum is None else _int_description(minimum))
        raise error(f'{name} must be {what}, got {value!r}')
    return value


def check_number(
    name: str,
    value: Any,
    minimum: Optional[float] = None,
    strict: bool = False,
    maximum: Optional[float] = None,
    error: Type[Exception] = ValueError,
    description: Optional[str] = None,
) -> float:
    """``value`` as a float, when it is a finite number in range.

    Args:
        name: the argument, as the message names it.
        value: what was given.
        minimum: lower bound (inclusive, exclusive with ``strict``); None: none.
            Default: None.
        strict: the lower bound is exclusive. Default: False.
        maximum: inclusive upper bound; None: none. Default: None.
        error: the exception class. Default: ``ValueError``.
        description: what the message says ``value`` must be. Default: ``'a finite
            number'`` with the bounds (``'a finite number > 0'``, ``'... in (0, 255]'``).

    Raises:
        error: ``NAME must be DESCRIPTION, got VALUE``.
    """
    ok = is_number(value) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if strict else value >= minimum
    if ok and maximum is not None:
        ok = value <= maximum
    if not ok:
        if description is None:
            description = 'a finite number'
            if minimum is not None and maximum is not None:
                description += f' in {"(" if strict else "["}{minimum:g}, {maximum:g}]'
            elif minimum is not None:
                description += f' {">" if strict else ">="} {minimum:g}'
            elif maximum is not None:
                description += f' <= {maximum:g}'
        raise error(f'{name} must be {description}, got {value!r}')
    return float(value)


def check_rate(name: str, value: Any, error: Type[Exception] = ValueError) -> float:
    """``value`` as a float, when it is a probability in ``[0, 1)`` (a dropout rate).

    Raises:
        error: ``NAME must be a probability in [0, 1), got VALUE``.
    """
    if not is_number(value) or not 0 <= value < 1:
        raise error(f'{name} must be a probability in [0, 1), got {value!r}')
    return float(value)


def check_bool(name: str, value: Any, error: Type[Exception] = ValueError) -> bool:
    """``value`` when it is ``True`` or ``False`` (not 0 / 1, not a string).

    Raises:
        error: ``NAME must be True or False, got VALUE``.
    """
    if not isinstance(value, bool):
        raise error(f'{name} must be True or False, got {value!r}')
    return value


def settings_from_dict(cls: Type[T], cfg: Optional[Dict[str, Any]], what: str) -> T:
    """``cls(**cfg)`` for a dataclass ``cls``, refusing keys it does not have: the one
    conversion of settings given as config dicts (generated datasets, attacks), so an
    unknown key is refused by name everywhere in the same words.

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


def path_inside(path: str, folders: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``folders`` or lies below one (symbolic links resolved;
    remote paths, ``'://'``, by prefix)."""
    for folder in folders:
        if '://' in path or '://' in folder:
            if path.startswith(folder.rstrip('/') + '/'):
                return True
            continue
        real, top = osp.realpath(path), osp.realpath(folder)
        if osp.commonpath([real, top]) == top:
            return True
    return False


def keyword_arguments(cls: type) -> Tuple[str, ...]:
    """The names a config may give ``cls``'s constructor, in order, ``self`` left out: its
    ``__init__``'s arguments, and its bases' where it passes ``**kwargs`` on (a hook's
    ``save_best``, a scheduler's ``eta_min`` / ``power``). Empty where no signature can be
    read."""
    import inspect

    names: List[str] = []
    for klass in cls.__mro__:
        init = vars(klass).get('__init__')
        if init is None:
            continue
        try:
            params = list(inspect.signature(init).parameters.values())
        except (TypeError, ValueError):
            break
        names += [
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name != 'self'
            and p.name not in names
        ]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return tuple(names)


def positive_pair(value: Any, single: bool = False) -> Optional[Tuple[int, int]]:
    """``(H, W)`` of a size given as two positive ints (a list or tuple; with ``single``
    also one positive int for both sides), else None (bools are no ints)."""
    if single and is_int(value) and value > 0:
        return (value, value)
    if isinstance(value, (list, tuple)) and len(value) == 2:
        if all(is_int(v) and v > 0 for v in value):
            return (int(value[0]), int(value[1]))
    return None


def env_choice(
    name: str, choices: Iterable[str], default: str, error: Type[Exception] = ValueError
) -> str:
    """The value of the environment variable ``name``, one of ``choices`` (or an on / off
    spelling of :data:`ENV_ON` / :data:`ENV_OFF`, given as ``'1'`` / ``'0'`` where those
    are choices); ``default`` where it is unset or empty (``NAME=`` unsets it in a shell
    line).

    Raises:
        error: another value, naming the variable, the value and the choices.
    """
    choices = tuple(choices)
    value = os.environ.get(name, '').strip()
    if not value:
        return default
    if value in choices:
        return value
    low = value.lower()
    for spellings, word in ((ENV_ON, '1'), (ENV_OFF, '0')):
        if low in spellings and word in choices:
            return word
    words = ' / '.join(
        f'{w}: {", ".join(sp[1:])}' for w, sp in (('1', ENV_ON), ('0', ENV_OFF)) if w in choices
    )
    raise error(
        f'{name}={value!r}: expected one of {", ".join(choices)} (or unset)'
        + (f'; also spelt {words}' if words else '')
    )


def env_switch(name: str, default: bool = True, error: Type[Exception] = ValueError) -> bool:
    """An on / off environment variable (``1`` / ``0``, ``true`` / ``false``, ``yes`` /
    ``no``, ``on`` / ``off``); ``default`` where it is unset or empty.

    Raises:
        error: another value (``LOOKHERE_FUSED_MLP=maybe``), naming the variable.
    """
    return env_choice(name, ('1', '0'), '1' if default else '0', error) == '1'
