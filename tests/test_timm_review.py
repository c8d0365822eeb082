"""The LookHere timm models against timm 1.0.31's ViT API, and the LayerNorm eps of timm
files (a review of :mod:`lookhere_dense.timm_models`):

* a timm / DeiT-III / mmseg-ViT file loaded into a trunk whose LayerNorm eps is not the
  1e-6 those weights were trained with is a warning naming both and each route's argument
  (official LookHere files keep the default, 1e-5, without one);
* the ``features_only`` wrapper loads a ``state_dict`` in its own names as PyTorch (and
  timm's ``FeatureGetterNet``) does: ``strict=False`` loads the rest, ``assign`` counts;
* ``norm_layer`` by timm's name; a name in the torch-only constructor is refused by name;
* ``feature_cls='getter'`` is the project's wrapper, ``'hook'`` / ``'fx'`` are refused
  in one line;
* ``forward_intermediates(output_dict=True)``, ``create_model(device=, dtype=)``, building
  under ``with torch.device('meta')`` and ``return_prefix_tokens`` without prefix tokens,
  as timm's ViT.

Tiny models only (two or three blocks, 64 px inputs where the size does not matter).
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch import nn

timm = pytest.importorskip('timm')

import lookhere_dense  # noqa: E402,F401 - registers (timm is imported)
from lookhere_dense.lookhere import create_model  # noqa: E402
from lookhere_dense.timm_models import LookHereFeatures  # noqa: E402

TINY = 'lookhere_vit_tiny_patch16_224'
TIMM_VIT = 'vit_tiny_patch16_224'
EPS_6 = functools.partial(nn.LayerNorm, eps=1e-6)


def _eps_warnings(caught) -> list:
    return [str(w.message) for w in caught if 'LayerNorm eps' in str(w.message)]


# ----------------------------------------------------------------------------------------
# 1a: the LayerNorm eps of timm / DeiT-III / mmseg-ViT files
# ----------------------------------------------------------------------------------------
def test_a_timm_file_in_a_trunk_of_another_layernorm_eps_is_a_warning(tmp_path, official_tiny):
    """A timm ViT file loaded into the default trunk (eps 1e-5) warns on the timm and the
    torch-only routes, naming both eps and the argument of each route (timm, torch only,
    mmseg's ``norm_cfg``); built with eps 1e-6 it warns not and gives timm's features bit
    for bit. An official LookHere file (trained with 1e-5, the default: its reference
    outputs match) and the project's own ``state_dict`` warn not; an mmseg-format file
    does."""
    torch.manual_seed(0)
    vit = timm.create_model(TIMM_VIT, depth=2, num_classes=0).eval()
    path = tmp_path / 'timm_vit.pth'
    torch.save(vit.state_dict(), path)
    arch = dict(depth=2, num_heads=3, init_values=0, num_classes=0, pos_encoding='abs')
    with pytest.warns(UserWarning, match=r'LayerNorm eps') as caught:
        model = timm.create_model(TINY, checkpoint_path=str(path), **arch).eval()
    (msg,) = _eps_warnings(caught)
    assert str(path) in msg and 'eps=1e-06' in msg and 'eps is 1e-05' in msg, msg
    assert 'norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6)' in msg, msg
    assert 'lookhere_dense.lookhere.create_model(..., norm_layer=' in msg, msg
    assert "norm_cfg=dict(type='LN', eps=1e-6)" in msg, msg
    assert model.norm.eps == 1e-5  # reported, never changed silently
    with pytest.warns(UserWarning, match=r'LayerNorm eps is 1e-05'):
        create_model(
            path, embed_dims=192, num_layers=2, num_heads=3, init_values=None, pos_encoding='abs'
        )

    x = torch.randn(1, 3, 224, 224)
    for extra in (dict(norm_layer=EPS_6), dict(norm_layer='layernorm')):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            matched = timm.create_model(TINY, checkpoint_path=str(path), **arch, **extra).eval()
        assert not _eps_warnings(caught), extra
        with torch.no_grad():
            assert torch.equal(matched.forward_features(x), vit.forward_features(x)), extra

    # the official LookHere file: no warning, and the default eps reproduces its outputs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        official = create_model(official_tiny.path, **official_tiny.vit_kwargs).eval()
        trunk = dict(embed_dims=192, num_layers=2, num_heads=12)
        torch.save(create_model(**trunk).state_dict(), tmp_path / 'own.pth')
        create_model(tmp_path / 'own.pth', **trunk)  # the project's own file, its record
    assert not _eps_warnings(caught)
    case = official_tiny.io['cases']['64x64']
    with torch.no_grad():
        out = official.forward_features(case['input'])
    torch.testing.assert_close(out, case['forward_features'], atol=2e-5, rtol=0)

    # an mmseg-format file (mmseg's VisionTransformer names) is such a file too
    from lookhere_dense.lookhere.weights import BackboneWeights, layernorm_eps_note

    mmseg = BackboneWeights({}, 'mmseg')
    assert 'mmseg format' in layernorm_eps_note(model, mmseg, 'f.pth')
    assert layernorm_eps_note(matched, mmseg, 'f.pth') is None
    assert layernorm_eps_note(model, BackboneWeights({}, 'official', {'x': 1}), 'f') is None


# ----------------------------------------------------------------------------------------
# 2a: the features_only wrapper's load_state_dict
# ----------------------------------------------------------------------------------------
def test_the_features_only_wrapper_loads_its_own_names_as_pytorch():
    """A ``state_dict`` in the wrapper's names with a key missing or extra: ``strict=False``
    loads the rest and returns the keys in the wrapper's names (as timm's
    ``FeatureGetterNet``; it was refused with 'checkpoint has no ViT backbone weights'),
    ``strict=True`` refuses them by name; ``assign=True`` takes the given tensors, also
    for a file in the model's own names (it was dropped)."""
    torch.manual_seed(0)
    source = timm.create_model(TINY, depth=3, features_only=True, img_size=64)
    sd = source.state_dict()
    sd.pop('model.blocks.0.norm1.weight')
    sd['model.extra.weight'] = torch.zeros(1)
    wrapper = timm.create_model(TINY, depth=3, features_only=True, img_size=64)
    result = wrapper.load_state_dict(sd, strict=False)
    assert result.missing_keys == ['model.blocks.0.norm1.weight']
    assert result.unexpected_keys == ['model.extra.weight']
    assert torch.equal(
        wrapper.model.blocks[1].attn.qkv.weight, source.model.blocks[1].attn.qkv.weight
    )
    with pytest.raises(RuntimeError, match=r'model\.blocks\.0\.norm1\.weight') as err:
        wrapper.load_state_dict(sd)
    assert 'model.extra.weight' in str(err.value)

    # assign: a wrapper built on the meta device takes the tensors themselves
    meta = timm.create_model(TINY, depth=3, features_only=True, img_size=64, device='meta')
    meta.load_state_dict(sd, strict=False, assign=True)
    assert meta.model.cls_token.device.type == 'cpu'
    assert meta.model.cls_token.data_ptr() == sd['model.cls_token'].data_ptr()
    own = timm.create_model(TINY, depth=3, num_classes=0, img_size=64).state_dict()
    meta = timm.create_model(TINY, depth=3, features_only=True, img_size=64, device='meta')
    meta.load_state_dict(own, assign=True)  # the model's own names: its load, with assign
    assert meta.model.cls_token.data_ptr() == own['cls_token'].data_ptr()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        ref = timm.create_model(TINY, depth=3, features_only=True, img_size=64)
        ref.load_state_dict(own)
        assert all(torch.equal(a, b) for a, b in zip(meta.eval()(x), ref.eval()(x)))


