"""The ``buffered`` backend: CPU flash calls per chunk of heads with the dense bias rebuilt
into a reused buffer: its bias copy, its head chunks, its buffer reuse, what it saves for
backward, its refusals, and where ``auto`` picks it (forward and gradients against the
reference on every shared case: ``tests/test_backends.py``)."""

from __future__ import annotations

import pytest
import torch
from test_tiled import (
    CONFIGS,
    DEPTH,
    HEADS,
    check,
    check_cpu_refusals,
    check_keeps_what_sdpa_keeps,
    grid_bias,
    qkv,
)

from lookhere_dense.lookhere import LookHereAttentionEngine, buffered, reference_attention
from lookhere_dense.lookhere.bias import GridBias
from lookhere_dense.lookhere.buffered import (
    BiasBuffers,
    buffered_attention,
    dense_bias_reversed,
    head_chunks,
    reverse_patches,
)

pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.mark.parametrize('name', ['lh90', 'center_mix', 'per_layer'])
def test_dense_bias_is_the_reference_bias_with_reversed_keys(name):
    """Bit for bit: the copied bias equals the gathered one with its patch columns
    reversed (prefix rows and columns 0), for no, one and three prefix tokens."""
    grid = (5, 7)
    gb = grid_bias(name, grid, torch.float64)
    for prefix in (0, 1, 3):
        for layer in range(DEPTH):
            key = None if gb.key_term is None else gb.key_term[layer]
            got = dense_bias_reversed(gb.table[layer], key, grid, prefix)[0]
            want = gb.dense(layer, prefix)
            want = torch.cat([want[..., :prefix], want[..., prefix:].flip(-1)], -1)
            assert torch.equal(got, want)


def test_prefix_tokens_of_jumbo():
    grid, prefix = (4, 6), 3
    gb = grid_bias('lh45', grid, torch.float64)
    gen = torch.Generator().manual_seed(4)
    q, k, v = (
        torch.randn(2, HEADS, prefix + 24, 8, generator=gen, dtype=torch.float64) for _ in range(3)
    )
    ref = reference_attention(q, k, v, gb.dense(1, prefix))
    check(buffered_attention(q, k, v, gb, 1, prefix), ref, torch.float64)


def test_head_chunks_are_even_and_bounded():
    mb = 2**20
    assert head_chunks(12, 1025, 4) == [slice(0, 6), slice(6, 12)]  # 6 x 4.2 MB per call
    assert head_chunks(12, 100, 4) == [slice(0, 12)]
    assert head_chunks(12, 4000, 4) == [slice(h, h + 1) for h in range(12)]  # 64 MB a head
    for heads, tokens in [(12, 1297), (16, 1025), (6, 2049), (7, 1500)]:
        chunks = head_chunks(heads, tokens, 4)
        assert [c.start for c in chunks] == sorted({c.start for c in chunks})
        assert chunks[0].start == 0 and chunks[-1].stop == heads
        assert all(a.stop == b.start for a, b in zip(chunks, chunks[1:]))
        sizes = {c.stop - c.start for c in chunks}
        assert max(sizes) - min(sizes) <= max(sizes) // 2 + 1
        assert max(sizes) * tokens * tokens * 4 <= max(buffered.MAX_CALL_BYTES, tokens**2 * 4)
    assert buffered.MAX_CALL_BYTES == 32 * mb


@pytest.mark.parametrize(
    'per_call,sizes', [(1, [1] * 10), (4, [4, 4, 2]), (5, [5, 5]), (12, [10])]
)
def test_calls_split_by_heads_match_reference(monkeypatch, per_call, sizes):
    """10 heads split into chunks (one buffer of the first chunk's size, a smaller last
    chunk a view of part of it): forward and gradients equal the reference's, and the
    output is laid out like SDPA's."""
    grid, cls_token, heads = (6, 7), True, 10
    tokens = grid[0] * grid[1] + 1
    monkeypatch.setattr(buffered, 'MAX_CALL_BYTES', per_call * tokens * tokens * 8)
    assert [c.stop - c.start for c in head_chunks(heads, tokens, 8)] == sizes
    full = grid_bias('center_mix', grid, torch.float64)
    gb = GridBias(grid, full.table[:, :heads], full.key_term[:, :heads], full.visible[:, :heads])
    gen = torch.Generator().manual_seed(7)
    fused = torch.randn(2, tokens, 3, heads, 8, generator=gen, dtype=torch.float64)
    q, k, v = fused.requires_grad_().permute(2, 0, 3, 1, 4).unbind(0)  # as in the model
    bufs = BiasBuffers()
    bufs.take((1, sizes[0], tokens, tokens), torch.float64).fill_(float('nan'))
    ref = reference_attention(q, k, v, gb.dense(1, cls_token))
    out = buffered_attention(q, k, v, gb, 1, cls_token, buffers=bufs)
    check(out, ref.detach(), torch.float64)
    assert out.transpose(1, 2).is_contiguous()  # (B, T, heads, d) in memory, like SDPA's
    with torch.no_grad():
        again = buffered_attention(q, k, v, gb, 1, cls_token, buffers=bufs)
        check(again, ref.detach(), torch.float64)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(6), dtype=ref.dtype)
    (got,), (want,) = torch.autograd.grad(out, fused, grad), torch.autograd.grad(ref, fused, grad)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    assert len(bufs) == 1


