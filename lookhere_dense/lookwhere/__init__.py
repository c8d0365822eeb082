"""LookWhere (Fuller et al., NeurIPS 2025, arXiv 2505.18051) for dense prediction, with a
LookHere extractor, in plain PyTorch (torch alone; no OpenMMLab imports).

* :mod:`.selector` -- :class:`LookWhereSelector`: a shallow ViT on a low-resolution copy
  that scores every high-resolution patch and supplies the prefix tokens;
* :mod:`.extractor` -- :class:`LookWhereExtractor`: our LookHere ViT on the kept patches
  only, the bias of each kept pair built from their grid coordinates (:mod:`.subset`);
* :mod:`.select` -- ``k`` / ``k_ratio`` rules, top-k, gather / scatter;
* :mod:`.fill` -- the dense map of every patch: nearest kept patch, the official
  inverse-distance mean of the 5 nearest, or learned propagation;
* :mod:`.model` -- :class:`LookWhere`, the three together;
* :mod:`.distill` -- what-where distillation from a frozen LookHere teacher;
* :mod:`.official` -- the official ``lookwhere_dinov2.pt`` layout.
"""

from .extractor import LookWhereExtractor
from .fill import FILL_MODES, PropagateFill, idw_fill, nearest_fill
from .model import LookWhere
from .select import (
    gather_patches,
    lattice_patches,
    resolve_k,
    scatter_patches,
    top_k_patches,
    top_k_with_coverage,
)
from .selector import LookWhereSelector, SelectorHead
from .subset import SubsetAttention, chunked_subset_attention, subset_bias

__all__ = [
    'LookWhere',
    'LookWhereSelector',
    'LookWhereExtractor',
    'SelectorHead',
    'SubsetAttention',
    'subset_bias',
    'chunked_subset_attention',
    'resolve_k',
    'top_k_patches',
    'top_k_with_coverage',
    'lattice_patches',
    'gather_patches',
    'scatter_patches',
    'nearest_fill',
    'idw_fill',
    'PropagateFill',
    'FILL_MODES',
]
