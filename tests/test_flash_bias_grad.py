"""The bias gradient beside PyTorch's CPU flash kernel (``biased_sdpa``, ``FlashBiasGrad``).

PyTorch's CPU flash kernel gives no gradient to ``attn_mask``; for a mask that needs one
(learnable slopes while they train) SDPA falls back to its math kernel, which computes
bfloat16 in float32 on the whole ``B x heads x T x S`` scores. ``biased_sdpa`` keeps the
forward and the ``q, k, v`` gradients on the flash kernel and computes the mask's gradient
itself. Checked here against autograd through a plain float64 softmax attention: exact in
float64 (masks broadcast over the batch and per sample, ``T != S``, ``-inf`` entries), within
a stated bound in bfloat16, and routed only where it should be. The model-level cases
(slope gradients through ``sdpa`` / ``chunked`` / windows equal to the reference backend's)
are in ``tests/test_learnable_slopes.py``; the no-float32-copy audit in
``tests/test_autocast_dtypes.py``.
"""

from __future__ import annotations

import pytest
import torch

import lookhere_dense.lookhere.attention.common as common
from lookhere_dense.lookhere.attention.common import FlashBiasGrad, biased_sdpa

#: bfloat16: largest error of the mask gradient, relative to its largest entry, against
#: float64 on the same rounded inputs. Measured 0.0034-0.0038 (the forward's output
#: rounded to bfloat16 enters ``rowsum(dO * O)``); the bound is about 2x that.
MAX_BF16_GRAD = 2**-7


def plain_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d) + mask) v, in autograd's hands."""
    scores = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask
    return scores.softmax(-1) @ v


def case(batch, heads, tokens, keys, dim, mask_batch, dtype, seed=0, blocked=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, tokens, dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(batch, heads, keys, dim, generator=g, dtype=torch.float64) for _ in 'kv')
    mask = torch.randn(mask_batch, heads, tokens, keys, generator=g, dtype=torch.float64)
    if blocked:  # LookHere's masks: -inf where a head does not look (never a whole row)
        hidden = torch.rand(mask.shape, generator=g) < 0.4
        hidden[..., 0] = False
        mask = mask.masked_fill(hidden, float('-inf'))
    weight = torch.randn(batch, heads, tokens, dim, generator=g, dtype=torch.float64)
    leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v, mask)]
    return leaves, weight


def grads(fn, leaves, weight):
    for t in leaves:
        t.grad = None
    out = fn(*leaves)
    (out.double() * weight).sum().backward()
    return out.detach(), [t.grad.clone() for t in leaves]


@pytest.mark.parametrize(
    'shape',
    [(2, 3, 37, 37, 8, 1), (2, 3, 37, 37, 8, 2), (1, 2, 20, 45, 16, 1), (3, 1, 9, 9, 4, 1)],
    ids=['broadcast', 'per-sample', 'T!=S', 'tiny'],
)
def test_float64_equals_autograd(shape):
    leaves, weight = case(*shape, dtype=torch.float64)
    out, got = grads(FlashBiasGrad.apply, leaves, weight)
    ref_out, ref = grads(plain_attention, leaves, weight)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    for name, a, b in zip('q k v mask'.split(), got, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=name)
    assert torch.isfinite(got[3]).all() and (got[3][leaves[3] == float('-inf')] == 0).all()


@pytest.mark.parametrize('mask_batch', [1, 2])
def test_bfloat16_mask_gradient_within_the_stated_bound(mask_batch):
    """bfloat16 in, float32 inside (scores, softmax from the saved log-sum-exp), the
    gradient written in bfloat16: against float64 on the same rounded inputs."""
    leaves, weight = case(2, 3, 64, 64, 16, mask_batch, torch.bfloat16)
    _, got = grads(biased_sdpa, leaves, weight)
    exact = [t.detach().double().requires_grad_(True) for t in leaves]
    _, ref = grads(plain_attention, exact, weight)
    assert got[3].dtype == torch.bfloat16
    err = float((got[3].double() - ref[3]).abs().max() / ref[3].abs().max())
    print(f'bf16 mask gradient: max error {err:.4f} of the largest entry')
    assert err <= MAX_BF16_GRAD


