"""The LookHere ViTs in timm's registry (:mod:`lookhere_dense.timm_models`).

``import lookhere_dense`` registers ``lookhere_vit_{tiny,small,base,large}_patch16_224``
(with the preset tags) when timm is imported, before or after it, without importing timm
itself. A timm model equals :func:`lookhere_dense.lookhere.create_model` bit for bit on
the same weights (whole tokens and ``features_only`` maps), loads official LookHere files
and our own through ``checkpoint_path=``, takes any image size, and mmseg's
``TIMMBackbone`` builds and runs a Segmenter on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

timm = pytest.importorskip('timm')

import lookhere_dense  # noqa: E402,F401 - registers (timm is imported)
from lookhere_dense.errors import CheckpointError  # noqa: E402
from lookhere_dense.lookhere import create_model  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NAMES = [f'lookhere_vit_{s}_patch16_224' for s in ('tiny', 'small', 'base', 'large')]
TINY = 'lookhere_vit_tiny_patch16_224'
#: the tiny timm model shrunk to two blocks (what create_model gets below)
SMALL = dict(depth=2)


def _ref(**kw):
    return create_model(embed_dims=192, num_layers=2, num_heads=12, **kw).eval()


def test_every_model_and_tag_is_registered():
    assert sorted(timm.list_models('lookhere_vit_*')) == sorted(NAMES)
    for name in NAMES:
        assert timm.is_model(name)
    cfg = timm.models.get_pretrained_cfg('lookhere_vit_base_patch16_224')
    assert cfg.tag == 'lh180' and cfg.num_classes == 1000
    for tag in ('lh180', 'lh90', 'lh45', 'alibi2d'):
        assert timm.models.get_pretrained_cfg(f'lookhere_vit_base_patch16_224.{tag}') is not None
    # lh45 and 2D-ALiBi need a multiple of 4 heads: the small model (6 heads) has two tags
    tags = {name: [] for name in NAMES}
    for full in timm.list_models('lookhere_vit_*', include_tags=True):
        name, tag = full.split('.')
        tags[name].append(tag)
    assert {name: sorted(t) for name, t in tags.items()} == {
        name: sorted(
            ['lh180', 'lh90'] if 'small' in name else ['lh180', 'lh90', 'lh45', 'alibi2d']
        )
        for name in NAMES
    }


@pytest.mark.parametrize('first', ['lookhere_dense', 'timm'])
def test_registration_in_either_import_order_and_no_timm_import_of_its_own(first, tmp_path):
    """A fresh process: ``import lookhere_dense`` alone loads no timm; importing timm
    later (or earlier) registers the models."""
    code = (
        'import sys\n'
        f'import {first}\n'
        "print('timm loaded:', 'timm' in sys.modules)\n"
        'import lookhere_dense, timm\n'
        "print(sorted(timm.list_models('lookhere_vit_*')))\n"
    )
    res = subprocess.run(
        [sys.executable, '-c', code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f'timm loaded: {first == "timm"}' in res.stdout
    assert str(sorted(NAMES)) in res.stdout


@pytest.mark.parametrize('value, registered', [('off', False), ('maybe', True)])
def test_the_lookhere_timm_switch(value, registered, tmp_path):
    """``LOOKHERE_TIMM=off`` (as ``0``) keeps the models out of timm; a value that is no
    switch warns, naming the variable and the spellings, and registers them (an error at
    import was a traceback before any tool, even ``--help``, could say it)."""
    code = (
        'import warnings\n'
        "warnings.simplefilter('always')\n"
        'import lookhere_dense, timm\n'
        "print('models', len(timm.list_models('lookhere_vit_*')))\n"
    )
    env = {**os.environ, 'LOOKHERE_TIMM': value}
    res = subprocess.run(
        [sys.executable, '-c', code], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert ('models 0' in res.stdout) != registered
    warned = "LOOKHERE_TIMM='maybe': expected one of 1, 0 (or unset); also spelt" in res.stderr
    assert warned == registered, res.stderr


@pytest.mark.parametrize('first', ['lookhere_dense', 'timm'])
def test_a_timm_our_models_cannot_use_still_imports_with_a_warning(first, tmp_path):
    """A timm whose API the registration cannot use (here a stand-in with no ``models``;
    timm 1.0.29 lacked ``timm.models._input``): ``import timm`` works, with one warning
    naming the timm version and the error. It raised ModuleNotFoundError from inside
    ``import timm`` before, breaking every timm user of the environment."""
    (tmp_path / 'timm').mkdir()
    (tmp_path / 'timm' / '__init__.py').write_text("__version__ = '0.0.1'\n")
    code = (
        'import warnings\n'
        "warnings.simplefilter('always')\n"
        f'import {first}\n'
        'import lookhere_dense, timm\n'
        "print('imported timm', timm.__version__)\n"
    )
    env = {**os.environ, 'PYTHONPATH': os.pathsep.join([str(tmp_path), str(REPO)])}
    res = subprocess.run(
        [sys.executable, '-c', code], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'imported timm 0.0.1' in res.stdout
    assert res.stderr.count('not registered with timm 0.0.1 (ModuleNotFoundError') == 1, res.stderr


def test_a_timm_model_s_errors_name_the_timm_model():
    """A timm user's mistakes (an argument, an input) were told of 'LookHereViT', a name
    of the mmseg / mmdet wrapper they never built."""
    with pytest.raises(ValueError, match=r'^lookhere_vit_tiny_patch16_224: mlp_ratio must'):
        timm.create_model(TINY, mlp_ratio=-1)
    model = timm.create_model(f'{TINY}.lh90', **SMALL)
    with pytest.raises(ValueError, match=rf'^{TINY}\.lh90 was built for 3 input channels, got 1'):
        model(torch.randn(1, 1, 32, 32))
    with pytest.raises(ValueError, match=rf'^{TINY}\.lh90 expects images of shape'):
        model(torch.randn(3, 32, 32))


def test_tags_choose_the_position_encoding_and_conflicts_are_named():
    m = timm.create_model(f'{TINY}.lh90', **SMALL)
    assert m.pos_encoding == 'lookhere' and m.lh_config.head_directions == 'corners-none'
    assert timm.create_model(f'{TINY}.alibi2d', **SMALL).pos_encoding == 'alibi2d'
    assert timm.create_model(TINY, **SMALL).lh_config == _ref().lh_config  # lh180
    with pytest.raises(ValueError, match="sets preset='lh90'; the argument preset='lh45'"):
        timm.create_model(f'{TINY}.lh90', preset='lh45', **SMALL)
    with pytest.raises(ValueError, match='unknown tag for this model; its tags are lh180, lh90'):
        timm.create_model('lookhere_vit_small_patch16_224.lh45', depth=2)
    with pytest.raises(RuntimeError, match='no weights to download; pass the file'):
        timm.create_model(TINY, pretrained=True, **SMALL)


def _ours(tmp_path: Path, preset: str = 'lh90', **kw):
    """A create_model trunk with random weights, saved as a state_dict file."""
    torch.manual_seed(0)
    ref = _ref(preset=preset, **kw)
    path = tmp_path / 'ours.pth'
    torch.save({'state_dict': ref.state_dict()}, path)
    return ref, str(path)


def test_timm_model_equals_create_model_bit_for_bit(tmp_path: Path):
    ref, path = _ours(tmp_path, out_indices=(0, 1))
    m = timm.create_model(f'{TINY}.lh90', checkpoint_path=path, **SMALL).eval()
    feats = timm.create_model(
        f'{TINY}.lh90', features_only=True, out_indices=(0, 1), checkpoint_path=path, **SMALL
    ).eval()
    overlay = timm.create_model(
        f'{TINY}.lh90', pretrained=True, pretrained_cfg_overlay=dict(file=path), **SMALL
    ).eval()
    x = torch.randn(2, 3, 80, 112)  # not the nominal 224: any size, no interpolation
    with torch.no_grad():
        assert torch.equal(m.forward_features(x), ref.forward_features(x))
        assert torch.equal(overlay.forward_features(x), ref.forward_features(x))
        maps = ref(x)
        got = feats(x)
        assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(got, maps))
        final, inter = m.forward_intermediates(x, indices=[1], output_fmt='NLC')
        assert torch.equal(inter[0], final[:, 1:]) and torch.equal(final, ref.forward_features(x))
        logits = m(x)
    assert logits.shape == (2, 1000)
    assert feats.feature_info.channels() == [192, 192]
    assert feats.feature_info.reduction() == [16, 16]
    assert [i['module'] for i in feats.feature_info.get_dicts()] == ['blocks.0', 'blocks.1']


def test_forward_intermediates_indices_norm_and_prefix_tokens(tmp_path: Path):
    m = timm.create_model(TINY, depth=3, num_classes=0).eval()
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        last_two = m.forward_intermediates(x, indices=2, intermediates_only=True)
        normed = m.forward_intermediates(x, indices=[0], norm=True, intermediates_only=True)
        (pair,) = m.forward_intermediates(
            x, indices=[0], return_prefix_tokens=True, intermediates_only=True
        )
        pooled = m(x)
    assert [tuple(t.shape) for t in last_two] == [(1, 192, 4, 3)] * 2
    assert not torch.equal(normed[0], pair[0])  # the final norm applied to block 0
    assert tuple(pair[1].shape) == (1, 1, 192)  # the CLS token
    assert pooled.shape == (1, 192)
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW' or 'NLC'"):
        m.forward_intermediates(x, output_fmt='NHWC')


@pytest.mark.parametrize('name', [TINY, 'vit_tiny_patch16_224'])  # timm's ViT: the reference
@pytest.mark.parametrize('index', [1, 3])
def test_stop_early_final_tokens_have_the_final_norm(name, index):
    """``stop_early=True``: the final tokens are the last block run's, after the final
    norm, as timm's ViT returns them (ours returned block 1's without it)."""
    torch.manual_seed(0)
    model = timm.create_model(name, depth=4, img_size=64, num_classes=0).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        final, (out,) = model.forward_intermediates(
            x, indices=[index], stop_early=True, output_fmt='NLC'
        )
        full = model.forward_features(x)
    if index == 3:  # the last block: what forward_features gives
        assert torch.equal(final, full)
    else:
        assert torch.equal(final[:, 1:], model.norm(out))
        assert not torch.equal(final[:, 1:], out)


def test_checkpoint_path_loads_official_files_and_checks_their_config(official_tiny):
    """The official format (``{'weights', 'config'}``: the tiny file of the reference
    set) loads through ``checkpoint_path=`` with its LookHere config adopted and, with
    ``head_type='mlp'``, its classifier: the logits are the official ``forward_head``
    (``head.fc2(tanh(head.fc1(cls)))`` on the recorded CLS features); a tag that
    contradicts the file's config is refused."""
    path, io = str(official_tiny.path), official_tiny.io
    # the official model's architecture names are timm's
    kw = {key: io['model'][key] for key in ('embed_dim', 'depth', 'num_heads', 'init_values')}
    ckpt = torch.load(path, weights_only=True)
    w = ckpt['weights']
    classes = w['head.fc2.weight'].shape[0]
    m = timm.create_model(
        TINY, checkpoint_path=path, num_classes=classes, head_type='mlp', **kw
    ).eval()
    assert m.lh_config.head_directions == ckpt['config']['head_directions']
    with torch.no_grad():
        for name, case in io['cases'].items():
            torch.testing.assert_close(
                m.forward_features(case['input']),
                case['forward_features'],
                atol=1e-4,
                rtol=0,
                msg=name,
            )
            cls = case['forward_features'][:, 0]
            hidden = torch.tanh(cls @ w['head.fc1.weight'].T + w['head.fc1.bias'])
            logits = hidden @ w['head.fc2.weight'].T + w['head.fc2.bias']
            torch.testing.assert_close(m(case['input']), logits, atol=1e-4, rtol=0, msg=name)
    other = 'lh45' if ckpt['config']['head_directions'] != 'lh45' else 'lh90'
    with pytest.raises(Exception, match='lh_config|preset|config'):
        timm.create_model(f'{TINY}.{other}', checkpoint_path=path, num_classes=classes, **kw)


