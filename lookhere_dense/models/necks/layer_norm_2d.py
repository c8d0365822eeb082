"""``LN2d``: LayerNorm over the channels of an NCHW map (ViTDet's norm for necks and heads).

Registered in mmengine's root ``MODELS`` registry, so ``norm_cfg=dict(type='LN2d')``
resolves through mmcv's ``build_norm_layer`` in the mmseg scope, the mmdet scope and
outside any scope alike.
"""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from mmengine.registry import MODELS
from torch import Tensor

__all__ = ['LayerNorm2d']


@MODELS.register_module('LN2d')
class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over dim 1 of ``(B, C, H, W)`` maps.

    A subclass of ``nn.LayerNorm`` (same parameters ``weight``/``bias`` of shape ``(C,)``),
    so everything that recognises norm layers by type -- mmcv's ``is_norm``, the
    abbreviation ``ln`` of ``build_norm_layer``, weight-decay rules -- treats it as one.

    Args:
        num_features (int): channels ``C``.
        eps (float): Default: 1e-6 when constructed directly. Built from a config
            (``norm_cfg=dict(type='LN2d')``, every neck and head here), mmcv's
            ``build_norm_layer`` sets ``eps=1e-5`` unless the config gives one:
            ``dict(type='LN2d', eps=1e-6)`` for ViTDet's 1e-6.
        elementwise_affine (bool): Default: True.
    """

    def __init__(self, num_features: int, eps: float = 1e-6, elementwise_affine: bool = True):
        super().__init__(num_features, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H, W)`` -> ``(B, C, H, W)``."""
        if x.dim() != 4:
            raise ValueError(f'LN2d expects (B, C, H, W) maps, got shape {tuple(x.shape)}')
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)
