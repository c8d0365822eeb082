"""What a LookHere ViT's weights mean: checkpoint formats, head counts and LookHere configs.

The trunk (:class:`~lookhere_dense.lookhere.vit.LookHereVisionTransformer`) uses the
official / timm parameter names (``patch_embed.proj``, ``cls_token``,
``blocks.{i}.attn.qkv``, ``blocks.{i}.ls1.gamma``, ``norm``, ...), so converting a file is
mostly dropping what a dense backbone has no use for and renaming the original DeiT-III
LayerScale keys.

=================  ====================================================  ===============
format             recognised by                                         LookHere config
=================  ====================================================  ===============
``official``       ``{'weights': state_dict, 'config': lh_config}``      from the file
``lookhere-dense`` ``{'state_dict': ..., 'meta': {'lookhere_config'}}``  from the file
                   (written by :func:`save_backbone_checkpoint`)
``mmengine``       ``{'state_dict': ...}`` or the flat state_dict of a   none
                   whole segmentor/detector (keys ``backbone.*``; the
                   others dropped)
``timm``           a flat state_dict or ``{'model': ...}`` / ``{'state_dict': ...}``  none
                   with ``blocks.*`` / ``patch_embed.*`` keys
``mmseg``          the same containers with mmseg ``VisionTransformer``'s   none
                   names (``layers.{i}.attn.attn.in_proj_weight``, ...:
                   what mmseg's ``vit2mmseg.py`` writes); renamed back
                   (:func:`mmseg_vit_to_timm`)
=================  ====================================================  ===============

Files are read by :func:`lookhere_dense.checkpoint.load_checkpoint_file` and loaded by
:func:`lookhere_dense.checkpoint.load_state_dict_strict` with :func:`vit_key_hints` (the
usual reasons why a ViT's keys differ: depth, LayerScale, final norm, ...). This module
adds what is LookHere-specific: :func:`backbone_weights` (format -> our keys),
:func:`file_num_heads` / :func:`check_num_heads` (the head-count rules) and
:func:`load_backbone_weights`, :func:`check_backbone_record` (adopting a file's LookHere
config into a trunk, the checks of its record); whole models: :mod:`.loading`.

Learnable slopes. A model built with ``lh_config=dict(..., learnable_slopes=True)`` has
the parameters ``pos_enc.slopes.*`` (:class:`~lookhere_dense.lookhere.slopes.LookHereSlopes`).
A file without them (official, timm, fixed-slope lookhere-dense) still loads strictly: these
keys, and only these, may be missing all together; the slopes then start from the LookHere
config the file records (else the model's) and the report lists them under
``'from_config'``. A file with learned slopes loads only into a learnable model; into a
fixed one it is refused with a message naming ``lh_config.learnable_slopes=True``.

Attention geometry. The qkv weights have the same shapes for any head count, so loading a
12-head file into a 6-head model "works" and gives wrong features. The head count of a
file is taken from (in this order) ``checkpoint_num_heads`` given by the user, the file
itself (lookhere-dense writes it), or a documented convention
(:func:`file_num_heads`); a file whose head count cannot be known is refused with a
message naming the key to set. Torch alone.
"""

from __future__ import annotations

import io
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from ..checkpoint import (
    EXTRA_STATE_KEY,
    decode_extra_state,
    is_extra_state_key,
    listed,
    load_checkpoint_file,
    load_state_dict_strict,
    read_record,
    strip_prefix,
)
from ..checkpoint.atomic import atomic_write_bytes
from ..errors import CheckpointError
from ..validation import int_or_none, is_int
from .config import OFFICIAL_KEYS, resolve_lh_config
from .pos_encoding import AbsolutePositionEncoding

__all__ = [
    'BackboneWeights',
    'backbone_weights',
    'ema_preferred',
    'file_num_heads',
    'heads_assumed',
    'file_embed_dims',
    'check_num_heads',
    'vit_key_hints',
    'vit_shape_summary',
    'vit_loose_advice',
    'has_layerscale',
    'file_depth',
    'missing_blocks',
    'is_mmseg_vit',
    'mmseg_vit_to_timm',
    'load_backbone_weights',
    'check_weights_argument',
    'check_backbone_record',
    'adopt_lh_config',
    'save_backbone_checkpoint',
    'file_pos_encoding',
    'HEADS_KEY',
    'OFFICIAL_NUM_HEADS',
    'TIMM_HEAD_DIM',
    'TIMM_LAYERNORM_EPS',
    'layernorm_eps_note',
]

#: the ``init_cfg`` key (and keyword argument) that states a file's head count
HEADS_KEY = 'checkpoint_num_heads'
#: Keys a classification checkpoint has that a dense-prediction backbone drops.
_CLASSIFIER = re.compile(r'^(head|fc_norm|head_drop|pre_logits)(\.|$)')
_DEIT3_LAYERSCALE = re.compile(r'^(blocks\.\d+)\.gamma_([12])$')
#: mmseg ``VisionTransformer``'s names -> timm's (the inverse of mmseg's
#: ``tools/model_converters/vit2mmseg.py``); block parts first, then the whole key
_MMSEG_BLOCK_PARTS = (
    ('ln1.', 'norm1.'),
    ('ln2.', 'norm2.'),
    ('attn.attn.in_proj_weight', 'attn.qkv.weight'),
    ('attn.attn.in_proj_bias', 'attn.qkv.bias'),
    ('attn.attn.out_proj.', 'attn.proj.'),
    ('ffn.layers.0.0.', 'mlp.fc1.'),
    ('ffn.layers.1.', 'mlp.fc2.'),
)
_MMSEG_TOP = (
    ('patch_embed.projection.', 'patch_embed.proj.'),
    ('ln_pre.', 'pre_ln.'),
    ('ln1.', 'norm.'),
)
_MMSEG_BLOCK = re.compile(r'^layers\.(\d+)\.(.*)$')
#: keys only mmseg VisionTransformer's layout has (BEiT / MAE share its FFN names, not its
#: attention's)
_MMSEG_LAYOUT = re.compile(r'^layers\.\d+\.attn\.attn\.in_proj_weight$')
#: the head count of the official ``LookHere`` class and of every released checkpoint
#: (LH_180 / LH_90 / LH_45, ViT-B/16), and the default of ``LookHereViT``
OFFICIAL_NUM_HEADS = 12
#: the head width of timm / DeiT-III ViT-Ti/S/B/L (192/3, 384/6, 768/12, 1024/16)
TIMM_HEAD_DIM = 64


