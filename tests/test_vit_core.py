"""The torch-only trunk (``lookhere_dense.lookhere.vit``) and the OpenMMLab wrapper
``LookHereViT`` are one model: the same state_dict keys, the same initial weights for one
seed, the same outputs; ``create_model`` loads official, timm and our files with the same
strict checks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from lookhere_dense.errors import CheckpointError
from lookhere_dense.lookhere import LookHereVisionTransformer, create_model
from lookhere_dense.lookhere.weights import save_backbone_checkpoint
from lookhere_dense.models.backbones import LookHereViT

ARCHS = {
    'global': dict(embed_dims=48, num_layers=3, num_heads=12, out_indices=(0, 2), preset='lh90'),
    'windows': dict(
        embed_dims=48,
        num_layers=4,
        num_heads=12,
        out_indices=(1, 3),
        window_size=3,
        window_block_indexes=(0, 2),
        preset='lh45',
        drop_path_rate=0.1,
    ),
    'rope_no_cls': dict(
        embed_dims=48,
        num_layers=2,
        num_heads=12,
        pos_encoding='rope2d',
        with_cls_token=False,
        init_values=None,
    ),
    'abs_cls_out': dict(
        embed_dims=48,
        num_layers=2,
        num_heads=12,
        pos_encoding='abs',
        img_size=64,
        output_cls_token=True,
        out_origin=True,
    ),
}


def _pair(arch):
    torch.manual_seed(0)
    core = create_model(**arch).eval()
    torch.manual_seed(0)
    wrapped = LookHereViT(**arch)
    wrapped.init_weights()
    return core, wrapped.eval()


def _flat(outs):
    return [t for o in outs for t in (o if isinstance(o, (list, tuple)) else [o])]


@pytest.mark.parametrize('name', list(ARCHS))
def test_wrapper_and_core_are_one_model(name):
    core, wrapped = _pair(ARCHS[name])
    assert isinstance(wrapped, LookHereVisionTransformer)
    sd_core, sd_wrapped = core.state_dict(), wrapped.state_dict()
    assert list(sd_core) == list(sd_wrapped)  # same keys, same order
    for key, value in sd_core.items():  # one seed, one initialisation
        torch.testing.assert_close(sd_wrapped[key], value, rtol=0, atol=0, msg=key)
    x = torch.randn(2, 3, 80, 112)
    with torch.no_grad():
        a, b = core(x), wrapped(x)
        for t, u in zip(_flat(a), _flat(b), strict=True):
            torch.testing.assert_close(t, u, rtol=0, atol=0)
        torch.testing.assert_close(core.forward_features(x), wrapped.forward_features(x))
    # weights move between the two by state_dict
    other = LookHereVisionTransformer(**ARCHS[name]).eval()
    other.load_state_dict(wrapped.state_dict())
    with torch.no_grad():
        for t, u in zip(_flat(other(x)), _flat(b), strict=True):
            torch.testing.assert_close(t, u, rtol=0, atol=0)


def test_wrapper_builds_norms_and_activations_from_mmcv_configs():
    wrapped = LookHereViT(
        embed_dims=48,
        num_layers=1,
        num_heads=12,
        norm_cfg=dict(type='LN', eps=1e-6),
        act_cfg=dict(type='ReLU'),
    )
    assert wrapped.blocks[0].norm1.eps == 1e-6 and wrapped.norm.eps == 1e-6
    assert isinstance(wrapped.blocks[0].mlp.act, torch.nn.ReLU)
    core = LookHereVisionTransformer(embed_dims=48, num_layers=1, num_heads=12)
    assert core.blocks[0].norm1.eps == 1e-5 and isinstance(core.blocks[0].mlp.act, torch.nn.GELU)


def test_create_model_reproduces_the_official_model(official_tiny):
    io = official_tiny.io
    model = create_model(str(official_tiny.path), **official_tiny.vit_kwargs).eval()
    assert model.lh_config.head_directions == 'halves-none'  # taken from the file
    for name, case in io['cases'].items():  # 128x96 extrapolates the 4x4 training grid
        with torch.no_grad():
            feats = model.forward_features(case['input'])
        torch.testing.assert_close(feats, case['forward_features'], atol=1e-4, rtol=0, msg=name)


def test_create_model_takes_a_pathlib_path_and_refuses_pretrained_true(official_tiny):
    """Paths load as strings do (they were taken for loaded checkpoints); ``True``, timm's
    habit, is refused naming the argument, before a model is built; a bad file's message
    speaks of ``num_heads``, not of an mmseg config key only."""
    by_str = create_model(str(official_tiny.path), **official_tiny.vit_kwargs).eval()
    by_path = create_model(Path(official_tiny.path), **official_tiny.vit_kwargs).eval()
    for key, value in by_str.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, by_path.state_dict()[key]), key
    model = create_model(**official_tiny.vit_kwargs)
    model.load_pretrained(Path(official_tiny.path))
    assert torch.equal(model.blocks[0].attn.qkv.weight, by_str.blocks[0].attn.qkv.weight)
    with pytest.raises(TypeError) as err:
        create_model(True, **official_tiny.vit_kwargs)
    assert str(err.value) == (
        'create_model: pretrained must be a checkpoint file (str or pathlib.Path) or a loaded '
        'checkpoint (a dict), got True; no weights are downloaded: pass the file, e.g. '
        "'LH_180_weights_and_config.pth'"
    )
    with pytest.raises(FileNotFoundError, match=r'is no file but a timm model name: timm'):
        create_model('lookhere_vit_base_patch16_224.lh90')
    with pytest.raises(FileNotFoundError) as err:  # a file of the user's, not there
        create_model('lookhere_vit_b16.pth')
    assert 'timm' not in str(err.value)
    assert create_model(False, **official_tiny.vit_kwargs) is not None  # timm: no weights
    with pytest.raises(TypeError, match=r'checkpoint must be a checkpoint file .* got 3'):
        model.load_pretrained(3)
    with pytest.raises(CheckpointError, match=r'Set num_heads=12 \(model.backbone.num_heads'):
        create_model(Path(official_tiny.path), **{**official_tiny.vit_kwargs, 'num_heads': 6})


def test_strict_false_names_what_keeps_its_initial_values(official_tiny):
    """A deeper model than the file, loaded with strict=False: a warning names the
    tensors the file lacks (it loaded half a model silently before)."""
    kwargs = {**official_tiny.vit_kwargs, 'num_layers': official_tiny.vit_kwargs['num_layers'] + 1}
    last = kwargs['num_layers'] - 1
    with pytest.warns(UserWarning) as seen:
        model = create_model(Path(official_tiny.path), strict=False, **kwargs)
    msgs = [str(w.message) for w in seen if 'strict=False' in str(w.message)]
    assert len(msgs) == 1 and f"keep their initial values: ['blocks.{last}." in msgs[0], msgs
    assert model.lh_config.head_directions == 'halves-none'


def test_create_model_applies_the_strict_checks(reference_dir: Path, tmp_path: Path):
    path = str(reference_dir / 'official_tiny_halves_none.pth')
    with pytest.raises(CheckpointError, match='has 12 attention heads.*num_heads=6'):
        create_model(path, embed_dims=96, num_layers=3, num_heads=6, init_values=0.1)
    with pytest.raises(CheckpointError, match='set num_layers=3'):
        create_model(path, embed_dims=96, num_layers=2, num_heads=12, init_values=0.1)
    with pytest.raises(ValueError, match='conflicts with the one stored'):
        create_model(
            path, embed_dims=96, num_layers=3, num_heads=12, init_values=0.1, preset='lh90'
        )
    # a timm-style file without a head count: stated with checkpoint_num_heads
    src = create_model(embed_dims=48, num_layers=2, num_heads=12)
    flat = tmp_path / 'timm.pth'
    torch.save({k: v for k, v in src.state_dict().items() if not k.endswith('_extra_state')}, flat)
    with pytest.raises(CheckpointError, match='checkpoint_num_heads=N'):
        create_model(str(flat), embed_dims=48, num_layers=2, num_heads=12)
    model = create_model(
        str(flat), embed_dims=48, num_layers=2, num_heads=12, checkpoint_num_heads=12
    )
    torch.testing.assert_close(model.blocks[1].attn.qkv.weight, src.blocks[1].attn.qkv.weight)
    # our own converted file records its head count and LookHere config
    ours = tmp_path / 'ours.pth'
    save_backbone_checkpoint(str(ours), src.state_dict(), src.lh_config.to_dict(), 'test')
    again = create_model(str(ours), embed_dims=48, num_layers=2, num_heads=12)
    assert again.lh_config == src.lh_config


def test_the_torch_only_routes_name_their_own_calls(official_tiny):
    """What a plain-PyTorch user meets: timm's argument names refused with ours (a bare
    TypeError before), an official ``state_dict`` given to ``load_state_dict`` refused
    naming ``load_pretrained`` (PyTorch's ``Missing key(s): "_extra_state"`` before), and
    a strict refusal's advice in ``create_model`` / ``load_pretrained`` terms, not
    mmseg's ``init_cfg``."""
    path, kw = str(official_tiny.path), official_tiny.vit_kwargs
    with pytest.raises(
        TypeError,
        match=r"create_model: unexpected argument\(s\) 'embed_dim' is timm's name: use "
        r"'embed_dims', 'depth' is timm's name: use 'num_layers', 'num_head': did you mean "
        r"'num_heads'",
    ):
        create_model(path, embed_dim=96, depth=3, num_head=12)
    weights = torch.load(path, weights_only=True)['weights']
    model = create_model(**kw)
    with pytest.raises(
        CheckpointError,
        match=r"state_dict has no '_extra_state' .*model\.load_pretrained\(PATH_OR_STATE_DICT\)",
    ):
        model.load_state_dict(weights)
    assert model.load_pretrained(weights, checkpoint_num_heads=12)['dropped'][0] == 'head.fc1.bias'
    model.load_state_dict(model.state_dict())  # its own: as in PyTorch
    with pytest.raises(CheckpointError) as info:
        create_model(path, **{**kw, 'init_values': None})
    assert 'create_model(FILE, ..., strict=False) or model.load_pretrained(FILE' in str(info.value)
    assert 'init_cfg' not in str(info.value)
    with pytest.raises(CheckpointError, match=r"init_cfg=dict\(type='Pretrained'"):
        LookHereViT(**{**kw, 'init_values': None}).load_pretrained(path)


def test_initialisation_draws_what_mmengine_drew():
    """The trunk initialises with its own truncated normal; one seed must give the numbers
    mmengine's ``trunc_normal_`` gave (the backbone used it before), so seeded runs and the
    committed demo / study numbers stay reproducible."""
    from mmengine.model.weight_init import trunc_normal_ as mmengine_trunc_normal

    from lookhere_dense.lookhere.vit import trunc_normal_

    for std in (0.02, 1.0):
        torch.manual_seed(0)
        theirs = mmengine_trunc_normal(torch.empty(4096), std=std)
        torch.manual_seed(0)
        ours = trunc_normal_(torch.empty(4096), std=std)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_non_finite_images_are_refused_by_name():
    from lookhere_dense.errors import NonFiniteInputError

    model = create_model(embed_dims=48, num_layers=1, num_heads=12).eval()
    x = torch.randn(3, 3, 32, 48)
    x[1, 0, 5, 7] = float('nan')
    x[2, 2, 0, 0] = float('inf')
    with pytest.raises(
        NonFiniteInputError, match=r'2 NaN / infinite values .*1 NaN; images \[1, 2\]'
    ):
        model(x)
    with pytest.raises(NonFiniteInputError):
        model.forward_features(x)
    assert model(x[:1])[0].isfinite().all()  # the finite image alone is fine


def test_features_that_overflow_from_finite_images_are_refused_by_cause():
    """In inference, finite images whose values overflow inside the backbone (never
    normalised, scaled by 1e30), or NaN weights, give NaN features: refused with the cause
    named, by ``forward`` and ``forward_features``; in training the NaN goes on to the
    loss (the ``FiniteLossHook``'s, and fp16 loss scaling's, to handle)."""
    from lookhere_dense.errors import USER_ERRORS, NonFiniteFeaturesError

    model = create_model(embed_dims=48, num_layers=2, num_heads=12).eval()
    x = torch.randn(2, 3, 32, 48)
    assert model(x * 1e15)[0].isfinite().all()  # large, and no overflow: fine
    with pytest.raises(
        NonFiniteFeaturesError, match=r'input values reach \|x\| = \d.*e\+30'
    ) as err:
        model(x * 1e30)
    assert isinstance(err.value, USER_ERRORS) and 'mean / std' in str(err.value)
    with pytest.raises(NonFiniteFeaturesError, match='input values reach'):
        model.forward_features(x * 1e30)
    with torch.no_grad():
        model.blocks[1].mlp.fc1.weight[3, 4] = float('nan')
    with pytest.raises(NonFiniteFeaturesError, match=r'\(1: blocks\.1\.mlp\.fc1\.weight\)'):
        model(x)
    assert model.train()(x)[0].isnan().all()  # training: no refusal (see the next test)


def test_in_training_the_cause_of_non_finite_features_is_kept_for_the_loss_hook():
    """In training (CPU) the forward does not stop at non-finite features: the NaN reaches
    the loss, which the ``FiniteLossHook`` stops on; the cause is kept for its message,
    found before the optimizer step turns every weight NaN. Weights grown huge (a learning
    rate too high) are told from huge inputs, in inference too."""
    from lookhere_dense.errors import NonFiniteFeaturesError

    model = create_model(embed_dims=48, num_layers=2, num_heads=12).train()
    x = torch.randn(2, 3, 32, 48)
    model(x)
    assert model.nonfinite_features is None
    model(x * 1e30)
    assert 'input values reach |x| = ' in model.nonfinite_features
    model(x)  # a finite forward clears it
    assert model.nonfinite_features is None
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(1e30)
    model(x)
    cause = model.nonfinite_features
    assert 'the weights reach |w| = ' in cause and '(blocks.0.attn.qkv.weight;' in cause
    assert 'optim_wrapper.optimizer.lr' in cause and 'input values' not in cause
    with pytest.raises(NonFiniteFeaturesError, match=r'weights reach .*load other weights'):
        model.eval()(x)
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.fill_(float('nan'))
    model.train()(x)
    assert 'parameters of the model hold NaN' in model.nonfinite_features
    assert 'blocks.0.attn.qkv.weight' in model.nonfinite_features


def test_non_finite_counts_say_they_are_of_what_the_backbone_receives(tmp_path):
    """One inf in a user's float image becomes several NaN / inf values once a pipeline
    resizes it (bilinear: inf * 0 is NaN): the message must not present those as the
    user's counts."""
    import numpy as np
    from tiny_seg import ADE_CFG, SHRINK, options, write_checkpoint

    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.errors import NonFiniteInputError

    ckpt = write_checkpoint(str(tmp_path / 'ckpt.pth'))
    cfg_path = str(tmp_path / 'cfg.py')
    load_config(ADE_CFG, options(*SHRINK, 'model.test_cfg.mode=whole')).dump(cfg_path)
    from mmseg.apis import inference_model, init_model

    model = init_model(cfg_path, ckpt, device='cpu')
    img = np.random.default_rng(0).uniform(0, 255, (100, 150, 3)).astype(np.float32)
    img[10, 20, 1] = np.inf  # one inf, no NaN: the test pipeline resizes to 128x192
    with pytest.raises(NonFiniteInputError) as err:
        inference_model(model, img)
    message = str(err.value)
    counted = re.search(r'hold (\d+) NaN / infinite values .*\((\d+) NaN;', message)
    assert counted and int(counted.group(1)) > 1 and int(counted.group(2)) > 0, message
    assert 'as the backbone receives them' in message  # not the user's counts
    assert 'turns inf into NaN: the original image may hold fewer' in message


def test_finite_images_whose_sum_overflows_are_not_refused():
    from lookhere_dense.lookhere.vit import check_finite_images

    x = torch.full((1, 3, 8, 8), 3e38)  # finite; the sum is inf
    assert not torch.isfinite(x.sum())
    check_finite_images(x)  # no error
    x[0, 1, 2, 3] = float('-inf')
    with pytest.raises(Exception, match='1 NaN / infinite values'):
        check_finite_images(x)
