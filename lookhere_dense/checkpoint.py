"""Read official LookHere, timm / DeiT-III and lookhere-dense checkpoints into our keys.

The backbone (:class:`~lookhere_dense.models.backbones.LookHereViT`) uses the official /
timm parameter names (``patch_embed.proj``, ``cls_token``, ``blocks.{i}.attn.qkv``,
``blocks.{i}.ls1.gamma``, ``norm``, ...), so converting is mostly dropping what a dense
backbone has no use for and renaming the original DeiT-III LayerScale keys.

=================  ====================================================  ===============
format             recognised by                                         LookHere config
=================  ====================================================  ===============
``official``       ``{'weights': state_dict, 'config': lh_config}``      from the file
``lookhere-dense`` ``{'state_dict': ..., 'meta': {'lookhere_config'}}``  from the file
                   (written by ``tools/convert_checkpoint.py``)
``mmengine``       ``{'state_dict': ...}`` of a whole segmentor/detector  none
                   (keys ``backbone.*``)
``timm``           a flat state_dict or ``{'model': ...}`` / ``{'state_dict': ...}``  none
                   with ``blocks.*`` / ``patch_embed.*`` keys
=================  ====================================================  ===============
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

__all__ = ['BackboneWeights', 'load_checkpoint_file', 'backbone_weights',
           'match_state_dict', 'save_backbone_checkpoint']

#: Keys a classification checkpoint has that a dense-prediction backbone drops.
_CLASSIFIER = re.compile(r'^(head|fc_norm|head_drop|pre_logits)(\.|$)')
_DEIT3_LAYERSCALE = re.compile(r'^(blocks\.\d+)\.gamma_([12])$')


@dataclass
class BackboneWeights:
    """Backbone parameters read from a checkpoint, in our key names.

    Attributes:
        state_dict: tensors keyed like ``LookHereViT.state_dict()``.
        format: ``'official'``, ``'lookhere-dense'``, ``'mmengine'`` or ``'timm'``.
        lh_config: the LookHere config stored in the file (official / ours, or the
            ``_extra_state`` of a saved ``LookHereViT``), else None.
        dropped: keys of the file that were dropped on purpose (classifier head, ...).
        pos_encoding: the ``pos_encoding`` a saved ``LookHereViT`` was built with (from its
            ``_extra_state``); ``'lookhere'`` for official files; None when unknown.
    """

    state_dict: Dict[str, Tensor]
    format: str
    lh_config: Optional[Dict[str, Any]] = None
    dropped: List[str] = field(default_factory=list)
    pos_encoding: Optional[str] = None


def load_checkpoint_file(path: str) -> Dict[str, Any]:
    """Load a checkpoint file (``.pth``/``.pt``/``.safetensors``) to CPU.

    Raises:
        FileNotFoundError: naming the path, when it does not exist.
    """
    if '://' not in path and not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path!r}')
    if path.endswith('.safetensors'):
        from safetensors.torch import load_file
        return load_file(path, device='cpu')
    from mmengine.runner.checkpoint import CheckpointLoader

    from . import compat
    compat.apply()
    ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    if not isinstance(ckpt, Mapping):
        raise ValueError(f'{path!r} does not hold a dict of weights (got {type(ckpt).__name__})')
    return dict(ckpt)


def _strip_prefix(sd: Mapping[str, Any], prefix: str) -> Dict[str, Any]:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def backbone_weights(ckpt: Mapping[str, Any], keep_pos_embed: bool = False) -> BackboneWeights:
    """Recognise a checkpoint's format and return its backbone weights in our keys.

    Args:
        ckpt: the loaded checkpoint (see :func:`load_checkpoint_file`).
        keep_pos_embed: keep a timm ``pos_embed`` (only a backbone with an absolute
            position embedding uses it). Default: False (dropped and listed).
    """
    lh_config = None
    if 'weights' in ckpt and 'config' in ckpt:
        fmt, sd, lh_config = 'official', dict(ckpt['weights']), dict(ckpt['config'])
    elif 'state_dict' in ckpt:
        sd = dict(ckpt['state_dict'])
        meta = ckpt.get('meta') or {}
        if isinstance(meta, Mapping) and meta.get('lookhere_config') is not None:
            fmt, lh_config = 'lookhere-dense', dict(meta['lookhere_config'])
        elif any(k.startswith('backbone.') for k in sd):
            fmt, sd = 'mmengine', _strip_prefix(sd, 'backbone.')
        else:
            fmt = 'timm'
    elif 'model' in ckpt and isinstance(ckpt['model'], Mapping):
        fmt, sd = 'timm', dict(ckpt['model'])
    else:
        fmt, sd = 'timm', dict(ckpt)

    if any(k.startswith('module.') for k in sd):
        sd = _strip_prefix(sd, 'module.')
    if not any(k.startswith(('blocks.', 'patch_embed.')) for k in sd):
        raise ValueError('checkpoint has no ViT backbone weights (no "blocks.*" or '
                         f'"patch_embed.*" keys); first keys: {sorted(sd)[:8]}')
    pos_encoding = 'lookhere' if fmt == 'official' else None
    extra = sd.pop('_extra_state', None)  # LookHereViT.get_extra_state() of our own saves
    if isinstance(extra, Mapping):
        pos_encoding = extra.get('pos_encoding')
        if lh_config is None and extra.get('lh_config') is not None:
            lh_config = dict(extra['lh_config'])
    out: Dict[str, Tensor] = {}
    dropped: List[str] = []
    for key, value in sd.items():
        m = _DEIT3_LAYERSCALE.match(key)
        if m:  # original DeiT-III repo: blocks.i.gamma_1 -> blocks.i.ls1.gamma
            key = f'{m.group(1)}.ls{m.group(2)}.gamma'
        if _CLASSIFIER.match(key) or (key == 'pos_embed' and not keep_pos_embed):
            dropped.append(key)
            continue
        out[key] = value
    return BackboneWeights(out, fmt, lh_config, sorted(dropped), pos_encoding)


def match_state_dict(model_sd: Mapping[str, Tensor], weights: Mapping[str, Tensor]
                     ) -> Tuple[Dict[str, Tensor], List[str], List[str]]:
    """Compare checkpoint weights with a model's state_dict.

    Returns:
        ``(loadable, missing, unexpected)``.

    Raises:
        ValueError: listing every key whose shape differs (checkpoint vs model).
    """
    mismatched = [f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(model_sd[k].shape)}'
                  for k, v in weights.items() if k in model_sd and v.shape != model_sd[k].shape]
    if mismatched:
        more = f'\n  ... and {len(mismatched) - 10} more' if len(mismatched) > 10 else ''
        raise ValueError(f'checkpoint does not fit the backbone ({len(mismatched)} tensors of '
                         'the wrong shape; check embed_dims, patch_size, mlp_ratio, '
                         'in_channels):\n  ' + '\n  '.join(mismatched[:10]) + more)
    loadable = {k: v for k, v in weights.items() if k in model_sd}
    missing = sorted(k for k in model_sd if k not in weights)
    unexpected = sorted(k for k in weights if k not in model_sd)
    return loadable, missing, unexpected


def save_backbone_checkpoint(path: str, state_dict: Mapping[str, Tensor],
                             lh_config: Optional[Mapping[str, Any]], source: str) -> None:
    """Write backbone weights as ``{'state_dict': ..., 'meta': {...}}``.

    The file works with ``init_cfg=dict(type='Pretrained', checkpoint=path)`` of
    ``LookHereViT`` (which also takes the stored LookHere config from ``meta``). Only
    tensors are written: a module's non-tensor ``_extra_state`` is replaced by
    ``lh_config``.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    meta = {'lookhere_config': None if lh_config is None else dict(lh_config),
            'source': source, 'converted_by': 'lookhere_dense.checkpoint'}
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()
               if isinstance(v, Tensor)}
    torch.save({'state_dict': tensors, 'meta': meta}, path)