def test_a_classifier_the_model_cannot_take_is_a_warning_not_silent_noise(official_tiny, recwarn):
    """timm's linear classifier of the file's class count cannot take the official MLP
    classifier: a warning names ``head_type='mlp'`` (it was an INFO log line, and the
    logits were a random classifier's); another class count is a new classifier, as for
    fine-tuning, without a warning."""
    path = str(official_tiny.path)
    kw = {key: official_tiny.io['model'][key] for key in ('embed_dim', 'depth', 'num_heads')}
    with pytest.warns(UserWarning, match=r"10-class LookHere MLP classifier .*head_type='mlp'"):
        m = timm.create_model(TINY, checkpoint_path=path, num_classes=10, **kw)
    assert isinstance(m.head, torch.nn.Linear)
    recwarn.clear()
    m = timm.create_model(TINY, checkpoint_path=path, num_classes=3, head_type='mlp', **kw)
    assert m.head.fc2.out_features == 3
    assert not [w for w in recwarn if 'classifier' in str(w.message)]
    with pytest.raises(ValueError, match=r"head_type must be one of \('linear', 'mlp'\)"):
        timm.create_model(TINY, head_type='MLP', **kw)


def test_mmseg_timm_backbone_builds_and_runs_a_segmenter():
    """mmseg's own ``TIMMBackbone`` on a LookHere name in a Segmenter-style model."""
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    init_default_scope('mmseg')
    cfg = dict(
        type='EncoderDecoder',
        data_preprocessor=dict(
            type='SegDataPreProcessor',
            mean=[123.675, 116.28, 103.53],
            std=[58.395, 57.12, 57.375],
            size=(64, 64),
        ),
        backbone=dict(
            type='TIMMBackbone',
            model_name=f'{TINY}.lh180',
            features_only=True,
            pretrained=False,
            out_indices=(1,),
            depth=2,
        ),
        decode_head=dict(
            type='FCNHead',
            in_channels=192,
            channels=32,
            num_convs=1,
            num_classes=5,
            in_index=0,
            loss_decode=dict(type='CrossEntropyLoss', loss_weight=1.0),
        ),
        test_cfg=dict(mode='whole'),
    )
    model = MODELS.build(cfg).eval()
    assert type(model.backbone.timm_model.model).__name__ == 'LookHereTimmViT'
    with torch.no_grad():
        logits = model(torch.randn(1, 3, 96, 128), mode='tensor')
    assert tuple(logits.shape) == (1, 5, 6, 8)


