"""The ``fused`` backend: a compiled CPU kernel for exact, tile-sparse LookHere attention
that reads the bias from the layer's small relative table inside its softmax pass.

Why a kernel of our own
    The ``tiled`` backend drives PyTorch's CPU flash kernel, which takes
    the bias as a mask tensor: it spends one more pass over every score block to add it,
    and the tiled plan pays for many small calls and for merging their partial results.
    Here one kernel does the whole layer: per (batch, head, query tile) an online softmax
    over only the key tiles the head can see, the bias added while the row maximum is
    taken (one pass, as SDPA without a mask), read straight from the ``(2H-1, 2W-1)``
    table (a key tile's row is one contiguous run of it) — no bias block is ever written,
    no partial result merged.

Tiles
    The patch grid is cut into tiles of ``tile = (th, tw)`` patches (default 8 x 8; the
    last tile row / column may be smaller), numbered row-major. The plan
    (:func:`plan_fused`, cached per fields of view and grid) lists, for each head group and
    query tile, the runs of consecutive key tiles holding a key some query of the tile can
    see (exact at tile granularity: two tiles share a visible pair iff the rectangle of
    their offsets holds a visible offset, an integral-image lookup). Blocked pairs inside
    a partly visible tile get ``-inf`` from the table.

Prefix tokens
    The ``J`` global prefix tokens (CLS, Jumbo; bias 0 to and from everything) are the
    first key block of every query tile; the prefix queries are one plain SDPA call.

Backward
    :class:`_FusedAttention` saves ``q, k, v``, the output and the log-sum-exp (what SDPA
    saves) and runs the kernel's flash backward (per batch and head: ``P`` recomputed with
    the global log-sum-exp, ``dK, dV`` accumulated in tile order).

Reduced precision
    bfloat16 / float16 ``q, k, v`` are read in their dtype; scores, bias, softmax and
    accumulators are float32. The products are float32 FMA kernels (operands converted as
    they are packed), except for bfloat16 where the kernel is built for AVX-512 and the CPU
    has AVX512-BF16 (:func:`native_bf16_available`): there the five products of the
    forward and backward take bfloat16 operands and sum in float32 (VDPBF16PS), ``P`` and
    ``dS`` rounded to bfloat16 as their operands, as flash attention does on GPUs (0.68-0.75x
    the time of the float32 products on one ViT-B layer; tolerances in
    ``tests/test_fused_bf16.py``). ``native_bf16=False`` or ``LOOKHERE_FUSED_BF16=0``
    keeps the float32 products. The same products, operands and roundings also run through
    PyTorch's ``at::native::cpublas::brgemm`` (oneDNN's micro-kernel: AMX tiles on CPUs
    with AMX, AVX-512 elsewhere), where torch's oneDNN takes bfloat16 there
    (:func:`brgemm_bf16_available`). :func:`bf16_products` says which runs: ``'brgemm'``
    where the CPU has AMX (:func:`amx_bf16_available`), else ``'vdpbf16ps'`` (our
    kernels) where available; ``native_bf16='brgemm'`` / ``'vdpbf16ps'`` or
    ``LOOKHERE_FUSED_BF16=brgemm`` / ``=vdpbf16ps`` choose one. With these products, a
    key block of whole 8 x 8 tiles (no key term) is read, not rewritten, by the row's
    passes, and after the query tile's first block of tiles (key blocks go nearest first)
    one pass takes ``P = exp(S - m)`` against the running maximum ``m``, redoing the block
    in two passes only where its own maximum exceeds ``m`` by more than 20 (the kernel's
    ``LAZY_RESCALE``): the exact softmax, in fewer passes over the float32 scores.

Non-finite inputs
    A NaN in ``q``, ``k`` or ``v`` (or an infinite score meeting a ``-inf`` bias) makes
    the output rows NaN that it makes NaN in the reference, in every dtype and product
    implementation (``tests/test_fused_bf16.py``); a row that sees no key is zeros.

Threads
    The kernel runs on PyTorch's intra-op threads (``torch.set_num_threads``); forward
    work items (batch, head, query tile) and backward items (batch, head) are handed to
    whichever thread is free. Keys and values are copied into tile order a few heads at a
    time (at most ``gather_bytes``, 32 MB).

Build
    The C++ source (``csrc/fused_tiles.cpp``) is compiled once per machine with the
    compiler PyTorch's extensions use (``torch.utils.cpp_extension``; ~20 s; ``setup.sh``
    does it) for the vector instructions PyTorch itself uses here
    (``torch.backends.cpu.get_cpu_capability()``), into :func:`build_directory`
    (``$LOOKHERE_BUILD_DIR`` or ``~/.cache/lookhere_dense``; the folder name carries a hash
    of the source, the flags and torch's version, so a stale build is never loaded); later
    processes load the library directly. :func:`fused_available` says whether it is there
    (and builds it on first use); where it cannot be built (no compiler), ``auto`` uses
    ``tiled`` and forcing ``fused`` raises an error with the compiler's
    message. Environment ``LOOKHERE_FUSED=0`` turns it off.

Learnable slopes
    While slopes train, the table (and the ``center`` heads' key term) require grad: the
    backward adds each score's ``dS`` to the table entry (and key) its bias was read from,
    per sample, and the sums over the batch flow back to the slopes through autograd. So
    the training step stays in the kernel, bf16 included (``sdpa`` / ``chunked`` keep
    PyTorch's flash kernel and compute the mask's gradient beside it:
    :func:`~.common.biased_sdpa`).

Limits (refused with a ValueError; ``auto`` does not choose it then): CUDA tensors and
attention dropout.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import MutableMapping, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ...errors import ConfigError
from ...validation import env_choice, env_switch
from ..bias import GridBias
from .common import (
    FLASH,
    FLASH_BWD,
    AttentionCall,
    AttentionRequest,
    VisibleCounts,
    cached_plan,
    flash_layer_inputs,
    head_groups,
    plan_key,
    work_dtype,
)

__all__ = [
    'NAME',
    'FUSED_MIN_TOKENS',
    'can_run',
    'attend',
    'FusedPlan',
    'plan_fused',
    'tile_layout',
    'fused_attention',
    'fused_available',
    'fused_unavailable_reason',
    'native_bf16_available',
    'native_bf16_unavailable_reason',
    'brgemm_bf16_available',
    'amx_bf16_available',
    'bf16_products',
    'BF16_PRODUCTS',
    'load_fused_ops',
    'build_directory',
    'FUSED_TILE',
    'FUSED_MAX_KEYS',
    'FUSED_GATHER_BYTES',
]

NAME = 'fused'

#: ``auto`` uses the compiled ``fused`` kernel on CPU from this many tokens on, wherever it
#: is built; below it (224x224 at patch 16: 197 tokens) the cached dense bias and SDPA
#: tie with it (docs/performance.md, "The fused kernel")
FUSED_MIN_TOKENS = 400

#: patches per tile (rows, columns)
FUSED_TILE = (8, 8)
#: the most key slots of one block (whole tiles): one block's scores (64 query rows x 1024
#: float32, 256 KiB) stay in L2. 1024 rather than 512: half the product calls and softmax
#: steps per query tile, ~5-10 % faster in bf16 on AMX tiles, the same in float32 and in
#: the backward (docs/performance.md, "bf16 on AMX tiles")
FUSED_MAX_KEYS = 1024
#: the most bytes of keys / values copied into tile order at once (a few heads)
FUSED_GATHER_BYTES = 32 * 2**20

_SOURCE = Path(__file__).with_name('csrc') / 'fused_tiles.cpp'
_ARCH_FLAGS = {
    'AVX512': ['-mavx512f', '-mavx512bw', '-mavx512vl', '-mavx512dq', '-mfma', '-mf16c'],
    'AVX2': ['-mavx2', '-mfma', '-mf16c'],
}
_LOCK = threading.Lock()
_STATE: dict = {}


def _capability() -> str:
    try:
        cap = torch.backends.cpu.get_cpu_capability()
    except Exception:  # pragma: no cover - very old torch
        cap = 'DEFAULT'
    return cap if cap in _ARCH_FLAGS else 'DEFAULT'


def build_directory() -> Path:
    """Where the kernel is compiled and kept: ``$LOOKHERE_BUILD_DIR``, else
    ``~/.cache/lookhere_dense`` (one sub-folder per source, flags and torch version)."""
    root = os.environ.get('LOOKHERE_BUILD_DIR')
    return Path(root) if root else Path.home() / '.cache' / 'lookhere_dense'


def _build_flags() -> Tuple[str, list]:
    """The extension's name (capability and a hash of the source, the flags and torch's
    version: a stale build is never loaded) and its compiler flags."""
    cap = _capability()
    flags = ['-O3', '-fopenmp', f'-DCPU_CAPABILITY={cap}']
    if cap != 'DEFAULT':
        flags += [f'-DCPU_CAPABILITY_{cap}'] + _ARCH_FLAGS[cap]
    key = _SOURCE.read_bytes() + ' '.join(flags).encode() + torch.__version__.encode()
    return f'lookhere_fused_{cap.lower()}_{hashlib.sha1(key).hexdigest()[:12]}', flags


def load_fused_ops(verbose: bool = False):
    """Load the kernel, compiling it first where this machine has no build of this source
    yet; returns ``torch.ops.lookhere_fused``. Raises RuntimeError with the reason when
    it cannot."""
    with _LOCK:
        if 'ops' in _STATE:
            return _STATE['ops']
        if 'error' in _STATE:
            raise RuntimeError(_STATE['error'])
        if not env_switch('LOOKHERE_FUSED', error=ConfigError):
            _STATE['error'] = 'the fused LookHere kernel is turned off (LOOKHERE_FUSED=0)'
            raise RuntimeError(_STATE['error'])
        compiled = False
        try:
            name, flags = _build_flags()
            directory = build_directory() / name
            library = directory / f'{name}.so'
            if not library.exists():
                compiled = True  # the user was told it compiles: the outcome is said too
                _compile(name, flags, directory, verbose)
            try:
                torch.ops.load_library(str(library))
            except OSError as exc:  # e.g. a build that was interrupted while linking
                raise RuntimeError(
                    f'{library} does not load ({exc}); delete {directory} to build it again'
                ) from exc
            _STATE['ops'] = torch.ops.lookhere_fused
            return _STATE['ops']
        except Exception as exc:  # no compiler, a failed build, ...
            _STATE['error'] = f'the fused LookHere kernel could not be built: {exc}'
            if compiled:
                reason = str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''
                print(
                    f'lookhere-dense: the fused kernel could not be built ({type(exc).__name__}'
                    f'{": " + reason if reason else ""}); attention runs on the other backends '
                    '(lookhere_dense.lookhere.explain_backend(model, size) says which)',
                    file=sys.stderr,
                    flush=True,
                )
            raise RuntimeError(_STATE['error']) from exc


def _compile(name: str, flags: list, directory: Path, verbose: bool) -> None:
    """Compile the kernel into ``directory`` with PyTorch's extension builder (ninja and
    the C++ compiler PyTorch's extensions use)."""
    import logging

    print(
        f'lookhere-dense: compiling the fused CPU attention kernel (once, ~20-40 s) into {directory}',
        file=sys.stderr,
        flush=True,
    )
    # the extension builder warns about CUDA_HOME on import on CPU-only machines
    logger = logging.getLogger('torch.utils.cpp_extension')
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension

        directory.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(
            name=name,
            sources=[str(_SOURCE)],
            extra_cflags=flags,
            extra_ldflags=['-fopenmp'],
            build_directory=str(directory),
            is_python_module=False,
            verbose=verbose,
        )
    finally:
        logger.setLevel(level)


