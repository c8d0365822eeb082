"""Fault battery, checkpoints: a file that cannot be read, or whose weights do not fit the
model, is refused with a message naming the file and what differs -- for backbone weights
(``init_cfg=dict(type='Pretrained', ...)``) and for whole models
(:func:`lookhere_dense.lookhere.loading.load_model_weights`: test / infer / resume). A file that
fits loads exactly.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import torch
from mmengine.registry import DefaultScope

from lookhere_dense.checkpoint import checkpoint_problem, decode_extra_state
from lookhere_dense.errors import CheckpointError
from lookhere_dense.lookhere.loading import load_model_weights
from lookhere_dense.lookhere.weights import save_backbone_checkpoint
from lookhere_dense.models import LookHereViT

pytestmark = pytest.mark.usefixtures('one_torch_thread')

TINY = dict(img_size=32, patch_size=8, embed_dims=48, num_layers=3, num_heads=12)
OFFICIAL = dict(
    img_size=64, patch_size=16, embed_dims=96, num_layers=3, num_heads=12, init_values=0.1
)  # the official reference file's architecture


def tiny(**kwargs) -> LookHereViT:
    torch.manual_seed(0)
    model = LookHereViT(**{**TINY, **kwargs})
    model.init_weights()
    return model.eval()


def pretrained(path, **kwargs) -> LookHereViT:
    """A backbone built with ``init_cfg=Pretrained`` and initialised (as the Runner does)."""
    init = dict(type='Pretrained', checkpoint=str(path))
    init.update({k: kwargs.pop(k) for k in ('checkpoint_num_heads', 'strict') if k in kwargs})
    model = LookHereViT(**kwargs, init_cfg=init)
    model.init_weights()
    return model


@pytest.fixture(scope='module')
def official(reference_dir: Path) -> Path:
    return reference_dir / 'official_tiny_halves_none.pth'


# ----------------------------------------------------------------------------------------
# Files that are no readable checkpoint: the path named, no weights_only advice
# ----------------------------------------------------------------------------------------
class _Custom:  # pickled into a file, like a checkpoint with arbitrary Python objects
    pass


def _write(kind: str, folder: Path, official_file: Path) -> Path:
    path = folder / f'{kind}.pth'
    if kind == 'empty':
        path.write_bytes(b'')
    elif kind == 'truncated':
        path.write_bytes(official_file.read_bytes()[:50_000])
    elif kind == 'corrupt':  # one byte flipped in a tensor: torch.load alone reads it
        data = bytearray(official_file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    elif kind == 'text':
        path.write_text('not a checkpoint\n')
    elif kind == 'pickle':
        path.write_bytes(pickle.dumps({'state_dict': {}}, protocol=4))
    elif kind == 'objects':
        torch.save({'state_dict': {'w': torch.zeros(1)}, 'meta': _Custom()}, path)
    elif kind == 'folder':
        path.mkdir()
    elif kind == 'safetensors':
        path = folder / 'broken.safetensors'
        path.write_bytes(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a": 1')
    elif kind == 'list':
        torch.save([torch.zeros(1)], path)
    return path


@pytest.mark.parametrize(
    'kind,match',
    [
        ('empty', r'is empty \(0 bytes\)'),
        ('truncated', r'is truncated or corrupt \(.*\); it was not written completely'),
        (
            'corrupt',
            r"cannot be read: damaged: it is truncated or corrupt \(checksum error in '.*"
            r"data/\d+'\)",
        ),
        ('text', r'cannot be read: not a PyTorch checkpoint lookhere-dense can read'),
        ('pickle', r'cannot be read: not a PyTorch checkpoint lookhere-dense can read'),
        ('objects', r'holds Python objects \(.*_Custom\) besides tensors'),
        ('folder', r'is a folder, not a file'),
        ('safetensors', r'is not a readable .safetensors file'),
        ('list', r'does not hold a dict of weights \(got list\)'),
    ],
)
@pytest.mark.parametrize('entry', ['init_cfg', 'load_model_weights'])
def test_unreadable_files_are_named(kind, match, entry, tmp_path, official):
    path = _write(kind, tmp_path, official)
    with pytest.raises(CheckpointError, match=match) as err:
        if entry == 'init_cfg':
            pretrained(path, **TINY)
        else:
            load_model_weights(tiny(), str(path))
    assert str(path) in str(err.value)
    assert 'weights_only' not in str(err.value)
    # the refused class as a field (tools branch on it, not on the message's text)
    refused = getattr(err.value, 'refused_class', None)
    assert (refused or '').endswith('._Custom') == (kind == 'objects'), refused
    # the check without raising (the --resume fallback, the tools) finds the same problem
    problem = checkpoint_problem(str(path))
    assert problem and f'cannot be read: {problem}' in str(err.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"checkpoint file not found: '.*nope.pth'"):
        load_model_weights(tiny(), str(tmp_path / 'nope.pth'))


# ----------------------------------------------------------------------------------------
# Attention geometry: same shapes, other head count
# ----------------------------------------------------------------------------------------
def test_official_12_head_file_is_refused_by_a_6_head_model(official):
    with pytest.raises(
        CheckpointError,
        match=r'has 12 attention heads per block \(not '
        r'recorded in this LookHere file.*official code'
        r'.*but the model has num_heads=6.*Set '
        r'num_heads=12 \(model.backbone.num_heads in a config\)',
    ) as err:
        pretrained(official, **{**OFFICIAL, 'num_heads': 6})
    assert 'checkpoint_num_heads=6' in str(err.value)
    pretrained(official, **OFFICIAL)  # the fitting model loads it


def test_stating_the_head_count_overrides_the_convention(official):
    """The user's statement wins over the convention (documented way out), and is checked."""
    model = pretrained(official, **{**OFFICIAL, 'num_heads': 6}, checkpoint_num_heads=6)
    assert model.num_heads == 6
    with pytest.raises(CheckpointError, match=r'checkpoint_num_heads must be a positive int'):
        pretrained(official, **OFFICIAL, checkpoint_num_heads=0)


