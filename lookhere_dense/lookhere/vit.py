"""The LookHere plain ViT in torch alone: the trunk (:class:`LookHereVisionTransformer`:
patch embedding, global and window blocks, CLS / Jumbo tokens, final norm) and
:func:`create_model`. The generic layers it stacks (patch embedding, MLP, LayerScale,
DropPath, attention, block) are in :mod:`.layers` and importable from here too.

The architecture of the official LookHere model (DeiT-III: pre-norm blocks with LayerScale,
CLS token, final norm, patch-embedding conv with bias, no absolute position embedding), so
official, timm and DeiT-III weights load by name (:mod:`.weights`), with optional
ViTDet-style window attention per block and, for controlled comparisons, other position
encodings in the identical trunk (:mod:`.pos_encoding`). The argument names are mmseg
``VisionTransformer``'s where the meaning is the same; the OpenMMLab backbone
(``LookHereViT`` in mmseg's and mmdet's registries) is a thin wrapper of
:class:`LookHereVisionTransformer` with the same ``state_dict`` keys and outputs.

Plain PyTorch::

    from lookhere_dense.lookhere import create_model

    model = create_model(pretrained='LH_180_weights_and_config.pth', out_indices=(3, 5, 7, 11))
    tokens = model.forward_features(images)   # (B, 1 + N, 768), the official model's output
    maps = model(images)                      # NCHW maps of blocks 3, 5, 7, 11
"""

from __future__ import annotations

import logging
import math
import os
import re
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..checkpoint import EXTRA_STATE_KEY, encode_extra_state, listed
from ..errors import CheckpointError, ConfigError
from ..validation import check_int, check_number, check_rate, is_int, is_number
from . import weights as _weights
from .config import LookHereConfig
from .engine import LookHereAttentionEngine
from .layers import (
    ActLayer,
    DropPath,
    LayerScale,
    LookHereBlock,
    LookHerePatchEmbed,
    LookHereSelfAttention,
    Mlp,
    NormLayer,
    check_finite_features,
    check_finite_images,
    trunc_normal_,
)
from .pos_encoding import PositionEncoding, build_position_encoding, isolated_rng
from .pos_encoding.spec import parse_pos_encoding

__all__ = [
    'LookHereVisionTransformer',
    'create_model',
    'LookHerePatchEmbed',
    'LookHereBlock',
    'LookHereSelfAttention',
    'LayerScale',
    'Mlp',
    'DropPath',
    'window_blocks',
    'image_size_pair',
    'trunc_normal_',
    'check_finite_images',
]

logger = logging.getLogger(__name__)
#: The timm names of the LookHere models (``lookhere_dense.timm_models``), with a tag.
_TIMM_NAME = re.compile(r'lookhere_vit_[a-z]+_patch\d+_\d+(\.\w+)?')

#: What ``torch.export`` / ``torch.onnx.export(dynamo=True)`` of a LookHere ViT is told.
EXPORT_HINT = (
    'LookHere ViT: torch.export / torch.onnx.export fix the attention to one image size '
    'first: with lookhere_dense.lookhere.export.static_grid_attention(model, (H, W)): '
    "torch.onnx.export(model, (images,), 'model.onnx') (H, W: the size of images; "
    'docs/deploy.md, "Plain PyTorch and timm models")'
)

#: the keys of the warnings given once per process
_warned: set = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, stacklevel=3)


def image_size_pair(img_size: Any) -> Tuple[int, int]:
    """``img_size`` as ``(H, W)``: an int, or a sequence of one or two positive ints (like
    mmseg's ``VisionTransformer``).

    Raises:
        ValueError: naming the value.
    """
    given = img_size
    if is_int(img_size):
        img_size = (img_size, img_size)
    elif isinstance(img_size, (list, tuple)) and len(img_size) == 1:
        img_size = (img_size[0], img_size[0])
    if (
        not isinstance(img_size, (list, tuple))
        or len(img_size) != 2
        or not all(is_int(s) and s >= 1 for s in img_size)
    ):
        raise ValueError(
            'LookHereViT: img_size must be a positive int or (H, W) with two '
            f'positive ints, got {given!r}'
        )
    return int(img_size[0]), int(img_size[1])


