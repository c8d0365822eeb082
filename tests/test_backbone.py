"""LookHereViT: official outputs, registries, output contract, caching, weights, errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lookhere_dense.checkpoint import decode_extra_state
from lookhere_dense.errors import ConfigError
from lookhere_dense.lookhere import vit as lv
from lookhere_dense.lookhere.pos_encoding import LookHerePositionEncoding, PositionEncoding
from lookhere_dense.models.backbones import LookHereViT

TINY = dict(embed_dims=96, num_layers=3, num_heads=12, init_values=0.1)


def tiny(**kwargs) -> LookHereViT:
    model = LookHereViT(**{**TINY, **kwargs})
    model.init_weights()
    return model.eval()


@pytest.fixture(scope='module')
def official(official_tiny):
    return official_tiny.path, official_tiny.io


# ----------------------------------------------------------------------------------------
# Official outputs
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('backend', ['auto', 'reference', 'chunked', 'flex'])
def test_reproduces_official_forward_features(official_tiny, backend):
    path, io = official_tiny.path, official_tiny.io
    model = LookHereViT(
        **official_tiny.vit_kwargs,
        attn_backend=backend,
        attn_block_size=5,
        init_cfg=dict(type='Pretrained', checkpoint=str(path)),
    )
    model.init_weights()
    model.eval()
    assert model.lh_config.head_directions == 'halves-none'
    for name in ('64x64', '128x96'):  # 128x96 extrapolates: grid 8x6 vs trained 4x4
        case = io['cases'][name]
        with torch.no_grad():
            feats = model.forward_features(case['input'])
        assert feats.shape == case['forward_features'].shape
        torch.testing.assert_close(feats, case['forward_features'], atol=1e-4, rtol=0, msg=name)
        # the NCHW output of the last block is the same tokens, reshaped
        model.output_cls_token = True
        with torch.no_grad():
            ((fmap, cls),) = model(case['input'])
        model.output_cls_token = False
        h, w = case['input'].shape[-2] // 16, case['input'].shape[-1] // 16
        torch.testing.assert_close(cls, case['forward_features'][:, 0], atol=1e-4, rtol=0)
        torch.testing.assert_close(
            fmap.flatten(2).transpose(1, 2), case['forward_features'][:, 1:], atol=1e-4, rtol=0
        )
        assert fmap.shape[-2:] == (h, w)


def test_official_bias_rounding_is_reproduced(official):
    """The official code rounds the bias to bfloat16; doing the same (the default) brings
    our features an order of magnitude closer than keeping full precision."""
    path, io = official
    case = io['cases']['128x96']
    errors = {}
    for rounding in ('bfloat16', 'none'):
        model = tiny(
            lh_config=dict(bias_rounding=rounding),
            init_cfg=dict(type='Pretrained', checkpoint=str(path)),
        )
        with torch.no_grad():
            feats = model.forward_features(case['input'])
        errors[rounding] = (feats - case['forward_features']).abs().max().item()
    assert errors['bfloat16'] * 5 < errors['none'], errors


# ----------------------------------------------------------------------------------------
# Registries
# ----------------------------------------------------------------------------------------
def test_registered_in_mmseg_and_mmdet():
    from mmdet.registry import MODELS as DET
    from mmseg.registry import MODELS as SEG

    for registry in (SEG, DET):
        model = registry.build(dict(type='LookHereViT', **TINY, preset='lh90'))
        assert isinstance(model, LookHereViT)
        assert model.lh_config.head_directions == 'corners-none'


def test_custom_imports_in_a_fresh_interpreter(tmp_path: Path, repo_root: Path):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(
        textwrap.dedent("""
        custom_imports = dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)
        backbone = dict(type='LookHereViT', embed_dims=48, num_layers=2, num_heads=12,
                        out_indices=(0, 1), preset='lh45')
    """)
    )
    script = textwrap.dedent(f"""
        import sys, torch
        from mmengine.config import Config
        assert 'lookhere_dense' not in sys.modules
        cfg = Config.fromfile({str(cfg)!r})
        from mmseg.registry import MODELS
        m = MODELS.build(cfg.backbone)
        outs = m(torch.randn(1, 3, 40, 72))
        print(type(m).__name__, [tuple(o.shape) for o in outs])
    """)
    res = subprocess.run(
        [sys.executable, '-c', script], cwd=repo_root, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert 'LookHereViT [(1, 48, 3, 5), (1, 48, 3, 5)]' in res.stdout


# ----------------------------------------------------------------------------------------
# Output contract (mmseg VisionTransformer's)
# ----------------------------------------------------------------------------------------
def test_outputs_follow_out_indices_and_pad_like_mmseg():
    model = tiny(out_indices=(0, -1), out_origin=True)
    outs = model(torch.randn(2, 3, 50, 33))  # pads to 64 x 48 (corner)
    assert [tuple(o.shape) for o in outs] == [(2, 96, 4, 3)] * 3
    assert model.out_indices == [0, 2]


def test_output_cls_token_and_no_cls_token():
    outs = tiny(output_cls_token=True, out_indices=[1, 2])(torch.randn(1, 3, 32, 48))
    assert all(
        isinstance(o, list) and o[0].shape == (1, 96, 2, 3) and o[1].shape == (1, 96) for o in outs
    )
    model = tiny(with_cls_token=False)
    assert not hasattr(model, 'cls_token')
    assert model(torch.randn(1, 3, 32, 48))[0].shape == (1, 96, 2, 3)
    with pytest.raises(ValueError, match='output_cls_token=True needs with_cls_token=True'):
        tiny(with_cls_token=False, output_cls_token=True)


def test_same_padding_centres_the_image():
    corner, same = tiny(), tiny(patch_pad='same')
    same.load_state_dict(corner.state_dict())
    x = torch.randn(1, 3, 40, 40)  # 8 px of padding: corner 0+8, same 4+4
    shifted = torch.nn.functional.pad(x, (4, 4, 4, 4))
    torch.testing.assert_close(same(x)[0], corner(shifted)[0])


def test_mmseg_vit_arguments_are_accepted(recwarn):
    lv._warned.discard('interpolate_mode')
    model = tiny(
        img_size=(512, 1024),
        patch_pad='corner',
        in_channels=3,
        mlp_ratio=4,
        qkv_bias=True,
        drop_rate=0.1,
        attn_drop_rate=0.1,
        drop_path_rate=0.1,
        norm_cfg=dict(type='LN', eps=1e-6),
        act_cfg=dict(type='GELU'),
        patch_norm=True,
        patch_bias=True,
        pre_norm=True,
        final_norm=True,
        interpolate_mode='bicubic',
        num_fcs=2,
        norm_eval=True,
        with_cp=False,
    )
    tiny(interpolate_mode='bilinear')  # second time: no new warning
    msgs = [str(w.message) for w in recwarn if 'interpolate_mode' in str(w.message)]
    assert len(msgs) == 1 and 'ignores interpolate_mode' in msgs[0]
    model.train()
    assert not model.blocks[0].norm1.training  # norm_eval
    assert model(torch.randn(1, 3, 32, 32))[0].shape == (1, 96, 2, 2)


def test_frozen_exclude_and_with_cp():
    model = tiny(frozen_exclude=['blocks.2', 'norm.'])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(('blocks.2', 'norm.')) for n in trainable)

    plain, cp = tiny(), tiny(with_cp=True)
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 48, 32)
    grads = []
    for model in (plain, cp):
        model.train()
        model.zero_grad()
        model(x)[0].square().mean().backward()
        grads.append(model.blocks[0].attn.qkv.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_bf16_autocast_has_no_nan():
    model = tiny(preset='lh45')
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = model(torch.randn(1, 3, 64, 96))[0]
    assert torch.isfinite(out).all()
    assert {key[-1] for key in model.pos_enc.engine.dense.keys()} == {torch.bfloat16}


# ----------------------------------------------------------------------------------------
# Bias caching
# ----------------------------------------------------------------------------------------
def test_bias_is_built_once_per_grid_and_not_in_state_dict():
    model = tiny()
    engine = model.pos_enc.engine
    x = torch.randn(1, 3, 64, 48)
    model(x)
    model(x)
    assert engine.tables.misses == 1 and engine.tables.hits >= 1
    assert engine.dense.misses == 3  # one per layer, then reused
    model(torch.randn(1, 3, 32, 32))  # a new grid: new entries
    assert engine.tables.misses == 2
    # no bias tensor in the state_dict: parameters, plus the config as plain data
    sd = model.state_dict()
    assert set(sd) == {name for name, _ in model.named_parameters()} | {'_extra_state'}
    assert decode_extra_state(sd['_extra_state'])['pos_encoding'] == 'lookhere'


def test_bias_cache_is_bounded():
    model = tiny(num_layers=1, embed_dims=24)
    for size in range(16, 16 * 12, 16):
        model(torch.randn(1, 3, size, 16))
    engine = model.pos_enc.engine
    assert len(engine.tables) <= engine.tables.maxsize


# ----------------------------------------------------------------------------------------
# One owner of the position encoding
# ----------------------------------------------------------------------------------------
class CountingEncoding(PositionEncoding):
    """Plain attention that records which layers asked it for attention."""

    name = 'none'

    def __init__(self):
        super().__init__()
        self.layers = []

    def forward(self, q, k, v, layer, grid_size, cls_token, dropout_p=0.0):
        self.layers.append(layer)
        return super().forward(q, k, v, layer, grid_size, cls_token, dropout_p)


def test_pos_enc_is_the_one_owner_of_the_engine():
    model = tiny(preset='lh90')
    engine = model.pos_enc.engine
    assert isinstance(model.pos_enc, LookHerePositionEncoding)
    # no attribute of the backbone or its blocks holds the engine besides pos_enc
    holders = [
        f'{name}.{key}'
        for name, module in model.named_modules()
        for key, value in vars(module).items()
        if value is engine
    ]
    assert holders == ['pos_enc.engine']
    assert model.lookhere is engine and model.lh_config is engine.config
    assert model.pos_encoding == model.pos_enc.name == 'lookhere'
    # a new owner is what forward uses, in every block
    model.pos_enc = CountingEncoding()
    model(torch.randn(1, 3, 32, 32))
    assert model.pos_enc.layers == [0, 1, 2]
    assert model.lookhere is None and model.lh_config is None and model.pos_encoding == 'none'
    with pytest.raises(AttributeError):  # read-only: pos_enc is the one owner
        model.lookhere = engine


def test_adopting_a_checkpoint_config_resets_the_engine_of_the_owner():
    source = tiny(preset='lh90')
    model = tiny()
    engine = model.pos_enc.engine
    model(torch.randn(1, 3, 32, 32))
    assert len(engine.tables) == 1
    model.load_state_dict(source.state_dict())
    assert model.pos_enc.engine is engine  # the same engine, reset
    assert engine.config == source.lh_config and len(engine.tables) == 0


# ----------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------
def _timm_vit(tmp_path: Path, layerscale: bool, deit3_names: bool = False) -> Path:
    import timm

    vit = timm.create_model(
        'vit_tiny_patch16_224',
        pretrained=False,
        num_classes=7,
        embed_dim=96,
        depth=3,
        num_heads=12,
        init_values=0.5 if layerscale else None,
    )
    sd = vit.state_dict()
    if deit3_names:  # the original DeiT-III repository's names
        sd = {
            k.replace('.ls1.gamma', '.gamma_1').replace('.ls2.gamma', '.gamma_2'): v
            for k, v in sd.items()
        }
    path = tmp_path / 'timm_vit.pth'
    torch.save({'model': sd} if deit3_names else sd, path)
    return path


@pytest.mark.parametrize('deit3_names', [False, True])
def test_loads_timm_and_deit3_weights(tmp_path: Path, deit3_names: bool):
    path = _timm_vit(tmp_path, layerscale=True, deit3_names=deit3_names)
    # a timm file does not record its head count, and 96 channels are no multiple of the
    # usual head width 64: the head count is stated
    model = tiny(init_cfg=dict(type='Pretrained', checkpoint=str(path), checkpoint_num_heads=12))
    report = model.load_pretrained(str(path), checkpoint_num_heads=12)
    assert 'pos_embed' in report['dropped'] and 'head.weight' in report['dropped']
    assert report['missing'] == [] and report['unexpected'] == []
    sd = torch.load(path, weights_only=True)
    sd = sd.get('model', sd)
    key = 'blocks.1.gamma_1' if deit3_names else 'blocks.1.ls1.gamma'
    torch.testing.assert_close(model.blocks[1].ls1.gamma, sd[key])
    torch.testing.assert_close(model.blocks[2].attn.qkv.weight, sd['blocks.2.attn.qkv.weight'])


@pytest.mark.parametrize('off', [None, 0, 0.0])
def test_timm_weights_without_layerscale_need_init_values_none(tmp_path: Path, off):
    path = _timm_vit(tmp_path, layerscale=False)
    with pytest.raises(
        ValueError,
        match=r'lacks backbone parameters \(no LayerScale.*'
        r'init_values=None\).*blocks.0.ls1.gamma',
    ) as err:
        tiny(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    # strict=False would run the file's blocks at LayerScale 0.1: not offered
    assert 'loads what fits' not in str(err.value)
    assert 'not strict=False: the 6 LayerScale gammas the file lacks' in str(err.value)
    # None, or 0 as in timm's ViT (a LayerScale at 0 would silence every branch)
    model = tiny(
        init_values=off,
        init_cfg=dict(type='Pretrained', checkpoint=str(path), checkpoint_num_heads=12),
    )
    assert isinstance(model.blocks[0].ls1, torch.nn.Identity)
    assert isinstance(model.blocks[2].ls2, torch.nn.Identity)


def _convert(repo_root: Path, src, dst, *args: str) -> subprocess.CompletedProcess:
    """``python tools/convert_checkpoint.py SRC DST ARGS...`` from the repository root."""
    return subprocess.run(
        [sys.executable, 'tools/convert_checkpoint.py', str(src), str(dst), *args],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _mmseg_vit(tmp_path: Path, **kwargs):
    """An mmseg ``VisionTransformer`` with random weights, and its state_dict saved as a
    file (mmseg's names: ``layers.{i}.attn.attn.in_proj_weight``, ``ln1``, ...)."""
    from mmseg.models.backbones import VisionTransformer

    torch.manual_seed(0)
    args = dict(img_size=64, embed_dims=192, num_layers=2, num_heads=3, out_indices=(0, 1))
    args.update(kwargs)
    src = VisionTransformer(**args)
    for p in src.parameters():  # not the init's zeros and ones: every tensor matters
        p.data.normal_(0, 0.05)
    path = tmp_path / 'mmseg_vit.pth'
    torch.save(src.state_dict(), path)
    src.eval()  # mmseg's VisionTransformer.train() returns None
    return src, path, args


@pytest.mark.parametrize(
    'arch',
    [
        dict(final_norm=True, patch_bias=True),
        dict(final_norm=False, pre_norm=True, patch_bias=False),
    ],
)
def test_an_mmseg_vit_file_gives_the_mmseg_vits_features(tmp_path: Path, arch):
    """A file in mmseg VisionTransformer's names (what mmseg's vit2mmseg.py writes, and
    its model zoo's ViT pretraining files) is renamed back when it loads: with the same
    absolute position embedding the LookHere trunk gives mmseg's features."""
    src, path, args = _mmseg_vit(tmp_path, **arch)
    model = LookHereViT(
        **args,
        pos_encoding='abs',
        init_values=None,
        init_cfg=dict(type='Pretrained', checkpoint=str(path)),
    )
    model.init_weights()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        for want, got in zip(src(x), model.eval()(x)):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_convert_checkpoint_renames_an_mmseg_vit_file(tmp_path: Path, repo_root: Path):
    _, path, args = _mmseg_vit(
        tmp_path, final_norm=True, patch_bias=True, embed_dims=384, num_heads=6
    )
    out = tmp_path / 'converted.pth'
    res = _convert(repo_root, path, out)
    assert res.returncode == 0, res.stderr
    assert 'mmseg format, 29 tensors' in res.stdout and '2 blocks' in res.stdout
    keys = torch.load(out, weights_only=True)['state_dict']
    assert 'blocks.1.mlp.fc1.weight' in keys and 'norm.weight' in keys
    assert not any(k.startswith('layers.') for k in keys)
    report = LookHereViT(**args, init_values=None).load_pretrained(str(out))
    assert report['missing'] == [] and report['unexpected'] == []


def test_a_file_without_blocks_is_refused_by_the_converter(tmp_path: Path, repo_root: Path):
    path = tmp_path / 'stem.pth'
    torch.save({'patch_embed.proj.weight': torch.zeros(8, 3, 16, 16)}, path)
    res = _convert(repo_root, path, tmp_path / 'o.pth')
    assert res.returncode == 2 and 'no transformer blocks (blocks.N.*)' in res.stderr, res.stderr
    assert not (tmp_path / 'o.pth').exists()


def test_a_file_in_another_mmseg_backbones_names_gets_one_hint(tmp_path: Path):
    """BEiT's mmseg names (layers.*, but not VisionTransformer's) are not renamed: the
    refusal names the layout, not qkv_bias / final_norm / LayerScale flags that the names
    alone seem to differ in."""
    from mmseg.models.backbones import BEiT

    path = tmp_path / 'beit.pth'
    torch.save(BEiT(img_size=64, embed_dims=96, num_layers=3, num_heads=12).state_dict(), path)
    with pytest.raises(ValueError) as err:
        tiny(init_cfg=dict(type='Pretrained', checkpoint=str(path), checkpoint_num_heads=12))
    msg = str(err.value)
    assert "uses mmseg's backbone names (layers.*)" in msg and '(BEiT, MAE)' in msg
    assert 'qkv_bias' not in msg and 'init_values' not in msg and 'final_norm' not in msg


def test_init_cfg_prefix_picks_the_tensors_under_it(tmp_path: Path):
    """``prefix`` (mmengine's ``Pretrained`` key) was accepted and ignored: a distillation
    run's ``student.backbone.*`` was refused, ``prefix='decode_head.'`` loaded the
    backbone anyway."""
    from lookhere_dense.errors import CheckpointError

    source = tiny()
    torch.nn.init.normal_(source.cls_token)
    path = tmp_path / 'distill.pth'
    state = {f'student.backbone.{k}': v for k, v in source.state_dict().items()}
    state.update(
        {f'teacher.backbone.{k}': torch.zeros_like(v) for k, v in source.state_dict().items()}
    )
    state['decode_head.conv_seg.weight'] = torch.zeros(2, 96, 1, 1)
    torch.save({'state_dict': state}, path)
    for prefix in ('student.backbone.', 'student.backbone'):  # mmengine adds the dot
        model = tiny(init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix=prefix))
        assert torch.equal(model.cls_token, source.cls_token)
    with pytest.raises(
        CheckpointError,
        match=r"prefix='head\.': no tensor of .*distill\.pth' has a key starting with it",
    ):
        tiny(init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix='head.'))
    with pytest.raises(ValueError, match='no ViT backbone weights'):
        tiny(init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix='decode_head.'))


