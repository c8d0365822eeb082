"""One quick in-process probe of the fused kernel in bfloat16 (issue 31 item 1): one
LookHere attention layer with ViT-B shapes (12 heads, d = 64) at ~4k and ~8k tokens.

Cases, each timed in interleaved rounds (the machine may be shared: medians, not minima):

- ``fused bf16 vdpbf16ps`` / ``fused bf16 brgemm``: bf16 ``q, k, v`` through the native
  bfloat16 products, our AVX512-BF16 kernels / PyTorch's brgemm (oneDNN's micro-kernel:
  AMX tiles where present), each where it runs
  (:func:`~lookhere_dense.lookhere.fused.bf16_products`);
- ``fused bf16 fp32-products``: bf16 ``q, k, v`` read natively, float32 products;
- ``fused fp32-compute``: bf16 ``q, k, v`` copied to float32, the kernel, the output copied
  back to bf16 (the path before bf16 was read natively);
- ``sdpa bf16``: ``F.scaled_dot_product_attention`` in bf16 without any bias (a lower
  bound on a dense layer, not a LookHere layer).

Run: ``python -m research.benchmark.fused_bf16_probe [--rounds 5] [--threads 2] [--backward]``
(``--backward``: forward + backward of every case, SDPA's too).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine
from lookhere_dense.lookhere.fused import (
    BF16_PRODUCTS,
    amx_bf16_available,
    bf16_products,
    fused_attention,
    native_bf16_unavailable_reason,
)


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _runs(products: str) -> bool:
    try:
        bf16_products(products)
        return True
    except RuntimeError:
        return False


def _cases(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gb) -> dict:
    """The timed calls on ``(1, 12, T, 64)`` bf16 ``q, k, v`` (layer 6's table)."""
    plans: dict = {}
    cases = {}
    for products in BF16_PRODUCTS:
        if _runs(products):
            cases[f'fused bf16 {products}'] = lambda p=products: fused_attention(
                q, k, v, gb, 6, True, plans=plans, native_bf16=p
            )
    return {
        **cases,
        'fused bf16 fp32-products': lambda: fused_attention(
            q, k, v, gb, 6, True, plans=plans, native_bf16=False
        ),
        'fused fp32-compute': lambda: fused_attention(
            q.float(), k.float(), v.float(), gb, 6, True, plans=plans
        ).bfloat16(),
        'sdpa bf16 (no bias)': lambda: F.scaled_dot_product_attention(q, k, v),
    }


def _with_backward(fn):
    """``fn`` and its backward (a gradient of ones on the output)."""

    def run():
        out = fn()
        out.backward(torch.ones_like(out))

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=5, help='Default: 5')
    parser.add_argument('--threads', type=int, default=2, help='Default: 2')
    parser.add_argument('--preset', default='lh180', help='Default: lh180')
    parser.add_argument(
        '--backward', action='store_true', help='time forward + backward (grids 32x32, 40x40)'
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f'torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}')
    print(
        f'native bf16 products: {native_bf16_unavailable_reason() or "yes"}; default '
        f'{bf16_products()}; AMX tiles: {"yes" if amx_bf16_available() else "no"}'
    )
    engine = LookHereAttentionEngine(PRESETS[args.preset], 12, 12)
    gen = torch.Generator().manual_seed(0)
    grids = ((32, 32), (40, 40)) if args.backward else ((64, 64), (64, 128))
    for grid in grids:
        tokens = grid[0] * grid[1] + 1
        gb = engine.grid_bias(grid, torch.device('cpu'), torch.float32)
        q, k, v = (
            torch.randn(1, 12, tokens, 64, generator=gen).bfloat16().requires_grad_(args.backward)
            for _ in range(3)
        )
        cases = _cases(q, k, v, gb)
        if args.backward:
            cases = {name: _with_backward(fn) for name, fn in cases.items()}
        with torch.set_grad_enabled(args.backward):
            for fn in cases.values():  # warm-up (plans, the build)
                fn()
            times: dict = {name: [] for name in cases}
            for _ in range(args.rounds):
                for name, fn in cases.items():
                    times[name].append(_time(fn))
        base = statistics.median(times['fused fp32-compute'])
        for name, values in times.items():
            med = statistics.median(values)
            print(
                f'{grid[0]}x{grid[1]} ({tokens} tokens) {name:24s} median {med * 1e3:8.1f} ms '
                f'(min {min(values) * 1e3:.1f}, max {max(values) * 1e3:.1f}; '
                f'{med / base:.2f}x fp32-compute)',
                flush=True,
            )


if __name__ == '__main__':
    main()