def test_a_misspelt_argument_is_named_with_the_close_timm_name():
    """``img_sizes=`` was Python's bare ``TypeError`` from the trunk's ``__init__`` (a
    new-user trial); ``create_model`` of the torch-only model named the close name."""
    with pytest.raises(TypeError) as err:
        timm.create_model('lookhere_vit_tiny_patch16_224.lh90', img_sizes=64)
    assert str(err.value).startswith(
        "lookhere_vit_tiny_patch16_224.lh90: unexpected argument 'img_sizes'; did you mean "
        "'img_size'"
    ), err.value
    with pytest.raises(TypeError, match=r"'in_chan'; did you mean 'in_chans'\?"):
        timm.create_model('lookhere_vit_tiny_patch16_224', in_chan=1)


# ----------------------------------------------------------------------------------------
# timm's dropout arguments
# ----------------------------------------------------------------------------------------
#: dropout module names (timm's ViT and ours) -> where the dropout acts
_DROP_SITES = {
    'pos_drop': 'after the position embedding',
    'drop_after_pos': 'after the position embedding',
    'attn.attn_drop': 'on the attention weights',
    'attn.proj_drop': 'after the attention projection',
    'mlp.drop1': 'in the MLP',  # timm's: after the activation
    'mlp.drop2': 'in the MLP',  # timm's: after fc2
    'mlp.drop': 'in the MLP',  # ours: one module after the activation and after fc2
    'head_drop': 'before the classifier',
}