# ----------------------------------------------------------------------------------------
# 2b: norm_layer by name
# ----------------------------------------------------------------------------------------
def test_norm_layer_takes_timms_names_and_the_torch_only_trunk_names_the_argument():
    """``norm_layer='rmsnorm'`` / ``'layernorm'`` are timm's layers (as for timm's ViT; it
    was "'str' object is not callable" from deep in the constructor); an unknown name is
    refused naming ``norm_layer``; the torch-only constructor refuses a name (or any
    non-callable) naming the argument and value."""
    m = timm.create_model(TINY, depth=1, norm_layer='rmsnorm', img_size=64).eval()
    ref = timm.create_model(TIMM_VIT, depth=1, norm_layer='rmsnorm')
    assert type(m.norm) is type(ref.norm) and type(m.blocks[0].norm1) is type(ref.norm)
    assert m(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
    assert timm.create_model(TINY, depth=1, norm_layer='layernorm').norm.eps == 1e-6
    with pytest.raises(ValueError, match=rf"^{TINY}: norm_layer='no_such_norm' is no layer"):
        timm.create_model(TINY, depth=1, norm_layer='no_such_norm')
    for key in ('norm_layer', 'act_layer'):
        with pytest.raises(TypeError, match=rf"LookHereViT: {key} must be a callable.*'rmsnorm'"):
            create_model(embed_dims=96, num_layers=1, **{key: 'rmsnorm'})
    with pytest.raises(TypeError, match=r'norm_layer must be a callable.*got 3$'):
        create_model(embed_dims=96, num_layers=1, norm_layer=3)


# ----------------------------------------------------------------------------------------
# 2c: feature_cls
# ----------------------------------------------------------------------------------------
def test_feature_cls_getter_is_the_lookhere_wrapper_and_hook_fx_are_refused(official_tiny):
    """``feature_cls='getter'`` (timm's default for ViTs; it gave timm's plain
    ``FeatureGetterNet`` with the classifier kept, which could not load an official file)
    and ``FeatureGetterNet`` itself are the project's wrapper; ``'hook'`` / ``'fx'`` are
    refused in one line saying why and what to use (they crashed in timm with
    "unexpected keyword argument 'prune'")."""
    from timm.models._features import FeatureGetterNet

    for fc in ('getter', 'Getter', FeatureGetterNet):
        f = timm.create_model(TINY, depth=3, features_only=True, feature_cls=fc)
        assert type(f) is LookHereFeatures and isinstance(f.model.head, nn.Identity), fc
    kw = dict(embed_dim=96, depth=3, init_values=0.1, img_size=64, features_only=True)
    f = timm.create_model(
        TINY, feature_cls='getter', checkpoint_path=str(official_tiny.path), **kw
    )
    default = timm.create_model(TINY, checkpoint_path=str(official_tiny.path), **kw)
    x = official_tiny.io['cases']['64x64']['input']
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(f.eval()(x), default.eval()(x)))
    for fc in ('hook', 'fx'):
        with pytest.raises(ValueError) as err:
            timm.create_model(TINY, depth=3, features_only=True, feature_cls=fc)
        msg = str(err.value)
        assert '\n' not in msg and f"feature_cls='{fc}' is not supported" in msg, msg
        assert 'position arguments' in msg and "feature_cls='getter'" in msg, msg


