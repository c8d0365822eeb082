"""THE checkpoint reader: a file (``.pth`` / ``.pt`` / ``.safetensors``, or an http(s) URL)
to a dict of CPU tensors, weights only, or an error that says what is wrong with the file.

``torch.load(..., weights_only=True)`` everywhere: unpickling arbitrary objects can run
code, so a file that holds Python objects besides tensors, numbers and strings is refused
(mmengine's Runner checkpoints hold a few of mmengine's own classes; exactly those are
allow-listed by :mod:`lookhere_dense.compat` when the OpenMMLab layer registers, and by the
timm entry and ``tools/convert_checkpoint.py`` when they meet such a file). timm's
``train.py`` checkpoints hold its arguments as an ``argparse.Namespace`` (``args``): that
class alone is allowed while these functions read a file, as timm's reader allows it.
Torch alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import re
import urllib.error
import zipfile
from typing import Any, Dict, Mapping, Optional

import torch

from ..errors import UnreadableCheckpointError

__all__ = ['load_checkpoint_file', 'checkpoint_problem', 'read_pointer_file']


#: classes allowed for ``torch.load(weights_only=True)`` while a file is read here: timm's
#: ``train.py`` (its ``CheckpointSaver``) saves its arguments, ``args``, as a Namespace, whose
#: unpickling sets attributes and runs no code (timm's own reader allows it the same way)
SAFE_GLOBALS = (argparse.Namespace,)


def _safe_globals() -> Any:
    """A context that allows :data:`SAFE_GLOBALS` for weights-only loading inside it only
    (nothing where this torch has no ``torch.serialization.safe_globals``). Classes the
    user allowed already are left out of it: the context's exit would take them off
    torch's process-wide list."""
    scoped = getattr(torch.serialization, 'safe_globals', None)
    if scoped is None:
        return contextlib.nullcontext()
    allowed = torch.serialization.get_safe_globals()
    new = [cls for cls in SAFE_GLOBALS if cls not in allowed]
    return scoped(new) if new else contextlib.nullcontext()