def fused_available() -> bool:
    """True when the kernel is built and loaded (building it on the first call)."""
    try:
        load_fused_ops()
        return True
    except RuntimeError:
        return False


#: the implementations of the bfloat16 products (:func:`bf16_products`)
BF16_PRODUCTS = ('vdpbf16ps', 'brgemm')


def _bf16_env() -> str:
    """``LOOKHERE_FUSED_BF16``: ``1`` (default: the machine's choice), ``0`` (the float32
    products) or one of :data:`BF16_PRODUCTS`."""
    return env_choice('LOOKHERE_FUSED_BF16', ('1', '0') + BF16_PRODUCTS, '1', ConfigError)


def _vdpbf16ps_available() -> bool:
    return fused_available() and bool(load_fused_ops().native_bf16())


def brgemm_bf16_available() -> bool:
    """True where PyTorch's ``at::native::cpublas::brgemm`` runs the kernel's bfloat16
    products: the kernel built for AVX-512 on a CPU with AVX512-BF16, torch's oneDNN with
    its micro-kernel API, and four small products of the kernel's kinds of call exact
    (checked once, on this machine: on AMX tiles where the CPU has them)."""
    return fused_available() and bool(load_fused_ops().brgemm_bf16())


def amx_bf16_available() -> bool:
    """True on a CPU with AMX bfloat16 tiles (PyTorch's ``cpublas::could_pack``)."""
    return fused_available() and bool(load_fused_ops().amx_bf16())