@dataclass
class BackboneWeights:
    """Backbone parameters read from a checkpoint, in our key names.

    Attributes:
        state_dict: tensors keyed like ``LookHereViT.state_dict()``.
        format: ``'official'``, ``'lookhere-dense'``, ``'mmengine'``, ``'timm'`` or
            ``'mmseg'`` (mmseg ``VisionTransformer``'s names, renamed).
        lh_config: the LookHere config stored in the file (official / ours, or the
            ``_extra_state`` of a saved ``LookHereViT``), else None.
        dropped: keys of the file that were dropped on purpose (classifier head, ...).
        pos_encoding: the ``pos_encoding`` a saved ``LookHereViT`` was built with (from its
            ``_extra_state``); ``'lookhere'`` for official files; None when unknown.
        num_heads: the head count recorded in the file (``_extra_state`` of a saved
            ``LookHereViT`` or ``meta['num_heads']`` of a converted file); None when the
            file does not record it.
    """

    state_dict: Dict[str, Tensor]
    format: str
    lh_config: Optional[Dict[str, Any]] = None
    dropped: List[str] = field(default_factory=list)
    pos_encoding: Optional[str] = None
    num_heads: Optional[int] = None


def is_mmseg_vit(sd: Mapping[str, Any]) -> bool:
    """Whether a state_dict has mmseg ``VisionTransformer``'s names
    (``layers.{i}.attn.attn.in_proj_weight``) and no timm ones (``blocks.*``)."""
    return any(_MMSEG_LAYOUT.match(k) for k in sd) and not any(k.startswith('blocks.') for k in sd)


def mmseg_vit_to_timm(sd: Mapping[str, Any]) -> Dict[str, Any]:
    """An mmseg ``VisionTransformer`` state_dict in timm's names, which the LookHere trunk
    uses: ``layers.{i}.ln1`` -> ``blocks.{i}.norm1``, ``attn.attn.in_proj_weight`` ->
    ``attn.qkv.weight`` (the same q, k, v rows), ``ffn.layers.0.0`` -> ``mlp.fc1``,
    ``patch_embed.projection`` -> ``patch_embed.proj``, ``ln_pre`` -> ``pre_ln``, the final
    ``ln1`` -> ``norm``; ``cls_token`` / ``pos_embed`` as they are. A key of no such name
    is kept, so that loading names it."""
    out: Dict[str, Any] = {}
    for key, value in sd.items():
        m = _MMSEG_BLOCK.match(key)
        if m:
            rest = m.group(2)
            for old, new in _MMSEG_BLOCK_PARTS:
                if rest.startswith(old):
                    rest = new + rest[len(old) :]
                    break
            key = f'blocks.{m.group(1)}.{rest}'
        else:
            for old, new in _MMSEG_TOP:
                if key.startswith(old):
                    key = new + key[len(old) :]
                    break
        out[key] = value
    return out


def _has_vit_keys(sd: Mapping[str, Any]) -> bool:
    return any(k.startswith(('blocks.', 'patch_embed.')) for k in sd)


def ema_preferred(ckpt: Mapping[str, Any]) -> Mapping[str, Any]:
    """The weights timm's reader takes from a file (``timm.models.load_state_dict``,
    ``use_ema=True``, its default): ``state_dict_ema``, else ``model_ema``, where not
    None (then ``state_dict``, ``model``, the flat dict: what :func:`backbone_weights`
    takes anyway), with the file's ``meta``. Every route (timm, mmseg's ``LookHereViT``,
    :func:`~lookhere_dense.lookhere.create_model`) takes a timm ``train.py`` file's EMA
    weights so. An official LookHere file (``weights`` and ``config``) has none and is
    kept as it is."""
    if not isinstance(ckpt, Mapping) or ('weights' in ckpt and 'config' in ckpt):
        return ckpt
    for key in ('state_dict_ema', 'model_ema'):
        if isinstance(ckpt.get(key), Mapping):
            out: Dict[str, Any] = {'state_dict': ckpt[key]}
            if isinstance(ckpt.get('meta'), Mapping):
                out['meta'] = ckpt['meta']
            return out
    return ckpt