def test_a_listed_pretrained_init_cfg_loads_strictly_after_the_others(tmp_path: Path):
    """``init_cfg=[dict(type='Pretrained', ...), dict(type='Constant', ...)]`` (mmengine's
    list form) went through mmengine's loader: a file of another model loaded what fit and
    warned. The ``Pretrained`` entry loads strictly, after the other initialisers (as
    mmengine orders them); two of them are refused."""
    from lookhere_dense.errors import ConfigError

    source = tiny()
    torch.nn.init.normal_(source.cls_token)
    path = tmp_path / 'same.pth'
    torch.save({'state_dict': source.state_dict()}, path)
    other = tmp_path / 'other.pth'  # a file of another model: it loaded nothing, silently
    torch.save({'state_dict': {'foo.weight': torch.zeros(3)}}, other)
    constant = dict(type='Constant', layer='LayerNorm', val=3.0, bias=0.0)
    with pytest.raises(ValueError, match='checkpoint has no ViT backbone weights'):
        tiny(init_cfg=[dict(type='Pretrained', checkpoint=str(other)), constant])
    model = tiny(init_cfg=[constant, dict(type='Pretrained', checkpoint=str(path))])
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    # no Pretrained entry: mmengine's initialisers alone
    assert torch.all(tiny(init_cfg=[constant]).blocks[0].norm1.weight == 3.0)
    with pytest.raises(ConfigError, match='init_cfg has 2 Pretrained entries'):
        tiny(init_cfg=[dict(type='Pretrained', checkpoint=str(p)) for p in (path, other)])


