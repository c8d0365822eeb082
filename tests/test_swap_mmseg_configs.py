"""Backbone swap over every plain-ViT segmentation config shipped with mmsegmentation.

Each config whose backbone is ``VisionTransformer`` (Segmenter, ViT/DeiT UPerNet, SETR,
DPT), ``BEiT`` or ``MAE`` is found by reading the installed config files (no list is
hard-coded), swapped to ``LookHereViT`` with :func:`lookhere_dense.swap.swap_backbone`,
shrunk (fewer layers, 16 dims per head, 32x32 inputs; every channel count that equalled
the embed dims follows it), built with mmseg's registry and run forward + loss +
backward on CPU. Configs that differ only in schedule, dataset or crop give the same
shrunk model and are tested once.
"""

from __future__ import annotations

import copy
import glob
import json
import os.path as osp
import re
from typing import Dict, List, Tuple

import pytest
import torch

from lookhere_dense.errors import ConfigError
from lookhere_dense.swap import SOURCE_BACKBONES, swap_backbone

mmseg = pytest.importorskip('mmseg')
CONFIG_ROOT = osp.join(osp.dirname(mmseg.__file__), '.mim', 'configs')
_TYPE = re.compile(r"type\s*=\s*'(%s)'" % '|'.join(SOURCE_BACKBONES))
_BASE = re.compile(r"_base_\s*=\s*(\[[^\]]*\]|'[^']*')", re.S)
SIZE = 32  # input side in px: a 2x2 patch grid
_CHANNEL_KEYS = {
    'in_channels',
    'channels',
    'embed_dims',
    'out_channels',
    'embed_dim',
    'post_process_channels',
}


def _mentions_vit(path: str, seen: set) -> bool:
    """Does the config file or any of its bases name a plain-ViT backbone type?"""
    if path in seen or not osp.isfile(path):
        return False
    seen.add(path)
    text = open(path).read()
    if _TYPE.search(text):
        return True
    m = _BASE.search(text)
    bases = re.findall(r"'([^']+)'", m.group(1)) if m else []
    return any(
        _mentions_vit(osp.normpath(osp.join(osp.dirname(path), b)), seen)
        for b in bases
        if '::' not in b
    )


def vit_configs() -> List[str]:
    """Relative paths of the shipped configs whose model backbone is a plain ViT."""
    from mmengine.config import Config

    out = []
    for path in sorted(glob.glob(osp.join(CONFIG_ROOT, '*', '*.py'))):
        if '/_base_/' in path or not _mentions_vit(path, set()):
            continue
        cfg = Config.fromfile(path)
        if cfg.get('model', {}).get('backbone', {}).get('type') in SOURCE_BACKBONES:
            out.append(osp.relpath(path, CONFIG_ROOT))
    return out


