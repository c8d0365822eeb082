"""timm's ``create_model`` arguments on the LookHere models (:mod:`lookhere_dense.timm_models`):
``in_chans`` / ``in_channels`` reach the patch embedding, ``checkpoint_path=`` loads a
training run's checkpoint (``tools/train.py``'s ``iter_N.pth``: an mmengine Runner file) and
a whole segmentor's flat ``state_dict``, ``pretrained=True`` takes the ``checkpoint_path``
(mmseg's ``TIMMBackbone`` passes ``pretrained=True`` by default), and a file timm cannot
read is refused with its name and its problem.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import pytest
import torch

timm = pytest.importorskip('timm')
from timm.models import adapt_input_conv  # noqa: E402

import lookhere_dense  # noqa: E402,F401 - registers (timm is imported)
from lookhere_dense.errors import CheckpointError, UnreadableCheckpointError  # noqa: E402
from lookhere_dense.lookhere import create_model  # noqa: E402
from lookhere_dense.lookhere.weights import backbone_weights  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY = 'lookhere_vit_tiny_patch16_224'


def _trunk(preset: str = 'lh90'):
    """A two-block create_model trunk (the tiny timm model with ``depth=2``), random."""
    torch.manual_seed(0)
    return create_model(embed_dims=192, num_layers=2, num_heads=12, preset=preset).eval()


def _segmentor_state_dict(trunk) -> dict:
    """What a segmentor's ``state_dict`` holds: the backbone under ``backbone.`` (its
    ``_extra_state`` record included) and a decode head."""
    sd = {f'backbone.{k}': v for k, v in trunk.state_dict().items()}
    sd['decode_head.conv_seg.weight'] = torch.randn(5, 192, 1, 1)
    sd['decode_head.conv_seg.bias'] = torch.zeros(5)
    return sd


def _runner_checkpoint(path: Path, trunk) -> Path:
    """A file as mmengine's Runner writes it (``iter_N.pth``): meta, the segmentor's
    weights and the message hub's ``HistoryBuffer`` objects (numpy inside)."""
    MessageHub = pytest.importorskip('mmengine.logging').MessageHub
    hub = MessageHub.get_instance(f'test_timm_checkpoints_{path.name}')
    for step in range(3):
        hub.update_scalar('train/loss', 1.0 / (step + 1))
    hub.update_info('iter', 3)
    torch.save(
        {
            'meta': {'epoch': 0, 'iter': 3, 'seed': 0, 'experiment_name': 'tiny'},
            'state_dict': _segmentor_state_dict(trunk),
            'message_hub': hub.state_dict(),
        },
        path,
    )
    return path


# ----------------------------------------------------------------------------------------
# in_chans
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('key', ['in_chans', 'in_channels'])
def test_in_chans_reaches_the_patch_embedding(key):
    """timm fills in ``in_chans=3`` from the pretrained cfg unless given: the user's value
    (timm's name or LookHereVisionTransformer's) must win."""
    m = timm.create_model(TINY, depth=2, num_classes=0, **{key: 1}).eval()
    assert tuple(m.patch_embed.proj.weight.shape) == (192, 1, 16, 16)
    with torch.no_grad():
        assert tuple(m(torch.randn(1, 1, 32, 48)).shape) == (1, 192)


def test_in_chans_and_in_channels_that_disagree_are_refused():
    with pytest.raises(ValueError, match='in_chans=1 and in_channels=3 are the same argument'):
        timm.create_model(TINY, depth=2, in_chans=1, in_channels=3)


def test_a_three_channel_file_loads_into_other_in_chans_as_timm_adapts_it(official_tiny):
    """As timm's own models: a 3-channel file's patch embedding is adapted to ``in_chans``
    (summed for one channel, so a gray image gives the features of the same image in
    three equal channels; repeated and scaled for four), through ``checkpoint_path=`` and
    ``pretrained=True`` alike. It was refused as a shape mismatch."""
    path = str(official_tiny.path)
    kw = {k: official_tiny.io['model'][k] for k in ('embed_dim', 'depth', 'num_heads')}
    rgb = timm.create_model(TINY, checkpoint_path=path, num_classes=0, **kw).eval()
    gray = timm.create_model(TINY, checkpoint_path=path, num_classes=0, in_chans=1, **kw).eval()
    x = torch.randn(2, 1, 64, 48)
    with torch.no_grad():
        torch.testing.assert_close(gray(x), rgb(x.expand(-1, 3, -1, -1)), atol=1e-5, rtol=1e-5)
    four = timm.create_model(
        TINY, pretrained=True, pretrained_cfg_overlay=dict(file=path), in_chans=4, **kw
    )
    file_conv = torch.load(path, weights_only=True)['weights']['patch_embed.proj.weight']
    torch.testing.assert_close(four.patch_embed.proj.weight, adapt_input_conv(4, file_conv))


