"""The one place that connects lookhere-dense to OpenMMLab.

:func:`register_all_modules` applies the version fixes of :mod:`lookhere_dense.compat` and
imports every module that registers something -- models (mmseg's and mmdet's ``MODELS``),
the layer-decay optimizer constructor, hooks, data transforms and metrics -- like mmseg's
own ``register_all_modules``. The tools call it first; configs reach it through
``custom_imports=dict(imports=['lookhere_dense.openmmlab'])`` (:data:`CONFIG_IMPORT`), whose
import runs it.

Nothing else in the package registers as a side effect of being imported for its math:
``import lookhere_dense.lookhere`` needs torch alone.
"""

from __future__ import annotations

import importlib

__all__ = ['register_all_modules', 'REGISTERING_MODULES', 'CONFIG_IMPORT']

#: the module a config names in ``custom_imports``: importing it registers everything
CONFIG_IMPORT = 'lookhere_dense.openmmlab'

#: The modules whose import registers lookhere-dense components, in import order.
REGISTERING_MODULES = (
    'lookhere_dense.models.backbones',
    'lookhere_dense.models.backbones.lookwhere',
    'lookhere_dense.models.necks',
    'lookhere_dense.models.heads',
    'lookhere_dense.models.segmentors',
    'lookhere_dense.engine',
    'lookhere_dense.engine.hooks',
    'lookhere_dense.engine.slope_logging',
    'lookhere_dense.data.transforms',
    'lookhere_dense.data.mixed_crops',
    'lookhere_dense.evaluation.metrics',
)

_done = False


def register_all_modules(init_default_scope: bool = False, scope: str = 'mmseg') -> None:
    """Register every lookhere-dense component in the OpenMMLab registries (idempotent).

    Args:
        init_default_scope: also make ``scope`` the default registry scope (as mmseg's
            ``register_all_modules(init_default_scope=True)``). Default: False.
        scope: the scope for ``init_default_scope``. Default: ``'mmseg'``.
    """
    global _done
    if not _done:
        from . import compat

        compat.apply()
        for name in REGISTERING_MODULES:
            importlib.import_module(name)
        _done = True
    if init_default_scope:
        from mmengine.registry import init_default_scope as _init

        _init(scope)
