"""OpenMMLab model components (registered in mmseg's and mmdet's ``MODELS``)."""
from .backbones import LookHereViT

__all__ = ['LookHereViT']