def _timm_vit_tiny(tmp_path: Path, **kwargs) -> Path:
    import timm

    vit = timm.create_model(
        'vit_tiny_patch16_224', pretrained=False, num_classes=10, depth=2, **kwargs
    )
    path = tmp_path / 'vit_tiny.pth'
    torch.save(vit.state_dict(), path)
    return path


def test_timm_3_head_vit_is_refused_by_12_heads(tmp_path):
    path = _timm_vit_tiny(tmp_path)  # 192 channels, 3 heads
    args = dict(embed_dims=192, num_layers=2, init_values=None)
    with pytest.raises(
        CheckpointError,
        match=r'has 3 attention heads per block \(not recorded '
        r'in this timm file; assumed from its 192 '
        r'channels.*num_heads=12.*LookHere head layouts '
        r'need 6, 12 or 16 heads',
    ):
        pretrained(path, **args, num_heads=12)
    model = pretrained(path, **args, num_heads=3, pos_encoding='rope2d')
    sd = torch.load(path, weights_only=True)
    torch.testing.assert_close(model.blocks[1].attn.qkv.weight, sd['blocks.1.attn.qkv.weight'])


def test_files_of_unknown_head_count_need_it_stated(tmp_path):
    path = tmp_path / 'flat.pth'
    sd = {k: v for k, v in tiny().state_dict().items() if k != '_extra_state'}
    torch.save(sd, path)  # 48 channels: no width-64 convention
    with pytest.raises(
        CheckpointError,
        match=r"cannot verify that '.*flat.pth' was trained "
        r'with num_heads=12.*checkpoint_num_heads=N',
    ):
        pretrained(path, **TINY)
    model = pretrained(path, **TINY, checkpoint_num_heads=12)
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, sd['blocks.0.attn.qkv.weight'])


def test_saved_backbones_record_their_geometry(tmp_path):
    src = tiny()
    assert {k: src.record()[k] for k in ('num_heads', 'num_layers', 'embed_dims')} == dict(
        num_heads=12, num_layers=3, embed_dims=48
    )
    six = LookHereViT(**{**TINY, 'num_heads': 6})
    with pytest.raises(
        CheckpointError,
        match=r'the loaded state_dict has 12 attention heads '
        r'.*num_heads=6',
    ):
        six.load_state_dict(src.state_dict())
    # converted files record it too (meta), so a 6-head backbone refuses them
    path = tmp_path / 'converted.pth'
    save_backbone_checkpoint(str(path), src.state_dict(), src.lh_config.to_dict(), 'test')
    assert torch.load(path, weights_only=True)['meta']['num_heads'] == 12
    with pytest.raises(
        CheckpointError,
        match=r'has 12 attention heads per block \(recorded in '
        r'the file\)',
    ):
        pretrained(path, **{**TINY, 'num_heads': 6})
    with pytest.raises(CheckpointError, match=r'checkpoint_num_heads=6 but .* records 12'):
        pretrained(path, **{**TINY, 'num_heads': 6}, checkpoint_num_heads=6)


