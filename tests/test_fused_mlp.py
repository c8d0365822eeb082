"""The MLP's bfloat16 inference path on CPU (``fc1`` + GELU as one oneDNN call,
:mod:`lookhere_dense.lookhere.fused_mlp`): as accurate as the plain path against float64,
taken only where it computes the same function, and off by ``LOOKHERE_FUSED_MLP=0``."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from lookhere_dense.lookhere import create_model
from lookhere_dense.lookhere.fused_mlp import fused_mlp, fused_mlp_available, fused_mlp_dtype
from lookhere_dense.lookhere.layers import Mlp

pytestmark = pytest.mark.skipif(
    not fused_mlp_available(), reason='this torch / CPU has no oneDNN bfloat16 fused linear'
)

BF16 = dict(device_type='cpu', dtype=torch.bfloat16)


def _mlp(approximate: str = 'none', seed: int = 0) -> Mlp:
    torch.manual_seed(seed)
    mlp = Mlp(64, 256, act_layer=lambda: nn.GELU(approximate=approximate)).eval()
    for p in mlp.parameters():  # biases large enough that a lost or doubled one shows
        nn.init.normal_(p, std=0.3)
    return mlp


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


def _plain(mlp: Mlp, x: torch.Tensor, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setenv('LOOKHERE_FUSED_MLP', '0')
        return mlp(x)


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
def test_fused_mlp_is_as_close_to_float64_as_the_plain_path(approximate, monkeypatch):
    mlp = _mlp(approximate)
    x = torch.randn(3, 50, 64)
    with torch.no_grad():
        ref = mlp.double()(x.double())
        mlp.float()
        with torch.autocast(**BF16):
            fused = mlp(x)
            plain = _plain(mlp, x, monkeypatch)
    assert fused.dtype == plain.dtype == torch.bfloat16
    assert not torch.equal(fused, plain), 'the fused path was not taken'
    # one bfloat16 rounding of the hidden layer and the output: ~2^-9 relative each
    assert _rel(fused, ref) < 6e-3
    assert _rel(fused, ref) <= 1.1 * _rel(plain, ref)


def test_bfloat16_weights_without_autocast_take_it_too(monkeypatch):
    mlp = _mlp().bfloat16()
    x = torch.randn(2, 33, 64).bfloat16()
    with torch.no_grad():
        ref = mlp.double()(x.double())
        mlp.bfloat16()
        fused, plain = mlp(x), _plain(mlp, x, monkeypatch)
    assert not torch.equal(fused, plain)
    assert _rel(fused, ref) < 6e-3


def test_non_contiguous_tokens_give_the_contiguous_result():
    mlp = _mlp()
    x = torch.randn(2, 40, 64)
    with torch.no_grad(), torch.autocast(**BF16):
        assert torch.equal(mlp(x[:, 1:]), mlp(x[:, 1:].contiguous()))


def test_it_is_taken_only_where_it_computes_the_plain_function(monkeypatch):
    mlp = _mlp()
    x = torch.randn(2, 9, 64)
    fc1, act, fc2 = mlp.fc1, mlp.act, mlp.fc2

    def dtype(x=x, act=act, dropout=0.0):
        return fused_mlp_dtype(x, fc1, act, fc2, dropout)

    with torch.autocast(**BF16):
        assert dtype() is None  # autograd on: the weights need gradients
        with torch.no_grad():
            assert dtype() == torch.bfloat16
            assert dtype(dropout=0.1) is None  # training with dropout
            assert dtype(act=nn.ReLU()) is None
            assert dtype(x=x.double()) is None  # autocast leaves float64 as it is
            monkeypatch.setenv('LOOKHERE_FUSED_MLP', '0')
            assert dtype() is None
            monkeypatch.delenv('LOOKHERE_FUSED_MLP')
        mlp.requires_grad_(False)  # a frozen MLP on an input that needs no gradient
        assert dtype() == torch.bfloat16
        assert dtype(x=x.clone().requires_grad_()) is None
        mlp.requires_grad_(True)
    with torch.no_grad():
        assert dtype() is None  # float32
        with torch.autocast('cpu', dtype=torch.float16):
            assert dtype() is None


def test_training_and_tracing_keep_the_plain_path(monkeypatch):
    mlp = _mlp()
    x = torch.randn(2, 9, 64)
    with torch.autocast(**BF16):
        y = mlp(x)
        assert y.requires_grad
        assert torch.equal(y.detach(), _plain(mlp, x, monkeypatch).detach())
    mlp.bfloat16()  # bfloat16 weights and tokens: the fused path but for the tracing
    with torch.no_grad():
        traced = torch.jit.trace(mlp, x.bfloat16(), check_trace=False)
    assert 'mkldnn' not in str(traced.inlined_graph)
    assert 'gelu' in str(traced.inlined_graph)


def test_fused_mlp_matches_its_definition():
    """The function itself against ``fc2(gelu(fc1(x)))`` in float64, bias and GELU kind
    included (a dropped bias or the wrong GELU is far outside bfloat16 rounding)."""
    mlp = _mlp('tanh')
    x = torch.randn(70, 64)
    with torch.no_grad():
        out = fused_mlp(x, mlp.fc1, mlp.act, mlp.fc2, torch.bfloat16)
        ref = mlp.double()(x.double())
    assert out.shape == (70, 64) and out.dtype == torch.bfloat16
    assert _rel(out, ref) < 6e-3


def test_whole_model_in_bf16_inference_stays_close_to_float32(monkeypatch):
    model = create_model(
        preset='lh180', embed_dims=96, num_layers=2, num_heads=12, patch_size=8
    ).eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        ref = model(x)[-1].double()
        with torch.autocast(**BF16):
            fused = model(x)[-1]
            plain = _plain(model, x, monkeypatch)[-1]
    assert not torch.equal(fused, plain)
    cos = torch.nn.functional.cosine_similarity(fused.double().flatten(), ref.flatten(), 0)
    assert cos > 0.999
    assert _rel(fused, ref) <= 1.25 * _rel(plain, ref)


@pytest.mark.parametrize('approximate', ['none', 'tanh'])
def test_the_gelu_kind_is_the_modules(approximate):
    """Where GELU's two kinds differ by several percent (pre-activations in [-4, -2]; a
    bfloat16 rounding is 0.4 %), ``fc1`` and ``fc2`` identities, each output element
    against float64 GELU of its bfloat16 input."""
    mlp = Mlp(32, 32, act_layer=lambda: nn.GELU(approximate=approximate)).eval()
    with torch.no_grad():
        for fc in (mlp.fc1, mlp.fc2):
            fc.weight.copy_(torch.eye(32))
            fc.bias.zero_()
        x = torch.linspace(-4, -2, 64 * 32).reshape(64, 32).bfloat16()
        out = fused_mlp(x, mlp.fc1, mlp.act, mlp.fc2, torch.bfloat16).double()
        ref = nn.functional.gelu(x.double(), approximate=approximate)
        other = nn.functional.gelu(
            x.double(), approximate='tanh' if approximate == 'none' else 'none'
        )
    assert ((other - ref).abs() / ref.abs()).max() > 0.02  # the kinds are told apart here
    assert ((out - ref).abs() / ref.abs()).max() < 0.01
