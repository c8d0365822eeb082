"""The LookHere method in plain PyTorch (torch alone; timm optional; no OpenMMLab imports).

* :mod:`.directions` -- fields of view of the head types, from relative offsets;
* :mod:`.bias` -- slopes, presets, the relative-offset table, the token-pair -> table
  index, and the table's materialisations;
* :mod:`.attention` -- the backends (overview) and the dense ones (``reference``, ``sdpa``);
* :mod:`.chunked` -- the ``chunked`` backend (blocks of query rows);
* :mod:`.flex` -- the ``flex`` backend (``flex_attention``, block masks, tile order);
* :mod:`.engine` -- :class:`LookHereAttentionEngine`: backend choice and bias caches;
* :mod:`.slopes` -- :class:`LookHereSlopes`: learnable global / layer / head slopes;
* :mod:`.windows` -- ViTDet window partitioning;
* :mod:`.cache` -- the bounded cache.
"""
from .attention import BACKENDS, reference_attention, sdpa_attention
from .bias import (PRESETS, GridBias, LookHereConfig, build_grid_bias, head_layout,
                   layer_slopes, lookhere_bias, relative_bias_table, resolve_lh_config)
from .cache import BoundedCache
from .chunked import chunked_attention
from .directions import DIRECTION_TYPES, PRIMITIVES
from .engine import LookHereAttentionEngine
from .flex import flex_attention_lookhere
from .slopes import LookHereSlopes

__all__ = [
    'BACKENDS', 'LookHereAttentionEngine', 'chunked_attention', 'flex_attention_lookhere',
    'reference_attention', 'sdpa_attention', 'PRESETS', 'GridBias', 'LookHereConfig',
    'build_grid_bias', 'head_layout', 'layer_slopes', 'lookhere_bias', 'relative_bias_table',
    'resolve_lh_config', 'BoundedCache', 'DIRECTION_TYPES', 'PRIMITIVES', 'LookHereSlopes',
]
