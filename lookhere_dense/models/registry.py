"""Registration of lookhere-dense modules in both OpenMMLab model registries.

mmseg and mmdet each keep their own ``MODELS`` registry (children of mmengine's), and a
config is built in the scope of one of them. Every model component here is registered in
both, under the same name, so ``dict(type='LookHereViT', ...)`` works in an mmseg config
and in an mmdet config alike.
"""

from __future__ import annotations

from typing import Callable, Type

from mmdet.registry import MODELS as MMDET_MODELS
from mmseg.registry import MODELS as MMSEG_MODELS

__all__ = ['register_model', 'MMSEG_MODELS', 'MMDET_MODELS']


def register_model(name: str = None) -> Callable[[Type], Type]:
    """Class decorator: register in mmseg's and mmdet's ``MODELS`` (``force=True`` so a
    re-import during development does not fail)."""

    def wrap(cls: Type) -> Type:
        for registry in (MMSEG_MODELS, MMDET_MODELS):
            registry.register_module(name=name or cls.__name__, module=cls, force=True)
        return cls

    return wrap