def _replace_channels(node, old: int, new: int, key: str = ''):
    if isinstance(node, dict):
        return {k: _replace_channels(v, old, new, k) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        items = [_replace_channels(v, old, new, key) for v in node]
        return type(node)(items)
    if key in _CHANNEL_KEYS and node == old:
        return new
    return node


def _bn_for_syncbn(node):
    if isinstance(node, dict):
        return {
            k: ('BN' if k == 'type' and v == 'SyncBN' else _bn_for_syncbn(v))
            for k, v in node.items()
        }
    if isinstance(node, (list, tuple)):
        return type(node)(_bn_for_syncbn(v) for v in node)
    return node


def shrink(model: dict) -> dict:
    """A small but structurally identical copy of a swapped model config."""
    model = copy.deepcopy(model)
    bb = model['backbone']
    old = bb.get('embed_dims', 768)
    new = 16 * bb.get('num_heads', 12)
    outs = bb.get('out_indices', -1)
    if isinstance(outs, int):
        bb['num_layers'], bb['out_indices'] = 2, -1
    else:
        bb['num_layers'], bb['out_indices'] = len(outs), list(range(len(outs)))
    bb['embed_dims'] = new
    bb['img_size'] = (SIZE, SIZE)
    for part in ('neck', 'decode_head', 'auxiliary_head'):
        if model.get(part) is not None:
            model[part] = _replace_channels(model[part], old, new)
    if model.get('decode_head', {}).get('type') == 'SegmenterMaskTransformerHead':
        model['decode_head']['num_heads'] = 4  # keep the head's own transformer tiny
    model = _bn_for_syncbn(model)
    model['data_preprocessor']['size'] = (SIZE, SIZE)
    model['test_cfg'] = dict(mode='whole')
    return model


#: Settings that change numbers, not structure: models that differ only in these (after
#: shrinking) are tested once.
_NUMERIC = _CHANNEL_KEYS | {
    'num_classes',
    'drop_path_rate',
    'drop_rate',
    'attn_drop_rate',
    'dropout_ratio',
    'init_values',
    'eps',
    'num_heads',
    'img_size',
    'loss_weight',
    'data_preprocessor',
    'mla_channels',
}


# one PyTorch thread for the whole module (see conftest.one_torch_thread)
pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _structure(node):
    if isinstance(node, dict):
        return {k: (None if k in _NUMERIC else _structure(v)) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_structure(v) for v in node]
    return node


def _signature(model: dict) -> str:
    return json.dumps(_structure(model), sort_keys=True, default=str)


def _load(rel: str):
    from mmengine.config import Config

    return Config.fromfile(osp.join(CONFIG_ROOT, rel))


def _swap_kwargs(rel: str) -> dict:
    cfg = _load(rel)
    heads = cfg.model.backbone.get('num_heads', 12)
    return {} if heads in (6, 12, 16) else dict(num_heads=12)


def unique_models() -> Dict[str, Tuple[str, dict]]:
    """``{config: shrunk swapped model}`` for one config per distinct shrunk model."""
    seen, out = set(), {}
    for rel in vit_configs():
        new = swap_backbone(_load(rel), **_swap_kwargs(rel))
        model = shrink(new.to_dict()['model'])
        sig = _signature(model)
        if sig not in seen:
            seen.add(sig)
            out[rel] = model
    return out


@pytest.fixture(scope='module')
def discovered() -> List[str]:
    return vit_configs()


@pytest.fixture(scope='module')
def models() -> Dict[str, dict]:
    return unique_models()


def test_discovery_covers_the_vit_families(discovered):
    families = {rel.split('/')[0] for rel in discovered}
    assert {'segmenter', 'vit', 'setr', 'dpt', 'beit', 'mae'} <= families, families
    assert len(discovered) >= 25  # 30 in mmsegmentation 1.2.2


def test_dedupe_keeps_every_family(models, discovered):
    assert {rel.split('/')[0] for rel in models} == {rel.split('/')[0] for rel in discovered}
    assert len(models) < len(discovered)


def _batch(model) -> dict:
    """Two random ``SIZE`` x ``SIZE`` images with labels, through the model's preprocessor."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    num_classes = model.decode_head.num_classes
    imgs = [torch.randint(0, 255, (3, SIZE, SIZE), dtype=torch.uint8) for _ in range(2)]
    samples = []
    for _ in imgs:
        s = SegDataSample()
        s.gt_sem_seg = PixelData(
            data=torch.randint(0, num_classes, (1, SIZE, SIZE), dtype=torch.long)
        )
        s.set_metainfo(
            dict(img_shape=(SIZE, SIZE), ori_shape=(SIZE, SIZE), pad_shape=(SIZE, SIZE))
        )
        samples.append(s)
    return model.data_preprocessor(dict(inputs=imgs, data_samples=samples), True)


def _total_loss(model, data: dict) -> torch.Tensor:
    losses = model(**data, mode='loss')
    return sum(v for k, v in losses.items() if 'loss' in k)


def test_every_vit_config_swaps_builds_and_trains_a_step(models):
    from mmengine.config import ConfigDict
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    init_default_scope('mmseg')
    torch.manual_seed(0)
    failures = []
    for rel, model_cfg in models.items():
        try:
            model = MODELS.build(ConfigDict(model_cfg))  # PyTorch's default init is enough
            model.train()
            assert type(model.backbone).__name__ == 'LookHereViT'
            data = _batch(model)
            total = _total_loss(model, data)
            assert torch.isfinite(total), (rel, total)
            total.backward()
            grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
            assert any(g is not None and g.abs().sum() > 0 for g in grads), rel
            model.eval()
            with torch.no_grad():
                pred = model(data['inputs'], data['data_samples'], mode='predict')
            assert pred[0].pred_sem_seg.data.shape[-2:] == (SIZE, SIZE), rel
        except Exception as err:  # collect all, report together
            failures.append(f'{rel}: {type(err).__name__}: {err}')
    assert not failures, '\n'.join(failures)


#: a plain-ViT config built beside the BEiT / MAE ones in the optimizer test: mmengine's
#: default constructor with ``custom_keys``, which the swap keeps
PLAIN_VIT = 'vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py'
LOOKHERE_DECAY = 'LookHereLayerDecayOptimizerConstructor'


def _optim_wrapper(model, cfg):
    """mmengine's ``build_optim_wrapper`` on ``cfg.optim_wrapper`` (an ``AmpOptimWrapper``
    built as a plain ``OptimWrapper``: it needs a GPU; the constructor is the same)."""
    from mmengine.optim import build_optim_wrapper

    wrapper = copy.deepcopy(cfg.optim_wrapper)
    wrapper.type = 'OptimWrapper'
    return build_optim_wrapper(model, wrapper)


def _lr_and_decay(model, optim_wrapper) -> Dict[str, Tuple[float, float]]:
    """``{parameter name: (lr, weight_decay)}`` of a built optimizer wrapper."""
    names = {id(p): n for n, p in model.named_parameters()}
    out = {}
    for group in optim_wrapper.optimizer.param_groups:
        for p in group['params']:
            out[names[id(p)]] = (group['lr'], group['weight_decay'])
    return out


#: mmseg ``BEiT`` / ``MAE`` backbone parameter (a regex on its name in the segmentor) ->
#: the ``LookHereViT`` parameter that takes its place in the swapped model (``\1`` is the
#: block index). BEiT's separate q / v biases are slices of LookHere's one qkv bias.
_SOURCE_TO_LOOKHERE = tuple(
    (re.compile(pattern), target)
    for pattern, target in (
        (r'backbone\.cls_token', 'backbone.cls_token'),
        (r'backbone\.patch_embed\.projection\.(weight|bias)', r'backbone.patch_embed.proj.\1'),
        (r'backbone\.layers\.(\d+)\.ln1\.(weight|bias)', r'backbone.blocks.\1.norm1.\2'),
        (r'backbone\.layers\.(\d+)\.ln2\.(weight|bias)', r'backbone.blocks.\1.norm2.\2'),
        (r'backbone\.layers\.(\d+)\.attn\.qkv\.(weight|bias)', r'backbone.blocks.\1.attn.qkv.\2'),
        (r'backbone\.layers\.(\d+)\.attn\.[qv]_bias', r'backbone.blocks.\1.attn.qkv.bias'),
        (
            r'backbone\.layers\.(\d+)\.attn\.proj\.(weight|bias)',
            r'backbone.blocks.\1.attn.proj.\2',
        ),
        (
            r'backbone\.layers\.(\d+)\.ffn\.layers\.0\.0\.(weight|bias)',
            r'backbone.blocks.\1.mlp.fc1.\2',
        ),
        (
            r'backbone\.layers\.(\d+)\.ffn\.layers\.1\.(weight|bias)',
            r'backbone.blocks.\1.mlp.fc2.\2',
        ),
        (r'backbone\.layers\.(\d+)\.gamma_1', r'backbone.blocks.\1.ls1.gamma'),
        (r'backbone\.layers\.(\d+)\.gamma_2', r'backbone.blocks.\1.ls2.gamma'),
        (r'backbone\.ln1\.(weight|bias)', r'backbone.norm.\1'),  # final_norm=True
    )
)
#: LookHereViT parameters with no source counterpart (the default preset learns no slopes)
_LOOKHERE_ONLY: frozenset = frozenset()
#: The one documented difference (docs/segmentation.md): mmseg's constructor exempts
#: ``pos_embed`` / ``cls_token`` from weight decay by unprefixed name, so on a segmentor it
#: decays ``backbone.cls_token``; ours does not.
_CLS_TOKEN = 'backbone.cls_token'


def _source_only(family: str, depth: int) -> set:
    """The source backbone's position parameters, which LookHere has no counterpart of."""
    names = {f'backbone.layers.{i}.attn.relative_position_bias_table' for i in range(depth)}
    return names | {'backbone.pos_embed'} if family == 'mae' else names


