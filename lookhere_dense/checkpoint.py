"""Read official LookHere, timm / DeiT-III and lookhere-dense checkpoints, and load them
strictly: a file that does not fit the model is refused with a message that names what
differs, never used anyway.

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

Every file is read by :func:`load_checkpoint_file` (:func:`checkpoint_problem` says why a
file cannot be read without raising: the ``--resume`` fallback). Every load goes through
:func:`load_state_dict_strict`: tensors of another shape, keys the model has and the file
lacks, and keys the file has and the model lacks are errors that name them (with a hint for
the usual causes: depth, LayerScale, final norm). Two entry points use it:

* :meth:`LookHereViT.load_pretrained` (``init_cfg=dict(type='Pretrained', ...)``) for
  backbone weights in any of the formats above;
* :func:`load_model_weights` for a whole model's checkpoint (``tools/test.py``,
  ``tools/infer.py``, ``--resume`` through
  :class:`~lookhere_dense.engine.hooks.CheckpointFitHook`).

Records. ``LookHereViT`` saves what its weights mean beyond their shapes (position
encoding, LookHere config, head count, depth, width) as its ``_extra_state``: a uint8 tensor
holding JSON (:func:`encode_extra_state`), so that every ``state_dict`` entry is a tensor
(mmengine broadcasts all of them in multi-process runs). Files written before hold a dict
there; :func:`decode_extra_state` reads both.

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
message naming the key to set.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import zipfile
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor, nn

__all__ = ['BackboneWeights', 'CheckpointError', 'UnreadableCheckpointError',
           'load_checkpoint_file', 'checkpoint_problem', 'backbone_weights',
           'match_state_dict', 'file_num_heads', 'check_num_heads',
           'load_state_dict_strict', 'load_model_weights', 'save_backbone_checkpoint',
           'encode_extra_state', 'decode_extra_state', 'is_extra_state_key',
           'EXTRA_STATE_KEY', 'HEADS_KEY']

#: the ``state_dict`` key of a module's ``get_extra_state()`` (PyTorch's name for it)
EXTRA_STATE_KEY = '_extra_state'
#: the ``init_cfg`` key (and keyword argument) that states a file's head count
HEADS_KEY = 'checkpoint_num_heads'
#: Keys a classification checkpoint has that a dense-prediction backbone drops.
_CLASSIFIER = re.compile(r'^(head|fc_norm|head_drop|pre_logits)(\.|$)')
_DEIT3_LAYERSCALE = re.compile(r'^(blocks\.\d+)\.gamma_([12])$')
#: the head count of the official ``LookHere`` class and of every released checkpoint
#: (LH_180 / LH_90 / LH_45, ViT-B/16), and the default of ``LookHereViT``
OFFICIAL_NUM_HEADS = 12
#: the head width of timm / DeiT-III ViT-Ti/S/B/L (192/3, 384/6, 768/12, 1024/16)
TIMM_HEAD_DIM = 64


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or whose weights do not fit the model; the
    message names the file and what to change."""


class UnreadableCheckpointError(CheckpointError):
    """A checkpoint file that cannot be read: ``checkpoint PATH cannot be read: PROBLEM``.

    Attributes:
        path: the file.
        problem: why, in a few words (what :func:`checkpoint_problem` returns).
    """

    def __init__(self, path: str, problem: str, advice: str = ''):
        self.path, self.problem = path, problem
        super().__init__(f'checkpoint {path!r} cannot be read: {problem}'
                         + (f'; {advice}' if advice else ''))


# ----------------------------------------------------------------------------------------
# Records (``_extra_state``)
# ----------------------------------------------------------------------------------------
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
    if isinstance(value, Tensor) and value.dtype == torch.uint8 and value.dim() == 1:
        try:
            state = json.loads(bytes(value.cpu().tolist()).decode('utf-8'))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f'an {EXTRA_STATE_KEY!r} entry that is not a LookHereViT record '
                             f'(a uint8 tensor of {value.numel()} bytes that is no JSON: '
                             f'{err})') from None
        if isinstance(state, dict):
            return state
    what = (f'a {value.dtype} tensor of shape {tuple(value.shape)}'
            if isinstance(value, Tensor) else type(value).__name__)
    raise ValueError(f'an {EXTRA_STATE_KEY!r} entry that is not a LookHereViT record ({what}); '
                     'expected the uint8 tensor LookHereViT.get_extra_state() writes (or the '
                     'dict of older files)')


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