def test_the_runner_load_path_refuses_other_heads_too(tmp_path):
    """mmengine's own non-strict ``load_checkpoint`` (the Runner's ``load_from`` /
    ``resume``) reaches ``set_extra_state``, which checks the recorded geometry."""
    from mmengine.runner import load_checkpoint

    path = tmp_path / 'iter_1.pth'
    torch.save({'state_dict': tiny().state_dict(), 'meta': {}}, path)
    with pytest.raises(ValueError, match=r'12 attention heads .* num_heads=6'):
        load_checkpoint(LookHereViT(**{**TINY, 'num_heads': 6}), str(path), logger='silent')


# ----------------------------------------------------------------------------------------
# Depth, keys, hints
# ----------------------------------------------------------------------------------------
def test_official_file_into_another_depth_blames_the_depth(official):
    with pytest.raises(CheckpointError) as err:
        pretrained(official, **{**OFFICIAL, 'num_layers': 6})
    msg = str(err.value)
    assert 'the file has 3 blocks (blocks.0-2), the model 6: set num_layers=3' in msg
    assert 'LayerScale' not in msg and 'blocks.3.attn.qkv.weight' in msg
    with pytest.raises(
        CheckpointError,
        match=r'has tensors the backbone lacks \(the file has 3 '
        r'blocks .* the model 2: set num_layers=3\).*'
        r'blocks.2.attn.qkv.weight',
    ):
        pretrained(official, **{**OFFICIAL, 'num_layers': 2})


@pytest.mark.parametrize(
    'file_kw,model_kw,hint',
    [
        (dict(qkv_bias=False), {}, 'the file has no qkv bias: set qkv_bias=False'),
        ({}, dict(qkv_bias=False), 'the file has a qkv bias: set qkv_bias=True'),
        (dict(final_norm=False), {}, 'the file has no final norm: set final_norm=False'),
        (dict(patch_bias=False), {}, 'the file has no patch-embedding bias: set patch_bias=False'),
        (dict(init_values=None), {}, 'no LayerScale in the file: set init_values=None'),
        ({}, dict(init_values=None), 'the file has LayerScale (ls1/ls2.gamma): set init_values'),
        (dict(pre_norm=True), {}, 'the file has a norm before the blocks: set pre_norm=True'),
    ],
)
def test_architecture_mismatches_name_the_option(file_kw, model_kw, hint, tmp_path):
    path = tmp_path / 'other.pth'
    torch.save({'state_dict': tiny(**file_kw).state_dict()}, path)
    with pytest.raises(CheckpointError) as err:
        pretrained(path, **{**TINY, **model_kw})
    assert hint in str(err.value) and str(path) in str(err.value)


def test_by_design_unused_keys_are_dropped_not_refused(official):
    """A backbone without final norm / CLS token uses the rest of a file that has them."""
    model = LookHereViT(**{**OFFICIAL, 'final_norm': False})
    report = model.load_pretrained(str(official))
    assert {'norm.weight', 'norm.bias', 'head.fc1.weight'} <= set(report['dropped'])
    assert report['missing'] == report['unexpected'] == []


def test_strict_false_loads_what_fits_but_never_other_shapes(tmp_path):
    path = tmp_path / 'deeper.pth'
    torch.save({'state_dict': tiny(num_layers=4).state_dict()}, path)
    model = pretrained(path, **TINY, strict=False)
    assert model.load_pretrained(str(path), strict=False)['unexpected'][0].startswith('blocks.3')
    wide = tmp_path / 'wide.pth'
    torch.save({'state_dict': tiny(embed_dims=96).state_dict()}, wide)
    with pytest.raises(CheckpointError, match=r'tensors of the wrong shape'):
        pretrained(wide, **TINY, strict=False)


