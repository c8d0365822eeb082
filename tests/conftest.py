"""Shared test fixtures.

Reference outputs of the official LookHere code live in ``../shared/reference`` (beside
the checkout). Tests that need them skip when the folder is absent, unless
``LOOKHERE_REQUIRE_SHARED=1`` (set by ``.ci/run``), where a missing folder is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """The suite tests an OpenMMLab toolkit: register its components once, as the tools do
    (``import lookhere_dense`` alone stays light; see :mod:`lookhere_dense.registry`).
    Without mmengine (an environment with torch alone, such as the GPU machine's) nothing
    is registered: the torch-only tests run, the OpenMMLab ones fail on their imports."""
    import importlib.util

    import lookhere_dense

    if importlib.util.find_spec('mmengine') is None:
        return
    lookhere_dense.register_all_modules()


def _shared_dir() -> Path:
    env = os.environ.get('LOOKHERE_SHARED')
    return Path(env) if env else REPO.parent / 'shared'


@pytest.fixture(scope='session')
def reference_dir() -> Path:
    """``../shared/reference`` (or ``$LOOKHERE_SHARED/reference``)."""
    path = _shared_dir() / 'reference'
    if not path.is_dir():
        if os.environ.get('LOOKHERE_REQUIRE_SHARED') == '1':
            pytest.fail(f'reference outputs not found at {path}')
        pytest.skip(f'reference outputs not found at {path}')
    return path


@pytest.fixture(scope='session')
def official_tiny(reference_dir: Path) -> SimpleNamespace:
    """The official tiny LookHere model of the reference set: ``path`` (its weights file),
    ``io`` (the official code's recorded inputs and outputs: ``io['cases']``) and
    ``vit_kwargs`` (its architecture as ``LookHereViT`` / ``create_model`` arguments)."""
    import torch

    io = torch.load(reference_dir / 'official_tiny_halves_none_io.pt', weights_only=True)
    arch = io['model']
    vit_kwargs = dict(
        embed_dims=arch['embed_dim'],
        num_layers=arch['depth'],
        num_heads=arch['num_heads'],
        patch_size=arch['patch_size'],
        init_values=arch['init_values'],
    )
    path = reference_dir / 'official_tiny_halves_none.pth'
    return SimpleNamespace(path=path, io=io, vit_kwargs=vit_kwargs)


@pytest.fixture(scope='session')
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope='module')
def one_torch_thread():
    """One PyTorch thread for a module (``pytestmark = pytest.mark.usefixtures(...)``): on a
    busy 2-core machine tiny models run several times faster than with two threads that
    wait for each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def without_fused(monkeypatch):
    """``auto`` as on a machine where the fused CPU kernel is not built (no compiler, or
    ``LOOKHERE_FUSED=0``): the engine's availability check answers False for the test, so
    the ``tiled`` choices are exercised (``tests/test_fused.py`` runs the real
    ``LOOKHERE_FUSED=0`` process too)."""
    import lookhere_dense.lookhere.attention.fused as fused

    monkeypatch.setattr(fused, 'fused_available', lambda: False)


@pytest.fixture(autouse=True)
def drop_closed_log_streams():
    """After each test, drop the logging handlers whose stream is closed.

    mmengine's ``MMLogger`` instances live for the whole process and keep a handler on the
    ``sys.stdout`` / ``sys.stderr`` of the test that created them; pytest closes those
    captured streams after that test, and the next test that logs through the same logger
    would print a "Logging error" traceback (which tests of the tools' one-line errors
    rightly refuse). A real process never swaps its streams, so this is the test harness's
    leftover, cleaned here."""
    yield
    import logging
    import sys

    loggers = [logging.getLogger()]
    loggers += [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    if 'mmengine.logging' in sys.modules:
        loggers += list(sys.modules['mmengine.logging'].MMLogger._instance_dict.values())
    for logger in loggers:
        for handler in list(logger.handlers):
            stream = getattr(handler, 'stream', None)
            if stream is not None and getattr(stream, 'closed', False):
                logger.removeHandler(handler)


@pytest.fixture(scope='module')
def pristine(tmp_path_factory) -> Path:
    """A tiny ADE20K-layout dataset (4 training, 2 validation pairs), made once per
    module: copy it (:func:`ade`) before changing it."""
    from research.datasets.synthetic_seg import make_ade20k_like

    return make_ade20k_like(tmp_path_factory.mktemp('pristine'), num_train=4, num_val=2)


@pytest.fixture
def ade(pristine, tmp_path) -> Path:
    """A fresh copy of :func:`pristine`, to change or break."""
    import shutil

    root = tmp_path / 'ade'
    shutil.copytree(pristine, root)
    return root
