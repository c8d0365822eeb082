"""Global prefix tokens: CLS, or ``J`` Jumbo tokens, at the front of the sequence.

Every attention backend and position encoding takes ``cls_token``: the number of global
prefix tokens in ``[p_0, ..., p_{J-1}, patch_0, ..., patch_{N-1}]`` (``True`` = 1,
``False`` = 0). They carry no position information (no LookHere bias or mask to and from
them, not rotated): :func:`num_prefix_tokens` reads the argument, :func:`prefix_phrase`
words it for error messages, :func:`check_tokens` refuses a sequence of the wrong length.
The first two are also importable from :mod:`.bias`. Torch-free.
"""

from __future__ import annotations

import operator
from typing import Sequence, Union

__all__ = ['num_prefix_tokens', 'prefix_phrase', 'check_tokens']


def num_prefix_tokens(cls_token: Union[bool, int]) -> int:
    """The number ``J`` of global prefix tokens a ``cls_token`` argument stands for.

    Every backend takes ``cls_token``: the number of global prefix tokens at the front of
    the sequence ``[p_0, ..., p_{J-1}, patch_0, ..., patch_{N-1}]`` (CLS, or Jumbo tokens);
    ``True`` = 1, ``False`` = 0. Prefix tokens carry no LookHere bias (0 to and from them,
    no mask), every patch query sees all of them and their queries attend to every token.

    Raises:
        TypeError: not an int (or bool).
        ValueError: negative.
    """
    try:
        count = operator.index(cls_token)
    except TypeError:
        raise TypeError(
            'cls_token must be a bool or an int >= 0 (the number of global prefix '
            f'tokens: CLS or Jumbo tokens), got {cls_token!r}'
        ) from None
    if count < 0:
        raise ValueError(
            f'cls_token (the number of global prefix tokens) must be >= 0, got {count}'
        )
    return count


def prefix_phrase(count: int) -> str:
    """``'with 2 prefix tokens'`` / ``'with 1 prefix token'`` / ``'without prefix tokens'``
    (for error messages)."""
    if not count:
        return 'without prefix tokens'
    return f'with {count} prefix token' + ('s' if count > 1 else '')


def check_tokens(
    what: str, tokens: int, grid_size: Sequence[int], prefix: int, *others: int
) -> int:
    """Refuse a sequence of ``tokens`` (and ``others``: e.g. the keys' length) that is not
    ``prefix + H*W`` for ``grid_size = (H, W)``; the error names ``what``, the count, the
    grid and the prefix tokens (the first wrong length). Returns ``prefix + H*W``.

    Raises:
        ValueError: a length other than ``prefix + H*W``.
    """
    n = grid_size[0] * grid_size[1] + prefix
    wrong = [count for count in (tokens, *others) if count != n]
    if wrong:
        raise ValueError(
            f'{what} got {wrong[0]} tokens but grid {tuple(grid_size)} '
            f'{prefix_phrase(prefix)} needs {n}'
        )
    return n