def _mapping(value: Any, key: str, where: str) -> Dict[str, Any]:
    """``value`` (a checkpoint's entry ``key``) as a dict, else a CheckpointError naming
    the file and the key."""
    if not isinstance(value, Mapping):
        raise CheckpointError(
            f'{where}: {key} is a {type(value).__name__} ({_short(value)}), not a dict'
        )
    return dict(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + '...'


def backbone_weights(
    ckpt: Mapping[str, Any], keep_pos_embed: bool = False, source: Optional[str] = None
) -> BackboneWeights:
    """Recognise a checkpoint's format and return its backbone weights in our keys.

    Args:
        ckpt: the loaded checkpoint (see :func:`load_checkpoint_file`).
        keep_pos_embed: keep a timm ``pos_embed`` (only a backbone with an absolute
            position embedding uses it). Default: False (dropped and listed).
        source: the file, for messages. Default: None (``'the checkpoint'``).

    Raises:
        CheckpointError: no ViT weights, or a container that is malformed (``weights`` /
            ``config`` / ``state_dict`` / ``meta`` of the wrong type, a value that is no
            tensor), naming the file and the key.
    """
    where = 'the checkpoint' if source is None else _source_words(os.fspath(source))
    lh_config = None
    num_heads = None
    pos_encoding = None
    if not isinstance(ckpt, Mapping):
        raise CheckpointError(f'{where} is a {type(ckpt).__name__}, not a dict of weights')
    ckpt = ema_preferred(ckpt)
    if 'weights' in ckpt and 'config' in ckpt:
        fmt = 'official'
        sd = _mapping(ckpt['weights'], "'weights'", where)
        lh_config = _mapping(ckpt['config'], "'config'", where + ' (official LookHere file)')
    elif 'state_dict' in ckpt:
        sd = _mapping(ckpt['state_dict'], "'state_dict'", where)
        meta = ckpt.get('meta') or {}
        if not isinstance(meta, Mapping):
            raise CheckpointError(
                f"{where}: 'meta' is a {type(meta).__name__} ({_short(meta)}), not a dict"
            )
        if meta:
            num_heads = int_or_none(meta.get('num_heads'))  # save_backbone_checkpoint's
            if meta.get('num_heads') is not None and num_heads is None:
                raise CheckpointError(
                    f"{where}: meta 'num_heads' is {_short(meta['num_heads'])}, not an int"
                )
            pos_encoding = meta.get('pos_encoding')
            if pos_encoding is not None and not isinstance(pos_encoding, str):
                raise CheckpointError(
                    f"{where}: meta 'pos_encoding' is {_short(pos_encoding)}, not a name"
                )
        if isinstance(meta, Mapping) and meta.get('lookhere_config') is not None:
            fmt = 'lookhere-dense'
            lh_config = _mapping(meta['lookhere_config'], "meta 'lookhere_config'", where)
        elif any(k.startswith('backbone.') for k in sd):
            fmt, sd = 'mmengine', strip_prefix(sd, 'backbone.')
        else:
            fmt = 'timm'
    elif 'model' in ckpt and isinstance(ckpt['model'], Mapping):
        fmt, sd = 'timm', dict(ckpt['model'])
    else:
        fmt, sd = 'timm', dict(ckpt)
    if not all(isinstance(k, str) for k in sd):
        bad = next(k for k in sd if not isinstance(k, str))
        raise CheckpointError(f'{where}: the weights have a key {bad!r} that is no name')

    if any(k.startswith('module.') for k in sd):
        sd = strip_prefix(sd, 'module.')
    if fmt == 'timm' and not _has_vit_keys(sd) and any(k.startswith('backbone.') for k in sd):
        # a whole model's flat state_dict (a segmentor's, or an mmengine checkpoint
        # unwrapped by timm's checkpoint_path= reader): its backbone, as above
        fmt, sd = 'mmengine', strip_prefix(sd, 'backbone.')
    if fmt in ('timm', 'mmengine') and is_mmseg_vit(sd):
        fmt, sd = 'mmseg', mmseg_vit_to_timm(sd)
    if not _has_vit_keys(sd):
        raise CheckpointError(
            ('' if source is None else f'{where}: ')
            + 'checkpoint has no ViT backbone weights (no "blocks.*" or '
            f'"patch_embed.*" keys); first keys: {sorted(sd)[:8]}'
        )
    if fmt == 'official':
        pos_encoding = 'lookhere'
    extra = sd.pop(EXTRA_STATE_KEY, None)  # LookHereViT.get_extra_state() of our own saves
    if extra is not None:
        try:
            extra = read_record(extra)
        except CheckpointError as err:
            raise CheckpointError(f'{where}: {EXTRA_STATE_KEY!r}: {err}') from None
        pos_encoding = extra.get('pos_encoding') or pos_encoding
        if lh_config is None and extra.get('lh_config') is not None:
            lh_config = dict(extra['lh_config'])
        if num_heads is None:
            num_heads = int_or_none(extra.get('num_heads'))
    out: Dict[str, Tensor] = {}
    dropped: List[str] = []
    for key, value in sd.items():
        m = _DEIT3_LAYERSCALE.match(key)
        if m:  # original DeiT-III repo: blocks.i.gamma_1 -> blocks.i.ls1.gamma
            key = f'{m.group(1)}.ls{m.group(2)}.gamma'
        if key.startswith('norm_pre.'):  # timm's norm before the blocks (CLIP ViTs)
            key = 'pre_ln.' + key[len('norm_pre.') :]
        if _CLASSIFIER.match(key) or (key == 'pos_embed' and not keep_pos_embed):
            dropped.append(key)
            continue
        if not isinstance(value, Tensor):
            raise CheckpointError(
                f'{where}: {key!r} holds a {type(value).__name__} ({_short(value)}), not a '
                'tensor: the file is damaged or no weights file'
            )
        out[key] = value
    return BackboneWeights(out, fmt, lh_config, sorted(dropped), pos_encoding, num_heads)


# ----------------------------------------------------------------------------------------
# Attention geometry
# ----------------------------------------------------------------------------------------
def file_embed_dims(sd: Mapping[str, Tensor]) -> Optional[int]:
    """The width of the ViT whose weights (in our names) ``sd`` holds; None if it cannot
    tell."""
    for key in ('patch_embed.proj.weight', 'cls_token', 'blocks.0.norm1.weight'):
        value = sd.get(key)
        if isinstance(value, Tensor) and value.dim() >= 1:
            return int(value.shape[0] if key == 'patch_embed.proj.weight' else value.shape[-1])
    return None


def heads_assumed(weights: BackboneWeights) -> bool:
    """Whether :func:`file_num_heads` can only assume a file's head count (timm / DeiT-III
    / mmengine files: ``embed_dims / 64``), which ``checkpoint_num_heads`` then overrides;
    False where the file records it or is a LookHere file (12)."""
    return weights.num_heads is None and weights.lh_config is None and weights.pos_encoding is None


def file_num_heads(weights: BackboneWeights) -> Tuple[Optional[int], str]:
    """The head count the backbone weights of a file were trained with, and how it is known.

    * recorded in the file (lookhere-dense writes it with every ``LookHereViT``);
    * files with a LookHere config but no head count (official LookHere files, and files of
      lookhere-dense written before it recorded head counts): 12, the head count of the
      official ``LookHere`` class, of every released checkpoint (LH_180 / LH_90 / LH_45)
      and the default of ``LookHereViT``;
    * other files (timm / DeiT-III / mmengine): ``embed_dims / 64``, the head width of
      timm's and DeiT-III's ViT-Ti/S/B/L, when ``embed_dims`` is a multiple of 64;
    * otherwise unknown (None).

    Returns:
        ``(num_heads or None, a phrase saying where it comes from)``.
    """
    if weights.num_heads is not None:
        return weights.num_heads, 'recorded in the file'
    if weights.lh_config is not None or weights.pos_encoding is not None:
        return OFFICIAL_NUM_HEADS, (
            'not recorded in this LookHere file; LookHere files without a head count come '
            f'from the official code, whose models have {OFFICIAL_NUM_HEADS} heads'
        )
    dims = file_embed_dims(weights.state_dict)
    if dims is not None and dims % TIMM_HEAD_DIM == 0:
        return dims // TIMM_HEAD_DIM, (
            f'not recorded in this {weights.format} file; assumed from its {dims} channels '
            f'and the head width {TIMM_HEAD_DIM} of timm / DeiT-III ViTs'
        )
    return None, (
        f'not recorded in this {weights.format} file, and its {dims} channels are '
        f'no multiple of the usual head width {TIMM_HEAD_DIM}'
    )