def _to_lookhere(name: str) -> Tuple[int, str]:
    """``(rule index, LookHereViT name)`` of a source backbone parameter, or ``(-1, '')``."""
    for i, (pattern, target) in enumerate(_SOURCE_TO_LOOKHERE):
        if pattern.fullmatch(name):
            return i, pattern.sub(target, name)
    return -1, ''


def _backbone_differences(
    family: str, depth: int, ours: dict, ref: dict, base_wd: float, used: set
) -> List[str]:
    """Every backbone parameter's ``(lr, weight_decay)`` under our constructor on the swapped
    model (``ours``) against mmseg's on the source model (``ref``), mapped by name; what
    differs beyond the documented ``backbone.cls_token`` weight decay, one line each.
    ``used`` collects the mapping rules that matched."""
    problems, unmatched, covered = [], set(), set()
    for name, want in sorted(ref.items()):
        if not name.startswith('backbone.'):
            continue
        rule, target = _to_lookhere(name)
        if rule < 0:
            unmatched.add(name)
            continue
        used.add(rule)
        covered.add(target)
        got = ours.get(target)
        if got is None:
            problems.append(f'{name} -> {target}: no such LookHereViT parameter')
        elif name == _CLS_TOKEN:
            if not (base_wd > 0 and got == pytest.approx((want[0], 0.0)) and want[1] == base_wd):
                problems.append(
                    f'{name}: (lr, weight_decay) {got} (ours) vs {want} (mmseg); expected '
                    f'the documented difference only: weight decay 0 (ours) vs {base_wd}'
                )
        elif got != pytest.approx(want):
            problems.append(
                f'{name} -> {target}: (lr, weight_decay) {got} (ours) vs {want} (mmseg)'
            )
    expected_only = _source_only(family, depth)
    if unmatched != expected_only:
        problems.append(
            f'source-only parameters: unexpected {sorted(unmatched - expected_only)}, '
            f'missing {sorted(expected_only - unmatched)}'
        )
    ours_only = {n for n in ours if n.startswith('backbone.')} - covered
    if ours_only != _LOOKHERE_ONLY:
        problems.append(f'LookHereViT parameters with no source counterpart: {sorted(ours_only)}')
    return problems