def _bf16_request(native_bf16: Union[None, bool, str]) -> Tuple[Union[None, bool, str], str]:
    """``(choice, asked)``: ``native_bf16`` checked, or where it is None the choice of
    ``LOOKHERE_FUSED_BF16`` (``0``: False, ``1``: None, the machine's; a name: that one);
    ``asked`` is what a refusal names, the argument or the variable.

    Raises:
        ConfigError: a ``LOOKHERE_FUSED_BF16`` value not among its choices.
        ValueError: an argument that is not None, True, False or a name of
            :data:`BF16_PRODUCTS`.
    """
    if native_bf16 is None:
        env = _bf16_env()
        if env in ('0', '1'):
            return (False if env == '0' else None), 'native_bf16'
        return env, 'LOOKHERE_FUSED_BF16'
    if native_bf16 is not True and native_bf16 is not False and native_bf16 not in BF16_PRODUCTS:
        raise ValueError(
            'fused attention: native_bf16 must be None, True, False or one of '
            f'{", ".join(map(repr, BF16_PRODUCTS))}, got {native_bf16!r}'
        )
    return native_bf16, 'native_bf16'


def bf16_products(native_bf16: Union[None, bool, str] = None) -> str:
    """Which products bfloat16 ``q, k, v`` run on: ``'brgemm'``, ``'vdpbf16ps'`` or
    ``'float32'``.

    Args:
        native_bf16: None or True: the machine's choice -- ``'brgemm'`` where the CPU has
            AMX tiles and brgemm runs (:func:`brgemm_bf16_available`), else ``'vdpbf16ps'``
            where the kernel is built for AVX-512 and the CPU has AVX512-BF16, else (None)
            ``'float32'``; ``LOOKHERE_FUSED_BF16`` (``0``, or an
            implementation's name) overrides it for None. False: ``'float32'``. A name of
            :data:`BF16_PRODUCTS`: that one. Default: None.

    Raises:
        RuntimeError: True or a name where that cannot run here (the message says why).
        ValueError: any other value.
    """
    native_bf16, asked = _bf16_request(native_bf16)
    if native_bf16 is False:
        return 'float32'
    if native_bf16 is None or native_bf16 is True:
        if brgemm_bf16_available() and amx_bf16_available():
            return 'brgemm'
        if _vdpbf16ps_available():  # brgemm needs it too (the operands' roundings)
            return 'vdpbf16ps'
        if native_bf16 is None:
            return 'float32'
        raise RuntimeError(
            f'fused attention: native_bf16=True, but {native_bf16_unavailable_reason()}'
        )
    available = brgemm_bf16_available() if native_bf16 == 'brgemm' else _vdpbf16ps_available()
    if not available:
        why = (
            fused_unavailable_reason()
            if not fused_available()
            else 'at::native::cpublas::brgemm does not run the bfloat16 products here (a CPU '
            "or build without AVX512-BF16, a torch without oneDNN's micro-kernel API, or "
            'its check products came out wrong)'
            if native_bf16 == 'brgemm'
            else f'this CPU / build has no AVX512-BF16 (build capability {_capability()})'
        )
        raise RuntimeError(f'fused attention: {asked}={native_bf16!r}, but {why}')
    return native_bf16


