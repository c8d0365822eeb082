"""Atomic file writes (standard library only): write to a temporary name in the same
folder, ``fsync`` it, ``os.replace`` it onto the final name and ``fsync`` the folder.

A reader (``--resume``, ``tools/test.py``) therefore sees either the old file or the
complete new one, never a half-written file under the final name, whatever stops the
writer: a full disk, a file-size limit (``ulimit -f``), a read-only or removed folder,
SIGKILL. Temporary names start with a dot and end in ``.partial-<host>-<pid>`` (mmengine's and
our ``iter_*.pth`` globs never match them); a failed write removes its own, and what a
killed writer left behind is removed by the next run (:func:`remove_stale_partials`).
"""

from __future__ import annotations

import errno
import os
import os.path as osp
import re
import socket
import tempfile
from typing import List, Optional, Tuple

__all__ = [
    'partial_name',
    'fsync_dir',
    'publish_file',
    'atomic_write_text',
    'atomic_write_bytes',
    'describe_os_error',
    'describe_path_error',
    'folder_write_problem',
    'check_output_folder',
    'remove_quietly',
    'remove_stale_partials',
]

#: this machine's name in temporary names (no path separators)
_HOST = socket.gethostname().replace(os.sep, '_') or 'host'
#: ``.<name>.partial-<host>-<pid>`` (``-<pid>`` alone: written before names had the host)
_PARTIAL = re.compile(r'^\..+\.partial-(?:(?P<host>.+)-)?(?P<pid>\d+)$')


def partial_name(filename: str) -> str:
    """The temporary name :func:`publish_file` renames from:
    ``.<filename>.partial-<host>-<pid>`` (same folder, hidden, unique per process and
    machine: a folder on a shared file system may be written from several)."""
    head, tail = osp.split(filename)
    return osp.join(head, f'.{tail}.partial-{_HOST}-{os.getpid()}')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process: it may be the writer
    return True


def remove_stale_partials(folder: str) -> List[Tuple[str, int]]:
    """Remove the temporary files (:func:`partial_name`) that writers killed while writing
    left in ``folder`` -- this machine's whose process is gone (a live one, a pid taken by
    another process since, or another machine's, is left alone) -- and return
    ``(path, bytes)`` of each."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in sorted(names):
        m = _PARTIAL.match(name)
        if not m or m.group('host') not in (None, _HOST):
            continue
        pid = int(m.group('pid'))
        if pid == os.getpid() or _alive(pid):
            continue
        path = osp.join(folder, name)
        try:
            size = os.path.getsize(path)
            os.remove(path)
        except OSError:
            continue
        removed.append((path, size))
    return removed


def fsync_dir(path: str) -> None:
    """Flush a folder's entries (a rename is durable only once its folder is synced);
    a file system that cannot sync folders is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def publish_file(tmp: str, final: str) -> None:
    """``fsync`` the complete file ``tmp`` and rename it onto ``final`` (same folder).

    Raises:
        OSError: from the sync or the rename (``tmp`` is then still there).
    """
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    fsync_dir(osp.dirname(osp.abspath(final)))


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, ``fsync``, rename).

    Raises:
        OSError: the write failed; ``path`` is untouched and the temporary file removed.
    """
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: str, data: bytes, sync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, ``fsync`` with ``sync``,
    rename): ``path`` is the old file or the whole new one, never a part.

    Args:
        sync: flush to the disk before the rename (durable across a power loss); without
            it a failed write (a full disk) still leaves no partial file. Default: True.

    Raises:
        OSError: the write failed; ``path`` is untouched and the temporary file removed.
    """
    tmp = partial_name(path)
    try:
        with open(tmp, 'wb') as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    if sync:
        fsync_dir(osp.dirname(osp.abspath(path)))


def remove_quietly(path: Optional[str]) -> None:
    """Remove ``path`` if it is there; errors are ignored (used while handling one)."""
    if path:
        try:
            os.remove(path)
        except OSError:
            pass


