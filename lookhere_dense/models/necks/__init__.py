"""Necks (registered in mmseg's and mmdet's ``MODELS``) and the ``LN2d`` norm."""

from .layer_norm_2d import LayerNorm2d
from .simple_fpn import SimpleFPN

__all__ = ['LayerNorm2d', 'SimpleFPN']
