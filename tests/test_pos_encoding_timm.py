"""The RoPE encodings and their timm counterparts.

* ``rope2d`` / ``rope2d_mixed`` are hand-written; these tests prove them equal to timm's
  ``RotaryEmbeddingCat`` (RoPE-ViT axial, as timm's ``vit_base_patch16_rope_224``) and
  ``RotaryEmbeddingMixed`` (RoPE-Mixed of naver-ai/rope-vit): the same angles per channel
  pair, the same rotated queries / keys once timm's interleaved pairs ``(2j, 2j + 1)`` are
  mapped to ours ``(j, j + d/2)``, hence the same attention logits, at several grids
  (rectangular included).
* ``rope_dinov3`` is timm's ``RotaryEmbeddingDinoV3`` in our interface; it is checked
  against DINOv3's RoPE written out here (coordinates, periods, augmentation draws).
"""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from lookhere_dense.lookhere.pos_encoding import (
    AxialRoPE2d,
    DinoV3RoPE2d,
    MixedRoPE2d,
    build_position_encoding,
)
from lookhere_dense.models.backbones import LookHereViT

timm_rope = pytest.importorskip('timm.layers.pos_embed_sincos')

pytestmark = pytest.mark.usefixtures('one_torch_thread')

GRIDS = [(4, 4), (3, 5), (6, 2), (1, 7), (14, 14)]

#: timm's RotaryEmbeddingCat takes rotate_half (timm 1.0.2x on; the [timm] extra admits
#: 1.0.20, whose library paths these tests' references do not change)
requires_rotate_half = pytest.mark.skipif(
    'rotate_half' not in inspect.signature(timm_rope.RotaryEmbeddingCat).parameters,
    reason="this timm's RotaryEmbeddingCat has no rotate_half (the reference's layout)",
)
TINY = dict(img_size=32, patch_size=8, embed_dims=48, num_layers=3, num_heads=12, init_values=None)


def interleaved(x):
    """Our half layout -> timm's interleaved layout: channel ``j`` -> ``2j``,
    ``j + d/2`` -> ``2j + 1``."""
    half = x.shape[-1] // 2
    idx = torch.stack([torch.arange(half), torch.arange(half) + half], -1).flatten()
    return x[..., idx]


def logits(q, k):
    return q @ k.transpose(-1, -2)


# -- rope2d == timm RotaryEmbeddingCat (RoPE-ViT axial) ---------------------------------------
def check_axial_equals_timm(grid, head_dim=16, theta=100.0):
    ours = AxialRoPE2d(head_dim, theta)
    timm_axial = timm_rope.RotaryEmbeddingCat(
        dim=head_dim, in_pixels=False, temperature=theta, grid_indexing='xy'
    )  # rotate_half=False
    timm_half = timm_rope.RotaryEmbeddingCat(
        dim=head_dim, in_pixels=False, temperature=theta, grid_indexing='xy', rotate_half=True
    )
    n = grid[0] * grid[1]
    # the same angle for every pair: timm's sin is sin(angle) repeated per pair
    sin_t = timm_axial.get_embed(list(grid))[:, :head_dim]
    ang = ours.angles(0, grid, torch.device('cpu'))[0]  # (N, d/2)
    torch.testing.assert_close(sin_t[:, 0::2], ang.sin())
    torch.testing.assert_close(sin_t[:, 1::2], ang.sin())
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, n, head_dim), torch.randn(2, 3, n, head_dim)
    qr, kr = ours.rotate(q, k, 0, grid, cls_token=False)
    # timm in our layout (rotate_half=True): the same rotated queries and keys
    emb_half = timm_half.get_embed(list(grid))
    torch.testing.assert_close(qr, timm_rope.apply_rot_embed_cat(q, emb_half, half=True))
    torch.testing.assert_close(kr, timm_rope.apply_rot_embed_cat(k, emb_half, half=True))
    # timm's default interleaved layout: the same logits once the channels are mapped
    emb = timm_axial.get_embed(list(grid))
    qt = timm_rope.apply_rot_embed_cat(interleaved(q), emb)
    kt = timm_rope.apply_rot_embed_cat(interleaved(k), emb)
    torch.testing.assert_close(qt, interleaved(qr))
    torch.testing.assert_close(logits(qt, kt), logits(qr, kr), atol=1e-5, rtol=1e-5)


@requires_rotate_half
@pytest.mark.parametrize('grid', GRIDS)
def test_rope2d_equals_timm_rotary_embedding_cat(grid):
    check_axial_equals_timm(grid)
    check_axial_equals_timm(grid, head_dim=8, theta=10.0)