def test_a_timm_models_own_three_channel_file_loads_into_in_chans_1(official_tiny, tmp_path):
    """A ``LookHereTimmViT``'s own ``state_dict`` saved with 3 channels is adapted through
    ``checkpoint_path=`` as the official file is (it got PyTorch's size-mismatch error); the
    same ``state_dict`` given to ``load_state_dict`` directly stays strict."""
    kw = {k: official_tiny.io['model'][k] for k in ('embed_dim', 'depth', 'num_heads')}
    rgb = timm.create_model(TINY, checkpoint_path=str(official_tiny.path), num_classes=0, **kw)
    own = tmp_path / 'own.pth'
    torch.save(rgb.state_dict(), own)
    gray = timm.create_model(TINY, checkpoint_path=str(own), num_classes=0, in_chans=1, **kw)
    x = torch.randn(2, 1, 64, 48)
    with torch.no_grad():
        torch.testing.assert_close(
            gray.eval()(x), rgb.eval()(x.expand(-1, 3, -1, -1)), atol=1e-5, rtol=1e-5
        )
    fresh = timm.create_model(TINY, num_classes=0, in_chans=1, **kw)
    with pytest.raises(RuntimeError, match='size mismatch for patch_embed.proj.weight'):
        fresh.load_state_dict(rgb.state_dict())


def _timm_backbone(**kwargs):
    """mmseg's ``TIMMBackbone`` of the tiny model: ``depth=2``, ``features_only``, block 1."""
    pytest.importorskip('mmseg')
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    init_default_scope('mmseg')
    return MODELS.build(
        dict(
            type='TIMMBackbone',
            model_name=TINY,
            features_only=True,
            out_indices=(1,),
            depth=2,
            **kwargs,
        )
    )


def test_mmseg_timm_backbone_in_channels_1_runs():
    """mmseg's ``TIMMBackbone(in_channels=1)`` passes ``in_chans=1`` to timm."""
    backbone = _timm_backbone(pretrained=False, in_channels=1).eval()
    with torch.no_grad():
        (fmap,) = backbone(torch.randn(1, 1, 64, 48))
    assert tuple(fmap.shape) == (1, 192, 4, 3)


# ----------------------------------------------------------------------------------------
# Whole-model checkpoints through checkpoint_path=
# ----------------------------------------------------------------------------------------
def test_backbone_weights_of_a_flat_segmentor_state_dict():
    """timm unwraps ``{'state_dict': ...}`` before ``load_state_dict``: a flat dict with
    ``backbone.*`` keys is a whole model's (mmengine format), its other keys are left out;
    a flat dict with neither ViT nor backbone keys is still refused."""
    trunk = _trunk()
    weights = backbone_weights(_segmentor_state_dict(trunk))
    assert weights.format == 'mmengine'
    want = {k for k in trunk.state_dict() if k != '_extra_state'}
    assert set(weights.state_dict) == want
    assert weights.num_heads == 12 and weights.lh_config is not None
    with pytest.raises(CheckpointError, match=r"no ViT backbone weights.*'decode_head\.w'"):
        backbone_weights({'decode_head.w': torch.ones(1)})


@pytest.mark.parametrize('form', ['runner', 'flat'])
@pytest.mark.parametrize('pretrained', [False, True])
def test_checkpoint_path_loads_a_training_checkpoint(tmp_path: Path, form, pretrained):
    """A Runner checkpoint and a ``torch.save(segmentor.state_dict())`` load through
    ``checkpoint_path=`` (``pretrained=True`` too): the backbone bit for bit, its LookHere
    config (lh90) and head count from the file's record."""
    trunk = _trunk('lh90')
    if form == 'runner':
        path = _runner_checkpoint(tmp_path / 'iter_3.pth', trunk)
    else:
        path = tmp_path / 'segmentor.pth'
        torch.save(_segmentor_state_dict(trunk), path)
    m = timm.create_model(
        TINY, pretrained=pretrained, checkpoint_path=str(path), depth=2, num_classes=0
    ).eval()
    assert m.lh_config.head_directions == trunk.lh_config.head_directions == 'corners-none'
    x = torch.randn(1, 3, 48, 80)
    with torch.no_grad():
        assert torch.equal(m.forward_features(x), trunk.forward_features(x))


