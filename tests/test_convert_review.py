"""Review fixes of tools/convert_checkpoint.py and of loading converted / foreign weights:
a non-square timm pos_embed with a CLS entry, atomic and safe output writes, recorded
position encodings, malformed containers, block gaps, register tokens. Torch (and timm)
only, tiny models."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from lookhere_dense.errors import CheckpointError, ToolError
from lookhere_dense.lookhere import LookHereVisionTransformer, create_model
from lookhere_dense.lookhere.weights import backbone_weights, load_backbone_weights

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / 'tools' / 'convert_checkpoint.py'
KW = dict(embed_dims=48, num_layers=2, num_heads=12, patch_size=16, img_size=64)


@functools.lru_cache(maxsize=1)
def _tool():
    spec = importlib.util.spec_from_file_location('convert_checkpoint_review', TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _convert(*argv) -> int:
    """``tools/convert_checkpoint.py ARGV`` in this process (ToolError propagates)."""
    return _tool().main([str(a) for a in argv])


def _convert_subprocess(*argv, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), *[str(a) for a in argv]],
        capture_output=True,
        text=True,
        preexec_fn=preexec,
        cwd=str(REPO),
    )


# ----------------------------------------------------------------------------------------
# 1. a timm pos_embed of a non-square grid with a CLS entry (6x8 + 1 = 49 tokens)
# ----------------------------------------------------------------------------------------
def test_a_non_square_timm_pos_embed_with_cls_is_kept_exactly(tmp_path: Path):
    timm = pytest.importorskip('timm')
    torch.manual_seed(0)
    src = timm.create_model(
        'vit_tiny_patch16_224', pretrained=False, img_size=(96, 128), depth=2, num_classes=0
    ).eval()
    assert src.pos_embed.shape[1] == 49  # 6x8 patches + CLS: a square length
    with torch.no_grad():
        src.pos_embed.normal_(0, 0.5)
    path, out = tmp_path / 'timm.pth', tmp_path / 'conv.pth'
    torch.save(src.state_dict(), path)
    assert _convert(path, out, '--keep-pos-embed') == 0
    model = create_model(
        str(out),
        embed_dims=192,
        num_layers=2,
        num_heads=3,
        patch_size=16,
        img_size=(96, 128),
        pos_encoding='abs',
        init_values=None,
        norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6),
    ).eval()
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        torch.testing.assert_close(
            model.forward_features(x), src.forward_features(x), atol=1e-4, rtol=1e-4
        )


# ----------------------------------------------------------------------------------------
# 2. the output: not the source, written atomically, a failed write named in one line
# ----------------------------------------------------------------------------------------
def _trunk_file(tmp_path: Path, enc: str = 'lookhere', name: str | None = None) -> Path:
    torch.manual_seed(0)
    m = LookHereVisionTransformer(**KW, pos_encoding=enc)
    m.init_weights()
    path = tmp_path / (name or f'{enc}.pth')
    torch.save(m.state_dict(), path)
    return path


def test_converting_a_file_onto_itself_is_refused(tmp_path: Path):
    src = _trunk_file(tmp_path)
    before = src.read_bytes()
    other = tmp_path / 'sub' / '..' / src.name  # another spelling of the same file
    (tmp_path / 'sub').mkdir()
    for dst in (src, other):
        with pytest.raises(ToolError, match='is the source file'):
            _convert(src, dst)
    link = tmp_path / 'link.pth'
    os.symlink(src, link)
    with pytest.raises(ToolError, match='is the source file'):
        _convert(link, src)
    assert src.read_bytes() == before


def test_a_failed_write_keeps_the_earlier_file_and_says_so_in_one_line(tmp_path: Path):
    import resource

    src = _trunk_file(tmp_path)
    dst = tmp_path / 'out.pth'
    dst.write_bytes(b'earlier')

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    res = _convert_subprocess(src, dst, preexec=limit)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: ') and str(dst) in lines[0], lines
    assert 'file-size limit' in lines[0] and 'Traceback' not in res.stderr
    assert dst.read_bytes() == b'earlier'
    assert not [p for p in os.listdir(tmp_path) if 'partial' in p]


def test_an_output_under_a_file_names_that_file(tmp_path: Path):
    src = _trunk_file(tmp_path)
    with pytest.raises(ToolError, match=r"lookhere\.pth' is a file, not a folder"):
        _convert(src, tmp_path / 'lookhere.pth' / 'x.pth')


# ----------------------------------------------------------------------------------------
# 3. a .safetensors output would lose the meta its reader does not read: refused
# ----------------------------------------------------------------------------------------
def test_a_safetensors_output_is_refused(tmp_path: Path):
    src = _trunk_file(tmp_path)
    with pytest.raises(ToolError, match=r'name the output \.pth'):
        _convert(src, tmp_path / 'out.safetensors')
    assert not (tmp_path / 'out.safetensors').exists()


# ----------------------------------------------------------------------------------------
# 4. the converter records the pos_encoding; weights of another one are never loaded
#    silently: a 'lookhere' file is refused elsewhere, another encoding's trunk moves to a
#    'lookhere' model (as pretraining, the project's rule) with a warning naming both
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('enc', ['abs', 'rope2d', 'alibi2d', 'none'])
def test_weights_of_another_encoding_are_named(tmp_path: Path, enc):
    src = _trunk_file(tmp_path, enc)
    out = tmp_path / f'{enc}_conv.pth'
    assert _convert(src, out) == 0
    assert torch.load(out, weights_only=True)['meta']['pos_encoding'] == enc
    for path in (src, out):
        with pytest.warns(UserWarning, match=f"pos_encoding={enc!r}.*pos_encoding='lookhere'"):
            create_model(str(path), **KW)  # pos_encoding='lookhere'
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            model = create_model(str(path), **KW, pos_encoding=enc)  # its own: as it is
        assert model.pos_encoding == enc


def test_a_converted_lookhere_file_is_refused_elsewhere_by_name(tmp_path: Path):
    src = _trunk_file(tmp_path, 'lookhere')
    out = tmp_path / 'lh_conv.pth'
    assert _convert(src, out) == 0
    assert torch.load(out, weights_only=True)['meta']['pos_encoding'] == 'lookhere'
    with pytest.raises(CheckpointError, match="holds a 'lookhere' model"):
        create_model(str(out), **KW, pos_encoding='rope2d')


def test_an_abs_table_without_a_record_tells_the_encoding(tmp_path: Path):
    """A trunk's weights without their record (``_extra_state`` removed): the key
    ``pos_enc.pos_embed`` is the 'abs' trunk's."""
    src = _trunk_file(tmp_path, 'abs')
    sd = torch.load(src, weights_only=True)
    sd.pop('_extra_state')
    with pytest.warns(UserWarning, match="pos_encoding='abs'"):
        load_backbone_weights(LookHereVisionTransformer(**KW), sd, checkpoint_num_heads=12)


