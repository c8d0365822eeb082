"""``LookHereViT``: a plain ViT whose position information is the LookHere bias.

A drop-in for mmseg's ``VisionTransformer`` (same argument names where the meaning is the
same, same output contract) with the architecture of the official LookHere model
(DeiT-III: pre-norm blocks with LayerScale, CLS token, final norm, patch-embedding conv
with bias, no absolute position embedding), so official, timm and DeiT-III weights load
by name. Optional ViTDet-style window attention per block.

For controlled comparisons ``pos_encoding=`` swaps LookHere for a baseline (learned
absolute embedding, 2D-RoPE, 2D-ALiBi, nothing) in the otherwise identical trunk; see
:mod:`lookhere_dense.models.pos_encoding`.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import build_activation_layer, build_norm_layer
from mmcv.cnn.bricks.drop import DropPath
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ...checkpoint import (EXTRA_STATE_KEY, HEADS_KEY, CheckpointError, backbone_weights,
                           check_num_heads, decode_extra_state, encode_extra_state,
                           file_num_heads, load_checkpoint_file, load_state_dict_strict)
from ...lookhere import LookHereAttentionEngine, LookHereConfig, resolve_lh_config
from ...lookhere.bias import OFFICIAL_KEYS
from ..pos_encoding import (AbsolutePositionEncoding,
                            PositionEncoding, build_position_encoding, isolated_rng,
                            parse_pos_encoding)
from ..registry import register_model

__all__ = ['LookHereViT', 'LookHerePatchEmbed', 'LookHereBlock', 'LookHereSelfAttention']

#: the keys ``init_cfg=dict(type='Pretrained', ...)`` takes (mmengine's and ours)
_PRETRAINED_KEYS = ('type', 'checkpoint', 'strict', 'prefix', 'map_location', HEADS_KEY)
_warned: set = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, stacklevel=3)


def _autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (then it casts the inputs itself)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # pragma: no cover - torch < 2.4: CUDA autocast only
        return torch.is_autocast_enabled()


class LookHerePatchEmbed(nn.Module):
    """Non-overlapping patch embedding (a strided conv), padding inputs to a patch multiple.

    Args:
        patch_size: patch side. Default: 16.
        in_channels: input channels. Default: 3.
        embed_dims: output channels. Default: 768.
        bias: conv bias (the official model has one). Default: True.
        padding: ``'corner'`` pads bottom/right, ``'same'`` pads evenly, like mmseg's
            ``AdaptivePadding``. Default: ``'corner'``.
        norm_cfg: optional norm after the projection. Default: None.
    """

    def __init__(self, patch_size: int = 16, in_channels: int = 3, embed_dims: int = 768,
                 bias: bool = True, padding: str = 'corner', norm_cfg: Optional[dict] = None):
        super().__init__()
        if padding not in ('corner', 'same'):
            raise ValueError(f"patch_pad must be 'corner' or 'same', got {padding!r}")
        self.patch_size = patch_size
        self.padding = padding
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, patch_size, bias=bias)
        self.norm = build_norm_layer(norm_cfg, embed_dims)[1] if norm_cfg else None

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """``(B, C, H, W)`` -> tokens ``(B, h*w, D)`` and the grid ``(h, w)``.

        Any memory format (``torch.channels_last`` too) gives the same result; a batch of
        0 images gives empty outputs.

        Raises:
            TypeError: not a tensor.
            ValueError: not 4-D, not a float dtype, the channel axis last
                ``(B, H, W, C)``, another channel count, or smaller than one patch.
        """
        if not isinstance(x, Tensor):
            raise TypeError(f'LookHereViT expects a tensor of images (B, C, H, W), got '
                            f'{type(x).__name__}')
        if x.dim() != 4:
            raise ValueError(f'LookHereViT expects images of shape (B, C, H, W), got {tuple(x.shape)}')
        if not x.is_floating_point():
            raise ValueError(f'LookHereViT expects float images (B, C, H, W), got dtype '
                             f'{x.dtype}: convert and normalise them first (in mmseg / mmdet '
                             "the model's data_preprocessor does), e.g. x.float()")
        c = self.proj.in_channels
        if x.shape[1] != c:
            if x.shape[-1] == c:
                raise ValueError(f'LookHereViT expects images of shape (B, C, H, W); got '
                                 f'{tuple(x.shape)}, which looks like (B, H, W, C) with the '
                                 f'channel axis last: use x.permute(0, 3, 1, 2)')
            raise ValueError(f'LookHereViT was built for {c} input channels, got {x.shape[1]}')
        h, w = x.shape[-2:]
        p = self.patch_size
        if h < p or w < p:
            raise ValueError(f'image of {h}x{w} px is smaller than one {p}x{p} patch')
        weight = self.proj.weight
        if x.dtype != weight.dtype and not _autocast_on(x.device.type):
            raise ValueError(f'LookHereViT weights are {weight.dtype} but the images are '
                             f'{x.dtype}: cast one to the other (e.g. x.to({weight.dtype}) '
                             'or model.to(x.dtype)), or run under torch.autocast')
        pad_h, pad_w = (-h) % p, (-w) % p
        if pad_h or pad_w:
            if self.padding == 'corner':
                x = F.pad(x, (0, pad_w, 0, pad_h))
            else:
                x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        x = self.proj(x)
        grid = (x.shape[2], x.shape[3])
        x = x.flatten(2).transpose(1, 2)
        if self.norm is not None:
            x = self.norm(x)
        return x, grid


class LayerScale(nn.Module):
    """Per-channel learnable scale (DeiT-III / CaiT); parameter ``gamma``."""

    def __init__(self, dim: int, init_values: float = 1e-4):
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Mlp(nn.Module):
    """Two-layer MLP with timm's parameter names (``fc1``, ``fc2``)."""

    def __init__(self, dim: int, hidden: int, act_cfg: dict, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class LookHereSelfAttention(nn.Module):
    """Multi-head self-attention that takes its position information from the backbone's
    :class:`~lookhere_dense.models.pos_encoding.PositionEncoding`, handed in every forward
    (called as ``pos_enc(q, k, v, layer, grid, cls_token, dropout_p)`` and
    ``pos_enc.window_attention(...)``, plus ``tokens=`` the input for encodings with
    ``uses_tokens``; a bare LookHere engine has the same calls).

    Args:
        dim: token channels.
        num_heads: heads.
        qkv_bias: bias of the qkv projection. Default: True.
        attn_drop: attention dropout. Default: 0.
        proj_drop: dropout after the output projection. Default: 0.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = attn_drop
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, pos_enc: Union[PositionEncoding, LookHereAttentionEngine],
                layer: int, grid: Tuple[int, int], cls_token: bool,
                window_size: int = 0, q_scale: float = 1.0) -> Tensor:
        """``(B, T, C)`` -> ``(B, T, C)``; ``window_size > 0`` selects window attention.

        ``q_scale`` multiplies the queries before the position encoding is asked, i.e. the
        content logits ``q . k / sqrt(d)`` of every encoding (RoPE rotates linearly, so
        its logits scale alike); an additive LookHere / 2D-ALiBi bias is not scaled. The
        backbone's ``log_n_scaling`` sets it (see :meth:`LookHereViT.attention_scale`).
        """
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.num_heads, self.head_dim).permute(
            2, 0, 3, 1, 4).unbind(0)
        if q_scale != 1.0:
            q = q * q_scale
        p = self.attn_drop if self.training else 0.0
        extra = {'tokens': x} if getattr(pos_enc, 'uses_tokens', False) else {}  # PaPE
        if window_size:
            x = pos_enc.window_attention(q, k, v, layer, grid, window_size, cls_token, p,
                                         **extra)
        else:
            x = pos_enc(q, k, v, layer, grid, cls_token, p, **extra)
        x = x.transpose(1, 2).reshape(b, t, c)
        return self.proj_drop(self.proj(x))


class LookHereBlock(nn.Module):
    """Pre-norm transformer block with LayerScale (DeiT-III), official parameter names.

    Args:
        dim, num_heads, mlp_ratio, qkv_bias: the usual.
        drop: dropout after the attention projection and in the MLP. Default: 0.
        attn_drop: attention dropout. Default: 0.
        drop_path: stochastic depth. Default: 0.
        init_values: LayerScale init; None disables LayerScale. Default: 1e-4.
        norm_cfg, act_cfg: mmcv configs. Default: LN, GELU.
        window_size: 0 for global attention, else ViTDet window size (in patches).
            Default: 0.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 init_values: Optional[float] = 1e-4, norm_cfg: dict = dict(type='LN'),
                 act_cfg: dict = dict(type='GELU'), window_size: int = 0):
        super().__init__()
        self.window_size = window_size
        self.norm1 = build_norm_layer(norm_cfg, dim)[1]
        self.attn = LookHereSelfAttention(dim, num_heads, qkv_bias, attn_drop, drop)
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.norm2 = build_norm_layer(norm_cfg, dim)[1]
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_cfg, drop)
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, pos_enc: Union[PositionEncoding, LookHereAttentionEngine],
                layer: int, grid: Tuple[int, int], cls_token: bool,
                q_scale: float = 1.0) -> Tensor:
        """``(B, T, C)`` -> ``(B, T, C)``; ``pos_enc`` and ``q_scale`` as in
        :class:`LookHereSelfAttention`."""
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x), pos_enc, layer, grid,
                                                  cls_token, self.window_size, q_scale)))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int = 1) -> None:
    if not _is_int(value) or value < minimum:
        what = 'a positive int' if minimum == 1 else f'>= {minimum} (an int)'
        raise ValueError(f'LookHereViT: {name} must be {what}, got {value!r}')


