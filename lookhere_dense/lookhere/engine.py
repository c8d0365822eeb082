"""The LookHere attention engine of one model: backend choice and bias caches.

:class:`LookHereAttentionEngine` owns the caches (tables per grid and dtype, dense biases,
window biases, flex block masks and score functions; all bounded, keyed by grid or window
size, device and dtype), chooses a backend per call (``auto``, see
:meth:`~LookHereAttentionEngine.choose_backend`), and is shared by all layers of a model:
layers differ only in which table slice they read, and layers with the same head string
share one block mask. Nothing here is part of a ``state_dict``. The backends themselves
live in :mod:`.attention`, one module each; the engine builds an
:class:`~.attention.common.AttentionCall` and hands it to the chosen one's ``attend``
(``auto``: :mod:`.attention.chooser`).

Slopes. Called plainly, the engine computes the bias at the slopes of its config, and
caches everything. Called with ``slopes=`` (a :class:`~.slopes.LookHereSlopes`, what
``lh_config=dict(..., learnable_slopes=True)`` gives the position encoding), it computes
each call's table of that layer (``heads x (2H-1) x (2W-1)``, float64, cheap) from the
current slopes and the cached *slope-free* distances and fields of view
(:meth:`~LookHereAttentionEngine.distance_tables`); every slope-dependent cache (tables,
dense and window biases, flex score functions) is bypassed, so a changed slope changes the
next call, and gradients reach the slopes through every backend. The slope-free caches
(distances, flex block masks and token orders, window padding masks) are used as before.

``torch.compile``. The engine's calls are not traced (``torch.compiler.disable``): inside a
compiled model attention runs as here (fused SDPA, the chunked blocks, flex compiled on its
own), and the block around it (norms, projections, MLP) is compiled. The caches, the
backend choice and the Python loops over blocks therefore never become guards or unrolled
graphs: one compilation per input shape, not per layer or call.

``torch.jit.trace`` (and what traces with it, such as mmengine's FLOP counter
``get_model_complexity_info``). The grid comes from the traced input's shape as plain
ints, so a traced graph is specialised to that image size (as timm's ViT is), and the
cached tables enter it as constants. ``auto`` skips the backends the tracer cannot record
(:data:`UNTRACEABLE`: the fused kernel's custom ops, flex, the Triton kernel); a model fixed to one
of them runs the backend ``auto`` would then pick for the trace, with a warning. Every
backend computes the same attention.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from torch import Tensor

from ..validation import check_int
from .attention import chooser
from .attention.chooser import BACKENDS, REGISTRY, RETIRED
from .attention.common import AttentionCall, AttentionRequest
from .attention.flex import flex_index, flex_score_mod, lookhere_block_mask, tile_order
from .attention.fused import FUSED_MIN_TOKENS
from .attention.tiled import TILED_MIN_TOKENS
from .attention.windows import (
    attend_in_windows,
    padded_grid,
    sdpa_in_windows,
    window_key_mask,
)
from .bias import (
    DistanceTable,
    GridBias,
    bias_from_distances,
    build_grid_bias,
    cast_bias,
    distance_table,
    num_prefix_tokens,
)
from .cache import BoundedCache
from .config import LookHereConfig
from .prefix_tokens import check_tokens
from .slopes import LookHereSlopes

__all__ = [
    'LookHereAttentionEngine',
    'UNTRACEABLE',
    'FUSED_MIN_TOKENS',
    'TILED_MIN_TOKENS',
]

#: the thresholds of ``auto`` live in their backends (:mod:`.attention.fused`,
#: :mod:`.attention.tiled`); imported here for old importers

#: backends ``torch.jit.trace`` cannot record, with the reason ``auto`` gives for skipping
#: them while a trace runs
UNTRACEABLE: Dict[str, str] = {
    'fused': 'cannot be recorded by torch.jit.trace (its kernel ops return Python values)',
    'flex': 'cannot be recorded by torch.jit.trace (flex_attention runs through dynamo)',
    # the tracer would record the output buffer, not the kernel's writes into it
    'triton': 'cannot be recorded by torch.jit.trace (a Triton kernel launch)',
}


class LookHereAttentionEngine:
    """LookHere attention for one model: bias caches and backend choice.

    Args:
        config: the LookHere configuration.
        depth: number of layers that ask for a bias (layer index ``0..depth-1``).
        num_heads: heads per layer.
        backend: one of :data:`~.attention.chooser.BACKENDS`. ``auto`` asks the backends
            in :data:`~.attention.chooser.AUTO_ORDER` (fused, tiled, sdpa, flex, chunked) and takes the first whose ``can_run`` agrees (:meth:`explain` says
            why the others did not). Default: ``'auto'``.
        block_size: query rows per block of the ``chunked`` backend; None or 0 sizes
            blocks automatically (:func:`~.chunked.auto_block_rows`). Default: None.
        max_dense_mb: budget for the cached dense biases (all layers, all grids; also the
            byte bound of that cache). Default: 1024.
        cache_size: grids / windows kept per cache (times ``depth`` for per-layer
            entries). Default: 4.
        flex_compile: compile ``flex_attention``; None: on CUDA only. Default: None.
        flex_tiles: run flex in tile order (:func:`~.flex.tile_order`), where directed heads
            skip more tiles; False: the model's row-major order. Default: True.
    """

    def __init__(
        self,
        config: LookHereConfig,
        depth: int,
        num_heads: int,
        backend: str = 'auto',
        block_size: Optional[int] = None,
        max_dense_mb: float = 1024,
        cache_size: int = 4,
        flex_compile: Optional[bool] = None,
        flex_tiles: bool = True,
    ):
        if backend in RETIRED:
            warnings.warn(
                f'LookHere attention backend {backend!r} was removed; '
                f'{RETIRED[backend]!r} runs in its place',
                stacklevel=2,
            )
            backend = RETIRED[backend]
        if backend not in BACKENDS:
            raise ValueError(
                f'unknown LookHere attention backend {backend!r}; allowed: {list(BACKENDS)}'
            )
        if block_size is not None and (not isinstance(block_size, int) or block_size < 0):
            raise ValueError(
                f'block_size must be None or an int >= 0 (0: automatic), got {block_size!r}'
            )
        if not max_dense_mb >= 0:  # also NaN
            raise ValueError(f'max_dense_mb must be >= 0, got {max_dense_mb}')
        check_int('cache_size', cache_size)
        config.validate(num_heads, depth)
        self.config = config
        self.depth = depth
        self.num_heads = num_heads
        self.backend = backend
        self.block_size = block_size or None
        self.max_dense_bytes = max_dense_mb * 2**20
        self.flex_compile = flex_compile
        #: the ``torch.compile`` backend of compiled flex (``'aot_eager'``: the CPU
        #: simulation of ``tools/gpu_check.sh``, dynamo's guards without code generation)
        self.flex_compile_backend = 'inductor'
        self.flex_tiles = flex_tiles
        #: relative tables per (grid, device, dtype)
        self.tables = BoundedCache(2 * cache_size)
        #: dense (heads, T, T) biases per (layer, grid, cls, device, dtype): global layers'
        #: and window-sized ones (a window's bias is the dense bias of a (ws, ws) grid),
        #: plus window padding masks under ('window_pad', grid, ws, cls, device, dtype)
        self.dense = BoundedCache(cache_size * (depth + 1), max_bytes=self.max_dense_bytes)
        #: flex block masks per (head string, grid, cls, device): shared across layers
        self.block_masks = BoundedCache(cache_size * max(1, len(config.direction_strings)))
        #: flex score_mods per (layer, grid, cls, device): one function object per layer
        self.score_mods = BoundedCache(cache_size * depth)
        #: flex token orders per (grid, cls, device)
        self.orders = BoundedCache(cache_size)
        #: flex callbacks' per-token index arrays per (grid, cls, device, tile order or not)
        self.flex_indices = BoundedCache(cache_size)
        #: slope-free distance tables per (grid, device), used with ``slopes=``
        self.distances = BoundedCache(2 * cache_size)
        #: tiled plans per (fields of view, grid): shared across layers
        self.tiled_plans = BoundedCache(cache_size * max(1, len(config.direction_strings)))
        #: fused kernel plans per (fields of view, grid, tile): shared across layers
        self.fused_plans = BoundedCache(cache_size * max(1, len(config.direction_strings)))
        #: triton kernel plans per (fields of view, grid, cls, device): shared across layers
        self.triton_plans = BoundedCache(cache_size * max(1, len(config.direction_strings)))
        self.last_backend: Optional[str] = None
        #: backends that raised when ``auto`` chose them (skipped from then on)
        self.failed: set = set()
        #: fixed backends replaced under torch.jit.trace (warned once each)
        self._warned_untraceable: set = set()

    def _caches(self) -> Dict[str, BoundedCache]:
        return dict(
            tables=self.tables,
            dense=self.dense,
            block_masks=self.block_masks,
            score_mods=self.score_mods,
            orders=self.orders,
            flex_indices=self.flex_indices,
            distances=self.distances,
            tiled_plans=self.tiled_plans,
            fused_plans=self.fused_plans,
            triton_plans=self.triton_plans,
        )

    def reset(self, config: Optional[LookHereConfig] = None) -> None:
        """Drop all caches (and switch to ``config`` if given)."""
        if config is not None:
            config.validate(self.num_heads, self.depth)
            self.config = config
        for cache in self._caches().values():
            cache.clear()

    def cache_info(self) -> Dict[str, Dict[str, int]]:
        """Per cache: ``size``, ``hits``, ``misses``, ``evictions``, ``bytes``."""
        return {name: cache.stats() for name, cache in self._caches().items()}

    # -- cached pieces -------------------------------------------------------------------
    def grid_bias(
        self, grid_size: Tuple[int, int], device: torch.device, dtype: torch.dtype = torch.float32
    ) -> GridBias:
        """Relative tables of every layer for ``grid_size`` on ``device`` in ``dtype``.

        Each dtype's tables are cast once from the float64 construction (bf16-rounded
        biases are exact in bfloat16 and float32).
        """
        key = (tuple(grid_size), str(device), dtype)
        return self.tables.get_or_create(
            key,
            lambda: build_grid_bias(
                self.config,
                tuple(grid_size),
                self.depth,
                self.num_heads,
                device=device,
                dtype=dtype,
            ),
        )

    def dense_bias(
        self,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
        device: torch.device,
        dtype: torch.dtype,
    ) -> Tensor:
        """The ``(heads, T, T)`` bias of ``layer`` in ``dtype``, built once per grid
        (unless it alone exceeds ``max_dense_mb``)."""
        key = (layer, tuple(grid_size), cls_token, str(device), dtype)
        return self.dense.get_or_create(
            key, lambda: self.grid_bias(grid_size, device, dtype).dense(layer, cls_token)
        )

    def window_bias(
        self,
        layer: int,
        window_size: int,
        cls_token: Union[bool, int],
        device: torch.device,
        dtype: torch.dtype,
    ) -> Tensor:
        """The ``(heads, T_w, T_w)`` bias of a ``window_size`` x ``window_size`` window
        (the dense bias of a window-sized grid, cached like one)."""
        ws = int(window_size)
        return self.dense_bias(layer, (ws, ws), cls_token, device, dtype)

    def block_mask(
        self,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
        device: torch.device,
    ):
        """The flex ``BlockMask`` of ``layer``'s fields of view (shared by all layers with
        the same head string), or None when nothing is blocked."""
        direction = self.config.layer_direction(layer)
        key = (direction, tuple(grid_size), cls_token, str(device))
        return self.block_masks.get_or_create(
            key,
            lambda: lookhere_block_mask(
                self.grid_bias(grid_size, device),
                layer,
                cls_token,
                order=self.flex_order(grid_size, cls_token, device),
                index=self.flex_index(grid_size, cls_token, device),
            ),
        )

    def score_mod(
        self,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
        device: torch.device,
    ) -> Callable:
        """The flex ``score_mod`` of ``layer`` (the same function object on every call)."""
        key = (layer, tuple(grid_size), cls_token, str(device))
        return self.score_mods.get_or_create(
            key,
            lambda: flex_score_mod(
                self.grid_bias(grid_size, device),
                layer,
                cls_token,
                self.flex_order(grid_size, cls_token, device),
                index=self.flex_index(grid_size, cls_token, device),
            ),
        )

    def flex_index(
        self, grid_size: Tuple[int, int], cls_token: Union[bool, int], device: torch.device
    ) -> Callable:
        """The flex callbacks' ``(q_idx, kv_idx) -> (is_cls, table_index, key_patch)`` for
        ``grid_size`` in the engine's token order (cached: a learnable-slopes step builds a
        fresh ``score_mod`` per layer around it, not fresh index arrays)."""
        key = (tuple(grid_size), cls_token, str(device), self.flex_tiles)
        return self.flex_indices.get_or_create(
            key,
            lambda: flex_index(
                tuple(grid_size),
                cls_token,
                self.flex_order(grid_size, cls_token, device),
                device,
            ),
        )

    def flex_order(
        self, grid_size: Tuple[int, int], cls_token: Union[bool, int], device: torch.device
    ) -> Optional[Tensor]:
        """The token order flex runs in (:func:`~.flex.tile_order`), or None
        (``flex_tiles=False``)."""
        if not self.flex_tiles:
            return None
        key = (tuple(grid_size), cls_token, str(device))
        return self.orders.get_or_create(
            key, lambda: tile_order(tuple(grid_size), cls_token, device=device)
        )

    def distance_tables(
        self, grid_size: Tuple[int, int], device: torch.device
    ) -> Dict[str, DistanceTable]:
        """The slope-free :class:`~.bias.DistanceTable` of each head string of the config
        for ``grid_size`` on ``device`` (cached; what learnable slopes multiply)."""
        grid = tuple(grid_size)

        def make() -> Dict[str, DistanceTable]:
            out = {}
            for s in self.config.direction_strings:
                t = distance_table(self.config, s, self.num_heads, grid)
                out[s] = DistanceTable(
                    t.distance.to(device),
                    t.visible.to(device),
                    None if t.key is None else t.key.to(device),
                    t.head_slopes.to(device),
                )
            return out

        return self.distances.get_or_create((grid, str(device)), make)

    def slope_bias(
        self,
        layer: int,
        grid_size: Tuple[int, int],
        device: torch.device,
        dtype: torch.dtype,
        slopes: LookHereSlopes,
    ) -> GridBias:
        """The tables of ``layer`` at the current ``slopes``, as a one-layer
        :class:`~.bias.GridBias` (index 0), computed on every call (never cached: the
        slopes change at every optimizer step) and differentiable in the slopes.

        The same float64 operations as the fixed-slope tables
        (:func:`~.bias.bias_from_distances`), so at the config's slopes the result equals
        :meth:`grid_bias`'s layer ``layer`` bit for bit.
        """
        table = self.distance_tables(grid_size, device)[self.config.layer_direction(layer)]
        scale, head = slopes.layer(layer)
        rounding = self.config.bias_rounding
        rel = bias_from_distances(table.distance, head, scale, rounding, table.visible)
        key = None
        if table.key is not None:
            key = (bias_from_distances(table.key, head, scale, rounding) + 0.0).flatten(1)
            key = cast_bias(key, dtype)[None]
        return GridBias(tuple(grid_size), cast_bias(rel, dtype)[None], key, table.visible[None])

    def dense_or_slope_bias(
        self,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
        device: torch.device,
        dtype: torch.dtype,
        slopes: Optional[LookHereSlopes],
    ) -> Tensor:
        """:meth:`dense_bias`, or the dense bias at ``slopes`` (built every call)."""
        if slopes is None:
            return self.dense_bias(layer, grid_size, cls_token, device, dtype)
        return self.slope_bias(layer, grid_size, device, dtype, slopes).dense(0, cls_token)

    def layer_bias(
        self,
        layer: int,
        grid_size: Tuple[int, int],
        device: torch.device,
        dtype: torch.dtype,
        slopes: Optional[LookHereSlopes],
    ) -> Tuple[GridBias, int]:
        """``(tables, index)`` of ``layer``: the cached :meth:`grid_bias` and ``layer``, or
        the one-layer :meth:`slope_bias` at ``slopes`` and 0."""
        if slopes is None:
            return self.grid_bias(grid_size, device, dtype), layer
        return self.slope_bias(layer, grid_size, device, dtype, slopes), 0

    def request(
        self,
        tokens: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        dropout_p: float = 0.0,
        slope_grads: bool = False,
        training: bool = False,
        auto: bool = True,
    ) -> AttentionRequest:
        """The :class:`~.attention.common.AttentionRequest` the backends' ``can_run`` are
        asked (with this engine's dense-bias budget and failed backends)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return AttentionRequest(
            tokens=tokens,
            device=torch.device(device),
            dtype=dtype,
            dropout_p=dropout_p,
            slope_grads=slope_grads,
            training=training,
            auto=auto,
            dense_bytes=self.depth * self.num_heads * tokens * tokens * itemsize,
            max_dense_bytes=self.max_dense_bytes,
            compiled_flex=self.flex_compile,
            failed=tuple(sorted(self.failed)),
        )

    def explain(self, *args: Any, **kwargs: Any) -> List[Tuple[str, Optional[str]]]:
        """``[(backend, why it cannot run or None)]``: the backends ``auto`` asked for a
        call (the arguments of :meth:`request`, without ``auto``), in order, the last one
        chosen (:func:`~.attention.chooser.explain`); a fixed ``backend`` is the one entry
        ``(backend, None)``, or its ``can_run`` reason."""
        request = self.request(*args, **kwargs)
        if self.backend != 'auto':
            fixed = replace(request, auto=False)
            return [(self.backend, REGISTRY[self.backend].can_run(fixed))]
        return chooser.explain(request, UNTRACEABLE if torch.jit.is_tracing() else None)

    def choose_backend(self, *args: Any, **kwargs: Any) -> str:
        """The backend that runs a call (the arguments of :meth:`request`: ``tokens,
        device, dtype, dropout_p, slope_grads, training``): the last of :meth:`explain`,
        i.e. for ``auto`` the first of :data:`~.attention.chooser.AUTO_ORDER` whose
        ``can_run`` answers None (a fixed ``backend`` is returned as is)."""
        if self.backend != 'auto':
            return self.backend
        return self.explain(*args, **kwargs)[-1][0]

    # -- attention -----------------------------------------------------------------------
    @torch.compiler.disable
    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
        dropout_p: float = 0.0,
        backend: Optional[str] = None,
        slopes: Optional[LookHereSlopes] = None,
    ) -> Tensor:
        """Attention of ``layer`` for ``q, k, v`` of shape ``(B, heads, T, d)``.

        ``T`` must be ``J + H*W`` for ``grid_size = (H, W)``, with ``J = cls_token`` the
        number of global prefix tokens at the front (CLS, or Jumbo tokens; True = 1; no
        bias to or from them, they see and are seen by every token).
        ``slopes``: learnable slopes to compute the bias at (see the module docstring);
        None: the config's slopes, cached. Default: None.

        Returns:
            ``(B, heads, T, d)``.
        """
        cls_token = num_prefix_tokens(cls_token)
        n = check_tokens('attention', q.shape[-2], grid_size, cls_token, k.shape[-2])
        if q.shape[1] != self.num_heads:
            raise ValueError(
                f'attention got {q.shape[1]} heads, the LookHere config was '
                f'built for {self.num_heads}'
            )
        if not 0 <= layer < self.depth:
            raise ValueError(f'layer {layer} out of range for depth {self.depth}')
        slope_grads = (
            slopes is not None
            and torch.is_grad_enabled()
            and any(p.requires_grad for p in slopes.parameters())
        )
        chosen_by_auto = backend is None and self.backend == 'auto'
        training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        backend = backend or self.choose_backend(
            n, q.device, q.dtype, dropout_p, slope_grads, training
        )
        if backend not in BACKENDS or backend == 'auto':
            raise ValueError(
                f'unknown LookHere attention backend {backend!r}; allowed: {list(BACKENDS[1:])}'
            )
        if torch.jit.is_tracing() and backend in UNTRACEABLE:
            backend = self._traceable_backend(backend, n, q, dropout_p, slope_grads, training)
        self.last_backend = backend
        call = AttentionCall(
            q, k, v, layer, tuple(grid_size), cls_token, dropout_p, slopes, slope_grads, self
        )
        module = REGISTRY[backend]
        if not (chosen_by_auto and getattr(module, 'FALLIBLE', False)):
            return module.attend(call)
        try:
            return module.attend(call)
        except Exception as err:  # pragma: no cover - compile problems are platform specific
            self.failed.add(backend)
            fallback = self.choose_backend(n, q.device, q.dtype, dropout_p, slope_grads, training)
            self.last_backend = fallback
            warnings.warn(
                f'LookHere {backend} attention failed ({type(err).__name__}: {err}); '
                f'falling back to the {fallback} backend for this model',
                stacklevel=2,
            )
            return REGISTRY[fallback].attend(call)

    def _traceable_backend(
        self,
        backend: str,
        tokens: int,
        q: Tensor,
        dropout_p: float,
        slope_grads: bool,
        training: bool,
    ) -> str:
        """The backend that runs in place of the untraceable ``backend`` under
        ``torch.jit.trace``: ``auto``'s choice for the trace (warned once per engine)."""
        request = self.request(tokens, q.device, q.dtype, dropout_p, slope_grads, training)
        chosen = chooser.explain(request, UNTRACEABLE)[-1][0]
        if backend not in self._warned_untraceable:
            self._warned_untraceable.add(backend)
            warnings.warn(
                f'LookHere attention backend {backend!r} {UNTRACEABLE[backend]}: the traced '
                f'graph runs the {chosen!r} backend (the same attention)',
                stacklevel=3,
            )
        return chosen

    @torch.compiler.disable
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
        slopes: Optional[LookHereSlopes] = None,
    ) -> Tensor:
        """ViTDet-style window attention with the LookHere bias of a window-sized grid.

        Patches attend within their ``window_size`` x ``window_size`` window (grids that
        are not a multiple are padded; padded keys are masked out, so a border window acts
        like a smaller one). The window bias is the bias of a ``(ws, ws)`` grid, the same
        for every window, built once per (window size, layer) and cached.

        The ``cls_token`` global prefix tokens (CLS, or Jumbo tokens; True = 1) keep
        LookHere's global behaviour: every window also sees the prefix keys (bias 0), and
        the prefix queries attend to all tokens (bias 0), exactly as in a global block.

        Windows run as one 4-D batch ``(B * nWin, heads, T_w, d)`` (with padding: one
        call per image, as the padding mask differs per window).

        Args:
            q, k, v: ``(B, heads, T, d)``, ``T = J + H*W`` (``J = cls_token``).
            slopes: learnable slopes (the window bias is then built every call); None:
                the config's (cached). Default: None.

        Returns:
            ``(B, heads, T, d)``.
        """
        ws = int(window_size)
        cls_token = num_prefix_tokens(cls_token)
        window_bias = self.dense_or_slope_bias(
            layer, (ws, ws), cls_token, q.device, q.dtype, slopes
        )
        pad = None
        if padded_grid(grid_size, ws) != tuple(grid_size):
            key = ('window_pad', tuple(grid_size), ws, cls_token, str(q.device), q.dtype)
            pad = self.dense.get_or_create(
                key, lambda: window_key_mask(grid_size, ws, cls_token, q.device, q.dtype)
            )

        def attend(qw: Tensor, kw: Tensor, vw: Tensor) -> Tensor:
            return sdpa_in_windows(qw, kw, vw, window_bias, pad, dropout_p)

        return attend_in_windows(q, k, v, grid_size, ws, cls_token, attend, dropout_p)
