"""lookhere-dense: LookHere plain-ViT backbones for mmsegmentation and mmdetection.

Importing the package is light: the LookHere math (:mod:`lookhere_dense.lookhere`) needs
torch alone and never loads OpenMMLab.

OpenMMLab registration and the version fixes happen in one explicit entry point,
:func:`register_all_modules` (:mod:`lookhere_dense.registry`), which the tools call first.
A config reaches it with ``custom_imports=dict(imports=['lookhere_dense'],
allow_failed_imports=False)``: mmengine reads ``custom_imports`` with mmengine already
loaded, and importing this package in a process where mmengine is loaded registers
(it never loads OpenMMLab itself).
"""
import sys

__version__ = '0.1.0'
__all__ = ['register_all_modules', '__version__']


def register_all_modules(init_default_scope: bool = False, scope: str = 'mmseg') -> None:
    """See :func:`lookhere_dense.registry.register_all_modules`."""
    from .registry import register_all_modules as _register
    _register(init_default_scope, scope)


if 'mmengine' in sys.modules:  # imported by an OpenMMLab process (e.g. custom_imports)
    register_all_modules()