def _check_rate(name: str, value: Any) -> None:
    if not _is_number(value) or not 0 <= value < 1:
        raise ValueError(f'LookHereViT: {name} must be a probability in [0, 1), got {value!r}')


def _check_finite(name: str, value: Any, minimum: Optional[float] = None,
                  strict: bool = False) -> None:
    """``value`` is a finite number (``> minimum`` with ``strict``, else ``>= minimum``)."""
    ok = _is_number(value) and math.isfinite(value)
    if ok and minimum is not None:
        ok = value > minimum if strict else value >= minimum
    if not ok:
        bound = '' if minimum is None else f' {">" if strict else ">="} {minimum:g}'
        raise ValueError(f'LookHereViT: {name} must be a finite number{bound}, got {value!r}')


def image_size_pair(img_size: Any) -> Tuple[int, int]:
    """``img_size`` as ``(H, W)``: an int, or a sequence of one or two positive ints (like
    mmseg's ``VisionTransformer``).

    Raises:
        ValueError: naming the value.
    """
    given = img_size
    if _is_int(img_size):
        img_size = (img_size, img_size)
    elif isinstance(img_size, (list, tuple)) and len(img_size) == 1:
        img_size = (img_size[0], img_size[0])
    if (not isinstance(img_size, (list, tuple)) or len(img_size) != 2
            or not all(_is_int(s) and s >= 1 for s in img_size)):
        raise ValueError('LookHereViT: img_size must be a positive int or (H, W) with two '
                         f'positive ints, got {given!r}')
    return int(img_size[0]), int(img_size[1])