# ----------------------------------------------------------------------------------------
# 3: timm 1.0.31's ViT API
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'flags',
    [
        dict(),
        dict(intermediates_only=True),
        dict(return_prefix_tokens=True),
        dict(return_prefix_tokens=True, intermediates_only=True, indices=1),
    ],
)
def test_forward_intermediates_output_dict_as_timms_vit(flags):
    """``forward_intermediates(output_dict=True)`` returns timm's keys for the same flags,
    holding what the tuple form returns."""
    x = torch.randn(1, 3, 32, 48)
    ours = timm.create_model(TINY, depth=2).eval()
    theirs = timm.create_model(TIMM_VIT, depth=2, dynamic_img_size=True).eval()
    with torch.no_grad():
        got = ours.forward_intermediates(x, output_dict=True, **flags)
        assert sorted(got) == sorted(theirs.forward_intermediates(x, output_dict=True, **flags))
        plain = ours.forward_intermediates(x, **flags)
    outs = plain if flags.get('intermediates_only') else plain[1]
    if not flags.get('intermediates_only'):
        assert torch.equal(got['image_features'], plain[0])
    if flags.get('return_prefix_tokens'):
        assert all(torch.equal(p, o[1]) for p, o in zip(got['image_intermediates_prefix'], outs))
        outs = [o[0] for o in outs]
    assert all(torch.equal(a, b) for a, b in zip(got['image_intermediates'], outs))