def _dropout_sites(model) -> set:
    """``{(block index or None, where, p)}`` of every dropout with ``p > 0``: timm's and
    our module names in one vocabulary (our attention dropout is a rate handed to the
    attention kernel, not a module)."""
    import re

    sites = set()
    for name, mod in model.named_modules():
        rate = getattr(mod, 'attn_drop', None)
        found = [(f'{name}.attn_drop', rate)] if isinstance(rate, float) else []
        if isinstance(mod, torch.nn.Dropout):
            found.append((name, mod.p))
        for full, p in found:
            if p:
                block, suffix = re.fullmatch(r'(?:blocks\.(\d+)\.)?(.+)', full).groups()
                sites.add((None if block is None else int(block), _DROP_SITES[suffix], p))
    return sites


@pytest.mark.parametrize(
    'kw',
    [
        dict(drop_rate=0.5),
        dict(pos_drop_rate=0.3),
        dict(proj_drop_rate=0.2),
        dict(attn_drop_rate=0.1),
        dict(drop_rate=0.5, pos_drop_rate=0.3, proj_drop_rate=0.2, attn_drop_rate=0.1),
    ],
)
def test_dropout_arguments_mean_what_they_mean_for_timms_vit(kw):
    """``drop_rate`` is timm's head dropout (it was the trunk's: after the position
    embedding and in every block's projection and MLP, no head dropout),
    ``pos_drop_rate`` dropout after the position embedding alone (it was renamed to the
    trunk's ``drop_rate``), ``proj_drop_rate`` in the projections and MLPs (it was
    refused): the dropouts of timm's ViT built with the same arguments. The keys of the
    ``state_dict`` stay the same."""
    ours = timm.create_model(TINY, depth=2, **kw)
    vit = timm.create_model('vit_tiny_patch16_224', depth=2, **kw)
    assert _dropout_sites(ours) == _dropout_sites(vit)
    assert _dropout_sites(ours)  # the argument did something
    assert ours.state_dict().keys() == timm.create_model(TINY, depth=2).state_dict().keys()


