"""A mask that needs a gradient (learnable slopes while they train): one attention layer,
forward + backward, through SDPA's math kernel against :func:`biased_sdpa`'s flash route.

Per dtype and token count (ViT-B heads: 12 of 64 channels, batch 2, a random
``(1, 12, T, T)`` mask that requires grad), each timed in interleaved rounds (medians):

- ``math``: ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)`` (PyTorch's only
  choice for such a mask on CPU: the math kernel, in float32 for bfloat16 inputs);
- ``flash``: :class:`~lookhere_dense.lookhere.attention.common.FlashBiasGrad` (the CPU flash
  kernel forward and backward, the mask's gradient per head in blocks of ``d`` rows).

The ratio ``flash / math`` is where :data:`FLASH_BIAS_GRAD_MIN_PAIRS` comes from (float32:
the math kernel is faster on short sequences).

Run: ``python -m research.benchmark.flash_bias_grad [--tokens 257 513 769 1025]
[--rounds 3] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from lookhere_dense.lookhere.attention.common import FLASH_BIAS_GRAD_MIN_PAIRS, FlashBiasGrad


def _step(fn, q, k, v, mask) -> float:
    for t in (q, k, v, mask):
        t.grad = None
    start = time.perf_counter()
    fn(q, k, v, mask).sum().backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--tokens', type=int, nargs='+', default=[257, 513, 769, 1025])
    parser.add_argument('--dtypes', nargs='+', default=['float32', 'bfloat16'])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cases = {
        'math': lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        'flash': FlashBiasGrad.apply,
    }
    print(
        f'threads {args.threads}, rounds {args.rounds}; float32 takes the flash route from '
        f'{FLASH_BIAS_GRAD_MIN_PAIRS} pairs per head ({FLASH_BIAS_GRAD_MIN_PAIRS**0.5:.0f}^2)'
    )
    for name in args.dtypes:
        dtype = getattr(torch, name)
        for tokens in args.tokens:
            g = torch.Generator().manual_seed(0)
            q, k, v = (
                torch.randn(2, 12, tokens, 64, generator=g).to(dtype).requires_grad_(True)
                for _ in range(3)
            )
            mask = torch.randn(1, 12, tokens, tokens, generator=g).to(dtype).requires_grad_(True)
            times = {c: [] for c in cases}
            for fn in cases.values():  # warm-up
                _step(fn, q, k, v, mask)
            for r in range(args.rounds):
                order = list(cases) if r % 2 == 0 else list(cases)[::-1]
                for c in order:
                    times[c].append(_step(cases[c], q, k, v, mask))
            med = {c: statistics.median(ts) for c, ts in times.items()}
            print(
                f'{name:>9} {tokens:>5} tokens: math {med["math"] * 1e3:8.1f} ms, '
                f'flash {med["flash"] * 1e3:8.1f} ms, flash / math {med["flash"] / med["math"]:.2f}',
                flush=True,
            )


if __name__ == '__main__':
    main()
