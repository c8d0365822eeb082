"""OpenMMLab model components (registered in mmseg's and mmdet's ``MODELS``) and the
position encodings they use.

:mod:`.pos_encoding` is plain PyTorch and imports without OpenMMLab. The names below are
loaded on first use (PEP 562), so ``import lookhere_dense.models.pos_encoding`` does not
import mmcv / mmengine / mmseg / mmdet; the modules that register (:mod:`.backbones`,
:mod:`.necks`) are imported by :func:`lookhere_dense.registry.register_all_modules`.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ['LookHereViT', 'SimpleFPN', 'LayerNorm2d', 'POS_ENCODINGS']

#: where each lazily loaded name lives
_HOMES = {'LookHereViT': '.backbones', 'SimpleFPN': '.necks', 'LayerNorm2d': '.necks',
          'POS_ENCODINGS': '.pos_encoding'}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(set(globals()) | set(__all__))
