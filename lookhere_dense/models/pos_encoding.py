"""Position encodings of :class:`~lookhere_dense.models.backbones.LookHereViT`: LookHere and
the baselines it is compared with, behind one small interface (plain PyTorch).

===================  ==========================================================================
``pos_encoding``     what gives the trunk its sense of position
===================  ==========================================================================
``'lookhere'``       LookHere: directional attention masks + per-head/per-layer distance
                     penalty (any preset / ``lh_config``), via the LookHere engine;
                     ``lh_config.learnable_slopes=True`` learns the slopes
``'abs'``            a learned absolute embedding ``pos_embed`` added to the patch tokens,
                     bicubic-resampled to the input's grid (like mmseg / timm); the CLS token
                     gets none (DeiT-III / timm ``no_embed_class``)
``'rope2d'``         axial 2D-RoPE: half of each head's channels rotate with the column, half
                     with the row, fixed frequencies ``theta ** (-4i / head_dim)``
``'rope2d_mixed'``   RoPE-Mixed (Heo et al. 2024): every channel pair rotates with
                     ``fx * x + fy * y``, ``(fx, fy)`` learned per layer and head
``'rope_dinov3'``    DINOv3's axial RoPE (Simeoni et al. 2025) through timm's
                     ``RotaryEmbeddingDinoV3``: patch centres normalised to ``[-1, 1]`` per
                     axis (a larger grid is denser, not larger), random coordinate rescaling
                     while training; needs timm
``'pape'``           PaPE (Ohrstrom et al. 2026): per layer and head, a sum of parabolas in
                     learned projections of the query-key offset, curvature and slope from
                     the query token; appended to q and k (fused SDPA, no N x N bias);
                     :mod:`lookhere_dense.models.pape`
``'alibi2d'``        2D-ALiBi: the Euclidean distance penalty without direction masks, i.e. a
                     LookHere config whose heads are all unrestricted (``'none'``), through the
                     same engine
``'none'``           nothing: attention sees content only
===================  ==========================================================================

Interface (:class:`PositionEncoding`), the same one the LookHere engine already has:

* ``add_to_tokens(x, grid)`` -- what happens to the patch tokens before the blocks
  (only ``abs`` changes them). The backbone calls it once per forward, so an encoding
  that draws per-forward randomness (``rope_dinov3``'s coordinate augmentation) draws it
  here and every layer of that forward shares it;
* ``forward(q, k, v, layer, grid, cls_token, dropout_p, tokens=None)`` -- global attention
  of one layer. ``tokens`` (``(B, T, C)``, the attention's input) is given to encodings
  with ``uses_tokens = True`` (``pape``: content-dependent curvature and slope) and
  ignored by the others;
* ``window_attention(q, k, v, layer, grid, window_size, cls_token, dropout_p,
  tokens=None)`` -- ViTDet window attention. Every encoding here supports windows: RoPE
  rotates queries and keys by their position in the whole grid before windowing (relative
  offsets inside a window are unchanged), PaPE appends its features the same way, ``abs``
  and ``none`` attend plainly, LookHere / 2D-ALiBi use the engine's window-sized bias;
* ``lh_config`` -- the LookHere config of the bias (None for encodings without one);
* ``clear_caches()`` -- drop cached tensors (bias tables, rotation angles), e.g. to start
  a measurement from a clean slate.

The backbone owns ONE encoding (``LookHereViT.pos_enc``) and hands it to every block in
each forward; for ``'lookhere'`` / ``'alibi2d'`` that encoding owns the LookHere engine.

A ``pos_encoding`` spec (``'rope2d'``, ``'lookhere:lh45'``, ``dict(type='abs',
init_std=0.02)``, plus the backbone's ``preset`` / ``lh_config``) is parsed by one function,
:func:`parse_pos_encoding`, into a :class:`PosEncodingSpec`; the backbone, the config checks
of :mod:`lookhere_dense.swap`, the benchmark and the study all call it.

The CLS token is never rotated and never biased (it has no position), in every encoding.
Nothing in this module imports OpenMMLab; ``rope_dinov3`` imports timm when built.
Definitions and conventions (channel layouts, the timm counterparts of ``rope2d`` /
``rope2d_mixed``): ``docs/position_encodings.md``.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..lookhere import (PRESETS, BoundedCache, LookHereAttentionEngine, LookHereConfig,
                        resolve_lh_config)
from ..lookhere.bias import OFFICIAL_KEYS
from ..lookhere.slopes import LookHereSlopes
from ..lookhere.windows import attend_in_windows, padded_grid, window_key_mask

__all__ = [
    'POS_ENCODINGS', 'LOOKHERE_BIAS_ENCODINGS', 'POS_ENCODING_OPTIONS', 'PositionEncoding',
    'LookHerePositionEncoding', 'AbsolutePositionEncoding', 'AxialRoPE2d', 'MixedRoPE2d',
    'DinoV3RoPE2d', 'NoPositionEncoding', 'PosEncodingSpec', 'PosEncodingError',
    'build_position_encoding', 'parse_pos_encoding', 'alibi2d_config', 'resample_abs_pos_embed',
    'rotate_half_pairs', 'window_sdpa', 'isolated_rng', 'bias_config',
]

#: Every value ``pos_encoding`` accepts.
POS_ENCODINGS = ('lookhere', 'abs', 'rope2d', 'rope2d_mixed', 'rope_dinov3', 'pape', 'alibi2d',
                 'none')
#: Encodings computed by the LookHere engine from a :class:`LookHereConfig`.
LOOKHERE_BIAS_ENCODINGS = ('lookhere', 'alibi2d')
#: The options each encoding takes in the dict form ``dict(type=NAME, **options)``.
POS_ENCODING_OPTIONS = {'lookhere': (), 'alibi2d': (), 'none': (), 'abs': ('init_std',),
                        'rope2d': ('theta',), 'rope2d_mixed': ('theta',),
                        'rope_dinov3': ('theta', 'normalize_coords', 'shift_coords',
                                        'jitter_coords', 'rescale_coords'),
                        'pape': ('parabolas',)}


@contextlib.contextmanager
def isolated_rng(device: Union[torch.device, str, None] = None) -> Iterator[None]:
    """Run a block with the global RNG (CPU, and ``device``'s if it is CUDA) restored after it.

    Random initialisation of an encoding's own parameters happens inside this, so the trunk's
    initialisation draws the same numbers whatever the encoding: with one seed, models that
    differ only in ``pos_encoding`` start from identical blocks, patch embedding and heads.
    """
    device = torch.device(device) if device is not None else torch.device('cpu')
    devices = [device] if device.type == 'cuda' else []
    with torch.random.fork_rng(devices=devices):
        yield


def check_number(name: str, value: Any, minimum: float, strict: bool = False) -> float:
    """``value`` as a float, when it is a finite real number ``>= minimum`` (``> minimum``
    with ``strict``): the check of an encoding's numeric options.

    Raises:
        ValueError: ``pos_encoding NAME must be a finite number > / >= MIN, got VALUE``.
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and math.isfinite(value) and (value > minimum if strict else value >= minimum)
    if not ok:
        raise ValueError(f'pos_encoding {name} must be a finite number '
                         f'{">" if strict else ">="} {minimum:g}, got {value!r}')
    return float(value)


def window_sdpa(q: Tensor, k: Tensor, v: Tensor, grid_size: Tuple[int, int], window_size: int,
                cls_token: bool, dropout_p: float = 0.0) -> Tensor:
    """ViTDet window attention without a position bias.

    Patches attend within their ``window_size`` x ``window_size`` window (padded keys of
    border windows are masked). With ``cls_token`` every window also sees the CLS key and
    the CLS query attends to all tokens, as in
    :meth:`~lookhere_dense.lookhere.LookHereAttentionEngine.window_attention`.

    Args:
        q, k, v: ``(B, heads, T, d)`` with ``T = H*W (+1)`` for ``grid_size = (H, W)``.

    Returns:
        ``(B, heads, T, d)``.
    """
    ws = int(window_size)
    mask = None
    if padded_grid(grid_size, ws) != tuple(grid_size):
        mask = window_key_mask(grid_size, ws, cls_token, q.device, q.dtype)
    return attend_in_windows(q, k, v, grid_size, ws, cls_token, lambda qw, kw, vw:
                             F.scaled_dot_product_attention(qw, kw, vw, attn_mask=mask,
                                                            dropout_p=dropout_p), dropout_p)


class PositionEncoding(nn.Module):
    """Common interface of the position encodings (see the module docstring).

    The default implementation is content-only attention: subclasses that only transform
    queries and keys (RoPE) override :meth:`rotate`; ``abs`` overrides
    :meth:`add_to_tokens`; bias-based encodings override :meth:`forward` and
    :meth:`window_attention`.
    """

    #: the ``pos_encoding`` name this class implements
    name: str = ''
    #: whether :meth:`forward` / :meth:`window_attention` need ``tokens`` (the attention's
    #: input); the attention passes them only to encodings that say so
    uses_tokens: bool = False

    def add_to_tokens(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        """Patch tokens ``(B, H*W, D)`` (no CLS) -> the tokens the blocks get (same shape)."""
        return x

    def rotate(self, q: Tensor, k: Tensor, layer: int, grid_size: Tuple[int, int],
               cls_token: bool) -> Tuple[Tensor, Tensor]:
        """Queries and keys ``(B, heads, T, d)`` as the attention logits should see them."""
        return q, k

    def forward(self, q: Tensor, k: Tensor, v: Tensor, layer: int, grid_size: Tuple[int, int],
                cls_token: bool, dropout_p: float = 0.0, tokens: Optional[Tensor] = None
                ) -> Tensor:
        """Global attention of ``layer``: ``(B, heads, T, d)`` -> ``(B, heads, T, d)``,
        ``T = H*W (+1 with cls_token)``. ``tokens``: the attention's input ``(B, T, C)``,
        used by encodings with :attr:`uses_tokens` (ignored here). Default: None."""
        n = grid_size[0] * grid_size[1] + int(cls_token)
        if q.shape[-2] != n or k.shape[-2] != n:
            raise ValueError(f'attention got {q.shape[-2]} tokens but grid {tuple(grid_size)} '
                             f'{"with" if cls_token else "without"} CLS needs {n}')
        q, k = self.rotate(q, k, layer, grid_size, cls_token)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    def window_attention(self, q: Tensor, k: Tensor, v: Tensor, layer: int,
                         grid_size: Tuple[int, int], window_size: int, cls_token: bool,
                         dropout_p: float = 0.0, tokens: Optional[Tensor] = None) -> Tensor:
        """ViTDet window attention of ``layer`` (see :func:`window_sdpa`); shapes and
        ``tokens`` as :meth:`forward`."""
        q, k = self.rotate(q, k, layer, grid_size, cls_token)
        return window_sdpa(q, k, v, grid_size, window_size, cls_token, dropout_p)

    @property
    def lh_config(self) -> Optional[LookHereConfig]:
        """The LookHere config of the encoding's bias; None (the default) for encodings
        without a LookHere bias."""
        return None

    def reset_parameters(self) -> None:
        """(Re-)initialise the encoding's own parameters (none by default)."""

    def clear_caches(self) -> None:
        """Drop every cached tensor (bias tables, rotation angles), so the next forward
        starts from a clean slate (e.g. for a memory measurement). Nothing by default."""

    def extra_repr(self) -> str:
        return f'name={self.name!r}'


class NoPositionEncoding(PositionEncoding):
    """``'none'``: attention over content only (permutation-equivariant over patches)."""

    name = 'none'


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
            raise ValueError(f'LookHerePositionEncoding implements {LOOKHERE_BIAS_ENCODINGS}, '
                             f'got {name!r}')
        self.engine = engine
        self.name = name
        config = getattr(engine, 'config', None)
        self.slopes: Optional[LookHereSlopes] = None
        if config is not None and config.learnable_slopes:
            self.slopes = LookHereSlopes(config, engine.depth, engine.num_heads)

    def _slope_kwargs(self) -> dict:
        return {} if self.slopes is None else {'slopes': self.slopes}

    def forward(self, q: Tensor, k: Tensor, v: Tensor, layer: int, grid_size: Tuple[int, int],
                cls_token: bool, dropout_p: float = 0.0, tokens: Optional[Tensor] = None
                ) -> Tensor:
        return self.engine(q, k, v, layer, grid_size, cls_token, dropout_p,
                           **self._slope_kwargs())

    def window_attention(self, q: Tensor, k: Tensor, v: Tensor, layer: int,
                         grid_size: Tuple[int, int], window_size: int, cls_token: bool,
                         dropout_p: float = 0.0, tokens: Optional[Tensor] = None) -> Tensor:
        return self.engine.window_attention(q, k, v, layer, grid_size, window_size, cls_token,
                                            dropout_p, **self._slope_kwargs())

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
            raise ValueError(f'this LookHere encoding was built with {have} slopes; it cannot '
                             f'switch to learnable_slopes={config.learnable_slopes} (set '
                             f'lh_config.learnable_slopes={self.slopes is not None} or build '
                             'the model with the other setting)')
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


def alibi2d_config(lh_config: Union[None, Mapping[str, Any], LookHereConfig] = None
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
        raise TypeError("pos_encoding='alibi2d' takes lh_config as a dict or LookHereConfig "
                        f'(no preset names), got {lh_config!r}')
    directed = sorted({t for s in cfg.direction_strings for t in s.split('-') if t != 'none'})
    if directed:
        raise ValueError(f"pos_encoding='alibi2d' has no direction masks, but lh_config uses "
                         f"direction types {directed}; use only 'none' (e.g. "
                         f"head_directions='none') or pos_encoding='lookhere'")
    return cfg


class PosEncodingError(ValueError):
    """A ``pos_encoding`` / ``preset`` / ``lh_config`` that cannot work.

    Attributes:
        key: the backbone argument at fault: ``'pos_encoding'``, ``'preset'`` or
            ``'lh_config'`` (config checks prefix it, e.g. ``model.backbone.preset``).
    """

    def __init__(self, message: str, key: str = 'pos_encoding'):
        super().__init__(message)
        self.key = key


def bias_config(encoding: str, lh_config: Union[None, str, Mapping[str, Any],
                                                 LookHereConfig] = None,
                preset: Optional[str] = None) -> Optional[LookHereConfig]:
    """The LookHere config the bias of ``encoding`` is computed from: ``lh_config`` /
    ``preset`` for ``'lookhere'``, :func:`alibi2d_config` for ``'alibi2d'``, None for the
    encodings without a LookHere bias. Part of :func:`parse_pos_encoding` (call that).

    Raises:
        PosEncodingError: an unknown preset or option, a preset for ``'alibi2d'``, or
            ``lh_config`` / ``preset`` for an encoding that has no LookHere bias; ``key``
            names the argument at fault.
    """
    if encoding == 'lookhere':
        try:
            return resolve_lh_config(lh_config, preset)
        except ValueError as err:
            bad_preset = preset is not None and preset not in PRESETS
            raise PosEncodingError(str(err), 'preset' if bad_preset else 'lh_config') from None
    if encoding == 'alibi2d':
        if preset is not None:
            raise PosEncodingError("pos_encoding='alibi2d' takes no LookHere preset (it has "
                                   'no direction masks); give slopes with lh_config=dict(...)',
                                   'preset')
        try:
            return alibi2d_config(lh_config)
        except ValueError as err:
            raise PosEncodingError(str(err), 'lh_config') from None
    if lh_config is not None or preset is not None:
        raise PosEncodingError(f'preset / lh_config configure LookHere; they do not apply to '
                               f'pos_encoding={encoding!r} (allowed with '
                               f'{list(LOOKHERE_BIAS_ENCODINGS)})',
                               'preset' if preset is not None else 'lh_config')
    return None


@dataclass(frozen=True)
class PosEncodingSpec:
    """A parsed ``pos_encoding``: what :func:`parse_pos_encoding` returns.

    Attributes:
        name: one of :data:`POS_ENCODINGS`.
        options: the encoding's own options (checked against
            :data:`POS_ENCODING_OPTIONS`), e.g. ``{'theta': 10.0}``. Default: none.
        preset: the LookHere preset, from the spec (``'lookhere:lh45'``) or from
            ``preset=``; None when none was named. Default: None.
        lh_config: the :class:`LookHereConfig` of the bias of ``'lookhere'`` /
            ``'alibi2d'`` (the default one when neither preset nor lh_config was given);
            None for the encodings without a LookHere bias. Default: None.
        explicit: a preset, or an lh_config with one of the official keys
            (:data:`~lookhere_dense.lookhere.bias.OFFICIAL_KEYS`), was given. Only a
            default (not explicit) config gives way to the one stored in a checkpoint, so
            ``lh_config=dict(learnable_slopes=True)`` (or ``bias_rounding`` alone) still
            takes a checkpoint's head directions and slopes. Default: False.
    """

    name: str
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    preset: Optional[str] = None
    lh_config: Optional[LookHereConfig] = None
    explicit: bool = False


def parse_pos_encoding(spec: Union[str, Mapping[str, Any], PosEncodingSpec] = 'lookhere',
                       lh_config: Union[None, str, Mapping[str, Any], LookHereConfig] = None,
                       preset: Optional[str] = None) -> PosEncodingSpec:
    """THE parser of a ``pos_encoding`` spec (with the backbone's ``preset`` /
    ``lh_config``), used by the backbone, the config checks, the benchmark and the study.

    Spec forms:

    * a name of :data:`POS_ENCODINGS`: ``'rope2d'``;
    * ``'lookhere:PRESET'``: LookHere with a preset, e.g. ``'lookhere:lh45'`` (the study's
      short form; the same as ``'lookhere'`` with ``preset='lh45'``);
    * ``dict(type=NAME, **options)`` with the options of :data:`POS_ENCODING_OPTIONS`, e.g.
      ``dict(type='rope2d', theta=10.0)``;
    * a :class:`PosEncodingSpec` (returned as it is; then no ``lh_config`` / ``preset``).

    Args:
        spec: the encoding. Default: ``'lookhere'``.
        lh_config: LookHere config (official keys, a :class:`LookHereConfig` or a preset
            name) for ``'lookhere'``, or slopes for ``'alibi2d'``; overrides the preset's
            entries. Default: None.
        preset: LookHere preset (``'lh180'``, ``'lh90'``, ``'lh45'``). Default: None.

    Returns:
        The :class:`PosEncodingSpec`, with the resolved LookHere config.

    Raises:
        PosEncodingError: an unknown name, option or preset, a preset for an encoding
            other than ``'lookhere'``, two different presets, lh_config for an encoding
            without a LookHere bias, an lh_config ``'alibi2d'`` cannot have; the message
            names the allowed values and ``key`` the argument at fault.
        TypeError: a spec that is neither a string, a dict nor a :class:`PosEncodingSpec`.
    """
    if isinstance(spec, PosEncodingSpec):
        if lh_config is not None or preset is not None:
            raise TypeError('parse_pos_encoding: a PosEncodingSpec is already parsed; it '
                            'takes no further lh_config / preset')
        return spec
    spec_preset = None
    if isinstance(spec, str):
        name, colon, spec_preset = spec.partition(':')
        options: dict = {}
        shown = spec
    elif isinstance(spec, Mapping):
        options = dict(spec)
        name, colon = options.pop('type', None), ''
        shown = name
    else:
        raise TypeError(f'pos_encoding must be a name or a dict with "type", got {spec!r}')
    if name not in POS_ENCODINGS:
        raise PosEncodingError(f'unknown pos_encoding {shown!r}; allowed: '
                               f"{list(POS_ENCODINGS)} (a LookHere preset as "
                               "'lookhere:PRESET', e.g. 'lookhere:lh45')")
    if colon:
        if name != 'lookhere':
            raise PosEncodingError(f"pos_encoding {spec!r}: only lookhere takes a preset "
                                   f"('lookhere:PRESET'); use {name!r}")
        if not spec_preset:
            raise PosEncodingError(f'pos_encoding {spec!r} names no preset; allowed: '
                                   f'{sorted(PRESETS)}')
        if preset is not None and preset != spec_preset:
            raise PosEncodingError(f'pos_encoding {spec!r} and preset={preset!r} name two '
                                   'different presets; give the preset once', 'preset')
        preset = spec_preset
    unknown = sorted(set(options) - set(POS_ENCODING_OPTIONS[name]))
    if unknown:
        raise PosEncodingError(f'pos_encoding {name!r} has no options {unknown}; allowed: '
                               f'{list(POS_ENCODING_OPTIONS[name])}')
    try:
        config = bias_config(name, lh_config, preset)
    except PosEncodingError as err:
        if spec_preset and err.key == 'preset':  # the preset came with the spec
            err.key = 'pos_encoding'
        raise
    explicit = preset is not None or (lh_config is not None and (
        not isinstance(lh_config, Mapping) or bool(set(lh_config) & set(OFFICIAL_KEYS))))
    return PosEncodingSpec(name, options, preset, config, explicit=explicit)


# ----------------------------------------------------------------------------------------
# Absolute embedding
# ----------------------------------------------------------------------------------------
def resample_abs_pos_embed(pos_embed: Tensor, src_grid: Tuple[int, int],
                           dst_grid: Tuple[int, int], mode: str = 'bicubic') -> Tensor:
    """Resize a patch position embedding from one grid to another (mmseg / timm style).

    Args:
        pos_embed: ``(1, Hs*Ws, D)``, row-major over ``src_grid = (Hs, Ws)``.
        dst_grid: ``(Hd, Wd)``.
        mode: ``F.interpolate`` mode (``align_corners=False``). Default: ``'bicubic'``.

    Returns:
        ``(1, Hd*Wd, D)`` (the input itself when the grids are equal).
    """
    src_grid, dst_grid = tuple(src_grid), tuple(dst_grid)
    if pos_embed.dim() != 3 or pos_embed.shape[1] != src_grid[0] * src_grid[1]:
        raise ValueError(f'pos_embed of shape {tuple(pos_embed.shape)} is not (1, H*W, D) for '
                         f'the grid {src_grid}')
    if src_grid == dst_grid:
        return pos_embed
    dim = pos_embed.shape[-1]
    grid = pos_embed.reshape(1, src_grid[0], src_grid[1], dim).permute(0, 3, 1, 2)
    kwargs = {} if mode in ('nearest', 'area') else dict(align_corners=False)
    grid = F.interpolate(grid.float(), size=dst_grid, mode=mode, **kwargs).to(pos_embed.dtype)
    return grid.permute(0, 2, 3, 1).reshape(1, dst_grid[0] * dst_grid[1], dim)


class AbsolutePositionEncoding(PositionEncoding):
    """``'abs'``: a learned embedding per patch of the training grid, added to the tokens.

    Inputs whose grid differs are given the embedding resampled to their grid with
    :func:`resample_abs_pos_embed`. The CLS token gets no embedding (as DeiT-III, the
    trunk's architecture); a timm checkpoint whose ``pos_embed`` has a CLS entry has that
    entry folded into ``cls_token`` on loading (an exact conversion, see
    :meth:`adapt_checkpoint_embedding`).

    Args:
        embed_dims: token channels ``D``.
        grid_size: ``(H, W)`` patch grid of the training size (``img_size / patch_size``).
        interpolate_mode: resampling mode. Default: ``'bicubic'``.
        init_std: std of the truncated-normal init (timm). Default: 0.02.

    Parameters:
        pos_embed: ``(1, H*W, D)``.
    """

    name = 'abs'

    def __init__(self, embed_dims: int, grid_size: Tuple[int, int],
                 interpolate_mode: str = 'bicubic', init_std: float = 0.02):
        super().__init__()
        if len(grid_size) != 2 or min(grid_size) < 1:
            raise ValueError(f'grid_size must be (H, W) >= 1, got {grid_size!r}')
        self.grid_size = (int(grid_size[0]), int(grid_size[1]))
        self.interpolate_mode = interpolate_mode
        self.init_std = check_number('init_std', init_std, 0)
        self.pos_embed = nn.Parameter(torch.zeros(1, self.grid_size[0] * self.grid_size[1],
                                                  embed_dims))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=self.init_std, a=-2.0, b=2.0)

    def embedding(self, grid_size: Tuple[int, int]) -> Tensor:
        """The embedding for ``grid_size``: ``(1, H*W, D)``."""
        return resample_abs_pos_embed(self.pos_embed, self.grid_size, tuple(grid_size),
                                      self.interpolate_mode)

    def add_to_tokens(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        return x + self.embedding(grid_size).to(x.dtype)

    def adapt_checkpoint_embedding(self, pos_embed: Tensor
                                   ) -> Tuple[Tensor, Optional[Tensor], str]:
        """A checkpoint's ``pos_embed`` resampled to this encoding's shape.

        Accepts ``(1, N, D)`` with ``N = h*w`` (DeiT-III / ours) or ``N = 1 + h*w`` (timm
        ViTs with a CLS entry, returned separately). ``(h, w)`` is this encoding's grid when
        ``N`` matches it, else the square ``sqrt(N)`` grid.

        Returns:
            ``(patches, cls_entry, note)``: the ``(1, H*W, D)`` patch embedding, the
            ``(1, 1, D)`` CLS entry or None (add it to ``cls_token`` for the same CLS input
            as in the checkpoint's model), and what was done.

        Raises:
            ValueError: wrong channel count, or a length that is no grid.
        """
        if pos_embed.dim() == 2:
            pos_embed = pos_embed[None]
        if pos_embed.dim() != 3 or pos_embed.shape[0] != 1:
            raise ValueError(f'checkpoint pos_embed has shape {tuple(pos_embed.shape)}, '
                             'expected (1, N, D)')
        dim = self.pos_embed.shape[-1]
        if pos_embed.shape[-1] != dim:
            raise ValueError(f'checkpoint pos_embed has {pos_embed.shape[-1]} channels, the '
                             f'backbone {dim} (check embed_dims)')
        own = self.grid_size[0] * self.grid_size[1]
        notes = []

        def square(n: int) -> Optional[Tuple[int, int]]:
            side = math.isqrt(n)
            return (side, side) if side * side == n and n > 0 else None

        n = pos_embed.shape[1]
        cls_entry = None
        if n == own or square(n):
            src = self.grid_size if n == own else square(n)
        elif n - 1 == own or square(n - 1):
            cls_entry, pos_embed = pos_embed[:, :1], pos_embed[:, 1:]
            notes.append('split off its CLS entry')
            src = self.grid_size if n - 1 == own else square(n - 1)
        else:
            raise ValueError(f'checkpoint pos_embed has {n} tokens: neither this backbone\'s '
                             f'{self.grid_size[0]}x{self.grid_size[1]} grid nor a square grid '
                             '(with or without a CLS entry)')
        if tuple(src) != self.grid_size:
            notes.append(f'resampled {src[0]}x{src[1]} -> '
                         f'{self.grid_size[0]}x{self.grid_size[1]} ({self.interpolate_mode})')
        out = resample_abs_pos_embed(pos_embed, tuple(src), self.grid_size,
                                     self.interpolate_mode)
        return out, cls_entry, '; '.join(notes) or 'kept as is'

    def extra_repr(self) -> str:
        return (f'name={self.name!r}, grid_size={self.grid_size}, '
                f'interpolate_mode={self.interpolate_mode!r}')


# ----------------------------------------------------------------------------------------
# 2D RoPE
# ----------------------------------------------------------------------------------------
def rotate_half_pairs(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate channel pairs ``(x[..., j], x[..., j + d/2])`` by ``angles[..., j]``.

    Args:
        x: ``(..., N, d)`` with even ``d``.
        angles: ``(..., N, d/2)``, broadcastable against ``x``'s leading dims.

    Returns:
        Same shape and dtype as ``x``.
    """
    half = x.shape[-1] // 2
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def patch_coordinates(grid_size: Tuple[int, int], device: Union[torch.device, str, None] = None
                      ) -> Tuple[Tensor, Tensor]:
    """Row and column index of every patch, row-major: two float32 ``(H*W,)`` tensors."""
    ys, xs = torch.meshgrid(torch.arange(grid_size[0], device=device, dtype=torch.float32),
                            torch.arange(grid_size[1], device=device, dtype=torch.float32),
                            indexing='ij')
    return ys.flatten(), xs.flatten()


class _RoPE2dBase(PositionEncoding):
    """RoPE on the patch tokens (the CLS token, first when present, is not rotated)."""

    def angles(self, layer: int, grid_size: Tuple[int, int], device: torch.device) -> Tensor:
        """Rotation angles ``(heads or 1, H*W, head_dim/2)`` of ``layer`` (float32)."""
        raise NotImplementedError

    def rotate(self, q: Tensor, k: Tensor, layer: int, grid_size: Tuple[int, int],
               cls_token: bool) -> Tuple[Tensor, Tensor]:
        off = int(cls_token)
        ang = self.angles(layer, tuple(grid_size), q.device)
        if ang.shape[-2] != q.shape[-2] - off:
            raise ValueError(f'RoPE got {q.shape[-2]} tokens but grid {tuple(grid_size)} '
                             f'{"with" if cls_token else "without"} CLS needs '
                             f'{ang.shape[-2] + off}')
        out = []
        for t in (q, k):
            rotated = rotate_half_pairs(t[:, :, off:], ang)
            out.append(torch.cat([t[:, :, :off], rotated], dim=2) if off else rotated)
        return out[0], out[1]


class AxialRoPE2d(_RoPE2dBase):
    """``'rope2d'``: axial 2D rotary embedding (RoPE-Axial of Heo et al. 2024).

    For head channels ``d``, ``d/4`` frequencies ``f_i = theta ** (-4i / d)``; the first
    ``d/4`` channel pairs rotate by ``x * f_i`` (column), the next ``d/4`` by ``y * f_i``
    (row), positions in patches. The same for every head and layer; no parameters.
    Larger grids simply use larger positions (no interpolation). Channel pairs are
    ``(j, j + d/2)`` ("half" layout).

    The same rotation as RoPE-ViT's axial RoPE and timm's ``RotaryEmbeddingCat(dim=d,
    in_pixels=False, temperature=theta, grid_indexing='xy')`` (timm's
    ``vit_base_patch16_rope_224``): equal angles per pair; those interleave the pairs as
    ``(2j, 2j + 1)``, so weights trained there load here after moving q / k channel
    ``2j -> j`` and ``2j + 1 -> j + d/2`` in every head (``tests/test_pos_encoding_timm.py``
    proves the attention logits equal).

    Args:
        head_dim: channels per head (multiple of 4).
        theta: frequency base. Default: 100 (RoPE-ViT's axial setting).
    """

    name = 'rope2d'

    def __init__(self, head_dim: int, theta: float = 100.0):
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"pos_encoding='rope2d' needs head channels divisible by 4 "
                             f'(embed_dims / num_heads), got {head_dim}')
        self.head_dim = head_dim
        self.theta = check_number('theta', theta, 0, strict=True)
        self._cache = BoundedCache(8)

    def frequencies(self) -> Tensor:
        """``(head_dim/4,)`` float32 frequencies."""
        return self.theta ** (-torch.arange(0, self.head_dim, 4, dtype=torch.float64)
                              / self.head_dim).float()

    def angles(self, layer: int, grid_size: Tuple[int, int], device: torch.device) -> Tensor:
        def make() -> Tensor:
            ys, xs = patch_coordinates(grid_size, device)
            freqs = self.frequencies().to(device)
            return torch.cat([xs[:, None] * freqs, ys[:, None] * freqs], dim=-1)[None]

        return self._cache.get_or_create((grid_size, str(device)), make)

    def clear_caches(self) -> None:
        """Drop the cached rotation angles."""
        self._cache.clear()

    def extra_repr(self) -> str:
        return f'name={self.name!r}, head_dim={self.head_dim}, theta={self.theta}'


class MixedRoPE2d(_RoPE2dBase):
    """``'rope2d_mixed'``: RoPE-Mixed (Heo et al. 2024), learnable 2D frequencies.

    Channel pair ``j`` of head ``h`` in layer ``l`` rotates by
    ``fx[l, h, j] * x + fy[l, h, j] * y``. Initialisation: magnitudes
    ``theta ** (-4i / d)`` for ``i < d/4``, each used twice, at directions ``phi`` and
    ``phi + pi/2`` with a random ``phi`` per layer and head. Channel pairs
    ``(j, j + d/2)``.

    The same encoding as RoPE-ViT's RoPE-Mixed and timm's ``RotaryEmbeddingMixed``: with
    one seed the initial ``freqs`` are the same numbers (timm's ``init_random_2d_freqs``
    draws the same), and the rotations are equal up to the pair layout (timm interleaves
    the pairs as ``(2j, 2j + 1)``; see :class:`AxialRoPE2d`).

    Args:
        depth: layers.
        num_heads: heads.
        head_dim: channels per head (multiple of 4).
        theta: magnitude base. Default: 10 (RoPE-ViT's mixed setting).

    Parameters:
        freqs: ``(2, depth, heads, head_dim/2)``: ``freqs[0]`` = ``fx``, ``freqs[1]`` = ``fy``.
            Keep it out of weight decay (as RoPE-ViT does).
    """

    name = 'rope2d_mixed'

    def __init__(self, depth: int, num_heads: int, head_dim: int, theta: float = 10.0):
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"pos_encoding='rope2d_mixed' needs head channels divisible by 4 "
                             f'(embed_dims / num_heads), got {head_dim}')
        self.depth, self.num_heads, self.head_dim = depth, num_heads, head_dim
        self.theta = check_number('theta', theta, 0, strict=True)
        self.freqs = nn.Parameter(torch.zeros(2, depth, num_heads, head_dim // 2))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        mag = self.theta ** (-torch.arange(0, self.head_dim, 4, dtype=torch.float32)
                             / self.head_dim)  # (d/4,)
        phi = torch.rand(self.depth, self.num_heads, 1, device=self.freqs.device) * 2 * math.pi
        mag = mag.to(self.freqs.device)
        fx = torch.cat([mag * torch.cos(phi), mag * torch.cos(phi + math.pi / 2)], dim=-1)
        fy = torch.cat([mag * torch.sin(phi), mag * torch.sin(phi + math.pi / 2)], dim=-1)
        self.freqs.copy_(torch.stack([fx, fy]))

    def angles(self, layer: int, grid_size: Tuple[int, int], device: torch.device) -> Tensor:
        ys, xs = patch_coordinates(grid_size, device)
        fx, fy = self.freqs[0, layer].float(), self.freqs[1, layer].float()  # (heads, d/2)
        return xs[None, :, None] * fx[:, None, :] + ys[None, :, None] * fy[:, None, :]

    def extra_repr(self) -> str:
        return (f'name={self.name!r}, depth={self.depth}, num_heads={self.num_heads}, '
                f'head_dim={self.head_dim}, theta={self.theta}')


def _timm_dinov3_rope() -> Tuple[Any, Any]:
    """timm's ``RotaryEmbeddingDinoV3`` and ``apply_rot_embed_cat`` (imported on use)."""
    try:
        from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3, apply_rot_embed_cat
    except ImportError as err:
        raise ImportError("pos_encoding='rope_dinov3' uses timm's RotaryEmbeddingDinoV3 "
                          '(timm >= 1.0.20: `pip install -U timm`), which could not be '
                          f'imported: {err}') from err
    return RotaryEmbeddingDinoV3, apply_rot_embed_cat


class DinoV3RoPE2d(PositionEncoding):
    """``'rope_dinov3'``: DINOv3's axial RoPE (Simeoni et al. 2025), timm's implementation.

    Wraps ``timm.layers.pos_embed_sincos.RotaryEmbeddingDinoV3`` (numerically DINOv3's
    ``RopePositionEmbedding``): patch centres ``((i + 0.5) / n) * 2 - 1`` per axis, in
    ``[-1, 1]`` whatever the grid (a larger test grid is denser, not larger); periods
    ``theta ** (2i / (d/2))`` for ``i < d/4``; angles ``2 pi * coordinate / period``, the
    first ``d/4`` channel pairs with the row, the next ``d/4`` with the column; pairs
    ``(j, j + d/2)`` (timm's ``rotate_half=True``, DINOv3's layout). No parameters.

    While training (``self.training``) the coordinates get DINOv3's augmentations, one
    random transform per forward shared by every layer: a shift uniform in
    ``[-shift, shift]`` per axis, a per-axis scale log-uniform in ``[1/jitter, jitter]``,
    a shared scale log-uniform in ``[1/rescale, rescale]`` (timm's order and RNG use). It
    is drawn in :meth:`add_to_tokens`, which the backbone calls once per forward (without
    that call, :meth:`rotate` draws once per new grid). Evaluation uses the plain
    coordinates.

    Args:
        head_dim: channels per head (multiple of 4).
        theta: period base (timm's ``temperature``, DINOv3's ``pos_embed_rope_base``).
            Default: 100 (DINOv3).
        normalize_coords: ``'separate'`` (each axis by its own length), ``'min'`` or
            ``'max'`` (both by the shorter / longer side). Default: ``'separate'`` (DINOv3).
        shift_coords: training shift, or None. Default: None (DINOv3).
        jitter_coords: training per-axis scale factor ``>= 1``, or None. Default: None
            (DINOv3).
        rescale_coords: training shared scale factor ``>= 1``, or None. Default: 2
            (DINOv3's released models).

    Raises:
        ImportError: timm (with ``RotaryEmbeddingDinoV3``) is not installed.
        ValueError: a head size not divisible by 4, or a bad option.
    """

    name = 'rope_dinov3'

    def __init__(self, head_dim: int, theta: float = 100.0, normalize_coords: str = 'separate',
                 shift_coords: Optional[float] = None, jitter_coords: Optional[float] = None,
                 rescale_coords: Optional[float] = 2.0):
        super().__init__()
        if head_dim % 4:
            raise ValueError(f"pos_encoding='rope_dinov3' needs head channels divisible by 4 "
                             f'(embed_dims / num_heads), got {head_dim}')
        if normalize_coords not in ('separate', 'min', 'max'):
            raise ValueError(f"pos_encoding='rope_dinov3': normalize_coords must be "
                             f"'separate', 'min' or 'max', got {normalize_coords!r}")
        rope_cls, self._rotate_cat = _timm_dinov3_rope()
        try:
            #: timm's ``RotaryEmbeddingDinoV3`` (its ``periods`` buffer is not saved)
            self.rope = rope_cls(dim=head_dim,
                                 temperature=check_number('theta', theta, 0, strict=True),
                                 normalize_coords=normalize_coords, grid_indexing='ij',
                                 rotate_half=True, shift_coords=shift_coords,
                                 jitter_coords=jitter_coords, rescale_coords=rescale_coords)
        except (TypeError, ValueError) as err:
            raise ValueError(f"pos_encoding='rope_dinov3': {err}") from None
        self.head_dim = head_dim
        self._cache = BoundedCache(8)
        self._drawn: Optional[Tuple[Tuple[int, int], Tensor]] = None

    @property
    def augments(self) -> bool:
        """Whether forwards draw random coordinates now (training, some augmentation on)."""
        return self.training and self.rope.aug_active

    def draw(self, grid_size: Tuple[int, int]) -> Tensor:
        """Draw a random coordinate transform for ``grid_size``, keep it for the layers of
        this forward and return its embedding (see :meth:`embedding`)."""
        grid = (int(grid_size[0]), int(grid_size[1]))
        self._drawn = (grid, self.rope.get_embed(list(grid)))
        return self._drawn[1]

    def embedding(self, grid_size: Tuple[int, int],
                  device: Union[torch.device, str, None] = None) -> Tensor:
        """``(H*W, 2 * head_dim)``: ``[sin | cos]`` of the angles in timm's half layout
        (float32), row-major over the grid; while augmenting, this forward's drawn one."""
        grid = (int(grid_size[0]), int(grid_size[1]))
        if self.augments:
            drawn = self._drawn
            emb = drawn[1] if drawn is not None and drawn[0] == grid else self.draw(grid)
            return emb.to(device) if device is not None else emb
        return self._cache.get_or_create(
            (grid, str(device)), lambda: self.rope.get_embed(list(grid)).to(device))

    def add_to_tokens(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        """Tokens unchanged; while augmenting, draws this forward's coordinate transform."""
        if self.augments:
            self.draw(grid_size)
        else:
            self._drawn = None
        return x

    def rotate(self, q: Tensor, k: Tensor, layer: int, grid_size: Tuple[int, int],
               cls_token: bool) -> Tuple[Tensor, Tensor]:
        off = int(cls_token)
        emb = self.embedding(grid_size, q.device)
        if emb.shape[0] != q.shape[-2] - off:
            raise ValueError(f'RoPE got {q.shape[-2]} tokens but grid {tuple(grid_size)} '
                             f'{"with" if cls_token else "without"} CLS needs '
                             f'{emb.shape[0] + off}')
        out = []
        for t in (q, k):
            rotated = self._rotate_cat(t[:, :, off:], emb, half=True)
            out.append(torch.cat([t[:, :, :off], rotated], dim=2) if off else rotated)
        return out[0], out[1]

    def clear_caches(self) -> None:
        """Drop the cached embeddings and the drawn transform."""
        self._cache.clear()
        self._drawn = None

    def extra_repr(self) -> str:
        r = self.rope
        return (f'name={self.name!r}, head_dim={self.head_dim}, theta={r.temperature}, '
                f'normalize_coords={r.normalize_coords!r}, shift_coords={r.shift_coords}, '
                f'jitter_coords={r.jitter_coords}, rescale_coords={r.rescale_coords}')


# ----------------------------------------------------------------------------------------
# Factory
# ----------------------------------------------------------------------------------------
def build_position_encoding(spec: Union[str, Mapping[str, Any], PosEncodingSpec], *,
                            embed_dims: int, num_heads: int, depth: int,
                            grid_size: Tuple[int, int],
                            engine: Optional[LookHereAttentionEngine] = None,
                            interpolate_mode: str = 'bicubic', attn_backend: str = 'auto',
                            attn_block_size: Optional[int] = None,
                            max_dense_bias_mb: float = 1024) -> PositionEncoding:
    """Build the encoding ``spec`` names (a spec or a :class:`PosEncodingSpec` from
    :func:`parse_pos_encoding`; a spec string / dict takes the default LookHere config).

    Args:
        embed_dims, num_heads, depth: the trunk's sizes.
        grid_size: the training grid ``(H, W)`` (used by ``abs``).
        engine: the LookHere engine of ``lookhere`` / ``alibi2d``; None builds one from
            ``spec.lh_config`` and the three ``attn_*`` / ``max_dense_bias_mb`` arguments
            (as :class:`~lookhere_dense.models.backbones.LookHereViT` names them). The
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
    head_dim = embed_dims // num_heads
    if spec.name in LOOKHERE_BIAS_ENCODINGS:
        if engine is None:
            spec.lh_config.validate(num_heads, depth)
            engine = LookHereAttentionEngine(spec.lh_config, depth, num_heads, attn_backend,
                                             attn_block_size, max_dense_bias_mb)
        return LookHerePositionEncoding(engine, spec.name)
    if spec.name == 'abs':
        return AbsolutePositionEncoding(embed_dims, grid_size, interpolate_mode,
                                        **spec.options)
    if spec.name == 'rope2d':
        return AxialRoPE2d(head_dim, **spec.options)
    if spec.name == 'rope2d_mixed':
        return MixedRoPE2d(depth, num_heads, head_dim, **spec.options)
    if spec.name == 'rope_dinov3':
        return DinoV3RoPE2d(head_dim, **spec.options)
    if spec.name == 'pape':
        from .pape import ParabolicPositionEncoding  # builds on this module: imported here
        return ParabolicPositionEncoding(embed_dims, depth, num_heads, **spec.options)
    return NoPositionEncoding()
