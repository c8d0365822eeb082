"""lookhere-dense: LookHere plain-ViT backbones for mmsegmentation and mmdetection.

Importing the package is light and registers nothing with OpenMMLab: the LookHere model
(:mod:`lookhere_dense.lookhere`, ``create_model``) needs torch alone and never loads
OpenMMLab. It registers the ``lookhere_vit_*`` models with timm
(:mod:`lookhere_dense.timm_models`) when timm is imported, before or after this package;
it never imports timm itself.

OpenMMLab registration and the version fixes happen in one place,
:func:`register_all_modules` (:mod:`lookhere_dense.registry`), which the tools call first
and which importing :mod:`lookhere_dense.openmmlab` runs. Configs reach it with
``custom_imports=dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)``,
which registers in any import order.

The configs ship inside the package (``lookhere_dense/.mim/configs``, OpenMMLab's mim
layout; in the repository a link to ``configs/``): :func:`config_path` finds one by name,
and the tools accept ``lookhere_dense::NAME.py``.
"""

import importlib
import os
import os.path as osp
import sys
from typing import Any, List

__version__ = '0.1.0'
__all__ = ['register_all_modules', 'config_path', 'config_names', 'CONFIG_ROOT', '__version__']

#: the folder of the configs shipped with the package (mim's ``.mim/configs`` layout)
CONFIG_ROOT = osp.join(osp.dirname(osp.abspath(__file__)), '.mim', 'configs')


def register_all_modules(init_default_scope: bool = False, scope: str = 'mmseg') -> None:
    """See :func:`lookhere_dense.registry.register_all_modules`."""
    from .registry import register_all_modules as _register

    _register(init_default_scope, scope)


def config_names() -> List[str]:
    """The configs shipped with the package, as paths relative to :data:`CONFIG_ROOT`
    (``'segmenter_lookhere_ade20k.py'``, ``'_base_/models/...'``, ``'study/...'``), sorted."""
    names = []
    for folder, _, files in os.walk(CONFIG_ROOT, followlinks=True):
        rel = osp.relpath(folder, CONFIG_ROOT)
        names += [osp.normpath(osp.join(rel, f)) for f in files if f.endswith('.py')]
    return sorted(names)


def config_path(name: str) -> str:
    """The absolute path of a config shipped with the package, e.g.
    ``config_path('segmenter_lookhere_ade20k.py')`` for
    ``mmseg.apis.init_model(config_path(...))`` or ``Config.fromfile``; works the same
    in the repository and after ``pip install`` (the configs are package data).

    Args:
        name: the config's path relative to the configs folder (``'x.py'``,
            ``'study/fov_vit_tiny.py'``); a ``configs/`` or ``lookhere_dense::`` prefix
            is accepted.

    Raises:
        FileNotFoundError: no such config, naming it and the closest shipped names.
    """
    rel = name.split('::', 1)[1] if name.startswith('lookhere_dense::') else name
    rel = rel[len('configs/') :] if rel.startswith('configs/') else rel
    full = osp.normpath(osp.join(CONFIG_ROOT, rel))
    if osp.isabs(rel) or not full.startswith(osp.normpath(CONFIG_ROOT) + os.sep):
        raise FileNotFoundError(
            f'config {name!r}: give a path relative to the shipped configs folder '
            f'({CONFIG_ROOT}), e.g. {"segmenter_lookhere_ade20k.py"!r}'
        )
    if not osp.isfile(full):
        import difflib

        close = difflib.get_close_matches(rel, config_names(), n=3, cutoff=0.5)
        raise FileNotFoundError(
            f'config {name!r} is not shipped with lookhere_dense (looked for {full!r})'
            + (f'; did you mean {" or ".join(repr(c) for c in close)}?' if close else '')
        )
    return full


class _RegisterWithTimm:
    """A ``sys.meta_path`` entry that registers the ``lookhere_vit_*`` models with timm
    right after timm itself is imported (the import is found by the finders after this
    one, so import hooks that refuse timm still do); it then removes itself."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        """The spec of ``timm`` from the other finders, its loader wrapped to register
        after timm has run; None for every other module."""
        if name != 'timm':
            return None
        for finder in [f for f in sys.meta_path if f is not self]:
            find = getattr(finder, 'find_spec', None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _unhook()
            _import_timm_models()

        spec.loader.exec_module = exec_module
        return spec


def _import_timm_models() -> None:
    """Import :mod:`lookhere_dense.timm_models` (which registers the models). A timm whose
    API it cannot use gets a warning, never an error: ``import timm`` itself must work."""
    try:
        importlib.import_module('lookhere_dense.timm_models')
    except Exception as err:  # noqa: B902 - whatever an unknown timm raises
        import warnings

        timm = sys.modules.get('timm')
        warnings.warn(
            f'lookhere_dense: the lookhere_vit_* models are not registered with timm '
            f'{getattr(timm, "__version__", "?")} ({type(err).__name__}: {err}); timm '
            "itself works. lookhere-dense's timm models are tested with timm 1.0.29-1.0.31 "
            "(pip install 'timm==1.0.31')",
            stacklevel=2,
        )


def _unhook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegisterWithTimm)]


def _register_with_timm() -> None:
    """Register the ``lookhere_vit_*`` models with timm: now if timm is imported, else as
    soon as it is (``LOOKHERE_TIMM=0``: never). Nothing here imports timm."""
    import warnings

    from .validation import env_switch

    try:
        on = env_switch('LOOKHERE_TIMM')
    except ValueError as err:  # at import: a traceback before any tool could say it
        warnings.warn(f'{err}; the lookhere_vit_* timm models are registered', stacklevel=2)
        on = True
    if not on:
        return
    if 'timm' in sys.modules:
        _import_timm_models()
    else:
        _unhook()
        sys.meta_path.insert(0, _RegisterWithTimm())


_register_with_timm()