def test_layer_decay_configs_build_their_optimizer_and_train_a_step(discovered):
    """The BEiT / MAE configs name mmseg's LayerDecayOptimizerConstructor, which raises a
    bare NotImplementedError for any backbone class but BEiT / MAE / ConvNeXt: swapped,
    they build their optimizer wrapper with mmengine's build_optim_wrapper (as the Runner
    does), with the source's layer-wise decay, and take an optimizer step. Every backbone
    parameter, mapped by name to the source's (_SOURCE_TO_LOOKHERE), and every head
    parameter gets the lr and weight decay mmseg's constructor gives the source model, but
    for the documented cls_token weight decay; the source's position parameters are the only
    ones without a counterpart. The ``_ms`` twins (the same model as their single-scale
    configs) are built with ``final_norm=True``, for the final norm's mapping. A plain-ViT
    config keeps its default constructor (no decay)."""
    import mmseg.engine  # noqa: F401 - registers mmseg's constructors, for the reference
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    init_default_scope('mmseg')
    torch.manual_seed(0)
    decayed = [rel for rel in discovered if rel.split('/')[0] in ('beit', 'mae')]
    assert {rel.split('/')[0] for rel in decayed} == {'beit', 'mae'}
    assert len(decayed) >= 4, decayed  # 6 in mmsegmentation 1.2.2
    failures, used = [], set()
    for rel in decayed + [PLAIN_VIT]:
        try:
            src = _load(rel)
            src.model = shrink(src.model.to_dict())
            if re.search(r'[-_]ms\.py$', rel):
                src.model.backbone.final_norm = True
            depth = src.model.backbone.num_layers
            layer_decay = src.optim_wrapper.get('constructor') is not None
            if layer_decay:  # as a config for the shrunk backbone would say
                src.optim_wrapper.paramwise_cfg.num_layers = depth
            notes: List[str] = []
            new = swap_backbone(src, report=notes.append, **_swap_kwargs(rel))
            # a plain ViT gains LookHere's LayerScale, and the swap says so
            scale = [n for n in notes if n.startswith('init_values=0.0001: LayerScale')]
            assert len(scale) == int(src.model.backbone.type == 'VisionTransformer'), notes
            notes = [n for n in notes if n not in scale]
            # whole-image tests (UPerNet's) get size_divisor, said once; sliding ones nothing
            padded = [n for n in notes if n.startswith('model.data_preprocessor.test_cfg')]
            whole = src.model.get('test_cfg', {}).get('mode', 'whole') == 'whole'
            assert len(padded) == int(whole), notes
            notes = [n for n in notes if n not in padded]
            model = MODELS.build(new.model)
            model.train()
            optim_wrapper = _optim_wrapper(model, new)
            lrs = _lr_and_decay(model, optim_wrapper)
            base = new.optim_wrapper.optimizer.lr
            blocks = []
            for i in range(depth):
                block = {lr for n, (lr, _) in lrs.items() if n.startswith(f'backbone.blocks.{i}.')}
                assert len(block) == 1, (i, block)
                blocks.append(block.pop())
            heads = {lr for n, (lr, _) in lrs.items() if not n.startswith('backbone.')}
            assert heads == {base}, heads
            if not layer_decay:
                assert new.optim_wrapper.get('constructor') is None and not notes, notes
                assert set(blocks) == {base}, blocks
            else:
                rate = src.optim_wrapper.paramwise_cfg.layer_decay_rate
                assert new.optim_wrapper.constructor == LOOKHERE_DECAY
                assert new.optim_wrapper.paramwise_cfg == dict(decay_rate=rate, num_layers=depth)
                assert len(notes) == 1 and f"-> constructor='{LOOKHERE_DECAY}'" in notes[0]
                assert blocks[0] < blocks[-1] < base, blocks
                assert blocks == pytest.approx([base * rate ** (depth - i) for i in range(depth)])
                # mmseg's own constructor on the source model: the same lr and weight decay
                # for every parameter, in the backbone mapped by name
                ref_model = MODELS.build(src.model)
                ref = _lr_and_decay(ref_model, _optim_wrapper(ref_model, src))
                head_names = {n for n in ref if not n.startswith('backbone.')}
                assert head_names == {n for n in lrs if not n.startswith('backbone.')}
                for name in sorted(head_names):
                    assert lrs[name] == pytest.approx(ref[name]), (name, lrs[name], ref[name])
                family, base_wd = rel.split('/')[0], src.optim_wrapper.optimizer.weight_decay
                problems = _backbone_differences(family, depth, lrs, ref, base_wd, used)
                assert not problems, '\n  '.join(['backbone lr / weight decay:'] + problems)
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            loss = _total_loss(model, _batch(model))
            assert torch.isfinite(loss), (rel, loss)
            optim_wrapper.backward(loss)
            optim_wrapper.step()  # not update_params: BEiT-L accumulates 2 steps
            moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
            assert any(n.startswith('backbone.blocks.0.') for n in moved), rel
            assert any(n.startswith('decode_head.') for n in moved), rel
        except Exception as err:  # collect all, report together
            failures.append(f'{rel}: {type(err).__name__}: {err}')
    unused = [p.pattern for i, (p, _) in enumerate(_SOURCE_TO_LOOKHERE) if i not in used]
    assert not failures, '\n'.join(failures)
    assert not unused, f'mapping rules no source parameter matched: {unused}'


