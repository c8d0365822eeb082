"""One peak-memory meter for benchmarks, evaluation and the study (torch only).

On CUDA it reports the caching allocator's peak (``torch.cuda.max_memory_allocated``).
On the CPU it reports the process's peak resident set size: exactly, from the kernel's
high-water mark ``VmHWM`` after resetting it (``/proc/self/clear_refs``, Linux), or --
where the mark cannot be reset -- by sampling the RSS every few milliseconds (a lower
bound of the true peak that can miss a short spike).
"""

from __future__ import annotations

import gc
import os
import threading
from typing import Optional

import torch

__all__ = ['PeakMemory', 'current_rss', 'peak_rss', 'reset_peak_rss', 'free_memory', 'MiB', 'GiB']

MiB = 2**20
GiB = 2**30


def _proc_status(field: str) -> Optional[int]:
    """A ``kB`` field of ``/proc/self/status`` in bytes, or None off Linux."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS (``VmHWM``) to its current RSS; False if unsupported."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        return False
    return _proc_status('VmHWM') is not None


def peak_rss() -> int:
    """Peak resident set size of this process in bytes (``VmHWM``, else ``ru_maxrss``)."""
    hwm = _proc_status('VmHWM')
    if hwm is not None:
        return hwm
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss() -> int:
    """Current resident set size in bytes (``VmRSS``; ``/proc/self/statm``; 0 if unknown)."""
    rss = _proc_status('VmRSS')
    if rss is not None:
        return rss
    try:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except (OSError, ValueError):
        return 0


def free_memory() -> None:
    """Collect garbage, empty the CUDA cache and hand freed heap back to the OS (glibc),
    so that the next measurement does not start on the previous one's leftovers."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        import ctypes

        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class PeakMemory:
    """Peak memory while a block runs.

    Example::

        with PeakMemory('cpu') as mem:
            model(x)
        print(mem.peak_mb, mem.rise_mb)

    Args:
        device: ``'cpu'`` or a CUDA device (``'cuda'``, ``'cuda:0'``).
        sample_interval: seconds between RSS samples when the kernel's peak cannot be
            reset. Default: 0.005.

    Attributes:
        start_bytes: memory in use when the block started (RSS, or CUDA allocated).
        peak_bytes: the peak during the block (same kind).
        rise_bytes: ``peak_bytes - start_bytes`` (>= 0): what the block itself added.
        kind: ``'cuda_max_allocated'``, ``'process_rss'`` (exact kernel peak) or
            ``'process_rss_sampled'``.
    """

    def __init__(self, device: str = 'cpu', sample_interval: float = 0.005):
        self.device = str(device)
        self.sample_interval = sample_interval
        self.start_bytes = 0
        self.peak_bytes = 0
        self.kind = ''
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith('cuda')

    @property
    def rise_bytes(self) -> int:
        return max(0, self.peak_bytes - self.start_bytes)

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / MiB

    @property
    def rise_mb(self) -> float:
        return self.rise_bytes / MiB

    def _sample(self) -> None:
        while not self._stop.wait(self.sample_interval):
            self.peak_bytes = max(self.peak_bytes, current_rss())

    def __enter__(self) -> 'PeakMemory':
        gc.collect()
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
            self.kind = 'cuda_max_allocated'
        elif reset_peak_rss():
            self.start_bytes = current_rss()
            self.kind = 'process_rss'
        else:
            self.start_bytes = self.peak_bytes = current_rss()
            self.kind = 'process_rss_sampled'
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self.peak_bytes = max(self.peak_bytes, self.start_bytes)
        return self

    def __exit__(self, *exc) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        elif self.kind == 'process_rss':
            self.peak_bytes = max(self.start_bytes, peak_rss())
        else:
            self._stop.set()
            self._thread.join()
            self.peak_bytes = max(self.peak_bytes, current_rss())
