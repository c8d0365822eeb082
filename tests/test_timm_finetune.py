"""timm's fine-tuning API on the LookHere timm models (:mod:`lookhere_dense.timm_models`):
``set_grad_checkpointing`` (the model and the ``features_only`` wrapper), ``group_matcher``
(timm's layer-wise lr decay groups per block as for timm's own ViT), ``no_weight_decay``,
the ``features_only`` ``out_indices`` as timm's ViT reports them and ``set_input_size``.
"""

from __future__ import annotations

import math

import pytest
import torch

timm = pytest.importorskip('timm')

from timm.optim import create_optimizer_v2, param_groups_weight_decay  # noqa: E402

import lookhere_dense  # noqa: E402,F401 - registers (timm is imported)

TINY = 'lookhere_vit_tiny_patch16_224'


def _lr_scales(model, **kwargs) -> dict:
    """``{parameter name: lr_scale}`` of timm's AdamW with layer decay 0.5."""
    opt = create_optimizer_v2(model, 'adamw', lr=1e-3, layer_decay=0.5, **kwargs)
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g['lr_scale'] for g in opt.param_groups for p in g['params']}


def _weight_decays(model) -> dict:
    opt = create_optimizer_v2(model, 'adamw', lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: g['weight_decay'] for g in opt.param_groups for p in g['params']}


# ----------------------------------------------------------------------------------------
# set_grad_checkpointing
# ----------------------------------------------------------------------------------------
def _block_calls(model, blocks) -> list:
    calls = [0] * len(blocks)
    for i, blk in enumerate(blocks):
        # a pre-hook: the recomputation may stop inside the block once it has what it needs
        blk.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


@pytest.mark.parametrize('features', [False, True])
def test_set_grad_checkpointing_recomputes_the_blocks(features):
    """With checkpointing the backward pass runs each block's forward again (and the
    gradients stay the same); ``grad_checkpointing`` reports it, ``enable=False`` ends it."""
    torch.manual_seed(0)
    kw = dict(features_only=True, out_indices=(0, 1)) if features else dict(num_classes=4)
    model = timm.create_model(TINY, depth=2, **kw).train()
    trunk = model.model if features else model
    x = torch.randn(2, 3, 32, 48)

    def step() -> tuple:
        model.zero_grad()
        out = model(x)
        loss = sum(o.square().mean() for o in out) if features else out.square().mean()
        loss.backward()
        return tuple(p.grad.clone() for p in model.parameters() if p.grad is not None)

    calls = _block_calls(model, trunk.blocks)
    plain = step()
    assert calls == [1, 1] and not trunk.grad_checkpointing
    model.set_grad_checkpointing()
    assert trunk.grad_checkpointing and trunk.with_cp
    calls[:] = [0, 0]
    again = step()
    assert calls == [2, 2]  # forward, then again in the backward pass
    for a, b in zip(plain, again):
        torch.testing.assert_close(a, b)
    model.set_grad_checkpointing(False)
    calls[:] = [0, 0]
    step()
    assert calls == [1, 1] and not trunk.grad_checkpointing


# ----------------------------------------------------------------------------------------
# group_matcher, no_weight_decay
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('num_classes', [0, 10])
def test_layer_decay_groups_as_timms_vit(num_classes):
    """timm's layer-wise decay gives every parameter the lr scale it gives the parameter of
    that name in timm's ViT (with a classifier blocks.0 0.5**12 and patch_embed 0.5**13;
    the final norm in the last block's group), not one group for all."""
    ours = _lr_scales(timm.create_model(TINY, num_classes=num_classes))
    vit = timm.create_model('vit_tiny_patch16_224', num_classes=num_classes, init_values=1e-4)
    theirs = _lr_scales(vit)
    shared = set(ours) & set(theirs)
    assert {'cls_token', 'patch_embed.proj.weight', 'blocks.0.attn.qkv.weight'} <= shared
    assert {'blocks.11.ls2.gamma', 'norm.weight'} <= shared
    assert {n: ours[n] for n in shared} == {n: theirs[n] for n in shared}
    top = 12 if num_classes == 0 else 13
    assert ours['patch_embed.proj.weight'] == 0.5**top
    assert ours['blocks.0.mlp.fc1.weight'] == 0.5 ** (top - 1)
    assert ours['blocks.11.mlp.fc1.weight'] == 0.5 ** (top - 12)