def test_calls_split_by_heads_in_bfloat16(monkeypatch):
    grid, cls_token = (5, 6), True
    tokens = grid[0] * grid[1] + 1
    monkeypatch.setattr(buffered, 'MAX_CALL_BYTES', 5 * tokens * tokens * 2)
    assert len(head_chunks(HEADS, tokens, 2)) == 3
    gb = grid_bias('lh45', grid, torch.bfloat16)
    q, k, v = qkv(grid, cls_token, dtype=torch.bfloat16, grad=True)
    exact = grid_bias('lh45', grid, torch.float64).dense(0, cls_token)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(qd, kd, vd, exact)
    out = buffered_attention(q, k, v, gb, 0, cls_token, buffers=BiasBuffers())
    check(out.double(), ref.detach(), torch.bfloat16)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(8), dtype=ref.dtype)
    got = torch.autograd.grad(out, (q, k, v), grad.bfloat16())
    want = torch.autograd.grad(ref, (qd, kd, vd), grad)
    for a, b in zip(got, want):
        assert a.dtype == torch.bfloat16 and torch.isfinite(a).all()
        torch.testing.assert_close(a.double(), b, atol=0.25, rtol=0.05)


def test_buffers_larger_than_the_bound_are_not_kept():
    bufs = BiasBuffers(max_bytes=1000)
    a = bufs.take((1, 2, 10, 10), torch.float32)  # 800 bytes: kept
    assert bufs.take((1, 2, 10, 10), torch.float32) is a
    big = bufs.take((1, 2, 20, 20), torch.float32)  # 3200 bytes: handed out, not kept
    assert big.shape == (1, 2, 20, 20) and len(bufs) == 1
    assert BiasBuffers().max_bytes == 2 * buffered.MAX_CALL_BYTES


def test_reverse_patches_is_its_own_inverse():
    t = torch.arange(2 * 3 * 7 * 2.0).view(2, 3, 7, 2)
    for prefix in (0, 1, 3):
        r = reverse_patches(t, prefix)
        assert torch.equal(r[:, :, :prefix], t[:, :, :prefix])
        assert torch.equal(r[:, :, prefix:], t[:, :, prefix:].flip(2))
        assert torch.equal(reverse_patches(r, prefix), t)


def test_one_buffer_serves_every_layer_forward_and_backward():
    """Layers run forward 0, 1, 2 and backward 2, 1, 0 through one buffer, each
    overwriting the last one's bias: the gradients are still the reference's. A buffer
    first made under ``inference_mode`` serves training calls too, and nothing a
    previous use left in it shows."""
    eng = LookHereAttentionEngine(CONFIGS['per_layer'], DEPTH, HEADS)
    grid = (6, 5)
    q, k, v = qkv(grid, True, dtype=torch.float64, grad=True)
    with torch.inference_mode():
        eng(q, k, v, 0, grid, True, backend='buffered')
    # what an earlier use left in the buffer must not matter: every value is written
    eng.bias_buffers.take((1, HEADS, 31, 31), torch.float64).fill_(float('nan'))

    def stack(backend):
        x = q
        for layer in range(DEPTH):
            x = eng(x, k, v, layer, grid, True, backend=backend)
        return x

    out, ref = stack('buffered'), stack('reference')
    check(out, ref, torch.float64)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=ref.dtype)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    info = eng.cache_info()['bias_buffers']
    assert info['size'] == 1 and info['misses'] == 1
    assert info['bytes'] == HEADS * 31 * 31 * 8


def test_backward_keeps_what_plain_sdpa_keeps():
    """Saved for backward: ``q, k, v`` (the model's, not reversed copies), the output and
    the log-sum-exp; no bias (nothing with ``T x T`` elements)."""
    _, saved, (_, k, v) = check_keeps_what_sdpa_keeps(
        lambda *args: buffered_attention(*args, buffers=BiasBuffers())
    )
    assert saved[1] is k and saved[2] is v


def test_unsupported_uses_are_refused_by_name():
    check_cpu_refusals(buffered_attention)


@pytest.mark.usefixtures('without_fused')
def test_auto_picks_buffered_while_training_small_grids():
    from lookhere_dense.lookhere.engine import BUFFERED_MAX_TOKENS, TILED_MIN_TOKENS

    eng = LookHereAttentionEngine(CONFIGS['lh90'], DEPTH, HEADS)
    cpu = torch.device('cpu')
    pick = eng.choose_backend
    assert pick(1025, cpu, training=True) == 'buffered'
    assert pick(BUFFERED_MAX_TOKENS, cpu, training=True) == 'buffered'
    assert pick(BUFFERED_MAX_TOKENS + 1, cpu, training=True) == 'tiled'
    assert pick(1025, cpu) == 'tiled'  # inference
    assert pick(TILED_MIN_TOKENS - 1, cpu, training=True) == 'sdpa'  # fits the budget
    assert pick(1025, cpu, dropout_p=0.1, training=True) == 'sdpa'  # 3 layers fit
    assert pick(1025, cpu, slope_grads=True, training=True) == 'sdpa'
    assert pick(1025, torch.device('cuda'), training=True) not in ('buffered', 'tiled')
    # 32 x 32 patches + CLS (a 512 x 512 image at patch 16): training -> buffered, one
    # buffer and no dense cache; the same call without autograd -> tiled
    grid = (32, 32)
    q, k, v = qkv(grid, True, batch=1, dim=4, grad=True)
    eng(q, k, v, 0, grid, True).sum().backward()
    assert eng.last_backend == 'buffered' and len(eng.dense) == 0
    assert len(eng.bias_buffers) == 1
    with torch.no_grad():
        eng(q, k, v, 0, grid, True)
    assert eng.last_backend == 'tiled'
