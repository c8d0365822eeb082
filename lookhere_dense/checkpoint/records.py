"""Records: what a module's weights mean beyond their shapes, saved in its ``state_dict``.

A LookHere ViT saves its position encoding, LookHere config, head count, depth and width as
its ``_extra_state`` (PyTorch's ``get_extra_state``): a uint8 tensor holding JSON
(:func:`encode_extra_state`), so that every ``state_dict`` entry is a tensor (mmengine
broadcasts all of them in multi-process runs, and files load with ``weights_only=True``).
Files written before hold a dict there; :func:`decode_extra_state` reads both, and the
record of a ``state_dict`` cast to one dtype (``{k: v.float() ...}``, as timm's
``avg_checkpoints.py`` writes), whose bytes survive the cast. Torch alone.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping

import torch
from torch import Tensor

from ..errors import CheckpointError

__all__ = [
    'EXTRA_STATE_KEY',
    'is_extra_state_key',
    'encode_extra_state',
    'decode_extra_state',
    'read_record',
]

#: the ``state_dict`` key of a module's ``get_extra_state()`` (PyTorch's name for it)
EXTRA_STATE_KEY = '_extra_state'


def is_extra_state_key(key: str) -> bool:
    """Whether a ``state_dict`` key is a module's ``get_extra_state()`` (a record, not
    weights)."""
    return key == EXTRA_STATE_KEY or key.endswith('.' + EXTRA_STATE_KEY)


def encode_extra_state(state: Mapping[str, Any]) -> Tensor:
    """A record (a dict of strings, numbers, lists, None) as a 1-D uint8 tensor of its
    JSON text (keys sorted, so equal records give equal tensors)."""
    text = json.dumps(dict(state), sort_keys=True)
    return torch.frombuffer(bytearray(text.encode('utf-8')), dtype=torch.uint8).clone()


def decode_extra_state(value: Any) -> Dict[str, Any]:
    """The record :func:`encode_extra_state` wrote, or the dict form of older files.

    Raises:
        ValueError: ``value`` is neither (naming its type).
    """
    if isinstance(value, Mapping):
        return dict(value)
    recast = _as_bytes(value)
    if recast is not value:  # a record cast with the weights, if its bytes are one
        try:
            state = json.loads(bytes(recast.tolist()).decode('utf-8'))
        except (UnicodeDecodeError, json.JSONDecodeError):
            state = None
        if isinstance(state, dict):
            return state
    elif isinstance(value, Tensor) and value.dtype == torch.uint8 and value.dim() == 1:
        try:
            state = json.loads(bytes(value.cpu().tolist()).decode('utf-8'))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(
                f'an {EXTRA_STATE_KEY!r} entry that is not a LookHereViT record '
                f'(a uint8 tensor of {value.numel()} bytes that is no JSON: '
                f'{err})'
            ) from None
        if isinstance(state, dict):
            return state
    what = (
        f'a {value.dtype} tensor of shape {tuple(value.shape)}'
        if isinstance(value, Tensor)
        else type(value).__name__
    )
    cast = ''
    if isinstance(value, Tensor) and value.dtype != torch.uint8:
        cast = (
            '; a state_dict cast to one dtype must keep it: cast the weights alone, e.g. '
            "{k: v if k.endswith('_extra_state') else v.float() for k, v in sd.items()}, or "
            "save the model's state_dict again"
        )
    raise ValueError(
        f'an {EXTRA_STATE_KEY!r} entry that is not a LookHereViT record ({what}); '
        'expected the uint8 tensor LookHereViT.get_extra_state() writes (or the '
        f'dict of older files){cast}'
    )


def _as_bytes(value: Any) -> Any:
    """A 1-D tensor of another real dtype whose values are all whole numbers 0-255 (a
    uint8 record cast with the weights: ``v.float()``, ``v.half()``, ``v.bfloat16()``,
    ``v.long()`` keep every byte exactly) as the uint8 tensor it was; anything else as it
    is."""
    if (
        not isinstance(value, Tensor)
        or value.dtype in (torch.uint8, torch.bool)
        or value.dtype.is_complex
        or value.dim() != 1
        or value.numel() == 0
    ):
        return value
    wide = value.detach().cpu().double()
    if not bool(((wide >= 0) & (wide <= 255) & (wide == wide.round())).all()):
        return value
    return wide.to(torch.uint8)  # a new tensor: the caller tells it from ``value``


def read_record(value: Any) -> Dict[str, Any]:
    """:func:`decode_extra_state` raising :class:`~lookhere_dense.errors.CheckpointError`
    (a record found in a checkpoint file)."""
    try:
        return decode_extra_state(value)
    except ValueError as err:
        raise CheckpointError(f'the checkpoint has {err}') from None