def test_layer_decay_groups_learnable_slopes_with_their_block():
    """Layer i's learnable slopes go with block i, the global slope with the final norm,
    as the mmengine layer-decay constructor assigns them; position parameters with the
    stem."""
    model = timm.create_model(TINY, depth=2, num_classes=0, lh_config=dict(learnable_slopes=True))
    scales = _lr_scales(model)
    assert scales['pos_enc.slopes.layer_log_ratio.0'] == scales['blocks.0.norm1.weight']
    assert scales['pos_enc.slopes.head_log_ratio.1'] == scales['blocks.1.norm1.weight']
    assert scales['pos_enc.slopes.global_log_ratio'] == scales['norm.weight'] == 1.0
    assert scales['blocks.0.norm1.weight'] == 0.5 and scales['cls_token'] == 0.25
    absolute = _lr_scales(timm.create_model(TINY, depth=2, num_classes=0, pos_encoding='abs'))
    assert absolute['pos_enc.pos_embed'] == absolute['patch_embed.proj.weight'] == 0.25


def test_no_weight_decay_exempts_tokens_position_parameters_and_slopes():
    """``no_weight_decay()`` reaches timm's optimizer factory: the CLS token, position
    parameters and learnable slopes get none even where timm's 1-D rule would not exempt
    them; weights do."""
    model = timm.create_model(TINY, depth=2, num_classes=0, lh_config=dict(learnable_slopes=True))
    decays = _weight_decays(model)
    assert decays['cls_token'] == 0 and decays['blocks.0.attn.qkv.weight'] == 0.05
    import inspect

    if 'weight_decay_exclude_1d' not in inspect.signature(param_groups_weight_decay).parameters:
        pytest.skip("this timm's param_groups_weight_decay has no weight_decay_exclude_1d")
    groups = param_groups_weight_decay(
        model, 0.05, weight_decay_exclude_1d=False, no_weight_decay_list=model.no_weight_decay()
    )
    no_decay = {
        n
        for n, p in model.named_parameters()
        for g in groups
        if g['weight_decay'] == 0 and any(p is q for q in g['params'])
    }
    assert {'cls_token', 'pos_enc.slopes.global_log_ratio', 'pos_enc.slopes.head_log_ratio.0'} <= (
        no_decay
    )
    assert 'blocks.0.norm1.weight' not in no_decay  # 1-D: only by timm's own 1-D rule
    absolute = timm.create_model(TINY, depth=2, num_classes=0, pos_encoding='abs')
    assert _weight_decays(absolute)['pos_enc.pos_embed'] == 0


@pytest.mark.parametrize(
    'kw',
    [
        dict(pos_encoding='abs'),
        dict(pos_encoding='rope2d_mixed'),
        dict(pos_encoding='pape'),
        dict(lh_config=dict(learnable_slopes=True)),
        dict(jumbo_tokens=2, with_cls_token=False),
    ],
)
def test_timm_and_the_mmengine_constructor_exempt_the_same_parameters(kw):
    """The exemptions are written twice (``no_weight_decay()`` for timm's factory, the
    layer-decay constructor's own rule for mmengine): the same backbone trained through
    either route decays the same tensors."""
    from torch import nn

    from lookhere_dense.engine.layer_decay import LookHereLayerDecayOptimizerConstructor
    from lookhere_dense.models.backbones import LookHereViT

    timm_kw = dict(kw)
    if 'jumbo_tokens' in kw:  # timm's names for a trunk without CLS token
        timm_kw = dict(jumbo_tokens=2, class_token=False, global_pool='avg')
    ours = timm.create_model(TINY, depth=2, num_classes=0, **timm_kw)
    timm_free = {n for n, wd in _weight_decays(ours).items() if wd == 0}
    model = nn.Module()
    model.backbone = LookHereViT(embed_dims=192, num_layers=2, num_heads=12, **kw)
    opt = LookHereLayerDecayOptimizerConstructor(
        dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05)),
        dict(decay_rate=0.9),
    )(model)
    names = {id(p): n.removeprefix('backbone.') for n, p in model.named_parameters()}
    mm_free = {
        names[id(p)]
        for g in opt.optimizer.param_groups
        if g['weight_decay'] == 0
        for p in g['params']
    }
    assert mm_free == timm_free
    assert {n for n, p in ours.named_parameters() if p.dim() > 1} & timm_free  # not only 1-D