def route(out: torch.Tensor) -> str:
    return 'flash' if type(out.grad_fn).__name__ == 'FlashBiasGradBackward' else 'sdpa'


def test_routes_only_a_cpu_mask_that_needs_a_gradient(monkeypatch):
    (q, k, v, mask), _ = case(2, 3, 16, 16, 8, 1, torch.bfloat16)
    assert route(biased_sdpa(q, k, v, mask)) == 'flash'  # reduced precision: always
    assert route(biased_sdpa(q, k, v, mask.detach())) == 'sdpa'
    assert route(biased_sdpa(q, k, v, mask, dropout_p=0.5)) == 'sdpa'  # SDPA's random masks
    with torch.no_grad():
        assert biased_sdpa(q, k, v, mask).grad_fn is None
    # a mask broadcast over heads is not one this function handles: SDPA's
    wide = mask[:, :1].detach().requires_grad_(True)
    assert route(biased_sdpa(q, k, v, wide)) == 'sdpa'
    # float32: the math kernel below FLASH_BIAS_GRAD_MIN_PAIRS pairs per head, flash from it
    q, k, v, mask = (t.detach().float().requires_grad_(True) for t in (q, k, v, mask))
    assert route(biased_sdpa(q, k, v, mask)) == 'sdpa'
    monkeypatch.setattr(common, 'FLASH_BIAS_GRAD_MIN_PAIRS', 16 * 16)
    assert route(biased_sdpa(q, k, v, mask)) == 'flash'


@pytest.mark.parametrize('backend', ['sdpa', 'chunked', 'window'])
def test_slope_gradients_through_the_flash_route_equal_the_reference(backend, monkeypatch):
    """Model level, float64 (the flash route forced from 0 pairs): the learnable slopes'
    gradients through ``sdpa`` / ``chunked`` / window blocks equal the ``reference``
    backend's, and the route was taken."""
    from lookhere_dense.lookhere import LookHereAttentionEngine
    from lookhere_dense.lookhere.config import PRESETS, resolve_lh_config
    from lookhere_dense.lookhere.slopes import LookHereSlopes

    monkeypatch.setattr(common, 'FLASH_BIAS_GRAD_MIN_PAIRS', 0)
    taken = []
    apply = FlashBiasGrad.apply
    monkeypatch.setattr(FlashBiasGrad, 'apply', lambda *a: taken.append(1) or apply(*a))
    cfg = resolve_lh_config(
        {**PRESETS['lh45'].to_dict(), 'bias_rounding': 'none', 'learnable_slopes': True}
    )
    depth, heads, grid = 2, 12, (4, 4)
    eng = LookHereAttentionEngine(cfg, depth, heads, block_size=3)
    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(2, heads, 17, 8, generator=g, dtype=torch.float64) for _ in range(4))
    slopes = LookHereSlopes(cfg, depth, heads).double()
    with torch.no_grad():
        for p in slopes.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.1)

    def slope_grads(name):
        slopes.zero_grad()
        loss = 0
        for layer in range(depth):
            if name == 'window':
                out = eng.window_attention(q, k, v, layer, grid, 2, True, slopes=slopes)
            else:
                out = eng(q, k, v, layer, grid, True, backend=name, slopes=slopes)
            loss = loss + (out * w).sum()
        loss.backward()
        return [p.grad.clone() for p in slopes.parameters()]

    if backend == 'window':  # the window blocks' own dense definition: sdpa on windows
        monkeypatch.setattr(common, 'FLASH_BIAS_GRAD_MIN_PAIRS', 10**12)
        ref = slope_grads('window')
        monkeypatch.setattr(common, 'FLASH_BIAS_GRAD_MIN_PAIRS', 0)
    else:
        ref = slope_grads('reference')
    taken.clear()
    got = slope_grads(backend)
    assert taken, f'{backend}: the flash route was not taken'
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    assert any(a.abs().sum() > 0 for a in got)