def _check_arguments(args: Mapping[str, Any]) -> None:
    """Validate the numeric arguments of :class:`LookHereVisionTransformer` and its layer
    builders (``norm_layer``, ``act_layer``: callables), naming key and value."""
    for name in ('patch_size', 'in_channels', 'embed_dims', 'num_layers', 'num_heads'):
        check_int(f'LookHereViT: {name}', args[name])
    for name in ('drop_rate', 'attn_drop_rate', 'drop_path_rate'):
        check_rate(f'LookHereViT: {name}', args[name])
    check_number('LookHereViT: mlp_ratio', args['mlp_ratio'], 0, strict=True)
    for name, example in (
        (
            'norm_layer',
            'a norm from the channel count, e.g. nn.LayerNorm or '
            'functools.partial(nn.LayerNorm, eps=1e-6)',
        ),
        ('act_layer', 'the MLP activation, e.g. nn.GELU'),
    ):
        if not callable(args[name]):
            raise TypeError(
                f'LookHereViT: {name} must be a callable that builds {example}; got '
                f'{args[name]!r}'
                + (
                    f" (a layer name: timm.create_model('lookhere_vit_...', {name}=NAME) "
                    "takes timm's names)"
                    if isinstance(args[name], str)
                    else ''
                )
            )
    check_int(
        'LookHereViT: jumbo_tokens', args['jumbo_tokens'], minimum=0, description='>= 0 (an int)'
    )
    if args['jumbo_mlp_ratio'] is not None:
        check_number('LookHereViT: jumbo_mlp_ratio', args['jumbo_mlp_ratio'], 0, strict=True)
        if not args['jumbo_tokens']:
            raise ValueError(
                f'LookHereViT: jumbo_mlp_ratio={args["jumbo_mlp_ratio"]!r} needs jumbo_tokens > 0'
            )
        wide = args['jumbo_tokens'] * args['embed_dims']
        if int(wide * args['jumbo_mlp_ratio']) < 1:
            raise ValueError(
                f'LookHereViT: jumbo_mlp_ratio={args["jumbo_mlp_ratio"]!r} gives the wide MLP '
                f'{int(wide * args["jumbo_mlp_ratio"])} channels'
            )
    if int(args['embed_dims'] * args['mlp_ratio']) < 1:
        raise ValueError(
            f'LookHereViT: mlp_ratio={args["mlp_ratio"]!r} gives an MLP of '
            f'{int(args["embed_dims"] * args["mlp_ratio"])} channels'
        )
    if args['init_values'] is not None:
        check_number('LookHereViT: init_values', args['init_values'])
    check_int(
        'LookHereViT: window_size', args['window_size'], minimum=0, description='>= 0 (an int)'
    )
    if args['attn_block_size'] is not None:
        check_int(
            'LookHereViT: attn_block_size',
            args['attn_block_size'],
            minimum=0,
            description='>= 0 (an int)',
        )
    mb = args['max_dense_bias_mb']
    if not is_number(mb) or not mb >= 0:  # inf: no limit
        raise ValueError(f'LookHereViT: max_dense_bias_mb must be a number >= 0, got {mb!r}')
    for name in ('window_block_indexes', 'global_attn_indexes'):
        if args[name] is not None:
            if not isinstance(args[name], (list, tuple)) or not all(is_int(i) for i in args[name]):
                raise ValueError(
                    f'LookHereViT: {name} must be a list of block indexes '
                    f'(ints), got {args[name]!r}'
                )
            twice = sorted({i for i in args[name] if list(args[name]).count(i) > 1})
            if twice:  # a typo ([0, 1, 1, 3] for [0, 1, 2, 3]) changed the layout silently
                raise ValueError(
                    f'LookHereViT: {name}={list(args[name])} lists block(s) {twice} more than once'
                )
    out_indices = args['out_indices']
    if isinstance(out_indices, (list, tuple)):
        if not out_indices or not all(is_int(i) for i in out_indices):
            raise ValueError(
                'LookHereViT: out_indices must be an int or a non-empty list of '
                f'ints, got {out_indices!r}'
            )
    elif not is_int(out_indices):
        raise ValueError(
            'LookHereViT: out_indices must be an int or a non-empty list of '
            f'ints, got {out_indices!r}'
        )


