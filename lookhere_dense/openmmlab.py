"""Import this module to register lookhere-dense with OpenMMLab.

Configs name it in ``custom_imports``::

    custom_imports = dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)

Importing it runs :func:`lookhere_dense.registry.register_all_modules` (mmseg's and mmdet's
``MODELS``, the transforms, hooks, metrics and the optimizer constructor; the version fixes
of :mod:`lookhere_dense.compat`). A module's body runs once per process, and this one is
imported by nothing else in the package, so the registration happens exactly when a config
(or a user) asks for it -- whatever was imported before: ``import lookhere_dense`` or any
submodule first (a notebook), mmseg / mmdet first, or nothing at all (mmseg's own
``tools/train.py``, ``mmseg.apis.init_model``, the Inferencers). ``import lookhere_dense``
alone registers nothing and loads no OpenMMLab module.
"""

from __future__ import annotations

from .registry import register_all_modules

__all__ = ['register_all_modules']

register_all_modules()
