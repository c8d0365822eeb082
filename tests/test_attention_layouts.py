"""Inputs the models never make but callers of the engine can: a ``q`` whose head
dimension is strided, an empty batch, a float16 bias beyond float16's range.

* ``tiled`` and the flash route of ``sdpa`` / ``chunked`` (a bias that needs a gradient:
  a learnable slope table that trains; in bfloat16 / float16 always, in float32 from 640²
  pairs) handed slices of ``q`` to PyTorch's CPU flash kernel, which reads the head
  dimension as contiguous without checking it: wrong outputs and gradients, or NaN / inf;
* the ``fused`` backward refused an empty batch with a message about layouts;
* a float16 table turned a bias beyond 65504 into ``-inf`` (a blocked key; a row of them
  gave NaN): refused, naming the way out.
"""

from __future__ import annotations

import os

import pytest
import torch

from lookhere_dense.lookhere.attention.fused import fused_available
from lookhere_dense.lookhere.config import PRESETS, LookHereConfig
from lookhere_dense.lookhere.engine import LookHereAttentionEngine
from lookhere_dense.lookhere.slopes import LookHereSlopes

requires_fused = pytest.mark.skipif(
    not fused_available() and not os.environ.get('LOOKHERE_REQUIRE_FUSED'),
    reason='the fused kernel is not built on this machine',
)


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values with a head dimension of stride T (not 1)."""
    out = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert out.stride(-1) != 1 and torch.equal(out, t)
    return out


@pytest.mark.parametrize('backend', ['tiled'])  # sdpa / chunked: the next test (their route)
def test_a_strided_head_dimension_gives_the_reference_output_and_gradients(backend):
    eng = LookHereAttentionEngine(PRESETS['lh90'], 4, 12)
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 12, 17, 64, dtype=torch.float64) for _ in range(4))
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    eng(*ref_in, 0, (4, 4), 1, backend='reference').backward(do)
    got_in = [_strided(q.float()).requires_grad_(), k.float().requires_grad_(), v.float()]
    got_in[2].requires_grad_()
    out = eng(*got_in, 0, (4, 4), 1, backend=backend)
    out.backward(do.float())
    ref = eng(*(t.detach() for t in ref_in), 0, (4, 4), 1, backend='reference')
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(got_in, ref_in):
        torch.testing.assert_close(a.grad.double(), b.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('backend', ['sdpa', 'chunked'])
def test_a_strided_q_in_bfloat16_with_learnable_slopes_stays_finite_and_close(backend):
    """The flash route with a mask gradient (learnable slopes) in bfloat16."""
    cfg = LookHereConfig('corners-none', learnable_slopes=True)
    eng, slopes = LookHereAttentionEngine(cfg, 4, 12), LookHereSlopes(cfg, 4, 12)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 12, 17, 64, dtype=torch.bfloat16) for _ in range(3))
    ref = eng(q, k, v, 0, (4, 4), 1, backend='reference', slopes=slopes).float()
    qs = _strided(q).requires_grad_()
    out = eng(qs, k, v, 0, (4, 4), 1, backend=backend, slopes=slopes)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(qs.grad).all()
    assert (out.float() - ref).abs().max().item() < 0.05
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0)
    assert cos.item() >= 0.999


@requires_fused
def test_the_fused_backward_of_an_empty_batch_gives_empty_gradients():
    eng = LookHereAttentionEngine(PRESETS['lh90'], 2, 12)
    q = torch.randn(0, 12, 26, 32, requires_grad=True)
    eng(q, q, q, 0, (5, 5), 1, backend='fused').sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


@pytest.mark.parametrize('backend', ['reference', 'sdpa', 'chunked', 'tiled'])
def test_a_float16_bias_beyond_float16_is_refused_not_blocked(backend):
    """A ``center`` head on an even grid with a huge slope: every key's bias is beyond
    65504, so float16 blocked them all (NaN, or another key winning)."""
    eng = LookHereAttentionEngine(LookHereConfig('center', global_slope=1e6), 2, 4)
    q = torch.randn(1, 4, 16, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match=r'beyond float16 \(65504\).*bfloat16'):
        with torch.no_grad():
            eng(q, q, q, 0, (4, 4), 0, backend=backend)
    # the same slopes in bfloat16 / float32 stay finite
    out = eng(q.bfloat16(), q.bfloat16(), q.bfloat16(), 0, (4, 4), 0, backend=backend)
    assert torch.isfinite(out).all()


def test_learnable_slopes_in_float16_beyond_its_range_are_refused():
    cfg = LookHereConfig('center', global_slope=1e6, learnable_slopes=True)
    eng, slopes = LookHereAttentionEngine(cfg, 2, 4), LookHereSlopes(cfg, 2, 4)
    q = torch.randn(1, 4, 16, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match=r'beyond float16'):
        eng(q, q, q, 0, (4, 4), 0, backend='sdpa', slopes=slopes)