def window_blocks(
    num_layers: int,
    window_size: int,
    window_block_indexes: Optional[Sequence[int]],
    global_attn_indexes: Optional[Sequence[int]],
) -> List[int]:
    """Indexes of windowed blocks from either naming (detectron2/mmdet or SAM); with
    ``window_size`` and neither list, the last block of each quarter is global (ViTDet)."""
    if not window_size:
        if window_block_indexes or global_attn_indexes:
            raise ValueError('window_block_indexes / global_attn_indexes need window_size > 0')
        return []
    if window_size < 1:
        raise ValueError(f'window_size must be >= 0, got {window_size}')
    if window_block_indexes is not None and global_attn_indexes is not None:
        windowed = sorted(set(window_block_indexes))
        if set(windowed) & set(global_attn_indexes) or set(windowed) | set(
            global_attn_indexes
        ) != set(range(num_layers)):
            raise ValueError(
                'window_block_indexes and global_attn_indexes must partition '
                f'range({num_layers}); got {list(window_block_indexes)} and '
                f'{list(global_attn_indexes)}'
            )
    elif window_block_indexes is not None:
        windowed = sorted(set(window_block_indexes))
    else:
        if global_attn_indexes is None:  # ViTDet: the last block of each quarter is global
            global_attn_indexes = sorted({max((q + 1) * num_layers // 4 - 1, 0) for q in range(4)})
            if len(global_attn_indexes) == num_layers:
                raise ValueError(
                    f'window_size={window_size} with {num_layers} layers: the '
                    'default (the last block of each quarter is global) leaves no '
                    'windowed block; give window_block_indexes or '
                    'global_attn_indexes'
                )
        windowed = [i for i in range(num_layers) if i not in set(global_attn_indexes)]
    bad = [i for i in windowed if not 0 <= i < num_layers]
    bad += [i for i in (global_attn_indexes or []) if not 0 <= i < num_layers]
    if bad:
        raise ValueError(
            f'LookHereViT: window_block_indexes / global_attn_indexes: block indexes {bad} '
            f'out of range for num_layers={num_layers}'
        )
    return windowed


class LookHereVisionTransformer(nn.Module):
    """Plain ViT with LookHere directed-attention position encoding (torch alone).

    Arguments shared with mmseg's ``VisionTransformer`` keep their meaning; defaults that
    differ follow the official LookHere (DeiT-III) architecture so official weights fit:
    ``patch_bias=True`` and ``final_norm=True``.

    Args:
        img_size (int | tuple): nominal training size; only recorded, except with
            ``pos_encoding='abs'``, whose embedding has the grid ``img_size / patch_size``,
            and ``log_n_scaling``; changed later by :meth:`set_input_size`. Default: 224.
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
        out_indices (int | Sequence[int]): blocks whose outputs :meth:`forward` returns
            (-1: last), in increasing block order, each once (the outputs come in block
            order: an unordered list is refused). Default: -1.
        qkv_bias (bool): Default: True.
        drop_rate (float): dropout after patch embedding, attention projection and MLP.
            Default: 0.
        attn_drop_rate (float): attention dropout. Default: 0.
        drop_path_rate (float): stochastic depth, linearly increasing over blocks.
            Default: 0.
        with_cls_token (bool): prepend a CLS token (bias 0 to and from it). Default: True.
        output_cls_token (bool): outputs become ``[feature_map, cls]``; needs
            ``with_cls_token`` or ``jumbo_tokens`` (then ``cls`` is the ``J`` Jumbo tokens
            side by side, ``(B, J * embed_dims)``). Default: False.
        jumbo_tokens (int): ``J`` Jumbo tokens (Fuller et al. 2025, "Thicker and
            Quicker") in place of the CLS token (set ``with_cls_token=False``); 0: none.
            They are attended like CLS in every block and every position encoding
            (global, no LookHere mask or bias, not rotated), skip the blocks' MLPs and
            instead, after each block's attention, go side by side through ONE wide MLP
            (``jumbo_mlp``, ``J * embed_dims`` wide) shared by all blocks, behind each
            block's own ``jumbo_norm``. Default: 0.
        jumbo_mlp_ratio (float, optional): hidden / input channels of the wide MLP;
            None: ``mlp_ratio`` (the paper's 4). Default: None.
        norm_layer (callable): ``norm_layer(dim)`` builds every norm. Default:
            ``nn.LayerNorm`` (eps 1e-5, as the official model).
        act_layer (callable): ``act_layer()`` builds the MLP activation. Default:
            ``nn.GELU``.
        patch_norm (bool): norm after the patch projection. Default: False.
        patch_bias (bool): bias of the patch projection. Default: True.
        pre_norm (bool): norm before the first block. Default: False.
        final_norm (bool): norm after the last block. Default: True.
        interpolate_mode (str, optional): how ``pos_encoding='abs'`` resamples its
            embedding to other grids (default ``'bicubic'``, as mmseg); ignored, with a
            warning, by the other encodings.
        norm_eval (bool): keep norm layers in eval mode while training. Default: False.
        with_cp (bool): activation checkpointing per block. Default: False.
        frozen_exclude (list[str]): parameters whose names contain one of these stay
            trainable, all others are frozen; ``['all']`` freezes nothing.
            Default: ``['all']``.
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
        init_values (float, optional): LayerScale init; None or 0: no LayerScale (e.g.
            for timm ViT weights without it; 0 as in timm's ViT). Default: 1e-4.
        attn_backend (str): ``'auto'``, ``'reference'``, ``'sdpa'``, ``'chunked'``,
            ``'tiled'``, ``'fused'``, ``'flex'`` or ``'triton'`` (CUDA inference; see
            :mod:`lookhere_dense.lookhere.attention`, whose ``BACKENDS`` lists them).
            Default: ``'auto'``.
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
            and dropped by the others. See :mod:`lookhere_dense.lookhere.pos_encoding`.
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

    #: how this API loads what fits of a file meant for another architecture (the advice
    #: of a strict refusal; the mmseg and timm classes say it in their own words)
    loose_loading: str = (
        'create_model(FILE, ..., strict=False) or model.load_pretrained(FILE, strict=False) '
        'loads what fits'
    )

    def __init__(
        self,
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
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        with_cls_token: bool = True,
        output_cls_token: bool = False,
        jumbo_tokens: int = 0,
        jumbo_mlp_ratio: Optional[float] = None,
        norm_layer: NormLayer = nn.LayerNorm,
        act_layer: ActLayer = nn.GELU,
        patch_norm: bool = False,
        patch_bias: bool = True,
        pre_norm: bool = False,
        final_norm: bool = True,
        interpolate_mode: Optional[str] = None,
        norm_eval: bool = False,
        with_cp: bool = False,
        frozen_exclude: Sequence[str] = ('all',),
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
        log_n_scaling: bool = False,
    ):
        super().__init__()
        _check_arguments(locals())
        img_size = image_size_pair(img_size)
        if isinstance(frozen_exclude, str):  # one name, not its letters
            frozen_exclude = [frozen_exclude]

        spec = parse_pos_encoding(pos_encoding, lh_config, preset)
        if interpolate_mode is not None and spec.name != 'abs':
            _warn_once(
                'interpolate_mode',
                'LookHereViT ignores interpolate_mode: it has no '
                'absolute position embedding to resize',
            )
        if embed_dims % num_heads:
            raise ValueError(f'embed_dims={embed_dims} is not divisible by num_heads={num_heads}')
        jumbo_tokens = int(jumbo_tokens)
        if jumbo_tokens and with_cls_token:
            raise ValueError(
                f'LookHereViT: jumbo_tokens={jumbo_tokens} replace the CLS token: set '
                'with_cls_token=False (output_cls_token=True then returns the Jumbo tokens)'
            )
        if output_cls_token and not (with_cls_token or jumbo_tokens):
            raise ValueError('output_cls_token=True needs with_cls_token=True or jumbo_tokens > 0')
        self.img_size = img_size
        self.patch_size = patch_size
        self.embed_dims = embed_dims
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.with_cls_token = with_cls_token
        self.output_cls_token = output_cls_token
        self.jumbo_tokens = jumbo_tokens
        #: global tokens at the front of the sequence: the CLS token, or the Jumbo tokens
        self.num_prefix_tokens = jumbo_tokens or int(with_cls_token)
        self.out_origin = out_origin
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        self.frozen_exclude = list(frozen_exclude)

        given = [out_indices] if isinstance(out_indices, int) else list(out_indices)
        self.out_indices = [num_layers + i if i < 0 else i for i in given]
        bad = [g for g, i in zip(given, self.out_indices) if not 0 <= i < num_layers]
        if bad:
            raise ConfigError(  # a ValueError; the tools print it as one error line
                f'out_indices={out_indices!r}: {", ".join(map(str, bad))} out of range for '
                f'num_layers={num_layers} (blocks 0..{num_layers - 1}, or '
                f'-{num_layers}..-1 counted from the last)'
            )
        if any(a >= b for a, b in zip(self.out_indices, self.out_indices[1:])):
            ordered = tuple(sorted(set(self.out_indices)))
            raise ConfigError(
                f'out_indices={out_indices!r}: the outputs come once per block, in block order '
                f"{ordered}, so an index into them (a head's in_index) would name another "
                f'block than listed: give out_indices={ordered}'
            )

        #: an explicit LookHere config (or preset) vs one to be taken from a checkpoint
        self.lh_explicit = spec.explicit
        self.attn_backend = attn_backend
        self.log_n_scaling = bool(log_n_scaling)
        grid = self._train_grid(self.img_size, patch_size)
        self.train_grid: Tuple[int, int] = grid
        with isolated_rng():  # the trunk draws the same init numbers whatever the encoding
            self.pos_enc: PositionEncoding = build_position_encoding(
                spec,
                embed_dims=embed_dims,
                num_heads=num_heads,
                depth=num_layers,
                grid_size=grid,
                interpolate_mode=interpolate_mode or 'bicubic',
                attn_backend=attn_backend,
                attn_block_size=attn_block_size,
                max_dense_bias_mb=max_dense_bias_mb,
            )

        self.window_size = int(window_size)
        self.window_block_indexes = window_blocks(
            num_layers, self.window_size, window_block_indexes, global_attn_indexes
        )

        self.patch_embed = LookHerePatchEmbed(
            patch_size,
            in_channels,
            embed_dims,
            patch_bias,
            patch_pad,
            norm_layer if patch_norm else None,
        )
        if with_cls_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.drop_after_pos = nn.Dropout(drop_rate)
        self.pre_ln = norm_layer(embed_dims) if pre_norm else None
        # on the CPU whatever the default device (``with torch.device('meta')``: no data to
        # read back), in float32 as mmseg's and timm's ViTs compute the same schedule
        dpr = torch.linspace(0, drop_path_rate, num_layers, device='cpu').tolist()
        self.blocks = nn.ModuleList(
            [
                LookHereBlock(
                    embed_dims,
                    num_heads,
                    mlp_ratio,
                    qkv_bias,
                    drop_rate,
                    attn_drop_rate,
                    dpr[i],
                    init_values,
                    norm_layer,
                    act_layer,
                    self.window_size if i in self.window_block_indexes else 0,
                    jumbo_tokens,
                )
                for i in range(num_layers)
            ]
        )
        self.norm = norm_layer(embed_dims) if final_norm else None
        # after every other module, so that a seed gives a Jumbo trunk the same blocks
        self.jumbo_token: Optional[nn.Parameter] = None
        self.jumbo_mlp: Optional[Mlp] = None
        if jumbo_tokens:
            wide = jumbo_tokens * embed_dims
            ratio = mlp_ratio if jumbo_mlp_ratio is None else jumbo_mlp_ratio
            self.jumbo_token = nn.Parameter(torch.zeros(1, jumbo_tokens, embed_dims))
            with isolated_rng():  # its construction draws no numbers from the trunk's stream
                self.jumbo_mlp = Mlp(wide, int(wide * ratio), act_layer, drop_rate)
        self._freeze()

    # -- messages (the OpenMMLab wrapper sends them to mmengine's logger) -------------------
    def _log(self, msg: str) -> None:
        """An info message (the ``lookhere_dense.lookhere.vit`` logger)."""
        logger.info(msg)

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
        """The official (DeiT-III) initialisation: truncated-normal (std 0.02) linear
        weights and CLS token, zero biases, unit LayerNorms, the position encoding's own
        parameters from their own RNG stream (:func:`~.pos_encoding.isolated_rng`)."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):  # elementwise_affine / bias False: None
                if m.weight is not None:
                    nn.init.ones_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if self.with_cls_token:
            trunc_normal_(self.cls_token, std=0.02)
        if self.jumbo_token is not None:
            trunc_normal_(self.jumbo_token, std=0.02)
        with isolated_rng(next(self.parameters()).device):
            self.pos_enc.reset_parameters()

    def load_pretrained(
        self,
        path: Union[str, 'os.PathLike[str]', Mapping[str, Any]],
        strict: bool = True,
        checkpoint_num_heads: Optional[int] = None,
        source: Optional[str] = None,
    ) -> Dict[str, List[str]]:
        """Load official LookHere / timm / DeiT-III / lookhere-dense weights from ``path``
        (see :func:`lookhere_dense.lookhere.weights.load_backbone_weights`: the strict
        checks, the head-count rules and the adoption of the file's LookHere config).

        Args:
            path: checkpoint file (``str`` or ``pathlib.Path``), or a checkpoint already
                loaded (then ``source`` names it in messages).
            strict: refuse files that lack parameters of the backbone or have parameters
                it lacks. Default: True.
            checkpoint_num_heads: the head count the file was trained with, for files
                that do not record it. Default: None.
            source: the file's name for messages when ``path`` is a loaded dict.
                Default: None.

        Returns:
            ``{'missing': [...], 'unexpected': [...], 'dropped': [...]}``.

        Raises:
            FileNotFoundError, CheckpointError: naming the file and what does not fit.
        """
        return _weights.load_backbone_weights(
            self, path, strict, checkpoint_num_heads, source=source
        )

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign=False):
        """PyTorch's, for this model's own ``state_dict`` (it holds the record,
        ``_extra_state``). A strict load of weights without the record (an official
        LookHere, timm or DeiT-III ``state_dict``) is refused with what to call instead --
        :meth:`load_pretrained`, which converts and checks such weights -- rather than
        PyTorch's ``Missing key(s) in state_dict: "_extra_state"``.

        Raises:
            CheckpointError: (``strict``) ``state_dict`` lacks ``_extra_state``.
        """
        if strict and isinstance(state_dict, Mapping) and EXTRA_STATE_KEY not in state_dict:
            own = [k for k in self.state_dict() if k != EXTRA_STATE_KEY]
            missing = [k for k in own if k not in state_dict]
            unexpected = [k for k in state_dict if k not in set(own)]
            more = ''
            if missing or unexpected:
                more = (
                    f' (and the names differ: it lacks {listed(missing)}, has '
                    f'{listed(unexpected)} the model lacks)'
                )
            raise CheckpointError(
                f'load_state_dict: the state_dict has no {EXTRA_STATE_KEY!r} -- the record '
                f'{type(self).__name__} saves with its weights (position encoding, LookHere '
                f"config, head count) -- so it is not this model's own state_dict{more}. "
                'Weights from an official LookHere, timm or DeiT-III file load, converted '
                'and checked, with model.load_pretrained(PATH_OR_STATE_DICT) or '
                'lookhere_dense.lookhere.create_model(PATH, ...); '
                'load_state_dict(state_dict, strict=False) copies the matching names unchecked'
            )
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def get_extra_state(self) -> Tensor:
        """Saved in every ``state_dict`` (key ``_extra_state``): the position encoding, the
        active LookHere config (e.g. the one adopted from an official checkpoint) and the
        attention geometry (``num_heads``, ``num_layers``, ``embed_dims``). A trained model
        therefore carries the bias it was trained with into testing, ``--resume`` and
        inference, where no pretrained weights are loaded, and a model with another head
        count refuses it.

        A uint8 tensor of JSON text (:func:`~lookhere_dense.checkpoint.encode_extra_state`;
        read it with :func:`~lookhere_dense.checkpoint.decode_extra_state` or
        :meth:`record`), so that every ``state_dict`` entry is a tensor: mmengine's Runner
        broadcasts them all in multi-process runs, and files load with
        ``weights_only=True``."""
        return encode_extra_state(self.record())

    def record(self) -> Dict[str, Any]:
        """What :meth:`get_extra_state` saves, as a dict of strings, numbers and lists; with
        ``log_n_scaling`` also the training size it refers to (``log_n_train_size``: the
        ``img_size``, e.g. after :meth:`set_input_size`), which loading adopts."""
        out = {
            'pos_encoding': self.pos_encoding,
            'lh_config': self.lh_config.to_dict() if self.lh_config is not None else None,
            'num_heads': self.num_heads,
            'num_layers': self.num_layers,
            'embed_dims': self.embed_dims,
            'jumbo_tokens': self.jumbo_tokens,
        }
        if self.log_n_scaling:
            out['log_n_train_size'] = [int(v) for v in self.img_size]
        return out

    def set_extra_state(self, state: Any) -> None:
        """Check and adopt the record of loaded weights
        (:func:`~lookhere_dense.lookhere.weights.check_backbone_record`).

        Raises:
            ValueError: the weights come from another ``pos_encoding`` or attention geometry
                (heads, layers, channels), or their LookHere config conflicts with an
                explicitly given ``preset`` / ``lh_config`` or does not fit this backbone,
                or the entry is no record of a LookHere ViT.
        """
        _weights.check_backbone_record(self, state)

    def _freeze(self) -> None:
        if 'all' in self.frozen_exclude:
            return
        names = [name for name, _ in self.named_parameters()]
        unmatched = [
            ex
            for ex in self.frozen_exclude
            if not isinstance(ex, str) or not any(ex in n for n in names)
        ]
        if unmatched:
            raise ValueError(
                f'LookHereViT: frozen_exclude entries {unmatched} match no '
                f'parameter (names like {names[:3]} ... {names[-2:]}); every '
                "parameter would be frozen. ['all'] freezes nothing, [] everything"
            )
        for name, param in self.named_parameters():
            if not any(ex in name for ex in self.frozen_exclude):
                param.requires_grad = False

    # -- forward -------------------------------------------------------------------------
    def _output(self, x: Tensor, grid: Tuple[int, int]):
        prefix = self.num_prefix_tokens
        patches = x[:, prefix:]
        b, _, c = patches.shape
        out = patches.reshape(b, grid[0], grid[1], c).permute(0, 3, 1, 2).contiguous()
        if not self.output_cls_token:
            return out
        return [out, x[:, :prefix].reshape(b, prefix * c) if self.jumbo_tokens else x[:, 0]]

    def _embed(self, inputs: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """Patch tokens (after CLS or the Jumbo tokens), dropout and pre-norm: ``(B, T, D)``
        and the grid."""
        self._check_export()
        x, grid = self.patch_embed(inputs)
        x = self.pos_enc.add_to_tokens(x, grid)
        if self.with_cls_token:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        elif self.jumbo_token is not None:
            x = torch.cat([self.jumbo_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.drop_after_pos(x)
        if self.pre_ln is not None:
            x = self.pre_ln(x)
        return x, grid

    def attention_scale(self, grid: Tuple[int, int], window_size: int = 0) -> float:
        """The query scale of ``log_n_scaling`` for an input grid: ``log(N) / log(N_train)``.

        ``N`` counts the keys a query attends to: ``H * W`` patches plus the prefix tokens
        (CLS: 1, Jumbo: ``J``); for a windowed block (``window_size > 0``) the patches of
        one window, ``min(ws, H) * min(ws, W)``, plus the prefix tokens (for ``ledit``'s
        causal queries, the most keys a query sees). ``N_train`` is the same count on the
        training grid (:attr:`train_grid`). 1.0 when ``log_n_scaling`` is off or the module
        is in train mode."""
        if not self.log_n_scaling or self.training:
            return 1.0
        cls = self.num_prefix_tokens

        def keys(h: int, w: int) -> int:
            if window_size:
                h, w = min(window_size, h), min(window_size, w)
            return h * w + cls

        n, n_train = keys(*grid), keys(*self.train_grid)
        return 1.0 if n == n_train else math.log(n) / math.log(n_train)

    def _train_grid(self, img_size: Tuple[int, int], patch_size: int) -> Tuple[int, int]:
        """The patch grid of the training size (checked for ``log_n_scaling``)."""
        grid = (math.ceil(img_size[0] / patch_size), math.ceil(img_size[1] / patch_size))
        if self.log_n_scaling and grid[0] * grid[1] + self.num_prefix_tokens < 2:
            raise ValueError(
                f'log_n_scaling needs at least 2 tokens on the training grid '
                f'(img_size {img_size} / patch_size {patch_size} gives '
                f'{grid[0]}x{grid[1]})'
            )
        return grid

    def set_input_size(
        self,
        img_size: Union[None, int, Tuple[int, int]] = None,
        patch_size: Optional[int] = None,
    ) -> None:
        """Make ``img_size`` the nominal training size, as timm's
        ``VisionTransformer.set_input_size`` (e.g. before fine-tuning at 384 px):
        :attr:`img_size`, :attr:`train_grid` (what ``log_n_scaling`` compares an input's
        grid with) and, with ``pos_encoding='abs'``, the embedding's grid (its table
        resampled to it in the same parameter: an optimizer built before keeps it, though
        state it holds for it would not fit the new shape). The
        LookHere bias has no size: every input size runs before and after the call, so to
        only *evaluate* at another size, do not call it (it would move ``log_n_scaling``'s
        reference).

        Args:
            img_size: an int or ``(H, W)``. Default: None (unchanged).
            patch_size: None or the model's own (a LookHere distance counts patches and the
                patch embedding is trained for its patch, so it is not changed). Default:
                None.

        Raises:
            ValueError: another ``patch_size``, a bad ``img_size`` (naming the value), a
                training grid too small for ``log_n_scaling``.
        """
        own = self.patch_size
        if patch_size is not None and patch_size not in (own, (own, own), [own, own]):
            raise ValueError(
                f"set_input_size: patch_size={patch_size!r} is not the model's {own}: a "
                'LookHere model keeps its patch size (its distances count patches and its '
                'patch embedding is trained for it); pass img_size alone'
            )
        if img_size is None:
            return
        size = image_size_pair(img_size)
        grid = self._train_grid(size, own)
        self.pos_enc.set_train_grid(grid)
        self.img_size, self.train_grid = size, grid

    #: the final norm is part of the last block's output (:meth:`_run_blocks`); False once
    #: timm's ``prune_intermediate_layers`` has cut later blocks off a timm model: the
    #: kept blocks' outputs stay what they were, the norm comes after them
    #: (:class:`lookhere_dense.timm_models.LookHereTimmViT`)
    _norm_in_last_block: bool = True

    def _run_blocks(self, x: Tensor, grid: Tuple[int, int]):
        """Yield ``(i, tokens)`` after every block (the last one after the final norm, while
        :attr:`_norm_in_last_block`)."""
        for i, blk in enumerate(self.blocks):
            q_scale = self.attention_scale(grid, blk.window_size)
            if self.with_cp and x.requires_grad:
                x = checkpoint(
                    blk,
                    x,
                    self.pos_enc,
                    i,
                    grid,
                    self.num_prefix_tokens,
                    q_scale,
                    self.jumbo_mlp,
                    use_reentrant=False,
                )
            else:
                x = blk(x, self.pos_enc, i, grid, self.num_prefix_tokens, q_scale, self.jumbo_mlp)
            if i == len(self.blocks) - 1 and self.norm is not None and self._norm_in_last_block:
                x = self.norm(x)
            yield i, x

    def _check_export(self) -> None:
        """Refuse ``torch.export`` (and the ``torch.onnx.export`` that runs it) of the
        grid-generic attention, saying what works: the bias tables are built per input
        grid, in steps ``torch.export`` cannot trace (a data-dependent range check, cached
        tensors); :func:`~lookhere_dense.lookhere.export.static_grid_attention` builds
        them for one image size before the export traces."""
        if not torch.compiler.is_exporting():
            return
        if hasattr(getattr(self.pos_enc, 'engine', None), 'slope_bias'):
            raise RuntimeError(EXPORT_HINT)

    def forward(self, inputs: Tensor) -> Tuple[Any, ...]:
        """Images ``(B, C, H, W)`` -> tuple of ``(B, embed_dims, h, w)`` maps per
        ``out_indices`` (``[map, cls]`` pairs with ``output_cls_token``), where
        ``h, w = ceil(H / patch), ceil(W / patch)``."""
        tokens, grid = self._embed(inputs)
        outs = [self._output(tokens, grid)] if self.out_origin else []
        x = tokens
        for i, x in self._run_blocks(tokens, grid):
            if i in self.out_indices:
                outs.append(self._output(x, grid))
        self._check_features(x, inputs)
        return tuple(outs)

    def forward_features(self, inputs: Tensor) -> Tensor:
        """All tokens after the last block and final norm, ``(B, T, D)`` (CLS or the Jumbo
        tokens first), like the official ``LookHere.forward_features``."""
        x, grid = self._embed(inputs)
        for _, out in self._run_blocks(x, grid):
            x = out
        self._check_features(x, inputs)
        return x

    #: in training, why the last forward's features were NaN / infinite, or None (finite,
    #: or not checked); the ``FiniteLossHook`` adds it to the message that stops the run
    nonfinite_features: Optional[str] = None

    def _check_features(self, x: Tensor, inputs: Tensor) -> None:
        """:func:`check_finite_features` of the last block's tokens (eager only). In
        inference non-finite features are refused. In training on CPU (where the check
        costs no device sync) their cause is kept in :attr:`nonfinite_features`: the NaN
        goes on to the loss, which the ``FiniteLossHook`` (or fp16 loss scaling) handles,
        and the hook's message names the cause found here, before the optimizer step made
        every weight NaN. Not on CUDA in training (a sync per step)."""
        if not self.training:
            check_finite_features(x, inputs, self)
        elif x.device.type == 'cpu':
            message = check_finite_features(x, inputs, self)
            if message is not None or self.nonfinite_features is not None:
                self.nonfinite_features = message

    def train(self, mode: bool = True) -> 'LookHereVisionTransformer':
        super().train(mode)
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, nn.LayerNorm):
                    m.eval()
        return self


#: timm's names of :class:`LookHereVisionTransformer` arguments -> ours (mmseg's)
TIMM_ARGUMENT_NAMES: Dict[str, str] = {
    'in_chans': 'in_channels',
    'embed_dim': 'embed_dims',
    'depth': 'num_layers',
    'class_token': 'with_cls_token',
    'pos_drop_rate': 'drop_rate',
}


def check_arguments(caller: str, arch: Mapping[str, Any]) -> None:
    """Refuse keyword arguments :class:`LookHereVisionTransformer` does not take, naming
    ours for timm's (``embed_dim`` -> ``embed_dims``) and the close names of a typo.

    Raises:
        TypeError: as Python's for an unexpected keyword argument, with the names to use.
    """
    import difflib
    import inspect

    params = [
        p for p in inspect.signature(LookHereVisionTransformer.__init__).parameters if p != 'self'
    ]
    wrong = [k for k in arch if k not in params]
    if not wrong:
        return
    hints = []
    for key in wrong:
        if key in TIMM_ARGUMENT_NAMES:
            hints.append(f"{key!r} is timm's name: use {TIMM_ARGUMENT_NAMES[key]!r}")
        else:
            close = difflib.get_close_matches(key, params, n=2, cutoff=0.6)
            hints.append(
                f'{key!r}' + (f': did you mean {" or ".join(map(repr, close))}?' if close else '')
            )
    raise TypeError(
        f'{caller}: unexpected argument(s) {", ".join(hints)}. LookHereVisionTransformer '
        "takes mmseg's VisionTransformer names (embed_dims, num_layers, in_channels, ...); "
        "timm's names work in timm.create_model('lookhere_vit_..._patch16_224', ...)"
    )


def create_model(
    pretrained: Union[str, 'os.PathLike[str]', Mapping[str, Any], None] = None,
    *,
    strict: bool = True,
    checkpoint_num_heads: Optional[int] = None,
    **arch: Any,
) -> LookHereVisionTransformer:
    """Build a LookHere ViT with torch alone, initialised, optionally from weights.

    Args:
        pretrained: official LookHere (``LH_180_weights_and_config.pth``, ...), timm /
            DeiT-III or lookhere-dense weights (a path, ``str`` or ``pathlib.Path``, or a
            loaded checkpoint); None (or False): the official random initialisation.
            The LookHere config stored in official and lookhere-dense files is adopted (an
            explicit ``preset`` / ``lh_config`` that differs is an error). Default: None.
        strict: refuse files with missing or unexpected parameters. Default: True.
        checkpoint_num_heads: the head count of a file that does not record it (see
            :func:`lookhere_dense.lookhere.weights.file_num_heads`). Default: None.
        **arch: the arguments of :class:`LookHereVisionTransformer` (``embed_dims``,
            ``num_layers``, ``num_heads``, ``patch_size``, ``init_values``, ``preset``,
            ``pos_encoding``, ``out_indices``, ...).

    Returns:
        The model, in train mode (call ``.eval()`` for inference).

    Raises:
        FileNotFoundError, CheckpointError: the file is missing or does not fit.
        ValueError / PosEncodingError: an argument that cannot work, named.
    """
    if pretrained is False:  # timm's habit for "no weights"
        pretrained = None
    if pretrained is not None:
        _weights.check_weights_argument('create_model: pretrained', pretrained)
        name = os.fspath(pretrained) if isinstance(pretrained, (str, os.PathLike)) else None
        if name and _TIMM_NAME.fullmatch(name) and not os.path.exists(name):
            raise FileNotFoundError(
                f'create_model: pretrained={name!r} is no file but a timm model name: '
                f'timm.create_model({name!r}, checkpoint_path=FILE) builds it; '
                'create_model takes a weights file (e.g. LH_180_weights_and_config.pth)'
            )
    check_arguments('create_model', arch)
    model = LookHereVisionTransformer(**arch)
    model.init_weights()
    if pretrained is not None:
        model.load_pretrained(pretrained, strict=strict, checkpoint_num_heads=checkpoint_num_heads)
    return model
