"""Jumbo tokens (``jumbo_tokens=J``, Fuller et al. 2025): J global tokens in place of CLS,
attended like CLS, joined after every attention into one ``J * D`` token for ONE wide MLP
shared by all blocks; outputs, backends, encodings, checkpoints, layer decay, configs."""

from __future__ import annotations

import math
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

from lookhere_dense.errors import CheckpointError
from lookhere_dense.lookhere import create_model
from lookhere_dense.lookhere.flex import flex_available
from lookhere_dense.lookhere.pos_encoding.spec import ENCODINGS

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
SMALL = dict(embed_dims=48, num_layers=3, num_heads=12, patch_size=8, img_size=32)

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def jumbo_model(j=3, seed=0, **kw):
    torch.manual_seed(seed)
    args = dict(SMALL, with_cls_token=False, jumbo_tokens=j, init_values=0.5)
    args.update(kw)
    return create_model(**args).eval()


def reference_tokens(model, x):
    """The Jumbo forward written out from the paper, with the model's own sub-modules."""
    tokens, grid = model._embed(x)
    j = model.jumbo_tokens
    b, _, d = tokens.shape
    for i, blk in enumerate(model.blocks):
        h = tokens + blk.ls1(
            blk.attn(blk.norm1(tokens), model.pos_enc, i, grid, j, blk.window_size)
        )
        wide = h[:, :j].reshape(b, j * d)
        wide = wide + blk.jumbo_ls(model.jumbo_mlp(blk.jumbo_norm(wide)))
        patches = h[:, j:] + blk.ls2(blk.mlp(blk.norm2(h[:, j:])))
        tokens = torch.cat([wide.reshape(b, j, d), patches], dim=1)
    return model.norm(tokens)


def test_outputs_maps_and_the_jumbo_tokens_side_by_side():
    model = jumbo_model(3, output_cls_token=True, out_indices=(1, 2))
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        outs = model(x)
        feats = model.forward_features(x)
    assert feats.shape == (2, 3 + 4 * 5, 48)
    assert len(outs) == 2
    fmap, jumbo = outs[-1]
    assert fmap.shape == (2, 48, 4, 5) and jumbo.shape == (2, 3 * 48)
    torch.testing.assert_close(jumbo, feats[:, :3].reshape(2, -1))
    torch.testing.assert_close(fmap, feats[:, 3:].transpose(1, 2).reshape(2, 48, 4, 5))
    assert model.num_prefix_tokens == 3 and not hasattr(model, 'cls_token')


def test_forward_is_the_papers_jumbo_block():
    """Fails when the wide MLP is skipped, applied per token, or replaced by the blocks' MLP."""
    model = jumbo_model(3)
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), reference_tokens(model, x))


def test_one_wide_mlp_is_shared_by_every_block():
    model = jumbo_model(2)
    calls = []
    model.jumbo_mlp.register_forward_hook(lambda m, args, out: calls.append(args[0].shape))
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert calls == [torch.Size([1, 1, 2 * 48])] * SMALL['num_layers']
    wide = [n for n, _ in model.named_parameters() if 'jumbo_mlp' in n]
    assert wide == [
        'jumbo_mlp.fc1.weight',
        'jumbo_mlp.fc1.bias',
        'jumbo_mlp.fc2.weight',
        'jumbo_mlp.fc2.bias',
    ]
    assert model.jumbo_mlp.fc1.weight.shape == (4 * 2 * 48, 2 * 48)
    assert jumbo_model(2, jumbo_mlp_ratio=2).jumbo_mlp.fc1.weight.shape == (2 * 2 * 48, 2 * 48)
    # the wide MLP mixes the J tokens: token 1's input moves token 0's output
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        before = model.forward_features(x)[:, 0]
        model.jumbo_token[:, 1] += torch.randn(48)
        after = model.forward_features(x)[:, 0]
    assert not torch.allclose(before, after)