def test_head_dropout_acts_in_forward_head_alone():
    """``drop_rate``: the trunk runs without dropout in training; ``forward_head``
    drops the pooled features before the classifier (``pre_logits`` returns them after
    ``head_drop``, as timm's ViT does); nothing in eval."""
    torch.manual_seed(0)
    model = timm.create_model(TINY, depth=2, num_classes=4, drop_rate=0.5)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = model.eval().forward_features(x)
        model.train()
        feats = model.forward_features(x)
        assert torch.equal(feats, want)  # no dropout in the trunk
        torch.manual_seed(1)
        logits = model.forward_head(feats)
        torch.manual_seed(1)
        pooled = model.forward_head(feats, pre_logits=True)
        torch.manual_seed(1)
        dropped = torch.nn.functional.dropout(feats[:, 0], 0.5, training=True)
        assert torch.equal(pooled, dropped) and not torch.equal(dropped, feats[:, 0])
        assert torch.equal(logits, model.head(dropped))
        model.eval()
        assert torch.equal(model.forward_head(feats, pre_logits=True), feats[:, 0])
        assert torch.equal(model.forward_head(feats), model.head(feats[:, 0]))


def test_bad_dropout_rates_are_named_in_timms_words():
    for key in ('drop_rate', 'pos_drop_rate', 'proj_drop_rate', 'attn_drop_rate'):
        with pytest.raises(ValueError, match=rf'{TINY}: {key} must be a probability'):
            timm.create_model(TINY, depth=1, **{key: 1.5})


