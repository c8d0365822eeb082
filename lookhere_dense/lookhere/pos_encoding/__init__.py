"""Position encodings of the LookHere ViT (:mod:`lookhere_dense.lookhere.vit`): LookHere and
the baselines it is compared with, behind one small interface (plain PyTorch; one file
per family).

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
                     :mod:`.pape`
``'alibi2d'``        2D-ALiBi: the Euclidean distance penalty without direction masks, i.e. a
                     LookHere config whose heads are all unrestricted (``'none'``), through the
                     same engine
``'ledit'``          LEDiT (Zhang et al. 2025): no position embedding; causal attention in
                     the grid's raster order (patch ``i`` sees patches ``j <= i``, prefix
                     tokens global) plus a residual, zero-initialised depthwise convolution
                     over the token grid after the patch embedding (``pos_enc.locality``);
                     :mod:`.ledit`
``'none'``           nothing: attention sees content only
===================  ==========================================================================

Interface (:class:`PositionEncoding`), the same one the LookHere engine already has:

* ``add_to_tokens(x, grid)`` -- what happens to the patch tokens before the blocks
  (``abs`` adds its embedding, ``ledit`` runs its locality convolution over the grid;
  the others leave them). The backbone calls it once per forward, so an encoding
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
  and ``none`` attend plainly, LookHere / 2D-ALiBi use the engine's window-sized bias,
  ``ledit`` attends causally in each window's own raster order;
* ``lh_config`` -- the LookHere config of the bias (None for encodings without one);
* ``clear_caches()`` -- drop cached tensors (bias tables, rotation angles), e.g. to start
  a measurement from a clean slate.

The backbone owns ONE encoding (``LookHereViT.pos_enc``) and hands it to every block in
each forward; for ``'lookhere'`` / ``'alibi2d'`` that encoding owns the LookHere engine.

A ``pos_encoding`` spec (``'rope2d'``, ``'lookhere:lh45'``, ``dict(type='abs',
init_std=0.02)``, plus the backbone's ``preset`` / ``lh_config``) is parsed by one function,
:func:`parse_pos_encoding`, into a :class:`PosEncodingSpec`; the backbone, the config checks
of :mod:`lookhere_dense.swap`, the benchmark and the study all call it.

The prefix tokens (the CLS token, or the ``J`` Jumbo tokens) are never rotated and never
biased (they have no position), in every encoding (``ledit`` with ``global_prefix=False``
puts them first in its causal order).
Files: :mod:`.base` (the interface, ``none``, window frames), :mod:`.lookhere`
(``lookhere`` / ``alibi2d``), :mod:`.absolute`, :mod:`.rope` (``rope2d``, ``rope2d_mixed``),
:mod:`.dinov3`, :mod:`.pape`, :mod:`.ledit`, :mod:`.spec` (the catalogue :data:`ENCODINGS` and
the one parser), :mod:`.factory` (the one factory). Nothing here imports OpenMMLab;
``rope_dinov3`` imports timm when built.
Definitions and conventions (channel layouts, the timm counterparts of ``rope2d`` /
``rope2d_mixed``): ``docs/position_encodings.md``.
"""

from lookhere_dense.errors import PosEncodingError

from .absolute import AbsolutePositionEncoding, resample_abs_pos_embed
from .base import NoPositionEncoding, PositionEncoding, Trunk, isolated_rng, window_sdpa
from .dinov3 import DinoV3RoPE2d
from .factory import build_position_encoding
from .ledit import LEDiTPositionEncoding, LocalityConv
from .lookhere import LOOKHERE_BIAS_ENCODINGS, LookHerePositionEncoding, alibi2d_config
from .pape import ParabolicPositionEncoding, parabola_features
from .rope import AxialRoPE2d, MixedRoPE2d, patch_coordinates, rotate_half_pairs
from .spec import (
    ENCODINGS,
    POS_ENCODING_OPTIONS,
    POS_ENCODINGS,
    PosEncodingSpec,
    bias_config,
    parse_pos_encoding,
)

__all__ = [
    'ENCODINGS',
    'POS_ENCODINGS',
    'LOOKHERE_BIAS_ENCODINGS',
    'POS_ENCODING_OPTIONS',
    'PositionEncoding',
    'Trunk',
    'LookHerePositionEncoding',
    'AbsolutePositionEncoding',
    'AxialRoPE2d',
    'MixedRoPE2d',
    'DinoV3RoPE2d',
    'ParabolicPositionEncoding',
    'LEDiTPositionEncoding',
    'LocalityConv',
    'NoPositionEncoding',
    'PosEncodingSpec',
    'PosEncodingError',
    'build_position_encoding',
    'parse_pos_encoding',
    'alibi2d_config',
    'resample_abs_pos_embed',
    'rotate_half_pairs',
    'patch_coordinates',
    'parabola_features',
    'window_sdpa',
    'isolated_rng',
    'bias_config',
]
