"""OpenMMLab model components (registered in mmseg's and mmdet's ``MODELS``)."""
from .backbones import LookHereViT
from .pos_encoding import POS_ENCODINGS

__all__ = ['LookHereViT', 'POS_ENCODINGS']