# ----------------------------------------------------------------------------------------
# Loading as timm's VisionTransformer loads (side by side with vit_tiny_patch16_224)
# ----------------------------------------------------------------------------------------
_TIMM_VIT = 'vit_tiny_patch16_224'
_SIDE = dict(img_size=64, depth=2, num_classes=5)


def _without_head(name: str) -> dict:
    sd = timm.create_model(name, **_SIDE).state_dict()
    return {k: v for k, v in sd.items() if not k.startswith('head')}


@pytest.mark.parametrize('name', [_TIMM_VIT, TINY])
def test_load_state_dict_reports_and_refuses_a_missing_classifier_as_pytorch(name):
    """A ``state_dict`` without ``head.*``: ``strict=False`` returns the head's keys as
    missing, ``strict=True`` raises PyTorch's ``Missing key(s)`` (a RuntimeError) before
    anything is loaded, as for timm's ViT (ours said 'All keys matched' and left a random
    head); a head of another class count is a size mismatch."""
    sd = _without_head(name)
    model = timm.create_model(name, **_SIDE)
    result = model.load_state_dict(sd, strict=False)
    assert sorted(result.missing_keys) == ['head.bias', 'head.weight']
    assert result.unexpected_keys == []
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fresh = timm.create_model(name, **_SIDE)
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "head.weight"'):
        fresh.load_state_dict(sd, strict=True)
    if name == TINY:  # refused before anything was loaded
        assert not torch.equal(fresh.blocks[0].mlp.fc1.weight, before['blocks.0.mlp.fc1.weight'])
    other = timm.create_model(name, img_size=64, depth=2, num_classes=3).state_dict()
    with pytest.raises(RuntimeError, match='size mismatch for head.weight'):
        timm.create_model(name, **_SIDE).load_state_dict(other, strict=False)
    extra = {**timm.create_model(name, **_SIDE).state_dict(), 'head.extra': torch.zeros(1)}
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "head.extra"'):
        timm.create_model(name, **_SIDE).load_state_dict(extra)


def test_a_ddp_module_prefixed_file_loads_its_classifier(tmp_path, recwarn):
    """A file saved from a DDP-wrapped model (``module.*`` keys): the trunk's reader strips
    the prefix, so must the classifier's (its head stayed random with a false 'has no
    classifier' warning, and ``load_state_dict(strict=True)`` refused it)."""
    torch.manual_seed(0)
    src = timm.create_model(TINY, **_SIDE)
    sd = {f'module.{k}': v for k, v in src.state_dict().items()}
    model = timm.create_model(TINY, **_SIDE)
    assert not model.load_state_dict(sd, strict=True).missing_keys
    assert torch.equal(model.head.weight, src.head.weight)
    torch.save({'state_dict': sd}, tmp_path / 'ddp.pth')
    again = timm.create_model(
        TINY, pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / 'ddp.pth')), **_SIDE
    )
    assert torch.equal(again.head.weight, src.head.weight)
    assert not [w for w in recwarn if 'no classifier' in str(w.message)]


def test_checkpoint_path_without_a_classifier_warns_that_it_stays_random(tmp_path):
    """``checkpoint_path=`` with a file without ``head.*`` (a backbone file, which the
    entry takes on purpose; timm refuses it): a warning says the classifier stays random,
    names timm's refusal and ``num_classes=0`` (it was an INFO log line); no warning with
    ``num_classes=0`` or ``features_only=True``."""
    path = tmp_path / 'backbone.pth'
    torch.save(_without_head(TINY), path)
    with pytest.warns(UserWarning, match=r'no classifier \(head\.\*\).*random.*num_classes=0'):
        timm.create_model(TINY, checkpoint_path=str(path), img_size=64, depth=2, num_classes=10)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter('error')
        timm.create_model(TINY, checkpoint_path=str(path), img_size=64, depth=2, num_classes=0)
        # features_only: the classifier goes (timm reads a pretrained file before wrapping)
        timm.create_model(
            TINY,
            features_only=True,
            out_indices=(1,),
            pretrained=True,
            pretrained_cfg_overlay=dict(file=str(path)),
            img_size=64,
            depth=2,
        )