def test_the_features_only_wrapper_has_the_same_groups():
    """The wrapper's names are the model's under ``model.``; it holds no classifier (as
    timm's pruned ViT: no parameters without gradients, no group above the blocks)."""
    model = timm.create_model(TINY, depth=2, features_only=True, out_indices=(0, 1))
    assert not [n for n, _ in model.named_parameters() if n.startswith('model.head')]
    scales = _lr_scales(model)
    assert scales['model.patch_embed.proj.weight'] == scales['model.cls_token'] == 0.25
    assert scales['model.blocks.0.attn.qkv.weight'] == 0.5
    assert scales['model.blocks.1.attn.qkv.weight'] == scales['model.norm.weight'] == 1.0
    assert _weight_decays(model)['model.cls_token'] == 0


# ----------------------------------------------------------------------------------------
# features_only out_indices
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('out_indices', [None, (-1, 2), (3, 5, 7, 11)])
def test_features_only_out_indices_as_timms_vit(out_indices):
    kw = {} if out_indices is None else dict(out_indices=out_indices)
    ours = timm.create_model(TINY, features_only=True, **kw)
    vit = timm.create_model('vit_tiny_patch16_224', features_only=True, **kw)
    assert ours.feature_info.out_indices == vit.feature_info.out_indices
    assert list(ours.out_indices) == list(vit.out_indices)
    if out_indices is None:
        assert ours.feature_info.out_indices == (9, 10, 11)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        maps = ours.eval()(x)
        want = ours.model.forward_intermediates(
            x, indices=3 if out_indices is None else out_indices, intermediates_only=True
        )
    assert len(maps) == len(want) == len(ours.feature_info.out_indices)
    for a, b in zip(maps, want):
        assert torch.equal(a, b)


# ----------------------------------------------------------------------------------------
# set_input_size
# ----------------------------------------------------------------------------------------
def test_set_input_size_moves_the_training_size_and_keeps_the_lookhere_output():
    """The LookHere bias has no size: an input gives the same features before and after;
    what moves is the training grid (``log_n_scaling``'s reference) and timm's record."""
    get_model_input_config = getattr(timm.models, 'get_model_input_config', None)
    if get_model_input_config is None:
        pytest.skip("this timm has no get_model_input_config (timm's record of the size)")

    torch.manual_seed(0)
    model = timm.create_model(f'{TINY}.lh90', num_classes=0, depth=2, log_n_scaling=True)
    model.eval()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        before = model.forward_features(x)
        assert model.attention_scale((6, 8)) == pytest.approx(math.log(49) / math.log(197))
        model.set_input_size((96, 128))
        assert model.train_grid == (6, 8) and model.img_size == (96, 128)
        assert model.attention_scale((6, 8)) == 1.0  # the new reference
        model.set_input_size(224)
        assert torch.equal(model.forward_features(x), before)
    assert get_model_input_config(model)['input_size'] == (3, 224, 224)
    model.set_input_size(384, patch_size=16)
    assert get_model_input_config(model)['input_size'] == (3, 384, 384)
    assert model.train_grid == (24, 24)
    with pytest.raises(ValueError, match="patch_size=8 is not the model's 16"):
        model.set_input_size(224, patch_size=8)
    with pytest.raises(ValueError, match=r'img_size must be a positive int .* got \(0, 4\)'):
        model.set_input_size((0, 4))
    assert model.train_grid == (24, 24)  # a refused call changes nothing


