"""``pos_encoding='pape'``: the fast appended-feature path against PaPE's definition, written
here as a plain ``N x N`` logit term (global and window attention), plus shapes, the CLS
rule, the trunk's initialisation, training and weight decay."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_layer_decay import optim_cfg
from test_pos_encoding import TINY
from test_pos_encoding import tiny as tiny_backbone

from lookhere_dense.errors import PosEncodingError
from lookhere_dense.lookhere.pos_encoding import pape as pape_module
from lookhere_dense.lookhere.pos_encoding import parse_pos_encoding
from lookhere_dense.lookhere.pos_encoding.pape import ParabolicPositionEncoding, parabola_features
from lookhere_dense.models.backbones import LookHereViT

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def tiny(pos_encoding='pape', seed=0, **kw) -> LookHereViT:
    """test_pos_encoding's tiny backbone, with PaPE by default."""
    return tiny_backbone(pos_encoding, seed, **kw)


# -- the definition, spelled out -------------------------------------------------------------
def definition_term(pe: ParabolicPositionEncoding, tokens, layer, grid, cls_token):
    """``pape(i, j) = sum_m -a_im (p_im - p_jm)^2 + s_im (p_im - p_jm)`` as a dense
    ``(B, heads, T, T)`` tensor (float64): ``p`` from the raw (column, row) patch indices,
    ``a = softplus(.)`` and ``s`` from the query token, 0 to and from the CLS token."""
    off = int(cls_token)
    h, w = grid
    heads, n_par = pe.num_heads, pe.parabolas
    xy = torch.tensor([(x, y) for y in range(h) for x in range(w)], dtype=torch.float64)
    w_pos = pe.position_proj[layer].detach().double().view(heads, n_par, 2)
    p = torch.einsum('nc,hmc->hnm', xy, w_pos)  # (heads, N, P)
    w_cs = pe.curve_proj[layer].detach().double().view(2, heads, n_par, -1)
    t = tokens[:, off:].double()
    a = F.softplus(torch.einsum('bnc,hmc->bhnm', t, w_cs[0]))
    s = torch.einsum('bnc,hmc->bhnm', t, w_cs[1])
    offset = p[:, :, None, :] - p[:, None, :, :]  # (heads, N_query, N_key, P)
    term = (-a[:, :, :, None] * offset**2 + s[:, :, :, None] * offset).sum(-1)
    full = torch.zeros(t.shape[0], heads, h * w + off, h * w + off, dtype=torch.float64)
    full[..., off:, off:] = term
    return full