@pytest.mark.parametrize('name', [_TIMM_VIT, TINY])
def test_a_pretrained_file_gives_its_ema_weights_as_timm(name, tmp_path):
    """``pretrained=True, pretrained_cfg_overlay=dict(file=...)`` with a timm ``train.py``
    file (``state_dict`` and ``state_dict_ema``) loads the EMA weights, as timm's reader
    (ours took ``state_dict``); ``model_ema`` likewise."""
    kw = dict(img_size=64, depth=2, num_classes=5, init_values=0)
    torch.manual_seed(0)
    raw = timm.create_model(name, **kw).eval()
    torch.manual_seed(1)
    ema = timm.create_model(name, **kw).eval()
    x = torch.randn(2, 3, 64, 64)

    def pooled(m):
        return m.forward_head(m.forward_features(x), pre_logits=True)

    for key in ('state_dict_ema', 'model_ema'):
        path = tmp_path / f'{key}.pth'
        torch.save({'state_dict': raw.state_dict(), key: ema.state_dict()}, path)
        model = timm.create_model(
            name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kw
        ).eval()
        with torch.no_grad():
            torch.testing.assert_close(pooled(model), pooled(ema), msg=key)


def test_every_route_takes_a_train_py_file_s_ema_weights(tmp_path):
    """The torch-only model's loader (mmseg's ``LookHereViT``'s too) takes a timm
    ``train.py`` file's ``state_dict_ema`` as the timm route does (it took ``state_dict``:
    one file, other weights by route)."""
    from lookhere_dense.lookhere import create_model

    kw = dict(img_size=64, embed_dims=48, num_layers=2, num_heads=12)
    torch.manual_seed(0)
    raw = create_model(**kw)
    torch.manual_seed(1)
    ema = create_model(**kw)
    path = tmp_path / 'train.pth.tar'
    torch.save({'state_dict': raw.state_dict(), 'state_dict_ema': ema.state_dict()}, path)
    model = create_model(**kw)
    model.load_pretrained(str(path))
    assert torch.equal(model.blocks[0].attn.qkv.weight, ema.blocks[0].attn.qkv.weight)


def test_a_timm_avg_file_s_fc_norm_loads_or_is_refused_never_dropped(tmp_path):
    """A timm ``global_pool='avg'`` file holds ``fc_norm.*`` (the norm after the pooling)
    and no final norm: refused without ``fc_norm=True`` -- with ``final_norm=False`` too,
    the advice of the final-norm refusal, which dropped ``fc_norm.*`` silently -- naming
    ``fc_norm=True``; with it, the logits are timm's (up to LayerNorm's eps, 1e-5 here, 1e-6
    in timm). A final-norm file is refused for ``fc_norm=True``."""
    torch.manual_seed(0)
    vit = timm.create_model(_TIMM_VIT, img_size=64, num_classes=5, global_pool='avg').eval()
    path = tmp_path / 'avg.pth'
    torch.save(vit.state_dict(), path)
    kw = dict(
        img_size=64,
        num_classes=5,
        global_pool='avg',
        init_values=0,
        num_heads=3,
        pos_encoding='abs',
        checkpoint_path=str(path),
    )
    for extra in ({}, dict(final_norm=False)):
        with pytest.raises(CheckpointError, match=r"fc_norm\.\*.*global_pool='avg', fc_norm=True"):
            timm.create_model(TINY, **extra, **kw)
    model = timm.create_model(TINY, fc_norm=True, **kw).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), vit(x), atol=2e-3, rtol=0)
    assert model.norm is None
    with pytest.raises(ValueError, match='fc_norm=True replaces the final norm'):
        timm.create_model(TINY, fc_norm=True, final_norm=True, depth=2)
    token = tmp_path / 'token.pth'
    torch.save(timm.create_model(_TIMM_VIT, img_size=64, num_classes=5).state_dict(), token)
    with pytest.raises(CheckpointError, match='drop fc_norm=True'):
        timm.create_model(TINY, fc_norm=True, **{**kw, 'checkpoint_path': str(token)})
    # its own state_dict round-trips; the features_only wrapper leaves fc_norm out
    again = timm.create_model(TINY, fc_norm=True, **{**kw, 'checkpoint_path': None})
    again.load_state_dict(model.state_dict())
    feats = timm.create_model(TINY, features_only=True, out_indices=(11,), fc_norm=True, **kw)
    assert not any('fc_norm' in k for k in feats.state_dict())


