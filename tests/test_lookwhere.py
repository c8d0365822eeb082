"""LookWhere with a LookHere extractor (lookhere_dense/lookwhere): the coordinate-built
bias, top-k gather / scatter, the extractor on the full set against the dense model, the
fills, bad k, the mmseg backbone and config through mmengine's Runner, distillation."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lookhere_dense.lookhere import LookHereAttentionEngine, LookHereConfig, create_model
from lookhere_dense.lookwhere import (
    LookWhere,
    LookWhereExtractor,
    gather_patches,
    nearest_fill,
    resolve_k,
    scatter_patches,
    subset_bias,
    top_k_patches,
)
from lookhere_dense.lookwhere.fill import PropagateFill
from lookhere_dense.lookwhere.selector import LookWhereSelector

TINY_SEL = dict(input_size=32, embed_dims=48, num_layers=2, num_heads=12)
TINY_EXT = dict(embed_dims=48, num_layers=2, num_heads=12)


@pytest.mark.parametrize(
    'config',
    [
        LookHereConfig('halves-none'),
        LookHereConfig('eighths1-eighths2-none', 1.0, (2.0, 0.5)),
        LookHereConfig('center-corners-none', fill_with='max'),
    ],
    ids=['lh180', 'lh45', 'center+max'],
)
def test_subset_bias_full_grid_equals_grid_bias(config):
    """The bias built from coordinates is the grid's dense bias on the full grid, and its
    rows / columns at any subset (any order)."""
    grid, depth, heads = (5, 7), 2, 12
    engine = LookHereAttentionEngine(config, depth, heads)
    gb = engine.grid_bias(grid, torch.device('cpu'), torch.float32)
    n = grid[0] * grid[1]
    full = torch.arange(n)[None]
    torch.manual_seed(0)
    subset = torch.stack([torch.randperm(n)[:9], torch.randperm(n)[:9]])
    for layer in range(depth):
        key = None if gb.key_term is None else gb.key_term[layer]
        dense = gb.dense(layer, 1)
        got = subset_bias(gb.table[layer], grid, full, 1, key)[0]
        assert torch.equal(got, dense)
        part = subset_bias(gb.table[layer], grid, subset, 1, key)
        for b in range(2):
            idx = torch.cat([torch.zeros(1, dtype=torch.long), subset[b] + 1])
            assert torch.equal(part[b], dense[:, idx][:, :, idx])


def test_top_k_gather_scatter_exact():
    torch.manual_seed(0)
    scores = torch.randn(3, 20)
    keep = top_k_patches(scores, 6)
    assert keep.shape == (3, 6) and bool((keep[:, 1:] > keep[:, :-1]).all())
    for b in range(3):
        assert set(keep[b].tolist()) == set(scores[b].topk(6).indices.tolist())
    tokens = torch.randn(3, 20, 5)
    kept = gather_patches(tokens, keep)
    for b in range(3):
        assert torch.equal(kept[b], tokens[b, keep[b]])
    back = scatter_patches(kept, keep, 20)
    mask = torch.zeros(3, 20, dtype=torch.bool).scatter(1, keep, True)
    assert torch.equal(back[mask], tokens[mask]) and bool((back[~mask] == 0).all())


def test_nearest_fill_is_brute_force_nearest_and_kept_exact():
    torch.manual_seed(1)
    grid = (6, 9)
    keep = top_k_patches(torch.randn(2, 54), 7)
    values = torch.randn(2, 7, 4)
    out = nearest_fill(values, keep, grid)
    assert out.shape == (2, 4, 6, 9)
    for b in range(2):
        ky, kx = keep[b] // 9, keep[b] % 9
        for y in range(6):
            for x in range(9):
                d = (ky - y) ** 2 + (kx - x) ** 2
                j = int(torch.argmin(d))  # the first nearest: the lower kept index
                assert torch.equal(out[b, :, y, x], values[b, j])
    prop = PropagateFill(4)
    filled = prop(values, keep, grid).flatten(2).transpose(1, 2)
    for b in range(2):
        assert torch.allclose(filled[b, keep[b]], values[b], atol=0, rtol=0)
    assert torch.isfinite(filled).all()


@pytest.mark.parametrize('preset', ['lh180', 'lh90'])
def test_extractor_on_full_set_is_the_dense_model(preset):
    torch.manual_seed(0)
    # LayerScale 1: the attention output is not scaled down below the tolerance
    trunk = create_model(preset=preset, out_indices=(0, 1), init_values=1.0, **TINY_EXT).eval()
    ext = LookWhereExtractor(trunk)
    x = torch.randn(2, 3, 80, 112)
    ref = trunk(x)
    keep = torch.arange(5 * 7)[None].expand(2, -1)
    for backend, name in (('coords', 'sdpa-coords'), ('auto', 'engine:')):
        with torch.no_grad():
            outs, j, grid = ext(x, keep, None, backend)
        assert ext.last_backend.startswith(name)
        for o, r in zip(outs, ref):
            assert torch.allclose(trunk._output(o, grid), r, atol=1e-5, rtol=1e-5)


def test_lookwhere_forward_dense_maps_and_per_call_k():
    torch.manual_seed(0)
    model = LookWhere(TINY_SEL, dict(out_indices=(0, 1), **TINY_EXT), k_ratio=0.25).eval()
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        outs = model(x)
        assert [tuple(o.shape) for o in outs] == [(2, 48, 4, 6)] * 2
        assert model.last_k == 6 and model.last_backend == 'sdpa-coords'
        model(x, k=3)
        assert model.last_k == 3
        model(x, k_ratio=0.5)
        assert model.last_k == 12
        tok = model.forward_tokens(x, k=5)
        dense = outs[-1]  # another k: only the shape is shared
        assert tok['tokens'][-1].shape == (2, 1 + 5, 48) and dense.shape[1] == 48


@pytest.mark.parametrize(
    'kwargs, error, words',
    [
        (dict(k=0), ValueError, 'outside [1, 24]'),
        (dict(k=25), ValueError, 'outside [1, 24]'),
        (dict(k=2.0), TypeError, 'k must be an int'),
        (dict(k=True), TypeError, 'k must be an int'),
        (dict(k_ratio=0.0), ValueError, 'outside (0, 1]'),
        (dict(k_ratio=1.5), ValueError, 'outside (0, 1]'),
        (dict(k_ratio=math.nan), ValueError, 'outside (0, 1]'),
        (dict(k_ratio='0.2'), TypeError, 'k_ratio must be a number'),
        (dict(k=3, k_ratio=0.5), ValueError, 'not both'),
    ],
)
def test_bad_k_is_a_clear_error(kwargs, error, words):
    model = LookWhere(TINY_SEL, TINY_EXT).eval()
    with pytest.raises(error, match=__import__('re').escape(words)):
        model(torch.randn(1, 3, 64, 96), **kwargs)


def test_resolve_k_rules():
    assert resolve_k(100, k_ratio=0.25) == 25
    assert resolve_k(10, k_ratio=0.01) == 1
    assert resolve_k(10, default_k=4) == 4
    with pytest.raises(ValueError, match='no default'):
        resolve_k(10)
    # the constructor's own words (it said "k=0 is outside [1, 4611686018427387904]")
    with pytest.raises(ValueError, match=r'^LookWhere: k=0 keeps no patch: give k >= 1 \('):
        LookWhere(TINY_SEL, TINY_EXT, k=0)
    with pytest.raises(ValueError, match=r'give k or k_ratio, not both \(got k=5, k_ratio=0.5\)'):
        LookWhere(TINY_SEL, TINY_EXT, k=5, k_ratio=0.5)  # k won silently
    model = LookWhere(TINY_SEL, TINY_EXT, k=5)
    model.k_ratio = 0.1  # was ignored: k stayed the default
    assert (model.k, model.k_ratio) == (None, 0.1)
    assert model.resolve_k(100) == 10
    model.k = 7
    assert (model.k, model.k_ratio, model.resolve_k(100)) == (7, None, 7)
    with pytest.raises(ValueError, match=r'keep gives the kept patches; k=3'):
        model(torch.randn(1, 3, 64, 64), keep=torch.tensor([[0, 1]]), k=3)  # k was ignored
    for images, said in (
        (torch.randn(3, 64, 64), r'LookWhere expects images of shape \(B, C, H, W\), got'),
        (torch.randn(1, 64, 64, 3), r'looks like \(B, H, W, C\) with the channel axis last'),
    ):
        with pytest.raises(ValueError, match=said):  # F.interpolate's error / '64 channels'
            model(images)


@pytest.mark.parametrize('target', ['attn', 'boundary'])
def test_distillation_loss_decreases(target):
    from lookhere_dense.lookwhere.distill import distillation_losses, teacher_targets

    torch.manual_seed(0)
    teacher = create_model(**TINY_EXT).eval()
    coverage = 0.5 if target == 'boundary' else 0.0
    student = LookWhere(TINY_SEL, dict(TINY_EXT), k_ratio=0.25, coverage=coverage)
    student.extractor.trunk.load_state_dict(teacher.state_dict())
    images = torch.randn(4, 3, 64, 64)
    targets = teacher_targets(teacher, images)
    assert torch.allclose(targets['attn'].sum(-1), torch.ones(4))
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    history = []
    for _ in range(12):
        losses = distillation_losses(student, images, targets, selector_target=target)
        loss = losses['loss_selector'] + losses['loss_extractor']
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append((losses['loss_selector'].item(), losses['loss_extractor'].item()))
    assert history[-1][0] < 0.7 * history[0][0]
    assert history[-1][1] < 0.7 * history[0][1]


def test_backbone_config_trains_through_runner(tmp_path):
    """configs/segmenter_lookwhere_vit-t_tiny-ade.py builds and trains 2 iterations with
    mmengine's Runner on the tiny generated ADE20K-layout data (shrunk model)."""
    from mmengine.runner import Runner
    from tiny_seg import SHRINK, make_ade, options, roots

    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.registry import register_all_modules

    register_all_modules(init_default_scope=True)
    root = make_ade(tmp_path / 'data', num_train=2, num_val=1)
    cfg = load_config(
        'configs/segmenter_lookwhere_vit-t_tiny-ade.py',
        options(
            *roots(root),
            'model.backbone.extractor.num_layers=2',
            'model.backbone.extractor.embed_dims=96',
            'model.backbone.selector.embed_dims=96',
            'model.backbone.selector.num_layers=1',
            *SHRINK[2:],  # the decode head and the loaders, as the tool tests shrink them
            'train_cfg.max_iters=2',
            'train_cfg.val_interval=2',
            'param_scheduler=[]',
        ),
    )
    cfg.work_dir = str(tmp_path / 'work')
    cfg.default_hooks.checkpoint.interval = 2
    runner = Runner.from_cfg(cfg)
    assert type(runner.model.backbone).__name__ == 'LookWhereViT'
    metrics = runner.train()
    assert runner.iter == 2
    assert runner.model.backbone.last_backend == 'sdpa-coords'
    del metrics


