"""The ``pos_encoding=`` switch of LookHereViT: every encoding in the same trunk."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from lookhere_dense.checkpoint import decode_extra_state
from lookhere_dense.errors import PosEncodingError
from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine, LookHereConfig
from lookhere_dense.lookhere.pos_encoding import (
    POS_ENCODINGS,
    AbsolutePositionEncoding,
    AxialRoPE2d,
    LookHerePositionEncoding,
    MixedRoPE2d,
    PosEncodingSpec,
    alibi2d_config,
    build_position_encoding,
    parse_pos_encoding,
    resample_abs_pos_embed,
)
from lookhere_dense.models.backbones import LookHereViT

TINY = dict(img_size=32, patch_size=8, embed_dims=48, num_layers=3, num_heads=12, init_values=None)


def tiny(pos_encoding='lookhere', seed=0, **kw) -> LookHereViT:
    torch.manual_seed(seed)
    model = LookHereViT(**{**TINY, **kw}, pos_encoding=pos_encoding)
    model.init_weights()
    return model


@pytest.mark.parametrize('enc', POS_ENCODINGS)
def test_forward_train_size_and_larger_rectangle_with_gradients(enc):
    model = tiny(enc)
    out = model(torch.randn(2, 3, 32, 32))[0]
    assert out.shape == (2, 48, 4, 4)
    big = model(torch.randn(1, 3, 56, 80))[0]  # 7x10 grid: larger and not square
    assert big.shape == (1, 48, 7, 10) and torch.isfinite(big).all()
    (out.square().mean() + big.square().mean()).backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert no_grad == []
    own = [n for n, _ in model.pos_enc.named_parameters()]
    assert own == {
        'abs': ['pos_embed'],
        'rope2d_mixed': ['freqs'],
        'pape': ['position_proj', 'curve_proj'],
        'ledit': ['locality.weight', 'locality.bias'],
    }.get(enc, [])


@pytest.mark.parametrize('enc', POS_ENCODINGS)
def test_a_misspelt_attn_backend_is_refused_for_every_encoding(enc):
    """Only lookhere / alibi2d / ledit checked the name; the others built with any string
    (they run sdpa, but a typo in a config meant for a LookHere run went unnoticed)."""
    from lookhere_dense.lookhere import create_model

    with pytest.raises(ValueError, match=r"unknown LookHere attention backend 'fsued'"):
        create_model(
            embed_dims=48, num_layers=1, num_heads=12, pos_encoding=enc, attn_backend='fsued'
        )


@pytest.mark.parametrize('enc', POS_ENCODINGS)
def test_window_covering_the_grid_equals_global_attention(enc):
    """A window at least as large as the grid is global attention, for every encoding (RoPE
    rotates by positions in the whole grid, padded keys are masked)."""
    glob = tiny(enc).eval()
    win = tiny(enc, window_size=8, window_block_indexes=[0, 1, 2]).eval()
    win.load_state_dict(glob.state_dict())
    x = torch.randn(1, 3, 40, 56)  # 5x7 grid, padded to one 8x8 window
    with torch.no_grad():
        torch.testing.assert_close(win(x)[0], glob(x)[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize('enc', POS_ENCODINGS)
def test_small_windows_and_checkpointing_run_with_gradients(enc):
    model = tiny(enc, window_size=3, window_block_indexes=[0, 2], with_cp=True)
    out = model(torch.randn(1, 3, 40, 64))[0]  # 5x8 grid: border windows are padded
    out.mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_same_seed_same_trunk_whatever_the_encoding():
    ref = tiny('lookhere').state_dict()
    assert decode_extra_state(ref.pop('_extra_state'))['pos_encoding'] == 'lookhere'
    for enc in POS_ENCODINGS:
        sd = tiny(enc).state_dict()
        assert decode_extra_state(sd.pop('_extra_state'))['pos_encoding'] == enc
        shared = [k for k in sd if not k.startswith('pos_enc.')]
        assert sorted(shared) == sorted(ref)
        for k in shared:
            torch.testing.assert_close(sd[k], ref[k], rtol=0, atol=0, msg=f'{enc}: {k}')


def test_unknown_encoding_and_misplaced_options_name_the_problem():
    with pytest.raises(ValueError, match=r"unknown pos_encoding 'sincos'.*'rope2d_mixed'"):
        LookHereViT(**TINY, pos_encoding='sincos')
    with pytest.raises(ValueError, match='do not apply to pos_encoding=.abs.'):
        LookHereViT(**TINY, pos_encoding='abs', preset='lh90')
    with pytest.raises(ValueError, match="has no options \\['theta'\\]"):
        LookHereViT(**TINY, pos_encoding=dict(type='abs', theta=3))
    with pytest.raises(ValueError, match='no LookHere preset'):
        LookHereViT(**TINY, pos_encoding='alibi2d', preset='lh180')
    with pytest.raises(ValueError, match=r"direction types \['halves'\]"):
        LookHereViT(**TINY, pos_encoding='alibi2d', lh_config=dict(head_directions='halves-none'))
    with pytest.raises(ValueError, match='divisible by 4'):
        LookHereViT(**{**TINY, 'embed_dims': 72}, pos_encoding='rope2d')  # head_dim 6


# -- the one spec parser ----------------------------------------------------------------------
def test_parse_pos_encoding_forms():
    assert parse_pos_encoding('rope2d') == PosEncodingSpec('rope2d')
    assert parse_pos_encoding(dict(type='rope2d', theta=10.0)).options == {'theta': 10.0}
    default = parse_pos_encoding()
    assert default.name == 'lookhere' and default.lh_config == PRESETS['lh180']
    assert not default.explicit and default.preset is None
    short = parse_pos_encoding('lookhere:lh45')
    assert short == parse_pos_encoding('lookhere', preset='lh45')
    assert (short.name, short.preset, short.lh_config, short.explicit) == (
        'lookhere',
        'lh45',
        PRESETS['lh45'],
        True,
    )
    assert parse_pos_encoding('lookhere:lh45', preset='lh45') == short
    over = parse_pos_encoding('lookhere:lh90', lh_config=dict(global_slope=2.0))
    assert over.lh_config.global_slope == 2.0
    assert over.lh_config.head_directions == PRESETS['lh90'].head_directions
    alibi = parse_pos_encoding('alibi2d')
    assert alibi.lh_config == alibi2d_config() and not alibi.explicit
    assert parse_pos_encoding('alibi2d', lh_config=dict(global_slope=2.0)).explicit
    assert parse_pos_encoding('none').lh_config is None
    assert parse_pos_encoding(short) is short  # already parsed


@pytest.mark.parametrize(
    'spec,kwargs,key,match',
    [
        ('sincos', {}, 'pos_encoding', r"unknown pos_encoding 'sincos'; allowed: \['lookhere'"),
        (dict(type='sincos'), {}, 'pos_encoding', r"unknown pos_encoding 'sincos'"),
        ('abs:lh90', {}, 'pos_encoding', r"'abs:lh90': only lookhere takes a preset"),
        ('alibi2d:lh90', {}, 'pos_encoding', r'only lookhere takes a preset'),
        (
            'lookhere:',
            {},
            'pos_encoding',
            r"names no preset; allowed: \['lh180', 'lh45', 'lh90'\]",
        ),
        ('lookhere:lh30', {}, 'pos_encoding', r"unknown LookHere preset 'lh30'; allowed"),
        ('lookhere:lh45', dict(preset='lh90'), 'preset', 'two different presets'),
        ('lookhere', dict(preset='lh30'), 'preset', r"unknown LookHere preset 'lh30'"),
        ('lookhere', dict(lh_config='lh30'), 'lh_config', r"unknown LookHere preset 'lh30'"),
        ('lookhere', dict(lh_config=dict(distance='cubic')), 'lh_config', 'cubic'),
        (
            dict(type='abs', theta=3),
            {},
            'pos_encoding',
            r"has no options \['theta'\]; allowed: "
            r"\['init_std'\]",
        ),
        ('abs', dict(preset='lh90'), 'preset', 'do not apply to pos_encoding=.abs.'),
        ('rope2d', dict(lh_config=dict(global_slope=1.0)), 'lh_config', 'do not apply'),
        ('alibi2d', dict(preset='lh180'), 'preset', 'no LookHere preset'),
        (
            'alibi2d',
            dict(lh_config=dict(head_directions='halves-none')),
            'lh_config',
            r"direction types \['halves'\]",
        ),
    ],
)
def test_parse_pos_encoding_names_the_problem_and_the_key(spec, kwargs, key, match):
    with pytest.raises(PosEncodingError, match=match) as info:
        parse_pos_encoding(spec, **kwargs)
    assert info.value.key == key


def test_parse_pos_encoding_rejects_other_types():
    with pytest.raises(TypeError, match='a name or a dict'):
        parse_pos_encoding(3)
    with pytest.raises(TypeError, match='already parsed'):
        parse_pos_encoding(parse_pos_encoding('lookhere'), preset='lh90')


def test_backbone_takes_the_short_preset_form():
    short = LookHereViT(**TINY, pos_encoding='lookhere:lh45')
    assert short.lh_config == PRESETS['lh45'] and short.pos_encoding == 'lookhere'
    assert short.record() == LookHereViT(**TINY, preset='lh45').record()
    with pytest.raises(ValueError, match='two different presets'):
        LookHereViT(**TINY, pos_encoding='lookhere:lh45', preset='lh90')


def test_build_position_encoding_owns_a_new_engine_or_the_given_one():
    pe = build_position_encoding(
        'lookhere:lh90',
        embed_dims=48,
        num_heads=12,
        depth=2,
        grid_size=(4, 4),
        attn_backend='chunked',
        attn_block_size=3,
    )
    assert isinstance(pe, LookHerePositionEncoding) and pe.lh_config == PRESETS['lh90']
    assert (pe.engine.backend, pe.engine.block_size, pe.engine.depth) == ('chunked', 3, 2)
    engine = LookHereAttentionEngine(PRESETS['lh180'], 2, 12)
    given = build_position_encoding(
        'lookhere', embed_dims=48, num_heads=12, depth=2, grid_size=(4, 4), engine=engine
    )
    assert given.engine is engine
    with pytest.raises(ValueError, match='does not fit num_heads=8'):
        build_position_encoding(
            'lookhere:lh45', embed_dims=48, num_heads=8, depth=2, grid_size=(4, 4)
        )


@pytest.mark.parametrize('enc', POS_ENCODINGS)
def test_clear_caches_starts_from_a_clean_slate(enc):
    model = tiny(enc).eval()
    x = torch.randn(1, 3, 32, 40)
    with torch.no_grad():
        before = model(x)[0]
    model.pos_enc.clear_caches()
    engine = getattr(model.pos_enc, 'engine', None)
    if engine is not None:
        assert all(info['size'] == 0 for info in engine.cache_info().values())
        assert engine.config == model.lh_config  # the config stays
    if enc == 'rope2d':
        assert len(model.pos_enc._cache) == 0
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], before, rtol=0, atol=0)
    if engine is not None:
        assert engine.cache_info()['tables']['size'] == 1  # rebuilt on demand


def test_pos_encoding_imports_and_runs_without_openmmlab(repo_root):
    """``lookhere_dense.lookhere.pos_encoding`` is plain PyTorch: it imports, builds every
    encoding and attends in a process where importing any OpenMMLab package fails."""
    script = textwrap.dedent("""
        import sys
        BLOCKED = ('mmcv', 'mmengine', 'mmseg', 'mmdet')

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in BLOCKED:
                    raise ImportError(f'{name} is blocked in this test')

        sys.meta_path.insert(0, Block())
        import torch
        from lookhere_dense.lookhere import pos_encoding as pe
        from lookhere_dense.lookhere.pos_encoding import POS_ENCODINGS
        q = torch.randn(1, 12, 1 + 20, 4)
        tokens = torch.randn(1, 1 + 20, 48)
        for name in POS_ENCODINGS:
            enc = pe.build_position_encoding(name, embed_dims=48, num_heads=12, depth=2,
                                             grid_size=(4, 5))
            kw = dict(tokens=tokens) if enc.uses_tokens else {}
            assert enc(q, q, q, 1, (4, 5), True, **kw).shape == q.shape
            assert enc.window_attention(q, q, q, 1, (4, 5), 3, True, **kw).shape == q.shape
            enc.clear_caches()
        from lookhere_dense.lookhere.pos_encoding.pape import ParabolicPositionEncoding  # torch only
        assert pe.parse_pos_encoding('lookhere:lh45').preset == 'lh45'
        loaded = sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED)
        print('OK', loaded)
    """)
    res = subprocess.run(
        [sys.executable, '-c', script], cwd=repo_root, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert 'OK []' in res.stdout


def test_registry_builds_every_encoding():
    from mmseg.registry import MODELS

    for enc in POS_ENCODINGS:
        model = MODELS.build(dict(type='LookHereViT', **TINY, pos_encoding=enc))
        assert model.pos_encoding == enc and model.pos_enc.name == enc


# -- abs -----------------------------------------------------------------------------------
def test_abs_resampling_matches_bicubic_interpolation_and_is_used_on_larger_inputs():
    pe = torch.randn(1, 4 * 4, 8)
    out = resample_abs_pos_embed(pe, (4, 4), (6, 10))
    ref = (
        F.interpolate(
            pe.reshape(1, 4, 4, 8).permute(0, 3, 1, 2),
            size=(6, 10),
            mode='bicubic',
            align_corners=False,
        )
        .permute(0, 2, 3, 1)
        .reshape(1, 60, 8)
    )
    torch.testing.assert_close(out, ref)
    assert resample_abs_pos_embed(pe, (4, 4), (4, 4)) is pe
    enc = AbsolutePositionEncoding(8, (4, 4))
    x = torch.zeros(2, 60, 8)
    expected = resample_abs_pos_embed(enc.pos_embed, (4, 4), (6, 10))
    torch.testing.assert_close(enc.add_to_tokens(x, (6, 10)), expected.expand(2, -1, -1))
    with pytest.raises(ValueError, match='not \\(1, H\\*W, D\\)'):
        resample_abs_pos_embed(pe, (5, 4), (6, 6))


def test_abs_adapts_checkpoint_embeddings():
    enc = AbsolutePositionEncoding(8, (4, 4))
    same = torch.randn(1, 16, 8)
    out, cls_entry, note = enc.adapt_checkpoint_embedding(same)
    assert out is same and cls_entry is None and note == 'kept as is'
    with_cls = torch.randn(1, 1 + 64, 8)  # a timm ViT: CLS entry + an 8x8 grid
    out, cls_entry, note = enc.adapt_checkpoint_embedding(with_cls)
    torch.testing.assert_close(out, resample_abs_pos_embed(with_cls[:, 1:], (8, 8), (4, 4)))
    torch.testing.assert_close(cls_entry, with_cls[:, :1])
    assert 'split off its CLS entry' in note and 'resampled 8x8 -> 4x4' in note
    with pytest.raises(ValueError, match='neither'):
        enc.adapt_checkpoint_embedding(torch.randn(1, 7, 8))
    with pytest.raises(ValueError, match='channels'):
        enc.adapt_checkpoint_embedding(torch.randn(1, 16, 9))


def test_abs_uses_interpolate_mode():
    model = LookHereViT(**TINY, pos_encoding='abs', interpolate_mode='bilinear')
    x = torch.zeros(1, 36, 48)
    expected = resample_abs_pos_embed(model.pos_enc.pos_embed, (4, 4), (6, 6), 'bilinear')
    torch.testing.assert_close(model.pos_enc.add_to_tokens(x, (6, 6)), expected)


# -- RoPE ----------------------------------------------------------------------------------
@pytest.mark.parametrize('enc', ['rope2d', 'rope2d_mixed'])
def test_rope_logits_depend_only_on_the_offset(enc):
    """With the same query / key content at every patch, a RoPE logit is a function of the
    offset alone: shifting both patches leaves it unchanged (translation equivariance)."""
    torch.manual_seed(0)
    pe = build_position_encoding(enc, embed_dims=48, num_heads=12, depth=2, grid_size=(4, 4))
    h, w = 5, 6
    q = torch.randn(1, 12, 1, 4).expand(1, 12, h * w, 4)
    k = torch.randn(1, 12, 1, 4).expand(1, 12, h * w, 4)
    qr, kr = pe.rotate(q, k, 1, (h, w), cls_token=False)
    logits = (qr @ kr.transpose(-1, -2))[0]  # (heads, N, N)
    idx = lambda y, x: y * w + x  # noqa: E731
    torch.testing.assert_close(logits[:, idx(1, 1), idx(3, 4)], logits[:, idx(2, 2), idx(4, 5)])
    torch.testing.assert_close(logits[:, idx(0, 3), idx(1, 0)], logits[:, idx(3, 5), idx(4, 2)])
    assert not torch.allclose(logits[:, idx(1, 1), idx(3, 4)], logits[:, idx(3, 4), idx(1, 1)])
    # the CLS token (first) is not rotated
    qc, kc = pe.rotate(
        torch.cat([q[:, :, :1], q], 2), torch.cat([k[:, :, :1], k], 2), 1, (h, w), cls_token=True
    )
    torch.testing.assert_close(qc[:, :, 0], q[:, :, 0])
    torch.testing.assert_close(qc[:, :, 1:], qr)


def test_rope_frequencies():
    axial = AxialRoPE2d(head_dim=16, theta=100.0)
    torch.testing.assert_close(
        axial.frequencies(), torch.tensor([1.0, 100**-0.25, 0.1, 100**-0.75])
    )
    ang = axial.angles(0, (2, 3), torch.device('cpu'))[0]  # (6, 8)
    torch.testing.assert_close(ang[4, :4], 1.0 * axial.frequencies())  # patch (1, 1): x = 1
    torch.testing.assert_close(ang[5, :4], 2.0 * axial.frequencies())  # patch (1, 2): x = 2
    torch.testing.assert_close(ang[5, 4:], 1.0 * axial.frequencies())  # y = 1
    mixed = MixedRoPE2d(depth=2, num_heads=3, head_dim=8, theta=10.0)
    fx, fy = mixed.freqs.detach()
    # magnitudes theta^(-4i/d), each used at two orthogonal directions per head and layer
    torch.testing.assert_close(
        torch.hypot(fx, fy), torch.tensor([1.0, 10**-0.5] * 2).expand(2, 3, 4)
    )
    torch.testing.assert_close(
        (fx[..., :2] * fx[..., 2:] + fy[..., :2] * fy[..., 2:]),
        torch.zeros(2, 3, 2),
        atol=1e-6,
        rtol=0,
    )


# -- alibi2d / none --------------------------------------------------------------------------
def test_alibi2d_is_the_lookhere_engine_with_unrestricted_heads():
    model = tiny('alibi2d')
    cfg = model.lh_config
    assert cfg == LookHereConfig('none', 1.0, (1.5, 0.5))
    assert model.pos_enc.engine is model.lookhere
    bias = model.pos_enc.engine.dense_bias(0, (4, 5), False, torch.device('cpu'), torch.float32)
    assert torch.isfinite(bias).all()  # no direction masks
    torch.testing.assert_close(bias, bias.transpose(-1, -2))  # a distance: symmetric
    assert (bias <= 0).all() and (bias.diagonal(dim1=-2, dim2=-1) == 0).all()
    assert alibi2d_config(dict(global_slope=2.0)).global_slope == 2.0


def test_lookhere_bias_has_masks_alibi_does_not():
    lh = LookHereAttentionEngine(LookHereConfig('halves-none'), 1, 12)
    bias = lh.dense_bias(0, (3, 3), False, torch.device('cpu'), torch.float32)
    assert torch.isinf(bias).any()


def test_none_is_equivariant_to_permuting_patches():
    """Without position information, shuffling the image's patches shuffles the output the
    same way (CLS included: it sees the same set). The other encodings break this."""
    x = torch.randn(1, 3, 32, 32)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(0))
    patches = x.reshape(1, 3, 4, 8, 4, 8).permute(0, 2, 4, 1, 3, 5).reshape(1, 16, 3, 8, 8)
    shuffled = patches[:, perm].reshape(1, 4, 4, 3, 8, 8).permute(0, 3, 1, 4, 2, 5)
    shuffled = shuffled.reshape(1, 3, 32, 32)
    for enc in POS_ENCODINGS:
        model = tiny(enc).eval()
        with torch.no_grad():
            a = model(x)[0].flatten(2)[..., perm]
            b = model(shuffled)[0].flatten(2)
        if enc == 'none':
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
        else:
            assert not torch.allclose(a, b, atol=1e-3), enc


# -- weights -------------------------------------------------------------------------------
def _timm_file(tmp_path, grid: int = 8, cls_entry: bool = True):
    """A timm-style flat state_dict of this trunk with a ``pos_embed`` over ``grid x grid``."""
    sd = {
        k: v.clone()
        for k, v in tiny('lookhere', seed=1).state_dict().items()
        if k != '_extra_state'
    }  # a timm file: tensors only
    pos = torch.randn(1, int(cls_entry) + grid * grid, 48)
    sd['pos_embed'] = pos
    sd['head.weight'] = torch.randn(10, 48)
    path = tmp_path / 'timm_vit.pth'
    torch.save(sd, path)
    return str(path), sd, pos


def test_timm_pos_embed_is_kept_by_abs_and_dropped_by_the_others(tmp_path):
    path, sd, pos = _timm_file(tmp_path)
    model = LookHereViT(**TINY, pos_encoding='abs')
    report = model.load_pretrained(path, checkpoint_num_heads=12)  # not in a timm file
    assert 'pos_embed' not in report['dropped'] and report['missing'] == []
    expected = resample_abs_pos_embed(pos[:, 1:], (8, 8), (4, 4))
    torch.testing.assert_close(model.pos_enc.pos_embed.data, expected)
    # the CLS entry of pos_embed is folded into cls_token: the same CLS input as in timm
    torch.testing.assert_close(model.cls_token.data, sd['cls_token'] + pos[:, :1])
    torch.testing.assert_close(
        model.blocks[1].attn.qkv.weight.data, sd['blocks.1.attn.qkv.weight']
    )
    for enc in ('lookhere', 'rope2d', 'none'):
        report = LookHereViT(**TINY, pos_encoding=enc).load_pretrained(
            path, checkpoint_num_heads=12
        )
        assert 'pos_embed' in report['dropped'] and report['missing'] == []


def test_abs_round_trip_through_an_mmengine_checkpoint_of_another_size(tmp_path):
    src = tiny('abs', seed=3)
    path = tmp_path / 'seg.pth'
    torch.save(
        {'state_dict': {f'backbone.{k}': v for k, v in src.state_dict().items()}, 'meta': {}}, path
    )
    dst = LookHereViT(**{**TINY, 'img_size': 48}, pos_encoding='abs')
    dst.load_pretrained(str(path))
    torch.testing.assert_close(
        dst.pos_enc.pos_embed.data,
        resample_abs_pos_embed(src.pos_enc.pos_embed.data, (4, 4), (6, 6)),
    )


def test_saved_models_load_only_into_their_own_encoding(tmp_path):
    path = tmp_path / 'seg.pth'
    torch.save(
        {
            'state_dict': {f'backbone.{k}': v for k, v in tiny('alibi2d').state_dict().items()},
            'meta': {},
        },
        path,
    )
    alibi = LookHereViT(**TINY, pos_encoding='alibi2d', lh_config=dict(layer_slopes=[1, 1]))
    assert alibi.lh_config.layer_slopes == (1.0, 1.0)
    with pytest.raises(ValueError, match='conflicts with the one stored'):
        alibi.load_pretrained(str(path))  # explicit slopes vs the file's
    alibi = LookHereViT(**TINY, pos_encoding='alibi2d')
    alibi.load_pretrained(str(path))
    assert alibi.lh_config == tiny('alibi2d').lh_config
    # a pretrained trunk may move to another encoding (like timm weights), except that
    # LookHere models load only into 'lookhere' (official rule)
    lookhere = LookHereViT(**TINY, pos_encoding='lookhere')
    lookhere.load_pretrained(str(path))
    assert 'halves' in lookhere.lh_config.head_directions  # its own, not the file's
    path_lh = tmp_path / 'seg_lh.pth'
    torch.save(
        {
            'state_dict': {f'backbone.{k}': v for k, v in tiny('lookhere').state_dict().items()},
            'meta': {},
        },
        path_lh,
    )
    with pytest.raises(ValueError, match="holds a 'lookhere' model.*pos_encoding='lookhere'"):
        LookHereViT(**TINY, pos_encoding='alibi2d').load_pretrained(str(path_lh))


def test_abs_without_pos_embed_in_file_is_missing(tmp_path):
    path = tmp_path / 'no_pos.pth'
    sd = tiny('lookhere').state_dict()
    sd.pop('_extra_state')  # a timm-like file without pos_embed
    torch.save(sd, path)
    with pytest.raises(ValueError, match='pos_enc.pos_embed'):
        LookHereViT(**TINY, pos_encoding='abs').load_pretrained(str(path))


def test_official_lookhere_weights_load_only_into_lookhere(tmp_path):
    src = tiny('lookhere', seed=2)
    path = tmp_path / 'LH_tiny.pth'
    weights = {k: v for k, v in src.state_dict().items() if k != '_extra_state'}
    torch.save(
        {
            'weights': weights,
            'config': dict(
                head_directions='halves-none', global_slope=1.0, layer_slopes=[1.5, 0.5]
            ),
        },
        path,
    )
    for enc in POS_ENCODINGS:
        model = LookHereViT(**TINY, pos_encoding=enc)
        if enc == 'lookhere':
            model.load_pretrained(str(path))
            got = model.state_dict()
            assert (
                decode_extra_state(got.pop('_extra_state'))['lh_config']['head_directions']
                == 'halves-none'
            )
            torch.testing.assert_close(got, weights)
        else:
            with pytest.raises(
                ValueError,
                match="holds a 'lookhere' model.*loads only into pos_encoding='lookhere'",
            ):
                model.load_pretrained(str(path))


def test_default_lookhere_still_reproduces_the_official_model(official_tiny):
    io = official_tiny.io
    model = LookHereViT(
        img_size=io['model']['img_size'],
        **official_tiny.vit_kwargs,
        init_cfg=dict(type='Pretrained', checkpoint=str(official_tiny.path)),
    )
    model.init_weights()
    model.eval()
    for case in io['cases'].values():
        with torch.no_grad():
            out = model.forward_features(case['input'])
        torch.testing.assert_close(out, case['forward_features'], atol=1e-4, rtol=1e-4)


def test_timm_vit_with_cls_pos_entry_gives_the_same_block_input(tmp_path):
    """timm ViT: x = cat(cls_token, patches) + pos_embed. After loading, our embedding step
    (patches + pos_embed, then CLS with the folded entry) produces the same tokens."""
    path, sd, pos = _timm_file(tmp_path, grid=4)
    model = LookHereViT(**TINY, pos_encoding='abs')
    model.load_pretrained(path, checkpoint_num_heads=12)  # not in a timm file
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        tokens, _ = model._embed(x)
        patches = (
            F.conv2d(x, sd['patch_embed.proj.weight'], sd['patch_embed.proj.bias'], stride=8)
            .flatten(2)
            .transpose(1, 2)
        )
        timm_tokens = torch.cat([sd['cls_token'].expand(2, -1, -1), patches], 1) + pos
    torch.testing.assert_close(tokens, timm_tokens)
