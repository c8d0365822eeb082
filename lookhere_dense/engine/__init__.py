"""Training components registered in mmengine's registries (layer-wise lr decay)."""

from .layer_decay import (
    LookHereLayerDecayOptimizerConstructor,
    ViTDetLayerDecayOptimizerConstructor,
    backbone_layer_id,
    find_lookhere_backbone,
    is_no_decay,
)

__all__ = [
    'LookHereLayerDecayOptimizerConstructor',
    'ViTDetLayerDecayOptimizerConstructor',
    'backbone_layer_id',
    'find_lookhere_backbone',
    'is_no_decay',
]
