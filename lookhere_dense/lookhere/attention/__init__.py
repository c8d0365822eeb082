"""LookHere attention: one module per backend, the shared plumbing, one chooser.

Every backend gives the same result; they differ in how the bias reaches the softmax.
Each backend module has ``NAME``, ``can_run(request)`` (None, or why it cannot run) and
``attend(call)`` (the forward through the engine's caches; its own backward where it has
one); see :mod:`.common`.

==================  ==========================================================  ============
module              how the bias reaches the softmax                            extra memory
==================  ==========================================================  ============
:mod:`.reference`   materialised ``(heads, T, T)`` bias + plain softmax          heads*T^2
                    attention in float32 (the tests' ground truth)              (x2)
:mod:`.sdpa`        cached dense bias as a 4-D ``attn_mask`` of                  heads*T^2
                    ``F.scaled_dot_product_attention``                          per layer
:mod:`.chunked`     blocks of query rows, each block's bias rows gathered from  heads*T*block
                    the relative table into one reused buffer; heads that look
                    only up (down) skip the rows below (above); recomputed in
                    backward
:mod:`.tiled`       CPU: per head group, query blocks against the key strips    O(T) + one
                    they can see; the bias a strided view of a re-pitched       re-pitched
                    table; partials merged by log-sum-exp; flash backward       table
:mod:`.fused`       CPU, our compiled kernel (``csrc/``): per 8x8 query tile    K/V of a few
                    an online softmax over the visible key tiles, the bias      heads in
                    read from the table; flash backward                         tile order
:mod:`.flex`        ``flex_attention``: a ``score_mod`` reading the table and    O(T) + tiles
                    a ``BlockMask`` of the fields of view (compiled on CUDA)
:mod:`.flash_       CUDA forward in Triton (:mod:`.triton_kernels`): per query  O(T) + tiles
triton`             tile an online softmax over the visible key tiles, the
                    bias read from the table; not chosen by ``auto`` (untimed)
:mod:`.causal`      LEDiT's causal attention (``sdpa`` / ``chunked`` / ``flex`` /  --
                    ``reference``; ``pos_encoding='ledit'``)
==================  ==========================================================  ============

Shared plumbing: :mod:`.common` (request / call, the CPU flash kernel and its checks,
tile-plan helpers, the online-softmax merge, the bias-table gather, flex helpers) and
:mod:`.windows` (ViTDet window partitioning, used by every windowed path). Backends import
those, never each other (an import-linter contract). :mod:`.chooser` asks the backends in
a documented order (``auto``) and explains the choice (:func:`explain_backend`).

:mod:`.dtype_audit` (``DtypeAudit``) records the dtype and size of every op a call runs
under ``torch.autocast``: how ``tests/test_autocast_dtypes.py`` holds each path to its
float32 budget (docs/mixed_precision.md).

Token order is ``[p_0, ..., p_{J-1}, patch_0, ..., patch_{N-1}]``: ``J >= 0`` global prefix
tokens (CLS is ``J = 1``, Jumbo tokens ``J``; their rows and columns carry no bias) before
the patches, row-major over the grid.

:class:`~lookhere_dense.lookhere.engine.LookHereAttentionEngine` owns the caches and calls
the chosen backend.
"""

from .chooser import (
    AUTO_ORDER,
    BACKENDS,
    REGISTRY,
    RETIRED,
    backend_summary,
    choose,
    explain,
    explain_backend,
)
from .common import AttentionCall, AttentionRequest
from .reference import reference_attention
from .sdpa import sdpa_attention

__all__ = [
    'BACKENDS',
    'AUTO_ORDER',
    'REGISTRY',
    'RETIRED',
    'AttentionRequest',
    'AttentionCall',
    'choose',
    'explain',
    'explain_backend',
    'backend_summary',
    'reference_attention',
    'sdpa_attention',
]
