"""Two facts about the installed torch's ``flex_attention`` that our flex backend depends on,
with torch alone (docs/gpu.md, "The simulation under the GPU machine's torch"):

- ``view grads``: does compiled flex give a tensor captured by the ``score_mod`` its
  gradient when that tensor is a view of another graph value (a row of a table computed
  from parameters)? Torch 2.8-2.13 under ``aot_eager`` do not: ``.grad`` stays None with
  no error, which is why :func:`lookhere_dense.lookhere.attention.flex.captured_tensor`
  copies a learnable table. Cases: a leaf, a computed tensor, views of it, a copy.
- ``score roundings``: how far bfloat16 flex (no ``score_mod``) is from the float32
  attention of the same rounded ``q, k, v``, in units of bfloat16's rounding of the
  output (``max |flex - ref| / (u * P|V|)``, ``u = 2^-8``): about 1.5 where flex keeps
  ``q k^T`` in float32, about 10 where it rounds the score to bfloat16 (torch 2.8's CPU
  flex).

Run: ``python -m research.benchmark.flex_torch_probe [--device cpu|cuda] [--backend aot_eager]``
(on CUDA the default backend is inductor; ``q, k, v`` then also require grad in a second
pass of the view cases). Prints one line per case; exit status 1 when the case that
captures as our flex backend does loses its gradient (the others may: that is the torch
bug being probed).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

#: the case that captures as :func:`~lookhere_dense.lookhere.attention.flex.captured_tensor` does
OURS = 'copy of a flattened row (our capture)'


def view_cases(p: torch.Tensor) -> Dict[str, Callable[[], torch.Tensor]]:
    """Tensors of shape ``(2, 128)`` computed from the leaf ``p``, as a ``score_mod`` may
    capture them."""
    return {
        'leaf': lambda: p,
        'computed': lambda: p * 2,
        'view of computed': lambda: (p * 2).view(2, 128),
        'row of computed': lambda: torch.stack([p * 2, p * 3])[0],
        'flattened row (our old capture)': lambda: (
            torch.stack([p * 2, p * 3])[0].reshape(2, 2, 64).flatten(1)
        ),
        OURS: lambda: torch.stack([p * 2, p * 3])[0].reshape(2, 2, 64).flatten(1).clone(),
    }


def probe_view_grads(device: str, backend: str, qkv_grad: bool) -> List[str]:
    """One line per :func:`view_cases` case: whether ``loss.backward()`` through compiled
    flex reaches ``p``; returns the names of the cases that lost it."""
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 2, 128, 16, generator=gen).to(device).requires_grad_(qkv_grad)
        for _ in range(3)
    )
    p = torch.randn(2, 128, generator=gen).to(device).requires_grad_()
    fn = torch.compile(flex_attention, backend=backend)
    lost = []
    for name, make in view_cases(p).items():
        torch._dynamo.reset()
        p.grad = None
        table = make()

        def score_mod(score, b, h, q_idx, kv_idx, table=table):
            return score + table[h, (kv_idx - q_idx).abs()]

        try:
            fn(q, k, v, score_mod=score_mod).sum().backward()
            got = 'None (lost)' if p.grad is None else f'{p.grad.abs().sum().item():.4g}'
        except Exception as err:  # a torch that refuses: name it, go on
            got = f'error {type(err).__name__}: {str(err)[:80]}'
        if p.grad is None:
            lost.append(name)
        print(f'view grads  {backend:9s} qkv grad {str(qkv_grad):5s}  {name:38s} p.grad {got}')
    return lost


def probe_score_roundings(device: str, backend: str) -> None:
    """bfloat16 flex without a ``score_mod``, eager and compiled, in roundings of the
    output from the float32 attention of the same rounded inputs."""
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        (2 * torch.randn(1, 2, 256, 64, generator=gen)).to(device, torch.bfloat16)
        for _ in range(3)
    )
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    size = F.scaled_dot_product_attention(q.float(), k.float(), v.float().abs())
    unit = torch.finfo(torch.bfloat16).eps / 2
    modes = {'compiled': torch.compile(flex_attention, backend=backend)}
    if device == 'cpu':
        modes = {'eager': flex_attention, **modes}
    for name, fn in modes.items():
        torch._dynamo.reset()
        with torch.no_grad():
            out = fn(q, k, v)
        err = ((out.float() - ref).abs() / (unit * size)).max().item()
        print(f'score roundings  {name:8s} bfloat16 flex vs float32: {err:.2f} roundings')


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument(
        '--backend',
        default=None,
        help='torch.compile backend (default: aot_eager on CPU, inductor on CUDA)',
    )
    args = parser.parse_args(argv)
    backend = args.backend or ('inductor' if args.device == 'cuda' else 'aot_eager')
    warnings.filterwarnings('ignore')
    print(f'torch {torch.__version__}, {args.device}, backend {backend}')
    lost = probe_view_grads(args.device, backend, qkv_grad=False)
    if args.device != 'cpu':  # torch has no CPU flex backward for q, k, v
        lost += probe_view_grads(args.device, backend, qkv_grad=True)
    probe_score_roundings(args.device, backend)
    return 1 if OURS in lost else 0


if __name__ == '__main__':
    sys.exit(main())
