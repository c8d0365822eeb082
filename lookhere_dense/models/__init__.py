"""OpenMMLab model components, registered in mmseg's and mmdet's ``MODELS``: the backbone
(:mod:`.backbones`, a thin wrapper of the torch-only trunk :mod:`lookhere_dense.lookhere.vit`),
necks, heads and segmentors. The names below are loaded on first use (PEP 562); the
modules register when :func:`lookhere_dense.registry.register_all_modules` imports them.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ['LookHereViT', 'SimpleFPN', 'LayerNorm2d']

#: where each lazily loaded name lives
_HOMES = {'LookHereViT': '.backbones', 'SimpleFPN': '.necks', 'LayerNorm2d': '.necks'}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(set(globals()) | set(__all__))
