"""The LookHere model in plain PyTorch (torch alone; timm optional; no OpenMMLab imports).

The model:

* :mod:`.vit` -- :class:`LookHereVisionTransformer` (global and window blocks, CLS /
  Jumbo tokens) and :func:`create_model`; :mod:`.layers` -- the generic layers it stacks
  (patch embedding, MLP, LayerScale, DropPath, attention, the block);
* :mod:`.weights` -- official LookHere / timm / DeiT-III / lookhere-dense files -> the
  trunk's keys, head-count rules, LookHere-config adoption; :mod:`.loading` -- whole-model
  checkpoints;
* :mod:`.pos_encoding` -- LookHere and the encodings it is compared with, one file per
  family, one parser and one factory.

The LookHere math:

* :mod:`.config` -- :class:`LookHereConfig`, the presets, head layouts and slope rules;
* :mod:`.directions` -- fields of view of the head types, from relative offsets;
* :mod:`.bias` -- the relative-offset table, the token-pair -> table index, and the
  table's materialisations (the one source of the bias); :mod:`.prefix_tokens` -- the
  count of global prefix tokens (CLS / Jumbo), which carry no position;
* :mod:`.slopes` -- :class:`LookHereSlopes`: learnable global / layer / head slopes;
* :mod:`.attention` -- one module per backend (``reference``, ``sdpa``, ``chunked``,
  ``tiled``, ``fused``, ``flex``, ``triton``; LEDiT's ``causal``), the shared plumbing,
  ViTDet's window partitioning (``attention.windows``) and the chooser;
  :mod:`.engine` -- :class:`LookHereAttentionEngine`: backend choice and bias caches
  (``lookhere.chunked`` / ``flex`` / ``fused`` / ``tiled`` / ``windows``: old import
  paths of the ``attention`` modules, the same module objects);
* :mod:`.cache` -- the bounded cache.
"""

from .attention import BACKENDS, explain_backend, reference_attention, sdpa_attention
from .attention.chunked import chunked_attention
from .attention.flex import flex_attention_lookhere
from .bias import GridBias, build_grid_bias, lookhere_bias, relative_bias_table
from .cache import BoundedCache
from .config import PRESETS, LookHereConfig, head_layout, layer_slopes, resolve_lh_config
from .directions import DIRECTION_TYPES, PRIMITIVES
from .engine import LookHereAttentionEngine
from .loading import load_model_weights
from .slopes import LookHereSlopes
from .vit import LookHereVisionTransformer, create_model
from .weights import save_backbone_checkpoint

__all__ = [
    'create_model',
    'LookHereVisionTransformer',
    'load_model_weights',
    'save_backbone_checkpoint',
    'BACKENDS',
    'explain_backend',
    'LookHereAttentionEngine',
    'chunked_attention',
    'flex_attention_lookhere',
    'reference_attention',
    'sdpa_attention',
    'PRESETS',
    'GridBias',
    'LookHereConfig',
    'build_grid_bias',
    'head_layout',
    'layer_slopes',
    'lookhere_bias',
    'relative_bias_table',
    'resolve_lh_config',
    'BoundedCache',
    'DIRECTION_TYPES',
    'PRIMITIVES',
    'LookHereSlopes',
]
