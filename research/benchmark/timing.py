"""Wall-clock timing that is honest on CUDA and fair between cases (torch only)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple, TypeVar

import torch

__all__ = ['sync', 'timed', 'rotations', 'interleaved', 'paired_ratio']

T = TypeVar('T')


def sync(device: str) -> None:
    """Wait for queued device work (CUDA) so wall-clock timings are honest."""
    if str(device).startswith('cuda'):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> float:
    """Seconds one call of ``fn`` takes (device-synchronised before and after)."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def rotations(names: Sequence[T], rounds: int) -> Iterator[Tuple[int, List[T]]]:
    """``(round, order)`` for ``rounds`` rounds: round ``r`` starts with item
    ``r mod len(names)`` (``A B C``, ``B C A``, ``C A B``, ...), so drift cancels."""
    names = list(names)
    for r in range(rounds):
        k = r % len(names) if names else 0
        yield r, names[k:] + names[:k]


def interleaved(
    cases: Dict[str, Callable[[], Any]], repeats: int, device: str
) -> Dict[str, List[float]]:
    """Time every case ``repeats`` times, rotating the order each round (drift cancels).

    Round ``r`` starts with case ``r mod len(cases)``: ``A B C``, ``B C A``, ``C A B``, ...

    Returns:
        ``{name: [seconds of round 0, round 1, ...]}``.
    """
    times: Dict[str, List[float]] = {n: [] for n in cases}
    for _, order in rotations(list(cases), repeats):
        for n in order:
            times[n].append(timed(cases[n], device))
    return times


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of ``num[i] / den[i]`` (robust to load changes between rounds)."""
    if len(num) != len(den) or not num:
        raise ValueError(
            f'paired_ratio needs two equally long, non-empty series, got '
            f'{len(num)} and {len(den)} values'
        )
    return statistics.median(a / b for a, b in zip(num, den))
