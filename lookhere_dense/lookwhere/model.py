"""LookWhere (Fuller et al., NeurIPS 2025, arXiv 2505.18051) with a LookHere extractor, as
a dense-prediction backbone: selector -> top-k patches -> extractor -> dense NCHW maps.
Torch alone."""

from __future__ import annotations

import logging
from numbers import Integral
from typing import Any, Dict, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor

from .extractor import LookWhereExtractor
from .fill import FILL_MODES, build_fill
from .select import resolve_k, top_k_with_coverage
from .selector import LookWhereSelector
from .subset import SUBSET_BACKENDS

#: the kept fraction of a model given neither ``k`` nor ``k_ratio``
DEFAULT_K_RATIO = 0.25

__all__ = ['LookWhere']

logger = logging.getLogger(__name__)


class LookWhere(nn.Module):
    """Selector + extractor + dense fill.

    ``forward(images, k=None, k_ratio=None)`` returns, like the LookHere trunk, a tuple of
    ``(B, D, ceil(H/p), ceil(W/p))`` maps (one per extractor ``out_indices``): every patch
    of the high-resolution grid has features, the kept ones their own, the others filled
    (``fill``), so Segmenter heads and SimpleFPN sit on it unchanged.

    Args:
        selector (dict | LookWhereSelector): :class:`~.selector.LookWhereSelector`
            arguments or module. Default: ``{}`` (ViT-T-wide, 3 blocks, 64x64 input).
        extractor (dict | LookWhereExtractor): :class:`~.extractor.LookWhereExtractor`
            (LookHere ViT) arguments or module. Default: ``{}`` (the trunk's defaults).
        k (int, optional): default kept patches per image. Default: None.
        k_ratio (float, optional): default kept fraction; not with ``k``. Default: None
            (0.25 without ``k``). Setting :attr:`k` or :attr:`k_ratio` later makes it the
            default (the other is cleared).
        fill (str): ``'nearest'`` (each patch the nearest kept patch's features),
            ``'idw'`` (the official LookWhere's: the inverse-distance-weighted mean of the
            5 nearest, :func:`~.fill.idw_fill`) or ``'propagate'``
            (:class:`~.fill.PropagateFill`, learned). Default: ``'nearest'``.
        use_selector_prefix (bool): the extractor starts from the selector's CLS (and
            register) tokens, as the official; False: from its own CLS token.
            Default: True.
        freeze_selector (bool): no gradients to the selector and the selector always in
            eval mode (fine-tuning as in the paper). Default: False.
        attn_path (str): ``'auto'``, ``'coords'``, ``'sdpa-coords'`` or
            ``'chunked-coords'`` (see :class:`~.subset.SubsetAttention`; the extractor's
            ``max_subset_bias_mb`` chooses between the last two for the first two).
            Default: ``'auto'``.
        coverage (float): share of ``k`` kept on a regular lattice, the rest by the
            selector's scores (:func:`~.select.top_k_with_coverage`); 0 is the official
            plain top-k. Default: 0.0.

    Attributes:
        last_k (int | None), last_backend (str | None): of the last forward.
    """

    def __init__(
        self,
        selector: Union[Mapping[str, Any], LookWhereSelector, None] = None,
        extractor: Union[Mapping[str, Any], LookWhereExtractor, None] = None,
        k: Optional[int] = None,
        k_ratio: Optional[float] = None,
        fill: str = 'nearest',
        use_selector_prefix: bool = True,
        freeze_selector: bool = False,
        attn_path: str = 'auto',
        coverage: float = 0.0,
    ):
        super().__init__()
        if not 0 <= coverage <= 1:
            raise ValueError(f'LookWhere: coverage={coverage!r} is outside [0, 1]')
        self.coverage = float(coverage)
        if fill not in FILL_MODES:
            raise ValueError(f'LookWhere: fill={fill!r} is not one of {list(FILL_MODES)}')
        if attn_path not in SUBSET_BACKENDS:
            raise ValueError(
                f'LookWhere: attn_path must be one of {list(SUBSET_BACKENDS)}, got {attn_path!r}'
            )
        self.selector = (
            selector
            if isinstance(selector, nn.Module)
            else LookWhereSelector(**dict(selector or {}))
        )
        self.extractor = (
            extractor
            if isinstance(extractor, nn.Module)
            else LookWhereExtractor(**dict(extractor or {}))
        )
        # the images' errors name this model (they are LookWhere's input)
        self.extractor.trunk.patch_embed.owner = type(self).__name__
        if k is not None and k_ratio is not None:
            raise ValueError(
                f'LookWhere: give k or k_ratio, not both (got k={k!r}, k_ratio={k_ratio!r})'
            )
        if k is not None:
            self.k = k
        else:
            self.k_ratio = DEFAULT_K_RATIO if k_ratio is None else k_ratio
        d_sel, d_ext = self.selector.embed_dims, self.extractor.embed_dims
        self.use_selector_prefix = bool(use_selector_prefix)
        self.prefix_proj: nn.Module = (
            nn.Linear(d_sel, d_ext) if use_selector_prefix and d_sel != d_ext else nn.Identity()
        )
        self.fill_mode = fill
        self.fill = build_fill(fill, d_ext)
        self.freeze_selector = bool(freeze_selector)
        self.attn_path = attn_path
        self.last_k: Optional[int] = None
        self.last_backend: Optional[str] = None
        if self.freeze_selector:
            for p in self.selector.parameters():
                p.requires_grad = False
            self.selector.eval()  # from the start, not from the first train() / eval()

    @property
    def k(self) -> Optional[int]:
        """The default kept patches per image (None: :attr:`k_ratio` decides). Setting it
        clears :attr:`k_ratio`; ``k <= N`` is checked per call, at the grid's ``N``."""
        return self._k

    @k.setter
    def k(self, value: Optional[int]) -> None:
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise TypeError(f'LookWhere: k must be an int, got {value!r}')
            if value < 1:
                raise ValueError(
                    f'LookWhere: k={value} keeps no patch: give k >= 1 (at most the '
                    "high-resolution grid's patches, checked per call)"
                )
            self._k_ratio = None
        self._k = None if value is None else int(value)

    @property
    def k_ratio(self) -> Optional[float]:
        """The default kept fraction, in ``(0, 1]`` (None: :attr:`k` decides). Setting it
        clears :attr:`k` (the last one set is the default)."""
        return self._k_ratio

    @k_ratio.setter
    def k_ratio(self, value: Optional[float]) -> None:
        if value is not None:
            resolve_k(1, k_ratio=value)  # the per-call rules: a number in (0, 1]
            self._k = None
        self._k_ratio = value

    @property
    def out_indices(self):
        return self.extractor.trunk.out_indices

    def train(self, mode: bool = True) -> 'LookWhere':
        super().train(mode)
        if self.freeze_selector:
            self.selector.eval()
        return self

    def resolve_k(
        self, num_patches: int, k: Optional[int] = None, k_ratio: Optional[float] = None
    ) -> int:
        """:func:`~.select.resolve_k` with this model's defaults."""
        return resolve_k(num_patches, k, k_ratio, self.k, self.k_ratio)

    def check_images(self, images: Tensor) -> None:
        """The extractor's input checks (shape, channels, dtype, size, finite values), made
        before the selector resizes the images (its errors named a 3-D tensor after
        ``F.interpolate`` and channels-last images as 96 channels).

        Raises:
            TypeError, ValueError: naming the problem, as the trunk's patch embedding does.
        """
        self.extractor.trunk.patch_embed.check_images(images)

    def run_selector(self, images: Tensor, grid: Tuple[int, int]) -> Dict[str, Any]:
        """The selector's output for ``grid`` (without gradients when it is frozen)."""
        if self.freeze_selector:
            with torch.no_grad():
                return self.selector(images, grid)
        return self.selector(images, grid)

    def select(
        self, images: Tensor, k: Optional[int] = None, k_ratio: Optional[float] = None
    ) -> Dict[str, Any]:
        """Run the selector and pick the top-k patches.

        Returns:
            dict: ``keep`` ``(B, K)`` (ascending), ``scores`` ``(B, N)``,
            ``prefix_tokens`` ``(B, J, D_sel)``, ``grid`` (high resolution), ``k``.
        """
        self.check_images(images)
        grid = self.extractor.grid_of(images.shape[-2:])
        n = grid[0] * grid[1]
        kk = self.resolve_k(n, k, k_ratio)
        out = self.run_selector(images, grid)
        out['keep'] = top_k_with_coverage(out['scores'], kk, grid, self.coverage)
        out['grid'] = grid
        out['k'] = kk
        return out

    def forward_tokens(
        self,
        images: Tensor,
        k: Optional[int] = None,
        k_ratio: Optional[float] = None,
        keep: Optional[Tensor] = None,
        selection: Optional[Dict[str, Any]] = None,
    ) -> Dict[str, Any]:
        """Selector, top-k (or the given ``keep`` ``(B, K)``) and extractor, without fill.

        Args:
            images: ``(B, C, H, W)``.
            k, k_ratio: this call's kept count / fraction (:meth:`resolve_k`); not with
                ``keep`` nor with a ``selection`` that holds its ``keep``.
            keep: ``(B, K)`` kept patch indices (distinct per row, ``K >= 1``) instead
                of the top-k.
            selection: the selector's output for these images, reused instead of running
                the selector again: :meth:`select`'s (its ``keep`` is the kept set), or
                ``self.selector(images, grid)``'s (``scores`` ``(B, N)``,
                ``prefix_tokens``; the top-k of its scores is taken as :meth:`select`
                does, with ``k`` / ``k_ratio`` / the model's defaults and ``coverage``).

        Returns:
            dict: ``tokens`` (list per out index of ``(B, J + K, D)``), ``num_prefix``,
            ``keep``, ``grid``, ``scores``, ``selector_prefix``.

        Raises:
            ValueError: ``k`` / ``k_ratio`` with ``keep`` or with a ``selection`` that
                has its ``keep`` (they would be ignored); a ``selection`` without
                ``scores`` and ``keep``.
        """
        sel = selection
        if keep is not None and (k is not None or k_ratio is not None):
            raise ValueError(
                f'LookWhere: keep gives the kept patches; k={k!r} / k_ratio={k_ratio!r} '
                'would be ignored: give one or the other'
            )
        if sel is not None and 'keep' in sel and (k is not None or k_ratio is not None):
            raise ValueError(
                f"LookWhere: selection['keep'] gives the kept patches ({sel['keep'].shape[1]} "
                f'per image); k={k!r} / k_ratio={k_ratio!r} would be ignored: give one or the '
                "other (select(images, k=...) for another count, or the selector's output "
                "without 'keep')"
            )
        if sel is None and keep is None:
            sel = self.select(images, k, k_ratio)  # checks the images
        else:
            self.check_images(images)
        if keep is None:
            if 'keep' in sel:
                keep = sel['keep']
            elif 'scores' in sel:  # the selector's own output: top-k as select() takes it
                grid = self.extractor.grid_of(images.shape[-2:])
                kk = self.resolve_k(grid[0] * grid[1], k, k_ratio)
                keep = top_k_with_coverage(sel['scores'], kk, grid, self.coverage)
            else:
                raise ValueError(
                    f"LookWhere: selection has neither 'keep' nor 'scores' (keys "
                    f'{sorted(sel)}): give select(images) or selector(images, grid)'
                )
        prefix = None
        if self.use_selector_prefix:
            if sel is None:
                grid = self.extractor.grid_of(images.shape[-2:])
                sel = self.run_selector(images, grid)
            prefix = self.prefix_proj(sel['prefix_tokens'])
        outs, j, grid = self.extractor(images, keep, prefix, self.attn_path)
        self.last_k = keep.shape[1]
        self.last_backend = self.extractor.last_backend
        return {
            'tokens': outs,
            'num_prefix': j,
            'keep': keep,
            'grid': grid,
            'scores': None if sel is None else sel['scores'],
            'selector_prefix': None if sel is None else sel['prefix_tokens'],
        }

    def densify(
        self, tokens: Tensor, num_prefix: int, keep: Tensor, grid: Tuple[int, int]
    ) -> Tensor:
        """``(B, J + K, D)`` extractor tokens -> ``(B, D, H, W)`` for every patch."""
        return self.fill(tokens[:, num_prefix:], keep, grid)

    def forward(
        self,
        images: Tensor,
        k: Optional[int] = None,
        k_ratio: Optional[float] = None,
        keep: Optional[Tensor] = None,
    ) -> Tuple[Tensor, ...]:
        """``(B, C, H, W)`` -> tuple of ``(B, D, ceil(H/p), ceil(W/p))`` maps, one per
        extractor ``out_indices``. ``k`` / ``k_ratio`` override the defaults for this call;
        ``keep`` ``(B, K)`` skips the selection."""
        out = self.forward_tokens(images, k, k_ratio, keep)
        return tuple(
            self.densify(t, out['num_prefix'], out['keep'], out['grid']) for t in out['tokens']
        )