def native_bf16_available() -> bool:
    """True where bfloat16 attention runs on native bfloat16 products by default
    (:func:`bf16_products` is not ``'float32'``): our VDPBF16PS kernels (the kernel built
    for AVX-512, a CPU with AVX512-BF16) or brgemm; ``LOOKHERE_FUSED_BF16=0`` turns them
    off. Elsewhere bfloat16 ``q, k, v`` are computed with the float32 products (False too
    where ``LOOKHERE_FUSED_BF16`` names products this CPU lacks: such calls are refused)."""
    try:
        return bf16_products() != 'float32'
    except RuntimeError:
        return False


def native_bf16_unavailable_reason() -> Optional[str]:
    """Why :func:`native_bf16_available` is False (None while it is True)."""
    if _bf16_env() == '0':
        return 'the native bfloat16 products are turned off (LOOKHERE_FUSED_BF16=0)'
    if not fused_available():
        return fused_unavailable_reason()
    try:
        products = bf16_products()
    except RuntimeError as err:  # LOOKHERE_FUSED_BF16 names products this CPU lacks
        return str(err)
    if products == 'float32':
        return (
            f'this CPU / build has no AVX512-BF16 (build capability {_capability()}); '
            'bfloat16 runs on the float32 products'
        )
    return None


def fused_unavailable_reason() -> Optional[str]:
    """Why :func:`fused_available` is False (None while it is True or untried)."""
    return _STATE.get('error')