def _check_arguments(args: Mapping[str, Any]) -> None:
    """Validate the numeric arguments of :class:`LookHereViT`, naming key and value."""
    for name in ('patch_size', 'in_channels', 'embed_dims', 'num_layers', 'num_heads'):
        _check_int(name, args[name])
    for name in ('drop_rate', 'attn_drop_rate', 'drop_path_rate'):
        _check_rate(name, args[name])
    _check_finite('mlp_ratio', args['mlp_ratio'], 0, strict=True)
    if int(args['embed_dims'] * args['mlp_ratio']) < 1:
        raise ValueError(f"LookHereViT: mlp_ratio={args['mlp_ratio']!r} gives an MLP of "
                         f"{int(args['embed_dims'] * args['mlp_ratio'])} channels")
    if args['init_values'] is not None:
        _check_finite('init_values', args['init_values'])
    _check_int('window_size', args['window_size'], minimum=0)
    if args['attn_block_size'] is not None:
        _check_int('attn_block_size', args['attn_block_size'], minimum=0)
    mb = args['max_dense_bias_mb']
    if not _is_number(mb) or not mb >= 0:  # inf: no limit
        raise ValueError(f'LookHereViT: max_dense_bias_mb must be a number >= 0, got {mb!r}')
    for name in ('window_block_indexes', 'global_attn_indexes'):
        if args[name] is not None:
            if not isinstance(args[name], (list, tuple)) or not all(
                    _is_int(i) for i in args[name]):
                raise ValueError(f'LookHereViT: {name} must be a list of block indexes '
                                 f'(ints), got {args[name]!r}')
    out_indices = args['out_indices']
    if isinstance(out_indices, (list, tuple)):
        if not out_indices or not all(_is_int(i) for i in out_indices):
            raise ValueError('LookHereViT: out_indices must be an int or a non-empty list of '
                             f'ints, got {out_indices!r}')
    elif not _is_int(out_indices):
        raise TypeError('out_indices must be an int, list or tuple')


