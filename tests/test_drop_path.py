"""``DropPath`` (stochastic depth): what it computes and what it costs in memory."""

from __future__ import annotations

import torch

from lookhere_dense.lookhere.attention.dtype_audit import DtypeAudit
from lookhere_dense.lookhere.layers import DropPath


def test_kept_samples_are_scaled_and_dropped_ones_are_zero():
    torch.manual_seed(0)
    x = torch.randn(256, 5, 7)
    y = DropPath(0.25).train()(x)
    kept = y.flatten(1).abs().sum(1) > 0
    assert 0.65 < kept.float().mean() < 0.85  # 0.75 expected
    torch.testing.assert_close(y[kept], x[kept] / 0.75, rtol=2**-23, atol=0)
    assert bool((y[~kept] == 0).all())


def test_identity_in_eval_and_at_zero():
    x = torch.randn(4, 3, 2)
    assert DropPath(0.5).eval()(x) is x
    assert DropPath(0.0).train()(x) is x


def test_one_full_size_tensor_per_call():
    """The scale is folded into the ``(B, 1, 1)`` mask: the branch output is the only
    tensor of the input's size (scaling ``x`` first made a second, a training step of the
    ADE20K config paid for it in peak memory: docs/performance.md)."""
    x = torch.randn(8, 197, 64, requires_grad=True)
    with DtypeAudit() as audit:
        y = DropPath(0.1).train()(x)
        y.sum().backward()
    forward_and_grad = audit.allocations(min_numel=x.numel())
    # the output, and x's gradient (mask * grad): nothing else of that size
    assert len(forward_and_grad) == 2, [(r.op, r.shape) for r in forward_and_grad]


def test_the_kept_share_is_the_configured_one_in_bf16():
    """In bfloat16 the draw ``keep + rand`` rounded: 89.85% of the samples were kept for
    ``drop_prob=0.1`` (10 standard errors below 90% at 4M samples), 80.11% for 0.2. The
    mask is drawn in float32 and cast; the output keeps the input's dtype."""
    torch.manual_seed(0)
    x = torch.ones(4_000_000, 1, dtype=torch.bfloat16)
    for p in (0.1, 0.2):
        y = DropPath(p).train()(x)
        assert y.dtype == torch.bfloat16
        kept = (y > 0).float().mean().item()
        assert abs(kept - (1 - p)) < 4 * ((p * (1 - p)) / x.shape[0]) ** 0.5, (p, kept)