_CAUSES = {
    errno.ENOSPC: 'the disk is full (ENOSPC)',
    errno.EDQUOT: 'the disk quota is exceeded (EDQUOT)',
    errno.EFBIG: 'the file-size limit was hit (EFBIG: `ulimit -f` or the file system)',
    errno.EROFS: 'the file system is read-only (EROFS)',
    errno.EACCES: 'permission denied (EACCES)',
    errno.EPERM: 'operation not permitted (EPERM)',
    errno.ENOENT: 'the folder does not exist (ENOENT: removed while the run went on?)',
    errno.EIO: 'an input/output error (EIO: failing disk or lost network mount)',
}


def describe_os_error(err: BaseException) -> str:
    """A few words for why a write failed, from the error's ``errno`` (found on the error
    or the errors it was raised from), else the error's own text."""
    seen = err
    while seen is not None:
        code = getattr(seen, 'errno', None)
        if code in _CAUSES:
            return _CAUSES[code]
        seen = seen.__cause__ or seen.__context__
    return f'{type(err).__name__}: {err}'


def describe_path_error(err: OSError) -> str:
    """:func:`describe_os_error`, with the path's own problems said as such: a part of it
    that is a file (``ENOTDIR`` / ``EEXIST``), or missing (``ENOENT``)."""
    if err.errno in (errno.ENOTDIR, errno.EEXIST):
        return f'a part of the path is not a folder ({os.strerror(err.errno)})'
    if err.errno == errno.ENOENT:
        return 'a part of the path does not exist (ENOENT)'
    return describe_os_error(err)


def folder_write_problem(folder: str) -> Optional[Tuple[OSError, str]]:
    """Create ``folder`` if missing and write 64 KiB to a temporary file in it (removed at
    once); the error and the step that failed, or None."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        return err, 'creating the folder'
    try:
        fd, probe = tempfile.mkstemp(prefix='.lookhere_write_test.', dir=folder)
    except OSError as err:
        return err, 'creating a file in it'
    try:  # what the run writes first (lock, config dump, log) fits in this
        os.write(fd, b'\0' * 65536)
        os.fsync(fd)
    except OSError as err:
        return err, 'writing 64 KiB to a file in it'
    finally:
        os.close(fd)
        try:
            os.remove(probe)
        except OSError:
            pass
    return None


def _nearest_existing(path: str) -> str:
    path = osp.abspath(path)
    while not osp.lexists(path) and osp.dirname(path) != path:
        path = osp.dirname(path)
    return path


def check_output_folder(folder: str, flag: str) -> None:
    """The training work dir's test (:func:`folder_write_problem`) for a tool's output
    folder (``--show-dir``, ``--out-dir``), before the work whose results it keeps, leaving nothing behind: an
    existing folder gets a 64 KiB file written and removed; a missing one, a folder
    created and removed in its nearest existing parent (it is created when the results
    are written). A path under a regular file, a read-only mount or a full disk is named
    by the flag, not by a traceback after the work (or deep in a library).

    Raises:
        lookhere_dense.errors.ToolError: naming the flag, the folder and the cause.
    """
    from ..errors import ToolError

    problem: Optional[Tuple[OSError, str]] = None
    if osp.isdir(folder):
        problem = folder_write_problem(folder)
    else:
        parent = _nearest_existing(folder)
        if osp.islink(parent) and not osp.exists(parent):
            err = OSError(errno.ENOENT, os.strerror(errno.ENOENT))
            problem = err, f'{parent!r} is a symbolic link to a missing target'
        elif not osp.isdir(parent):
            err = OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
            problem = err, f'{parent!r} is a file'
        else:
            try:
                os.rmdir(tempfile.mkdtemp(prefix='.lookhere_write_test.', dir=parent))
            except OSError as err:
                problem = err, f'creating a folder in {parent!r}'
    if problem:
        err, what = problem
        raise ToolError(
            f'{flag} {folder!r} cannot be written: {describe_path_error(err)} ({what}): '
            f'make it writable or choose another {flag}'
        )