def test_wrong_shapes_and_missing_files_are_named(tmp_path: Path):
    other = LookHereViT(embed_dims=48, num_layers=3, num_heads=12)
    path = tmp_path / 'small.pth'
    torch.save({'state_dict': other.state_dict()}, path)
    with pytest.raises(
        ValueError,
        match=r'(?s)\(the file is a ViT of width 48 with 16x16 patches of 3 channels, the model '
        r'of width 96 with 16x16 patches of 3 channels; 47 tensors of the wrong shape.*'
        r'patch_embed.proj.weight: checkpoint \(48, 3, 16, 16\) vs model '
        r'\(96, 3, 16, 16\).*and 37 more',
    ):
        tiny(init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with pytest.raises(FileNotFoundError, match='checkpoint file not found'):
        tiny(init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'nope.pth')))
    torch.save({'state_dict': {'foo': torch.zeros(1)}}, path)
    with pytest.raises(ValueError, match='no ViT backbone weights'):
        tiny(init_cfg=dict(type='Pretrained', checkpoint=str(path)))


def test_checkpoint_config_conflicts_with_explicit_one(official):
    """A CheckpointError, so the tools print it as one ``error:`` line (a plain ValueError
    was a 43-line traceback from the Runner's init_weights)."""
    from lookhere_dense.errors import CheckpointError

    path, _ = official
    with pytest.raises(
        CheckpointError,
        match=r'conflicts with the one stored.*head_directions: '
        r"'corners-none' != 'halves-none'",
    ):
        tiny(preset='lh90', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    model = tiny(preset='lh180', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    assert model.lh_config.head_directions == 'halves-none'


def test_stored_config_must_fit_the_backbone(tmp_path: Path):
    from lookhere_dense.lookhere.weights import save_backbone_checkpoint

    path = tmp_path / 'lh45.pth'
    save_backbone_checkpoint(
        str(path),
        tiny(num_heads=6).state_dict(),
        dict(head_directions='eighths1-eighths2-none', global_slope=1.0, layer_slopes=[2.0, 0.5]),
        source='test',
    )
    with pytest.raises(
        ValueError,
        match=r'stored in .* does not fit this backbone.*'
        r'does not fit num_heads=6',
    ):
        tiny(num_heads=6, init_cfg=dict(type='Pretrained', checkpoint=str(path)))


def test_convert_checkpoint_cli_round_trip(official, tmp_path: Path, repo_root: Path):
    path, io = official
    out = tmp_path / 'converted.pth'
    res = _convert(repo_root, path, out)
    assert res.returncode == 0, res.stderr
    assert 'official format, 47 tensors' in res.stdout and 'head.fc1.weight' in res.stdout
    model = tiny(init_cfg=dict(type='Pretrained', checkpoint=str(out)))
    assert model.lh_config.head_directions == 'halves-none'
    case = io['cases']['64x64']
    with torch.no_grad():
        feats = model.forward_features(case['input'])
    torch.testing.assert_close(feats, case['forward_features'], atol=1e-4, rtol=0)
    res = subprocess.run(
        [sys.executable, 'tools/convert_checkpoint.py', 'missing.pth', str(out)],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2 and 'checkpoint file not found' in res.stderr


def test_converted_files_record_the_head_count(official, tmp_path: Path):
    """tools/convert_checkpoint.py writes the head count: official files 12, a saved
    LookHereViT its own, ``--num-heads`` for files that do not record it (refused when it
    contradicts a recorded one); loading then checks it."""
    from tiny_seg import run_tools

    from lookhere_dense.errors import CheckpointError

    path, _ = official
    six = tiny(num_heads=6)  # lh180 fits 6 heads
    whole = tmp_path / 'iter_1.pth'
    torch.save(
        {'meta': {}, 'state_dict': {f'backbone.{k}': v for k, v in six.state_dict().items()}},
        whole,
    )
    flat = tmp_path / 'flat.pth'  # 96 channels: no head-width convention applies
    torch.save({k: v for k, v in six.state_dict().items() if k != '_extra_state'}, flat)
    outs = [tmp_path / f'{name}.pth' for name in ('official', 'six', 'flat_out', 'wrong')]
    res = run_tools(
        [
            ('convert_checkpoint', [str(path), str(outs[0])]),
            ('convert_checkpoint', [str(whole), str(outs[1])]),
            ('convert_checkpoint', [str(flat), str(outs[2]), '--num-heads', '6']),
            ('convert_checkpoint', [str(whole), str(outs[3]), '--num-heads', '12']),
        ]
    )
    assert [r['rc'] for r in res] == [0, 0, 0, 2], res
    assert [torch.load(p, weights_only=True)['meta']['num_heads'] for p in outs[:3]] == [12, 6, 6]
    assert 'heads: 12 (official LookHere file' in res[0]['stdout']
    assert 'heads: 6 (recorded in the file)' in res[1]['stdout']
    assert f'error: --num-heads 12, but {str(whole)!r} records 6 heads' in res[3]['stderr']
    assert not outs[3].exists()
    with pytest.raises(
        CheckpointError,
        match=r'has 6 attention heads per block \(recorded in '
        r'the file\).*num_heads=12',
    ):
        tiny(init_cfg=dict(type='Pretrained', checkpoint=str(outs[1])))
    model = tiny(num_heads=6, init_cfg=dict(type='Pretrained', checkpoint=str(outs[2])))
    torch.testing.assert_close(model.blocks[2].attn.qkv.weight, six.blocks[2].attn.qkv.weight)


#: Runs tools/convert_checkpoint.py (argv after ``-c``) with mmengine unimportable, as on a
#: machine that has torch alone.
_WITHOUT_MMENGINE = """
import runpy, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('mmcv', 'mmengine', 'mmseg', 'mmdet'):
            raise ModuleNotFoundError(f'blocked for this test: {name}', name=name)
sys.meta_path.insert(0, Blocked())
sys.argv = ['tools/convert_checkpoint.py', *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name='__main__')
"""


def test_convert_checkpoint_reads_a_training_runs_checkpoint(tmp_path: Path, repo_root: Path):
    """A Runner checkpoint (``WORK_DIR/iter_N.pth``: weights, plus the message hub's
    ``HistoryBuffer`` objects and the numpy arrays in them) converts from the command line
    as it is: the tool allows mmengine's classes itself. Without mmengine the error says
    what is needed, not to call a Python function."""
    from mmengine.logging import HistoryBuffer, MessageHub
    from tiny_seg import run_tools

    six = tiny(num_heads=6)
    hub = MessageHub.get_instance('test_convert_checkpoint_runner_file')
    for step in range(3):
        hub.update_scalar('train/loss', 1.0 / (step + 1))
        hub.update_scalar('train/lr', 1e-4)
    hub.update_info('iter', 3)
    hub_state = hub.state_dict()
    assert isinstance(hub_state['log_scalars']['train/loss'], HistoryBuffer)
    src = tmp_path / 'work_dir' / 'iter_3.pth'
    src.parent.mkdir()
    torch.save(
        {
            'meta': {'epoch': 0, 'iter': 3, 'seed': 0, 'experiment_name': 'tiny'},
            'state_dict': {f'backbone.{k}': v for k, v in six.state_dict().items()},
            'message_hub': hub_state,
        },
        src,
    )
    out = tmp_path / 'backbone.pth'
    (conv,) = run_tools([('convert_checkpoint', [str(src), str(out)])])  # a fresh process
    assert conv['rc'] == 0, conv['stderr']
    assert 'heads: 6 (recorded in the file)' in conv['stdout'] and f'wrote {out}' in conv['stdout']
    model = tiny(num_heads=6, init_cfg=dict(type='Pretrained', checkpoint=str(out)))
    for name, value in six.state_dict().items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(model.state_dict()[name], value, atol=0, rtol=0)
    res = subprocess.run(
        [sys.executable, '-c', _WITHOUT_MMENGINE, str(src), str(tmp_path / 'no.pth')],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stderr
    assert 'an mmengine Runner checkpoint, which only reads with mmengine installed' in res.stderr
    assert 'register_all_modules' not in res.stderr and 'Traceback' not in res.stderr
    assert not (tmp_path / 'no.pth').exists()


def test_the_record_is_a_tensor_and_old_dict_records_still_load(tmp_path: Path):
    """``_extra_state`` is a uint8 tensor of JSON (mmengine broadcasts every state_dict
    entry); the dict that older files hold is read with the same checks."""
    from mmengine.runner import load_checkpoint

    from lookhere_dense.lookhere.loading import load_model_weights

    source = tiny(preset='lh45')
    sd = source.state_dict()
    assert all(isinstance(v, torch.Tensor) for v in sd.values())
    assert sd['_extra_state'].dtype == torch.uint8 and sd['_extra_state'].dim() == 1
    assert decode_extra_state(sd['_extra_state']) == source.record()
    assert source.record()['lh_config']['head_directions'] == 'eighths1-eighths2-none'
    old = dict(sd, _extra_state=source.record())  # a file of the dict era
    model = tiny()
    model.load_state_dict(old)
    assert model.lh_config == source.lh_config
    path = tmp_path / 'old.pth'
    torch.save({'meta': {}, 'state_dict': old}, path)
    model = tiny()
    load_model_weights(model, str(path))  # tools/test.py, infer, resume
    assert model.lh_config == source.lh_config
    model = tiny()
    load_checkpoint(model, str(path), logger='silent')  # mmengine's own load_from
    assert model.lh_config == source.lh_config
    x = torch.randn(1, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], source(x)[0])
    # the checks of the record apply to both forms
    rope = tiny(pos_encoding='rope2d')
    for record in (rope.get_extra_state(), rope.record()):
        with pytest.raises(ValueError, match=r"trained with pos_encoding='rope2d'"):
            tiny().load_state_dict(dict(rope.state_dict(), _extra_state=record))
    with pytest.raises(
        ValueError,
        match=r"has an '_extra_state' entry that is not a "
        r'LookHereViT record \(a torch.float32 tensor',
    ):
        tiny().load_state_dict(dict(sd, _extra_state=torch.zeros(3)))


def test_loads_whole_model_mmengine_checkpoints(tmp_path: Path):
    source = tiny(preset='lh45')
    path = tmp_path / 'segmentor.pth'
    torch.save(
        {
            'meta': {},
            'state_dict': {
                **{f'backbone.{k}': v for k, v in source.state_dict().items()},
                'decode_head.conv_seg.weight': torch.zeros(3, 96, 1, 1),
            },
        },
        path,
    )
    model = tiny(preset='lh45', init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    want = source.state_dict()
    got = model.state_dict()
    assert decode_extra_state(got.pop('_extra_state')) == decode_extra_state(
        want.pop('_extra_state')
    )  # the config came along
    torch.testing.assert_close(got, want)


def test_mmengine_checkpoints_with_message_hub_load_under_weights_only(tmp_path: Path):
    """compat: mmengine's own checkpoints (HistoryBuffer, numpy) load with weights_only."""
    import numpy as np
    from mmengine.logging.history_buffer import HistoryBuffer
    from mmengine.runner.checkpoint import CheckpointLoader

    buf = HistoryBuffer()
    buf.update(np.float64(1.5))
    path = tmp_path / 'epoch_1.pth'
    torch.save(
        {
            'state_dict': {'w': torch.ones(2)},
            'message_hub': {'loss': buf},
            'meta': {'dtype': np.dtype('float32'), 'arr': np.arange(3)},
        },
        path,
    )
    ckpt = CheckpointLoader.load_checkpoint(str(path), map_location='cpu')
    assert ckpt['message_hub']['loss'].current() == 1.5
    assert torch.load(path, weights_only=True)['meta']['arr'].tolist() == [0, 1, 2]


# ----------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'kwargs,error,match',
    [
        (dict(preset='lh60'), ValueError, r"unknown LookHere preset 'lh60'"),
        (dict(num_heads=8, embed_dims=96), ValueError, r"'halves-none'.*does not fit num_heads=8"),
        (dict(embed_dims=100), ValueError, r'embed_dims=100 is not divisible by num_heads=12'),
        (
            dict(lh_config=dict(head_directions='quarters-none')),
            ValueError,
            r"unknown LookHere direction type 'quarters'",
        ),
        (dict(out_indices=(5,)), ValueError, r'out_indices=\(5,\): 5 out of range'),
        (  # the value as written, not the converted -1; a ConfigError: one error line
            dict(num_layers=2, out_indices=(-3,)),
            ConfigError,
            r'out_indices=\(-3,\): -3 out of range for num_layers=2 '
            r'\(blocks 0\.\.1, or -2\.\.-1 counted from the last\)',
        ),
        (  # the outputs come in block order: a head's in_index=0 got block 0, not 3
            dict(num_layers=4, out_indices=(3, 0)),
            ConfigError,
            r'out_indices=\(3, 0\): the outputs come once per block, in block order \(0, 3\).*'
            r'give out_indices=\(0, 3\)',
        ),
        (dict(num_layers=4, out_indices=(2, -2)), ConfigError, r'give out_indices=\(2,\)'),
        (dict(attn_backend='fast'), ValueError, r"unknown LookHere attention backend 'fast'"),
        (dict(num_fcs=3), ValueError, r'num_fcs=2 only'),
        (  # a stock mmseg base config's model.pretrained beside the user's init_cfg
            dict(pretrained='vit.pth', init_cfg=dict(type='Pretrained', checkpoint='lh.pth')),
            ConfigError,
            r"pretrained='vit\.pth' and init_cfg=.*'lh\.pth'.*--cfg-options model\.pretrained=None",
        ),
        (dict(patch_pad='reflect'), ValueError, r"patch_pad must be 'corner' or 'same'"),
        (dict(window_block_indexes=[0]), ValueError, r'need window_size > 0'),
        (  # refused when built, not at forward ("expected 4D input (got 3D input)")
            dict(norm_cfg=dict(type='BN')),
            ConfigError,
            r"norm_cfg=\{'type': 'BN'\}: it builds BatchNorm2d, which normalises \(B, C, \.\.\.\) "
            r"maps, not the \(B, N, C\) token sequences .*; accepted: .*dict\(type='LN'\)",
        ),
        (
            dict(norm_cfg=dict(type='GN', num_groups=4)),
            ConfigError,
            r'it builds GroupNorm, which normalises',
        ),
        (  # wants maps: fails the (B, N, C) probe
            dict(norm_cfg=dict(type='LN2d')),
            ConfigError,
            r'LayerNorm2d does not take \(B, N, C\) tokens',
        ),
        (dict(norm_cfg=dict(type='Norm')), ConfigError, r"'Norm' is not a layer type mmcv knows"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        LookHereViT(**{**TINY, **kwargs})


@pytest.mark.parametrize(
    'norm_cfg',
    [
        dict(type='LN', eps=1e-6),
        dict(type=torch.nn.LayerNorm),
        dict(type='LN', elementwise_affine=False),
        dict(type='LN', bias=False),
        dict(type=torch.nn.RMSNorm),  # a token norm that is no LayerNorm
    ],
)
def test_layer_norm_configs_build_initialise_and_run(norm_cfg):
    model = tiny(norm_cfg=norm_cfg)  # init_weights leaves weight / bias None alone
    assert isinstance(model.norm, (torch.nn.LayerNorm, torch.nn.RMSNorm))
    out = model(torch.randn(1, 3, 32, 48))
    assert out[0].shape == (1, 96, 2, 3) and torch.isfinite(out[0]).all()


def test_bad_inputs():
    model = tiny()
    with pytest.raises(ValueError, match=r'image of 12x40 px is smaller than one 16x16 patch'):
        model(torch.randn(1, 3, 12, 40))
    with pytest.raises(ValueError, match=r'built for 3 input channels, got 1'):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match=r'expects images of shape \(B, C, H, W\)'):
        model(torch.randn(3, 32, 32))


def test_drop_in_for_mmseg_vit_in_a_shipped_config():
    """mmseg's own Segmenter config with only the backbone type changed trains a step."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.structures import PixelData
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample

    init_default_scope('mmseg')
    import mmseg

    cfg = Config.fromfile(
        Path(mmseg.__file__).parent / '.mim/configs/segmenter/'
        'segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py'
    )
    backbone = cfg.model.backbone
    # every other argument as shipped, except heads: ViT-T's 3 heads fit no LookHere layout
    backbone.update(type='LookHereViT', num_layers=2, num_heads=6, init_cfg=None)
    cfg.model.pretrained = None  # the shipped URL needs the internet
    cfg.model.decode_head.update(num_layers=1, num_classes=5)
    cfg.model.data_preprocessor.size = (64, 64)
    model = MODELS.build(cfg.model)
    model.init_weights()
    samples = []
    for _ in range(2):
        s = SegDataSample(
            metainfo=dict(img_shape=(64, 64), ori_shape=(64, 64), pad_shape=(64, 64))
        )
        s.gt_sem_seg = PixelData(data=torch.randint(0, 5, (1, 64, 64)))
        samples.append(s)
    losses = model.loss(torch.randn(2, 3, 64, 64), samples)
    loss = sum(v for k, v in losses.items() if 'loss' in k)
    loss.backward()
    assert torch.isfinite(loss)
    assert model.backbone.blocks[0].attn.qkv.weight.grad is not None


@pytest.mark.parametrize(
    'layers,windowed',
    [
        (12, [0, 1, 3, 4, 6, 7, 9, 10]),  # ViTDet-B: global 2, 5, 8, 11
        (24, [i for i in range(24) if i not in (5, 11, 17, 23)]),  # ViTDet-L
        (6, [1, 4]),
    ],
)
def test_default_global_blocks_are_the_last_of_each_quarter(layers, windowed):
    model = LookHereViT(embed_dims=48, num_layers=layers, num_heads=12, window_size=4)
    assert model.window_block_indexes == windowed
    assert [b.window_size for b in model.blocks] == [
        4 if i in windowed else 0 for i in range(layers)
    ]


def test_too_few_layers_for_the_default_window_pattern():
    with pytest.raises(ValueError, match=r'leaves no windowed block; give window_block_indexes'):
        LookHereViT(embed_dims=48, num_layers=3, num_heads=12, window_size=4)


# ----------------------------------------------------------------------------------------
# The LookHere config travels with trained weights (test / resume / inference)
# ----------------------------------------------------------------------------------------
def test_adopted_config_is_restored_where_no_init_weights_runs(tmp_path: Path):
    """Fine-tune from a pretrained file with a non-default config (adopted by init_weights),
    save as the Runner does, then load as tools/test.py / --resume / infer do: mmengine's
    load_checkpoint into a segmentor built from the same config, without init_weights."""
    from mmengine.registry import DefaultScope
    from mmengine.runner import load_checkpoint
    from mmseg.registry import MODELS as MMSEG_MODELS

    from lookhere_dense.lookhere.weights import save_backbone_checkpoint

    pretrained = tmp_path / 'lh90_pretrained.pth'
    lh90 = dict(head_directions='corners-none', global_slope=1.0, layer_slopes=[1.5, 0.5])
    save_backbone_checkpoint(
        str(pretrained), tiny(lh_config=lh90).state_dict(), lh90, source='test'
    )
    cfg = dict(
        type='EncoderDecoder',
        data_preprocessor=dict(type='SegDataPreProcessor', mean=[0, 0, 0], std=[1, 1, 1]),
        backbone=dict(
            type='LookHereViT',
            **TINY,
            out_indices=(2,),
            init_cfg=dict(type='Pretrained', checkpoint=str(pretrained)),
        ),
        decode_head=dict(
            type='FCNHead',
            in_channels=96,
            channels=96,
            num_convs=0,
            concat_input=False,
            num_classes=3,
            norm_cfg=dict(type='BN', requires_grad=True),
        ),
        train_cfg=dict(),
        test_cfg=dict(mode='whole'),
    )
    with DefaultScope.overwrite_default_scope('mmseg'):
        trained = MMSEG_MODELS.build(cfg)
        trained.init_weights()
        assert trained.backbone.lh_config.head_directions == 'corners-none'
        ckpt = tmp_path / 'iter_10.pth'
        torch.save({'meta': {}, 'state_dict': trained.state_dict()}, ckpt)
        cfg['backbone'].pop('init_cfg')  # as tools/test.py's model sees it
        tested = MMSEG_MODELS.build(cfg)
    assert tested.backbone.lh_config.head_directions == 'halves-none'  # the default
    load_checkpoint(tested, str(ckpt), map_location='cpu', logger='silent')
    assert tested.backbone.lh_config == trained.backbone.lh_config
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        torch.testing.assert_close(tested.eval().backbone(x)[0], trained.eval().backbone(x)[0])


def test_default_backbone_adopts_the_saved_config_and_explicit_conflicts_are_named(tmp_path: Path):
    source = tiny(preset='lh90')
    default = tiny()
    assert default.lh_config != source.lh_config
    default.load_state_dict(source.state_dict())
    assert default.lh_config == source.lh_config
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        torch.testing.assert_close(default(x)[0], source(x)[0])
    with pytest.raises(ValueError, match=r'conflicts with the one stored'):
        tiny(preset='lh45').load_state_dict(source.state_dict())
    # init_cfg from a Runner checkpoint of ours: the config comes along too
    ckpt = tmp_path / 'seg.pth'
    torch.save(
        {'meta': {}, 'state_dict': {f'backbone.{k}': v for k, v in source.state_dict().items()}},
        ckpt,
    )
    model = tiny(init_cfg=dict(type='Pretrained', checkpoint=str(ckpt)))
    assert model.lh_config == source.lh_config


def test_weights_of_another_pos_encoding_are_refused_by_load_state_dict():
    source = tiny(pos_encoding='rope2d')
    with pytest.raises(
        ValueError,
        match=r"trained with pos_encoding='rope2d'.*"
        r"set model.backbone.pos_encoding='rope2d'",
    ):
        tiny().load_state_dict(source.state_dict())
    sd = source.state_dict()
    sd.pop('_extra_state')  # moving the trunk on purpose
    tiny().load_state_dict(sd, strict=False)
