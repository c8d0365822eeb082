"""The MLP's bfloat16 inference path on CPU (``fc1`` + GELU as one oneDNN call,
:mod:`lookhere_dense.lookhere.fused_mlp`): as accurate as the plain path against float64,
taken only where it computes the same function, and off by ``LOOKHERE_FUSED_MLP=0``.

The tests of the conditions (:func:`use_fused_mlp`) run everywhere, with the op's
availability taken as given; the ones that run the op need it (oneDNN with bfloat16 on this
CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import lookhere_dense.lookhere.fused_mlp as fm
from lookhere_dense.lookhere import create_model
from lookhere_dense.lookhere.fused_mlp import fused_mlp, use_fused_mlp
from lookhere_dense.lookhere.layers import Mlp

requires_op = pytest.mark.skipif(
    not fm.fused_mlp_available(), reason='this torch / CPU has no oneDNN bfloat16 fused linear'
)

BF16 = dict(device_type='cpu', dtype=torch.bfloat16)
#: the fused path's error against float64, at most this times the plain path's
AS_CLOSE = 1.1


def _mlp(approximate: str = 'none', seed: int = 0, drop: float = 0.0) -> Mlp:
    torch.manual_seed(seed)
    mlp = Mlp(64, 256, act_layer=lambda: nn.GELU(approximate=approximate), drop=drop).eval()
    for p in mlp.parameters():  # biases large enough that a lost or doubled one shows
        nn.init.normal_(p, std=0.3)
    return mlp


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


def _plain(module: nn.Module, x: torch.Tensor, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setenv('LOOKHERE_FUSED_MLP', '0')
        return module(x)


@pytest.fixture
def op_available(monkeypatch):
    """The op taken as available (the conditions are tested on every machine)."""
    monkeypatch.setattr(fm, '_onednn_bf16_linear', lambda: True)
    monkeypatch.setattr(torch.backends.mkldnn, 'is_available', lambda: True)


@requires_op
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
    assert _rel(fused, ref) <= AS_CLOSE * _rel(plain, ref)


@requires_op
def test_bfloat16_weights_without_autocast_take_it_too(monkeypatch):
    mlp = _mlp()
    x = torch.randn(2, 33, 64).bfloat16()
    with torch.no_grad():
        ref = mlp.double()(x.double())
        mlp.bfloat16()
        fused, plain = mlp(x), _plain(mlp, x, monkeypatch)
    assert not torch.equal(fused, plain)
    assert _rel(fused, ref) <= AS_CLOSE * _rel(plain, ref)


@requires_op
def test_strided_tokens_and_no_fc2_bias(monkeypatch):
    """A view that stays strided after flattening the token axes (every other channel of a
    wider tensor), and ``fc2`` without a bias."""
    mlp = _mlp()
    mlp.fc2 = nn.Linear(256, 64, bias=False)
    x = torch.randn(2, 40, 128)[..., ::2]
    with torch.no_grad():
        ref = mlp.double()(x.double())
        mlp.float()
        with torch.autocast(**BF16):
            fused, plain = mlp(x), _plain(mlp, x, monkeypatch)
            assert torch.equal(fused, mlp(x.contiguous()))
    assert not torch.equal(fused, plain)
    assert _rel(fused, ref) < 6e-3
    assert _rel(fused, ref) <= AS_CLOSE * _rel(plain, ref)


def test_it_is_taken_only_where_it_computes_the_plain_function(op_available, monkeypatch):
    mlp = _mlp(drop=0.5)
    x = torch.randn(2, 9, 64)

    def fused(x=x):
        return use_fused_mlp(x, mlp)

    with torch.autocast(**BF16):
        assert not fused()  # autograd on: the weights need gradients
        with torch.no_grad():
            assert fused()
            mlp.train()  # dropout acts
            assert not fused()
            mlp.eval()
            mlp.drop.train()  # Monte-Carlo dropout: the Dropout module's own flag
            assert not fused()
            mlp.drop.eval()
            assert not fused(x.double())  # autocast leaves float64 as it is
            mlp.fc2.half()
            assert not fused()  # and float16 weights (the plain path's dtype error)
            mlp.fc2.float()
            monkeypatch.setenv('LOOKHERE_FUSED_MLP', '0')
            assert not fused()
            monkeypatch.setenv('LOOKHERE_FUSED_MLP', 'off')
            assert not fused()
            monkeypatch.setenv('LOOKHERE_FUSED_MLP', 'maybe')  # was taken as on, silently
            from lookhere_dense.errors import ConfigError

            with pytest.raises(ConfigError, match=r"^LOOKHERE_FUSED_MLP='maybe': expected one"):
                fused()
            monkeypatch.setenv('LOOKHERE_FUSED_MLP', '')
            assert fused()
            monkeypatch.delenv('LOOKHERE_FUSED_MLP')
            assert fused()
        mlp.requires_grad_(False)  # a frozen MLP on an input that needs no gradient
        assert fused()
        assert not fused(x.clone().requires_grad_())
        mlp.requires_grad_(True)
    with torch.no_grad():
        assert not fused()  # float32
        assert not fused(x.bfloat16())  # bfloat16 tokens, float32 weights, no autocast
        mlp.bfloat16()
        assert fused(x.bfloat16())
        mlp.float()
        with torch.autocast('cpu', dtype=torch.float16):
            assert not fused()


def test_modules_that_are_not_the_plain_ones_keep_their_forward(op_available):
    """A subclassed or wrapped layer (e.g. an adapter), a hooked one, another activation, a
    GELU kind oneDNN lacks, or ``fc1`` without a bias: the plain path, which calls them."""

    class Adapted(nn.Linear):
        def forward(self, x):
            return super().forward(x) + 1

    x = torch.randn(2, 9, 64)
    with torch.no_grad(), torch.autocast(**BF16):
        assert use_fused_mlp(x, _mlp())
        for change in (
            lambda m: setattr(m, 'fc1', Adapted(64, 256)),
            lambda m: setattr(m, 'fc2', Adapted(256, 64)),
            lambda m: m.fc1.register_forward_hook(lambda *a: None),
            lambda m: m.fc2.register_forward_pre_hook(lambda *a: None),
            lambda m: m.act.register_forward_hook(lambda *a: None),
            lambda m: setattr(m, 'act', nn.ReLU()),
            lambda m: setattr(m, 'act', type('MyGELU', (nn.GELU,), {})()),
            lambda m: setattr(m.act, 'approximate', 'sigmoid'),
            lambda m: setattr(m, 'fc1', nn.Linear(64, 256, bias=False)),
        ):
            mlp = _mlp()
            change(mlp)
            assert not use_fused_mlp(x, mlp)
        handle = nn.modules.module.register_module_forward_hook(lambda *a: None)
        try:
            assert not use_fused_mlp(x, _mlp())
        finally:
            handle.remove()


@requires_op
def test_dropout_in_training_still_drops(monkeypatch):
    mlp = _mlp(drop=0.5).train()
    x = torch.randn(2, 9, 64)
    with torch.no_grad(), torch.autocast(**BF16):
        torch.manual_seed(3)
        out = mlp(x)
        torch.manual_seed(3)
        assert torch.equal(out, _plain(mlp, x, monkeypatch))
        mlp.eval()
        mlp.drop.train()  # Monte-Carlo dropout
        torch.manual_seed(4)
        out = mlp(x)
        torch.manual_seed(4)
        assert torch.equal(out, _plain(mlp, x, monkeypatch))


@requires_op
def test_training_tracing_and_compiling_keep_the_plain_path(monkeypatch):
    mlp = _mlp()
    x = torch.randn(2, 9, 64)
    with torch.autocast(**BF16):
        y = mlp(x)
        assert y.requires_grad
        assert torch.equal(y.detach(), _plain(mlp, x, monkeypatch).detach())
    mlp.bfloat16()  # bfloat16 weights and tokens: the fused path but for the tracing
    xb = x.bfloat16()
    with torch.no_grad():
        traced = torch.jit.trace(mlp, xb, check_trace=False)
        compiled = torch.compile(mlp, backend='eager', fullgraph=True)
        out = compiled(xb)
        plain = _plain(mlp, xb, monkeypatch)
    assert 'mkldnn' not in str(traced.inlined_graph)
    assert 'gelu' in str(traced.inlined_graph)
    assert torch.equal(out, plain)


@requires_op
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
        out = fused_mlp(x, mlp.fc1, mlp.act, mlp.fc2).double()
        ref = nn.functional.gelu(x.double(), approximate=approximate)
        other = nn.functional.gelu(
            x.double(), approximate='tanh' if approximate == 'none' else 'none'
        )
    assert ((other - ref).abs() / ref.abs()).max() > 0.02  # the kinds are told apart here
    assert ((out - ref).abs() / ref.abs()).max() < 0.01


@requires_op
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
    # two blocks of bfloat16 roundings around float32 residuals: the plain path's error,
    # give or take the rounding noise of the comparison
    assert _rel(fused, ref) <= 1.25 * _rel(plain, ref)


@requires_op
def test_function_transforms_keep_the_plain_path(monkeypatch):
    """Forward-mode AD (the op would drop the tangent) and ``torch.func`` (``vmap`` would
    loop over the op): the plain path, its values and tangents."""
    import torch.autograd.forward_ad as fwAD

    mlp = _mlp()
    x, t = torch.randn(5, 64), torch.randn(5, 64)
    with torch.no_grad(), torch.autocast(**BF16):
        with fwAD.dual_level():
            out = fwAD.unpack_dual(mlp(fwAD.make_dual(x, t)))
            with monkeypatch.context() as m:
                m.setenv('LOOKHERE_FUSED_MLP', '0')
                plain = fwAD.unpack_dual(mlp(fwAD.make_dual(x, t)))
        assert out.tangent is not None
        assert torch.equal(out.primal, plain.primal) and torch.equal(out.tangent, plain.tangent)
        xs = torch.randn(3, 5, 64)
        vmapped = torch.func.vmap(mlp)
        assert torch.equal(vmapped(xs), _plain(vmapped, xs, monkeypatch))
        jvp = lambda x: torch.func.jvp(mlp, (x,), (t,))  # noqa: E731
        value, tangent = jvp(x)
        plain_value, plain_tangent = _plain(jvp, x, monkeypatch)
    assert torch.equal(value, plain_value) and torch.equal(tangent, plain_tangent)


@requires_op
def test_jumbo_model_in_bf16_inference(monkeypatch):
    """A Jumbo trunk (its blocks run the MLP on the patch tokens, a slice, and the shared
    wide MLP on the joined Jumbo tokens) takes the fused path and stays close to float32."""
    torch.manual_seed(0)
    model = create_model(
        embed_dims=48,
        num_layers=2,
        num_heads=12,
        patch_size=8,
        with_cls_token=False,
        jumbo_tokens=3,
        init_values=0.5,
    ).eval()
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        ref = model.forward_features(x).double()
        with torch.autocast(**BF16):
            fused = model.forward_features(x)
            plain = _plain(model.forward_features, x, monkeypatch)
    assert not torch.equal(fused, plain)
    assert _rel(fused, ref) < 0.02
    assert _rel(fused, ref) <= 1.25 * _rel(plain, ref)