_MMSEG_DECAY = dict(decay_rate=0.8, decay_type='layer_wise_vit', num_layers=12)


@pytest.mark.parametrize(
    'constructor,paramwise,expect',
    [
        (  # mmseg's newer name, scoped; the keys it ignores are dropped and said so
            'mmseg.LearningRateDecayOptimizerConstructor',
            dict(_MMSEG_DECAY, custom_keys={'head': dict(lr_mult=10.0)}),
            (LOOKHERE_DECAY, dict(decay_rate=0.8, num_layers=14), r"\['custom_keys'\] dropped"),
        ),
        (
            'LayerDecayOptimizerConstructor',
            dict(num_layers=12, layer_decay_rate=0.9),
            (LOOKHERE_DECAY, dict(decay_rate=0.9, num_layers=14), 'LookHereViT depth, 14'),
        ),
        (  # already LookHere's: only the depth follows the backbone
            LOOKHERE_DECAY,
            dict(decay_rate=0.9, num_layers=12),
            (LOOKHERE_DECAY, dict(decay_rate=0.9, num_layers=14), r'num_layers: 12 -> 14'),
        ),
        (
            'ForceDefaultOptimWrapperConstructor',
            {},
            ('ForceDefaultOptimWrapperConstructor', {}, None),
        ),
        ('MyConstructor', {}, ('MyConstructor', {}, "'MyConstructor' kept as it is")),
        (
            'LearningRateDecayOptimizerConstructor',
            dict(_MMSEG_DECAY, decay_type='stage_wise'),
            r"optim_wrapper.paramwise_cfg.decay_type='stage_wise' .*ConvNeXt",
        ),
        (
            'LayerDecayOptimizerConstructor',
            dict(num_layers=12),
            r"'LayerDecayOptimizerConstructor' without optim_wrapper.paramwise_cfg.layer_decay_rate",
        ),
        (
            'mmpretrain.LearningRateDecayOptimWrapperConstructor',
            dict(layer_decay_rate=0.65),
            r"constructor='mmpretrain.LearningRateDecayOptimWrapperConstructor' cannot work "
            'with LookHereViT: .*get_layer_depth',
        ),
    ],
)
def test_swap_rewrites_or_refuses_optimizer_constructors(constructor, paramwise, expect):
    """Each optimizer constructor that depends on the backbone's class is rewritten for
    LookHereViT (num_layers = the swapped backbone's depth, here 14 set on the source) or
    refused with the key to set; others are kept (an unknown one with a note)."""
    cfg = _load('beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py')
    cfg.model.backbone.num_layers = 14
    cfg.optim_wrapper.constructor = constructor
    cfg.optim_wrapper.paramwise_cfg = paramwise
    notes: List[str] = []
    if isinstance(expect, str):
        with pytest.raises(ConfigError, match=expect):
            swap_backbone(cfg, report=notes.append)
        return
    want_constructor, want_paramwise, note = expect
    new = swap_backbone(cfg, report=notes.append)
    assert new.optim_wrapper.constructor == want_constructor
    assert new.optim_wrapper.paramwise_cfg == want_paramwise
    if note is None:
        assert notes == []
    else:
        assert len(notes) == 1 and re.search(note, notes[0]), notes


