"""Whole-model checkpoints (a Runner's ``iter_N.pth``, ``{'state_dict': ...}``, a plain
``state_dict``) loaded strictly into a model that holds LookHere ViTs (a segmentor, a
detector, or a trunk alone). Torch alone.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from torch import nn

from ..checkpoint import (
    EXTRA_STATE_KEY,
    listed,
    load_checkpoint_file,
    load_state_dict_strict,
    read_record,
    strip_prefix,
)
from ..errors import CheckpointError
from ..validation import int_or_none
from .vit import LookHereVisionTransformer
from .weights import (
    BackboneWeights,
    check_num_heads,
    file_num_heads,
    vit_key_hints,
    vit_shape_summary,
)

__all__ = ['load_model_weights', 'lookhere_backbones', 'model_state_dict_of']


def lookhere_backbones(model: nn.Module) -> List[Tuple[str, LookHereVisionTransformer]]:
    """Every LookHere ViT in ``model`` with its key prefix (``''`` for the model itself)."""
    return [
        (name + '.' if name else '', m)
        for name, m in model.named_modules()
        if isinstance(m, LookHereVisionTransformer)
    ]


def model_state_dict_of(
    model: nn.Module, ckpt: Mapping[str, Any], path: str = 'the checkpoint'
) -> Dict[str, Any]:
    """The state_dict of a whole-model checkpoint (``state_dict`` of a Runner file, or the
    file itself; a DDP wrapper's ``module.`` prefixes removed), checked to share keys with
    ``model``: a file that shares none would load nothing (mmengine's ``load_from`` only
    warns, listing every key).

    Raises:
        CheckpointError: no ``state_dict`` dict, or no key of ``model``; for backbone-only
            weights (official LookHere, timm / DeiT, a converted file) the message says to
            give them to the backbone's ``init_cfg``.
    """
    sd = ckpt.get('state_dict', ckpt)
    if not isinstance(sd, Mapping):
        raise CheckpointError(
            f'{path!r}: "state_dict" is a {type(sd).__name__}, not a dict of weights'
        )
    sd = dict(sd)
    if sd and all(k.startswith('module.') for k in sd):  # saved from a DDP wrapper
        sd = strip_prefix(sd, 'module.')
    own = model.state_dict()
    if not set(sd) & set(own):
        hint = ''
        if (
            'weights' in ckpt
            and 'config' in ckpt
            or any(k.startswith(('blocks.', 'patch_embed.')) for k in sd)
        ):
            hint = (
                ' It looks like backbone-only weights (pretrained): give them to the '
                "backbone, model.backbone.init_cfg=dict(type='Pretrained', checkpoint=...)."
            )
        raise CheckpointError(
            f"checkpoint {path!r} has none of the model's keys (file: "
            f'{listed(sorted(sd), 6)}, model: '
            f'{listed(sorted(own), 6)}).{hint}'
        )
    return sd


def load_model_weights(
    model: nn.Module,
    checkpoint: Union[str, Mapping[str, Any]],
    strict: bool = True,
    checkpoint_num_heads: Optional[int] = None,
    source: Optional[str] = None,
) -> Dict[str, Any]:
    """Load a whole model's checkpoint (a Runner's ``iter_N.pth`` / ``epoch_N.pth``, or
    ``{'state_dict': ...}`` / a plain state_dict) strictly into ``model``: what
    ``tools/test.py``, ``tools/infer.py`` and ``--resume`` load.

    Every tensor must fit (shape) and, with ``strict``, every key must match (the
    ``LookHereViT`` records included); the ``LookHereViT`` backbones must have the head
    count, position encoding and LookHere config the file records (files of lookhere-dense
    that predate recorded head counts count as 12 heads, see :func:`file_num_heads`).
    ``module.`` prefixes (a DDP wrapper's) are removed first.

    Args:
        model: the built model (e.g. a segmentor), on any device.
        checkpoint: the checkpoint file, or a checkpoint already loaded (a Runner hook's).
        strict: refuse missing / unexpected keys. Default: True.
        checkpoint_num_heads: the head count of the file's LookHere backbone, for files
            that do not record it. Default: None.
        source: the file, for messages, when ``checkpoint`` is already loaded.
            Default: None (``'the checkpoint'``).

    Returns:
        The loaded checkpoint dict (``meta``, ``message_hub``, ... of a Runner file).

    Raises:
        FileNotFoundError, CheckpointError: naming the file and what does not fit.
    """
    if isinstance(checkpoint, str):
        path = checkpoint
        ckpt: Mapping[str, Any] = load_checkpoint_file(path)
    else:
        path, ckpt = source or 'the checkpoint', checkpoint
    sd = model_state_dict_of(model, ckpt, path)

    def verify_heads() -> None:
        for prefix, backbone in lookhere_backbones(model):
            state = sd.get(prefix + EXTRA_STATE_KEY)
            part = BackboneWeights(strip_prefix(sd, prefix), 'mmengine')
            if state is not None:
                state = read_record(state)
                part.pos_encoding = state.get('pos_encoding')
                part.num_heads = int_or_none(state.get('num_heads'))
            heads, how = file_num_heads(part)
            check_num_heads(backbone.num_heads, heads, how, path, checkpoint_num_heads)

    load_state_dict_strict(
        model,
        sd,
        path,
        strict=strict,
        verify=verify_heads,
        require_extra_state=strict,
        hints=vit_key_hints,
        summary=vit_shape_summary,
    )
    return dict(ckpt)