# -- rope2d_mixed == timm RotaryEmbeddingMixed (RoPE-Mixed) ----------------------------------
def check_mixed_equals_timm(grid, depth=2, heads=3, head_dim=16):
    torch.manual_seed(7)
    ours = MixedRoPE2d(depth, heads, head_dim, theta=10.0)
    torch.manual_seed(7)
    theirs = timm_rope.RotaryEmbeddingMixed(
        dim=heads * head_dim, depth=depth, num_heads=heads, temperature=10.0, grid_indexing='xy'
    )
    # one seed, the same initial frequencies (same draws, same formula)
    torch.testing.assert_close(ours.freqs.data, theirs.freqs.data)
    with torch.no_grad():  # train one of them a little: they must still agree
        ours.freqs.add_(0.01 * torch.randn_like(ours.freqs))
        theirs.freqs.copy_(ours.freqs)
    n = grid[0] * grid[1]
    emb = theirs.get_embed(list(grid))  # (depth, heads, N, 2 * head_dim), interleaved
    q, k = torch.randn(2, heads, n, head_dim), torch.randn(2, heads, n, head_dim)
    for layer in range(depth):
        ang = ours.angles(layer, grid, torch.device('cpu'))  # (heads, N, d/2)
        torch.testing.assert_close(emb[layer, ..., :head_dim][..., 0::2], ang.sin())
        with torch.no_grad():
            qr, kr = ours.rotate(q, k, layer, grid, cls_token=False)
            qt = timm_rope.apply_rot_embed_cat(interleaved(q), emb[layer])
            kt = timm_rope.apply_rot_embed_cat(interleaved(k), emb[layer])
        torch.testing.assert_close(qt, interleaved(qr))
        torch.testing.assert_close(kt, interleaved(kr))
        torch.testing.assert_close(logits(qt, kt), logits(qr, kr), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('grid', GRIDS)
def test_rope2d_mixed_equals_timm_rotary_embedding_mixed(grid):
    check_mixed_equals_timm(grid)


def test_rope2d_mixed_backbone_init_is_timm_init():
    """In the backbone (same seed as timm's model would use for it) the initial
    frequencies are timm's ``init_random_2d_freqs`` numbers."""
    torch.manual_seed(3)
    model = LookHereViT(**TINY, pos_encoding='rope2d_mixed')
    torch.manual_seed(3)
    expected = timm_rope.init_random_2d_freqs(head_dim=4, depth=3, num_heads=12, temperature=10.0)
    torch.testing.assert_close(model.pos_enc.freqs.data, expected)


# -- rope_dinov3 == DINOv3's RoPE, written out -------------------------------------------------
def dinov3_coordinates(grid, normalize='separate'):
    """``(N, 2)`` (row, column) patch centres in ``[-1, 1]`` as DINOv3 defines them."""
    h, w = grid
    den = {'separate': (h, w), 'max': (max(grid),) * 2, 'min': (min(grid),) * 2}[normalize]
    rows = (torch.arange(h, dtype=torch.float32) + 0.5) / den[0] * 2 - 1
    cols = (torch.arange(w, dtype=torch.float32) + 0.5) / den[1] * 2 - 1
    r, c = torch.meshgrid(rows, cols, indexing='ij')
    return torch.stack([r.flatten(), c.flatten()], -1)


def dinov3_draw(shift=None, jitter=None, rescale=None):
    """DINOv3's training transform of the coordinates, drawn in its order from the CPU RNG:
    ``(coords + shift) * jitter * rescale``."""
    ops = []
    if shift is not None:
        ops.append(('add', torch.empty(2).uniform_(-shift, shift)))
    if jitter is not None:
        ops.append(('mul', torch.empty(2).uniform_(-math.log(jitter), math.log(jitter)).exp()))
    if rescale is not None:
        ops.append(('mul', torch.empty(1).uniform_(-math.log(rescale), math.log(rescale)).exp()))

    def apply(coords):
        for op, value in ops:
            coords = coords + value if op == 'add' else coords * value
        return coords

    return apply


def dinov3_rotate(x, coords, theta=100.0):
    """Rotate channel pairs ``(j, j + d/2)`` of ``x (..., N, d)`` (as complex numbers) by
    ``2 pi * coordinate / period``: rows for the first ``d/4`` pairs, columns for the next,
    periods ``theta ** (2i / (d/2))``."""
    d = x.shape[-1]
    periods = theta ** (2 * torch.arange(d // 4, dtype=torch.float32) / (d // 2))
    angles = (2 * math.pi * coords[:, :, None] / periods).flatten(1).double()  # (N, d/2)
    z = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double()) * torch.polar(
        torch.ones_like(angles), angles
    )
    return torch.cat([z.real, z.imag], -1).to(x.dtype)


def dinov3_attention(q, k, v, coords, cls_token, theta=100.0):
    off = int(cls_token)
    qr = torch.cat([q[:, :, :off], dinov3_rotate(q[:, :, off:], coords, theta)], 2)
    kr = torch.cat([k[:, :, :off], dinov3_rotate(k[:, :, off:], coords, theta)], 2)
    return (logits(qr, kr) / math.sqrt(q.shape[-1])).softmax(-1) @ v


def qkv(grid, cls_token, heads=3, head_dim=16, seed=0):
    torch.manual_seed(seed)
    t = grid[0] * grid[1] + int(cls_token)
    return [torch.randn(2, heads, t, head_dim) for _ in range(3)]


def check_dinov3_eval(grid, cls_token, normalize='separate', theta=100.0):
    pe = DinoV3RoPE2d(16, theta=theta, normalize_coords=normalize).eval()
    q, k, v = qkv(grid, cls_token)
    fast = pe(q, k, v, 0, grid, cls_token)
    slow = dinov3_attention(q, k, v, dinov3_coordinates(grid, normalize), cls_token, theta)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('grid', GRIDS)
@pytest.mark.parametrize('cls_token', [True, False])
def test_rope_dinov3_equals_dinov3_rope_in_evaluation(grid, cls_token):
    check_dinov3_eval(grid, cls_token)


@pytest.mark.parametrize('normalize', ['min', 'max'])
def test_rope_dinov3_normalisation_options(normalize):
    check_dinov3_eval((3, 6), True, normalize, theta=10.0)


def check_dinov3_training(grid, cls_token, shift=None, jitter=None, rescale=2.0, seed=5):
    pe = DinoV3RoPE2d(16, shift_coords=shift, jitter_coords=jitter, rescale_coords=rescale).train()
    q, k, v = qkv(grid, cls_token)
    torch.manual_seed(seed)
    pe.add_to_tokens(torch.zeros(1), grid)  # the backbone's once-per-forward call draws
    fast = [pe(q, k, v, layer, grid, cls_token) for layer in range(3)]
    torch.manual_seed(seed)
    coords = dinov3_draw(shift, jitter, rescale)(dinov3_coordinates(grid))
    slow = dinov3_attention(q, k, v, coords, cls_token)
    for out in fast:  # every layer of the forward shares the draw
        torch.testing.assert_close(out, slow, atol=1e-5, rtol=1e-5)
    return fast[0]


@pytest.mark.parametrize('grid', [(4, 4), (3, 5)])
@pytest.mark.parametrize('cls_token', [True, False])
def test_rope_dinov3_training_draws_dinov3_transforms(grid, cls_token):
    a = check_dinov3_training(grid, cls_token)
    b = check_dinov3_training(grid, cls_token, seed=6)
    assert not torch.allclose(a, b, atol=1e-4)  # another forward, another transform
    check_dinov3_training(grid, cls_token, shift=0.5, jitter=1.5, rescale=2.0)
    check_dinov3_training(grid, cls_token, shift=None, jitter=1.2, rescale=None)


@pytest.mark.parametrize('check', ['eval', 'train', 'axial', 'mixed'])
def test_the_timm_checks_catch_a_1e3_error(monkeypatch, check):
    """Companion of the checks above: a 1e-3 error in the code under test fails them."""
    if check in ('eval', 'train'):
        real = DinoV3RoPE2d.embedding
        monkeypatch.setattr(
            DinoV3RoPE2d,
            'embedding',
            lambda self, grid, device=None: real(self, grid, device) + 1e-3,
        )
        run = (
            (lambda: check_dinov3_eval((3, 5), True))
            if check == 'eval'
            else (lambda: check_dinov3_training((3, 5), True))
        )
    else:
        if (
            check == 'axial'
            and 'rotate_half' not in inspect.signature(timm_rope.RotaryEmbeddingCat).parameters
        ):
            pytest.skip("this timm's RotaryEmbeddingCat has no rotate_half")
        cls = AxialRoPE2d if check == 'axial' else MixedRoPE2d
        real = cls.angles
        monkeypatch.setattr(
            cls, 'angles', lambda self, layer, grid, device: real(self, layer, grid, device) + 1e-3
        )
        run = (
            (lambda: check_axial_equals_timm((3, 5)))
            if check == 'axial'
            else (lambda: check_mixed_equals_timm((3, 5)))
        )
    with pytest.raises(AssertionError):
        run()


def test_rope_dinov3_larger_grids_are_denser_not_larger():
    """Patch ``(i, j)`` of an ``n x m`` grid and patch ``(3i+1, 3j+1)`` of the ``3n x 3m``
    grid have the same coordinates: the same rotation."""
    pe = DinoV3RoPE2d(16).eval()
    small, large = pe.embedding((2, 3)), pe.embedding((6, 9))
    idx = torch.tensor([(3 * i + 1) * 9 + 3 * j + 1 for i in range(2) for j in range(3)])
    torch.testing.assert_close(large[idx], small)
    assert not torch.allclose(large[:6], small)
    # rope2d, in contrast, keeps positions in patches: a larger grid reaches larger angles
    axial = AxialRoPE2d(16)
    assert axial.angles(0, (6, 9), 'cpu').max() > 2 * axial.angles(0, (2, 3), 'cpu').max()


def test_rope_dinov3_in_the_backbone():
    """Train mode draws once per forward (checkpointed blocks recompute with the same
    draw: the same gradients), eval is deterministic, nothing is saved, a few steps train."""

    def grads(with_cp):
        torch.manual_seed(0)
        model = LookHereViT(**TINY, pos_encoding='rope_dinov3', with_cp=with_cp)
        model.init_weights()
        x = torch.randn(2, 3, 32, 40)
        torch.manual_seed(1)
        model(x)[0].square().mean().backward()
        return [p.grad for p in model.parameters()]

    for a, b in zip(grads(False), grads(True)):
        torch.testing.assert_close(a, b)
    torch.manual_seed(0)
    model = LookHereViT(**TINY, pos_encoding=dict(type='rope_dinov3', rescale_coords=4.0))
    model.init_weights()
    assert not any(k.startswith('pos_enc.') for k in model.state_dict())
    x, target = torch.randn(2, 3, 32, 40), torch.randn(2, 48, 4, 5)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], model(x)[0], rtol=0, atol=0)
    model.train()
    with torch.no_grad():
        assert not torch.allclose(model(x)[0], model(x)[0])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = F.mse_loss(model(x)[0], target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_rope_dinov3_string_and_none_options_build_in_the_backbone():
    """Options that are not numbers (normalize_coords='min', shift_coords=None) pass the
    backbone's checks: every encoding validates its own options."""
    model = LookHereViT(
        **TINY,
        pos_encoding=dict(
            type='rope_dinov3', normalize_coords='min', shift_coords=None, theta=50.0
        ),
    )
    assert model.pos_enc.rope.normalize_coords == 'min'
    with pytest.raises(
        ValueError,
        match=r'pos_encoding theta must be a finite number > 0, '
        r'got -1',
    ):
        LookHereViT(**TINY, pos_encoding=dict(type='rope_dinov3', theta=-1))


def test_rope_dinov3_bad_options_name_the_problem():
    with pytest.raises(ValueError, match="normalize_coords must be 'separate', 'min' or 'max'"):
        LookHereViT(**TINY, pos_encoding=dict(type='rope_dinov3', normalize_coords='mean'))
    with pytest.raises(ValueError, match="'rope_dinov3': rescale_coords must be"):
        LookHereViT(**TINY, pos_encoding=dict(type='rope_dinov3', rescale_coords=0.5))
    with pytest.raises(ValueError, match="'rope_dinov3' needs head channels divisible by 4"):
        LookHereViT(**{**TINY, 'embed_dims': 72}, pos_encoding='rope_dinov3')


def test_rope_dinov3_without_timm_is_a_clear_error(repo_root):
    """Without timm, building ``rope_dinov3`` says what to install; the other encodings
    (and the module) still work."""
    script = textwrap.dedent("""
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] == 'timm':
                    raise ImportError(f'{name} is blocked in this test')

        sys.meta_path.insert(0, Block())
        import torch
        from lookhere_dense.lookhere import pos_encoding as pe
        for name in ('pape', 'rope2d', 'rope2d_mixed'):
            pe.build_position_encoding(name, embed_dims=48, num_heads=12, depth=2,
                                       grid_size=(4, 4))
        try:
            pe.build_position_encoding('rope_dinov3', embed_dims=48, num_heads=12, depth=2,
                                       grid_size=(4, 4))
        except ImportError as err:
            print('ERROR', err)
        print('timm loaded:', 'timm' in sys.modules)
    """)
    res = subprocess.run(
        [sys.executable, '-c', script], cwd=repo_root, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert "ERROR pos_encoding='rope_dinov3' uses timm's RotaryEmbeddingDinoV3" in res.stdout
    assert 'pip install -U timm' in res.stdout and 'timm loaded: False' in res.stdout


def test_build_position_encoding_passes_the_options():
    pe = build_position_encoding(
        dict(
            type='rope_dinov3',
            theta=10.0,
            jitter_coords=1.5,
            rescale_coords=None,
            normalize_coords='max',
        ),
        embed_dims=48,
        num_heads=12,
        depth=2,
        grid_size=(4, 4),
    )
    assert (
        pe.rope.temperature,
        pe.rope.jitter_coords,
        pe.rope.rescale_coords,
        pe.rope.normalize_coords,
    ) == (10.0, 1.5, None, 'max')
    assert pe.rope.rotate_half and pe.rope.grid_indexing == 'ij'