def test_device_dtype_and_meta_construction_as_timms_vit():
    """``create_model(device=, dtype=)`` (timm hands them to the model class) builds on that
    device in that dtype (a new classifier too); building under ``with
    torch.device('meta')`` works for the timm and the torch-only models (it failed
    reading the drop-path schedule back from the meta device), the schedule unchanged."""
    m = timm.create_model(TINY, depth=2, device='meta')
    assert {p.device.type for p in m.parameters()} == {'meta'}
    m = timm.create_model(TINY, depth=2, img_size=64, dtype=torch.bfloat16).eval()
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        assert m(torch.randn(1, 3, 64, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16
    m.reset_classifier(5)
    assert m.head.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match=rf'^{TINY}: dtype must be a floating-point'):
        timm.create_model(TINY, depth=2, dtype=torch.int64)
    with torch.device('meta'):
        m = timm.create_model(TINY, depth=3, drop_path_rate=0.1)
        trunk = create_model(embed_dims=96, num_layers=3, drop_path_rate=0.1)
    for model in (m, trunk):
        assert {p.device.type for p in model.parameters()} == {'meta'}
        expected = torch.linspace(0, 0.1, 3).tolist()
        assert [getattr(b.drop_path, 'drop_prob', 0.0) for b in model.blocks] == expected


def test_return_prefix_tokens_without_prefix_tokens_gives_the_maps_as_timm():
    """``class_token=False``: ``return_prefix_tokens=True`` returns the maps alone, as
    timm's ViT (they were ``(map, empty)`` pairs); with the CLS token the pairs stay."""
    x = torch.randn(1, 3, 32, 48)
    for name in (TINY, TIMM_VIT):
        m = timm.create_model(
            name, depth=2, class_token=False, global_pool='avg', dynamic_img_size=True
        ).eval()
        with torch.no_grad():
            outs = m.forward_intermediates(x, return_prefix_tokens=True, intermediates_only=True)
        assert all(isinstance(o, torch.Tensor) for o in outs), name
    m = timm.create_model(TINY, depth=2).eval()
    with torch.no_grad():
        outs = m.forward_intermediates(x, return_prefix_tokens=True, intermediates_only=True)
    assert all(isinstance(o, tuple) and o[1].shape == (1, 1, 192) for o in outs)


def test_assign_with_another_format_is_refused_by_name(official_tiny):
    """``load_state_dict(..., assign=True)`` with a file of another format (converted and
    copied in, not assigned): refused by name, where it was ignored (a model built on
    ``'meta'`` stayed on ``'meta'``, nothing loaded, no word); the model's own
    ``state_dict`` is assigned as in PyTorch."""
    timm_sd = timm.create_model(TIMM_VIT, depth=2).state_dict()
    m = timm.create_model(
        TINY, depth=2, init_values=0, pos_encoding='abs', num_heads=3, device='meta'
    )
    with pytest.raises(ValueError, match=r"assign=True\) takes this model's own state_dict"):
        m.load_state_dict(timm_sd, assign=True)
    own = timm.create_model(TINY, depth=2).state_dict()
    m = timm.create_model(TINY, depth=2, device='meta')
    m.load_state_dict(own, assign=True)
    assert {p.device.type for p in m.parameters()} == {'cpu'}