def _first_line(err: BaseException) -> str:
    """The first line of an error message that is not torch's ``weights_only`` advice."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    keep = [
        ln
        for ln in lines
        if 'weights_only' not in ln
        and 'WeightsUnpickler' not in ln
        and 'trusted source' not in ln
        and 'torch.load' not in ln
    ]
    unsupported = [ln for ln in lines if 'Unsupported global' in ln]
    line = (unsupported or keep or lines or [type(err).__name__])[0]
    return line.split('. ')[0][:300]


_REWRITE = 'it was not written completely or not downloaded completely: download / save it again'
_NOT_TORCH = 'expected a file written by torch.save (.pth / .pt) or a .safetensors file'


def _unreadable(path: str, err: BaseException) -> UnreadableCheckpointError:
    """The error for a file torch cannot read, by cause; never advises weights_only=False."""
    text = str(err)
    if isinstance(err, pickle.UnpicklingError) and 'Unsupported global' in text:
        m = re.search(r'GLOBAL ([\w.]+)', text)
        what = m.group(1) if m else 'a Python class'
        return UnreadableCheckpointError(
            path,
            f'it holds Python objects ({what}) besides tensors, numbers and strings',
            'lookhere-dense loads weights only (unpickling arbitrary objects can run code). '
            + (
                'An mmengine Runner checkpoint: call lookhere_dense.register_all_modules() '
                'first (it allows exactly the classes mmengine writes), or re-save'
                if what.startswith('mmengine.')
                else 'Re-save'
            )
            + ' the weights alone, e.g. torch.save({"state_dict": model.state_dict()}, '
            'PATH)',
            refused_class=m.group(1) if m else None,
        )
    if isinstance(err, PermissionError):
        return UnreadableCheckpointError(path, 'permission denied')
    if isinstance(err, (EOFError, zipfile.BadZipFile, OSError)) or (
        isinstance(err, RuntimeError)
        and ('central directory' in text or 'PytorchStreamReader' in text)
    ):
        return UnreadableCheckpointError(
            path, f'damaged: it is truncated or corrupt ({_first_line(err)})', _REWRITE
        )
    return UnreadableCheckpointError(
        path,
        f'not a PyTorch checkpoint lookhere-dense can read ({type(err).__name__}: '
        f'{_first_line(err)})',
        _NOT_TORCH,
    )


def read_pointer_file(path: str) -> Optional[str]:
    """The checkpoint a pointer file names (mmengine's ``last_checkpoint``: one line, the
    newest checkpoint's path): its text, stripped; a relative name is taken relative to
    the file's folder, a URL as it is. None: no such file, an unreadable or empty one."""
    try:
        with open(path, encoding='utf-8') as f:
            named = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not named:
        return None
    if os.path.isabs(named) or '://' in named:
        return named
    return os.path.join(os.path.dirname(path), named)


def _pointer_target(path: str) -> Optional[str]:
    """The checkpoint a small text file names as its only line (:func:`read_pointer_file`),
    when that file exists; else None."""
    if os.path.getsize(path) > 4096:
        return None
    target = read_pointer_file(path)
    if target is None or len(target.splitlines()) != 1:
        return None
    return target if os.path.isfile(target) and target != path else None


def _file_problem(path: str) -> Optional[UnreadableCheckpointError]:
    """What is wrong with a local file before anything is unpickled: a folder, an empty
    file, a ``torch.save`` (zip) file whose end is missing, whose members fail their
    checksums (a truncated or corrupt download) or that has no ``data.pkl``.

    Raises:
        FileNotFoundError: naming the path, when it does not exist.
    """
    if os.path.isdir(path):
        return UnreadableCheckpointError(path, 'it is a folder, not a file')
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint file not found: {path!r}')
    if os.path.getsize(path) == 0:
        return UnreadableCheckpointError(path, 'empty file', 'it is empty (0 bytes): ' + _REWRITE)
    try:
        with open(path, 'rb') as f:
            head = f.read(4)
    except OSError as err:
        return _unreadable(path, err)
    if path.endswith(('.py', '.yaml', '.yml')) and head != b'PK\x03\x04':
        return UnreadableCheckpointError(
            path,
            'it is a config file, not a checkpoint (the tools take the config first, then '
            'the checkpoint: tools/test.py CONFIG CHECKPOINT)',
        )
    pointed = _pointer_target(path)
    if pointed is not None:
        return UnreadableCheckpointError(
            path,
            f"it is mmengine's last_checkpoint pointer file (a line of text naming {pointed!r})",
            f'pass that checkpoint: {pointed}',
        )
    is_zip = zipfile.is_zipfile(path)
    if head == b'PK\x03\x04' and not is_zip:
        return UnreadableCheckpointError(
            path,
            'damaged: it is truncated or corrupt (a torch.save zip archive whose end is missing)',
            _REWRITE,
        )
    if not is_zip:
        return None
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        return UnreadableCheckpointError(
            path,
            f'damaged: it is truncated or corrupt (zip archive: {_first_line(err)})',
            _REWRITE,
        )
    if bad is not None:
        return UnreadableCheckpointError(
            path, f'damaged: it is truncated or corrupt (checksum error in {bad!r})', _REWRITE
        )
    if not any(n.endswith('data.pkl') for n in names):
        return UnreadableCheckpointError(
            path, 'not a PyTorch checkpoint (a zip archive without data.pkl)', _NOT_TORCH
        )
    return None


def _not_weights(path: str, ckpt: Any) -> Optional[UnreadableCheckpointError]:
    if isinstance(ckpt, Mapping):
        return None
    return UnreadableCheckpointError(
        path, f'it does not hold a dict of weights (got {type(ckpt).__name__})'
    )


def load_checkpoint_file(path: str) -> Dict[str, Any]:
    """THE checkpoint reader: load a file (``.pth``/``.pt``/``.safetensors``, or an http(s)
    URL) to CPU, tensors only (``weights_only``; mmengine's own checkpoint objects are
    allowed once :func:`lookhere_dense.register_all_modules` has run).

    Raises:
        FileNotFoundError: naming the path, when it does not exist.
        UnreadableCheckpointError: ``checkpoint PATH cannot be read: PROBLEM`` for a
            folder, an empty, truncated or corrupt file (zip checksums are verified), a
            file that is no checkpoint or no dict, or one that holds arbitrary Python
            objects. Never advises ``weights_only=False``.
    """
    if '://' not in path:
        problem = _file_problem(path)
        if problem is not None:
            raise problem
    if path.endswith('.safetensors'):
        from safetensors.torch import load_file

        try:
            return load_file(path, device='cpu')
        except Exception as err:  # safetensors raises its own SafetensorError
            raise UnreadableCheckpointError(
                path, f'it is not a readable .safetensors file ({_first_line(err)})'
            ) from None
    try:
        if '://' in path:
            if not path.startswith(('http://', 'https://')):
                raise UnreadableCheckpointError(
                    path,
                    'only local files and http(s):// URLs can be read here',
                    'download the file first (with OpenMMLab, mmengine.runner.'
                    'CheckpointLoader reads its other schemes)',
                )
            try:
                with _safe_globals():
                    ckpt = torch.hub.load_state_dict_from_url(
                        path, map_location='cpu', weights_only=True
                    )
            except (urllib.error.URLError, ConnectionError, TimeoutError) as err:
                raise UnreadableCheckpointError(
                    path,
                    f'it could not be downloaded ({_first_line(err)})',
                    'check the address and the network, or download the file and give '
                    'its local path',
                ) from None
        else:
            with _safe_globals():
                ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except (FileNotFoundError, MemoryError, KeyboardInterrupt, UnreadableCheckpointError):
        raise
    except Exception as err:
        raise _unreadable(path, err) from None
    problem = _not_weights(path, ckpt)
    if problem is not None:
        raise problem
    return dict(ckpt)


def checkpoint_problem(path: str) -> Optional[str]:
    """Why the local file ``path`` cannot be read as a checkpoint, in a few words (None when
    it can): what :func:`load_checkpoint_file` would refuse, found without raising and
    without loading the tensors of a ``torch.save`` (zip) file (they are memory-mapped).
    ``'file not found'`` for a missing file."""
    try:
        problem = _file_problem(path)
    except FileNotFoundError:
        return 'file not found'
    if problem is None and path.endswith('.safetensors'):
        try:
            load_checkpoint_file(path)
        except UnreadableCheckpointError as err:
            problem = err
    elif problem is None:
        try:
            with _safe_globals():
                ckpt = torch.load(
                    path, map_location='cpu', weights_only=True, mmap=zipfile.is_zipfile(path)
                )
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: B902 - every failure is a reason
            problem = _unreadable(path, err)
        else:
            problem = _not_weights(path, ckpt)
    return None if problem is None else problem.problem


def checkpoint_head(path: str) -> Any:
    """A ``torch.save`` file as ``torch.load(weights_only=True)`` gives it, its tensors
    memory-mapped (a zip file's are not read), to look at its ``meta``; None for a
    ``.safetensors`` file, a missing one or one that cannot be read (the callers fall back
    on what they would do without it)."""
    if path.endswith('.safetensors') or not os.path.isfile(path):
        return None
    try:
        with _safe_globals():
            return torch.load(
                path, map_location='cpu', weights_only=True, mmap=zipfile.is_zipfile(path)
            )
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception:  # noqa: B902 - unreadable: nothing to look at
        return None


def training_meta(path: str) -> Optional[Dict[str, Any]]:
    """The ``meta`` of a training run's checkpoint (mmengine's: ``iter``, ``epoch``, ...), or
    None: a weights-only file (no ``meta``), a ``.safetensors`` file, or one that cannot be
    read (:func:`checkpoint_head`)."""
    ckpt = checkpoint_head(path)
    meta = ckpt.get('meta') if isinstance(ckpt, dict) else None
    return dict(meta) if isinstance(meta, dict) else None