def _window_blocks(num_layers: int, window_size: int,
                   window_block_indexes: Optional[Sequence[int]],
                   global_attn_indexes: Optional[Sequence[int]]) -> List[int]:
    """Indexes of windowed blocks from either naming (detectron2/mmdet or SAM)."""
    if not window_size:
        if window_block_indexes or global_attn_indexes:
            raise ValueError('window_block_indexes / global_attn_indexes need window_size > 0')
        return []
    if window_size < 1:
        raise ValueError(f'window_size must be >= 0, got {window_size}')
    if window_block_indexes is not None and global_attn_indexes is not None:
        windowed = sorted(set(window_block_indexes))
        if set(windowed) & set(global_attn_indexes) or \
                set(windowed) | set(global_attn_indexes) != set(range(num_layers)):
            raise ValueError('window_block_indexes and global_attn_indexes must partition '
                             f'range({num_layers}); got {list(window_block_indexes)} and '
                             f'{list(global_attn_indexes)}')
    elif window_block_indexes is not None:
        windowed = sorted(set(window_block_indexes))
    else:
        if global_attn_indexes is None:  # ViTDet: the last block of each quarter is global
            global_attn_indexes = sorted({max((q + 1) * num_layers // 4 - 1, 0)
                                          for q in range(4)})
            if len(global_attn_indexes) == num_layers:
                raise ValueError(f'window_size={window_size} with {num_layers} layers: the '
                                 'default (the last block of each quarter is global) leaves no '
                                 'windowed block; give window_block_indexes or '
                                 'global_attn_indexes')
        windowed = [i for i in range(num_layers) if i not in set(global_attn_indexes)]
    bad = [i for i in windowed if not 0 <= i < num_layers]
    bad += [i for i in (global_attn_indexes or []) if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f'block indexes {bad} out of range for num_layers={num_layers}')
    return windowed


@register_model()
class LookHereViT(BaseModule):
    """Plain ViT backbone with LookHere directed-attention position encoding.

    Arguments shared with mmseg's ``VisionTransformer`` keep their meaning; defaults that
    differ follow the official LookHere (DeiT-III) architecture so official weights fit:
    ``patch_bias=True`` and ``final_norm=True``.

    Args:
        img_size (int | tuple): nominal training size; only recorded, except with
            ``pos_encoding='abs'``, whose embedding has the grid ``img_size / patch_size``.
            Default: 224.
        patch_size (int): patch side. Default: 16.
        patch_pad (str): ``'corner'`` or ``'same'`` padding of inputs that are not a patch
            multiple. Default: ``'corner'``.
        in_channels (int): input channels. Default: 3.
        embed_dims (int): token channels. Default: 768.
        num_layers (int): blocks. Default: 12.
        num_heads (int): heads per block. Default: 12.
        mlp_ratio (float): MLP hidden / embed dims. Default: 4.
        out_origin (bool): also output the patch embeddings (before the blocks) first.
            Default: False.
        out_indices (int | Sequence[int]): blocks whose outputs are returned (-1: last).
            Default: -1.
        qkv_bias (bool): Default: True.
        drop_rate (float): dropout after patch embedding, attention projection and MLP.
            Default: 0.
        attn_drop_rate (float): attention dropout. Default: 0.
        drop_path_rate (float): stochastic depth, linearly increasing over blocks.
            Default: 0.
        with_cls_token (bool): prepend a CLS token (bias 0 to and from it). Default: True.
        output_cls_token (bool): outputs become ``[feature_map, cls]``; needs
            ``with_cls_token``. Default: False.
        norm_cfg (dict): Default: ``dict(type='LN')`` (eps 1e-5, as the official model).
        act_cfg (dict): Default: ``dict(type='GELU')``.
        patch_norm (bool): norm after the patch projection. Default: False.
        patch_bias (bool): bias of the patch projection. Default: True.
        pre_norm (bool): norm before the first block. Default: False.
        final_norm (bool): norm after the last block. Default: True.
        interpolate_mode (str, optional): how ``pos_encoding='abs'`` resamples its
            embedding to other grids (default ``'bicubic'``, as mmseg); ignored, with a
            warning, by the other encodings.
        num_fcs (int): MLP layers; only 2 is supported. Default: 2.
        norm_eval (bool): keep norm layers in eval mode while training. Default: False.
        with_cp (bool): activation checkpointing per block. Default: False.
        frozen_exclude (list[str]): parameters whose names contain one of these stay
            trainable, all others are frozen; ``['all']`` freezes nothing.
            Default: ``['all']``.
        pretrained (str, optional): deprecated, use ``init_cfg``. Default: None.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads
            official LookHere, timm / DeiT-III or lookhere-dense weights (see
            :mod:`lookhere_dense.checkpoint`). Default: None.
        lh_config (dict | str, optional): LookHere config with the official keys
            (``head_directions``, ``global_slope``, ``layer_slopes``, ``distance``,
            ``fill_with``, plus ``bias_rounding`` and ``learnable_slopes``: the slopes
            become parameters ``pos_enc.slopes.*`` initialised to the config's, see
            :mod:`lookhere_dense.lookhere.slopes`); overrides ``preset`` entries.
            Official and fixed-slope checkpoints load into a learnable model (their
            config's slopes become the initial values); learned slopes load only into
            a learnable model. Default: None.
        preset (str, optional): ``'lh180'``, ``'lh90'`` or ``'lh45'``. With neither
            ``preset`` nor ``lh_config``: ``lh180``, or the config stored in the
            pretrained checkpoint. Default: None.
        init_values (float, optional): LayerScale init; None: no LayerScale (e.g. for
            timm ViT weights without it). Default: 1e-4.
        attn_backend (str): ``'auto'``, ``'reference'``, ``'sdpa'``, ``'chunked'`` or
            ``'flex'`` (see :mod:`lookhere_dense.lookhere.attention`). Default: ``'auto'``.
        attn_block_size (int, optional): query rows per block of the chunked backend;
            None: sized automatically (the bias block never exceeds the MLP activation).
            Default: None.
        max_dense_bias_mb (float): ``auto`` caches dense biases of a grid while all
            layers' fit in this budget. Default: 1024.
        window_size (int): ViTDet window size in patches; 0 disables windows. Default: 0.
        window_block_indexes (Sequence[int], optional): windowed blocks (detectron2 /
            mmdet naming). Default: None.
        global_attn_indexes (Sequence[int], optional): global blocks (SAM naming); the
            others are windowed. With ``window_size`` and neither list, the last block of
            each quarter is global (ViTDet). Default: None.
        pos_encoding (str | dict): the position encoding, by name or as
            ``dict(type=NAME, **options)``: ``'lookhere'`` (uses ``preset`` /
            ``lh_config``; ``'lookhere:lh45'`` is short for ``preset='lh45'``),
            ``'abs'`` (learned ``pos_enc.pos_embed``; option ``init_std``),
            ``'rope2d'`` / ``'rope2d_mixed'`` (option ``theta``), ``'rope_dinov3'``
            (DINOv3's RoPE via timm; options ``theta``, ``normalize_coords``,
            ``shift_coords``, ``jitter_coords``, ``rescale_coords``), ``'pape'`` (PaPE;
            option ``parabolas``), ``'alibi2d'`` (optional
            ``lh_config`` dict with ``'none'`` heads only, e.g. other slopes) or
            ``'none'``. Everything else (blocks, parameters, their initialisation for a
            given seed) is the same for all. Official LookHere checkpoints load only into
            ``'lookhere'``; timm / DeiT-III ``pos_embed`` is kept (resampled) by ``'abs'``
            and dropped by the others. See :mod:`lookhere_dense.models.pos_encoding`.
            Default: ``'lookhere'``.
        log_n_scaling (bool): a test-time extrapolation aid: in eval mode, multiply every
            block's queries by ``log(N) / log(N_train)``, ``N`` the keys a query attends
            to (patches + CLS; for a windowed block the patches of one window) and
            ``N_train`` the same count on the training grid ``img_size / patch_size``
            (see :meth:`attention_scale`). Exactly 1 at the training grid; training (the
            module in train mode) is never scaled. Applied in one place for every
            ``pos_encoding`` (:class:`LookHereSelfAttention`): the content logits are
            sharpened as the number of keys grows, an additive LookHere / 2D-ALiBi bias is
            left as trained (its distance penalty already grows with the grid).
            Default: False.

    Attributes:
        pos_enc (PositionEncoding): the one owner of the position encoding (for
            ``'lookhere'`` / ``'alibi2d'``: of the LookHere engine, ``pos_enc.engine``),
            handed to every block in each forward. ``pos_encoding``, ``lh_config`` and
            ``lookhere`` are read from it.
    """

    def __init__(self,
                 img_size: Union[int, Tuple[int, int]] = 224,
                 patch_size: int = 16,
                 patch_pad: str = 'corner',
                 in_channels: int = 3,
                 embed_dims: int = 768,
                 num_layers: int = 12,
                 num_heads: int = 12,
                 mlp_ratio: float = 4,
                 out_origin: bool = False,
                 out_indices: Union[int, Sequence[int]] = -1,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 with_cls_token: bool = True,
                 output_cls_token: bool = False,
                 norm_cfg: dict = dict(type='LN'),
                 act_cfg: dict = dict(type='GELU'),
                 patch_norm: bool = False,
                 patch_bias: bool = True,
                 pre_norm: bool = False,
                 final_norm: bool = True,
                 interpolate_mode: Optional[str] = None,
                 num_fcs: int = 2,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 frozen_exclude: Sequence[str] = ('all',),
                 pretrained: Optional[str] = None,
                 init_cfg: Optional[Union[dict, List[dict]]] = None,
                 lh_config: Union[None, str, Mapping[str, Any], LookHereConfig] = None,
                 preset: Optional[str] = None,
                 init_values: Optional[float] = 1e-4,
                 attn_backend: str = 'auto',
                 attn_block_size: Optional[int] = None,
                 max_dense_bias_mb: float = 1024,
                 window_size: int = 0,
                 window_block_indexes: Optional[Sequence[int]] = None,
                 global_attn_indexes: Optional[Sequence[int]] = None,
                 pos_encoding: Union[str, Mapping[str, Any]] = 'lookhere',
                 log_n_scaling: bool = False):
        if init_cfg is not None and pretrained is not None:
            raise ValueError('init_cfg and pretrained cannot be set at the same time')
        if isinstance(pretrained, str):
            warnings.warn('pretrained is deprecated, use init_cfg=dict(type="Pretrained", '
                          'checkpoint=...)', DeprecationWarning)
            init_cfg = dict(type='Pretrained', checkpoint=pretrained)
        elif pretrained is not None:
            raise TypeError('pretrained must be a str or None')
        super().__init__(init_cfg=init_cfg)
        _check_arguments(locals())
        img_size = image_size_pair(img_size)
        if isinstance(frozen_exclude, str):  # one name, not its letters
            frozen_exclude = [frozen_exclude]

        spec = parse_pos_encoding(pos_encoding, lh_config, preset)
        if interpolate_mode is not None and spec.name != 'abs':
            _warn_once('interpolate_mode', 'LookHereViT ignores interpolate_mode: it has no '
                       'absolute position embedding to resize')
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        if num_fcs != 2:
            raise ValueError(f'LookHereViT supports num_fcs=2 only (got {num_fcs})')
        if output_cls_token and not with_cls_token:
            raise ValueError('output_cls_token=True needs with_cls_token=True')
        self.img_size = img_size
        self.patch_size = patch_size
        self.embed_dims = embed_dims
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.with_cls_token = with_cls_token
        self.output_cls_token = output_cls_token
        self.out_origin = out_origin
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        self.frozen_exclude = list(frozen_exclude)

        if isinstance(out_indices, int):
            out_indices = [num_layers - 1 if out_indices == -1 else out_indices]
        elif not isinstance(out_indices, (list, tuple)):
            raise TypeError('out_indices must be an int, list or tuple')
        self.out_indices = [num_layers + i if i < 0 else i for i in out_indices]
        bad = [i for i in self.out_indices if not 0 <= i < num_layers]
        if bad:
            raise ValueError(f'out_indices {bad} out of range for num_layers={num_layers}')

        # LookHere: explicit config (or preset) vs one to be taken from the checkpoint
        self._lh_explicit = spec.explicit
        self.attn_backend = attn_backend
        grid = tuple(math.ceil(s / patch_size) for s in self.img_size)
        self.train_grid: Tuple[int, int] = grid
        self.log_n_scaling = bool(log_n_scaling)
        if self.log_n_scaling and grid[0] * grid[1] + int(with_cls_token) < 2:
            raise ValueError(f'log_n_scaling needs at least 2 tokens on the training grid '
                             f'(img_size {self.img_size} / patch_size {patch_size} gives '
                             f'{grid[0]}x{grid[1]})')
        with isolated_rng():  # the trunk draws the same init numbers whatever the encoding
            self.pos_enc: PositionEncoding = build_position_encoding(
                spec, embed_dims=embed_dims, num_heads=num_heads, depth=num_layers,
                grid_size=grid, interpolate_mode=interpolate_mode or 'bicubic',
                attn_backend=attn_backend, attn_block_size=attn_block_size,
                max_dense_bias_mb=max_dense_bias_mb)

        self.window_size = int(window_size)
        self.window_block_indexes = _window_blocks(num_layers, self.window_size,
                                                   window_block_indexes, global_attn_indexes)

        self.patch_embed = LookHerePatchEmbed(patch_size, in_channels, embed_dims, patch_bias,
                                              patch_pad, norm_cfg if patch_norm else None)
        if with_cls_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.drop_after_pos = nn.Dropout(drop_rate)
        self.pre_ln = build_norm_layer(norm_cfg, embed_dims)[1] if pre_norm else None
        dpr = torch.linspace(0, drop_path_rate, num_layers).tolist()
        self.blocks = nn.ModuleList([
            LookHereBlock(embed_dims, num_heads, mlp_ratio, qkv_bias, drop_rate,
                          attn_drop_rate, dpr[i], init_values, norm_cfg, act_cfg,
                          self.window_size if i in self.window_block_indexes else 0)
            for i in range(num_layers)])
        self.norm = build_norm_layer(norm_cfg, embed_dims)[1] if final_norm else None
        self._freeze()

    # -- read from the one owner, pos_enc ------------------------------------------------
    @property
    def pos_encoding(self) -> str:
        """The ``pos_encoding`` name (``pos_enc.name``), e.g. ``'lookhere'``."""
        return self.pos_enc.name

    @property
    def lh_config(self) -> Optional[LookHereConfig]:
        """The active LookHere config (``pos_enc.lh_config``); None for encodings without
        a LookHere bias."""
        return self.pos_enc.lh_config

    @property
    def lookhere(self) -> Optional[LookHereAttentionEngine]:
        """The LookHere engine, read from its one owner ``pos_enc`` (None for encodings
        without one). Read-only: replace ``model.pos_enc`` to change the encoding."""
        return getattr(self.pos_enc, 'engine', None)

    # -- weights ---------------------------------------------------------------------------
    def init_weights(self) -> None:
        """Official (DeiT-III) init, or load the ``Pretrained`` checkpoint of ``init_cfg``
        (keys ``checkpoint``, ``strict``, and ``checkpoint_num_heads`` for files that do not
        record their head count; see :meth:`load_pretrained`)."""
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            unknown = sorted(set(cfg) - set(_PRETRAINED_KEYS))
            if unknown or not cfg.get('checkpoint'):
                raise ValueError(f'LookHereViT init_cfg {dict(cfg)}: '
                                 + (f'unknown keys {unknown}; allowed: '
                                    f'{list(_PRETRAINED_KEYS)}' if unknown else
                                    'needs checkpoint=PATH'))
            self.load_pretrained(cfg['checkpoint'], strict=cfg.get('strict', True),
                                 checkpoint_num_heads=cfg.get(HEADS_KEY))
            self._is_init = True
            return
        if cfg is not None:
            super().init_weights()
            return
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if self.with_cls_token:
            trunc_normal_(self.cls_token, std=.02)
        with isolated_rng(next(self.parameters()).device):
            self.pos_enc.reset_parameters()

    def load_pretrained(self, path: str, strict: bool = True,
                        checkpoint_num_heads: Optional[int] = None) -> Dict[str, List[str]]:
        """Load official LookHere / timm / DeiT-III / lookhere-dense weights from ``path``.

        The LookHere config stored in official and lookhere-dense files replaces the
        default one; it must equal an explicitly given ``lh_config``/``preset``. Such files
        load only into ``pos_encoding='lookhere'``. With ``pos_encoding='abs'`` a file's
        ``pos_embed`` (timm / DeiT-III) or ``pos_enc.pos_embed`` (ours) is kept, resampled to
        this backbone's grid, and a CLS entry (timm ViTs) is added to ``cls_token`` (the CLS
        token has no position embedding here, so its input stays the same); the other
        encodings drop it.

        The file must fit (:func:`~lookhere_dense.checkpoint.load_state_dict_strict`):
        tensor shapes always; with ``strict`` also every key both ways, except what is
        dropped on purpose (classifier head, ``pos_embed`` of non-``abs`` encodings, the
        final ``norm`` with ``final_norm=False``, ``cls_token`` with
        ``with_cls_token=False``, another encoding's ``pos_enc.*``). The file's head count
        must equal ``num_heads`` (:func:`~lookhere_dense.checkpoint.file_num_heads`:
        recorded in lookhere-dense files, 12 for official LookHere files, ``embed_dims/64``
        for timm / DeiT-III files; files it cannot tell need ``checkpoint_num_heads``).

        Args:
            path: checkpoint file.
            strict: refuse files that lack parameters of the backbone or have parameters
                it lacks. Default: True.
            checkpoint_num_heads: the head count the file was trained with, for files
                that do not record it. Default: None.

        Returns:
            ``{'missing': [...], 'unexpected': [...], 'dropped': [...]}``.

        Raises:
            FileNotFoundError, CheckpointError: naming the file and what does not fit.
        """
        is_abs = isinstance(self.pos_enc, AbsolutePositionEncoding)
        weights = backbone_weights(load_checkpoint_file(path), keep_pos_embed=is_abs)
        if weights.pos_encoding == 'alibi2d' and self.pos_encoding != 'alibi2d':
            weights.lh_config = None  # 2D-ALiBi slopes: meaningless for another encoding
        if weights.lh_config is not None:
            source = weights.pos_encoding or 'lookhere'
            if self.pos_encoding != source:
                raise CheckpointError(f'{path!r} ({weights.format} format) holds a {source!r} '
                                      f'model (config {weights.lh_config}); it loads only into '
                                      f'pos_encoding={source!r}, not {self.pos_encoding!r}')
        pos_note = ''
        if is_abs:
            stored = [k for k in ('pos_embed', 'pos_enc.pos_embed') if k in weights.state_dict]
            if stored:
                sd = weights.state_dict
                pos_embed, cls_entry, pos_note = self.pos_enc.adapt_checkpoint_embedding(
                    sd.pop(stored[0]))
                sd['pos_enc.pos_embed'] = pos_embed
                if cls_entry is not None and 'cls_token' in sd:
                    sd['cls_token'] = sd['cls_token'] + cls_entry
                    pos_note += ', added to cls_token'
                pos_note = f'; {stored[0]} -> pos_enc.pos_embed: {pos_note}'
        dropped = self._unused_checkpoint_keys(weights.state_dict, weights.pos_encoding)

        def verify() -> None:  # after the key checks, before anything is loaded
            heads, how = file_num_heads(weights)
            check_num_heads(self.num_heads, heads, how, path, checkpoint_num_heads)
            if weights.lh_config is not None:
                self._adopt_checkpoint_config(weights.lh_config, path)

        report = load_state_dict_strict(self, weights.state_dict, path, strict=strict,
                                        dropped=dropped, what='backbone', verify=verify)
        report['dropped'] = sorted(weights.dropped + report['dropped'])
        loaded = len(weights.state_dict) - len(dropped) - len(report['unexpected'])
        print_log(f'LookHereViT: loaded {loaded} tensors from {path} '
                  f'({weights.format} format); dropped {report["dropped"] or "nothing"}; '
                  f'unexpected (ignored) {report["unexpected"] or "none"}; missing '
                  f'{report["missing"] or "none"}; pos_encoding {self.pos_encoding!r}'
                  + (f', LookHere config {self.lh_config.to_dict()}' if self.lh_config else '')
                  + ('; learnable slopes start from that config (the file has none)'
                     if report.get('from_config') else '')
                  + pos_note, logger='current')
        return report

    def _unused_checkpoint_keys(self, state_dict: Mapping[str, Tensor],
                                file_encoding: Optional[str]) -> Dict[str, str]:
        """``{key: reason}`` of file tensors this backbone leaves out by design."""
        own = self.state_dict()
        out = {}
        for key in state_dict:
            if key in own:
                continue
            if key.startswith('norm.') and self.norm is None:
                out[key] = 'final_norm=False'
            elif key == 'cls_token' and not self.with_cls_token:
                out[key] = 'with_cls_token=False'
            elif key.startswith('pos_enc.') and file_encoding not in (None, self.pos_encoding):
                out[key] = f'position encoding {file_encoding!r} of the file'
        return out

    # -- what the weights mean beyond their shapes ---------------------------------------
    def get_extra_state(self) -> Tensor:
        """Saved in every ``state_dict`` (key ``_extra_state``): the position encoding, the
        active LookHere config (e.g. the one adopted from an official checkpoint by
        :meth:`init_weights`) and the attention geometry (``num_heads``, ``num_layers``,
        ``embed_dims``). A trained model therefore carries the bias it was trained with
        into ``tools/test.py``, ``--resume`` and inference, where no ``init_weights`` runs,
        and a model with another head count refuses it.

        A uint8 tensor of JSON text (:func:`~lookhere_dense.checkpoint.encode_extra_state`;
        read it with :func:`~lookhere_dense.checkpoint.decode_extra_state` or
        :meth:`record`), so that every ``state_dict`` entry is a tensor: mmengine's Runner
        broadcasts them all in multi-process runs, and files load with
        ``weights_only=True``."""
        return encode_extra_state(self.record())

    def record(self) -> Dict[str, Any]:
        """What :meth:`get_extra_state` saves, as a dict of strings, numbers and lists."""
        return {'pos_encoding': self.pos_encoding,
                'lh_config': self.lh_config.to_dict() if self.lh_config is not None else None,
                'num_heads': self.num_heads, 'num_layers': self.num_layers,
                'embed_dims': self.embed_dims}

    def set_extra_state(self, state: Any) -> None:
        """Adopt the LookHere config of loaded weights (see :meth:`get_extra_state`; the
        dict that files written before the tensor form hold is read too).

        Raises:
            ValueError: the weights come from another ``pos_encoding`` or attention geometry
                (heads, layers, channels), or their LookHere config conflicts with an
                explicitly given ``preset`` / ``lh_config`` or does not fit this backbone,
                or the entry is no record of a ``LookHereViT``.
        """
        try:
            state = decode_extra_state(state)
        except ValueError as err:
            raise ValueError(f'LookHereViT: the loaded state_dict has {err}') from None
        for key in ('num_layers', 'embed_dims'):
            stored = state.get(key)
            if stored is not None and stored != getattr(self, key):
                raise CheckpointError(f'the loaded weights come from a LookHereViT with '
                                      f'{key}={stored}, this one has {key}='
                                      f'{getattr(self, key)}: set model.backbone.{key}={stored}')
        if state.get('num_heads') is not None:
            check_num_heads(self.num_heads, state['num_heads'], 'recorded in the file',
                            'the loaded state_dict')
        source = state.get('pos_encoding')
        if source is not None and source != self.pos_encoding:
            raise ValueError(f'the loaded weights were trained with pos_encoding={source!r}, '
                             f'but this LookHereViT has pos_encoding={self.pos_encoding!r}: '
                             f'set model.backbone.pos_encoding={source!r} (or drop the '
                             f'{EXTRA_STATE_KEY!r} key to move the trunk weights on purpose)')
        stored = state.get('lh_config')
        if stored is not None and self.lh_config is not None:
            stored = {k: v for k, v in stored.items() if k != 'bias_rounding'}
            self._adopt_checkpoint_config(stored, 'the loaded state_dict')

    def _adopt_checkpoint_config(self, stored: Mapping[str, Any], path: str) -> None:
        stored = dict(stored)
        stored.setdefault('bias_rounding', self.lh_config.bias_rounding)
        learnable = self.lh_config.learnable_slopes
        if stored.get('learnable_slopes') is True and not learnable:
            raise CheckpointError(
                f'{path!r} holds learned LookHere slopes (lh_config learnable_slopes=True, '
                'tensors pos_enc.slopes.*), but this LookHereViT has fixed slopes: set '
                'model.backbone.lh_config.learnable_slopes=True (lh_config=dict(..., '
                'learnable_slopes=True)) to load them')
        # a fixed-slope file in a learnable model: its slopes are the initial values
        stored['learnable_slopes'] = learnable
        try:
            ckpt_cfg = resolve_lh_config(stored)
        except ValueError as err:
            raise ValueError(f'the LookHere config stored in {path!r} cannot be used: '
                             f'{err}') from None
        if self._lh_explicit:
            diff = [d for d in self.lh_config.differences(ckpt_cfg)
                    if d.split(':')[0] in OFFICIAL_KEYS]
            if diff:
                raise ValueError(f'the LookHere config given to LookHereViT conflicts with the '
                                 f'one stored in {path!r} (given != checkpoint): '
                                 + '; '.join(diff) + '. Remove lh_config/preset to use the '
                                 "checkpoint's, or make them equal.")
        try:
            ckpt_cfg.validate(self.num_heads, self.num_layers)
        except ValueError as err:
            raise ValueError(f'the LookHere config stored in {path!r} does not fit this '
                             f'backbone: {err}') from None
        if ckpt_cfg != self.lh_config:
            print_log(f'LookHereViT: LookHere config from {path}: {ckpt_cfg.to_dict()}',
                      logger='current')
        self.pos_enc.set_lh_config(ckpt_cfg)

    def _freeze(self) -> None:
        if 'all' in self.frozen_exclude:
            return
        names = [name for name, _ in self.named_parameters()]
        unmatched = [ex for ex in self.frozen_exclude
                     if not isinstance(ex, str) or not any(ex in n for n in names)]
        if unmatched:
            raise ValueError(f'LookHereViT: frozen_exclude entries {unmatched} match no '
                             f'parameter (names like {names[:3]} ... {names[-2:]}); every '
                             "parameter would be frozen. ['all'] freezes nothing, [] everything")
        for name, param in self.named_parameters():
            if not any(ex in name for ex in self.frozen_exclude):
                param.requires_grad = False

    # -- forward -------------------------------------------------------------------------
    def _output(self, x: Tensor, grid: Tuple[int, int]):
        patches = x[:, 1:] if self.with_cls_token else x
        b, _, c = patches.shape
        out = patches.reshape(b, grid[0], grid[1], c).permute(0, 3, 1, 2).contiguous()
        return [out, x[:, 0]] if self.output_cls_token else out

    def _embed(self, inputs: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """Patch tokens (+CLS), dropout and pre-norm: ``(B, T, D)`` and the grid."""
        x, grid = self.patch_embed(inputs)
        x = self.pos_enc.add_to_tokens(x, grid)
        if self.with_cls_token:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.drop_after_pos(x)
        if self.pre_ln is not None:
            x = self.pre_ln(x)
        return x, grid

    def attention_scale(self, grid: Tuple[int, int], window_size: int = 0) -> float:
        """The query scale of ``log_n_scaling`` for an input grid: ``log(N) / log(N_train)``.

        ``N`` counts the keys a query attends to: ``H * W`` patches (+1 with the CLS
        token); for a windowed block (``window_size > 0``) the patches of one window,
        ``min(ws, H) * min(ws, W)`` (+1). ``N_train`` is the same count on the training
        grid (:attr:`train_grid`). 1.0 when ``log_n_scaling`` is off or the module is in
        train mode."""
        if not self.log_n_scaling or self.training:
            return 1.0
        cls = int(self.with_cls_token)

        def keys(h: int, w: int) -> int:
            if window_size:
                h, w = min(window_size, h), min(window_size, w)
            return h * w + cls

        n, n_train = keys(*grid), keys(*self.train_grid)
        return 1.0 if n == n_train else math.log(n) / math.log(n_train)

    def _run_blocks(self, x: Tensor, grid: Tuple[int, int]):
        """Yield ``(i, tokens)`` after every block (the last one after the final norm)."""
        for i, blk in enumerate(self.blocks):
            q_scale = self.attention_scale(grid, blk.window_size)
            if self.with_cp and x.requires_grad:
                x = checkpoint(blk, x, self.pos_enc, i, grid, self.with_cls_token, q_scale,
                               use_reentrant=False)
            else:
                x = blk(x, self.pos_enc, i, grid, self.with_cls_token, q_scale)
            if i == len(self.blocks) - 1 and self.norm is not None:
                x = self.norm(x)
            yield i, x

    def forward(self, inputs: Tensor) -> Tuple[Any, ...]:
        """Images ``(B, C, H, W)`` -> tuple of ``(B, embed_dims, h, w)`` maps per
        ``out_indices`` (``[map, cls]`` pairs with ``output_cls_token``), where
        ``h, w = ceil(H / patch), ceil(W / patch)``."""
        x, grid = self._embed(inputs)
        outs = [self._output(x, grid)] if self.out_origin else []
        for i, x in self._run_blocks(x, grid):
            if i in self.out_indices:
                outs.append(self._output(x, grid))
        return tuple(outs)

    def forward_features(self, inputs: Tensor) -> Tensor:
        """All tokens after the last block and final norm, ``(B, T, D)`` (CLS first), like
        the official ``LookHere.forward_features``."""
        x, grid = self._embed(inputs)
        for _, x in self._run_blocks(x, grid):
            pass
        return x

    def train(self, mode: bool = True) -> 'LookHereViT':
        super().train(mode)
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.eval()
        return self
