"""The Triton source of the ``triton`` backend (:mod:`.flash_triton`): a flash-attention
forward with the LookHere bias read from the relative table and whole key tiles skipped.

Imported only when the backend runs (``import triton`` costs ~0.25 s, and most CPU
installs have no Triton); nothing here imports the rest of the package. The kernel is
built by :func:`forward_kernel`, compiled for the GPU, or run by Triton's interpreter on
CPU tensors where Python started with ``TRITON_INTERPRET=1`` (the tests' simulation, numpy
underneath).

One program computes ``BLOCK_M`` queries of one (image, head) against the key tiles that
layer's field of view reaches from their ``MASK_BLOCK`` query tile (the lists of
:func:`~.common.visible_tiles`, partial tiles then full ones), ``BLOCK_N`` keys at a time,
with an online softmax in float32:

* the score is ``q k^T`` (float32 accumulation; float32 inputs in IEEE precision, not
  TF32) times ``d^-0.5``, plus the bias ``table[head, code[key] - code[query] + centre]``
  (float32, ``-inf`` outside the field of view; plus ``key_term[head, key_patch[key]]``
  for ``center`` heads), 0 for pairs with a prefix token (the positions ``>= N``: the
  prefix tokens run last);
* the probabilities are rounded to ``v``'s dtype for ``P V`` (as flash attention does),
  the output divided by the row sum in float32 and rounded once.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import triton
import triton.language as tl

__all__ = ['forward_kernel', 'interpreting']

_KERNEL: Optional[Any] = None


def _lookhere_forward(
    Q,
    K,
    V,
    Out,
    Code,
    KeyPatch,
    Table,
    KeyTerm,
    PartNum,
    PartIdx,
    FullNum,
    FullIdx,
    stride_qb,
    stride_qh,
    stride_qt,
    stride_kb,
    stride_kh,
    stride_kt,
    stride_vb,
    stride_vh,
    stride_vt,
    stride_ob,
    stride_oh,
    stride_ot,
    stride_table,
    stride_key_term,
    stride_num_h,
    stride_idx_h,
    stride_idx_q,
    heads,
    tokens,
    patches,
    centre,
    all_tiles,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_BLOCK: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_KEY_TERM: tl.constexpr,
    IEEE: tl.constexpr,
):
    LOG2E: tl.constexpr = 1.4426950408889634
    SUB: tl.constexpr = MASK_BLOCK // BLOCK_N
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // heads).to(tl.int64)  # b * stride_qb passes 2**31 from ~86 images of 32k tokens
    h = pid_bh % heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    m_ok = offs_m < tokens
    q = tl.load(
        Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :],
        mask=m_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    code_q = tl.load(Code + offs_m, mask=m_ok, other=0)
    q_prefix = offs_m >= patches
    m_i = tl.full([BLOCK_M], float('-inf'), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    q_tile = (pid_m * BLOCK_M) // MASK_BLOCK
    if HAS_MASK:
        n_part = tl.load(PartNum + h * stride_num_h + q_tile)
        n_full = tl.load(FullNum + h * stride_num_h + q_tile)
    else:
        n_part = all_tiles
        n_full = 0
    row = h * stride_idx_h + q_tile * stride_idx_q
    for j in range(0, (n_part + n_full) * SUB):
        t = j // SUB
        if HAS_MASK:
            part = tl.load(PartIdx + row + tl.minimum(t, all_tiles - 1))
            full = tl.load(FullIdx + row + tl.maximum(t - n_part, 0))
            tile = tl.where(t < n_part, part, full)
        else:
            tile = t
        offs_n = tile * MASK_BLOCK + (j % SUB) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < tokens
        k = tl.load(
            K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :],
            mask=n_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        v = tl.load(
            V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :],
            mask=n_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision='ieee')
        else:
            qk = tl.dot(q, tl.trans(k))
        code_k = tl.load(Code + offs_n, mask=n_ok, other=0)
        entry = code_k[None, :] - code_q[:, None] + centre
        bias = tl.load(Table + h * stride_table + entry)
        if HAS_KEY_TERM:
            key_patch = tl.load(KeyPatch + offs_n, mask=n_ok, other=0)
            bias = bias + tl.load(KeyTerm + h * stride_key_term + key_patch)[None, :]
        prefix = q_prefix[:, None] | (offs_n >= patches)[None, :]
        bias = tl.where(prefix, 0.0, bias)
        s = qk * qk_scale + bias * LOG2E
        s = tl.where(n_ok[None, :], s, float('-inf'))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision='ieee')
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=m_ok[:, None] & d_ok[None, :],
    )


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1`` when Triton was
    first imported: the mode is fixed then, for Triton's own library functions too)."""
    knobs = getattr(triton, 'knobs', None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    # Triton < 3.4 read the variable so itself
    return os.environ.get('TRITON_INTERPRET', '0') == '1'  # pragma: no cover - Triton < 3.4


def forward_kernel():
    """The jitted forward: compiled for the GPU, or, where Triton interprets
    (:func:`interpreting`), run by its interpreter on CPU tensors (the tests' simulation)."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = triton.jit(_lookhere_forward)
    return _KERNEL
