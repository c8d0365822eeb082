"""OpenMMLab model components (registered in mmseg's and mmdet's ``MODELS``)."""
from .backbones import LookHereViT
from .necks import LayerNorm2d, SimpleFPN  # noqa: F401  (registers SimpleFPN, LN2d)
from .pos_encoding import POS_ENCODINGS

__all__ = ['LookHereViT', 'POS_ENCODINGS']