def test_the_jumbo_tokens_skip_the_patch_mlp():
    model = jumbo_model(2)
    seen = []
    model.blocks[0].mlp.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 40))
    assert seen == [4 * 5]


@pytest.mark.parametrize('preset', ['lh180', 'lh90', 'lh45'])
def test_the_jumbo_tokens_are_global_like_cls(preset):
    """Every patch sees every Jumbo token in the first block (no LookHere mask on them),
    whatever its field of view."""
    model = jumbo_model(3, preset=preset, num_layers=1, final_norm=False)
    x = torch.randn(1, 3, 32, 40)
    with torch.no_grad():
        base = model.forward_features(x)[:, 3:]
        for j in range(3):
            step = torch.randn(48)  # not a constant: the LayerNorm would remove it
            model.jumbo_token[:, j] += step
            moved = (model.forward_features(x)[:, 3:] - base).abs().amax(-1)
            model.jumbo_token[:, j] -= step
            assert bool((moved > 1e-6).all()), (j, moved)


BACKENDS = ['reference', 'sdpa', 'chunked', 'tiled'] + (['flex'] if flex_available() else [])


@pytest.mark.parametrize('window', [0, 3])
@pytest.mark.parametrize('backend', BACKENDS[1:])
def test_every_backend_gives_the_reference_forward(backend, window):
    kw = dict(preset='lh90', window_size=window)
    if window:
        kw['window_block_indexes'] = [0, 2]
    ref = jumbo_model(3, attn_backend='reference', **kw)
    other = jumbo_model(3, attn_backend=backend, **kw)
    other.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 40, 56)  # 5x7: windows of 3 need padding
    with torch.no_grad():
        torch.testing.assert_close(
            other.forward_features(x), ref.forward_features(x), atol=1e-5, rtol=1e-4
        )


@pytest.mark.parametrize('encoding', sorted(ENCODINGS))
def test_every_position_encoding_takes_jumbo_tokens(encoding):
    model = jumbo_model(2, pos_encoding=encoding, window_size=2, window_block_indexes=[1])
    model.train()
    x = torch.randn(2, 3, 24, 40)
    out = model(x)[0]
    assert out.shape == (2, 48, 3, 5)
    out.square().mean().backward()
    for name in ('jumbo_token', 'jumbo_mlp.fc1.weight', 'blocks.0.jumbo_norm.weight'):
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and bool(grad.abs().sum() > 0), name
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x), reference_tokens(model, x))


def test_gradients_of_the_jumbo_parts_match_finite_differences():
    model = jumbo_model(2, num_layers=2).double()
    x = torch.randn(1, 3, 24, 24, dtype=torch.float64)
    names = ('jumbo_token', 'blocks.1.jumbo_norm.bias', 'jumbo_mlp.fc2.bias')
    own = dict(model.named_parameters())
    start = tuple(own[n].detach().clone().requires_grad_(True) for n in names)

    def loss(*tensors):
        out = torch.func.functional_call(model, dict(zip(names, tensors)), (x,), strict=False)
        return out[0].square().sum()

    assert torch.autograd.gradcheck(loss, start, eps=1e-6, atol=1e-6)


def test_activation_checkpointing_gives_the_same_gradients():
    plain = jumbo_model(2).train()
    cp = jumbo_model(2, with_cp=True).train()
    cp.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32)
    for m in (plain, cp):
        m.forward_features(x).square().mean().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), cp.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_a_seed_gives_a_jumbo_trunk_the_same_blocks():
    torch.manual_seed(0)
    plain = create_model(**SMALL, with_cls_token=False)
    jumbo = jumbo_model(3, init_values=1e-4)
    for name, p in plain.named_parameters():
        torch.testing.assert_close(dict(jumbo.named_parameters())[name], p, msg=name)


