"""Generic ViT layers in torch alone: patch embedding, MLP, LayerScale, stochastic depth
(:class:`DropPath`), the multi-head self-attention that asks a position encoding for its
positions, and the pre-norm block (DeiT-III, with the optional Jumbo path).

Nothing here knows how a position is encoded: :class:`LookHereSelfAttention` and
:class:`LookHereBlock` take the trunk's position-encoding object in every forward (see
:mod:`.pos_encoding`), so the same layers serve every encoding. The parameter names are the
official LookHere / timm ones (``fc1``, ``fc2``, ``gamma``, ``qkv``, ``proj``, ``norm1``,
``ls1``, ...), so their weights load by name. The trunk that stacks them is
:class:`~lookhere_dense.lookhere.vit.LookHereVisionTransformer` (:mod:`.vit`), which
re-exports every name of this module.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..errors import NonFiniteFeaturesError, NonFiniteInputError
from .attention.windows import effective_window
from .fused_mlp import fused_mlp, use_fused_mlp

if TYPE_CHECKING:  # the annotations only: the layers need no position-encoding code
    from .engine import LookHereAttentionEngine
    from .pos_encoding import PositionEncoding

__all__ = [
    'LookHerePatchEmbed',
    'LookHereBlock',
    'LookHereSelfAttention',
    'LayerScale',
    'Mlp',
    'DropPath',
    'trunc_normal_',
    'check_finite_images',
    'check_finite_features',
    'NormLayer',
    'ActLayer',
    'WEIGHT_CAUSES',
    'weights_caused',
]

#: ``norm_layer(dim) -> module`` and ``act_layer() -> module``
NormLayer = Callable[[int], nn.Module]
ActLayer = Callable[[], nn.Module]


def _tracing() -> bool:
    """Whether the forward is being traced, compiled or exported (no data-dependent checks
    then: they would break the graph or bake one input's answer into it)."""
    compiler = getattr(torch, 'compiler', None)
    if compiler is not None:
        for name in ('is_compiling', 'is_exporting', 'is_dynamo_compiling'):
            fn = getattr(compiler, name, None)
            if fn is not None and fn():
                return True
    onnx = getattr(torch, 'onnx', None)
    if onnx is not None and getattr(onnx, 'is_in_onnx_export', lambda: False)():
        return True
    return torch.jit.is_tracing() or torch.jit.is_scripting()


def _jit_int(size: Any) -> Any:
    """A shape entry as a plain ``int`` under ``torch.jit.trace`` (which gives shape
    entries as 0-d tensors; the grid sizes the bias tables, so a traced graph is
    specialised to the traced image size, as timm's ViT is). Elsewhere unchanged: an
    ``int`` in eager mode, a symbolic size under ``torch.compile`` (not specialised)."""
    return int(size) if torch.jit.is_tracing() else size


def _finite_mask(x: Tensor) -> Optional[Tensor]:
    """None when every value of ``x`` is finite (one reduction, no ``x``-sized temporary,
    in that common case), else ``torch.isfinite(x)`` (finite values whose sum overflows
    are finite)."""
    if bool(torch.isfinite(x.sum())):
        return None
    finite = torch.isfinite(x)
    return None if bool(finite.all()) else finite


def check_finite_images(x: Tensor) -> None:
    """Refuse images with NaN or infinite values (they would give an all-NaN prediction).

    The counts are of ``x``, the tensor the backbone receives. Behind a data pipeline
    (mmseg / mmdet) that is the image after resizing, normalisation and padding, and in
    sliding-window inference one window: bilinear resizing spreads a bad pixel over its
    neighbours and turns inf into NaN (``inf * 0``), so the message says so rather than
    claim the counts of the original image.

    Raises:
        NonFiniteInputError: naming how many values of which images are not finite.
    """
    finite = _finite_mask(x)
    if finite is None:
        return
    bad = (~finite).flatten(1).sum(1)
    images = [int(i) for i in torch.nonzero(bad).flatten()]
    nan = int(torch.isnan(x).sum())
    raise NonFiniteInputError(
        f'LookHereViT: the input images hold {int(bad.sum())} NaN / infinite values of '
        f'{x[0].numel()} per image ({nan} NaN; images {images[:8]} of the batch of '
        f'{x.shape[0]}) as the backbone receives them (resizing in a data pipeline spreads one '
        'bad pixel and turns inf into NaN: the original image may hold fewer): every '
        'prediction would be NaN. Check the image files and the preprocessing (float '
        'images must be finite; normalisation by a zero std gives inf / NaN)'
    )


#: a largest ``|value|`` above which inputs or weights are named as the likely cause of
#: features that overflow (normalised images and trained weights are of order 1-10)
OVERFLOW_SUSPECT = 1e4


#: how :func:`nonfinite_cause` begins where the weights themselves are the cause (NaN /
#: infinite parameters, or weights grown large enough to overflow); its messages are built
#: from these, so :func:`weights_caused` recognises them
WEIGHT_CAUSES = ('parameters of the model hold NaN', 'the weights reach |w|')


def weights_caused(message: Optional[str]) -> bool:
    """Whether a :func:`nonfinite_cause` (or a message that quotes one) blames the weights
    (not the inputs or the activations' dtype)."""
    return bool(message) and any(cause in message for cause in WEIGHT_CAUSES)


def nonfinite_cause(images: Tensor, model: nn.Module, dtype: Optional[torch.dtype] = None) -> str:
    """Why a forward of finite ``images`` through ``model`` gave NaN / infinite values: its
    non-finite parameters (named), else inputs or weights so large that they overflow
    (the largest ``|x|`` and ``|w|``, the largest weight's parameter named; above
    :data:`OVERFLOW_SUSPECT` they are named as the cause), else activations that outgrew
    the dtype (``dtype``, the features' dtype; float16 named). Run only once non-finite
    values were found: it reads every parameter."""
    bad, peak_w, where_w = [], 0.0, ''
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not p.is_floating_point():
                continue
            if not bool(torch.isfinite(p).all()):
                bad.append(name)
            elif not bad and p.numel():
                top = float(p.detach().abs().amax())
                if top > peak_w:
                    peak_w, where_w = top, name
        peak_x = float(images.detach().abs().amax())
    fix_weights = (
        'updates too large made them so: lower the learning rate '
        '(optim_wrapper.optimizer.lr) or clip gradients '
        '(optim_wrapper.clip_grad=dict(max_norm=1.0))'
        if model.training
        else 'load other weights (a diverging training saves such checkpoints)'
    )
    if bad:
        return (
            f'{WEIGHT_CAUSES[0]} / infinite values ({len(bad)}: '
            f'{", ".join(bad[:3])}{", ..." if len(bad) > 3 else ""}): {fix_weights}'
        )
    if peak_x > OVERFLOW_SUSPECT and peak_x >= peak_w:
        return (
            f'the input values reach |x| = {peak_x:.3g} (normalised images are of order 1) and '
            f'overflow inside the backbone: check the preprocessing (the data '
            "preprocessor's mean / std, a scale factor)"
        )
    if peak_w > OVERFLOW_SUSPECT:
        return (
            f'{WEIGHT_CAUSES[1]} = {peak_w:.3g} ({where_w}; the inputs only |x| = '
            f'{peak_x:.3g}) and overflow inside the backbone: {fix_weights}'
        )
    return (
        f'the activations overflow inside the backbone with inputs |x| <= {peak_x:.3g} '
        f'and weights |w| <= {peak_w:.3g}'
        + (' (float16 ends at 65504: use bfloat16 autocast)' if dtype == torch.float16 else '')
    )


def check_finite_features(features: Tensor, images: Tensor, model: nn.Module) -> Optional[str]:
    """Whether ``features`` are NaN / infinite although the images were finite
    (:func:`check_finite_images` passed), and why (:func:`nonfinite_cause`). In inference
    such features are refused; in training the message is returned (the loss the NaN
    reaches is the ``FiniteLossHook``'s to stop, and it adds this cause). One reduction over
    ``features`` when they are finite; nothing while the forward is traced, compiled or
    exported.

    Returns:
        None when the features are finite (or not checked), else what the refusal says
        after its ``LookHereViT:`` (training).

    Raises:
        NonFiniteFeaturesError: in inference (``model.training`` False): how many feature
            values are not finite, and the cause.
    """
    finite = None if _tracing() else _finite_mask(features.detach())
    if finite is None:
        return None
    message = (
        f'{int((~finite).sum())} of {features.numel()} feature values are NaN / infinite '
        f'although the input images are finite: {nonfinite_cause(images, model, features.dtype)}'
    )
    if model.training:
        return message
    raise NonFiniteFeaturesError(f'LookHereViT: {message}')


def _autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (then it casts the inputs itself)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # pragma: no cover - torch < 2.4: CUDA autocast only
        return torch.is_autocast_enabled()


@torch.no_grad()
def trunc_normal_(
    tensor: Tensor, std: float = 1.0, mean: float = 0.0, a: float = -2.0, b: float = 2.0
) -> Tensor:
    """Fill ``tensor`` from a normal distribution truncated to ``[a, b]`` by the inverse CDF
    of a uniform draw (the method of DeiT / timm's and mmengine's ``trunc_normal_``; one
    uniform draw per element, so a seed gives the same weights as those)."""

    def cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    lower, upper = cdf((a - mean) / std), cdf((b - mean) / std)
    tensor.uniform_(2 * lower - 1, 2 * upper - 1).erfinv_()
    return tensor.mul_(std * math.sqrt(2.0)).add_(mean).clamp_(min=a, max=b)


class DropPath(nn.Module):
    """Stochastic depth per sample: in training, zero a sample's residual branch with
    probability ``drop_prob`` and scale the kept ones by ``1 / (1 - drop_prob)``. The scale
    is folded into the ``(B, 1, ...)`` mask, so the branch costs one full-size tensor (the
    output), not two.

    Args:
        drop_prob: the probability. Default: 0.
    """

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: Tensor) -> Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1 - self.drop_prob
        shape = (x.shape[0],) + (1,) * (x.dim() - 1)
        # drawn in float32: in bf16, keep + rand rounds, and the kept share moved
        # (0.8985 for 0.9); the mask (0 or 1 / keep) is then cast to the branch's dtype
        mask = (keep + torch.rand(shape, dtype=torch.float32, device=x.device)).floor_()
        return x * mask.div_(keep).to(x.dtype)

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob}'


