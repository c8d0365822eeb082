"""Training components registered in mmengine's registries (layer-wise lr decay, mixed
precision on CPU and CUDA)."""

from .amp import AmpTestLoop, MixedPrecisionOptimWrapper
from .layer_decay import (
    LookHereLayerDecayOptimizerConstructor,
    ViTDetLayerDecayOptimizerConstructor,
    backbone_layer_id,
    find_lookhere_backbone,
    is_no_decay,
)

__all__ = [
    'AmpTestLoop',
    'MixedPrecisionOptimWrapper',
    'LookHereLayerDecayOptimizerConstructor',
    'ViTDetLayerDecayOptimizerConstructor',
    'backbone_layer_id',
    'find_lookhere_backbone',
    'is_no_decay',
]