def test_checkpoint_round_trip_and_mismatches_name_the_key(tmp_path):
    model = jumbo_model(3)
    path = tmp_path / 'jumbo.pth'
    torch.save({'state_dict': model.state_dict()}, path)
    again = create_model(pretrained=str(path), **SMALL, with_cls_token=False, jumbo_tokens=3)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(again.eval().forward_features(x), model.forward_features(x))
    assert again.record()['jumbo_tokens'] == 3
    # a Jumbo file into a trunk without Jumbo tokens, and the other way round
    with pytest.raises(CheckpointError, match='jumbo_token'):
        create_model(pretrained=str(path), **SMALL)
    with pytest.raises(CheckpointError, match='jumbo_tokens=3'):
        create_model(**SMALL).load_state_dict(model.state_dict())
    plain = create_model(**SMALL)
    with pytest.raises(CheckpointError, match='jumbo_tokens=0'):
        jumbo_model(3).load_state_dict(plain.state_dict())
    with pytest.raises(CheckpointError, match='jumbo_tokens=2'):
        jumbo_model(3).load_state_dict(jumbo_model(2).state_dict())


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match='with_cls_token=False'):
        create_model(**SMALL, jumbo_tokens=2)
    with pytest.raises(ValueError, match='jumbo_tokens'):
        create_model(**SMALL, with_cls_token=False, jumbo_tokens=-1)
    with pytest.raises(ValueError, match='jumbo_tokens'):
        create_model(**SMALL, with_cls_token=False, jumbo_tokens=1.5)
    with pytest.raises(ValueError, match='jumbo_mlp_ratio'):
        create_model(**SMALL, with_cls_token=False, jumbo_tokens=2, jumbo_mlp_ratio=0)
    with pytest.raises(ValueError, match='output_cls_token'):
        create_model(**SMALL, with_cls_token=False, output_cls_token=True)


def test_log_n_scaling_counts_the_jumbo_tokens():
    model = jumbo_model(3, log_n_scaling=True)
    n, n_train = 8 * 8 + 3, 4 * 4 + 3
    assert model.attention_scale((8, 8)) == pytest.approx(math.log(n) / math.log(n_train))


# -- OpenMMLab: layer decay and configs --------------------------------------------------
def _segmentor(**backbone):
    from mmseg.registry import MODELS

    args = dict(
        type='LookHereViT',
        patch_size=8,
        embed_dims=24,
        num_layers=3,
        num_heads=6,
        out_indices=(2,),
        with_cls_token=False,
        jumbo_tokens=2,
    )
    args.update(backbone)
    with DefaultScope.overwrite_default_scope('mmseg'):
        return MODELS.build(
            dict(
                type='EncoderDecoder',
                data_preprocessor=dict(type='SegDataPreProcessor', mean=[0, 0, 0], std=[1, 1, 1]),
                backbone=args,
                decode_head=dict(
                    type='FCNHead',
                    in_channels=24,
                    channels=8,
                    num_convs=1,
                    num_classes=3,
                    norm_cfg=dict(type='BN', requires_grad=True),
                ),
                train_cfg=dict(),
                test_cfg=dict(mode='whole'),
            )
        )