def test_set_input_size_resamples_an_abs_table_as_the_forward_would():
    """``abs``: after ``set_input_size(S)`` the table has S's grid, and an S input gives
    what it gave before the call (the forward resampled the table the same way)."""
    torch.manual_seed(0)
    model = timm.create_model(TINY, num_classes=0, depth=2, pos_encoding='abs').eval()
    x = torch.randn(1, 3, 160, 96)
    with torch.no_grad():
        before = model.forward_features(x)
        model.set_input_size((160, 96))
        assert tuple(model.pos_enc.pos_embed.shape) == (1, 10 * 6, 192)
        assert model.pos_enc.grid_size == (10, 6) and model.pos_enc.pos_embed.requires_grad
        torch.testing.assert_close(model.forward_features(x), before, rtol=0, atol=1e-6)


def test_a_loaded_training_size_keeps_the_abs_table_in_the_optimizer():
    """mmengine's Runner builds the optimizer before ``load_from`` / ``--resume``: a file
    whose recorded ``log_n_scaling`` training size differs resized the ``abs`` table into
    a new parameter the optimizer never saw, and the table stopped training silently."""
    torch.manual_seed(0)
    kw = dict(num_classes=0, depth=2, img_size=64, log_n_scaling=True, pos_encoding='abs')
    trained = timm.create_model(TINY, **kw)
    model = timm.create_model(TINY, **{**kw, 'img_size': 32})
    table = model.pos_enc.pos_embed
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model.load_state_dict(trained.state_dict())
    assert model.pos_enc.pos_embed is table and model.img_size == (64, 64)  # the file's
    torch.testing.assert_close(table, trained.pos_enc.pos_embed, rtol=0, atol=0)
    before = table.detach().clone()
    model.forward_features(torch.randn(1, 3, 64, 64)).square().mean().backward()
    opt.step()
    assert table.grad is not None and not torch.equal(table.detach(), before)


def test_set_input_size_leaves_a_model_without_log_n_as_it_was():
    """Without ``log_n_scaling`` nothing of a LookHere model depends on the training size:
    the features of a model told 384 px equal the 224 px model's, windowed blocks too; a
    frozen ``abs`` table stays frozen."""
    torch.manual_seed(0)
    model = timm.create_model(
        f'{TINY}.lh90', num_classes=0, depth=2, window_size=3, window_block_indexes=[0]
    ).eval()
    x = torch.randn(1, 3, 80, 112)
    with torch.no_grad():
        before = model.forward_features(x)
        model.set_input_size(384)
        assert torch.equal(model.forward_features(x), before)
    frozen = timm.create_model(TINY, num_classes=0, depth=1, pos_encoding='abs')
    frozen.pos_enc.pos_embed.requires_grad_(False)
    frozen.set_input_size(96)
    assert not frozen.pos_enc.pos_embed.requires_grad and frozen.pos_enc.grid_size == (6, 6)


def test_the_log_n_training_size_travels_with_the_weights(tmp_path):
    """``set_input_size(128)`` before fine-tuning moves ``log_n_scaling``'s reference; a
    reload built at the original size scaled against 64 px again, all keys matching (a
    new-user trial: outputs 2.8e-4 apart at 128 px). The size is in the weights' record
    and adopted when they load; without log_n_scaling the record is as before."""
    kw = dict(embed_dim=96, depth=3, init_values=0.1, img_size=64, log_n_scaling=True)
    name = 'lookhere_vit_tiny_patch16_224'
    tuned = timm.create_model(name, num_classes=7, **kw)
    tuned.set_input_size(128)
    tuned.eval()
    path = tmp_path / 'ft.pth'
    torch.save(tuned.state_dict(), path)
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        want = tuned(x)
    again = timm.create_model(name, num_classes=7, **kw).eval()
    again.load_state_dict(torch.load(path, weights_only=True))
    via_file = timm.create_model(name, num_classes=7, checkpoint_path=str(path), **kw).eval()
    for model in (again, via_file):
        assert model.img_size == (128, 128)
        with torch.no_grad():
            assert torch.equal(model(x), want)
    plain = timm.create_model(name, num_classes=7, embed_dim=96, depth=3)
    assert 'log_n_train_size' not in plain.record()


