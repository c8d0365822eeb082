"""The ``triton`` backend (:mod:`lookhere_dense.lookhere.attention.flash_triton`) without a
GPU: its kernel run by Triton's interpreter on CPU against the float32 / float64 reference,
on grids large enough that whole key tiles are skipped and others are full, and compiled
for a Hopper GPU (sm_90) to machine code.

Triton fixes the interpreter mode when it is first imported, so the interpreted cases run
in a child process started with ``TRITON_INTERPRET=1`` (this file's
``test_*_in_the_interpreter`` functions, and ``tests/test_backends.py``'s ``triton`` cases,
which skip in a plain process).
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

pytest.importorskip('triton')

from lookhere_dense.lookhere.attention.common import (
    AttentionRequest,  # noqa: E402
    tile_order,  # noqa: E402
)
from lookhere_dense.lookhere.attention.flash_triton import (  # noqa: E402
    can_run,
    triton_attention_lookhere,
    triton_plan,
)
from lookhere_dense.lookhere.attention.reference import reference_attention  # noqa: E402
from lookhere_dense.lookhere.config import PRESETS  # noqa: E402
from lookhere_dense.lookhere.engine import LookHereAttentionEngine  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERPRETING = os.environ.get('TRITON_INTERPRET', '0') == '1'
CPU = torch.device('cpu')
HEADS = 12
CONFIGS = {
    'lh180': PRESETS['lh180'],
    'lh45': PRESETS['lh45'],
    'center': replace(PRESETS['lh180'], head_directions='corners-center'),
}


def test_the_interpreted_cases_pass_in_a_child_process():
    """``TRITON_INTERPRET=1 pytest`` of this file's interpreted cases and of
    ``tests/test_backends.py``'s ``triton`` cases (every config, grid and prefix count of
    that file, float32 and float16)."""
    if INTERPRETING:
        pytest.skip('this is the child process')
    res = subprocess.run(
        [
            sys.executable,
            '-m',
            'pytest',
            '-q',
            '-p',
            'no:cacheprovider',
            'tests/test_triton_backend.py',
            'tests/test_backends.py',
            '-k',
            'triton and not child_process',
        ],
        cwd=REPO,
        env={**os.environ, 'TRITON_INTERPRET': '1'},
        capture_output=True,
        text=True,
        timeout=900,
    )
    tail = res.stdout[-3000:] + res.stderr[-2000:]
    assert res.returncode == 0, tail
    assert ' passed' in tail and ' failed' not in tail, tail
    assert 'in the interpreter' not in tail.split('short test summary')[-1], tail  # not skipped


@pytest.mark.parametrize(
    'name, grid, prefix, dtype',
    [
        ('lh45', (16, 24), 1, torch.float32),
        ('lh180', (16, 32), 0, torch.float16),
        ('center', (9, 30), 4, torch.float32),
    ],
)
def test_large_grids_skip_tiles_and_match_the_reference_in_the_interpreter(
    name, grid, prefix, dtype
):
    """Several 128-token tiles in tile order: some skipped (a directed head sees none of
    their keys), some full, some partial; the output equals the reference (float64 bias,
    float32 softmax) to float32 / float16 rounding."""
    if not INTERPRETING:
        pytest.skip('runs in the interpreter (the child process above)')
    eng = LookHereAttentionEngine(CONFIGS[name], 2, HEADS)
    tokens = grid[0] * grid[1] + prefix
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, tokens, 16, generator=gen).mul(2).to(dtype) for _ in range(3))
    fixed = eng.grid_bias(grid, CPU)
    for layer in range(2):
        plan = triton_plan(fixed, layer, prefix, tile_order(grid, prefix))
        part_num, _, full_num, _ = plan.tiles
        n_tiles = part_num.shape[-1]
        assert int((part_num + full_num).min()) < n_tiles  # some key tiles are skipped
        assert int(full_num.max()) > 0  # and some are full
        out = eng(q, k, v, layer, grid, prefix, backend='triton')
        assert eng.last_backend == 'triton' and out.dtype == dtype
        ref = reference_attention(
            q, k, v, eng.grid_bias(grid, CPU, torch.float64).dense(layer, prefix)
        )
        atol = 2e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out, ref, atol=atol, rtol=0)


def test_the_backend_refuses_what_it_cannot_do():
    """Never chosen by ``auto``; forward only; on CPU only in the interpreter; inputs that
    need a gradient are refused by name."""
    t = 64
    assert 'auto never chooses it' in can_run(AttentionRequest(t, CPU))
    assert 'forward only' in can_run(AttentionRequest(t, CPU, training=True, auto=False))
    on_cpu = can_run(AttentionRequest(t, CPU, auto=False))
    if INTERPRETING:
        assert on_cpu is None
    else:
        assert 'TRITON_INTERPRET=1' in on_cpu
    eng = LookHereAttentionEngine(PRESETS['lh90'], 1, HEADS)
    q = torch.randn(1, HEADS, 17, 8, requires_grad=True)
    with pytest.raises(ValueError, match="attn_backend='triton' has a forward only"):
        triton_attention_lookhere(q, q, q, eng.grid_bias((4, 4), CPU), 0, 1)


@pytest.mark.parametrize('dtype', ['bf16', 'fp16', 'fp32'])
def test_the_kernel_compiles_for_a_hopper_gpu(dtype, tmp_path):
    """The kernel as ``triton_attention_lookhere`` launches it for ViT-B (head dim 64, the
    tile lists, a ``center`` per-key term), compiled to sm_90 machine code (``cubin``) by
    Triton's own ptxas, in each dtype; shared memory within an H100's / H200's 227 KiB."""
    import triton
    from triton.backends.compiler import GPUTarget

    from lookhere_dense.lookhere.attention import triton_kernels

    if INTERPRETING:
        pytest.skip('the interpreter does not compile')
    params = inspect.signature(triton_kernels._lookhere_forward).parameters
    const = dict(
        HEAD_DIM=64,
        BLOCK_D=64,
        BLOCK_M=64,
        BLOCK_N=64,
        MASK_BLOCK=128,
        HAS_MASK=True,
        HAS_KEY_TERM=True,
        IEEE=dtype == 'fp32',
    )
    signature = {}
    for name in params:
        if name in const:
            signature[name] = 'constexpr'
        elif name in ('Q', 'K', 'V', 'Out'):
            signature[name] = f'*{dtype}'
        elif name in ('Table', 'KeyTerm'):
            signature[name] = '*fp32'
        elif name in ('Code', 'KeyPatch', 'PartNum', 'PartIdx', 'FullNum', 'FullIdx'):
            signature[name] = '*i32'
        else:
            signature[name] = 'fp32' if name == 'qk_scale' else 'i32'
    source = triton.compiler.ASTSource(
        fn=triton_kernels.forward_kernel(), signature=signature, constexprs=const
    )
    try:
        kernel = triton.compile(
            source, target=GPUTarget('cuda', 90, 32), options=dict(num_warps=4, num_stages=2)
        )
    except Exception as err:  # no CUDA toolchain in this Triton build
        if 'ptxas' in str(err) and 'not found' in str(err).lower():
            pytest.skip(f'Triton has no ptxas here: {err}')
        raise
    assert kernel.asm.get('cubin')
    assert 0 < kernel.metadata.shared <= 232448
    if dtype == 'fp32':
        return  # IEEE float32 products: the exact path, not the fast one (spills not checked)
    assert 'wgmma' in kernel.asm['ptx']  # the tensor cores
    ptxas = os.path.join(os.path.dirname(triton.__file__), 'backends', 'nvidia', 'bin', 'ptxas')
    ptx = tmp_path / 'kernel.ptx'
    ptx.write_text(kernel.asm['ptx'])
    res = subprocess.run(
        [ptxas, '-v', '-arch=sm_90a', str(ptx), '-o', str(tmp_path / 'kernel.cubin')],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    assert '0 bytes spill stores, 0 bytes spill loads' in res.stderr, res.stderr