def test_the_wide_mlp_has_its_own_layer_decay_groups():
    model = _segmentor()
    cfg = dict(
        type='OptimWrapper',
        constructor='LookHereLayerDecayOptimizerConstructor',
        optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
        paramwise_cfg=dict(num_layers=3, decay_rate=0.5, jumbo_mlp_lr_scale=0.25),
    )
    with DefaultScope.overwrite_default_scope('mmseg'):
        groups = build_optim_wrapper(model, cfg).optimizer.param_groups
    by_name = {g['group_name']: g for g in groups}
    assert sorted(by_name['jumbo_mlp_decay']['param_names']) == [
        'backbone.jumbo_mlp.fc1.weight',
        'backbone.jumbo_mlp.fc2.weight',
    ]
    assert sorted(by_name['jumbo_mlp_no_decay']['param_names']) == [
        'backbone.jumbo_mlp.fc1.bias',
        'backbone.jumbo_mlp.fc2.bias',
    ]
    assert by_name['jumbo_mlp_decay']['lr'] == pytest.approx(0.25e-3)
    assert by_name['jumbo_mlp_decay']['weight_decay'] == 0.05
    assert by_name['jumbo_mlp_no_decay']['weight_decay'] == 0.0
    assert 'backbone.jumbo_token' in by_name['layer_0_no_decay']['param_names']
    assert 'backbone.blocks.1.jumbo_norm.weight' in by_name['layer_2_no_decay']['param_names']
    assert 'backbone.blocks.1.jumbo_ls.gamma' in by_name['layer_2_no_decay']['param_names']
    names = [n for g in groups for n in g['param_names']]
    assert len(names) == len(set(names)) == len([p for p in model.parameters() if p.requires_grad])
    with pytest.raises(ValueError, match='jumbo_mlp_lr_scale'):
        with DefaultScope.overwrite_default_scope('mmseg'):
            build_optim_wrapper(
                model, dict(cfg, paramwise_cfg=dict(decay_rate=0.5, jumbo_mlp_lr_scale=0))
            )


def test_the_vit_t_jumbo_config_builds_and_segments():
    from mmseg.registry import MODELS

    cfg = Config.fromfile(osp.join(REPO, 'configs', 'segmenter_lookhere_vit-t_jumbo_ade20k.py'))
    assert cfg.model.backbone.jumbo_tokens == 6 and cfg.model.backbone.with_cls_token is False
    cfg.model.backbone.num_layers = 2
    with DefaultScope.overwrite_default_scope('mmseg'):
        model = MODELS.build(cfg.model).eval()
    assert model.backbone.jumbo_mlp.fc1.weight.shape == (4 * 6 * 192, 6 * 192)
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 48, 80), mode='tensor')
    assert logits.shape[:2] == (1, 150)


@pytest.mark.parametrize(
    'name,scope',
    [
        ('upernet_lookhere-b16_sfpn_8xb2-160k_ade20k-512x512.py', 'mmseg'),
        ('mask_rcnn_lookhere-b16_sfpn_lsj-1024-24k_cityscapes.py', 'mmdet'),
    ],
)
def test_upernet_and_vitdet_configs_take_jumbo_tokens(name, scope):
    """The SimpleFPN configs (window blocks + global blocks) accept the option."""
    if scope == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    cfg = Config.fromfile(osp.join(REPO, 'configs', name))
    cfg.merge_from_dict(
        {
            'model.backbone.embed_dims': 48,
            'model.backbone.num_heads': 6,
            'model.backbone.num_layers': 2,
            'model.backbone.window_size': 3,
            'model.backbone.window_block_indexes': [0],
            'model.backbone.out_indices': (1,),
            'model.backbone.init_cfg': None,
            'model.backbone.with_cls_token': False,
            'model.backbone.jumbo_tokens': 2,
            'model.neck.in_channels': 48,
        }
    )
    with DefaultScope.overwrite_default_scope(scope):
        model = MODELS.build(cfg.model).eval()
        with torch.no_grad():
            feats = model.extract_feat(torch.randn(1, 3, 80, 112))
    assert model.backbone.jumbo_tokens == 2
    assert len(feats) == model.neck.num_outs


def test_the_study_names_jumbo_runs():
    from research.study.aids import (
        DEFAULT_JUMBO_TOKENS,
        apply_train_aids,
        split_run_spec,
    )

    assert split_run_spec('lookhere:lh180+jumbo') == ('lookhere:lh180', ('jumbo',))
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'study', 'fov_vit_tiny.py'))
    apply_train_aids(cfg, ['jumbo'])
    assert cfg.model.backbone.jumbo_tokens == DEFAULT_JUMBO_TOKENS
    assert cfg.model.backbone.with_cls_token is False
    cfg.extrapolation.jumbo_tokens = 0
    with pytest.raises(ValueError, match='extrapolation.jumbo_tokens'):
        apply_train_aids(cfg, ['jumbo'])