def test_a_training_checkpoint_is_loaded_strictly_and_named(tmp_path: Path):
    """The strictness of the other formats: a model with another depth is refused, the
    message names the file (not 'the checkpoint')."""
    path = tmp_path / 'segmentor.pth'
    torch.save(_segmentor_state_dict(_trunk()), path)
    with pytest.raises(CheckpointError, match=r"segmentor\.pth' .*the file has 2 blocks"):
        timm.create_model(TINY, checkpoint_path=str(path), depth=3)


def test_a_runner_checkpoint_loads_without_register_all_modules(tmp_path: Path):
    """A fresh process that only imports lookhere_dense and timm (no OpenMMLab
    registration, so mmengine's classes are not allowed yet): the timm entry allows
    exactly those before timm reads the file; other Python objects stay refused."""
    path = _runner_checkpoint(tmp_path / 'iter_3.pth', _trunk())
    other = tmp_path / 'other.pth'
    when = datetime.date(2024, 1, 1)  # a Python object no allow-list admits
    torch.save({'state_dict': _segmentor_state_dict(_trunk()), 'when': when}, other)
    plain = tmp_path / 'plain.pth'
    torch.save({'state_dict': _trunk().state_dict()}, plain)
    code = (
        'import sys, lookhere_dense, timm\n'
        'from lookhere_dense import compat\n'
        f'timm.create_model({TINY!r}, checkpoint_path=sys.argv[3], depth=2)\n'
        "print('plain file: allow-list', compat._applied)\n"
        f'm = timm.create_model({TINY!r}, checkpoint_path=sys.argv[1], depth=2)\n'
        "print('loaded', type(m).__name__, 'allow-list', compat._applied)\n"
        'try:\n'
        f'    timm.create_model({TINY!r}, checkpoint_path=sys.argv[2], depth=2)\n'
        'except Exception as err:\n'
        "    print('refused', type(err).__name__, err)\n"
    )
    res = subprocess.run(
        [sys.executable, '-c', code, str(path), str(other), str(plain)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    # mmengine's classes are allowed only once a file needs them
    assert 'plain file: allow-list False' in res.stdout, res.stdout
    assert 'loaded LookHereTimmViT allow-list True' in res.stdout, res.stdout
    assert 'refused UnreadableCheckpointError' in res.stdout, res.stdout
    assert f'{str(other)!r} cannot be read: it holds Python objects (datetime.date)' in res.stdout


# ----------------------------------------------------------------------------------------
# pretrained=True
# ----------------------------------------------------------------------------------------
def test_pretrained_true_takes_the_checkpoint_path_and_needs_a_file(tmp_path: Path):
    path = tmp_path / 'ours.pth'
    trunk = _trunk('lh180')
    torch.save({'state_dict': trunk.state_dict()}, path)
    m = timm.create_model(
        f'{TINY}.lh180', pretrained=True, checkpoint_path=str(path), depth=2
    ).eval()
    assert torch.equal(m.blocks[1].attn.qkv.weight, trunk.blocks[1].attn.qkv.weight)
    with pytest.raises(RuntimeError, match='no weights to download; pass the file'):
        timm.create_model(f'{TINY}.lh180', pretrained=True, depth=2)
    with pytest.raises(RuntimeError, match='no weights to download; pass the file'):
        timm.create_model(f'{TINY}.lh180', pretrained=True, checkpoint_path='', depth=2)


def test_mmseg_timm_backbone_loads_checkpoint_path_with_its_default_pretrained(tmp_path):
    """``dict(type='TIMMBackbone', model_name=..., checkpoint_path=...)``: mmseg passes
    ``pretrained=True`` (its default) with the file."""
    trunk = _trunk('lh90')
    path = _runner_checkpoint(tmp_path / 'iter_3.pth', trunk)
    backbone = _timm_backbone(checkpoint_path=str(path)).eval()
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        (fmap,) = backbone(x)
        want = trunk(x)[-1]  # the last block's map (after the final norm)
    assert torch.equal(fmap, want)


# ----------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------
def test_checkpoint_path_errors_name_the_file_and_the_problem(tmp_path: Path):
    missing = tmp_path / 'nope.pth'
    with pytest.raises(FileNotFoundError, match=r"checkpoint file not found: '.*nope\.pth'"):
        timm.create_model(TINY, checkpoint_path=str(missing), depth=2)
    text = tmp_path / 'notes.pth'
    text.write_text('these are not weights\n')
    with pytest.raises(
        UnreadableCheckpointError, match=r"'.*notes\.pth' cannot be read: not a PyTorch checkpoint"
    ):
        timm.create_model(TINY, checkpoint_path=str(text), depth=2)
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    with pytest.raises(UnreadableCheckpointError, match=r"'.*empty\.pth' cannot be read: empty"):
        timm.create_model(TINY, checkpoint_path=str(empty), depth=2)
    with pytest.raises(UnreadableCheckpointError, match='it is a folder, not a file'):
        timm.create_model(TINY, checkpoint_path=str(tmp_path), depth=2)


def test_a_model_that_builds_ours_inside_does_not_lend_it_its_checkpoint_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The entry reads ``checkpoint_path`` from the ``timm.create_model`` call building it;
    a model of another name that builds ours inside keeps its file to itself (ours would
    otherwise check it, name it in messages, and take ``pretrained=True`` as satisfied)."""
    from timm.models import _registry

    inner = _registry.model_entrypoint(TINY)

    def wrapper_of_a_lookhere(pretrained: bool = False, **kwargs):
        return torch.nn.ModuleDict(dict(enc=inner(pretrained=pretrained, depth=2)))

    monkeypatch.setitem(
        _registry._model_entrypoints, 'wrapper_of_a_lookhere', wrapper_of_a_lookhere
    )
    path = tmp_path / 'wrapper.pth'
    torch.save({'state_dict': {}}, path)
    with pytest.raises(RuntimeError, match='no weights to download'):
        timm.create_model('wrapper_of_a_lookhere', pretrained=True, checkpoint_path=str(path))


# ----------------------------------------------------------------------------------------
# Files written by tools/convert_checkpoint.py: timm's reader keeps their state_dict alone,
# the head count and LookHere config of their meta are read back from the file
# ----------------------------------------------------------------------------------------
def _convert(src: Path, dst: Path) -> Path:
    """``tools/convert_checkpoint.py SRC DST`` (in this process)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        'convert_checkpoint_tool', REPO / 'tools' / 'convert_checkpoint.py'
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([str(src), str(dst)]) == 0
    meta = torch.load(dst, weights_only=True)['meta']
    assert meta['num_heads'] is not None and meta['lookhere_config'] is not None
    return dst


def _converted_run(tmp_path: Path, trunk, name: str = 'bb.pth') -> Path:
    """A training run's ``iter_N.pth`` converted with tools/convert_checkpoint.py."""
    src = _runner_checkpoint(tmp_path / f'iter_4_{name}', trunk)
    return _convert(src, tmp_path / name)


def _build(route: str, path: Path, **kwargs):
    """The tiny timm model with ``depth=2`` and the file of ``path`` loaded the
    ``route`` way; returns the trunk (the LookHereTimmViT)."""
    if route == 'mmseg':
        return _timm_backbone(checkpoint_path=str(path), **kwargs).timm_model.model
    if route == 'load_checkpoint':
        model = timm.create_model(TINY, depth=2, num_classes=0, **kwargs)
        timm.models.load_checkpoint(model, str(path))
        return model
    if route == 'pretrained_file':
        return timm.create_model(
            TINY,
            pretrained=True,
            pretrained_cfg_overlay=dict(file=str(path)),
            depth=2,
            num_classes=0,
            **kwargs,
        )
    features = route == 'features_only'
    extra = dict(features_only=True, out_indices=(1,)) if features else dict(num_classes=0)
    model = timm.create_model(TINY, checkpoint_path=str(path), depth=2, **extra, **kwargs)
    return model.model if features else model


ROUTES = ['checkpoint_path', 'features_only', 'pretrained_file', 'load_checkpoint', 'mmseg']


@pytest.mark.parametrize('route', ROUTES)
def test_a_converted_file_loads_through_every_timm_route(tmp_path: Path, route):
    """A converted lh90 run of the 12-head tiny model (192 channels, so timm's head-width
    convention would say 3 heads): every timm route takes its recorded head count and
    LookHere config, as mmseg's LookHereViT does, and gives the trunk's features."""
    trunk = _trunk('lh90')
    path = _converted_run(tmp_path, trunk)
    model = _build(route, path).eval()
    assert model.lh_config.head_directions == 'corners-none'
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        assert torch.equal(model.forward_features(x), trunk.forward_features(x))


@pytest.mark.parametrize('route', ROUTES)
def test_a_converted_file_refuses_a_conflicting_tag_in_timm_words(tmp_path: Path, route):
    """The file's LookHere config (lh90) against an explicit preset: refused in one line
    naming the file, both configs and the tag to drop (not mmseg's 'Remove
    lh_config/preset'); without the tag the file's config is taken (the mmseg route
    refuses / adopts the same)."""
    path = _converted_run(tmp_path, _trunk('lh90'))
    with pytest.raises(CheckpointError) as info:
        _build(route, path, preset='lh180')
    msg = str(info.value)
    assert '\n' not in msg
    assert f'{str(path)!r} holds a model trained with the LookHere config lh90' in msg, msg
    assert "head_directions='corners-none'" in msg and "head_directions='halves-none'" in msg
    assert 'has lh180' in msg and 'drop preset= to take the file' in msg, msg
    assert 'model.backbone' not in msg and 'Remove lh_config' not in msg


def test_a_converted_file_against_a_tag(tmp_path: Path):
    """``name.lh180`` with a converted lh90 file of the small model (6 heads = 384 / 64,
    so only the config tells them apart; before, it loaded silently keeping lh180)."""
    torch.manual_seed(0)
    small = create_model(embed_dims=384, num_layers=2, num_heads=6, preset='lh90').eval()
    path = _converted_run(tmp_path, small, 'small_lh90.pth')
    name = 'lookhere_vit_small_patch16_224'
    with pytest.raises(CheckpointError) as info:
        timm.create_model(f'{name}.lh180', num_classes=0, depth=2, checkpoint_path=str(path))
    msg = str(info.value)
    assert f'{name}.lh180 has lh180' in msg and 'asked for by the tag .lh180' in msg, msg
    assert f"drop the tag .lh180 to take the file's config, or use {name}.lh90" in msg, msg
    for tag in ('', '.lh90'):
        m = timm.create_model(f'{name}{tag}', num_classes=0, depth=2, checkpoint_path=str(path))
        assert m.lh_config.head_directions == 'corners-none'


def test_head_counts_are_checked_in_timm_words(tmp_path: Path):
    """A recorded head count against ``num_heads``; a file without one (timm convention:
    channels / 64) and ``checkpoint_num_heads=`` to state it."""
    path = _converted_run(tmp_path, _trunk('lh90'))
    with pytest.raises(CheckpointError) as info:
        timm.create_model(TINY, checkpoint_path=str(path), depth=2, num_heads=6)
    msg = str(info.value)
    assert f'{str(path)!r} has 12 attention heads per block (recorded in the file)' in msg
    assert 'has num_heads=6' in msg and 'pass num_heads=12 to timm.create_model' in msg, msg
    assert 'model.backbone' not in msg
    with pytest.raises(CheckpointError, match='drop checkpoint_num_heads'):
        timm.create_model(TINY, checkpoint_path=str(path), depth=2, checkpoint_num_heads=3)

    trunk = _trunk('lh180')
    flat = tmp_path / 'flat.pth'  # no record: a timm-style file of the 12-head tiny trunk
    torch.save({k: v for k, v in trunk.state_dict().items() if k != '_extra_state'}, flat)
    with pytest.raises(CheckpointError) as info:
        timm.create_model(TINY, checkpoint_path=str(flat), depth=2)
    msg = str(info.value)
    assert 'has 3 attention heads per block (not recorded' in msg, msg
    assert 'if the file has 12 heads, pass checkpoint_num_heads=12' in msg, msg
    m = timm.create_model(TINY, checkpoint_path=str(flat), depth=2, checkpoint_num_heads=12)
    assert torch.equal(m.blocks[1].attn.qkv.weight, trunk.blocks[1].attn.qkv.weight)


def test_encoding_and_learned_slopes_are_checked_in_timm_words(tmp_path: Path):
    """A LookHere file into the 2D-ALiBi tag, a file with learned slopes into a
    fixed-slope model: refused naming the create_model argument / tag."""
    path = _converted_run(tmp_path, _trunk('lh90'))
    with pytest.raises(CheckpointError) as info:
        timm.create_model(f'{TINY}.alibi2d', checkpoint_path=str(path), depth=2)
    msg = str(info.value)
    assert f"{str(path)!r} holds a 'lookhere' model, but {TINY}.alibi2d has " in msg, msg
    assert "pos_encoding='lookhere' (the tag .lh180 / .lh90 / .lh45, or no tag" in msg, msg
    torch.manual_seed(0)
    learned = create_model(
        embed_dims=192, num_layers=2, num_heads=12, lh_config=dict(learnable_slopes=True)
    )
    with torch.no_grad():
        learned.pos_enc.slopes.global_log_ratio.fill_(0.25)  # as if trained
    slopes = _convert(
        _runner_checkpoint(tmp_path / 'iter_4_slopes.pth', learned), tmp_path / 'slopes.pth'
    )
    with pytest.raises(CheckpointError) as info:
        timm.create_model(TINY, checkpoint_path=str(slopes), depth=2)
    msg = str(info.value)
    assert 'holds learned LookHere slopes' in msg, msg
    assert 'pass lh_config=dict(learnable_slopes=True) to timm.create_model' in msg, msg
    m = timm.create_model(
        TINY, checkpoint_path=str(slopes), depth=2, lh_config=dict(learnable_slopes=True)
    )
    assert torch.equal(m.pos_enc.slopes.global_log_ratio, learned.pos_enc.slopes.global_log_ratio)


@pytest.mark.parametrize('features', [False, True])
def test_a_timm_models_own_state_dict_is_checked_in_timm_words(tmp_path: Path, features):
    """A file with exactly the model's keys loads as PyTorch loads it; its record's
    LookHere config against a tag is refused in timm's words too."""
    kw = dict(features_only=True, out_indices=(1,)) if features else dict(num_classes=0)
    src = timm.create_model(f'{TINY}.lh90', depth=2, **kw)
    path = tmp_path / 'own.pth'
    torch.save(src.state_dict(), path)
    with pytest.raises(CheckpointError) as info:
        timm.create_model(f'{TINY}.lh180', depth=2, checkpoint_path=str(path), **kw)
    msg = str(info.value)
    assert f'{str(path)!r} holds a model trained with the LookHere config lh90' in msg, msg
    assert 'Remove lh_config' not in msg
    m = timm.create_model(TINY, depth=2, checkpoint_path=str(path), **kw)
    assert (m.model if features else m).lh_config.head_directions == 'corners-none'


# ----------------------------------------------------------------------------------------
# pretrained=True with a file of the pretrained cfg
# ----------------------------------------------------------------------------------------
def test_a_pretrained_runner_checkpoint_loads_in_a_fresh_process(tmp_path: Path):
    """``pretrained=True, pretrained_cfg_overlay=dict(file=iter_N.pth)`` as the first thing
    a process does (no checkpoint_path= load before it allowed mmengine's classes), and a
    ``pretrained_cfg=dict(file=...)``; a missing file is named."""
    trunk = _trunk('lh90')
    path = _runner_checkpoint(tmp_path / 'iter_4.pth', trunk)
    code = (
        'import sys, torch, lookhere_dense, timm\n'
        f'm = timm.create_model({TINY!r}, pretrained=True, '
        'pretrained_cfg_overlay=dict(file=sys.argv[1]), depth=2, num_classes=0)\n'
        "print('overlay', m.lh_config.head_directions)\n"
        f'm = timm.create_model({TINY!r}, pretrained=True, '
        'pretrained_cfg=dict(file=sys.argv[1]), depth=2, num_classes=0)\n'
        "print('cfg', m.lh_config.head_directions)\n"
        'torch.save(m.blocks[1].attn.qkv.weight, sys.argv[2])\n'
        'try:\n'
        f'    timm.create_model({TINY!r}, pretrained=True, '
        "pretrained_cfg_overlay=dict(file='nope.pth'), depth=2)\n"
        'except Exception as err:\n'
        "    print('refused', type(err).__name__, err)\n"
    )
    res = subprocess.run(
        [sys.executable, '-c', code, str(path), str(tmp_path / 'qkv.pt')],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'overlay corners-none' in res.stdout and 'cfg corners-none' in res.stdout, res.stdout
    qkv = torch.load(tmp_path / 'qkv.pt', weights_only=True)
    assert torch.equal(qkv, trunk.blocks[1].attn.qkv.weight)
    assert (
        "refused FileNotFoundError checkpoint file not found: 'nope.pth' "
        '(timm.create_model pretrained_cfg_overlay=dict(file=)' in res.stdout
    ), res.stdout


def test_mmseg_timm_backbone_without_a_file_says_pretrained_false():
    """mmseg's TIMMBackbone passes pretrained=True unless told otherwise: the message
    says how to build random weights."""
    with pytest.raises(RuntimeError, match=r'no weights to download.*pretrained=False'):
        _timm_backbone()


def test_a_timm_vit_file_loads_with_init_values_0_and_is_refused_in_timm_words(tmp_path: Path):
    """timm's ViT files have no LayerScale; ``timm.create_model`` drops ``init_values=None``,
    so ``init_values=0`` turns it off (timm's ViT's convention) and the refusal says so; it
    does not offer ``load_pretrained(..., strict=False)``, which would run the file's
    branches at LayerScale 1e-4, nor mmseg's ``init_cfg``."""
    name = 'lookhere_vit_small_patch16_224'
    source = timm.create_model('vit_small_patch16_224', depth=2).eval()
    path = tmp_path / 'timm_vit_small.pth'
    torch.save(source.state_dict(), path)
    for init_values in (None, 1e-4):  # None is dropped by timm: the default LayerScale
        with pytest.raises(CheckpointError) as info:
            timm.create_model(name, checkpoint_path=str(path), depth=2, init_values=init_values)
        msg = str(info.value)
        assert 'no LayerScale in the file: pass init_values=0' in msg, msg
        assert 'strict=False loads' not in msg and 'load_pretrained' not in msg, msg
        assert 'not strict=False: the 4 LayerScale gammas the file lacks' in msg, msg
        assert 'init_cfg' not in msg and 'init_values=None' not in msg
    model = timm.create_model(name, checkpoint_path=str(path), depth=2, init_values=0).eval()
    assert not any('.ls1.' in k or '.ls2.' in k for k in model.state_dict())
    for key in ('blocks.1.attn.qkv.weight', 'blocks.1.mlp.fc2.bias', 'head.weight'):
        assert torch.equal(model.state_dict()[key], source.state_dict()[key]), key
    # what strict=False does (the API still has it): the gammas stay at their init
    layered = timm.create_model(name, depth=2).eval()
    with pytest.warns(UserWarning, match=r'strict=False; 4 backbone tensors .*ls1\.gamma'):
        report = layered.load_pretrained(str(path), strict=False)
    assert any('.ls1.gamma' in k for k in report['missing'])
    with pytest.raises(TypeError, match=r'load_pretrained: path must be a checkpoint file'):
        layered.load_pretrained(True)
    assert torch.equal(layered.blocks[1].attn.qkv.weight, source.blocks[1].attn.qkv.weight)
    assert float(layered.blocks[1].ls1.gamma.abs().max()) <= 1e-4


def test_architecture_advice_uses_timms_argument_names(official_tiny):
    """A file of another depth is refused with timm's ``depth=`` (it said mmseg's
    ``set num_layers=3`` to a ``timm.create_model`` user); ``global_pool='token'`` without
    a CLS token names ``class_token``."""
    kw = {k: official_tiny.io['model'][k] for k in ('embed_dim', 'num_heads')}
    with pytest.raises(CheckpointError) as info:
        timm.create_model(
            TINY, checkpoint_path=str(official_tiny.path), num_classes=0, depth=2, **kw
        )
    msg = str(info.value)
    assert 'the file has 3 blocks (blocks.0-2), the model 2: pass depth=3' in msg, msg
    assert 'num_layers' not in msg
    with pytest.raises(
        ValueError, match=r"needs the CLS token \(class_token=True; or global_pool='avg'\)"
    ):
        timm.create_model(TINY, depth=1, class_token=False, global_pool='token')