# ----------------------------------------------------------------------------------------
# 5. malformed containers: one CheckpointError naming the file and the key
# ----------------------------------------------------------------------------------------
def _official_weights(reference_dir: Path):
    ref = torch.load(reference_dir / 'official_tiny_halves_none.pth', weights_only=True)
    return dict(ref['weights']), ref['config']


@pytest.mark.parametrize(
    'case',
    [
        'config_none',
        'config_str',
        'weights_list',
        'sd_list',
        'meta_cfg_str',
        'meta_str',
        'heads_str',
        'nontensor',
    ],
)
def test_malformed_containers_name_the_file_and_the_key(tmp_path: Path, reference_dir, case):
    w, cfg = _official_weights(reference_dir)
    ckpt, key = {
        'config_none': ({'weights': w, 'config': None}, "'config'"),
        'config_str': ({'weights': w, 'config': 'halves-none'}, "'config'"),
        'weights_list': ({'weights': [1, 2], 'config': cfg}, "'weights'"),
        'sd_list': ({'state_dict': [1, 2]}, "'state_dict'"),
        'meta_cfg_str': (
            {'state_dict': w, 'meta': {'lookhere_config': 'lh90'}},
            'lookhere_config',
        ),
        'meta_str': ({'state_dict': w, 'meta': 'x'}, "'meta'"),
        'heads_str': ({'state_dict': w, 'meta': {'num_heads': 'twelve'}}, 'num_heads'),
        'nontensor': ({'state_dict': {**w, 'blocks.0.attn.qkv.weight': 3.0}}, 'blocks.0.attn.qkv'),
    }[case]
    path = tmp_path / f'{case}.pth'
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError) as info:
        backbone_weights(ckpt, source=str(path))
    assert str(path) in str(info.value) and key in str(info.value), info.value
    res = _convert_subprocess(path, tmp_path / 'out.pth')
    assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr
    assert str(path.name) in res.stderr and key in res.stderr, res.stderr
    assert not (tmp_path / 'out.pth').exists()