def test_distillation_entry_runs_and_student_loads_into_backbone(tmp_path, capfd):
    """tools/lookwhere_study.py distill's entry (the tools' Runner on the distillation
    config, images only: the libraries' warnings in the log file, not on the terminal)
    writes a checkpoint whose student.* weights load into LookWhereViT (init_cfg prefix
    'student.') with the selector frozen."""
    from tiny_seg import make_ade, options

    from lookhere_dense.registry import register_all_modules
    from lookhere_dense.swap import model_registry
    from research.lookwhere.distill import run_distillation

    root = make_ade(tmp_path / 'data', num_train=2, num_val=1)
    shrink = [
        f'train_dataloader.dataset.data_root={root}',
        'train_cfg.max_iters=3',
        'train_dataloader.batch_size=2',
        'default_hooks.checkpoint.interval=3',
        'model.teacher.num_layers=2',
        'model.teacher.embed_dims=48',
        'model.student.extractor.num_layers=2',
        'model.student.extractor.embed_dims=48',
        'model.student.selector.embed_dims=48',
        'model.student.selector.num_layers=1',
    ]
    runner = run_distillation(
        'configs/lookwhere_distill_vit-t_tiny-ade.py', str(tmp_path / 'work'), options(*shrink)
    )
    assert runner.iter == 3
    terminal = ''.join(capfd.readouterr())
    assert 'Saving checkpoint at 3 iterations' in terminal
    assert 'FileClient' not in terminal and 'System environment' not in terminal
    log = next((tmp_path / 'work').glob('*/*.log')).read_text()
    assert 'FileClient' in log
    ckpt = str(tmp_path / 'work' / 'iter_3.pth')
    state = torch.load(ckpt, map_location='cpu', weights_only=False)['state_dict']
    student = {k[len('student.') :]: v for k, v in state.items() if k.startswith('student.')}
    assert student and not any(k.startswith('teacher.') for k in student)
    register_all_modules(init_default_scope=True)
    backbone = model_registry('mmseg').build(
        dict(
            type='LookWhereViT',
            selector=dict(input_size=(64, 64), embed_dims=48, num_layers=1, num_heads=12),
            extractor=dict(img_size=128, embed_dims=48, num_layers=2, num_heads=12),
            freeze_selector=True,
            init_cfg=dict(type='Pretrained', checkpoint=ckpt, prefix='student.'),
        )
    )
    backbone.init_weights()
    mine = backbone.state_dict()
    for key, value in student.items():
        assert torch.equal(mine[key], value), key
    assert not any(p.requires_grad for p in backbone.selector.parameters())
    backbone.train()
    assert not backbone.selector.training
    # a file that does not fit is refused (mmengine's Pretrained loaded what fits: 0 of
    # 226 tensors of a LookHere file, and training went on from random weights)
    from lookhere_dense.errors import CheckpointError

    def build(*others, **init_cfg):
        pretrained = dict(type='Pretrained', checkpoint=ckpt, **init_cfg)
        return model_registry('mmseg').build(
            dict(
                type='LookWhereViT',
                selector=dict(input_size=(64, 64), embed_dims=48, num_layers=1, num_heads=12),
                extractor=dict(img_size=128, embed_dims=48, num_layers=2, num_heads=12),
                init_cfg=[*others, pretrained] if others else pretrained,
            )
        )

    for others in ((), (dict(type='Constant', layer='LayerNorm', val=1.0),)):
        # a list's Pretrained entry too (it went through mmengine's loose loader)
        with pytest.raises(
            CheckpointError,
            match=r"distillation run's checkpoint \(student\.\*\): add prefix='student\.'",
        ):
            build(*others).init_weights()
    listed = build(dict(type='Constant', layer='LayerNorm', val=1.0), prefix='student.')
    listed.init_weights()  # mmengine's initialisers first, then the file over them
    for key, value in student.items():
        assert torch.equal(listed.state_dict()[key], value), key
    with pytest.raises(
        CheckpointError,
        match=r"the file's blocks are blocks\.0-1, the model's extractor\.trunk\.blocks\.0-1 and selector\.backbone\.blocks\.0-0: a checkpoint of another model",
    ):
        build(prefix='teacher.').init_weights()  # the LookHere teacher's weights
    loose = build(prefix='teacher.', strict=False)
    loose.init_weights()  # strict=False: what fits, as asked


