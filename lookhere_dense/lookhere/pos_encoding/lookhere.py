"""``'lookhere'`` and ``'alibi2d'``: attention with the bias of a LookHere engine."""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple, Union

from torch import Tensor

from ..config import LookHereConfig, resolve_lh_config
from ..engine import LookHereAttentionEngine
from ..slopes import LookHereSlopes
from .base import PositionEncoding, Trunk

__all__ = ['LookHerePositionEncoding', 'alibi2d_config', 'LOOKHERE_BIAS_ENCODINGS']

#: Encodings computed by the LookHere engine from a :class:`LookHereConfig`.
LOOKHERE_BIAS_ENCODINGS = ('lookhere', 'alibi2d')


class LookHerePositionEncoding(PositionEncoding):
    """``'lookhere'`` / ``'alibi2d'``: attention with the bias of a LookHere engine.

    The encoding is the one owner of its engine: the backbone reaches the engine (its
    config, caches and backend) only through ``pos_enc.engine``. To attend with another
    engine, assign ``pos_enc.engine`` (anything called like
    :class:`~lookhere_dense.lookhere.LookHereAttentionEngine` and with its
    ``window_attention``; stand-ins without ``config`` / ``reset`` have no ``lh_config``
    and nothing to clear).

    With ``learnable_slopes=True`` in the engine's config the encoding also owns the
    slopes as parameters (:class:`~lookhere_dense.lookhere.slopes.LookHereSlopes`, under
    ``pos_enc.slopes.*`` in the ``state_dict``) and hands them to the engine in every
    call, which then computes the bias at their current values.

    Args:
        engine: the engine (owns the bias caches and the backend choice).
        name: ``'lookhere'`` or ``'alibi2d'`` (for messages; the math is the engine's).
            Default: ``'lookhere'``.

    Attributes:
        slopes (LookHereSlopes | None): the learnable slopes; None with fixed slopes.
    """

    def __init__(self, engine: LookHereAttentionEngine, name: str = 'lookhere'):
        super().__init__()
        if name not in LOOKHERE_BIAS_ENCODINGS:
            raise ValueError(
                f'LookHerePositionEncoding implements {LOOKHERE_BIAS_ENCODINGS}, got {name!r}'
            )
        self.engine = engine
        self.name = name
        config = getattr(engine, 'config', None)
        self.slopes: Optional[LookHereSlopes] = None
        if config is not None and config.learnable_slopes:
            self.slopes = LookHereSlopes(config, engine.depth, engine.num_heads)

    @classmethod
    def from_spec(
        cls,
        options: Mapping[str, Any],
        trunk: Trunk,
        *,
        name: str = 'lookhere',
        lh_config: Optional[LookHereConfig] = None,
        **spec: Any,
    ) -> 'LookHerePositionEncoding':
        """The encoding of ``name`` with ``trunk.engine``, or a new engine of ``lh_config``
        with the trunk's settings (``attn_backend``, ``attn_block_size``,
        ``max_dense_bias_mb``)."""
        engine = trunk.engine
        if engine is None:
            lh_config.validate(trunk.num_heads, trunk.depth)
            engine = LookHereAttentionEngine(
                lh_config,
                trunk.depth,
                trunk.num_heads,
                trunk.attn_backend,
                trunk.attn_block_size,
                trunk.max_dense_bias_mb,
            )
        return cls(engine, name, **options)

    def _slope_kwargs(self) -> dict:
        return {} if self.slopes is None else {'slopes': self.slopes}

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
        return self.engine(q, k, v, layer, grid_size, cls_token, dropout_p, **self._slope_kwargs())

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
        return self.engine.window_attention(
            q, k, v, layer, grid_size, window_size, cls_token, dropout_p, **self._slope_kwargs()
        )

    @property
    def lh_config(self) -> Optional[LookHereConfig]:
        """The engine's config (None for a stand-in engine without one)."""
        return getattr(self.engine, 'config', None)

    def set_lh_config(self, config: LookHereConfig) -> None:
        """Switch the engine to ``config`` (e.g. the one stored in a checkpoint) and drop
        its caches; learnable slopes restart from ``config``'s values.

        Raises:
            ValueError: ``config`` does not fit the engine's heads / layers, or its
                ``learnable_slopes`` differs from this encoding's (the parameters exist or
                not from construction on).
        """
        if config.learnable_slopes != (self.slopes is not None):
            have = 'learnable' if self.slopes is not None else 'fixed'
            raise ValueError(
                f'this LookHere encoding was built with {have} slopes; it cannot '
                f'switch to learnable_slopes={config.learnable_slopes} (set '
                f'lh_config.learnable_slopes={self.slopes is not None} or build '
                'the model with the other setting)'
            )
        self.engine.reset(config)
        if self.slopes is not None:
            self.slopes.set_config(config)

    def reset_parameters(self) -> None:
        """Learnable slopes back to the config's values (nothing with fixed slopes)."""
        if self.slopes is not None:
            self.slopes.reset_parameters()

    def clear_caches(self) -> None:
        """Drop the engine's bias tables, dense biases, block masks and tile orders."""
        reset = getattr(self.engine, 'reset', None)
        if reset is not None:
            reset()

    def extra_repr(self) -> str:
        cfg = self.lh_config
        return f'name={self.name!r}, config={cfg.to_dict() if cfg is not None else None}'


def alibi2d_config(
    lh_config: Union[None, Mapping[str, Any], LookHereConfig] = None,
) -> LookHereConfig:
    """The LookHere config of ``'alibi2d'``: every head unrestricted (``'none'`` heads).

    Default: ``head_directions='none'`` (slopes 1/4, 1/16, 1/64, 1/256 per group of heads,
    LookHere's schedule for unrestricted heads), ``layer_slopes=(1.5, 0.5)`` and
    ``global_slope=1`` as ``lh180``, so ``alibi2d`` differs from LookHere only in having no
    direction masks. ``lh_config`` entries (a dict / :class:`LookHereConfig`) override
    these; its ``head_directions`` must use only ``'none'`` direction types.
    """
    base = LookHereConfig('none', 1.0, (1.5, 0.5))
    if lh_config is None:
        return base
    if isinstance(lh_config, LookHereConfig):
        cfg = lh_config
    elif isinstance(lh_config, Mapping):
        cfg = resolve_lh_config({**base.to_dict(), **dict(lh_config)})
    else:
        raise TypeError(
            "pos_encoding='alibi2d' takes lh_config as a dict or LookHereConfig "
            f'(no preset names), got {lh_config!r}'
        )
    directed = sorted({t for s in cfg.direction_strings for t in s.split('-') if t != 'none'})
    if directed:
        raise ValueError(
            f"pos_encoding='alibi2d' has no direction masks, but lh_config uses "
            f"direction types {directed}; use only 'none' (e.g. "
            f"head_directions='none') or pos_encoding='lookhere'"
        )
    return cfg