# ----------------------------------------------------------------------------------------
# 6. a gap in the blocks; register tokens in an 'abs' pos_embed
# ----------------------------------------------------------------------------------------
def test_a_gap_in_the_blocks_is_named(tmp_path: Path):
    from lookhere_dense.lookhere.weights import vit_key_hints

    keep = {'blocks.0.', 'blocks.1.'}
    sd = {
        k: v
        for k, v in torch.load(_trunk_file(tmp_path), weights_only=True).items()
        if not k.startswith('blocks.') or k[:9] in keep
    }
    sd.update({k.replace('blocks.1.', 'blocks.4.'): v for k, v in sd.items() if 'blocks.1.' in k})
    path = tmp_path / 'gap.pth'
    torch.save(sd, path)
    with pytest.raises(ToolError, match=r'lacks the blocks blocks\.2, blocks\.3'):
        _convert(path, tmp_path / 'out.pth')
    hints = vit_key_hints([], [], ['blocks.0.x', 'blocks.1.x'], sorted(sd))
    assert any('blocks.2-3' in h for h in hints) and not any('num_layers=5' in h for h in hints)


def test_register_tokens_in_an_abs_pos_embed_are_named(tmp_path: Path):
    timm = pytest.importorskip('timm')
    src = timm.create_model(
        'vit_tiny_patch16_224', pretrained=False, img_size=64, depth=2, num_classes=0, reg_tokens=4
    )
    path, out = tmp_path / 'reg.pth', tmp_path / 'reg_conv.pth'
    torch.save(src.state_dict(), path)
    assert _convert(path, out, '--keep-pos-embed') == 0
    with pytest.raises(CheckpointError, match=r'reg_conv\.pth.*pos_embed.*4 register tokens'):
        create_model(
            str(out),
            embed_dims=192,
            num_layers=2,
            num_heads=3,
            patch_size=16,
            img_size=64,
            pos_encoding='abs',
            init_values=None,
        )


def test_our_own_abs_table_is_never_read_with_a_cls_entry(tmp_path: Path):
    """A 7x7 ``pos_enc.pos_embed`` (49 entries, ours: never a CLS entry) into a 6x8 model
    (48 = 49 - 1) was read as 6x8 + CLS: its first entry added to ``cls_token``, the rest
    taken as the 6x8 grid unresampled. It is resampled, the CLS token untouched."""
    kw = dict(KW, img_size=112)
    torch.manual_seed(0)
    src = LookHereVisionTransformer(pos_encoding='abs', **kw)
    with torch.no_grad():
        src.pos_enc.pos_embed.normal_()
    path = tmp_path / 'abs7.pth'
    torch.save({'state_dict': src.state_dict()}, path)
    dst = LookHereVisionTransformer(pos_encoding='abs', **dict(KW, img_size=(96, 128)))
    load_backbone_weights(dst, str(path))
    assert torch.equal(dst.cls_token, src.cls_token)
    expected, cls_entry, note = dst.pos_enc.adapt_checkpoint_embedding(
        src.pos_enc.pos_embed.detach(), has_cls=False
    )
    assert cls_entry is None and note.startswith('resampled 7x7 -> 6x8')
    assert torch.equal(dst.pos_enc.pos_embed.detach(), expected)


def test_an_alibi2d_file_converted_before_encodings_were_recorded_loads_into_alibi2d(
    tmp_path: Path,
):
    """Earlier conversions wrote the 2D-ALiBi config (every head unrestricted) without the
    encoding: not taken for a LookHere model (it was refused from an alibi2d backbone)."""
    from lookhere_dense.checkpoint import decode_extra_state
    from lookhere_dense.lookhere.weights import EXTRA_STATE_KEY

    sd = LookHereVisionTransformer(pos_encoding='alibi2d', **KW).state_dict()
    record = decode_extra_state(sd[EXTRA_STATE_KEY])
    tensors = {k: v for k, v in sd.items() if k != EXTRA_STATE_KEY}
    path = tmp_path / 'old_alibi.pth'
    meta = {'lookhere_config': record['lh_config'], 'num_heads': 12, 'source': 'x'}
    torch.save({'state_dict': tensors, 'meta': meta}, path)
    model = LookHereVisionTransformer(pos_encoding='alibi2d', **KW)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no warning either: the same bias
        load_backbone_weights(model, str(path))
    assert torch.equal(model.blocks[0].attn.qkv.weight, tensors['blocks.0.attn.qkv.weight'])