def _official_like_checkpoint():
    """A state dict in the official lookwhere_dinov2.pt layout, made of timm's own
    vit_base_patch14_reg4_dinov2 modules (shrunk: 48 dims, 2 blocks), and those modules."""
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    arch = dict(pretrained=False, num_classes=0, embed_dim=48, num_heads=12, depth=2)
    sel = timm.create_model('vit_base_patch14_reg4_dinov2', img_size=42, **arch).eval()
    ext = timm.create_model('vit_base_patch14_reg4_dinov2', img_size=70, **arch).eval()
    for m in (sel, ext):  # LayerScale 1e-5 would hide the blocks
        for name, p in m.named_parameters():
            if name.endswith('gamma'):
                p.data.uniform_(0.5, 1.0)
    r = math.ceil(37 / 3)
    head = torch.nn.Sequential()
    head.w1 = torch.nn.Linear(48, 192)
    head.w2 = torch.nn.Linear(192, r * r)
    ckpt = {
        'selector': {'backbone': sel.state_dict(), 'head': head.state_dict()},
        'extractor': ext.state_dict(),
    }
    return ckpt, sel, ext, head, r


def test_the_distillation_config_builds_through_mmseg_init_model():
    """mmseg's ``init_model`` sets ``model.pretrained=None`` and ``model.train_cfg=None`` in
    every config: the distiller takes them (it stopped with 'unexpected keyword argument
    pretrained'); a value would be unused, and is refused naming the key."""
    from mmseg.apis import init_model
    from mmseg.registry import MODELS

    from lookhere_dense.registry import register_all_modules

    register_all_modules()
    model = init_model('configs/lookwhere_distill_vit-t_tiny-ade.py', device='cpu')
    assert type(model).__name__ == 'LookWhereDistiller'
    cfg = dict(model.cfg.model, pretrained='teacher.pth')
    with pytest.raises(ValueError, match=r"pretrained='teacher\.pth' is not used"):
        MODELS.build(cfg)