def window_visibility(grid, window_size, cls_token):
    """``(T, T)`` bool: which keys each query sees in ViTDet window attention (patches see
    their window and the CLS token, the CLS query sees everything)."""
    h, w = grid
    win = torch.tensor(
        [(y // window_size) * 10_000 + x // window_size for y in range(h) for x in range(w)]
    )
    seen = win[:, None] == win[None, :]
    if cls_token:
        seen = torch.cat([torch.ones(1, h * w, dtype=torch.bool), seen], 0)
        seen = torch.cat([torch.ones(h * w + 1, 1, dtype=torch.bool), seen], 1)
    return seen


def definition_attention(q, k, v, term, visible=None):
    logits = (q @ k.transpose(-1, -2) + term) / math.sqrt(q.shape[-1])
    if visible is not None:
        logits = logits.masked_fill(~visible, float('-inf'))
    return logits.softmax(-1) @ v


def check_against_definition(grid, cls_token, window_size=0, layer=1, parabolas=5, seed=0):
    """Fast path == definition (float64), for random weights, q, k, v and tokens."""
    torch.manual_seed(seed)
    pe = ParabolicPositionEncoding(
        embed_dims=24, depth=3, num_heads=3, parabolas=parabolas
    ).double()
    t = grid[0] * grid[1] + int(cls_token)
    q, k, v = (torch.randn(2, 3, t, 8, dtype=torch.float64) for _ in range(3))
    tokens = torch.randn(2, t, 24, dtype=torch.float64)
    term = definition_term(pe, tokens, layer, grid, cls_token)
    if window_size:
        fast = pe.window_attention(q, k, v, layer, grid, window_size, cls_token, tokens=tokens)
        slow = definition_attention(q, k, v, term, window_visibility(grid, window_size, cls_token))
    else:
        fast = pe(q, k, v, layer, grid, cls_token, tokens=tokens)
        slow = definition_attention(q, k, v, term)
    torch.testing.assert_close(fast, slow, rtol=1e-9, atol=1e-10)
    return pe, (q, k, v, tokens)


@pytest.mark.parametrize('grid', [(4, 4), (3, 5), (5, 2), (1, 6)])
@pytest.mark.parametrize('cls_token', [True, False])
def test_pape_equals_its_definition(grid, cls_token):
    check_against_definition(grid, cls_token, layer=0)
    check_against_definition(grid, cls_token, layer=2, parabolas=3, seed=1)


@pytest.mark.parametrize('grid,window_size', [((5, 7), 3), ((4, 4), 2), ((3, 5), 4)])
@pytest.mark.parametrize('cls_token', [True, False])
def test_pape_window_attention_equals_its_definition(grid, window_size, cls_token):
    check_against_definition(grid, cls_token, window_size)


def test_appended_features_give_the_parabola_sum():
    """The dot products of :func:`parabola_features` are the parabola sum itself."""
    torch.manual_seed(0)
    p = torch.randn(3, 7, 4, dtype=torch.float64)  # (heads, N, P)
    a, s = (
        torch.rand(2, 3, 7, 4, dtype=torch.float64),
        torch.randn(2, 3, 7, 4, dtype=torch.float64),
    )
    qf, kf = parabola_features(p, a, s)
    assert qf.shape == (2, 3, 7, 9) and kf.shape == (3, 7, 9)
    offset = p[:, :, None] - p[:, None]
    expected = (-a[:, :, :, None] * offset**2 + s[:, :, :, None] * offset).sum(-1)
    torch.testing.assert_close(qf @ kf.transpose(-1, -2), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize('perturb', ['features', 'coordinates', 'scale'])
def test_the_definition_check_catches_a_1e3_error_in_the_fast_path(monkeypatch, perturb):
    """Companion of the checks above: a 1e-3 error in the fast path fails them."""
    if perturb == 'features':
        real = pape_module.parabola_features

        def features(p, a, s):
            qf, kf = real(p, a, s)
            return qf + 1e-3, kf

        monkeypatch.setattr(pape_module, 'parabola_features', features)
    elif perturb == 'coordinates':
        real = ParabolicPositionEncoding.patch_coordinates

        def coords(self, grid, device=None):
            out = real(self, grid, device).clone()
            out[0, 0] += 1e-3  # one patch off by 1e-3 (a shift of all would be invisible)
            return out

        monkeypatch.setattr(ParabolicPositionEncoding, 'patch_coordinates', coords)
    else:
        real_sdpa = F.scaled_dot_product_attention
        monkeypatch.setattr(
            pape_module.F,
            'scaled_dot_product_attention',
            lambda q, k, v, **kw: real_sdpa(q * (1 + 1e-3), k, v, **kw),
        )
    with pytest.raises(AssertionError):
        check_against_definition((3, 5), True)


# -- the encoding's rules -------------------------------------------------------------------
def test_cls_token_gets_no_term_and_patch_terms_depend_on_offsets_only():
    torch.manual_seed(0)
    pe = ParabolicPositionEncoding(embed_dims=24, depth=2, num_heads=3, parabolas=4)
    q, k, v = (torch.randn(1, 3, 1 + 12, 8) for _ in range(3))
    tokens = torch.randn(1, 13, 24)
    qe, ke = pe.extend(q, k, tokens, 1, (3, 4), True)
    assert qe.shape == ke.shape == (1, 3, 13, 8 + pe.num_features)
    assert (8 + pe.num_features) % 8 == 0 and pe.num_features >= 2 * 4 + 1
    assert (qe[:, :, 0, 8:] == 0).all() and (ke[:, :, 0, 8:] == 0).all()
    out = pe(q, k, v, 1, (3, 4), True, tokens=tokens)
    torch.testing.assert_close(out[:, :, :1], F.scaled_dot_product_attention(q[:, :, :1], k, v))
    # the same content at every patch: logits depend on the offset alone
    qc, kc = q[:, :, 1:2].expand(1, 3, 30, 8), k[:, :, 1:2].expand(1, 3, 30, 8)
    qe, ke = pe.extend(qc, kc, tokens[:, 1:2].expand(1, 30, 24), 0, (5, 6), False)
    logits = (qe @ ke.transpose(-1, -2))[0]
    idx = lambda y, x: y * 6 + x  # noqa: E731
    torch.testing.assert_close(logits[:, idx(1, 1), idx(3, 4)], logits[:, idx(2, 2), idx(4, 5)])
    assert not torch.allclose(logits[:, idx(1, 1), idx(3, 4)], logits[:, idx(3, 4), idx(1, 1)])


@pytest.mark.parametrize('grid', [(4, 4), (7, 10), (3, 1), (1, 9)])
def test_backbone_shapes_at_several_grids(grid):
    model = tiny(dict(type='pape', parabolas=3)).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, grid[0] * 8, grid[1] * 8))[0]
    assert out.shape == (2, 48, *grid) and torch.isfinite(out).all()


def test_trunk_initialisation_does_not_depend_on_the_encoding_or_its_options():
    ref = {k: v for k, v in tiny('none').state_dict().items() if k != '_extra_state'}
    for spec in ('pape', dict(type='pape', parabolas=7)):
        model = tiny(spec)
        sd = {
            k: v
            for k, v in model.state_dict().items()
            if k != '_extra_state' and not k.startswith('pos_enc.')
        }
        assert sorted(sd) == sorted(ref)
        for key, value in sd.items():
            torch.testing.assert_close(value, ref[key], rtol=0, atol=0, msg=key)
    # the encoding's own init is the reference's U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    pe = tiny('pape').pos_enc
    assert pe.position_proj.abs().max() <= 1 / math.sqrt(2)
    assert pe.curve_proj.abs().max() <= 1 / math.sqrt(48)
    assert pe.position_proj.std() > 0.3 and pe.curve_proj.std() > 0.05


def test_a_few_training_steps_reduce_the_loss_and_train_the_encoding():
    model = tiny(dict(type='pape', parabolas=4), window_size=2, window_block_indexes=[1])
    x, target = torch.randn(2, 3, 32, 40), torch.randn(2, 48, 4, 5)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = [p.detach().clone() for p in model.pos_enc.parameters()]
    losses = []
    for _ in range(6):
        opt.zero_grad()
        loss = F.mse_loss(model(x)[0], target)
        loss.backward()
        assert all(
            p.grad is not None and p.grad.abs().sum() > 0 for p in model.pos_enc.parameters()
        )
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(not torch.equal(b, p) for b, p in zip(before, model.pos_enc.parameters()))


def test_runs_under_autocast():
    model = tiny(dict(type='pape', parabolas=3)).eval()
    x = torch.randn(1, 3, 40, 48)
    with torch.no_grad():
        ref = model(x)[0]
        with torch.autocast('cpu', dtype=torch.bfloat16):
            low = model(x)[0]
    assert torch.isfinite(low).all()
    torch.testing.assert_close(low.float(), ref, atol=0.2, rtol=0.1)


def test_weight_decay_applies_to_pape_weights_as_in_the_reference():
    """The reference decays every parameter; the toolkit's rule (no decay for position
    embeddings, norms, biases...) leaves PaPE's two weight tensors decayed, at layer 0."""
    from mmengine.optim import build_optim_wrapper

    model = tiny(dict(type='pape', parabolas=2))
    wrapper = build_optim_wrapper(model, optim_cfg(num_layers=3, decay_rate=0.7))
    for name in ('pos_enc.position_proj', 'pos_enc.curve_proj'):
        group = next(g for g in wrapper.optimizer.param_groups if name in g['param_names'])
        assert group['weight_decay'] == 0.05 and group['layer_id'] == 0


def test_bad_options_and_missing_tokens_name_the_problem():
    for bad in (0, -3, 2.5, True, '8'):
        with pytest.raises(ValueError, match='parabolas must be a positive int'):
            LookHereViT(**TINY, pos_encoding=dict(type='pape', parabolas=bad))
    with pytest.raises(
        PosEncodingError,
        match=r"'pape' has no options \['theta'\]; allowed: "
        r"\['parabolas'\]",
    ):
        parse_pos_encoding(dict(type='pape', theta=3))
    pe = ParabolicPositionEncoding(embed_dims=24, depth=2, num_heads=3, parabolas=2)
    q = torch.randn(1, 3, 13, 8)
    with pytest.raises(ValueError, match='needs the attention.s input tokens'):
        pe(q, q, q, 0, (3, 4), True)
    with pytest.raises(ValueError, match=r'needs tokens of shape \(1, 13, 24\)'):
        pe(q, q, q, 0, (3, 4), True, tokens=torch.randn(1, 12, 24))
    with pytest.raises(ValueError, match='grid \\(3, 3\\) with 1 prefix token needs 10'):
        pe(q, q, q, 0, (3, 3), True, tokens=torch.randn(1, 13, 24))
    with pytest.raises(ValueError, match='has 2 layers, got layer 2'):
        pe(q, q, q, 2, (3, 4), True, tokens=torch.randn(1, 13, 24))