# ----------------------------------------------------------------------------------------
# Plan
# ----------------------------------------------------------------------------------------
def tile_layout(grid_size: Tuple[int, int], tile: Tuple[int, int] = FUSED_TILE):
    """The tiles of a grid, as the kernel numbers them.

    Returns:
        ``(y0, x0, rows, cols, start, order)``: int64 numpy arrays; per tile its first row
        and column, its size, and ``start`` (tiles + 1) the first tile-order position of
        each tile; ``order[p]`` the patch (row-major) at tile-order position ``p``.
    """
    height, width = grid_size
    th, tw = tile
    ty, tx = np.meshgrid(np.arange(-(-height // th)), np.arange(-(-width // tw)), indexing='ij')
    y0, x0 = (ty * th).ravel(), (tx * tw).ravel()
    rows, cols = np.minimum(th, height - y0), np.minimum(tw, width - x0)
    start = np.concatenate([[0], np.cumsum(rows * cols)])
    order = np.concatenate(
        [
            ((a + np.arange(r))[:, None] * width + b + np.arange(c)[None, :]).ravel()
            for a, b, r, c in zip(y0, x0, rows, cols)
        ]
    )
    return y0, x0, rows, cols, start, order


@dataclass(eq=False)
class FusedPlan:
    """What the kernel computes for one layer's fields of view on one grid.

    Attributes:
        grid_size: ``(H, W)``.
        tile: ``(th, tw)``.
        run_ptr: int32 ``(groups, tiles + 1)``: the runs of query tile ``t`` of group
            ``g`` are ``runs[run_ptr[g, t] : run_ptr[g, t + 1]]``.
        runs: int32 ``(R, 2)``: first key tile, last key tile + 1.
        head_group: int32 ``(heads,)``: each head's group.
        order: int64 ``(N,)``: the patch at each tile-order position.
        computed: patch pairs the kernel computes, as a fraction of all heads' dense pairs.
        visible: patch pairs the heads can see, same fraction.
    """

    grid_size: Tuple[int, int]
    tile: Tuple[int, int]
    run_ptr: Tensor
    runs: Tensor
    head_group: Tensor
    order: Tensor
    computed: float
    visible: float


def plan_fused(
    visible: Tensor, grid_size: Tuple[int, int], tile: Tuple[int, int] = FUSED_TILE
) -> FusedPlan:
    """The runs of key tiles each head group sees from each query tile.

    A (query tile, key tile) pair is in the plan iff some query of the one can see some key
    of the other (tested against the fields of view pair by pair).

    Args:
        visible: ``(heads, 2H-1, 2W-1)`` bool fields of view of the layer.
        grid_size: ``(H, W)``.
        tile: ``(th, tw)`` patches per tile.
    """
    height, width = grid_size
    if tuple(visible.shape[-2:]) != (2 * height - 1, 2 * width - 1):
        raise ValueError(f'visible {tuple(visible.shape)} does not fit grid {grid_size}')
    if not all(isinstance(t, int) and t >= 1 for t in tile) or len(tile) != 2:
        raise ValueError(f'tile must be two positive ints, got {tile!r}')
    y0, x0, rows, cols, start, order = tile_layout(grid_size, tile)
    n_tiles = len(y0)
    vis = visible.cpu().numpy()
    groups = head_groups(visible)
    head_group = np.zeros(visible.shape[0], np.int32)
    run_ptr = np.zeros((len(groups), n_tiles + 1), np.int64)
    runs: list = []
    computed = seen = 0
    size = rows * cols
    for g, heads in enumerate(groups):
        head_group[list(heads)] = g
        counts = VisibleCounts(vis[heads[0]], grid_size)
        # offsets between query tile a and key tile b: dy in [y0b - (y0a + ra - 1), y0b + rb - 1 - y0a]
        qa, kb = np.arange(n_tiles)[:, None], np.arange(n_tiles)[None, :]
        any_seen = (
            counts(
                y0[kb] - (y0[qa] + rows[qa] - 1),
                y0[kb] + rows[kb] - 1 - y0[qa],
                x0[kb] - (x0[qa] + cols[qa] - 1),
                x0[kb] + cols[kb] - 1 - x0[qa],
            )
            > 0
        )  # (tiles, tiles)
        computed += len(heads) * int((any_seen * size[qa] * size[kb]).sum())
        seen += len(heads) * _visible_pairs(vis[heads[0]], grid_size)
        # runs: rising / falling edges of each query tile's row of any_seen
        padded = np.zeros((n_tiles, n_tiles + 2), np.int8)
        padded[:, 1:-1] = any_seen
        edges = np.diff(padded, axis=1)
        qs, firsts = np.nonzero(edges == 1)
        _, lasts = np.nonzero(edges == -1)
        runs.append(np.stack([firsts, lasts], 1))
        run_ptr[g, 1:] = np.bincount(qs, minlength=n_tiles).cumsum()
    offsets = np.cumsum([0] + [len(r) for r in runs[:-1]])
    run_ptr += offsets[:, None]
    dense = visible.shape[0] * (height * width) ** 2
    return FusedPlan(
        (height, width),
        tuple(tile),
        torch.from_numpy(run_ptr.astype(np.int32)),
        torch.from_numpy(np.concatenate(runs).astype(np.int32).reshape(-1, 2)),
        torch.from_numpy(head_group),
        torch.from_numpy(order.astype(np.int64)),
        computed / dense,
        seen / dense,
    )


def _visible_pairs(visible: np.ndarray, grid_size: Tuple[int, int]) -> int:
    """Visible (query, key) patch pairs of one head: each offset counted as often as it
    occurs in the grid."""
    height, width = grid_size
    occur = np.outer(
        height - np.abs(np.arange(-height + 1, height)),
        width - np.abs(np.arange(-width + 1, width)),
    )
    return int((visible * occur).sum())


def get_fused_plan(
    grid_bias: GridBias,
    layer: int,
    tile: Tuple[int, int] = FUSED_TILE,
    cache: Optional[MutableMapping] = None,
) -> FusedPlan:
    """:func:`plan_fused` of ``layer``, from ``cache`` when given (a dict or an object with
    ``get_or_create``; layers with the same fields of view share one entry)."""
    visible = grid_bias.visible[layer]
    return cached_plan(
        cache,
        plan_key('fused', visible, grid_bias.grid_size, tuple(tile))
        if cache is not None
        else None,
        lambda: plan_fused(visible, grid_bias.grid_size, tile),
    )


# ----------------------------------------------------------------------------------------
# Execution
# ----------------------------------------------------------------------------------------
def _kernel_args(plan: FusedPlan, off: int, scale: float):
    height, width = plan.grid_size
    return (
        plan.run_ptr,
        plan.runs,
        plan.head_group,
        height,
        width,
        plan.tile[0],
        plan.tile[1],
        off,
        scale,
    )


def _forward(
    q,
    k,
    v,
    table,
    key_term,
    plan: FusedPlan,
    off: int,
    max_keys: int,
    gather_bytes: int,
    products: str,
):
    scale = q.shape[-1] ** -0.5
    out, lse = load_fused_ops().forward(
        q,
        k,
        v,
        table,
        key_term,
        *_kernel_args(plan, off, scale),
        max_keys,
        gather_bytes,
        products != 'float32',
        products == 'brgemm',
    )
    if off:  # the prefix queries: bias 0 to every key
        o, l = FLASH(q[:, :, :off], k, v)
        out[:, :, :off] = o
        lse[:, :, :off] = l
    return out, lse


class _FusedAttention(torch.autograd.Function):
    """The fused kernel with its flash-style backward: saves ``q, k, v, out, lse``."""

    @staticmethod
    def forward(ctx, q, k, v, table, key_term, plan, off, max_keys, gather_bytes, native):
        out, lse = _forward(
            q,
            k,
            v,
            table.detach(),
            None if key_term is None else key_term.detach(),
            plan,
            off,
            max_keys,
            gather_bytes,
            native,
        )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.table, ctx.key_term, ctx.plan, ctx.off, ctx.max_keys, ctx.native = (
            table,
            key_term,
            plan,
            off,
            max_keys,
            native,
        )
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        off, plan = ctx.off, ctx.plan
        if q.numel() == 0:  # an empty batch (the kernel's checks want real rows)
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            dtable = torch.zeros_like(ctx.table) if ctx.needs_input_grad[3] else None
            dkey = None
            if ctx.needs_input_grad[4] and ctx.key_term is not None:
                dkey = torch.zeros_like(ctx.key_term)
            return dq, dk, dv, dtable, dkey, None, None, None, None, None
        dout = dout.to(q.dtype)
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        scale = q.shape[-1] ** -0.5
        table, key_term = ctx.table, ctx.key_term
        bias_grads = ctx.needs_input_grad[3] or ctx.needs_input_grad[4]
        dq, dk, dv, dtable, dkey = load_fused_ops().backward(
            dout,
            q,
            k,
            v,
            out,
            lse,
            table.detach(),
            None if key_term is None else key_term.detach(),
            *_kernel_args(plan, off, scale),
            ctx.max_keys,
            ctx.native != 'float32',
            bias_grads,
            ctx.native == 'brgemm',
        )
        if off:  # the prefix queries' share
            gq, gk, gv = FLASH_BWD(
                dout[:, :, :off],
                q[:, :, :off],
                k,
                v,
                out[:, :, :off],
                lse[:, :, :off],
                0.0,
                False,
            )
            dq[:, :, :off] += gq
            dk += gk
            dv += gv
        # the kernel's per-sample bias gradients, summed over the batch (the prefix
        # queries' bias is the constant 0: they add nothing)
        dtable = dtable.sum(0) if ctx.needs_input_grad[3] else None
        dkey = dkey.sum(0) if ctx.needs_input_grad[4] else None
        return dq, dk, dv, dtable, dkey, None, None, None, None, None


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    dropout_p: float = 0.0,
    tile: Tuple[int, int] = FUSED_TILE,
    plans: Optional[MutableMapping] = None,
    max_keys: int = FUSED_MAX_KEYS,
    gather_bytes: int = FUSED_GATHER_BYTES,
    native_bf16: Optional[bool] = None,
) -> Tensor:
    """Exact LookHere attention through the compiled tile-sparse kernel (see the module
    docstring).

    Args:
        q, k, v: ``(B, heads, T, d)`` on CPU with ``T = J + H*W``; float32, float64,
            bfloat16 or float16 (the last two read as they are, computed in float32:
            float32 scores, softmax and accumulators; output in their dtype).
        grid_bias: tables of the grid.
        layer: which layer's table to use.
        cls_token: number ``J`` of global prefix tokens at the front (CLS, or Jumbo
            tokens; True = 1), bias 0 to and from everything.
        dropout_p: must be 0 (no attention dropout: use ``chunked``).
        tile: ``(th, tw)`` patches per tile. Default: :data:`FUSED_TILE`.
        plans: a cache for the plans (dict, or the engine's ``BoundedCache``); None:
            planned on every call.
        max_keys: the most key slots of one block (whole tiles; a block of one tile may
            exceed it). Default: :data:`FUSED_MAX_KEYS`.
        gather_bytes: the most bytes of keys / values copied into tile order at once (at
            least one head). Default: :data:`FUSED_GATHER_BYTES`.
        native_bf16: for bfloat16 ``q, k, v``: True = the native bfloat16 products
            (a RuntimeError where this machine has none), ``'vdpbf16ps'`` / ``'brgemm'`` =
            that implementation of them, False = the float32 products; None = native where
            :func:`native_bf16_available` (:func:`bf16_products`). Default: None.

    Returns:
        ``(B, heads, T, d)`` in ``q``'s dtype, laid out ``(B, T, heads, d)`` in memory.
        Differentiable in ``q, k, v``.
    """
    off, table, key_term = flash_layer_inputs(
        'fused', q, k, grid_bias, layer, cls_token, dropout_p, bias_grads=True
    )
    for name, value in (('max_keys', max_keys), ('gather_bytes', gather_bytes)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f'fused attention: {name} must be a positive int, got {value!r}')
    if not fused_available():
        raise RuntimeError(
            f'{fused_unavailable_reason()}; use '
            "model.backbone.attn_backend='auto' (which then picks 'tiled')"
        )
    # the products' choice is for bfloat16 q, k, v only (LOOKHERE_FUSED_BF16=vdpbf16ps on a
    # CPU without AVX512-BF16 refused float32 inference)
    if q.dtype == torch.bfloat16:
        native = bf16_products(native_bf16)
    else:  # the choice is still checked: a misspelt value is refused in any dtype
        _bf16_request(native_bf16)
        native = 'float32'
    plan = get_fused_plan(grid_bias, layer, tile, plans)
    dtype = q.dtype
    # bfloat16 / float16 q, k, v go in as they are (converted as the kernel packs them);
    # the table, the softmax and the accumulators are float32
    work = work_dtype(dtype)
    store = dtype if dtype in (torch.bfloat16, torch.float16) else work
    q, k, v = (t.to(store) if t.dtype != store else t for t in (q, k, v))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    table = table.to(work).contiguous()
    if key_term is not None:
        key_term = key_term.to(work)[:, plan.order].contiguous()
    inputs = (q, k, v, table) if key_term is None else (q, k, v, table, key_term)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        out = _FusedAttention.apply(
            q, k, v, table, key_term, plan, off, max_keys, gather_bytes, native
        )
    else:
        out = _forward(q, k, v, table, key_term, plan, off, max_keys, gather_bytes, native)[0]
    return out if out.dtype == dtype else out.to(dtype)


def can_run(request: AttentionRequest) -> Optional[str]:
    """CPU, no attention dropout, the kernel built (a compiler); ``auto`` from
    :data:`FUSED_MIN_TOKENS` tokens on. Learnable slopes that train are fine: the backward
    gives the bias table (and the key term) their gradients."""
    if not request.on_cpu:
        return f'runs on CPU only (the call is on {request.device})'
    if request.dropout_p:
        return 'has no attention dropout'
    if request.auto and request.tokens < FUSED_MIN_TOKENS:
        return f'{request.tokens} tokens < FUSED_MIN_TOKENS ({FUSED_MIN_TOKENS})'
    if not fused_available():
        return fused_unavailable_reason() or 'the kernel is not built'
    return None


def attend(call: AttentionCall) -> Tensor:
    """:func:`fused_attention` with the engine's tables and plan cache; the tables in the
    compute dtype (float32 for bfloat16 / float16 ``q``: the bias is not rounded first)."""
    q = call.q
    dtype = work_dtype(q.dtype)
    grid_bias, index = call.engine.layer_bias(
        call.layer, call.grid_size, q.device, dtype, call.slopes
    )
    args = (grid_bias, index, call.cls_token, call.dropout_p)
    return fused_attention(call.q, call.k, call.v, *args, plans=call.engine.fused_plans)
