"""``'ledit'``: LEDiT's position sense without a position encoding (Zhang et al. 2025,
"LEDiT: Your Length-Extrapolatable Diffusion Transformer without Positional Encoding",
arXiv 2503.04344).

LEDiT "needs no explicit PEs": "causal attention [...] implicitly impart[s] global
positional information to tokens, while enhancing locality [...] precisely distinguish[es]
adjacent tokens"; the project page: "the main difference lies in the incorporation of
causal attention and convolution after patchification". Here:

* no position embedding is added to any token;
* every layer attends causally in the raster (row-major) order of the patch grid: patch
  query ``i`` sees patch keys ``j <= i`` (:func:`causal_attention`);
* a locality module after the patch embedding (:class:`LocalityConv`, the encoding's
  :meth:`~LEDiTPositionEncoding.add_to_tokens` hook): a residual depthwise ``k x k``
  convolution over the token grid, zero-initialised (the identity at initialisation),
  optionally the sum of several dilations.

The choices the paper's text (as read for this module: its abstract and project page; the
method section was not available) leaves open are written down in
``docs/position_encodings.md`` (section ``ledit``) and in the class docstring.

Prefix tokens (``cls_token`` = ``J``: CLS, or ``J`` Jumbo tokens at the front) are global by
default: every patch query sees all prefix keys and the prefix queries attend to every
token; with ``global_prefix=False`` they are the first ``J`` tokens of the causal order
(a prefix query sees only the prefix keys up to itself), which makes the attention strictly
causal; the locality convolution still reaches ``d * (k // 2)`` patches ahead
(``locality=False`` for a strictly causal trunk).

Backends (``attn_backend``: ``sdpa``, ``chunked``, ``flex``, ``reference``; ``auto`` is
``sdpa``), all exact, are in :mod:`lookhere_dense.lookhere.attention.causal`.

Window blocks (ViTDet) are causal in each window's own raster order, with the padded keys
of border windows masked and the prefix tokens global as in a global block
(:func:`causal_window_attention`), whatever the backend.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from lookhere_dense.validation import check_bool, check_int

from ..attention import causal as _causal
from ..attention.causal import (
    CAUSAL_BACKENDS,
    CausalCall,
    attend,
    causal_block_mask,
    causal_window_attention,
    window_causal_mask,
)
from ..attention.common import flex_available
from ..bias import num_prefix_tokens
from ..cache import BoundedCache
from ..prefix_tokens import check_tokens
from .base import PositionEncoding, Trunk

#: the values of ``attn_backend`` ``'ledit'`` runs with
LEDIT_BACKENDS = CAUSAL_BACKENDS

__all__ = ['LEDiTPositionEncoding', 'LocalityConv', 'LEDIT_BACKENDS']


def __getattr__(name: str) -> Any:
    """The causal functions under this module's old path (they live in
    :mod:`lookhere_dense.lookhere.attention.causal`)."""
    if name in _causal.__all__:
        return getattr(_causal, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


# -- the locality module -------------------------------------------------------------------
class LocalityConv(nn.Module):
    """The locality module after the patch embedding: ``x + sum_d conv_d(x)``, a
    ``kernel_size`` convolution over the token grid per dilation ``d`` (``'same'`` zero
    padding, so any grid ``H, W >= 1`` keeps its shape), one bias.

    Args:
        channels: token channels ``D``.
        kernel_size: odd kernel side. Default: 3.
        dilations: one branch per dilation rate, summed. Default: ``(1,)``.
        depthwise: one ``k x k`` filter per channel (``groups = D``); False: a full
            ``D -> D`` convolution. Default: True.
        zero_init: weights and bias start at zero (the module starts as the identity, so
            a pretrained trunk's features are unchanged at the start of fine-tuning);
            False: PyTorch's ``Conv2d`` initialisation. Default: True.

    Parameters:
        weight: ``(len(dilations), D, 1 or D, k, k)``.
        bias: ``(D,)``.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 3,
        dilations: Sequence[int] = (1,),
        depthwise: bool = True,
        zero_init: bool = True,
    ):
        super().__init__()
        self.channels = check_int('ledit channels', channels)
        self.kernel_size = check_int('pos_encoding ledit kernel_size', kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(
                f'pos_encoding ledit kernel_size must be odd (a centred kernel), got {kernel_size}'
            )
        if isinstance(dilations, int) and not isinstance(dilations, bool):
            dilations = (dilations,)
        if not isinstance(dilations, (list, tuple)) or not dilations:
            raise ValueError(
                f'pos_encoding ledit dilations must be a positive int or a non-empty '
                f'list of them, got {dilations!r}'
            )
        for d in dilations:
            check_int('pos_encoding ledit dilations entry', d)
        if len(set(dilations)) != len(dilations):
            raise ValueError(f'pos_encoding ledit dilations repeat a rate: {list(dilations)}')
        self.dilations = tuple(int(d) for d in dilations)
        self.depthwise = check_bool('pos_encoding ledit depthwise', depthwise)
        self.zero_init = check_bool('pos_encoding ledit zero_init', zero_init)
        fan = 1 if depthwise else channels
        self.weight = nn.Parameter(
            torch.zeros(len(self.dilations), channels, fan, kernel_size, kernel_size)
        )
        self.bias = nn.Parameter(torch.zeros(channels))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.zero_init:
            self.weight.zero_()
            self.bias.zero_()
            return
        fan_in = self.weight.shape[2] * self.kernel_size**2
        for w in self.weight:  # nn.Conv2d's default, per branch
            nn.init.kaiming_uniform_(w, a=5**0.5)
        bound = fan_in**-0.5
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        """``(B, H*W, D)`` patch tokens (row-major) -> the same shape."""
        h, w = (int(s) for s in grid_size)
        if x.dim() != 3 or x.shape[1] != h * w or x.shape[2] != self.channels:
            raise ValueError(
                f'ledit locality module got tokens of shape {tuple(x.shape)}, expected '
                f'(B, {h}*{w}, {self.channels}) for the grid {(h, w)}'
            )
        img = x.transpose(1, 2).reshape(x.shape[0], self.channels, h, w)
        weight = self.weight.to(x.dtype)
        groups = self.channels if self.depthwise else 1
        pad = self.kernel_size // 2
        out = None
        for i, d in enumerate(self.dilations):
            y = F.conv2d(img, weight[i], None, padding=d * pad, dilation=d, groups=groups)
            out = y if out is None else out + y
        out = out + self.bias.to(x.dtype)[:, None, None]
        return x + out.flatten(2).transpose(1, 2)

    def extra_repr(self) -> str:
        return (
            f'channels={self.channels}, kernel_size={self.kernel_size}, '
            f'dilations={self.dilations}, depthwise={self.depthwise}, '
            f'zero_init={self.zero_init}'
        )


# -- the encoding --------------------------------------------------------------------------
class LEDiTPositionEncoding(PositionEncoding):
    """``'ledit'``: no position embedding, causal attention in the patch grid's raster
    order, and a locality module after the patch embedding (LEDiT, Zhang et al. 2025).

    Decisions (the paper states causal attention, no explicit PE and "convolution after
    patchification"; the rest is this implementation's):

    * causal in every layer, row-major order over the grid of each forward (any size: a
      larger grid is a longer sequence, nothing to extrapolate);
    * prefix tokens (``cls_token`` = ``J``) global by default (``global_prefix``); their
      keys are seen by every patch, their queries see every token. Through them a patch
      can learn of later patches one layer later, so only ``global_prefix=False`` (or
      ``J = 0``) makes the attention strictly causal (the locality convolution still sees
      ``d * (k // 2)`` patches ahead; ``locality=False`` for a strictly causal trunk);
    * windows: causal in each window's own raster order, padded keys masked, prefix global;
    * the locality module (:class:`LocalityConv`): residual, depthwise ``3 x 3``, every
      channel, zero-initialised, applied to the patch tokens only (prefix tokens have no
      grid position) -- all options.

    Args:
        embed_dims: token channels ``D``.
        attn_backend: one of :data:`LEDIT_BACKENDS`. Default: ``'auto'``.
        block_size: query rows per block of ``'chunked'``; None or 0: automatic.
            Default: None.
        kernel_size, dilations, depthwise, zero_init: of :class:`LocalityConv`.
        locality: build the locality module; False: causal attention only (an ablation;
            no parameters). Default: True.
        global_prefix: prefix queries attend to every token; False: causally among the
            prefix. Default: True.

    Parameters:
        locality.weight, locality.bias: see :class:`LocalityConv` (with ``locality``).
    """

    name = 'ledit'
    options = ('kernel_size', 'dilations', 'depthwise', 'zero_init', 'locality', 'global_prefix')

    def __init__(
        self,
        embed_dims: int,
        attn_backend: str = 'auto',
        block_size: Optional[int] = None,
        kernel_size: int = 3,
        dilations: Union[int, Sequence[int]] = (1,),
        depthwise: bool = True,
        zero_init: bool = True,
        locality: bool = True,
        global_prefix: bool = True,
    ):
        super().__init__()
        if attn_backend not in LEDIT_BACKENDS:
            raise ValueError(
                f"pos_encoding='ledit' cannot run attn_backend={attn_backend!r}; allowed: "
                f'{list(LEDIT_BACKENDS)} (causal masking is exact in each)'
            )
        if attn_backend == 'flex' and not flex_available():
            raise ValueError(
                f"pos_encoding='ledit' with attn_backend='flex' needs torch's "
                f'flex_attention (torch >= 2.5), not in torch {torch.__version__}'
            )
        if block_size is not None:
            check_int('ledit attn_block_size', block_size, minimum=0, description='>= 0')
        self.attn_backend = attn_backend
        self.block_size = block_size or None
        self.global_prefix = check_bool('pos_encoding ledit global_prefix', global_prefix)
        check_bool('pos_encoding ledit locality', locality)
        self.locality: Optional[LocalityConv] = (
            LocalityConv(embed_dims, kernel_size, dilations, depthwise, zero_init)
            if locality
            else None
        )
        self.last_backend: Optional[str] = None
        #: window masks and flex block masks per (kind, grid / tokens, J, device)
        self._cache = BoundedCache(8)

    @classmethod
    def from_spec(
        cls, options: Mapping[str, Any], trunk: Trunk, **spec: Any
    ) -> 'LEDiTPositionEncoding':
        return cls(trunk.embed_dims, trunk.attn_backend, trunk.attn_block_size, **options)

    def add_to_tokens(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        """The locality module on the patch tokens ``(B, H*W, D)`` (identity without it)."""
        return x if self.locality is None else self.locality(x, grid_size)

    def choose_backend(self) -> str:
        """The backend of the next call: the configured one; ``'auto'`` -> ``'sdpa'``."""
        return 'sdpa' if self.attn_backend == 'auto' else self.attn_backend

    @staticmethod
    def _checked_prefix(
        q: Tensor, k: Tensor, grid_size: Tuple[int, int], cls_token: Union[bool, int]
    ) -> int:
        """The number ``J`` of prefix tokens, once ``q`` and ``k`` hold ``J + H*W`` tokens."""
        prefix = num_prefix_tokens(cls_token)
        check_tokens('ledit attention', q.shape[-2], grid_size, prefix, k.shape[-2])
        return prefix

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
        dropout_p: float = 0.0,
        tokens: Optional[Tensor] = None,
    ) -> Tensor:
        prefix = self._checked_prefix(q, k, grid_size, cls_token)
        backend = self.choose_backend()
        self.last_backend = backend
        mask = None
        if backend == 'flex':
            mask = self._cache.get_or_create(
                ('flex', q.shape[-2], prefix, self.global_prefix, str(q.device)),
                lambda: causal_block_mask(q.shape[-2], prefix, self.global_prefix, q.device),
            )
        call = CausalCall(
            q, k, v, prefix, self.global_prefix, dropout_p, backend, self.block_size, mask
        )
        return attend(call)

    def window_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        window_size: int,
        cls_token: Union[bool, int],
        dropout_p: float = 0.0,
        tokens: Optional[Tensor] = None,
    ) -> Tensor:
        prefix = self._checked_prefix(q, k, grid_size, cls_token)
        ws = check_int('ledit window_size', window_size)
        grid = (int(grid_size[0]), int(grid_size[1]))
        mask = self._cache.get_or_create(
            ('window', grid, ws, prefix, str(q.device)),
            lambda: window_causal_mask(grid, ws, prefix, q.device),
        )
        return causal_window_attention(
            q, k, v, grid, ws, prefix, self.global_prefix, dropout_p, mask
        )

    def reset_parameters(self) -> None:
        if self.locality is not None:
            self.locality.reset_parameters()

    def clear_caches(self) -> None:
        """Drop the cached window masks and flex block masks."""
        self._cache.clear()

    def extra_repr(self) -> str:
        return (
            f'name={self.name!r}, attn_backend={self.attn_backend!r}, '
            f'global_prefix={self.global_prefix}'
        )