def test_vit_t_needs_a_head_count_lookhere_supports():
    rel = 'segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py'
    with pytest.raises(ConfigError, match=r'num_heads=3.*Set model.backbone.num_heads'):
        swap_backbone(_load(rel))
    new = swap_backbone(_load(rel), num_heads=12)
    assert new.model.backbone.num_heads == 12
    assert new.model.backbone.embed_dims == 192


def test_swap_carries_architecture_and_drops_position_settings():
    dpt = swap_backbone(_load('dpt/dpt_vit-b16_8xb2-160k_ade20k-512x512.py'), preset='lh90')
    bb = dpt.model.backbone
    assert bb.type == 'LookHereViT' and bb.preset == 'lh90'
    assert (bb.embed_dims, bb.num_layers, tuple(bb.out_indices)) == (768, 12, (2, 5, 8, 11))
    assert bb.output_cls_token is True and bb.final_norm is False
    assert 'interpolate_mode' not in bb and 'pretrained' not in bb
    assert dpt.model.pretrained is None
    assert 'lookhere_dense.openmmlab' in dpt.custom_imports.imports
    beit = swap_backbone(_load('beit/beit-base_upernet_8xb2-160k_ade20k-640x640.py'))
    assert beit.model.backbone.qkv_bias is True and beit.model.backbone.init_values == 0.1
    src = _load('setr/setr_vit-l_mla_8xb1-80k_cityscapes-768x768.py')
    setr = swap_backbone(src).model.backbone
    assert setr.with_cls_token is False
    for key in ('drop_rate', 'out_indices', 'norm_cfg', 'num_layers', 'embed_dims'):
        assert setr[key] == src.model.backbone[key], key