class LookHerePatchEmbed(nn.Module):
    """Non-overlapping patch embedding (a strided conv), padding inputs to a patch multiple.

    Its input errors name the model as :attr:`owner` (``'LookHereViT'``; a timm model sets
    its own name, ``lookhere_vit_tiny_patch16_224``).

    Args:
        patch_size: patch side. Default: 16.
        in_channels: input channels. Default: 3.
        embed_dims: output channels. Default: 768.
        bias: conv bias (the official model has one). Default: True.
        padding: ``'corner'`` pads bottom/right, ``'same'`` pads evenly, like mmseg's
            ``AdaptivePadding``. Default: ``'corner'``.
        norm_layer: optional norm after the projection, ``norm_layer(embed_dims)``.
            Default: None.
    """

    #: the model's name in the input errors
    owner: str = 'LookHereViT'

    def __init__(
        self,
        patch_size: int = 16,
        in_channels: int = 3,
        embed_dims: int = 768,
        bias: bool = True,
        padding: str = 'corner',
        norm_layer: Optional[NormLayer] = None,
    ):
        super().__init__()
        if padding not in ('corner', 'same'):
            raise ValueError(f"patch_pad must be 'corner' or 'same', got {padding!r}")
        self.patch_size = patch_size
        self.padding = padding
        self.proj = nn.Conv2d(in_channels, embed_dims, patch_size, patch_size, bias=bias)
        self.norm = norm_layer(embed_dims) if norm_layer is not None else None

    def check_images(self, x: Tensor) -> None:
        """The input checks of :meth:`forward` (what a model that resizes or crops the
        images before its patch embedding, e.g. LookWhere's selector, asks first).

        Raises:
            TypeError, ValueError, NonFiniteInputError: as :meth:`forward`.
        """
        if not isinstance(x, Tensor):
            raise TypeError(
                f'{self.owner} expects a tensor of images (B, C, H, W), got {type(x).__name__}'
            )
        if x.dim() != 4:
            raise ValueError(
                f'{self.owner} expects images of shape (B, C, H, W), got {tuple(x.shape)}'
            )
        if not x.is_floating_point():
            raise ValueError(
                f'{self.owner} expects float images (B, C, H, W), got dtype '
                f'{x.dtype}: convert and normalise them first (in mmseg / mmdet '
                "the model's data_preprocessor does), e.g. x.float()"
            )
        c = self.proj.in_channels
        if x.shape[1] != c:
            if x.shape[-1] == c:
                raise ValueError(
                    f'{self.owner} expects images of shape (B, C, H, W); got '
                    f'{tuple(x.shape)}, which looks like (B, H, W, C) with the '
                    f'channel axis last: use x.permute(0, 3, 1, 2)'
                )
            raise ValueError(f'{self.owner} was built for {c} input channels, got {x.shape[1]}')
        h, w = _jit_int(x.shape[-2]), _jit_int(x.shape[-1])
        p = self.patch_size
        if h < p or w < p:
            raise ValueError(f'image of {h}x{w} px is smaller than one {p}x{p} patch')
        weight = self.proj.weight
        if x.dtype != weight.dtype and not _autocast_on(x.device.type):
            raise ValueError(
                f'{self.owner} weights are {weight.dtype} but the images are '
                f'{x.dtype}: cast one to the other (e.g. x.to({weight.dtype}) '
                'or model.to(x.dtype)), or run under torch.autocast'
            )
        if not _tracing():
            check_finite_images(x)

    def forward(self, x: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """``(B, C, H, W)`` -> tokens ``(B, h*w, D)`` and the grid ``(h, w)``.

        Any memory format (``torch.channels_last`` too) gives the same result; a batch of
        0 images gives empty outputs.

        Raises:
            TypeError: not a tensor.
            ValueError: not 4-D, not a float dtype, the channel axis last
                ``(B, H, W, C)``, another channel count, or smaller than one patch.
            NonFiniteInputError: NaN or infinite pixel values (checked in eager mode; a
                traced, compiled or exported graph has no data-dependent checks).
        """
        self.check_images(x)
        h, w = _jit_int(x.shape[-2]), _jit_int(x.shape[-1])
        p = self.patch_size
        pad_h, pad_w = (-h) % p, (-w) % p
        if pad_h or pad_w:
            if self.padding == 'corner':
                x = F.pad(x, (0, pad_w, 0, pad_h))
            else:
                x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        x = self.proj(x)
        grid = (_jit_int(x.shape[2]), _jit_int(x.shape[3]))
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
    """Two-layer MLP with timm's parameter names (``fc1``, ``fc2``). In bfloat16 inference
    on CPU, ``fc1`` and an ``nn.GELU`` run as one oneDNN call (:mod:`.fused_mlp`).

    Args:
        dim: input and output channels.
        hidden: hidden channels.
        act_layer: ``act_layer()`` builds the activation. Default: ``nn.GELU``.
        drop: dropout after the activation and the output. Default: 0.
    """

    def __init__(self, dim: int, hidden: int, act_layer: ActLayer = nn.GELU, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., dim)`` -> ``(..., dim)``: ``fc2(drop(act(fc1(x))))``, then dropout;
        where :func:`~.fused_mlp.use_fused_mlp` allows it (bfloat16 inference on CPU, not
        traced), ``fc1`` and the GELU as one oneDNN call (:mod:`.fused_mlp`)."""
        if not _tracing() and use_fused_mlp(x, self):
            return fused_mlp(x, self.fc1, self.act, self.fc2)
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class LookHereSelfAttention(nn.Module):
    """Multi-head self-attention that takes its position information from the trunk's
    :class:`~lookhere_dense.lookhere.pos_encoding.PositionEncoding`, handed in every forward
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

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = attn_drop
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(
        self,
        x: Tensor,
        pos_enc: Union['PositionEncoding', 'LookHereAttentionEngine'],
        layer: int,
        grid: Tuple[int, int],
        cls_token: bool,
        window_size: int = 0,
        q_scale: float = 1.0,
    ) -> Tensor:
        """``(B, T, C)`` -> ``(B, T, C)``; ``window_size > 0`` selects window attention.

        ``q_scale`` multiplies the queries before the position encoding is asked, i.e. the
        content logits ``q . k / sqrt(d)`` of every encoding (RoPE rotates linearly, so
        its logits scale alike); an additive LookHere / 2D-ALiBi bias is not scaled. The
        trunk's ``log_n_scaling`` sets it (see
        :meth:`LookHereVisionTransformer.attention_scale`).
        """
        b, t, c = x.shape
        q, k, v = (
            self.qkv(x)
            .reshape(b, t, 3, self.num_heads, self.head_dim)
            .permute(2, 0, 3, 1, 4)
            .unbind(0)
        )
        if q_scale != 1.0:
            q = q * q_scale
        p = self.attn_drop if self.training else 0.0
        extra = {'tokens': x} if getattr(pos_enc, 'uses_tokens', False) else {}  # PaPE
        if window_size:
            ws = effective_window(grid, window_size, getattr(pos_enc, 'lh_config', None))
            x = pos_enc.window_attention(q, k, v, layer, grid, ws, cls_token, p, **extra)
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
        init_values: LayerScale init; None or 0 disables LayerScale (timm's convention: a
            LayerScale at 0 would silence every residual branch). Default: 1e-4.
        norm_layer: ``norm_layer(dim)``. Default: ``nn.LayerNorm`` (eps 1e-5).
        act_layer: ``act_layer()``. Default: ``nn.GELU``.
        window_size: 0 for global attention, else ViTDet window size (in patches).
            Default: 0.
        jumbo_tokens: ``J`` Jumbo tokens at the front of the sequence (0: none). With
            ``J > 0`` they skip this block's MLP: after the attention they are joined
            into one ``J * dim`` token that goes through the trunk's shared wide MLP
            (handed in each forward, see :meth:`forward`) behind this block's own
            ``jumbo_norm`` (and ``jumbo_ls`` LayerScale when ``init_values`` is set).
            Default: 0.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        init_values: Optional[float] = 1e-4,
        norm_layer: NormLayer = nn.LayerNorm,
        act_layer: ActLayer = nn.GELU,
        window_size: int = 0,
        jumbo_tokens: int = 0,
    ):
        super().__init__()
        self.window_size = window_size
        self.jumbo_tokens = int(jumbo_tokens)
        self.norm1 = norm_layer(dim)
        self.attn = LookHereSelfAttention(dim, num_heads, qkv_bias, attn_drop, drop)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer, drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        if self.jumbo_tokens:
            wide = self.jumbo_tokens * dim
            self.jumbo_norm = norm_layer(wide)
            self.jumbo_ls = LayerScale(wide, init_values) if init_values else nn.Identity()

    def forward(
        self,
        x: Tensor,
        pos_enc: Union['PositionEncoding', 'LookHereAttentionEngine'],
        layer: int,
        grid: Tuple[int, int],
        cls_token: Union[bool, int],
        q_scale: float = 1.0,
        jumbo_mlp: Optional[nn.Module] = None,
    ) -> Tensor:
        """``(B, T, C)`` -> ``(B, T, C)``; ``pos_enc`` and ``q_scale`` as in
        :class:`LookHereSelfAttention`, ``cls_token`` the number of global prefix tokens
        (CLS: 1, Jumbo: ``J``). A Jumbo block needs the trunk's shared ``jumbo_mlp``
        (``J * C -> J * C``)."""
        x = x + self.drop_path(
            self.ls1(
                self.attn(
                    self.norm1(x), pos_enc, layer, grid, cls_token, self.window_size, q_scale
                )
            )
        )
        if not self.jumbo_tokens:
            return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))
        if jumbo_mlp is None:
            raise ValueError(
                f'a block with jumbo_tokens={self.jumbo_tokens} needs the shared jumbo_mlp'
            )
        j = self.jumbo_tokens
        b, _, c = x.shape
        wide = x[:, :j].reshape(b, 1, j * c)  # the J tokens side by side: one J*C token
        wide = wide + self.drop_path(self.jumbo_ls(jumbo_mlp(self.jumbo_norm(wide))))
        patches = x[:, j:]
        patches = patches + self.drop_path(self.ls2(self.mlp(self.norm2(patches))))
        return torch.cat([wide.reshape(b, j, c), patches], dim=1)