# ----------------------------------------------------------------------------------------
# prune_intermediate_layers
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('name', [TINY, 'vit_tiny_patch16_224'])  # timm's ViT: the reference
@pytest.mark.parametrize('prune_norm', [False, True])
@pytest.mark.parametrize('indices', [[1, 2], [0], 2])
def test_pruning_keeps_the_kept_blocks_outputs(name, prune_norm, indices):
    """After ``prune_intermediate_layers`` the blocks asked for give what they gave before
    (the new last block's output got the final norm: block 2 differed by up to 1.7), as
    timm's ViT gives; ``norm=True`` normalises them while the norm stays
    (``prune_norm=False``); the final tokens are ``forward_features``'s, after the norm
    where it stays."""
    torch.manual_seed(0)
    model = timm.create_model(name, depth=4, img_size=64, num_classes=0).eval()
    x = torch.randn(1, 3, 64, 64)

    def run(**kw):
        return model.forward_intermediates(x, indices=indices, intermediates_only=True, **kw)

    with torch.no_grad():
        plain, normed = run(), run(norm=True)
        model.prune_intermediate_layers(indices, prune_norm=prune_norm)
        after, after_normed = run(), run(norm=True)
        final, last = model.forward_intermediates(
            x, indices=[len(model.blocks) - 1], output_fmt='NLC'
        )
        features = model.forward_features(x)
    assert len(after) == len(plain)
    for a, b in zip(after, plain):
        assert torch.equal(a, b)
    cut = indices != 2  # the last two of four keep every block
    if not prune_norm or (name == TINY and not cut):  # ours keeps a norm the last block has
        for a, b in zip(after_normed, normed):
            assert torch.equal(a, b)
    elif cut:  # the norm is gone
        for a, b in zip(after_normed, after):
            assert torch.equal(a, b)
    assert torch.equal(final, features)
    if cut:  # the kept blocks' last output, then the norm where it stays
        norm = model.norm if not prune_norm else torch.nn.Identity()
        with torch.no_grad():
            assert torch.equal(final[:, 1:], norm(last[0]))


# ----------------------------------------------------------------------------------------
# reset_classifier and act_layer as timm's ViT takes them
# ----------------------------------------------------------------------------------------
def test_reset_classifier_checks_global_pool_as_the_constructor():
    """``reset_classifier(n, global_pool)`` takes the pools the constructor takes and
    refuses others in its words (it took any string and returned per-token logits,
    ``(2, 17, 4)`` for ``'max'``); ``'token'`` needs the CLS token."""
    model = timm.create_model(TINY, img_size=64, depth=1, num_classes=5)
    with pytest.raises(ValueError, match=r"global_pool must be 'token', 'avg' or '', got 'max'"):
        model.reset_classifier(4, 'max')
    model.reset_classifier(4, 'avg')
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 4)
    no_cls = timm.create_model(TINY, depth=1, class_token=False, global_pool='avg')
    with pytest.raises(ValueError, match="global_pool='token' needs the CLS token"):
        no_cls.reset_classifier(4, 'token')


def test_a_timm_activation_name_is_resolved_as_timm_does():
    """``act_layer='gelu_tanh'`` is resolved with timm's ``get_act_layer`` as for timm's
    ViT (it was called as a class: TypeError 'str' object is not callable)."""
    model = timm.create_model(TINY, img_size=64, depth=1, num_classes=4, act_layer='gelu_tanh')
    vit = timm.create_model('vit_tiny_patch16_224', depth=1, act_layer='gelu_tanh')
    assert type(model.blocks[0].mlp.act) is type(vit.blocks[0].mlp.act)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 4)