def test_official_layout_loads_and_matches_the_official_procedure():
    from lookhere_dense.lookwhere.official import load_official_lookwhere

    ckpt, sel, ext, head, r = _official_like_checkpoint()
    small = dict(
        high_res=70, embed_dims=48, selector_layers=2, extractor_layers=2, selector_size=42
    )
    model, report = load_official_lookwhere(ckpt, **small)
    assert report['dropped'] == ['extractor.reg_token']
    model.eval()
    x = torch.randn(2, 3, 70, 70)
    with torch.no_grad():
        # the official Selector.forward, on timm's modules
        low = torch.nn.functional.interpolate(
            x, size=(42, 42), mode='bilinear', align_corners=False
        )
        t = sel.patch_embed(low) + sel.pos_embed
        t = torch.cat([sel.cls_token.expand(2, -1, -1), sel.reg_token.expand(2, -1, -1), t], 1)
        t = sel.norm(sel.blocks(t))
        s = head.w2(torch.nn.functional.gelu(head.w1(t[:, 5:])))
        s = s.reshape(2, 3, 3, r, r).permute(0, 1, 3, 2, 4).reshape(2, 1, 3 * r, 3 * r)
        s = torch.nn.functional.interpolate(s, size=(5, 5), mode='bilinear', align_corners=False)
        ours = model.select(x, k=7)
        assert torch.allclose(ours['scores'], s.flatten(1), atol=1e-5)
        keep = ours['keep']
        # the official Extractor.forward
        e = ext.patch_embed(x) + ext.pos_embed
        e = torch.cat([t[:, :5], gather_patches(e, keep)], 1)
        e = ext.norm(ext.blocks(e))
        got = model.forward_tokens(x, keep=keep)['tokens'][-1]
        assert torch.allclose(got, e, atol=1e-5)
        # the official dense output (upsample_grid_nn, K=5): each patch the mean of its 5
        # nearest kept patches weighted by 1 / (distance + 1e-8), written out patch by patch
        dense = model(x, k=7)[-1]
        assert dense.shape == (2, 48, 5, 5)
        values = e[:, 5:]
        for b in range(2):
            kept = [(int(i) // 5, int(i) % 5) for i in keep[b]]
            for p in range(25):
                d = [math.dist((p // 5, p % 5), c) for c in kept]
                near = sorted(range(7), key=lambda j: (d[j], j))[:5]
                w = torch.tensor([1 / (d[j] + 1e-8) for j in near])
                want = (values[b, near] * (w / w.sum())[:, None]).sum(0)
                torch.testing.assert_close(dense[b, :, p // 5, p % 5], want, atol=1e-5, rtol=0)
        # blocks of a few pairs give the same; an empty batch gives an empty map
        from lookhere_dense.lookwhere.fill import idw_fill

        small_blocks = idw_fill(values, keep, (5, 5), max_pairs=20)
        torch.testing.assert_close(small_blocks, dense, atol=1e-6, rtol=0)
        assert model(torch.randn(0, 3, 70, 70), k=7)[-1].shape == (0, 48, 5, 5)


def test_official_weights_load_at_another_resolution():
    """``high_res`` other than the file's: the extractor's table is resampled to its grid
    at load (it was refused for its shape), as the official forward resamples it to the
    input's; the model then gives what the file's resolution gives at that input."""
    from lookhere_dense.lookwhere.official import load_official_lookwhere

    ckpt, *_ = _official_like_checkpoint()
    small = dict(embed_dims=48, selector_layers=2, extractor_layers=2, selector_size=42)
    at_file, _ = load_official_lookwhere(ckpt, high_res=70, **small)
    larger, _ = load_official_lookwhere(ckpt, high_res=98, **small)
    assert larger.extractor.trunk.pos_enc.pos_embed.shape == (1, 49, 48)
    x = torch.randn(1, 3, 98, 98)
    with torch.no_grad():
        torch.testing.assert_close(
            larger.eval()(x, k=20)[-1], at_file.eval()(x, k=20)[-1], atol=1e-5, rtol=1e-5
        )


def test_official_layout_errors_name_what_does_not_fit():
    from lookhere_dense.lookwhere.official import load_official_lookwhere, official_lookwhere

    ckpt, *_ = _official_like_checkpoint()
    small = dict(
        high_res=70, embed_dims=48, selector_layers=2, extractor_layers=2, selector_size=42
    )
    with pytest.raises(ValueError, match="top-level keys 'selector' and 'extractor'"):
        load_official_lookwhere({'model': {}}, **small)
    with pytest.raises(
        ValueError, match=r'selector.head.w2.weight: file \(169, 192\) vs model \(4, 192\)'
    ):
        model = official_lookwhere(**small)
        model.selector.head = type(model.selector.head)(48, 4)
        load_official_lookwhere(ckpt, model)
    with pytest.raises(ValueError, match=r"missing in the file: \['extractor.trunk.blocks.2"):
        load_official_lookwhere(ckpt, **dict(small, extractor_layers=3))
    lookhere = LookWhere(
        dict(input_size=42, patch_size=14, embed_dims=48, num_layers=2, num_heads=12),
        dict(img_size=70, patch_size=14, embed_dims=48, num_layers=2, num_heads=12),
    )
    with pytest.raises(ValueError, match='absolute positions'):
        load_official_lookwhere(ckpt, lookhere)


@pytest.mark.parametrize('scope', ['mmseg', 'mmdet'])
def test_heads_and_simple_fpn_sit_on_the_backbone_unchanged(scope):
    """LookWhereViT's NCHW maps feed SimpleFPN (mmdet / ViTDet) and the Segmenter mask and
    linear heads (mmseg) exactly as LookHereViT's do."""
    from lookhere_dense.registry import register_all_modules
    from lookhere_dense.swap import model_registry

    register_all_modules()
    registry = model_registry(scope)
    torch.manual_seed(0)
    backbone = registry.build(
        dict(type='LookWhereViT', selector=TINY_SEL, extractor=TINY_EXT, k_ratio=0.5)
    ).eval()
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        feats = backbone(x)
        assert feats[-1].shape == (1, 48, 4, 6)
        if scope == 'mmdet':
            fpn = registry.build(dict(type='SimpleFPN', in_channels=48, out_channels=32))
            assert [tuple(o.shape[-2:]) for o in fpn(feats)] == [(16, 24), (8, 12), (4, 6), (2, 3)]
            return
        for head in (
            dict(
                type='LeanSegmenterMaskTransformerHead', num_layers=1, num_heads=2, embed_dims=48
            ),
            dict(type='FCNHead', num_convs=0, concat_input=False),
        ):
            head = registry.build(
                dict(head, in_channels=48, channels=48, num_classes=5, dropout_ratio=0.0)
            ).eval()
            assert head(feats).shape == (1, 5, 4, 6)


def test_subset_attention_wrong_token_count_is_a_clear_error():
    """The token count goes through prefix_tokens.check_tokens (one check for the code
    base): the error names the kept patches, the count and the prefix tokens."""
    from lookhere_dense.lookwhere.subset import SubsetAttention

    trunk = create_model(**TINY_EXT, img_size=64)
    attend = SubsetAttention(trunk.pos_enc, torch.tensor([[0, 3, 5]]), (4, 4))
    q = torch.randn(1, 12, 5, 4)
    with pytest.raises(ValueError, match='3 kept patches got 5 tokens .* 1 prefix token needs 4'):
        attend(q, q, q, 0, (4, 4), 1)
    q = torch.randn(1, 12, 4, 4)
    assert attend(q, q, q, 0, (4, 4), 1).shape == q.shape


def test_subset_index_is_pair_index_and_buffer_reuse_is_exact():
    """subset_index's block is pair_index of every kept pair (prefix pairs: the zero slot);
    the extractor without autograd (one bias buffer for every layer) equals it with
    autograd (a fresh bias per layer)."""
    from lookhere_dense.lookhere.bias import pair_index
    from lookhere_dense.lookwhere.subset import subset_index

    grid = (5, 7)
    torch.manual_seed(0)
    keep = torch.stack([torch.randperm(35)[:9], torch.randperm(35)[:9]])
    index = subset_index(grid, keep, 2).view(2, 11, 11)
    assert torch.equal(index[:, 2:, 2:], pair_index(grid, keep[:, :, None], keep[:, None, :]))
    assert bool((index[:, :2] == 9 * 13).all()) and bool((index[:, :, :2] == 9 * 13).all())
    extractor = LookWhereExtractor(**TINY_EXT, img_size=64).eval()
    x = torch.randn(2, 3, 80, 112)
    keep = top_k_patches(torch.randn(2, 35), 12)
    with_grad = extractor(x, keep)[0][-1]
    with torch.no_grad():
        buffered = extractor(x, keep)[0][-1]
    assert extractor.last_backend == 'sdpa-coords'
    torch.testing.assert_close(buffered, with_grad, rtol=0, atol=0)


def test_top_k_with_coverage_is_lattice_plus_top_scores():
    """coverage 0 is plain top-k; otherwise round(coverage * k) lattice patches (spread
    over the grid) and the best-scoring others, k distinct patches in ascending order."""
    from lookhere_dense.lookwhere import lattice_patches, top_k_with_coverage

    torch.manual_seed(0)
    grid, k = (12, 20), 60
    scores = torch.randn(3, 240)
    assert torch.equal(top_k_with_coverage(scores, k, grid, 0.0), top_k_patches(scores, k))
    lattice = lattice_patches(grid, 30)
    assert lattice.numel() == 30 and lattice.unique().numel() == 30
    ys, xs = lattice // 20, lattice % 20
    assert ys.unique().numel() >= 4 and xs.unique().numel() >= 7  # spread, not one band
    keep = top_k_with_coverage(scores, k, grid, 0.5)
    for b in range(3):
        assert keep[b].unique().numel() == k and torch.equal(keep[b], keep[b].sort().values)
        assert set(lattice.tolist()) <= set(keep[b].tolist())
        rest = scores[b].clone()
        rest[lattice] = float('-inf')
        best = set(rest.topk(k - 30).indices.tolist())
        assert set(keep[b].tolist()) == best | set(lattice.tolist())
    with pytest.raises(ValueError, match='coverage=1.5 is outside'):
        top_k_with_coverage(scores, k, grid, 1.5)
    with pytest.raises(ValueError, match='coverage=-0.1 is outside'):
        LookWhere(TINY_SEL, TINY_EXT, coverage=-0.1)


def test_boundary_map_marks_where_features_change():
    from lookhere_dense.lookwhere.distill import boundary_map, distillation_losses

    flat = boundary_map(torch.ones(2, 4, 5, 6))
    assert torch.allclose(flat, torch.full((2, 30), 1 / 30))
    step = torch.zeros(1, 4, 5, 6)
    step[..., 3:] = 1.0  # an edge between columns 2 and 3
    got = boundary_map(step).view(5, 6)
    assert torch.allclose(got.sum(), torch.tensor(1.0))
    assert bool((got[:, 2:4] > 0.09).all()) and bool((got[:, [0, 1, 4, 5]] < 1e-6).all())
    model = LookWhere(TINY_SEL, TINY_EXT)
    with pytest.raises(ValueError, match="selector_target='cls' is not one of"):
        distillation_losses(
            model, torch.randn(1, 3, 32, 32), {'grid': (2, 2)}, selector_target='cls'
        )


@pytest.mark.parametrize('num_prefix', [0, 1, 3])
def test_chunked_subset_attention_equals_dense_bias_sdpa(num_prefix):
    """chunked-coords is SDPA with the dense coordinate bias, forward and gradients (q, k,
    v and the table, as with learnable slopes; center heads with their key term), for
    block sizes that divide the tokens or not, with and without prefix tokens; without
    autograd (one bias buffer, blocks written into the result) too."""
    import torch.nn.functional as F

    from lookhere_dense.lookwhere import chunked_subset_attention

    grid, heads = (6, 9), 12
    engine = LookHereAttentionEngine(LookHereConfig('center-corners-none', fill_with='max'), 1, 12)
    gb = engine.grid_bias(grid, torch.device('cpu'), torch.float64)
    torch.manual_seed(num_prefix)
    keep = torch.stack([torch.randperm(54)[:20], torch.randperm(54)[:20]])  # any order
    total = num_prefix + 20

    def leaves():
        torch.manual_seed(7)
        q, k, v = (torch.randn(2, heads, total, 8, dtype=torch.float64) for _ in range(3))
        return [t.requires_grad_() for t in (q, k, v, gb.table[0].clone(), gb.key_term[0].clone())]

    q, k, v, table, key = leaves()
    bias = subset_bias(table, grid, keep, num_prefix, key)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    weight = torch.randn_like(ref)
    ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v, table, key))
    assert all(float(g.abs().max()) > 0 for g in ref_grads)
    workspace = {}
    for rows in (1, 3, 7, total - 1, total, total + 5):
        for recompute in (True, False):
            q, k, v, table, key = leaves()
            out = chunked_subset_attention(
                q, k, v, table, grid, keep, num_prefix, key, rows, recompute=recompute
            )
            torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
            grads = torch.autograd.grad((out * weight).sum(), (q, k, v, table, key))
            for got, want in zip(grads, ref_grads):
                torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        with torch.no_grad():
            out = chunked_subset_attention(q, k, v, table, grid, keep, num_prefix, key, rows)
            torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
            for _ in range(2):  # buffers kept in the workspace between calls (layers)
                out = chunked_subset_attention(
                    q, k, v, table, grid, keep, num_prefix, key, rows, workspace=workspace
                )
                torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_extractor_chooses_chunked_coords_above_the_budget_and_matches_dense():
    """The extractor on a gathered set: 'sdpa-coords' within max_subset_bias_mb,
    'chunked-coords' above it (and when asked), both named in last_backend and equal in
    output and in every parameter's gradient (learnable slopes included), with the trunk's
    CLS, with 5 given prefix tokens and with none; bad budgets / paths are clear errors."""
    torch.manual_seed(0)
    lh = dict(head_directions='center-corners-none', fill_with='max', learnable_slopes=True)
    trunk = create_model(lh_config=lh, init_values=1.0, **TINY_EXT, img_size=64)
    x = torch.randn(2, 3, 80, 112)
    keep = torch.stack([torch.randperm(35)[:13], torch.randperm(35)[:13]])
    cases = (('auto', 256.0, None, 'sdpa-coords'), ('auto', 0.0, 4, 'chunked-coords'))
    forced = (
        ('coords', 0.0, 5, 'chunked-coords'),
        ('chunked-coords', 256.0, None, 'chunked-coords'),
        ('sdpa-coords', 0.0, None, 'sdpa-coords'),
    )
    for prefix in (None, torch.randn(2, 5, 48), torch.randn(2, 0, 48)):
        results = {}
        for backend, budget, rows, path in cases + (forced if prefix is None else ()):
            ext = LookWhereExtractor(trunk, max_subset_bias_mb=budget, subset_block_rows=rows)
            trunk.zero_grad()
            out = ext(x, keep, prefix, backend)[0][-1]
            assert ext.last_backend == path, (backend, budget)
            (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
            grads = {n: p.grad.clone() for n, p in trunk.named_parameters() if p.grad is not None}
            assert any('slopes' in n for n in grads)
            results[(backend, budget)] = (out.detach(), grads)
        ref_out, ref_grads = results[('auto', 256.0)]
        for out, grads in results.values():
            torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
            assert grads.keys() == ref_grads.keys()
            for n, g in grads.items():
                torch.testing.assert_close(g, ref_grads[n], rtol=1e-4, atol=1e-6, msg=n)
    with pytest.raises(ValueError, match='max_subset_bias_mb|max_dense_bias_mb'):
        LookWhereExtractor(trunk, max_subset_bias_mb=-1)
    with pytest.raises(ValueError, match='block_rows must be None or an int >= 0.*1.5'):
        LookWhereExtractor(trunk, subset_block_rows=1.5)
    with pytest.raises(ValueError, match="attn_path must be one of .*'chunked-coords'.*'chunky'"):
        LookWhere(TINY_SEL, TINY_EXT, attn_path='chunky')
    with pytest.raises(ValueError, match=r'rows=\(3, 2\) is not a block'):
        subset_bias(torch.zeros(12, 9, 13), (5, 7), keep, 1, rows=(3, 2))


def test_study_distils_the_propagate_fill():
    """The study's --fill: with 'propagate' the student's learned fill correction (zero at
    the start) is trained by the distillation; a bad fill is a clear error."""
    from research.lookwhere.study import FOV, _frames, distill_student, new_teacher, run_study

    torch.manual_seed(0)
    teacher = new_teacher(FOV).eval()
    frames = [_frames((64, 64), 2, seed=0, task=FOV)[0]]
    student = distill_student(
        teacher, frames, [0.5], 1, lambda m: None, FOV, 'boundary', 0.5, 'propagate'
    )
    assert isinstance(student.fill, PropagateFill)
    assert float(student.fill.pw.weight.detach().abs().max()) > 0  # moved from its zero init
    with pytest.raises(ValueError, match="fill='smear' is not one of"):
        run_study([(64, 64)], [0.5], task='fov', fill='smear')


def test_study_seed_changes_the_student_not_the_teacher(capsys):
    """The study's --seed: the same seed gives the same student, another seed another one
    (initialisation and step order); seed 0 keeps the earlier studies' student; a negative
    seed is refused by run_study and the CLI."""
    import runpy

    from research.lookwhere.study import FOV, _frames, distill_student, new_teacher, run_study

    torch.manual_seed(0)
    teacher = new_teacher(FOV).eval()
    frames = [_frames((64, 64), 2, seed=0, task=FOV)[0]]

    def student(seed):
        s = distill_student(
            teacher, frames, [0.5], 2, lambda m: None, FOV, 'boundary', 0.5, 'propagate', seed=seed
        )
        return torch.cat([p.detach().flatten() for p in s.selector.parameters()])

    default = distill_student(
        teacher, frames, [0.5], 2, lambda m: None, FOV, 'boundary', 0.5, 'propagate'
    )
    default = torch.cat([p.detach().flatten() for p in default.selector.parameters()])
    torch.testing.assert_close(student(0), default, rtol=0, atol=0)
    torch.testing.assert_close(student(1), student(1), rtol=0, atol=0)
    assert not torch.equal(student(0), student(1))
    with pytest.raises(ValueError, match='seed=-1 < 0'):
        run_study([(64, 64)], [0.5], task='fov', seed=-1)
    main = runpy.run_path('tools/lookwhere_study.py')['main']
    with pytest.raises(SystemExit) as exc:
        main(['study', '--seed', '-1'])
    assert exc.value.code == 2
    assert '--seed: -1 is negative' in capsys.readouterr().err


def test_extractor_memory_measures_both_paths_on_the_same_output(capsys):
    """tools/lookwhere_study.py extractor-memory: one row per path, each ran the path it
    names, the same output; a bad path is refused by the CLI."""
    import runpy

    from research.lookwhere.study import run_extractor_memory

    rows = run_extractor_memory((64, 128), 0.25, rounds=1, block_rows=3)
    assert [r['ran'] for r in rows] == ['sdpa-coords', 'chunked-coords']
    assert rows[0]['kept'] == 8 and rows[1]['max_abs_diff_to_first'] < 1e-5
    main = runpy.run_path('tools/lookwhere_study.py')['main']
    with pytest.raises(SystemExit) as exc:
        main(['extractor-memory', '--paths', 'dense'])
    assert exc.value.code == 2
    assert "'dense' is not one of" in capsys.readouterr().err


def test_study_whole_frame_finetune_control_trains_a_copy():
    """--finetune-teacher: finetune_whole trains the whole-frame model it is given (here a
    copy of the teacher) with the student's fine-tuning steps; the teacher is untouched."""
    import copy

    from research.lookwhere.study import FOV, _frames, finetune_whole, new_teacher

    torch.manual_seed(0)
    teacher = new_teacher(FOV).eval()
    before = copy.deepcopy(teacher.state_dict())
    pool = [_frames((64, 64), 2, seed=0, task=FOV)]
    tuned = finetune_whole(copy.deepcopy(teacher), pool, [0.5], 1, lambda m: None)
    assert not tuned.training
    moved = [k for k, v in tuned.state_dict().items() if not torch.equal(v, before[k])]
    assert 'cls.weight' in moved and any(k.startswith('backbone.') for k in moved)
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())


def test_study_whole_frame_teacher_trains_once_and_caches(tmp_path, capsys):
    """--teacher-whole-iters: whole_frame_teacher trains the crop-trained teacher on whole
    frames, saves it, and a second call loads the saved one instead of training again; a
    negative count is refused by the CLI and by run_study."""
    import copy
    import runpy

    from research.lookwhere.study import FOV, _frames, new_teacher, run_study, whole_frame_teacher

    torch.manual_seed(0)
    crop_trained = new_teacher(FOV).eval()
    before = copy.deepcopy(crop_trained.state_dict())
    pool = [_frames((64, 64), 2, seed=0, task=FOV)]
    path = str(tmp_path / 'teacher_whole2.sd.pt')
    logs = []
    first = whole_frame_teacher(crop_trained, pool, 2, logs.append, path, FOV)
    assert not first.training and (tmp_path / 'teacher_whole2.sd.pt').exists()
    assert any(not torch.equal(v, before[k]) for k, v in first.state_dict().items())
    assert any('teacher whole-frame iter 2/2' in m for m in logs)
    logs.clear()
    again = whole_frame_teacher(new_teacher(FOV), pool, 2, logs.append, path, FOV)
    assert logs == [f'whole-frame teacher from {path}']
    for k, v in again.state_dict().items():
        assert torch.equal(v, first.state_dict()[k]), k
    with pytest.raises(ValueError, match='teacher_whole_iters=-1 < 0'):
        run_study([(64, 64)], [0.5], task='fov', teacher_whole_iters=-1)
    main = runpy.run_path('tools/lookwhere_study.py')['main']
    with pytest.raises(SystemExit) as exc:
        main(['study', '--teacher-whole-iters', '-3'])
    assert exc.value.code == 2
    assert '--teacher-whole-iters: -3 is negative' in capsys.readouterr().err


def _tiny_study(tmp_path, k_ratios, **options):
    """``run_study`` at smoke scale: one 64x64 field-of-view size, one step of teacher
    training and distillation, two test frames, a 32x48 selector input; ``options``
    (fine-tuning, training frames) as the test needs."""
    from research.lookwhere.study import run_study

    return run_study(
        [(64, 64)],
        k_ratios,
        train_iters=1,
        distill_iters=1,
        test_frames=2,
        repeats=1,
        threads=1,
        out_dir=str(tmp_path),
        name='t',
        task='fov',
        selector_input=(32, 48),
        **options,
    )


def test_study_train_frames_rows_and_summary(tmp_path, capsys):
    """--train-frames: the count of generated training frames the study uses (recorded in
    the JSON per size); below 2 is refused by the CLI and by run_study, before any training.
    The study's rows (whole, slide, resized and LookWhere per ratio) and ``summary`` of its
    JSON: the gap from the rows, every missing size / ratio / file a clear error."""
    import runpy

    from research.lookwhere.study import run_study

    res = _tiny_study(tmp_path, [0.5], finetune_iters=0, train_frames=3)
    assert res['teacher']['train_frames'] == {'64x64': 3}
    assert res['student']['selector'].endswith('32x48 input')
    assert [(r['method'], r['k_ratio']) for r in res['rows']] == [
        ('whole', None),
        ('slide', None),
        ('resized', 0.5),
        ('lookwhere', 0.5),
    ]
    assert res['rows'][2]['resized_to'] == '48x48'

    # the summary of study results (seeds): one line per run, the gap from its rows
    from research.lookwhere.study import summarize

    lines, table = summarize([res, res], '64x64', 0.5, ['a', 'b'])
    whole, lw = res['rows'][0]['miou'], res['rows'][3]['miou']
    assert [ln['run'] for ln in lines] == ['a', 'b']
    assert lines[0]['gap'] == round(lw - whole, 2) and lines[0]['whole_ft'] is None
    assert lines[0]['resized'] == res['rows'][2]['miou'] and lines[0]['train_frames'] == 3
    assert f'| a | 3 | 0 | {whole:.2f} | - |' in table
    assert f'gap to the whole frame mean {lw - whole:.2f}' in table
    for row in res['rows']:  # per-class IoU beside the mean
        assert abs(sum(row['class_iou'].values()) / len(row['class_iou']) - row['miou']) < 0.02
    cls = next(iter(res['rows'][3]['class_iou']))
    lines, table = summarize([res], '64x64', 0.5, class_id=cls)
    assert lines[0]['class_lookwhere'] == res['rows'][3]['class_iou'][cls]
    assert f'class {cls}: whole | resized | LookWhere |' in table
    stored = json.loads(json.dumps(res))  # from the JSON file: string keys
    assert summarize([stored], '64x64', 0.5, class_id=cls)[0] == lines
    for args, match in (
        (([res], '32x32', 0.5), 'run 1 has no rows at 32x32'),
        (([res], '64x64', 0.25), 'run 1 has no LookWhere row at 64x64, k_ratio 0.25'),
        (([res], '64x64', 0.5, ['a', 'b']), '2 names for 1 runs'),
        (([],), 'no study results given'),
        (([{'rows': [{'size': '64x64'}]}],), 'run 1 is not a study result'),
    ):
        with pytest.raises(ValueError, match=match):
            summarize(*args)
    main = runpy.run_path('tools/lookwhere_study.py')['main']
    capsys.readouterr()
    assert main(['summary', str(tmp_path / 't.json'), '--size', '64x64', '--k-ratio', '0.5']) == 0
    assert '| t | 3 | 0 |' in capsys.readouterr().out
    for argv, err in (
        (['summary', str(tmp_path / 'missing.json')], 'cannot read study results'),
        (['summary', str(tmp_path / 't.json'), '--size', '8x8'], 't has no rows at 8x8'),
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and err in capsys.readouterr().err

    with pytest.raises(ValueError, match='train_frames=1 < 2'):
        run_study([(64, 64)], [0.5], task='fov', train_frames=1)
    with pytest.raises(ValueError, match=r'selector_input=\(30, 48\) is not a multiple of the 8'):
        run_study([(64, 64)], [0.5], task='fov', selector_input=(30, 48))
    main = runpy.run_path('tools/lookwhere_study.py')['main']
    with pytest.raises(SystemExit) as exc:
        main(['study', '--train-frames', '0'])
    assert exc.value.code == 2
    assert '--train-frames: 0 is below 2' in capsys.readouterr().err


def test_study_equal_training_controls_whole_ft_and_resized_ft(tmp_path):
    """With ``finetune_teacher`` the study also evaluates the teacher fine-tuned as long as
    the student (the equal-training control) on the whole frame and shrunk to LookWhere's
    token count (``resized-ft``); ``summary`` shows both."""
    from research.lookwhere.study import summarize

    res = _tiny_study(
        tmp_path, [0.25, 0.5], finetune_iters=2, finetune_teacher=True, train_frames=2
    )
    rows = [(r['method'], r['k_ratio']) for r in res['rows']]
    assert rows == [
        ('whole', None),
        ('whole-ft', None),
        ('slide', None),
        ('resized', 0.25),
        ('resized', 0.5),
        ('resized-ft', 0.25),
        ('resized-ft', 0.5),
        ('lookwhere', 0.25),
        ('lookwhere', 0.5),
    ]
    by = {(r['method'], r['k_ratio']): r for r in res['rows']}
    assert by[('resized-ft', 0.25)]['resized_to'] == by[('resized', 0.25)]['resized_to']
    # the fine-tuning changed the model here, so its resized rows are its own, not the
    # teacher's under another name (the teacher in their place by hand: fails)
    assert by[('whole-ft', None)]['class_iou'] != by[('whole', None)]['class_iou']
    assert by[('resized-ft', 0.25)]['class_iou'] != by[('resized', 0.25)]['class_iou']
    lines, table = summarize([res], '64x64', 0.25)
    assert lines[0]['resized_ft'] == by[('resized-ft', 0.25)]['miou']
    assert lines[0]['whole_ft'] == by[('whole-ft', None)]['miou']
    assert '| resized 0.25 | resized-ft 0.25 | LookWhere 0.25 |' in table


def test_resized_logits_is_the_whole_frame_at_the_same_token_count():
    """The study's resized baseline: at k_ratio 0.25 on a frame made of 2x2 pixel blocks it
    is the teacher's pass on the half-size image (patch map's logits upsampled to the full
    frame), not the full-resolution pass; other ratios shrink each side by sqrt(k) to whole
    patches; a ratio outside (0, 1] is refused."""
    import torch.nn.functional as F

    from research.lookwhere.study import FOV, new_teacher, resized_logits, resized_size

    torch.manual_seed(0)
    teacher = new_teacher(FOV).eval()
    small = torch.randn(1, 3, 64, 96)
    frame = F.interpolate(small, scale_factor=2, mode='nearest')
    with torch.no_grad():
        got = resized_logits(teacher, frame, 0.25, 8)
        want = teacher.head(teacher.backbone(small)[-1], (128, 192))
        full = teacher(frame)
    assert got.shape == (1, FOV.num_classes, 128, 192)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (got - full).abs().max() > 1e-2
    assert resized_size((1024, 2048), 0.25, 16) == (512, 1024)
    assert resized_size((1024, 2048), 0.1, 16) == (320, 640)
    assert resized_size((1024, 2048), 0.5, 16) == (720, 1456)
    assert resized_size((32, 32), 0.01, 16) == (16, 16)
    for bad in (0, 1.5, -0.25):
        with pytest.raises(ValueError, match=f'k_ratio={bad!r} is not in'):
            resized_logits(teacher, frame, bad, 8)


def test_class_iou_from_the_confusion_matrix():
    """class_iou: intersection over union per class present (rows: label, columns:
    prediction); classes in neither are left out; their mean is miou."""
    from research.lookwhere.study import class_iou, miou

    conf = torch.tensor([[3, 1, 0], [0, 2, 0], [0, 0, 0]])
    assert class_iou(conf) == {0: 75.0, 1: round(200 / 3, 2)}
    assert abs(miou(conf) - (75.0 + 200 / 3) / 2) < 1e-9


def test_a_lookhere_segmentor_file_for_a_lookwhere_model_is_named_as_such():
    """tools/test.py with a LookWhere config and a LookHereViT segmentor's checkpoint: the
    hints said 'set final_norm=True' and 'strict=False loads the weights' (both wrong);
    blocks under other names mean another model's file."""
    from lookhere_dense.lookhere.weights import vit_key_hints

    file_keys = ['backbone.blocks.0.attn.qkv.weight', 'backbone.blocks.1.attn.qkv.weight']
    file_keys += ['backbone.norm.weight', 'backbone._extra_state']
    model_keys = ['backbone.extractor.trunk.blocks.0.attn.qkv.weight']
    model_keys += ['backbone.selector.backbone.blocks.0.attn.qkv.weight']
    model_keys += ['backbone.extractor.trunk._extra_state']
    hints = vit_key_hints(model_keys, file_keys, model_keys, file_keys)
    assert hints == [
        "the file's blocks are backbone.blocks.0-1, the model's "
        'backbone.extractor.trunk.blocks.0-0 and backbone.selector.backbone.blocks.0-0: a '
        "checkpoint of another model (a LookHereViT segmentor's for this LookWhere model, "
        'whose LookHere trunk is extractor.trunk.*? load such a file with '
        'extractor=dict(pretrained=FILE))'
    ]
    # the model's own names under a prefix (a distillation run's student.*): the prefix
    student = ['student.extractor.trunk.blocks.0.attn.qkv.weight', 'teacher.blocks.0.norm1.weight']
    trunk = ['extractor.trunk.blocks.0.attn.qkv.weight']
    assert vit_key_hints(trunk, student, trunk, student)[0].endswith(
        "the model sits under 'student.' in the file: add prefix='student.'"
    )
    # neither: another model, no LookWhere advice for a plain ViT
    other = ['encoder.blocks.0.attn.qkv.weight']
    plain = ['backbone.blocks.0.attn.qkv.weight']
    assert vit_key_hints(plain, other, plain, other) == [
        "the file's blocks are encoder.blocks.0-0, the model's backbone.blocks.0-0: a "
        'checkpoint of another model'
    ]


def test_the_segmentation_loss_reaches_no_selector_head():
    """What docs/lookwhere.md and the LookWhere config say: trained directly, the selector's
    head gets no gradient (top-k is no differentiable function of its scores; the config
    lets DDP run with such parameters), its blocks do (through the prefix tokens)."""
    from mmengine.config import Config

    model = LookWhere(TINY_SEL, TINY_EXT, k_ratio=0.5).train()
    model(torch.randn(2, 3, 64, 64))[-1].mean().backward()
    none = {n for n, p in model.named_parameters() if p.grad is None}
    head = {n for n, _ in model.named_parameters() if n.startswith('selector.head.')}
    assert head and head <= none
    assert model.selector.backbone.blocks[0].attn.qkv.weight.grad is not None
    for name in ('segmenter_lookwhere_vit-t_tiny-ade.py', 'lookwhere_distill_vit-t_tiny-ade.py'):
        cfg = Config.fromfile(f'configs/{name}')
        assert cfg.model_wrapper_cfg.find_unused_parameters is True, name


def test_the_distillation_teacher_loads_through_the_trunks_loader(tmp_path):
    """The teacher's file: a segmentor's checkpoint loads without a prefix and stays
    through ``init_weights`` (the Runner's call redrew 27 of its 33 tensors: the student
    was distilled from a random teacher), and one of another depth names model.teacher.*
    (it said model.backbone.num_layers, and without a prefix mmengine's RuntimeError
    listed every key)."""
    from lookhere_dense.errors import CheckpointError
    from lookhere_dense.registry import register_all_modules
    from lookhere_dense.swap import model_registry

    register_all_modules(init_default_scope=True)
    trunk = create_model(embed_dims=48, num_layers=2, num_heads=12)
    path = str(tmp_path / 'segmentor.pth')
    torch.save({'state_dict': {'backbone.' + k: v for k, v in trunk.state_dict().items()}}, path)

    def distiller(**teacher):
        return model_registry('mmseg').build(
            dict(
                type='LookWhereDistiller',
                teacher=dict(embed_dims=48, num_heads=12, checkpoint=path, **teacher),
                student=dict(selector=TINY_SEL, extractor=TINY_EXT),
            )
        )

    model = distiller(num_layers=2)
    model.init_weights()  # what the Runner calls before training: the teacher stays
    for key, value in trunk.state_dict().items():
        if value.is_floating_point():
            assert torch.equal(model.teacher.state_dict()[key], value), key
    assert torch.equal(
        distiller(num_layers=2, prefix='backbone.').teacher.cls_token, trunk.cls_token
    )
    with pytest.raises(
        CheckpointError, match=r'^model\.teacher: .*set num_layers=2.*model\.teacher\.num_layers'
    ):
        distiller(num_layers=3)


def test_a_nearest_fill_student_fine_tunes_with_the_learned_fill(tmp_path):
    """A student distilled with fill='nearest' has no fill parameters; LookWhereViT's strict
    init_cfg loads it into fill='propagate', whose correction starts afresh (at zero)."""
    from lookhere_dense.registry import register_all_modules
    from lookhere_dense.swap import model_registry

    register_all_modules(init_default_scope=True)
    student = LookWhere(TINY_SEL, TINY_EXT)
    path = str(tmp_path / 'distill.pth')
    torch.save({'state_dict': {'student.' + k: v for k, v in student.state_dict().items()}}, path)
    backbone = model_registry('mmseg').build(
        dict(
            type='LookWhereViT',
            selector=TINY_SEL,
            extractor=TINY_EXT,
            fill='propagate',
            init_cfg=dict(type='Pretrained', checkpoint=path, prefix='student.'),
        )
    )
    torch.nn.init.ones_(backbone.fill.pw.weight)
    backbone.init_weights()
    assert torch.equal(backbone.extractor.trunk.cls_token, student.extractor.trunk.cls_token)
    assert not backbone.fill.pw.weight.any()  # restarted: the plain propagation


def test_trunk_arguments_the_extractor_would_ignore_are_refused_or_honoured():
    """``out_origin`` / ``output_cls_token`` on the extractor and ``log_n_scaling`` on the
    selector were accepted and ignored (LookWhere returned other outputs than the docs'
    "the trunk's"); ``with_cp`` checkpointed no block (the plain trunk checkpoints each):
    now each block's forward runs again in backward, with the same gradients; a frozen
    selector is in eval mode from construction (it was in train mode until the first
    ``train()`` / ``eval()``: two selections of one image differed with drop path)."""
    for key in ('out_origin', 'output_cls_token'):
        with pytest.raises(ValueError, match=f'LookWhere extractor: {key}=True is not supported'):
            LookWhere(TINY_SEL, dict(TINY_EXT, **{key: True}))
    with pytest.raises(ValueError, match='LookWhere selector: log_n_scaling is not supported'):
        LookWhere(dict(TINY_SEL, log_n_scaling=True), TINY_EXT)
    frozen = LookWhere(dict(TINY_SEL, drop_path_rate=0.5), TINY_EXT, freeze_selector=True)
    assert not frozen.selector.training and frozen.extractor.training

    x = torch.randn(1, 3, 64, 64)
    grads, calls = [], []
    for with_cp in (False, True):
        torch.manual_seed(0)
        model = LookWhere(TINY_SEL, dict(TINY_EXT, with_cp=with_cp), k=8)
        blocks = model.extractor.trunk.blocks
        calls.append(0)
        blocks[0].register_forward_pre_hook(lambda *a: calls.__setitem__(-1, calls[-1] + 1))
        model(x)[0].square().mean().backward()
        grads.append(blocks[0].attn.qkv.weight.grad.clone())
    assert calls == [1, 2]  # recomputed in backward with with_cp
    torch.testing.assert_close(grads[1], grads[0])


def test_the_selector_input_is_whole_patches():
    """A selector input off the patch grid was padded at the bottom and right: the score
    map covered zero padding and did not line up with the image (an ``input_size`` of 40
    px at patch 16 gave a 3x3 grid over 48 px, 17 % of it padding). ``input_size`` off the
    grid is refused, naming the nearest; ``input_scale`` rounds each side to patches."""
    with pytest.raises(
        ValueError,
        match=r'input_size=\(40, 64\) is not a multiple of patch_size=16.*input_size=\(48, 64\)',
    ):
        LookWhereSelector(**{**TINY_SEL, 'input_size': (40, 64)})
    sel = LookWhereSelector(**{**TINY_SEL, 'input_size': None, 'input_scale': 0.25})
    assert sel.low_res_size((168, 200)) == (48, 48)  # 42 -> 48 (2.6 patches), 50 -> 48
    assert sel.low_res_size((20, 600)) == (16, 144)  # at least one patch; 150 -> 144
    out = sel(torch.randn(1, 3, 168, 200), target_grid=(10, 12))
    assert out['grid'] == (3, 3) and out['scores'].shape == (1, 120)
