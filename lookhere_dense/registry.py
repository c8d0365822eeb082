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
from typing import Any, Mapping, Set

__all__ = [
    'register_all_modules',
    'check_openmmlab_installed',
    'REGISTERING_MODULES',
    'CONFIG_IMPORT',
    'OPENMMLAB_PACKAGES',
    'type_name',
    'type_names',
]

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


def type_name(node: Any) -> str:
    """The class name a registry config's ``type`` names: ``'SimpleFPN'`` for
    ``'SimpleFPN'``, ``'mmseg.SomeHead'`` or the class itself (new-style configs)."""
    typ = node.get('type')
    return typ.__name__ if isinstance(typ, type) else str(typ).split('.')[-1]


def type_names(nodes: Any) -> Set[str]:
    """:func:`type_name` of every registry config in ``nodes`` (a list such as
    ``custom_hooks``; entries that are not dicts are left out)."""
    return {type_name(n) for n in nodes or () if isinstance(n, Mapping)}


#: The packages the OpenMMLab parts import (the ``[openmmlab]`` extras; mmcv by module name).
OPENMMLAB_PACKAGES = ('mmengine', 'mmcv', 'mmseg', 'mmdet')


def check_openmmlab_installed() -> None:
    """Refuse to register without the OpenMMLab packages, naming the missing ones.

    Raises:
        lookhere_dense.errors.MissingExtrasError: one line (the tools and the
            ``lookhere-train`` / ``lookhere-test`` entry points print it as their
            ``error:``), instead of an import traceback from deep inside.
    """
    import importlib.util

    from .errors import MissingExtrasError

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):  # an import hook that refuses it
            return True

    missing = [name for name in OPENMMLAB_PACKAGES if absent(name)]
    if missing:
        raise MissingExtrasError(
            f'the OpenMMLab parts of lookhere-dense (configs, registries, tools) need '
            f'{", ".join(missing)}, not installed here: pip install '
            "'lookhere-dense[openmmlab]' (mmcv 2.1.0 has no PyPI wheel for torch 2.14: "
            "install a matching wheel first, or run the repository's setup.sh). The model "
            'alone needs torch only: lookhere_dense.lookhere.create_model',
            name=missing[0],
        )


def register_all_modules(init_default_scope: bool = False, scope: str = 'mmseg') -> None:
    """Register every lookhere-dense component in the OpenMMLab registries (idempotent).

    Args:
        init_default_scope: also make ``scope`` the default registry scope (as mmseg's
            ``register_all_modules(init_default_scope=True)``). Default: False.
        scope: the scope for ``init_default_scope``. Default: ``'mmseg'``.
    """
    global _done
    if not _done:
        check_openmmlab_installed()
        from . import compat

        compat.apply()
        for name in REGISTERING_MODULES:
            importlib.import_module(name)
        _done = True
    if init_default_scope:
        from mmengine.registry import init_default_scope as _init

        _init(scope)