def test_dpt_head_with_jumbo_tokens_is_refused_by_name():
    from lookhere_dense.errors import ConfigError
    from lookhere_dense.swap import check_model_cfg

    cfg = Config(
        dict(
            model=dict(
                type='EncoderDecoder',
                backbone=dict(
                    type='LookHereViT',
                    embed_dims=48,
                    num_heads=12,
                    num_layers=2,
                    out_indices=(0, 1),
                    with_cls_token=False,
                    jumbo_tokens=2,
                    output_cls_token=True,
                ),
                decode_head=dict(type='DPTHead', in_channels=(48, 48), num_classes=3),
            )
        )
    )
    with pytest.raises(ConfigError, match='jumbo_tokens=2'):
        check_model_cfg(cfg)


def test_a_zero_width_or_unused_wide_mlp_is_refused():
    with pytest.raises(ValueError, match='jumbo_mlp_ratio=0.001 gives the wide MLP 0 channels'):
        create_model(**SMALL, with_cls_token=False, jumbo_tokens=2, jumbo_mlp_ratio=0.001)
    with pytest.raises(ValueError, match='jumbo_mlp_ratio=2 needs jumbo_tokens > 0'):
        create_model(**SMALL, jumbo_mlp_ratio=2)


def test_the_jumbo_config_trains_with_layer_decay_and_predicts_through_mmseg(
    tmp_path, monkeypatch
):
    """``tools/train.py configs/segmenter_lookhere_vit-t_jumbo_ade20k.py`` (two blocks, two
    iterations) with the layer-decay constructor, then mmseg's own ``init_model`` /
    ``inference_model`` on the checkpoint it wrote: the Jumbo record travels with it."""
    import numpy as np
    from mmseg.apis import inference_model, init_model

    from lookhere_dense.apis.train import train_model
    from research.datasets.synthetic_seg import make_ade20k_like

    make_ade20k_like(tmp_path / 'data', num_train=2, num_val=1)
    monkeypatch.chdir(tmp_path)
    config = osp.join(REPO, 'configs', 'segmenter_lookhere_vit-t_jumbo_ade20k.py')
    options = {
        'model.backbone.num_layers': 2,
        'model.decode_head.num_layers': 1,
        'train_cfg.max_iters': 2,
        'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'optim_wrapper.constructor': 'LookHereLayerDecayOptimizerConstructor',
        'optim_wrapper.paramwise_cfg': dict(decay_rate=0.9, jumbo_mlp_lr_scale=0.5),
    }
    runner = train_model(config, cfg_options=options)
    assert runner.iter == 2
    names = {g['group_name']: g for g in runner.optim_wrapper.optimizer.param_groups}
    assert names['jumbo_mlp_decay']['lr_scale'] == 0.5
    ckpt = osp.join('work_dirs', 'segmenter_lookhere_vit-t_jumbo_ade20k', 'iter_2.pth')
    cfg = Config.fromfile(config)
    cfg.merge_from_dict({'model.backbone.num_layers': 2, 'model.decode_head.num_layers': 1})
    model = init_model(cfg, ckpt, device='cpu')
    assert model.backbone.jumbo_tokens == 6
    image = np.random.default_rng(0).integers(0, 255, (96, 128, 3), dtype=np.uint8)
    result = inference_model(model, image)
    assert tuple(result.pred_sem_seg.data.shape[-2:]) == (96, 128)
    # the same file into the config without Jumbo tokens: refused, naming the option
    plain = Config.fromfile(osp.join(REPO, 'configs', 'segmenter_lookhere_vit-t_ade20k.py'))
    plain.merge_from_dict({'model.backbone.num_layers': 2, 'model.decode_head.num_layers': 1})
    with pytest.raises(CheckpointError, match='jumbo_tokens=6'):
        init_model(plain, ckpt, device='cpu')
