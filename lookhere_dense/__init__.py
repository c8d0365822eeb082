"""lookhere-dense: LookHere plain-ViT backbones for mmsegmentation and mmdetection.

Importing the package is light and registers nothing: the LookHere model
(:mod:`lookhere_dense.lookhere`, ``create_model``) needs torch alone and never loads
OpenMMLab.

OpenMMLab registration and the version fixes happen in one place,
:func:`register_all_modules` (:mod:`lookhere_dense.registry`), which the tools call first
and which importing :mod:`lookhere_dense.openmmlab` runs. Configs reach it with
``custom_imports=dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)``,
which registers in any import order.
"""

__version__ = '0.1.0'
__all__ = ['register_all_modules', '__version__']


def register_all_modules(init_default_scope: bool = False, scope: str = 'mmseg') -> None:
    """See :func:`lookhere_dense.registry.register_all_modules`."""
    from .registry import register_all_modules as _register

    _register(init_default_scope, scope)
