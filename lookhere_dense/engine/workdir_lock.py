"""One training run per work dir: :class:`WorkDirLock`.

Two runs writing into one work dir overwrite each other's ``iter_N.pth`` and
``last_checkpoint`` (mmengine accepts the second run without a word). The training API
(:func:`lookhere_dense.apis.train.train_model`) takes this lock on the work dir before the
Runner is built (rank 0 of a multi-process run); a second run is refused with
:class:`~lookhere_dense.errors.WorkDirLockedError` naming the run that holds it (pid, host,
start, command), unless it is told to share (``share_work_dir=True``,
``tools/train.py --share-work-dir``).

The lock is an ``flock`` on ``WORK_DIR/.lookhere_train.lock``: the kernel drops it when
the holding process ends in any way (SIGKILL, OOM killer, power-off of a node holding an
NFSv4 lock after its lease), so a crashed run never blocks the next one; the file's
content (who held it) is kept and reported when the next run takes over. Forked children
(dataloader workers) close their copy of the lock at once, so it ends with the process that
took it: a ``--resume`` right after a SIGKILL is not refused while the dead run's workers
linger. A file system without ``flock`` support gets a warning and no lock.

A work dir that cannot be written (read-only mount, ``chattr +i``, no permission, a path
under a regular file) is refused before training starts, with one
:class:`~lookhere_dense.errors.WorkDirNotWritableError` naming the folder and the cause
(:func:`check_work_dir_writable`; the lock runs it first).
"""

from __future__ import annotations

import errno
import json
import os
import os.path as osp
import socket
import sys
import time
from typing import List, Optional

from ..errors import WorkDirLockedError, WorkDirNotWritableError

__all__ = ['WorkDirLock', 'LOCK_FILE', 'check_work_dir_writable']

#: The lock file's name inside the work dir.
LOCK_FILE = '.lookhere_train.lock'

#: The descriptors of the locks this process holds: a forked child (a dataloader worker)
#: closes its copies at once (:func:`_close_held_in_child`), so the lock ends with the
#: process that took it, not with the last of its workers.
_HELD: set = set()
_AT_FORK_REGISTERED = False


def _close_held_in_child() -> None:
    """In a forked child: close the inherited descriptors of the held locks. An ``flock``
    is dropped only when every descriptor of its open file is closed, and dataloader
    workers outlive a SIGKILLed run for seconds: the run's ``--resume`` was refused as
    "in use" by a run that was gone."""
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


def _register_at_fork() -> None:
    global _AT_FORK_REGISTERED
    if not _AT_FORK_REGISTERED and hasattr(os, 'register_at_fork'):
        os.register_at_fork(after_in_child=_close_held_in_child)
        _AT_FORK_REGISTERED = True


def _cause(err: OSError) -> str:
    from ..checkpoint.atomic import describe_path_error

    return describe_path_error(err)


def _unwritable(work_dir: str, err: OSError, what: str) -> WorkDirNotWritableError:
    return WorkDirNotWritableError(
        f'work dir {work_dir!r} cannot be written: {_cause(err)} ({what}). Training writes '
        'its logs and checkpoints there: make the folder writable (chmod u+w, chattr -i, '
        'a read-write mount) or choose another --work-dir.'
    )


def check_work_dir_writable(work_dir: str) -> None:
    """Create ``work_dir`` if missing and check that a file can be created in it and 64 KiB
    written (a temporary file, removed at once: a full disk is named here, not by a
    traceback from the first log or config write).

    Raises:
        lookhere_dense.errors.WorkDirNotWritableError: naming the folder and the cause.
    """
    from ..checkpoint.atomic import folder_write_problem

    problem = folder_write_problem(work_dir)
    if problem:
        raise _unwritable(work_dir, *problem) from None


def _describe(holder: dict) -> str:
    started = holder.get('started')
    when = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started)) if started else '?'
    return (
        f'pid {holder.get("pid", "?")} on {holder.get("host", "?")}, started {when}, '
        f'command: {holder.get("command", "?")}'
    )


class WorkDirLock:
    """An exclusive lock on a training work dir (see the module docstring).

    Example::

        with WorkDirLock('work_dirs/run1') as lock:
            for note in lock.notes:
                print(note)
            ...  # train

    Args:
        work_dir: the folder (created if missing; it must be writable).

    Attributes:
        path: the lock file.
        notes: what acquiring it found (a stale lock taken over, no lock support).
    """

    def __init__(self, work_dir: str):
        self.work_dir = work_dir
        self.path = osp.join(work_dir, LOCK_FILE)
        self.notes: List[str] = []
        self._fd: Optional[int] = None

    def acquire(self) -> 'WorkDirLock':
        """Take the lock.

        Raises:
            lookhere_dense.errors.WorkDirLockedError: a live run holds it.
            lookhere_dense.errors.WorkDirNotWritableError: the work dir cannot be written
                (:func:`check_work_dir_writable`).
        """
        import fcntl

        check_work_dir_writable(self.work_dir)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise _unwritable(self.work_dir, err, f'opening the lock file {self.path}') from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = self._read(fd)
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise WorkDirLockedError(self._refusal(holder)) from None
            self.notes.append(
                f'work dir lock {self.path} not taken ({os.strerror(err.errno or 0)}): '
                'this file system does not support flock, so a second run in the same '
                'work dir would not be refused'
            )
            return self
        holder = self._read(fd)
        if holder:
            self.notes.append(
                f'work dir {self.work_dir}: the previous run ({_describe(holder)}) ended '
                'without releasing its lock (killed or crashed); this run takes it over'
            )
        try:
            self._write(fd)
        except OSError as err:
            os.close(fd)
            raise _unwritable(self.work_dir, err, f'writing the lock file {self.path}') from None
        self._fd, self._owner = fd, os.getpid()
        _register_at_fork()
        _HELD.add(fd)
        return self

    def release(self) -> None:
        """Empty the lock file (a clean end) and drop the lock."""
        import fcntl

        fd, self._fd = self._fd, None
        if fd is None or getattr(self, '_owner', None) != os.getpid():
            return  # a forked child: its copy was closed at the fork (the number may be reused)
        _HELD.discard(fd)
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> 'WorkDirLock':
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    # helpers ---------------------------------------------------------------------------
    @staticmethod
    def _read(fd: int) -> dict:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            text = os.read(fd, 65536).decode('utf-8', 'replace').strip()
            return json.loads(text) if text else {}
        except (OSError, ValueError):
            return {'pid': '?', 'command': '(unreadable lock file)'}

    @staticmethod
    def _write(fd: int) -> None:
        holder = dict(
            pid=os.getpid(),
            host=socket.gethostname(),
            started=time.time(),
            command=' '.join(sys.argv)[:300],
        )
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(holder).encode())
        os.fsync(fd)

    def _refusal(self, holder: dict) -> str:
        return (
            f'work dir {self.work_dir!r} is in use by another training run '
            f'({_describe(holder)}; lock file {self.path}). Two runs in one folder would '
            "overwrite each other's checkpoints: use another --work-dir, wait for that run "
            'to end, or pass --share-work-dir if you really mean to share it.'
        )