def test_a_timm_train_py_checkpoint_with_its_args_loads(tmp_path):
    """timm's ``train.py`` saves ``{'state_dict', 'args': argparse.Namespace, ...}``:
    ``checkpoint_path=`` loads it as timm does (it was refused: 'holds Python objects
    (argparse.Namespace)'); any other Python object stays refused."""
    import argparse
    import fractions

    from lookhere_dense.errors import UnreadableCheckpointError

    kw = dict(img_size=64, depth=2, num_classes=5)
    model = timm.create_model(TINY, **kw).eval()
    path = tmp_path / 'model_best.pth.tar'
    args = argparse.Namespace(model=TINY, lr=0.1)
    torch.save({'epoch': 3, 'arch': TINY, 'state_dict': model.state_dict(), 'args': args}, path)
    loaded = timm.create_model(TINY, checkpoint_path=str(path), **kw).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    bad = tmp_path / 'bad.pth'
    torch.save({'state_dict': model.state_dict(), 'x': fractions.Fraction(1, 3)}, bad)
    with pytest.raises(UnreadableCheckpointError, match=r'fractions\.Fraction'):
        timm.create_model(TINY, checkpoint_path=str(bad), **kw)
    # a class the user allowed already stays allowed after our reader (its scoped
    # allowance's exit took it off torch's list; timm's own reader, behind
    # checkpoint_path=, does so still)
    from lookhere_dense.checkpoint import load_checkpoint_file

    with torch.serialization.safe_globals([argparse.Namespace]):
        load_checkpoint_file(str(path))
        assert argparse.Namespace in torch.serialization.get_safe_globals()


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_a_state_dict_cast_to_one_dtype_loads(dtype, tmp_path):
    """A ``state_dict`` cast to one dtype (timm's ``avg_checkpoints.py``: ``v.float()``)
    casts the uint8 record too; its bytes survive and it loads, through ``checkpoint_path=``
    and ``load_state_dict`` (it was refused: a float32 ``_extra_state``). A record that is
    no longer one says how to cast the file."""
    kw = dict(img_size=64, depth=2, num_classes=5)
    model = timm.create_model(TINY, **kw).eval()
    cast = {k: v.to(dtype) for k, v in model.state_dict().items()}
    path = tmp_path / 'avg.pth'
    torch.save(cast, path)
    loaded = timm.create_model(TINY, checkpoint_path=str(path), **kw)
    assert loaded.record() == model.record()
    timm.create_model(TINY, **kw).load_state_dict(cast)
    cast['_extra_state'] = cast['_extra_state'] + 0.5
    with pytest.raises(CheckpointError, match=r"v if k.endswith\('_extra_state'\) else v.float"):
        timm.create_model(TINY, **kw).load_state_dict(cast)


def test_the_data_config_is_the_official_lookhere_evaluation():
    """The official LookHere evaluation (GreenCUBIC/lookhere ``data_prep.py``) resizes the
    short side to 256 with torchvision's ``Resize`` (bilinear) and crops 224: timm's data
    config says crop_pct 0.875, bilinear."""
    cfg = timm.data.resolve_data_config({}, model=timm.create_model(TINY, depth=1))
    assert cfg['crop_pct'] == 0.875 and cfg['interpolation'] == 'bilinear'