def test_dpt_without_cls_token_outputs_says_what_to_set():
    cfg = _load('dpt/dpt_vit-b16_8xb2-160k_ade20k-512x512.py')
    cfg.model.backbone.output_cls_token = False
    with pytest.raises(ConfigError, match='output_cls_token=True'):
        swap_backbone(cfg)


def test_cls_token_outputs_into_a_plain_head_says_what_to_set():
    cfg = _load('segmenter/segmenter_vit-b_mask_8xb1-160k_ade20k-512x512.py')
    cfg.model.backbone.output_cls_token = True
    with pytest.raises(ConfigError, match='Set model.backbone.output_cls_token=False'):
        swap_backbone(cfg)


@pytest.mark.parametrize(
    'overrides,match',
    [
        (
            dict(pos_encoding='sincos'),
            r"model.backbone.pos_encoding: unknown pos_encoding 'sincos'",
        ),
        (
            dict(pos_encoding='lookhere:lh30'),
            r"model.backbone.pos_encoding: unknown LookHere preset 'lh30'",
        ),
        (dict(pos_encoding='abs:lh90'), r'model.backbone.pos_encoding: .*only lookhere takes'),
        (dict(preset='lh30'), r"model.backbone.preset: unknown LookHere preset 'lh30'"),
        (dict(pos_encoding='alibi2d', preset='lh90'), r'model.backbone.preset: .*no LookHere'),
        (
            dict(lh_config=dict(head_directions='quarters-none')),
            r"model.backbone.lh_config: unknown LookHere direction type 'quarters'",
        ),
        (
            dict(pos_encoding='lookhere:lh45', preset='lh90'),
            r'model.backbone.preset: .*two '
            r'different presets',
        ),
    ],
)
def test_swap_names_the_backbone_key_of_a_bad_position_encoding(overrides, match):
    """The config check parses pos_encoding / preset / lh_config with the backbone's own
    parser (parse_pos_encoding) and names the key at fault."""
    with pytest.raises(ConfigError, match=match):
        swap_backbone(
            _load('segmenter/segmenter_vit-b_mask_8xb1-160k_ade20k-512x512.py'), **overrides
        )


def test_swap_accepts_the_short_lookhere_preset_form():
    cfg = swap_backbone(
        _load('segmenter/segmenter_vit-b_mask_8xb1-160k_ade20k-512x512.py'),
        pos_encoding='lookhere:lh45',
    )
    assert cfg.model.backbone.pos_encoding == 'lookhere:lh45'