def test_a_file_of_another_architecture_names_its_other_keys_too():
    """A detector's checkpoint under a config with other heads (a new-user trial: the
    message listed only '4 tensors of the wrong shape' and hinted at the backbone's
    arguments): the keys each side lacks are named, and the heads' sizes in the advice."""
    from lookhere_dense.checkpoint.strict import match_state_dict

    model = {'rpn_conv.0.weight': torch.zeros(8, 8), 'fc.weight': torch.zeros(4, 8)}
    model['backbone._extra_state'] = torch.zeros(3, dtype=torch.uint8)
    file = {'rpn_conv.weight': torch.zeros(8, 8), 'fc.weight': torch.zeros(4, 16)}
    with pytest.raises(CheckpointError) as exc:
        match_state_dict(model, file, 'det.pth')
    msg = str(exc.value)
    assert msg.startswith(
        "checkpoint 'det.pth' does not fit the model (1 tensors of the wrong shape: "
        'fc.weight: checkpoint (4, 16) vs model (4, 8); the model has 1 tensors the file '
        "lacks: ['rpn_conv.0.weight']; the file has 1 the model lacks: ['rpn_conv.weight'])"
    )  # the record (_extra_state) is no tensor the file lacks
    assert "the heads' types and sizes (e.g. fc_out_channels" in msg
    file['fc.weight'] = torch.zeros(4, 8)  # shapes fit: missing / unexpected as before
    _, missing, unexpected = match_state_dict(model, file)
    assert missing == ['backbone._extra_state', 'rpn_conv.0.weight']
    assert unexpected == ['rpn_conv.weight']


def test_timm_norm_pre_loads_into_pre_norm(tmp_path):
    import timm

    vit = timm.create_model(
        'vit_tiny_patch16_224',
        pretrained=False,
        num_classes=0,
        depth=2,
        embed_dim=128,
        num_heads=2,
        pre_norm=True,
    )
    path = tmp_path / 'clip_like.pth'
    torch.save(vit.state_dict(), path)
    model = pretrained(
        path,
        embed_dims=128,
        num_layers=2,
        num_heads=2,
        init_values=None,
        pre_norm=True,
        patch_bias=False,
        pos_encoding='rope2d',
    )
    torch.testing.assert_close(model.pre_ln.weight, vit.norm_pre.weight)


def test_non_finite_weights_are_refused(tmp_path):
    sd = tiny().state_dict()
    sd['blocks.1.mlp.fc1.weight'][0, 0] = float('nan')
    path = tmp_path / 'diverged.pth'
    torch.save({'state_dict': sd}, path)
    with pytest.raises(
        CheckpointError,
        match=r'holds NaN / inf values in 1 parameters: '
        r"\['blocks.1.mlp.fc1.weight'\]",
    ):
        pretrained(path, **TINY)
    with pytest.raises(CheckpointError, match=r'NaN / inf'):
        load_model_weights(tiny(), str(path))


@pytest.mark.parametrize(
    'init_cfg,match',
    [
        (dict(type='Pretrained', checkpont='x.pth'), r"unknown keys \['checkpont'\]"),
        (dict(type='Pretrained'), r'needs checkpoint=PATH'),
    ],
)
def test_bad_init_cfg_is_named(init_cfg, match):
    with pytest.raises(ValueError, match=match):
        LookHereViT(**TINY, init_cfg=init_cfg).init_weights()


