"""Is ``buffered`` superseded? (issue 30 item 3): one ViT-B/16 attention layer, forward +
backward through the engine, per backend, on the cases ``auto`` gave ``buffered`` (CPU
training, 1024..1300 tokens, where the fused kernel is not built). Run at ``a9c272f``
(docs/attention.md, "Retired: buffered"); ``buffered`` is removed since, and the name now
runs ``tiled`` (with a warning), so today's default compares ``tiled`` and ``fused``.

``python -m research.benchmark.buffered_check case BACKEND PRESET SIDE``
    one case in this process: prints ``BACKEND PRESET SIDE TOKENS MS`` (median of 5 steps
    after a warm-up, 1 thread).
``python -m research.benchmark.buffered_check run [--rounds R] [--backends ...] [--out F]``
    every case in a fresh process each, interleaved (round 1 of every case, then round
    2, ...), ``taskset -c 1`` where it exists; prints the medians, min..max and the ratios
    to ``tiled``, writes the raw numbers as JSON to ``F``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Sequence

CASES = (('lh180', 512), ('lh90', 512), ('lh180', 576), ('lh90', 576))


def case(backend: str, preset: str, side: int) -> float:
    """Median ms of 5 forward + backward steps of layer 3 of a ViT-B/16 engine (batch 1,
    12 heads x 64, CLS token, ``side`` x ``side`` image)."""
    import torch

    from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine

    torch.set_num_threads(1)
    torch.manual_seed(0)
    grid = (side // 16, side // 16)
    tokens = 1 + grid[0] * grid[1]
    eng = LookHereAttentionEngine(PRESETS[preset], 12, 12)
    q, k, v = (torch.randn(1, 12, tokens, 64, requires_grad=True) for _ in range(3))
    g = torch.randn(1, 12, tokens, 64)

    def step() -> None:
        eng(q, k, v, 3, grid, 1, backend=backend).backward(g)

    step()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def run(backends: Sequence[str], rounds: int) -> Dict[str, List[float]]:
    """``{'backend preset side': [ms per round]}``, each case a fresh process."""
    pin = ['taskset', '-c', '1'] if shutil.which('taskset') else []
    out: Dict[str, List[float]] = {}
    for r in range(rounds):
        for preset, side in CASES:
            for b in backends:
                cmd = [*pin, sys.executable, '-m', __spec__.name, 'case', b, preset, str(side)]
                line = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                ms = float(line.split()[-1])
                out.setdefault(f'{b} {preset} {side}', []).append(ms)
                print(f'round {r + 1}: {b} {preset} {side}: {ms:.1f} ms', flush=True)
    return out


def main(argv: Sequence[str] = None) -> None:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = p.add_subparsers(dest='cmd', required=True)
    c = sub.add_parser('case')
    c.add_argument('backend')
    c.add_argument('preset')
    c.add_argument('side', type=int)
    r = sub.add_parser('run')
    r.add_argument('--rounds', type=int, default=7)
    r.add_argument('--backends', nargs='+', default=['tiled', 'fused'])
    r.add_argument('--out', default=None)
    a = p.parse_args(argv)
    if a.cmd == 'case':
        ms = case(a.backend, a.preset, a.side)
        print(f'{a.backend} {a.preset} {a.side} {1 + (a.side // 16) ** 2} {ms:.1f}')
        return
    res = run(a.backends, a.rounds)
    if a.out:
        with open(a.out, 'w') as f:
            json.dump(res, f, indent=1)
    for preset, side in CASES:
        tiled = res.get(f'tiled {preset} {side}')
        for b in a.backends:
            ms = res[f'{b} {preset} {side}']
            ratio = ''
            if tiled and b != 'tiled':
                ratio = f', / tiled per round: median {statistics.median(x / y for x, y in zip(ms, tiled)):.2f}x'
            print(
                f'{preset} {side}: {b}: median {statistics.median(ms):.1f} ms '
                f'(min {min(ms):.1f}, max {max(ms):.1f}){ratio}'
            )


if __name__ == '__main__':
    main()
