from .lookhere_vit import LookHereViT

__all__ = ['LookHereViT']
