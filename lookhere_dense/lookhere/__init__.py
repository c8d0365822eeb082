"""The LookHere method in plain PyTorch (no OpenMMLab imports).

* :mod:`.directions` -- fields of view of the head types, from relative offsets;
* :mod:`.bias` -- slopes, presets, the relative-offset table and its materialisations;
* :mod:`.attention` -- the attention backends and the caching engine;
* :mod:`.windows` -- ViTDet window partitioning;
* :mod:`.cache` -- the bounded cache.
"""
from .attention import (BACKENDS, LookHereAttentionEngine, chunked_attention,
                        flex_attention_lookhere, reference_attention, sdpa_attention)
from .bias import (PRESETS, GridBias, LookHereConfig, build_grid_bias, head_layout,
                   layer_slopes, lookhere_bias, relative_bias_table, resolve_lh_config)
from .cache import BoundedCache
from .directions import DIRECTION_TYPES, PRIMITIVES

__all__ = [
    'BACKENDS', 'LookHereAttentionEngine', 'chunked_attention', 'flex_attention_lookhere',
    'reference_attention', 'sdpa_attention', 'PRESETS', 'GridBias', 'LookHereConfig',
    'build_grid_bias', 'head_layout', 'layer_slopes', 'lookhere_bias', 'relative_bias_table',
    'resolve_lh_config', 'BoundedCache', 'DIRECTION_TYPES', 'PRIMITIVES',
]