def _source_words(source: str) -> str:
    """A file's name in quotes for a message; 'the loaded state_dict' (words, not a file)
    as it is."""
    return source if source.startswith('the ') else repr(source)


def check_num_heads(
    model_heads: int,
    file_heads: Optional[int],
    how: str,
    source: str,
    declared: Optional[int] = None,
    key: str = HEADS_KEY,
) -> None:
    """Refuse weights trained with another head count than ``model_heads``.

    Args:
        model_heads: the model's ``num_heads``.
        file_heads: the file's head count (see :func:`file_num_heads`), or None.
        how: where ``file_heads`` comes from (for the message).
        source: the file (for the message).
        declared: the head count the user states for the file (``checkpoint_num_heads``);
            overrides an assumed ``file_heads`` but must equal a recorded one.
        key: how the user states it (for the message). Default: :data:`HEADS_KEY`.

    Raises:
        CheckpointError: naming the file, both head counts and the key to set.
    """
    where = _source_words(source)
    if declared is not None:
        if not is_int(declared) or declared < 1:
            raise CheckpointError(
                f'{key} must be a positive int (the head count the '
                f'checkpoint was trained with), got {declared!r}'
            )
        if how == 'recorded in the file' and file_heads != declared:
            raise CheckpointError(
                f'{key}={declared} but {where} records {file_heads} heads; remove {key}'
            )
        file_heads, how = declared, f'stated by {key}'
    if file_heads is None:
        raise CheckpointError(
            f'cannot verify that {where} was trained with num_heads={model_heads} (head '
            f'count {how}). The weights have the same shapes for any head count, but split '
            'into other heads they give wrong features. State the head count the file was '
            f'trained with: {key}=N (create_model / load_pretrained; in a config '
            f"init_cfg=dict(type='Pretrained', checkpoint=..., {key}=N))"
        )
    if file_heads != model_heads:
        extra = ''
        if file_heads not in (6, 12, 16):
            extra = (
                f'; LookHere head layouts need 6, 12 or 16 heads, so a {file_heads}-head '
                "trunk fits only the other encodings (e.g. pos_encoding='rope2d')"
            )
        raise CheckpointError(
            f'{where} has {file_heads} attention heads per block ({how}), but the model '
            f'has num_heads={model_heads}. The qkv weights have the same shapes for any head '
            f'count, but split into other heads they give wrong features. Set num_heads='
            f'{file_heads} (model.backbone.num_heads in a config){extra}; if the file really has '
            f'{model_heads} heads, state it with {key}={model_heads}'
        )


_ANY_BLOCK = re.compile(r'^(|.*\.)blocks\.(\d+)\.')


def _depths(keys) -> Dict[str, int]:
    """``{prefix: number of blocks}`` of the ``{prefix}blocks.{i}.*`` keys."""
    out: Dict[str, int] = {}
    for k in keys:
        m = _ANY_BLOCK.match(k)
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(2)) + 1)
    return out


def _prefixes(depths: Mapping[str, int]) -> str:
    """``{prefix: depth}`` in words: ``'backbone.blocks.0-11'`` and so on."""
    return ' and '.join(f'{p}blocks.0-{n - 1}' for p, n in sorted(depths.items()))


def missing_blocks(keys: Iterable[str], prefix: str = '') -> List[int]:
    """The block indices below the largest that ``{prefix}blocks.{i}.*`` keys lack (a
    file with blocks 0, 1, 2, 7 lacks 3-6: no whole trunk of any depth)."""
    seen = set()
    for k in keys:
        m = _ANY_BLOCK.match(k)
        if m and m.group(1) == prefix:
            seen.add(int(m.group(2)))
    return [i for i in range(max(seen) + 1) if i not in seen] if seen else []