# ----------------------------------------------------------------------------------------
# Reading files
# ----------------------------------------------------------------------------------------
def _first_line(err: BaseException) -> str:
    """The first line of an error message that is not torch's ``weights_only`` advice."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    keep = [ln for ln in lines if 'weights_only' not in ln and 'WeightsUnpickler' not in ln
            and 'trusted source' not in ln and 'torch.load' not in ln]
    unsupported = [ln for ln in lines if 'Unsupported global' in ln]
    line = (unsupported or keep or lines or [type(err).__name__])[0]
    return line.split('. ')[0][:300]


_REWRITE = ('it was not written completely or not downloaded completely: download / save '
            'it again')
_NOT_TORCH = 'expected a file written by torch.save (.pth / .pt) or a .safetensors file'


def _unreadable(path: str, err: BaseException) -> UnreadableCheckpointError:
    """The error for a file torch cannot read, by cause; never advises weights_only=False."""
    text = str(err)
    if isinstance(err, pickle.UnpicklingError) and 'Unsupported global' in text:
        m = re.search(r'GLOBAL ([\w.]+)', text)
        what = m.group(1) if m else 'a Python class'
        return UnreadableCheckpointError(
            path, f'it holds Python objects ({what}) besides tensors, numbers and strings',
            'lookhere-dense loads weights only (unpickling arbitrary objects can run code). '
            'Re-save the weights alone, e.g. torch.save({"state_dict": model.state_dict()}, '
            'PATH)')
    if isinstance(err, PermissionError):
        return UnreadableCheckpointError(path, 'permission denied')
    if isinstance(err, (EOFError, zipfile.BadZipFile, OSError)) or (
            isinstance(err, RuntimeError) and ('central directory' in text
                                               or 'PytorchStreamReader' in text)):
        return UnreadableCheckpointError(
            path, f'damaged: it is truncated or corrupt ({_first_line(err)})', _REWRITE)
    return UnreadableCheckpointError(
        path, f'not a PyTorch checkpoint lookhere-dense can read ({type(err).__name__}: '
        f'{_first_line(err)})', _NOT_TORCH)


def _file_problem(path: str) -> Optional[UnreadableCheckpointError]:
    """What is wrong with a local file before anything is unpickled: a folder, an empty
    file, a ``torch.save`` (zip) file whose end is missing, whose members fail their
    checksums (a truncated or corrupt download) or that has no ``data.pkl``.

    Raises:
        FileNotFoundError: naming the path, when it does not exist.
    """
    if os.path.isdir(path):
        return UnreadableCheckpointError(path, 'it is a folder, not a file')
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path!r}')
    if os.path.getsize(path) == 0:
        return UnreadableCheckpointError(path, 'empty file',
                                         'it is empty (0 bytes): ' + _REWRITE)
    try:
        with open(path, 'rb') as f:
            head = f.read(4)
    except OSError as err:
        return _unreadable(path, err)
    is_zip = zipfile.is_zipfile(path)
    if head == b'PK\x03\x04' and not is_zip:
        return UnreadableCheckpointError(
            path, 'damaged: it is truncated or corrupt (a torch.save zip archive whose end '
            'is missing)', _REWRITE)
    if not is_zip:
        return None
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        return UnreadableCheckpointError(
            path, f'damaged: it is truncated or corrupt (zip archive: {_first_line(err)})',
            _REWRITE)
    if bad is not None:
        return UnreadableCheckpointError(
            path, f'damaged: it is truncated or corrupt (checksum error in {bad!r})', _REWRITE)
    if not any(n.endswith('data.pkl') for n in names):
        return UnreadableCheckpointError(
            path, 'not a PyTorch checkpoint (a zip archive without data.pkl)', _NOT_TORCH)
    return None


def _not_weights(path: str, ckpt: Any) -> Optional[UnreadableCheckpointError]:
    if isinstance(ckpt, Mapping):
        return None
    return UnreadableCheckpointError(
        path, f'it does not hold a dict of weights (got {type(ckpt).__name__})')


def load_checkpoint_file(path: str) -> Dict[str, Any]:
    """THE checkpoint reader: load a file (``.pth``/``.pt``/``.safetensors``, or a URL) to
    CPU, tensors only (``weights_only``; mmengine's own checkpoint objects are allowed by
    :mod:`lookhere_dense.compat`).

    Raises:
        FileNotFoundError: naming the path, when it does not exist.
        UnreadableCheckpointError: ``checkpoint PATH cannot be read: PROBLEM`` for a
            folder, an empty, truncated or corrupt file (zip checksums are verified), a
            file that is no checkpoint or no dict, or one that holds arbitrary Python
            objects. Never advises ``weights_only=False``.
    """
    if '://' not in path:
        problem = _file_problem(path)
        if problem is not None:
            raise problem
    if path.endswith('.safetensors'):
        from safetensors.torch import load_file
        try:
            return load_file(path, device='cpu')
        except Exception as err:  # safetensors raises its own SafetensorError
            raise UnreadableCheckpointError(
                path, f'it is not a readable .safetensors file ({_first_line(err)})') from None
    from mmengine.runner.checkpoint import CheckpointLoader

    from . import compat
    compat.apply()
    try:
        ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu', logger='silent')
    except (FileNotFoundError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:
        raise _unreadable(path, err) from None
    problem = _not_weights(path, ckpt)
    if problem is not None:
        raise problem
    return dict(ckpt)


def checkpoint_problem(path: str) -> Optional[str]:
    """Why the local file ``path`` cannot be read as a checkpoint, in a few words (None when
    it can): what :func:`load_checkpoint_file` would refuse, found without raising and
    without loading the tensors of a ``torch.save`` (zip) file (they are memory-mapped).
    ``'file not found'`` for a missing file."""
    try:
        problem = _file_problem(path)
    except FileNotFoundError:
        return 'file not found'
    if problem is None and path.endswith('.safetensors'):
        try:
            load_checkpoint_file(path)
        except UnreadableCheckpointError as err:
            problem = err
    elif problem is None:
        from . import compat
        compat.apply()
        try:
            ckpt = torch.load(path, map_location='cpu', weights_only=True,
                              mmap=zipfile.is_zipfile(path))
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: B902 - every failure is a reason
            problem = _unreadable(path, err)
        else:
            problem = _not_weights(path, ckpt)
    return None if problem is None else problem.problem


def _record(value: Any) -> Dict[str, Any]:
    """:func:`decode_extra_state` raising :class:`CheckpointError`."""
    try:
        return decode_extra_state(value)
    except ValueError as err:
        raise CheckpointError(f'the checkpoint has {err}') from None


def _strip_prefix(sd: Mapping[str, Any], prefix: str) -> Dict[str, Any]:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


def _int_or_none(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def backbone_weights(ckpt: Mapping[str, Any], keep_pos_embed: bool = False) -> BackboneWeights:
    """Recognise a checkpoint's format and return its backbone weights in our keys.

    Args:
        ckpt: the loaded checkpoint (see :func:`load_checkpoint_file`).
        keep_pos_embed: keep a timm ``pos_embed`` (only a backbone with an absolute
            position embedding uses it). Default: False (dropped and listed).
    """
    lh_config = None
    num_heads = None
    if 'weights' in ckpt and 'config' in ckpt:
        fmt, sd, lh_config = 'official', dict(ckpt['weights']), dict(ckpt['config'])
    elif 'state_dict' in ckpt:
        sd = dict(ckpt['state_dict'])
        meta = ckpt.get('meta') or {}
        if isinstance(meta, Mapping):
            num_heads = _int_or_none(meta.get('num_heads'))  # save_backbone_checkpoint's
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
        raise CheckpointError('checkpoint has no ViT backbone weights (no "blocks.*" or '
                              f'"patch_embed.*" keys); first keys: {sorted(sd)[:8]}')
    pos_encoding = 'lookhere' if fmt == 'official' else None
    extra = sd.pop(EXTRA_STATE_KEY, None)  # LookHereViT.get_extra_state() of our own saves
    if extra is not None:
        extra = _record(extra)
        pos_encoding = extra.get('pos_encoding')
        if lh_config is None and extra.get('lh_config') is not None:
            lh_config = dict(extra['lh_config'])
        if num_heads is None:
            num_heads = _int_or_none(extra.get('num_heads'))
    out: Dict[str, Tensor] = {}
    dropped: List[str] = []
    for key, value in sd.items():
        m = _DEIT3_LAYERSCALE.match(key)
        if m:  # original DeiT-III repo: blocks.i.gamma_1 -> blocks.i.ls1.gamma
            key = f'{m.group(1)}.ls{m.group(2)}.gamma'
        if key.startswith('norm_pre.'):  # timm's norm before the blocks (CLIP ViTs)
            key = 'pre_ln.' + key[len('norm_pre.'):]
        if _CLASSIFIER.match(key) or (key == 'pos_embed' and not keep_pos_embed):
            dropped.append(key)
            continue
        out[key] = value
    return BackboneWeights(out, fmt, lh_config, sorted(dropped), pos_encoding, num_heads)


# ----------------------------------------------------------------------------------------
# Attention geometry
# ----------------------------------------------------------------------------------------
def _file_embed_dims(sd: Mapping[str, Tensor]) -> Optional[int]:
    for key in ('patch_embed.proj.weight', 'cls_token', 'blocks.0.norm1.weight'):
        value = sd.get(key)
        if isinstance(value, Tensor) and value.dim() >= 1:
            return int(value.shape[0] if key == 'patch_embed.proj.weight' else value.shape[-1])
    return None


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
            f'from the official code, whose models have {OFFICIAL_NUM_HEADS} heads')
    dims = _file_embed_dims(weights.state_dict)
    if dims is not None and dims % TIMM_HEAD_DIM == 0:
        return dims // TIMM_HEAD_DIM, (
            f'not recorded in this {weights.format} file; assumed from its {dims} channels '
            f'and the head width {TIMM_HEAD_DIM} of timm / DeiT-III ViTs')
    return None, (f'not recorded in this {weights.format} file, and its {dims} channels are '
                  f'no multiple of the usual head width {TIMM_HEAD_DIM}')


def check_num_heads(model_heads: int, file_heads: Optional[int], how: str, source: str,
                    declared: Optional[int] = None, key: str = HEADS_KEY) -> None:
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
    if declared is not None:
        if not isinstance(declared, int) or isinstance(declared, bool) or declared < 1:
            raise CheckpointError(f'{key} must be a positive int (the head count the '
                                  f'checkpoint was trained with), got {declared!r}')
        if how == 'recorded in the file' and file_heads != declared:
            raise CheckpointError(f'{key}={declared} but {source!r} records '
                                  f'{file_heads} heads; remove {key}')
        file_heads, how = declared, f'stated by {key}'
    if file_heads is None:
        raise CheckpointError(
            f'cannot verify that {source!r} was trained with num_heads={model_heads} (head '
            f'count {how}). The weights have the same shapes for any head count, but split '
            'into other heads they give wrong features. State the head count the file was '
            f'trained with: init_cfg=dict(type=\'Pretrained\', checkpoint=..., '
            f'{key}=N) (load_model_weights(..., {key}=N))')
    if file_heads != model_heads:
        extra = ''
        if file_heads not in (6, 12, 16):
            extra = (f'; LookHere head layouts need 6, 12 or 16 heads, so a {file_heads}-head '
                     "trunk fits only the other encodings (e.g. pos_encoding='rope2d')")
        raise CheckpointError(
            f'{source!r} has {file_heads} attention heads per block ({how}), but the model '
            f'has num_heads={model_heads}. The qkv weights have the same shapes for any head '
            'count, but split into other heads they give wrong features. Set '
            f'model.backbone.num_heads={file_heads}{extra}; if the file really has '
            f'{model_heads} heads, state it with {key}={model_heads}')


# ----------------------------------------------------------------------------------------
# Strict loading
# ----------------------------------------------------------------------------------------
def match_state_dict(model_sd: Mapping[str, Tensor], weights: Mapping[str, Tensor],
                     source: Optional[str] = None
                     ) -> Tuple[Dict[str, Tensor], List[str], List[str]]:
    """Compare checkpoint weights with a model's state_dict.

    Args:
        model_sd: the model's tensors.
        weights: the file's tensors (non-tensor entries are ignored here).
        source: the file, for the message. Default: None.

    Returns:
        ``(loadable, missing, unexpected)``.

    Raises:
        CheckpointError: listing every key whose shape differs (checkpoint vs model).
    """
    weights = {k: v for k, v in weights.items() if isinstance(v, Tensor)}
    mismatched = [f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(model_sd[k].shape)}'
                  for k, v in weights.items() if k in model_sd and v.shape != model_sd[k].shape]
    if mismatched:
        more = f'; ... and {len(mismatched) - 10} more' if len(mismatched) > 10 else ''
        where = f'{source!r} ' if source else ''
        raise CheckpointError(  # one line: the tools print it as one ``error:`` line
            f'checkpoint {where}does not fit the model ({len(mismatched)} tensors of the '
            'wrong shape; check embed_dims, patch_size, mlp_ratio, in_channels, num_classes'
            '): ' + '; '.join(mismatched[:10]) + more)
    loadable = {k: v for k, v in weights.items() if k in model_sd}
    missing = sorted(k for k in model_sd if k not in weights)
    unexpected = sorted(k for k in weights if k not in model_sd)
    return loadable, missing, unexpected


_ANY_BLOCK = re.compile(r'^(|.*\.)blocks\.(\d+)\.')


def _depths(keys) -> Dict[str, int]:
    """``{prefix: number of blocks}`` of the ``{prefix}blocks.{i}.*`` keys."""
    out: Dict[str, int] = {}
    for k in keys:
        m = _ANY_BLOCK.match(k)
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(2)) + 1)
    return out


def _listed(keys: List[str], n: int = 12) -> str:
    return str(keys[:n])[:-1] + (f', ... ({len(keys) - n} more)]' if len(keys) > n else ']')


#: ``(key pattern, what, option when the file lacks it, option when the file has it)``: a
#: flag of the architecture differs when one side has such a tensor and the other has none
_FLAG_HINTS = (
    (r'(^|\.)attn\.qkv\.bias$', 'qkv bias', 'qkv_bias=False', 'qkv_bias=True'),
    (r'(^|\.)patch_embed\.proj\.bias$', 'patch-embedding bias', 'patch_bias=False',
     'patch_bias=True'),
    (r'(^|\.)patch_embed\.norm\.weight$', 'patch-embedding norm', 'patch_norm=False',
     'patch_norm=True'),
    (r'(^|\.)pre_ln\.weight$', 'norm before the blocks', 'pre_norm=False', 'pre_norm=True'),
    (r'^(backbone\.)?norm\.weight$', 'final norm', 'final_norm=False', 'final_norm=True'),
    (r'(^|\.)cls_token$', 'CLS token', 'with_cls_token=False', 'with_cls_token=True'),
    (r'\.ls[12]\.gamma$', 'LayerScale', 'init_values=None', 'init_values to a number'),
)


def _key_hints(missing: List[str], unexpected: List[str], model_keys, file_keys) -> List[str]:
    """The usual reasons why keys of a ViT differ, found from the keys themselves."""
    hints = []
    in_file, in_model = _depths(file_keys), _depths(model_keys)
    for prefix in sorted(set(in_file) & set(in_model)):
        have, want = in_file[prefix], in_model[prefix]
        if have != want:
            hints.append(f'the file has {have} blocks ({prefix}blocks.0-{have - 1}), the '
                         f'model {want}: set num_layers={have}')

    def some(keys, pattern: str) -> bool:
        return any(re.search(pattern, k) for k in keys)

    for pattern, what, off, on in _FLAG_HINTS:
        if some(missing, pattern) and not some(file_keys, pattern):
            hints.append(f'no LayerScale in the file: set {off}' if what == 'LayerScale' else
                         f'the file has no {what}: set {off}')
        elif some(unexpected, pattern) and not some(model_keys, pattern):
            hints.append(f'the file has LayerScale (ls1/ls2.gamma): set {on}'
                         if what == 'LayerScale' else f'the file has a {what}: set {on}')
    if some(file_keys, r'^(backbone\.)?layers\.\d+\.'):
        hints.append("the file uses mmseg VisionTransformer's names (layers.*); LookHereViT "
                     'takes timm / official names (blocks.*): load the original timm / '
                     'DeiT-III / LookHere file instead of the mmseg conversion')
    if some(missing, r'(^|\.)_extra_state$'):
        hints.append('the file lacks the record a LookHereViT saves with its weights '
                     '(_extra_state: position encoding, LookHere config, head count); '
                     'strict=False loads the weights without it')
    if some(missing, r'(^|\.)pos_enc\.pos_embed$'):
        hints.append("the file has no position embedding for pos_encoding='abs'")
    if some(unexpected, _SLOPE_KEY) and not some(model_keys, _SLOPE_KEY):
        hints.append('the file has learned LookHere slopes (pos_enc.slopes.*): set '
                     'model.backbone.lh_config.learnable_slopes=True')
    return hints


#: the state_dict keys of learnable LookHere slopes (any prefix)
_SLOPE_KEY = r'(^|\.)pos_enc\.slopes\.'


def _slope_groups(module: nn.Module) -> List[Tuple[nn.Module, List[str]]]:
    """Every learnable-slopes module in ``module`` with the full keys of its parameters."""
    from .lookhere.slopes import LookHereSlopes
    return [(m, [f'{name}.{p}' if name else p for p, _ in m.named_parameters()])
            for name, m in module.named_modules() if isinstance(m, LookHereSlopes)]


def _slopes_from_config(module: nn.Module, missing: List[str]
                        ) -> Tuple[List[str], List[nn.Module]]:
    """The missing keys that are whole groups of learnable slopes (they start from the
    LookHere config), and their modules; a group missing only in part stays missing."""
    absent = set(missing)
    keys: List[str] = []
    modules = []
    for m, names in _slope_groups(module):
        if names and absent.issuperset(names):
            keys += names
            modules.append(m)
    return sorted(keys), modules


def load_state_dict_strict(module: nn.Module, state_dict: Mapping[str, Any], source: str,
                           strict: bool = True,
                           dropped: Optional[Mapping[str, str]] = None,
                           what: str = 'model',
                           verify: Optional[Callable[[], None]] = None,
                           require_extra_state: bool = False
                           ) -> Dict[str, List[str]]:
    """THE strict loader: load ``state_dict`` into ``module`` only if it fits.

    Shapes must agree always. With ``strict`` every tensor of ``module`` must be in the
    file and every tensor of the file in ``module``, except the keys of ``dropped``
    (dropped on purpose, with the reason) and the learnable LookHere slopes of a file
    that has none (each group all or nothing; they restart from the LookHere config,
    the file's when it records one). Records (``*._extra_state``, the uint8 tensor or the
    dict of older files) are not weights: they are never compared by shape, and are
    handed to the modules that have one (``LookHereViT.set_extra_state`` checks the
    position encoding, the LookHere config and the head count they record).

    Args:
        module: the model or backbone.
        state_dict: the file's entries in ``module``'s key names.
        source: the file (for messages).
        strict: refuse missing and unexpected keys. Default: True.
        dropped: ``{key: reason}`` of file keys to leave out on purpose. Default: none.
        what: what ``module`` is, for messages (``'model'``, ``'backbone'``).
            Default: ``'model'``.
        verify: called after the key checks, before anything is loaded (further checks,
            e.g. of the head count). Default: None.
        require_extra_state: with ``strict``, the records of ``module`` must be in the
            file too (a whole model's checkpoint; backbone weights from elsewhere have
            none). Default: False.

    Returns:
        ``{'missing': [...], 'unexpected': [...], 'dropped': [...], 'from_config': [...]}``
        (the first two are empty with ``strict``; ``from_config``: learnable-slope keys
        the file lacks).

    Raises:
        CheckpointError: a shape mismatch, or (``strict``) missing / unexpected keys, named
            with the likely cause.
    """
    dropped = dict(dropped or {})
    entries = {k: v for k, v in state_dict.items() if k not in dropped}
    everything = module.state_dict()
    own = {k: v for k, v in everything.items()
           if isinstance(v, Tensor) and not is_extra_state_key(k)}
    records = {k: v for k, v in entries.items() if is_extra_state_key(k) and k in everything}
    loadable, missing, unexpected = match_state_dict(
        own, {k: v for k, v in entries.items() if not is_extra_state_key(k)}, source)
    from_config, fresh_slopes = _slopes_from_config(module, missing)
    missing = [k for k in missing if k not in set(from_config)]
    if require_extra_state:
        missing += sorted(k for k in everything if is_extra_state_key(k) and k not in records)
    params = {name for name, _ in module.named_parameters()}
    broken = [k for k, v in loadable.items()
              if k in params and v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if broken:
        raise CheckpointError(f'checkpoint {source!r} holds NaN / inf values in '
                              f'{len(broken)} parameters: {_listed(broken)}; it was saved '
                              'after training diverged or is corrupt: use an earlier one')
    if strict and (missing or unexpected):
        hints = _key_hints(missing, unexpected, own.keys(), entries.keys())
        because = f' ({"; ".join(hints)})' if hints else ''
        if missing:
            msg = (f'checkpoint {source!r} lacks {what} parameters{because}: '
                   f'{_listed(missing)}')
            if unexpected:
                msg += f'; and it has tensors the {what} lacks: {_listed(unexpected)}'
        else:
            msg = (f'checkpoint {source!r} has tensors the {what} lacks{because}: '
                   f'{_listed(unexpected)}')
        advice = ('its config, or the same options with --cfg-options' if what == 'model'
                  else "pretrained weights meant for another architecture: "
                  "init_cfg=dict(type='Pretrained', ..., strict=False) loads what fits")
        raise CheckpointError(msg + f'. Build the {what} the file was trained with ({advice})')
    if verify is not None:
        verify()
    try:
        module.load_state_dict({**loadable, **records}, strict=False)
    except (ValueError, RuntimeError) as err:  # a set_extra_state refused the file's record
        raise CheckpointError(f'checkpoint {source!r}: {err}') from None
    for slopes in fresh_slopes:  # no learned values in the file: the config's slopes
        slopes.reset_parameters()
    return dict(missing=missing, unexpected=unexpected, dropped=sorted(dropped),
                from_config=from_config)


def _lookhere_backbones(model: nn.Module) -> List[Tuple[str, nn.Module]]:
    from .models.backbones.lookhere_vit import LookHereViT
    return [(name + '.' if name else '', m) for name, m in model.named_modules()
            if isinstance(m, LookHereViT)]


def load_model_weights(model: nn.Module, checkpoint: Union[str, Mapping[str, Any]],
                       strict: bool = True, checkpoint_num_heads: Optional[int] = None,
                       source: Optional[str] = None) -> Dict[str, Any]:
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
    sd = ckpt.get('state_dict', ckpt)
    if not isinstance(sd, Mapping):
        raise CheckpointError(f'{path!r}: "state_dict" is a {type(sd).__name__}, not a dict '
                              'of weights')
    sd = dict(sd)
    if sd and all(k.startswith('module.') for k in sd):  # saved from a DDP wrapper
        sd = _strip_prefix(sd, 'module.')
    own = model.state_dict()
    if not set(sd) & set(own):
        hint = ''
        if 'weights' in ckpt and 'config' in ckpt or any(
                k.startswith(('blocks.', 'patch_embed.')) for k in sd):
            hint = (' It looks like backbone-only weights (pretrained): use them as '
                    "model.backbone.init_cfg=dict(type='Pretrained', checkpoint=...) and "
                    'train, instead of testing with them.')
        raise CheckpointError(f'checkpoint {path!r} has none of the model\'s keys (file: '
                              f'{_listed(sorted(sd), 6)}, model: '
                              f'{_listed(sorted(own), 6)}).{hint}')

    def verify_heads() -> None:
        for prefix, backbone in _lookhere_backbones(model):
            state = sd.get(prefix + EXTRA_STATE_KEY)
            part = BackboneWeights(_strip_prefix(sd, prefix), 'mmengine')
            if state is not None:
                state = _record(state)
                part.pos_encoding = state.get('pos_encoding')
                part.num_heads = _int_or_none(state.get('num_heads'))
            heads, how = file_num_heads(part)
            check_num_heads(backbone.num_heads, heads, how, path, checkpoint_num_heads)

    load_state_dict_strict(model, sd, path, strict=strict, verify=verify_heads,
                           require_extra_state=strict)
    return dict(ckpt)


def save_backbone_checkpoint(path: str, state_dict: Mapping[str, Tensor],
                             lh_config: Optional[Mapping[str, Any]], source: str,
                             num_heads: Optional[int] = None) -> None:
    """Write backbone weights as ``{'state_dict': ..., 'meta': {...}}``.

    The file works with ``init_cfg=dict(type='Pretrained', checkpoint=path)`` of
    ``LookHereViT`` (which also takes the stored LookHere config from ``meta``). Only
    weights are written: a module's record (``_extra_state``) is replaced by ``lh_config``
    and the head count.

    Args:
        num_heads: the head count of the weights, written to ``meta['num_heads']`` so
            loading can check it; None: taken from the ``_extra_state`` of a saved
            ``LookHereViT`` in ``state_dict``, else not recorded. Default: None.
    """
    extra = state_dict.get(EXTRA_STATE_KEY)
    if num_heads is None and extra is not None:
        num_heads = _int_or_none(_record(extra).get('num_heads'))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    meta = {'lookhere_config': None if lh_config is None else dict(lh_config),
            'num_heads': num_heads, 'source': source, 'converted_by': __name__}
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()
               if isinstance(v, Tensor) and not is_extra_state_key(k)}
    torch.save({'state_dict': tensors, 'meta': meta}, path)