# ----------------------------------------------------------------------------------------
# Whole models: test / infer / resume
# ----------------------------------------------------------------------------------------
def segmentor(num_classes: int = 3, **backbone):
    from mmseg.registry import MODELS

    cfg = dict(
        type='EncoderDecoder',
        data_preprocessor=dict(type='SegDataPreProcessor', mean=[0, 0, 0], std=[1, 1, 1]),
        backbone=dict(type='LookHereViT', **{**TINY, **backbone}),
        decode_head=dict(
            type='FCNHead',
            in_channels=backbone.get('embed_dims', 48),
            channels=backbone.get('embed_dims', 48),
            num_convs=0,
            concat_input=False,
            num_classes=num_classes,
            norm_cfg=dict(type='BN', requires_grad=True),
        ),
        train_cfg=dict(),
        test_cfg=dict(mode='whole'),
    )
    with DefaultScope.overwrite_default_scope('mmseg'):
        torch.manual_seed(0)
        model = MODELS.build(cfg)
        model.init_weights()
    return model.eval()


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A Runner-style checkpoint of a segmentor with a non-default LookHere config."""
    model = segmentor(preset='lh90')
    path = tmp_path_factory.mktemp('whole') / 'iter_10.pth'
    torch.save(
        {
            'meta': {'dataset_meta': {'classes': ('a', 'b', 'c')}},
            'state_dict': model.state_dict(),
            'message_hub': {},
        },
        path,
    )
    return model, path


def test_a_fitting_checkpoint_loads_exactly(trained):
    src, path = trained
    model = segmentor()  # default config: the file's is adopted
    ckpt = load_model_weights(model, str(path))
    assert ckpt['meta']['dataset_meta']['classes'] == ('a', 'b', 'c')
    assert model.backbone.lh_config == src.backbone.lh_config
    x = torch.randn(1, 3, 32, 40)
    with torch.no_grad():
        torch.testing.assert_close(model.backbone(x)[0], src.backbone(x)[0])


def test_ddp_prefixed_checkpoints_load(trained, tmp_path):
    _, path = trained
    sd = torch.load(path, weights_only=True)['state_dict']
    ddp = tmp_path / 'ddp.pth'
    torch.save({'state_dict': {f'module.{k}': v for k, v in sd.items()}}, ddp)
    load_model_weights(segmentor(), str(ddp))


@pytest.mark.parametrize(
    'model_kw,match',
    [
        (
            dict(embed_dims=96),
            r'(?s)tensors of the wrong shape.*backbone.cls_token: checkpoint '
            r'\(1, 1, 48\) vs model \(1, 1, 96\)',
        ),
        (
            dict(num_heads=6),
            r'has 12 attention heads per block \(recorded in the file\).*'
            r'num_heads=6',
        ),
        (
            dict(num_classes=5),
            r'decode_head.conv_seg.weight: checkpoint \(3, 48, 1, 1\) vs model '
            r'\(5, 48, 1, 1\)',
        ),
        (
            dict(num_layers=4),
            r'lacks model parameters \(the file has 3 blocks \(backbone.blocks.0-2'
            r'\), the model 4: set num_layers=3\)',
        ),
        (dict(pos_encoding='rope2d'), r"trained with pos_encoding='lookhere'"),
    ],
)
def test_checkpoints_of_another_model_are_refused(trained, model_kw, match):
    _, path = trained
    num_classes = model_kw.pop('num_classes', 3)
    with pytest.raises(ValueError, match=match) as err:
        load_model_weights(segmentor(num_classes, **model_kw), str(path))
    assert str(path) in str(err.value)


def test_missing_and_unexpected_keys_are_named(trained, tmp_path):
    _, path = trained
    ckpt = torch.load(path, weights_only=False)
    lacking = copy.deepcopy(ckpt)
    del lacking['state_dict']['backbone.blocks.1.norm2.bias']
    p1 = tmp_path / 'lacking.pth'
    torch.save(lacking, p1)
    with pytest.raises(
        CheckpointError,
        match=r"lacks model parameters: \['backbone.blocks.1."
        r"norm2.bias'\]",
    ):
        load_model_weights(segmentor(), str(p1))
    extra = copy.deepcopy(ckpt)
    extra['state_dict']['auxiliary_head.conv_seg.weight'] = torch.zeros(3, 48, 1, 1)
    p2 = tmp_path / 'extra.pth'
    torch.save(extra, p2)
    with pytest.raises(
        CheckpointError,
        match=r"has tensors the model lacks: \['auxiliary_head"
        r".conv_seg.weight'\]",
    ):
        load_model_weights(segmentor(), str(p2))
    load_model_weights(segmentor(), str(p2), strict=False)  # opting out of the key check


def test_a_whole_model_file_without_the_backbone_record_is_refused(trained, tmp_path):
    """test / infer / resume need the record of what the weights mean (position encoding,
    LookHere config, head count); ``strict=False`` loads the weights without it (the head
    count then stated)."""
    _, path = trained
    ckpt = torch.load(path, weights_only=True)
    del ckpt['state_dict']['backbone._extra_state']
    bare = tmp_path / 'bare.pth'
    torch.save(ckpt, bare)
    with pytest.raises(
        CheckpointError,
        match=r'lacks model parameters \(the file lacks the '
        r"record a LookHereViT saves.*\['backbone."
        r"_extra_state'\]",
    ):
        load_model_weights(segmentor(), str(bare))
    load_model_weights(segmentor(), str(bare), strict=False, checkpoint_num_heads=12)


def test_backbone_only_weights_for_a_whole_model_get_a_hint(official):
    with pytest.raises(
        CheckpointError,
        match=r"has none of the model's keys.*backbone-only "
        r'weights.*init_cfg',
    ):
        load_model_weights(segmentor(), str(official))


def test_older_whole_model_files_without_recorded_heads(trained, tmp_path):
    """Files of lookhere-dense written before head counts were recorded count as 12 heads
    (the default and every shipped config); other counts must be stated."""
    _, path = trained
    ckpt = torch.load(path, weights_only=False)
    state = decode_extra_state(ckpt['state_dict']['backbone._extra_state'])
    for key in ('num_heads', 'num_layers', 'embed_dims'):
        state.pop(key)
    ckpt['state_dict']['backbone._extra_state'] = state  # the dict form files had then
    old = tmp_path / 'old.pth'
    torch.save(ckpt, old)
    load_model_weights(segmentor(), str(old))
    with pytest.raises(
        CheckpointError,
        match=r'has 12 attention heads per block \(not '
        r'recorded.*num_heads=6',
    ):
        load_model_weights(segmentor(num_heads=6), str(old))
    load_model_weights(segmentor(num_heads=6), str(old), checkpoint_num_heads=6)


def test_a_url_that_cannot_be_downloaded_is_not_called_corrupt(tmp_path, monkeypatch):
    """A stock config's ``https://download.openmmlab.com/...`` weights without a network
    (or a wrong address): 'could not be downloaded', not 'damaged: truncated or corrupt'."""
    from lookhere_dense.checkpoint import load_checkpoint_file
    from lookhere_dense.errors import UnreadableCheckpointError

    monkeypatch.setenv('TORCH_HOME', str(tmp_path))  # an empty hub cache
    url = 'http://127.0.0.1:9/vit_tiny_p16_384.pth'  # the discard port: refused at once
    with pytest.raises(UnreadableCheckpointError) as err:
        load_checkpoint_file(url)
    msg = str(err.value)
    assert msg.startswith(f'checkpoint {url!r} cannot be read: it could not be downloaded (')
    assert 'corrupt' not in msg and 'download the file and give its local path' in msg


def test_the_last_checkpoint_pointer_file_names_the_checkpoint_it_points_to(tmp_path):
    """``tools/test.py CONFIG work_dir/last_checkpoint``: mmengine's pointer file (one line
    naming the newest checkpoint), read as a pickle before ('Unsupported operand 47')."""
    from lookhere_dense.checkpoint import load_checkpoint_file

    target = tmp_path / 'iter_8.pth'
    torch.save({'state_dict': {'w': torch.zeros(2)}}, target)
    pointer = tmp_path / 'last_checkpoint'
    pointer.write_text(str(target))
    expected = (
        f"it is mmengine's last_checkpoint pointer file (a line of text naming {str(target)!r})"
    )
    assert checkpoint_problem(str(pointer)) == expected
    with pytest.raises(CheckpointError) as err:
        load_checkpoint_file(str(pointer))
    assert str(err.value) == (
        f'checkpoint {str(pointer)!r} cannot be read: {expected}; pass that checkpoint: {target}'
    )
    pointer.write_text(str(tmp_path / 'iter_9.pth'))  # names nothing that exists: as before
    assert 'pointer' not in checkpoint_problem(str(pointer))


def test_a_state_dict_is_not_quoted_as_a_file_name():
    """``adopt_lh_config`` names a file in quotes and 'the loaded state_dict' without them
    (it read "stored in 'the loaded state_dict'", as if that were a file)."""
    from lookhere_dense.errors import CheckpointError
    from lookhere_dense.lookhere import create_model
    from lookhere_dense.lookhere.weights import adopt_lh_config

    model = create_model(embed_dims=48, num_layers=1, num_heads=12, preset='lh90')
    bad = dict(model.lh_config.to_dict(), head_directions='no-such-layout')
    with pytest.raises(CheckpointError, match=r'stored in the loaded state_dict cannot be used'):
        adopt_lh_config(model, bad, 'the loaded state_dict')
    with pytest.raises(CheckpointError, match=r"stored in 'w\.pth' cannot be used"):
        adopt_lh_config(model, bad, 'w.pth')
