"""The LookWhere extractor: our LookHere ViT on an arbitrary subset of high-resolution
patches (what to see). Torch alone."""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..lookhere.vit import LookHereVisionTransformer, create_model
from .select import gather_patches
from .subset import (
    DEFAULT_MAX_DENSE_BIAS_MB,
    SUBSET_ENCODINGS,
    SubsetAttention,
    check_subset_budget,
)

__all__ = ['LookWhereExtractor']


def _check_distinct(keep: Tensor) -> None:
    """Refuse a ``keep`` ``(B, K)`` with a patch index twice in one row (it is attended
    twice: every kept token's softmax changes). One sort of ``B x K`` indices.

    Raises:
        ValueError: naming the first such row and index.
    """
    ordered = keep.sort(dim=1).values
    same = ordered[:, 1:] == ordered[:, :-1]  # (B, K - 1)
    if bool(same.any()):
        row = int(same.any(1).nonzero()[0, 0])
        index = int(ordered[row, 1:][same[row]][0])
        raise ValueError(
            f'LookWhere extractor: keep row {row} holds patch {index} more than once; '
            'give distinct patch indices per image (e.g. keep.unique() of that row, or '
            'top_k_patches)'
        )


class LookWhereExtractor(nn.Module):
    """A LookHere ViT (:func:`~lookhere_dense.lookhere.create_model`) that embeds the whole
    high-resolution image into patch tokens but runs its blocks only on the kept ones.

    Positions: LookHere / 2D-ALiBi take the bias of every kept pair from the full grid's
    relative-offset table at the kept coordinates (:mod:`.subset`); ``abs`` adds its
    (resampled) table to all patches before the gather, so each kept token carries its own
    position (how the official DINOv2 extractor works).

    Args:
        **trunk: :class:`~lookhere_dense.lookhere.LookHereVisionTransformer` arguments
            (``embed_dims``, ``num_layers``, ``num_heads``, ``patch_size``, ``preset``,
            ``pos_encoding``, ``out_indices``, ``with_cp``, ...). Window attention, Jumbo
            tokens and ``log_n_scaling`` are refused (not defined on a gathered subset), so
            are ``out_origin`` and ``output_cls_token`` (LookWhere's outputs are the filled
            maps of ``out_indices``).
        max_subset_bias_mb (float): the largest dense coordinate bias of one layer
            (``B x heads x (J + K)^2`` elements, MiB) built whole; above it the attention
            runs per block of query rows (``'chunked-coords'``, bounded memory; see
            :class:`~.subset.SubsetAttention`). Default: 256.
        subset_block_rows (int, optional): query rows per block of that path; None:
            :func:`~.subset.auto_subset_block_rows`. Default: None.

    Attributes:
        trunk (LookHereVisionTransformer): the ViT; with the full grid kept and its own
            CLS it computes exactly ``trunk(images)``.
        last_backend (str | None): the attention path of the last forward
            (:class:`~.subset.SubsetAttention`).
    """

    def __init__(
        self,
        trunk: Optional[LookHereVisionTransformer] = None,
        *,
        max_subset_bias_mb: float = DEFAULT_MAX_DENSE_BIAS_MB,
        subset_block_rows: Optional[int] = None,
        **kwargs: Any,
    ):
        super().__init__()
        check_subset_budget(max_subset_bias_mb, subset_block_rows)
        self.max_subset_bias_mb = float(max_subset_bias_mb)
        self.subset_block_rows = subset_block_rows
        if trunk is None:
            trunk = create_model(**kwargs)
        elif kwargs:
            raise ValueError(
                f'LookWhere extractor: give a trunk or its arguments, not both ({sorted(kwargs)})'
            )
        if trunk.window_block_indexes:
            raise ValueError(
                'LookWhere extractor: window attention (window_size > 0) is not defined on a '
                'gathered patch subset; use window_size=0'
            )
        if trunk.jumbo_tokens:
            raise ValueError('LookWhere extractor: jumbo_tokens are not supported (use CLS)')
        if trunk.log_n_scaling:
            raise ValueError('LookWhere extractor: log_n_scaling is not supported')
        for key in ('out_origin', 'output_cls_token'):  # LookWhere gives one map per index
            if getattr(trunk, key):
                raise ValueError(
                    f'LookWhere extractor: {key}=True is not supported (its outputs are the '
                    'filled patch maps of out_indices); use the default False'
                )
        if trunk.pos_encoding not in SUBSET_ENCODINGS:
            raise ValueError(
                f'LookWhere extractor: pos_encoding={trunk.pos_encoding!r} is not supported on '
                f'a gathered patch subset; use one of {list(SUBSET_ENCODINGS)}'
            )
        self.trunk = trunk
        self.last_backend: Optional[str] = None

    @property
    def patch_size(self) -> int:
        return self.trunk.patch_size

    @property
    def embed_dims(self) -> int:
        return self.trunk.embed_dims

    def grid_of(self, size: Tuple[int, int]) -> Tuple[int, int]:
        """The patch grid ``(ceil(H / p), ceil(W / p))`` of an image of ``size``."""
        p = self.patch_size
        return (-(-int(size[0]) // p), -(-int(size[1]) // p))

    def embed(self, images: Tensor) -> Tuple[Tensor, Tuple[int, int]]:
        """Patch tokens of the whole image with positions (``abs``) added: ``(B, N, D)``
        and the grid (the only full-resolution cost: one strided conv)."""
        x, grid = self.trunk.patch_embed(images)
        return self.trunk.pos_enc.add_to_tokens(x, grid), grid

    def forward(
        self,
        images: Tensor,
        keep: Tensor,
        prefix_tokens: Optional[Tensor] = None,
        backend: str = 'auto',
    ) -> Tuple[List[Tensor], int, Tuple[int, int]]:
        """Run the blocks on the kept patches.

        Args:
            images: ``(B, C, H, W)``.
            keep: ``(B, K)`` kept patch indices of the grid of ``images``, ``K >= 1``,
                distinct within each row (a repeated patch would enter every kept
                token's softmax twice).
            prefix_tokens: ``(B, J, D)`` tokens in front of the kept patches (the
                selector's CLS and registers); None: the trunk's own CLS token.
            backend: one of :data:`~.subset.SUBSET_BACKENDS` (``'auto'``, ``'coords'``,
                ``'sdpa-coords'``, ``'chunked-coords'``; :class:`~.subset.SubsetAttention`).

        Returns:
            ``(outs, J, grid)``: per ``trunk.out_indices`` the ``(B, J + K, D)`` tokens
            (prefix first; the last block's after the final norm), the prefix count and
            the high-resolution grid.
        """
        trunk = self.trunk
        tokens, grid = self.embed(images)
        n = grid[0] * grid[1]
        if keep.dim() != 2 or keep.shape[0] != tokens.shape[0]:
            raise ValueError(f'keep must be (B={tokens.shape[0]}, K), got {tuple(keep.shape)}')
        if keep.shape[1] == 0:
            raise ValueError(
                f'LookWhere extractor: keep is {tuple(keep.shape)}, no kept patch: give at '
                'least one patch index per image (every patch is filled from the kept ones)'
            )
        if keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= n):
            raise ValueError(f'keep holds patch indices outside the {grid[0]}x{grid[1]} grid')
        _check_distinct(keep)
        x = gather_patches(tokens, keep)
        if prefix_tokens is None:
            if not trunk.with_cls_token:
                prefix_tokens = x[:, :0]
            else:
                prefix_tokens = trunk.cls_token.expand(x.shape[0], -1, -1)
        j = prefix_tokens.shape[1]
        x = torch.cat([prefix_tokens.to(x.dtype), x], dim=1)
        x = trunk.drop_after_pos(x)
        if trunk.pre_ln is not None:
            x = trunk.pre_ln(x)
        attend = SubsetAttention(
            trunk.pos_enc, keep, grid, backend, self.max_subset_bias_mb, self.subset_block_rows
        )
        outs = []
        last = len(trunk.blocks) - 1
        for i, blk in enumerate(trunk.blocks):
            if trunk.with_cp and x.requires_grad:  # the trunk's activation checkpointing
                x = checkpoint(blk, x, attend, i, grid, j, use_reentrant=False)
            else:
                x = blk(x, attend, i, grid, j)
            if i == last and trunk.norm is not None:
                x = trunk.norm(x)
            if i in trunk.out_indices:
                outs.append(x)
        self.last_backend = attend.last_backend
        return outs, j, grid