def _ranges(indices: Sequence[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``'3-5, 9'``."""
    parts: List[str] = []
    for i in indices:
        if parts and parts[-1][1] == i - 1:
            parts[-1][1] = i
        else:
            parts.append([i, i])
    return ', '.join(f'{a}' if a == b else f'{a}-{b}' for a, b in parts)


def file_depth(keys: Iterable[str]) -> int:
    """The number of blocks of a trunk's keys (``blocks.{i}.*``, timm's names): one more
    than the largest ``i``, 0 without blocks."""
    return _depths(keys).get('', 0)


#: a LayerScale parameter (timm's names, any prefix)
_LAYERSCALE = r'(^|\.)ls[12]\.gamma$'


def has_layerscale(keys: Iterable[str]) -> bool:
    """Whether keys (timm's names, any prefix) hold a LayerScale gamma (``ls1`` / ``ls2``)."""
    return any(re.search(_LAYERSCALE, k) for k in keys)


def vit_shape_summary(model_sd: Mapping[str, Tensor], file_sd: Mapping[str, Tensor]) -> str:
    """A ViT's width, patches and channels in the file and in the model, when the patch
    embeddings differ (the ``summary`` of :func:`~lookhere_dense.checkpoint.load_state_dict_strict`;
    timm's names, any prefix); ``''`` otherwise.

    Args:
        model_sd: the model's tensors.
        file_sd: the file's tensors in the model's names.
    """
    patch = next(
        (k for k in file_sd if k.endswith('patch_embed.proj.weight') and k in model_sd), None
    )
    if patch is None or file_sd[patch].dim() != 4 or model_sd[patch].dim() != 4:
        return ''
    (fw, fc, fp, _), (mw, mc, mp, _) = file_sd[patch].shape, model_sd[patch].shape
    if (fw, fc, fp) == (mw, mc, mp):
        return ''
    return (
        f'the file is a ViT of width {fw} with {fp}x{fp} patches of {fc} channels, '
        f'the model of width {mw} with {mp}x{mp} patches of {mc} channels'
    )


def vit_loose_advice(missing: List[str], file_keys: Sequence[str]) -> Optional[str]:
    """Why ``strict=False`` would be wrong for a file without LayerScale (the ``advice`` of
    :func:`~lookhere_dense.checkpoint.load_state_dict_strict`): the gammas it lacks would keep
    their init value (~1e-4) and scale every residual branch of the file by it. None when
    the file has LayerScale or the model misses none (the usual advice holds)."""
    scales = [k for k in missing if re.search(_LAYERSCALE, k)]
    if not scales or has_layerscale(file_keys):  # not only the gammas of blocks it lacks
        return None
    return (
        f'not strict=False: the {len(scales)} LayerScale gammas the file lacks would '
        'keep their init value and scale every residual branch of the file by it, '
        'which throws its features away'
    )


#: flag of the architecture differs when one side has such a tensor and the other has none
_FLAG_HINTS = (
    (r'(^|\.)attn\.qkv\.bias$', 'qkv bias', 'qkv_bias=False', 'qkv_bias=True'),
    (
        r'(^|\.)patch_embed\.proj\.bias$',
        'patch-embedding bias',
        'patch_bias=False',
        'patch_bias=True',
    ),
    (
        r'(^|\.)patch_embed\.norm\.weight$',
        'patch-embedding norm',
        'patch_norm=False',
        'patch_norm=True',
    ),
    (r'(^|\.)pre_ln\.weight$', 'norm before the blocks', 'pre_norm=False', 'pre_norm=True'),
    (r'^(backbone\.)?norm\.weight$', 'final norm', 'final_norm=False', 'final_norm=True'),
    (r'(^|\.)cls_token$', 'CLS token', 'with_cls_token=False', 'with_cls_token=True'),
    (
        r'(^|\.)jumbo_token$',
        'Jumbo token (jumbo_token, jumbo_mlp.*, blocks.*.jumbo_norm)',
        'jumbo_tokens=0 (or strict=False to start them from scratch)',
        "jumbo_tokens to the file's J (jumbo_token.shape[1]) and with_cls_token=False",
    ),
    (_LAYERSCALE, 'LayerScale', 'init_values=None', 'init_values to a number'),
)


def vit_key_hints(
    missing: List[str], unexpected: List[str], model_keys: Sequence[str], file_keys: Sequence[str]
) -> List[str]:
    """The usual reasons why keys of a ViT differ, found from the keys themselves (the
    ``hints`` of :func:`~lookhere_dense.checkpoint.load_state_dict_strict`). A file in
    mmseg's backbone names (``layers.*``) gets that one hint: its other keys differ by name,
    not by architecture."""
    if any(re.match(r'^(backbone\.)?layers\.\d+\.', k) for k in file_keys) and not any(
        re.match(r'^(backbone\.)?blocks\.\d+\.', k) for k in file_keys
    ):
        return [
            "the file uses mmseg's backbone names (layers.*); LookHereViT takes timm / "
            "official names (blocks.*): init_cfg=dict(type='Pretrained', ...) and "
            "tools/convert_checkpoint.py rename mmseg VisionTransformer's; for another "
            'mmseg backbone (BEiT, MAE) load the original timm / DeiT-III / LookHere file'
        ]
    hints = []
    in_file, in_model = _depths(file_keys), _depths(model_keys)
    if in_file and in_model and not set(in_file) & set(in_model):
        # blocks under other names: this model's under a prefix, or another model's file
        # (whose other keys differ by name too)
        said = f"the file's blocks are {_prefixes(in_file)}, the model's {_prefixes(in_model)}"
        under = sorted(
            f[: len(f) - len(m)] for f in in_file for m in in_model if f != m and f.endswith(m)
        )
        if under:  # e.g. a distillation run's student.* for the LookWhere model itself
            return [
                f"{said}: the model sits under {under[0]!r} in the file: add prefix='{under[0]}'"
            ]
        if any('extractor.trunk.' in m for m in in_model):
            return [
                f"{said}: a checkpoint of another model (a LookHereViT segmentor's for this "
                'LookWhere model, whose LookHere trunk is extractor.trunk.*? load such a '
                'file with extractor=dict(pretrained=FILE))'
            ]
        return [f'{said}: a checkpoint of another model']
    for prefix in sorted(set(in_file) & set(in_model)):
        have, want = in_file[prefix], in_model[prefix]
        gaps = missing_blocks(file_keys, prefix)
        if gaps:
            hints.append(
                f'the file lacks the blocks {prefix}blocks.{_ranges(gaps)} below its last, '
                f'{prefix}blocks.{have - 1}: no whole trunk (a damaged or filtered file), '
                'whatever num_layers'
            )
        elif have != want:
            hints.append(
                f'the file has {have} blocks ({prefix}blocks.0-{have - 1}), the '
                f'model {want}: set num_layers={have}'
            )

    def some(keys, pattern: str) -> bool:
        return any(re.search(pattern, k) for k in keys)

    for pattern, what, off, on in _FLAG_HINTS:
        if some(missing, pattern) and not some(file_keys, pattern):
            hints.append(
                f'no LayerScale in the file: set {off}'
                if what == 'LayerScale'
                else f'the file has no {what}: set {off}'
            )
        elif some(unexpected, pattern) and not some(model_keys, pattern):
            hints.append(
                f'the file has LayerScale (ls1/ls2.gamma): set {on}'
                if what == 'LayerScale'
                else f'the file has a {what}: set {on}'
            )
    if some(missing, r'(^|\.)_extra_state$'):
        hints.append(
            'the file lacks the record a LookHereViT saves with its weights '
            '(_extra_state: position encoding, LookHere config, head count); '
            'strict=False loads the weights without it'
        )
    if some(missing, r'(^|\.)pos_enc\.pos_embed$'):
        hints.append("the file has no position embedding for pos_encoding='abs'")
    if some(unexpected, _SLOPE_KEY) and not some(model_keys, _SLOPE_KEY):
        hints.append(
            'the file has learned LookHere slopes (pos_enc.slopes.*): set '
            'model.backbone.lh_config.learnable_slopes=True'
        )
    return hints


#: the state_dict keys of learnable LookHere slopes (any prefix)
_SLOPE_KEY = r'(^|\.)pos_enc\.slopes\.'


def save_backbone_checkpoint(
    path: str,
    state_dict: Mapping[str, Tensor],
    lh_config: Optional[Mapping[str, Any]],
    source: str,
    num_heads: Optional[int] = None,
    pos_encoding: Optional[str] = None,
) -> None:
    """Write backbone weights as ``{'state_dict': ..., 'meta': {...}}``, atomically (a
    temporary file in the same folder renamed onto ``path``: a failed write leaves an
    earlier file there as it was).

    The file works with ``init_cfg=dict(type='Pretrained', checkpoint=path)`` of
    ``LookHereViT`` (which also takes the stored LookHere config from ``meta``). Only
    weights are written: a module's record (``_extra_state``) is replaced by ``lh_config``
    and the head count.

    Args:
        num_heads: the head count of the weights, written to ``meta['num_heads']`` so
            loading can check it; None: taken from the ``_extra_state`` of a saved
            ``LookHereViT`` in ``state_dict``, else not recorded. Default: None.
        pos_encoding: the ``pos_encoding`` the weights were trained with, written to
            ``meta['pos_encoding']`` so loading refuses a model of another; None: taken
            from the ``_extra_state`` in ``state_dict``, else not recorded. Default: None.

    Raises:
        CheckpointError: a value of ``state_dict`` that is no tensor (nothing written).
        OSError: the write failed (``path`` untouched).
    """
    extra = state_dict.get(EXTRA_STATE_KEY)
    if extra is not None:
        record = read_record(extra)
        if num_heads is None:
            num_heads = int_or_none(record.get('num_heads'))
        if pos_encoding is None:
            pos_encoding = record.get('pos_encoding')
    bad = [
        k for k, v in state_dict.items() if not isinstance(v, Tensor) and not is_extra_state_key(k)
    ]
    if bad:
        raise CheckpointError(
            f'{source!r}: {listed(bad)} hold no tensor '
            f'({type(state_dict[bad[0]]).__name__}); nothing was written'
        )
    meta = {
        'lookhere_config': None if lh_config is None else dict(lh_config),
        'num_heads': num_heads,
        'pos_encoding': pos_encoding,
        'source': source,
        'converted_by': __name__,
    }
    tensors = {
        k: v.detach().cpu().contiguous()
        for k, v in state_dict.items()
        if isinstance(v, Tensor) and not is_extra_state_key(k)
    }
    buffer = io.BytesIO()
    torch.save({'state_dict': tensors, 'meta': meta}, buffer)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_bytes(os.fspath(path), buffer.getvalue())


# ----------------------------------------------------------------------------------------
# Adoption into a trunk (a LookHereVisionTransformer; duck-typed here, so this module does
# not import the model)
# ----------------------------------------------------------------------------------------
def unused_checkpoint_keys(
    model: Any, state_dict: Mapping[str, Tensor], file_encoding: Optional[str]
) -> Dict[str, str]:
    """``{key: reason}`` of file tensors the trunk ``model`` leaves out by design: the final
    ``norm`` with ``final_norm=False``, ``cls_token`` with ``with_cls_token=False``, and
    another encoding's ``pos_enc.*``."""
    own = model.state_dict()
    out = {}
    for key in state_dict:
        if key in own:
            continue
        if key.startswith('norm.') and model.norm is None:
            out[key] = 'final_norm=False'
        elif key == 'cls_token' and not model.with_cls_token:
            out[key] = 'with_cls_token=False'
        elif key.startswith('pos_enc.') and file_encoding not in (None, model.pos_encoding):
            out[key] = f'position encoding {file_encoding!r} of the file'
    return out


def check_weights_argument(name: str, value: Any) -> None:
    """Refuse weights given as anything but a file path (``str`` / ``os.PathLike``) or a
    loaded checkpoint (a mapping), e.g. timm's habit ``pretrained=True``.

    Raises:
        TypeError: naming the argument and the value.
    """
    if isinstance(value, (str, os.PathLike, Mapping)):
        return
    raise TypeError(
        f'{name} must be a checkpoint file (str or pathlib.Path) or a loaded checkpoint '
        f'(a dict), got {value!r}'
        + (
            "; no weights are downloaded: pass the file, e.g. 'LH_180_weights_and_config.pth'"
            if isinstance(value, bool)
            else ''
        )
    )


#: the LayerNorm eps of timm's ``VisionTransformer``, DeiT-III and mmseg's ViT configs,
#: whose weights (formats ``timm`` / ``mmseg``) were trained with it; the official LookHere
#: model (and this trunk's default) uses PyTorch's 1e-5
TIMM_LAYERNORM_EPS = 1e-6


def layernorm_eps_note(model: Any, weights: BackboneWeights, path: str) -> Optional[str]:
    """The warning for a timm / DeiT-III / mmseg-ViT file (format ``timm`` or ``mmseg``,
    recording no LookHere model: not an official LookHere file nor one of this project's)
    loaded into a trunk whose LayerNorms have another eps than those files were trained
    with (1e-6, :data:`TIMM_LAYERNORM_EPS`); None where they agree, the file records a
    LookHere model, or the trunk has no ``nn.LayerNorm``. The eps has no parameter: the
    weights load either way and every feature differs a little; the note says how each
    route builds the trunk with 1e-6 (the eps is never changed silently)."""
    if weights.format not in ('timm', 'mmseg') or not heads_assumed(weights):
        return None
    eps = sorted({float(m.eps) for m in model.modules() if isinstance(m, torch.nn.LayerNorm)})
    if not eps or eps == [TIMM_LAYERNORM_EPS]:
        return None
    shown = ', '.join(f'{e:g}' for e in eps)
    return (
        f'{path}: a timm / DeiT-III / mmseg ViT file ({weights.format} format; such weights '
        f'are trained with LayerNorm eps={TIMM_LAYERNORM_EPS:g}) loaded into a backbone whose '
        f'LayerNorm eps is {shown}: every feature differs a little from the original '
        "model's (the eps is no parameter: nothing else tells). To match it, build the "
        'backbone with eps=1e-6: timm: timm.create_model(..., '
        "norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6)) (or norm_layer='layernorm', "
        "timm's LayerNorm, as its ViT); torch only: "
        'lookhere_dense.lookhere.create_model(..., '
        'norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6)); mmseg / mmdet: '
        "backbone=dict(type='LookHereViT', norm_cfg=dict(type='LN', eps=1e-6), ...). "
        'Official LookHere files are trained with the default, 1e-5'
    )


def file_pos_encoding(weights: BackboneWeights) -> Optional[str]:
    """The ``pos_encoding`` the weights were trained with: recorded in the file (the
    ``_extra_state`` of a saved trunk, ``meta['pos_encoding']`` of a converted file,
    ``'lookhere'`` for official files), else told by its keys and record: a LookHere config
    without a recorded encoding (converted before encodings were recorded) is
    ``'lookhere'``, except one whose heads are all unrestricted (``head_directions='none'``:
    2D ALiBi's, or the same bias as LookHere's: None), a table ``pos_enc.pos_embed`` (only the ``'abs'`` trunk saves one) is
    ``'abs'``; None (unknown: timm / DeiT-III / mmseg files, which fit any encoding)."""
    if weights.pos_encoding is not None:
        return weights.pos_encoding
    if weights.lh_config is not None:
        # every head unrestricted: 2D ALiBi's config, or a LookHere one with the same bias
        # (files converted before the encoding was recorded cannot tell them apart)
        directions = weights.lh_config.get('head_directions')
        return None if directions == 'none' else 'lookhere'
    if 'pos_enc.pos_embed' in weights.state_dict:
        return 'abs'
    return None


def load_backbone_weights(
    model: Any,
    checkpoint: Union[str, 'os.PathLike[str]', Mapping[str, Any]],
    strict: bool = True,
    checkpoint_num_heads: Optional[int] = None,
    source: Optional[str] = None,
) -> Dict[str, List[str]]:
    """Load official LookHere / timm / DeiT-III / lookhere-dense weights into a trunk.

    The LookHere config stored in official and lookhere-dense files replaces the
    default one; it must equal an explicitly given ``lh_config``/``preset``. Such files
    load only into ``pos_encoding='lookhere'``. With ``pos_encoding='abs'`` a file's
    ``pos_embed`` (timm / DeiT-III) or ``pos_enc.pos_embed`` (ours) is kept, resampled to
    the trunk's grid, and a CLS entry (timm ViTs) is added to ``cls_token`` (the CLS
    token has no position embedding here, so its input stays the same); the other
    encodings drop it.

    The file must fit (:func:`~lookhere_dense.checkpoint.load_state_dict_strict`):
    tensor shapes always; with ``strict`` also every key both ways, except what is
    dropped on purpose (classifier head, ``pos_embed`` of non-``abs`` encodings, the
    final ``norm`` with ``final_norm=False``, ``cls_token`` with
    ``with_cls_token=False``, another encoding's ``pos_enc.*``). The file's head count
    must equal ``num_heads`` (:func:`file_num_heads`: recorded in lookhere-dense files, 12
    for official LookHere files, ``embed_dims/64`` for timm / DeiT-III files; files it
    cannot tell need ``checkpoint_num_heads``).

    Args:
        model: a :class:`~lookhere_dense.lookhere.vit.LookHereVisionTransformer`.
        checkpoint: the file, or a checkpoint already loaded.
        strict: refuse files that lack parameters of the backbone or have parameters
            it lacks. Default: True.
        checkpoint_num_heads: the head count the file was trained with, for files
            that do not record it. Default: None.
        source: the file's name for messages when ``checkpoint`` is a dict. Default: None.

    Returns:
        ``{'missing': [...], 'unexpected': [...], 'dropped': [...]}`` (and
        ``'from_config'``: learnable-slope keys the file lacks).

    Raises:
        FileNotFoundError, CheckpointError: naming the file and what does not fit.
    """
    if isinstance(checkpoint, (str, os.PathLike)):
        path = os.fspath(checkpoint)
        ckpt = load_checkpoint_file(path)
    else:
        check_weights_argument('checkpoint', checkpoint)
        path, ckpt = source or 'the checkpoint', checkpoint
    is_abs = isinstance(model.pos_enc, AbsolutePositionEncoding)
    weights = backbone_weights(ckpt, keep_pos_embed=is_abs, source=path)
    file_encoding = file_pos_encoding(weights)
    if file_encoding == 'alibi2d' and model.pos_encoding != 'alibi2d':
        weights.lh_config = None  # 2D-ALiBi slopes: meaningless for another encoding
    if file_encoding == 'lookhere' and model.pos_encoding != 'lookhere':
        raise CheckpointError(
            f'{_source_words(path)} ({weights.format} format) holds a '
            f"'lookhere' model (config {weights.lh_config}); it loads only into "
            f"pos_encoding='lookhere', not {model.pos_encoding!r}: set "
            "model.backbone.pos_encoding='lookhere'"
        )
    if file_encoding is not None and model.pos_encoding != file_encoding:
        # a trunk of another encoding as pretraining (as timm's 'abs' weights are): said,
        # never silent
        warnings.warn(
            f'{path}: weights trained with pos_encoding={file_encoding!r} ({weights.format} '
            f'format, recorded in the file) loaded into a pos_encoding={model.pos_encoding!r} '
            'backbone: its trunk is used as pretraining, the position encoding it was '
            f'trained with is not, so its features differ from the original model; set '
            f'pos_encoding={file_encoding!r} to use the model as it was trained',
            UserWarning,
            stacklevel=2,
        )
    pos_note = ''
    if is_abs:
        stored = [k for k in ('pos_embed', 'pos_enc.pos_embed') if k in weights.state_dict]
        if stored:
            sd = weights.state_dict
            try:
                pos_embed, cls_entry, pos_note = model.pos_enc.adapt_checkpoint_embedding(
                    sd.pop(stored[0]),  # our own table never has a CLS entry
                    has_cls=False if stored[0] == 'pos_enc.pos_embed' else None,
                )
            except ValueError as err:
                reg = sd.get('reg_token')
                extra = (
                    f'; the file has {reg.shape[1]} register tokens (reg_token, timm '
                    'reg_tokens), which this trunk has none of: such a pos_embed (and '
                    "file) does not fit pos_encoding='abs'; convert it without "
                    '--keep-pos-embed for another encoding'
                    if isinstance(reg, Tensor) and reg.dim() == 3
                    else ''
                )
                raise CheckpointError(
                    f'{_source_words(path)}: {stored[0]!r} cannot be used: {err}{extra}'
                ) from None
            sd['pos_enc.pos_embed'] = pos_embed
            if cls_entry is not None and 'cls_token' in sd:
                sd['cls_token'] = sd['cls_token'] + cls_entry
                pos_note += ', added to cls_token'
            pos_note = f'; {stored[0]} -> pos_enc.pos_embed: {pos_note}'
    dropped = unused_checkpoint_keys(model, weights.state_dict, file_encoding)

    def verify() -> None:  # after the key checks, before anything is loaded
        heads, how = file_num_heads(weights)
        check_num_heads(model.num_heads, heads, how, path, checkpoint_num_heads)
        if weights.lh_config is not None:
            adopt_lh_config(model, weights.lh_config, path)

    report = load_state_dict_strict(
        model,
        weights.state_dict,
        path,
        strict=strict,
        dropped=dropped,
        what='backbone',
        verify=verify,
        hints=vit_key_hints,
        loose=getattr(model, 'loose_loading', None),
        summary=vit_shape_summary,
        advice=vit_loose_advice,
    )
    report['dropped'] = sorted(weights.dropped + report['dropped'])
    if report['missing']:  # strict=False: say what stays as initialised
        warnings.warn(
            f'{path}: loaded with strict=False; {len(report["missing"])} backbone tensors are '
            f'not in the file and keep their initial values: {listed(report["missing"])}',
            UserWarning,
            stacklevel=2,
        )
    eps_note = layernorm_eps_note(model, weights, path)
    if eps_note is not None:
        warnings.warn(eps_note, UserWarning, stacklevel=2)
    loaded = len(weights.state_dict) - len(dropped) - len(report['unexpected'])
    config = model.lh_config
    model._log(
        f'LookHereViT: loaded {loaded} tensors from {path} '
        f'({weights.format} format); left out of the backbone '
        f'{report["dropped"] or "nothing"}; '
        f'unexpected (ignored) {report["unexpected"] or "none"}; missing '
        f'{report["missing"] or "none"}; pos_encoding {model.pos_encoding!r}'
        + (f', LookHere config {config.to_dict()}' if config else '')
        + (
            '; learnable slopes start from that config (the file has none)'
            if report.get('from_config')
            else ''
        )
        + pos_note
    )
    return report


def check_backbone_record(model: Any, state: Any) -> None:
    """Check the record (``_extra_state``) of weights loaded into a trunk and adopt their
    LookHere config (the trunk's ``set_extra_state``; the dict that files written before
    the tensor form hold is read too).

    Raises:
        CheckpointError (a ValueError): the weights come from another ``pos_encoding`` or
            attention geometry (heads, layers, channels), or their LookHere config conflicts
            with an explicitly given ``preset`` / ``lh_config`` or does not fit the trunk,
            or the entry is no record of a LookHere ViT.
    """
    try:
        state = decode_extra_state(state)
    except ValueError as err:
        raise CheckpointError(f'LookHereViT: the loaded state_dict has {err}') from None
    for key in ('num_layers', 'embed_dims'):
        stored = state.get(key)
        if stored is not None and stored != getattr(model, key):
            raise CheckpointError(
                f'the loaded weights come from a LookHereViT with '
                f'{key}={stored}, this one has {key}='
                f'{getattr(model, key)}: set model.backbone.{key}={stored}'
            )
    # a record without the key predates Jumbo tokens: it comes from a trunk without them
    stored = state.get('jumbo_tokens', 0 if 'pos_encoding' in state else None)
    own = getattr(model, 'jumbo_tokens', 0)
    if stored is not None and stored != own:
        tensors = ' (its Jumbo tensors: jumbo_token, jumbo_mlp.*, blocks.*.jumbo_norm.*)'
        raise CheckpointError(
            f'the loaded weights come from a LookHereViT with jumbo_tokens={stored} '
            f'(key {EXTRA_STATE_KEY!r}){tensors if stored else ""}, this one has '
            f'jumbo_tokens={own}: set model.backbone.jumbo_tokens={stored}'
            + (' and with_cls_token=False' if stored else '')
            + f' (or drop the {EXTRA_STATE_KEY!r} key to move the trunk weights on purpose)'
        )
    if state.get('num_heads') is not None:
        check_num_heads(
            model.num_heads, state['num_heads'], 'recorded in the file', 'the loaded state_dict'
        )
    source = state.get('pos_encoding')
    if source is not None and source != model.pos_encoding:
        raise CheckpointError(
            f'the loaded weights were trained with pos_encoding={source!r}, '
            f'but this LookHereViT has pos_encoding={model.pos_encoding!r}: '
            f'set model.backbone.pos_encoding={source!r} (or drop the '
            f'{EXTRA_STATE_KEY!r} key to move the trunk weights on purpose)'
        )
    stored = state.get('lh_config')
    if stored is not None and model.lh_config is not None:
        stored = {k: v for k, v in stored.items() if k != 'bias_rounding'}
        adopt_lh_config(model, stored, 'the loaded state_dict')
    size = state.get('log_n_train_size')
    if size is not None and getattr(model, 'log_n_scaling', False):
        if tuple(size) != tuple(model.img_size):  # the size the weights' scaling refers to
            model.set_input_size(tuple(int(v) for v in size))


def adopt_lh_config(model: Any, stored: Mapping[str, Any], path: str) -> None:
    """Switch the trunk ``model`` to the LookHere config ``stored`` in a file.

    The file's ``bias_rounding`` defaults to the model's; its learnable-slopes flag must
    not ask for learned slopes the model cannot hold (a fixed-slope file in a learnable
    model gives the initial slopes). With an explicit ``preset`` / ``lh_config`` on the
    model the official keys must agree.

    Raises:
        CheckpointError, ValueError: naming the file and what differs.
    """
    where = _source_words(path)
    stored = dict(stored)
    stored.setdefault('bias_rounding', model.lh_config.bias_rounding)
    learnable = model.lh_config.learnable_slopes
    if stored.get('learnable_slopes') is True and not learnable:
        raise CheckpointError(
            f'{where} holds learned LookHere slopes (lh_config learnable_slopes=True, '
            'tensors pos_enc.slopes.*), but this LookHereViT has fixed slopes: set '
            'model.backbone.lh_config.learnable_slopes=True (lh_config=dict(..., '
            'learnable_slopes=True)) to load them'
        )
    # a fixed-slope file in a learnable model: its slopes are the initial values
    stored['learnable_slopes'] = learnable
    try:
        ckpt_cfg = resolve_lh_config(stored)
    except ValueError as err:
        raise CheckpointError(
            f'the LookHere config stored in {where} cannot be used: {err}'
        ) from None
    if model.lh_explicit:
        diff = [
            d for d in model.lh_config.differences(ckpt_cfg) if d.split(':')[0] in OFFICIAL_KEYS
        ]
        if diff:
            raise CheckpointError(
                f'the LookHere config given to LookHereViT conflicts with the '
                f'one stored in {where} (given != checkpoint): '
                + '; '.join(diff)
                + '. Remove lh_config/preset to use the '
                "checkpoint's, or make them equal."
            )
    try:
        ckpt_cfg.validate(model.num_heads, model.num_layers)
    except ValueError as err:
        raise CheckpointError(
            f'the LookHere config stored in {where} does not fit this backbone: {err}'
        ) from None
    if ckpt_cfg != model.lh_config:
        model._log(f'LookHereViT: LookHere config from {path}: {ckpt_cfg.to_dict()}')
    model.pos_enc.set_lh_config(ckpt_cfg)
