"""bfloat16 autocast accuracy of a small LookHere ViT, per attention backend (issue 31 item 5).

What a user runs: float32 weights, ``torch.autocast('cpu', dtype=torch.bfloat16)`` around the
forward (the linear layers and the attention run in bfloat16, LayerNorm and softmax
statistics in float32, the final features come out float32). Ground truth: the same model
in float32 with the ``reference`` backend, and the official LookHere code's float32
outputs in ``../shared/reference``.

Tolerances (stated here). Measured at the commit that added this file, on this machine
(AVX2, bfloat16 emulated by PyTorch): every backend cosine 0.999996 and relative error
0.0030 on the final features, 0.0038 on the gradients; the official cases 0.0029, max abs
error 0.013 on features of max 4.2. The error is bfloat16's, dominated by the linear
layers, the same for every backend. The bounds are about 2x that:

- final features: cosine >= :data:`MIN_COSINE`, ``|a - b| / |b|`` <= :data:`MAX_REL`;
- the concatenated parameter gradients of a fixed loss on them: <= :data:`MAX_REL_GRAD`;
- the official cases: ``|a - b| / |b|`` <= :data:`MAX_REL_OFFICIAL` and
  ``max |a - b|`` <= :data:`MAX_ABS_OFFICIAL`.

The model has no LayerScale (``init_values=None``), so the attention is not damped to a
tenth of the residual stream and a wrong bias shows. Checked once by hand (the fused
backend handed a bias table rolled by one column, an off-by-one read): the small ViT's
features then miss by 0.014 (lh180) / 0.040 (lh45), its gradients by 0.047 / 0.11, the
official cases by 0.0058 / 0.0069 (max abs 0.031): every fused case fails.
"""

from __future__ import annotations

import pytest
import torch

from lookhere_dense.lookhere import create_model
from lookhere_dense.lookhere.attention.chooser import REGISTRY
from lookhere_dense.lookhere.attention.common import AttentionRequest

pytestmark = pytest.mark.usefixtures('one_torch_thread')

#: bounds of bfloat16 autocast against float32 (see the module docstring)
MIN_COSINE = 0.9999
MAX_REL = 0.006
MAX_REL_GRAD = 0.008
MAX_REL_OFFICIAL = 0.005
MAX_ABS_OFFICIAL = 0.02
#: a small LookHere ViT: 3 blocks, 12 heads of 8 channels, 8 px patches, no LayerScale
ARCH = dict(embed_dims=96, num_layers=3, num_heads=12, patch_size=8, init_values=None)
#: a 9 x 12 patch grid (+ CLS: 109 tokens), batch 2
IMAGE = (2, 3, 72, 96)
#: backends whose CPU path has no backward (flex: PyTorch's flex_attention on CPU)
FORWARD_ONLY = ('flex',)


def agreement(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """``(cosine, |a - b| / |b|, max |a - b|)`` of two tensors, in float64."""
    a, b = a.detach().flatten().double(), b.detach().flatten().double()
    cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    return cosine, float((a - b).norm() / b.norm()), float((a - b).abs().max())


def check(
    a: torch.Tensor, b: torch.Tensor, what: str, max_rel: float, max_abs: float = float('inf')
) -> None:
    """``a`` agrees with ``b``: cosine >= MIN_COSINE, relative error <= ``max_rel``, max
    abs error <= ``max_abs``."""
    cosine, rel, worst = agreement(a, b)
    assert cosine >= MIN_COSINE and rel <= max_rel and worst <= max_abs, (
        f'{what}: cosine {cosine:.6f} (>= {MIN_COSINE}), relative error {rel:.4f} '
        f'(<= {max_rel}), max abs error {worst:.4f} (<= {max_abs})'
    )


def features_and_grads(backend: str, preset: str, bf16: bool, grads: bool = True):
    """Final features of the small ViT (seeded weights, fixed input) and the gradients of
    a fixed linear loss on them; bfloat16 autocast when ``bf16``. The first block's
    ``qkv`` output dtype is returned too (what the attention received)."""
    torch.manual_seed(0)
    model = create_model(attn_backend=backend, preset=preset, **ARCH)
    x = torch.randn(IMAGE, generator=torch.Generator().manual_seed(1))
    seen = []
    first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    handle = first_linear.register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    with torch.set_grad_enabled(grads), torch.autocast('cpu', torch.bfloat16, enabled=bf16):
        feats = model.forward_features(x)
    handle.remove()
    if not grads:
        return feats.float(), None, seen[0]
    w = torch.randn(feats.shape, generator=torch.Generator().manual_seed(2))
    (feats.float() * w).sum().backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return feats.float(), g, seen[0]


@pytest.fixture(scope='module')
def fp32_reference():
    """``{preset: (features, grads)}`` of the float32 ``reference`` backend."""
    return {
        preset: features_and_grads('reference', preset, bf16=False)[:2]
        for preset in ('lh180', 'lh45')
    }


def _can_run(name: str, training: bool) -> None:
    tokens = 1 + (IMAGE[2] // 8) * (IMAGE[3] // 8)
    request = AttentionRequest(
        tokens, torch.device('cpu'), torch.bfloat16, training=training, auto=False
    )
    reason = REGISTRY[name].can_run(request)
    if reason is not None:
        pytest.skip(f'{name} cannot run here in bfloat16: {reason}')


@pytest.mark.parametrize('preset', ['lh180', 'lh45'])
@pytest.mark.parametrize('backend', sorted(REGISTRY))
def test_bf16_autocast_matches_fp32_reference(backend, preset, fp32_reference):
    grads = backend not in FORWARD_ONLY
    _can_run(backend, training=grads)
    feats, g, dtype = features_and_grads(backend, preset, bf16=True, grads=grads)
    assert dtype == torch.bfloat16  # the blocks really ran in bfloat16
    ref_feats, ref_g = fp32_reference[preset]
    check(feats, ref_feats, f'{backend} {preset} features', MAX_REL)
    if grads:
        check(g, ref_g, f'{backend} {preset} gradients', MAX_REL_GRAD)


@pytest.mark.parametrize('backend', ['auto', 'reference', 'sdpa', 'chunked', 'tiled', 'fused'])
def test_official_reference_cases_in_bf16(official_tiny, backend):
    """The official LookHere code's float32 outputs (``../shared/reference``), reproduced
    under bfloat16 autocast by the official weights, at the training grid and at an
    extrapolated one (128x96: grid 8x6 vs 4x4)."""
    if backend != 'auto':
        _can_run(backend, training=False)
    model = create_model(
        str(official_tiny.path), attn_backend=backend, **official_tiny.vit_kwargs
    ).eval()
    for name in ('64x64', '128x96'):
        case = official_tiny.io['cases'][name]
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
            feats = model.forward_features(case['input'])
        assert feats.shape == case['forward_features'].shape
        check(
            feats,
            case['forward_features'],
            f'{backend} official {name}',
            MAX_REL_OFFICIAL,
            MAX_ABS_OFFICIAL,
        )
