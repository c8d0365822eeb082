"""One factory: a parsed ``pos_encoding`` spec -> the encoding module of a trunk."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple, Union

from ..attention.chooser import BACKENDS, RETIRED
from ..engine import LookHereAttentionEngine
from .base import PositionEncoding, Trunk
from .spec import ENCODINGS, PosEncodingSpec, parse_pos_encoding

__all__ = ['build_position_encoding']


def build_position_encoding(
    spec: Union[str, Mapping[str, Any], PosEncodingSpec],
    *,
    embed_dims: int,
    num_heads: int,
    depth: int,
    grid_size: Tuple[int, int],
    engine: Optional[LookHereAttentionEngine] = None,
    interpolate_mode: str = 'bicubic',
    attn_backend: str = 'auto',
    attn_block_size: Optional[int] = None,
    max_dense_bias_mb: float = 1024,
) -> PositionEncoding:
    """Build the encoding ``spec`` names (a spec or a :class:`PosEncodingSpec` from
    :func:`parse_pos_encoding`; a spec string / dict takes the default LookHere config).

    Args:
        embed_dims, num_heads, depth: the trunk's sizes.
        grid_size: the training grid ``(H, W)`` (used by ``abs``).
        engine: the LookHere engine of ``lookhere`` / ``alibi2d``; None builds one from
            ``spec.lh_config`` and the three ``attn_*`` / ``max_dense_bias_mb`` arguments
            (as :class:`~lookhere_dense.lookhere.vit.LookHereVisionTransformer` names them). The
            returned encoding owns it. Default: None.
        interpolate_mode: ``abs`` resampling mode. Default: ``'bicubic'``.
        attn_backend: the engine's backend. Default: ``'auto'``.
        attn_block_size: query rows per block of the chunked backend. Default: None.
        max_dense_bias_mb: the engine's dense-bias budget. Default: 1024.

    Raises:
        PosEncodingError: see :func:`parse_pos_encoding`.
        ValueError: a LookHere config that does not fit ``num_heads`` / ``depth``, an
            unknown backend, an option value the encoding cannot use.
        ImportError: ``'rope_dinov3'`` without timm.
    """
    spec = parse_pos_encoding(spec)
    if attn_backend not in BACKENDS and attn_backend not in RETIRED:  # retired: the engine warns
        # every encoding: one without a LookHere bias runs sdpa, but a typo is still a typo
        raise ValueError(
            f'unknown LookHere attention backend {attn_backend!r} (attn_backend); allowed: '
            f'{list(BACKENDS)}'
        )
    trunk = Trunk(
        embed_dims,
        num_heads,
        depth,
        tuple(grid_size),
        interpolate_mode,
        attn_backend,
        attn_block_size,
        max_dense_bias_mb,
        engine,
    )
    return ENCODINGS[spec.name].from_spec(
        spec.options, trunk, name=spec.name, lh_config=spec.lh_config
    )
