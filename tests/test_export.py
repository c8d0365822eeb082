"""Export: the static-grid attention equals the engine's, a tiny model exported to ONNX at two
grid sizes runs in onnxruntime with the torch results, and neither the file nor
onnxruntime's optimised graph holds an ``N x N`` bias; ``tools/export.py`` exports the
Segmenter (logits at ``H x W``) and the backbone, as ONNX and ``.pt2``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine, LookHereConfig, create_model
from lookhere_dense.lookhere.export import (
    StaticGridAttention,
    query_blocked_attention,
    static_grid_attention,
)

pytestmark = pytest.mark.usefixtures('one_torch_thread')
onnx = pytest.importorskip('onnx')
ort = pytest.importorskip('onnxruntime')

CONFIGS = {
    'lh180': PRESETS['lh180'],
    'lh90': PRESETS['lh90'],
    'lh45': PRESETS['lh45'],
    'center': LookHereConfig('center-none'),
    'fill_max': LookHereConfig('corners-none', fill_with='max'),
}


@pytest.mark.parametrize('name', list(CONFIGS))
@pytest.mark.parametrize(
    'grid,cls', [((5, 7), True), ((4, 3), False), ((1, 6), True), ((6, 1), True), ((3, 3), False)]
)
def test_static_grid_attention_equals_the_reference(name, grid, cls):
    torch.manual_seed(0)
    engine = LookHereAttentionEngine(CONFIGS[name], 2, 12)
    n = grid[0] * grid[1] + int(cls)
    q, k, v = (torch.randn(2, 12, n, 8) for _ in range(3))
    for budget in (1e-4, 48.0):  # one grid column per block, and one block
        static = StaticGridAttention(engine, grid, cls_token=cls, budget_mb=budget)
        for layer in range(2):
            ref = engine(q, k, v, layer, grid, cls, backend='reference')
            torch.testing.assert_close(static(q, k, v, layer, grid, cls), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize('grid', [(6, 6), (5, 7)])  # a multiple of the window, and padded
def test_static_grid_window_attention_equals_the_engine(grid):
    torch.manual_seed(0)
    engine = LookHereAttentionEngine(PRESETS['lh90'], 2, 12)
    static = StaticGridAttention(engine, grid, window_size=3, cls_token=True)
    q, k, v = (torch.randn(2, 12, grid[0] * grid[1] + 1, 8) for _ in range(3))
    ref = engine.window_attention(q, k, v, 1, grid, 3, True)
    torch.testing.assert_close(
        static.window_attention(q, k, v, 1, grid, 3, True), ref, atol=1e-5, rtol=0
    )


def test_static_grid_attention_refuses_another_grid():
    engine = LookHereAttentionEngine(PRESETS['lh90'], 1, 12)
    static = StaticGridAttention(engine, (4, 6))
    q = torch.randn(1, 12, 4 * 5 + 1, 8)
    with pytest.raises(ValueError, match=r'prepared for the patch grid \(4, 6\), got \(4, 5\)'):
        static(q, q, q, 0, (4, 5), True)


def test_an_export_under_autocast_is_refused_with_what_to_do():
    """``torch.export`` under ``torch.autocast`` recorded a graph that mixed a bfloat16 bias
    with float32 queries and failed when run (a new-user trial); refused by name, and the
    advice (convert the model) exports a bfloat16 program that runs."""
    torch.manual_seed(0)
    model = create_model(img_size=64, embed_dims=48, num_layers=1, num_heads=12).eval()
    x = torch.randn(1, 3, 64, 64)
    with static_grid_attention(model, (64, 64)), torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.raises(ValueError, match=r'under torch\.autocast \(cpu, torch\.bfloat16\)'):
            torch.export.export(model, (x,))
    low = model.to(torch.bfloat16)
    with static_grid_attention(low, (64, 64)):
        program = torch.export.export(low, (x.to(torch.bfloat16),))
    out = program.module()(x.to(torch.bfloat16))
    assert out[-1].dtype == torch.bfloat16 and bool(torch.isfinite(out[-1]).all())


def test_query_blocked_attention_equals_one_call():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 300, 8) for _ in range(3))
    exp = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    # 300 queries in blocks of 128 (the least), and in one block
    for budget in (0.001, 64.0):
        torch.testing.assert_close(query_blocked_attention(q, k, v, budget), exp)


def _tiny(**kw):
    torch.manual_seed(0)
    return create_model(
        embed_dims=48,
        num_layers=2,
        num_heads=12,
        preset='lh90',
        init_values=None,
        out_indices=(0, 1),
        **kw,
    ).eval()


def _initializer_bytes(model) -> int:
    sizes = {1: 4, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 16: 2}
    return sum(math.prod(t.dims) * sizes.get(t.data_type, 4) for t in model.graph.initializer)


def _export(model, x, path: Path):
    from lookhere_dense.apis.export import save_onnx

    with static_grid_attention(model, x.shape[-2:]):
        program = torch.onnx.export(model, (x,), dynamo=True, opset_version=23, optimize=False)
    save_onnx(program, str(path))


def _timm_tiny():
    timm = pytest.importorskip('timm')
    import lookhere_dense.timm_models  # noqa: F401 - registers the timm names

    return timm.create_model('lookhere_vit_tiny_patch16_224', depth=2).eval()


@pytest.mark.parametrize('build', [_tiny, _timm_tiny], ids=['create_model', 'timm'])
def test_plain_export_says_what_to_do_and_the_documented_way_works(build, tmp_path: Path):
    """docs/deploy.md, "Plain PyTorch and timm models": without ``static_grid_attention``
    ``torch.export`` / ``torch.onnx.export`` stop with the hint; with it, the snippet's
    call (named input and outputs, a dynamic batch from an example of 2) writes a file
    onnxruntime runs equal to torch at batch 1 and 3."""
    from torch.export import Dim

    from lookhere_dense.apis.export import onnxruntime_session
    from lookhere_dense.lookhere.vit import EXPORT_HINT

    model = build()
    images = torch.randn(2, 3, 48, 64)
    with pytest.raises(RuntimeError, match='static_grid_attention') as err:
        torch.export.export(model, (images,))
    assert str(err.value) == EXPORT_HINT
    with torch.no_grad():
        expected = model(images)
    names = [f'out{i}' for i in range(len(expected))] if isinstance(expected, tuple) else ['y']
    with static_grid_attention(model, images.shape[-2:]):
        torch.onnx.export(
            model,
            (images,),
            str(tmp_path / 'lookhere.onnx'),
            input_names=['images'],
            output_names=names,
            dynamic_shapes=({0: Dim('batch')},),
        )
    session = onnxruntime_session(str(tmp_path / 'lookhere.onnx'))
    assert [o.name for o in session.get_outputs()] == names
    for batch in (1, 3):  # the batch stays dynamic
        x = torch.randn(batch, 3, 48, 64)
        with torch.no_grad():
            want = model(x)
        want = want if isinstance(want, (tuple, list)) else [want]
        outputs = session.run(None, {'images': x.numpy()})
        assert len(outputs) == len(want)
        for out, exp in zip(outputs, want, strict=True):
            torch.testing.assert_close(torch.from_numpy(out), exp, atol=1e-4, rtol=0)
    # the model is as before: eager calls at other sizes still run
    assert model(torch.randn(1, 3, 32, 32)) is not None


def test_a_jumbo_trunk_with_window_blocks_exports_and_runs_in_onnxruntime(tmp_path: Path):
    """J = 3 Jumbo tokens (global in the static-grid attention and in the windows), the
    Jumbo tokens side by side as the second output."""
    from lookhere_dense.apis.export import onnxruntime_session

    model = _tiny(
        with_cls_token=False,
        jumbo_tokens=3,
        output_cls_token=True,
        window_size=3,
        window_block_indexes=[0],
    )
    x = torch.randn(1, 3, 80, 112)  # 5x7 patches: the windows of 3 need padding
    with torch.no_grad():
        expected = [t for pair in model(x) for t in pair]
    path = tmp_path / 'jumbo.onnx'
    _export(model, x, path)
    session = onnxruntime_session(str(path))
    outputs = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    assert [o.shape for o in outputs] == [tuple(e.shape) for e in expected]
    for out, exp in zip(outputs, expected, strict=True):
        torch.testing.assert_close(torch.from_numpy(out), exp, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    'kw', [dict(), dict(mem_pattern=True, mem_reuse=True, cpu_arena=False, threads=2)]
)
def test_onnxruntime_session_sets_its_memory_options(kw, tmp_path: Path):
    """Defaults: memory pattern and buffer reuse off, the CPU arena on (the settings that
    hold the least memory, docs/deploy.md); each keyword reaches onnxruntime."""
    from lookhere_dense.apis.export import onnxruntime_session

    model = _tiny()
    x = torch.randn(1, 3, 32, 48)
    path = tmp_path / 'one.onnx'
    _export(model, x, path)
    opts = onnxruntime_session(str(path), **kw).get_session_options()
    want = dict(mem_pattern=False, mem_reuse=False, cpu_arena=True, threads=None) | kw
    assert opts.enable_mem_pattern is want['mem_pattern']
    assert opts.enable_mem_reuse is want['mem_reuse']
    assert opts.enable_cpu_mem_arena is want['cpu_arena']
    if want['threads']:
        assert opts.intra_op_num_threads == want['threads']


@pytest.mark.parametrize('size', [(64, 96), (80, 48)])  # two grids; 80x48 also pads nothing
def test_onnx_export_runs_in_onnxruntime_without_a_dense_bias(size, tmp_path: Path):
    from lookhere_dense.apis.export import onnxruntime_session

    model = _tiny()
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        expected = model(x)
    path = tmp_path / 'tiny.onnx'
    _export(model, x, path)
    session = onnxruntime_session(str(path))
    outputs = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    for out, exp in zip(outputs, expected, strict=True):
        torch.testing.assert_close(torch.from_numpy(out), exp, atol=1e-4, rtol=0)
    grid = (size[0] // 16, size[1] // 16)
    weights = sum(t.numel() * 4 for t in model.state_dict().values() if t.is_floating_point())
    tables = 2 * 12 * (2 * grid[0]) * (2 * grid[1] - 1) * 4  # 2 layers, extended tables
    indices = 16 * 1024  # the shared int64 index tables and small per-block ones
    # weights + tables + indices and nothing more: one layer's dense bias alone would be
    # 12 x T x T x 4 bytes (30 KB at 4x6); folded bias blocks add ~60 KB here
    assert _initializer_bytes(onnx.load(str(path))) <= weights + tables + indices
    # onnxruntime's own session optimisation (constant folding has no size limit) must not
    # turn the bias back into constants either: the runtime zero keeps it a computation
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / 'optimized.onnx')
    ort.InferenceSession(str(path), options, providers=['CPUExecutionProvider'])
    folded = _initializer_bytes(onnx.load(str(tmp_path / 'optimized.onnx')))
    assert folded <= weights + tables + indices, (folded, weights, tables)


def _attention_nodes(path: Path) -> int:
    return sum(n.op_type == 'Attention' for n in onnx.load(str(path)).graph.node)


def test_export_tool_writes_segmenter_logits_and_backbone_maps(tmp_path: Path):
    from tiny_seg import ADE_CFG, SHRINK, options, write_checkpoint

    from lookhere_dense.apis.export import export_model

    ckpt = write_checkpoint(str(tmp_path / 'ckpt' / 'iter_0.pth'))
    opts = options(*SHRINK)
    lines = []
    seg = export_model(
        ADE_CFG, ckpt, (64, 96), str(tmp_path / 'seg.onnx'), cfg_options=opts, log=lines.append
    )
    assert seg['output_shapes'] == [[1, 150, 64, 96]] and seg['max_abs_diff'] < 1e-4
    assert seg['lookhere_layers_served'] == 1
    assert seg['query_blocked_modules'] == 2  # the mask head's two layers
    # the mask head's attention over 24 patches + 150 classes (174 queries) fits one block
    # of the default 48 MiB: one Attention per head layer; per backbone layer one block and the CLS row
    assert _attention_nodes(tmp_path / 'seg.onnx') == 2 * 2 + 2 * 1
    small = export_model(
        ADE_CFG,
        ckpt,
        (64, 96),
        str(tmp_path / 'small.onnx'),
        cfg_options=opts,
        budget_mb=0.01,
        log=lines.append,
    )
    assert small['max_abs_diff'] < 1e-4
    # blocks of one grid column (6) and the CLS row per backbone layer; two blocks of at
    # most 128 queries per head layer
    assert _attention_nodes(tmp_path / 'small.onnx') == 2 * (6 + 1) + 2 * 2
    assert set(seg['files']) == {str(tmp_path / 'seg.onnx'), str(tmp_path / 'seg.onnx.data')}
    assert any('onnxruntime vs torch' in ln for ln in lines)
    bb = export_model(
        ADE_CFG,
        ckpt,
        (80, 48),
        str(tmp_path / 'bb.pt2'),
        format='pt2',
        part='backbone',
        cfg_options=opts,
        log=lines.append,
    )
    assert bb['output_shapes'] == [[1, 96, 5, 3]] and bb['max_abs_diff'] < 1e-4
    assert bb['total_bytes'] <= bb['weights_bytes'] + bb['tables_bytes'] + 1_500_000, bb
    # the largest constant is a weight, not a bias
    assert bb['largest_constant'][2] <= bb['largest_weight_bytes'], bb['largest_constant']
    assert seg['largest_constant'][2] <= seg['largest_weight_bytes'], seg['largest_constant']


@pytest.mark.parametrize('out,fmt', [('c.onnx', 'pt2'), ('c.PT2', 'onnx')])
def test_export_refuses_a_suffix_of_the_other_format(out, fmt, tmp_path: Path):
    """``--format pt2 --out c.onnx`` wrote a ``.pt2`` archive named ``.onnx`` (exit 0)."""
    from tiny_seg import ADE_CFG

    from lookhere_dense.apis.export import export_model
    from lookhere_dense.errors import ConfigError

    with pytest.raises(
        ConfigError, match=rf"--out '.*{out}' names a \..* file but the format is '{fmt}'"
    ):
        export_model(ADE_CFG, None, (64, 96), str(tmp_path / out), format=fmt)
    assert not any(tmp_path.iterdir())


def _mmseg_whole_mode(config: str, ckpt: str, opts: dict, img):
    """``mmseg.apis.inference_model`` in whole mode on the BGR image ``img`` (no resize):
    the result's ``seg_logits`` / ``pred_sem_seg``, and the normalised input (BGR->RGB,
    mean / std; the exported graph's input) as a numpy array."""
    from mmseg.apis import inference_model, init_model

    from lookhere_dense.apis.cli import load_config

    cfg = load_config(config, opts)
    cfg.model.test_cfg = dict(mode='whole')
    cfg.test_pipeline = [dict(type='LoadImageFromNDArray'), dict(type='PackSegInputs')]
    model = init_model(cfg, ckpt, device='cpu')
    with torch.no_grad():
        res = inference_model(model, img)
    dp = model.data_preprocessor
    x = torch.from_numpy(img).permute(2, 0, 1).float()
    x = x[[2, 1, 0]] if dp.channel_conversion else x
    x = ((x - dp.mean) / dp.std)[None]
    return res.seg_logits.data, res.pred_sem_seg.data[0], x.numpy()


def _run_file(path: Path, x):
    if path.suffix == '.pt2':
        with torch.no_grad():
            return torch.export.load(str(path)).module()(torch.from_numpy(x))
    from lookhere_dense.apis.export import onnxruntime_session

    session = onnxruntime_session(str(path))
    return torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x})[0])


# pad value 0 is also what the patch embedding pads with, 2 is not: only a graph that pads
# its input as mmseg does matches then
@pytest.mark.parametrize('fmt,pad_val', [('onnx', 0), ('onnx', 2), ('pt2', 2)])
def test_export_at_an_odd_size_gives_mmseg_whole_mode_inference(fmt, pad_val, tmp_path: Path):
    """mmseg's whole mode pads the normalised input to the data preprocessor's
    ``size_divisor`` (16: 40x72 -> 48x80) with its ``pad_val``, resizes the head's logits
    to the padded size and crops them: the exported graph does the same (onnxruntime and
    ``torch.export.load`` equal to ``inference_model``'s logits and classes), and the tool's
    own check compares with that (not with ``encode_decode`` of the unpadded input)."""
    import numpy as np
    from tiny_seg import ADE_CFG, SHRINK, options, write_checkpoint

    from lookhere_dense.apis.export import export_model

    shape = (40, 72)  # not a multiple of size_divisor=16
    ckpt = write_checkpoint(str(tmp_path / 'ckpt' / 'iter_0.pth'))
    opts = options(*SHRINK, f'model.data_preprocessor.pad_val={pad_val}')
    path = tmp_path / f'odd.{fmt}'
    lines = []
    rep = export_model(
        ADE_CFG, ckpt, shape, str(path), format=fmt, cfg_options=opts, log=lines.append
    )
    assert rep['output_shapes'] == [[1, 150, *shape]] and rep['max_abs_diff'] < 1e-4, rep
    img = np.random.default_rng(0).integers(0, 256, (*shape, 3), dtype=np.uint8)
    logits, pred, x = _mmseg_whole_mode(ADE_CFG, ckpt, opts, img)
    out = _run_file(path, x)
    assert out.shape == (1, 150, *shape)
    torch.testing.assert_close(out[0], logits, atol=1e-4, rtol=0)
    assert torch.equal(out[0].argmax(0), pred)
    assert rep['padded_size'] == [48, 80] and rep['grid'] == [3, 5]
    assert rep['pad_value'] == pad_val and rep['argmax_agreement'] == 1.0
    assert any('padded in the graph to 48x80' in ln for ln in lines), lines
    assert not any('WARNING' in ln for ln in lines), lines


def test_export_check_catches_a_graph_without_mmseg_padding(monkeypatch, tmp_path: Path):
    """The check compares with mmseg's inference: a segmentor exported without the
    test-time padding (the graph before this was fixed) at 40x72 is reported as different
    (a large max |diff|, classes that disagree, a warning line)."""
    from tiny_seg import ADE_CFG, SHRINK, options, write_checkpoint

    import lookhere_dense.apis.export as export

    ckpt = write_checkpoint(str(tmp_path / 'ckpt' / 'iter_0.pth'))
    monkeypatch.setattr(export, 'whole_mode_padding', lambda model, size: (tuple(size), 0.0))
    lines = []
    rep = export.export_model(
        ADE_CFG,
        ckpt,
        (40, 72),
        str(tmp_path / 'unpadded.pt2'),
        format='pt2',
        cfg_options=options(*SHRINK),
        log=lines.append,
    )
    assert rep['padded_size'] == [40, 72]
    assert rep['max_abs_diff'] > 1e-2 and rep['argmax_agreement'] < 0.99, rep
    assert any(ln.startswith('WARNING: the exported file differs') for ln in lines), lines


@pytest.mark.parametrize('pos_encoding', ['rope2d', 'pape', 'rope_dinov3'])
def test_encodings_with_cached_tables_export(pos_encoding):
    """The RoPE / PaPE tables are cached; the cache's size accounting read the storage's
    data pointer of an exporter's fake tensors: ``torch.export`` of a trunk with these
    encodings (and ``tools/export.py``) died in a 280-line traceback."""
    torch.manual_seed(0)
    model = create_model(
        embed_dims=48, num_layers=2, num_heads=12, pos_encoding=pos_encoding, out_indices=(0, 1)
    ).eval()
    x = torch.randn(1, 3, 48, 64)
    with torch.no_grad():
        expected = model(x)
    with static_grid_attention(model, x.shape[-2:]):
        program = torch.export.export(model, (x,))
    with torch.no_grad():
        got = program.module()(x)
    for out, exp in zip(got, expected, strict=True):
        torch.testing.assert_close(out, exp, atol=1e-5, rtol=0)


def test_backbone_export_with_cls_tokens_is_checked_on_flat_outputs(tmp_path: Path):
    """``--part backbone`` with ``output_cls_token=True`` wrote the file, then its check
    died (``'list' object has no attribute 'shape'``): the backbone gives ``[map, cls]``
    per index, the file flat outputs. Both are flat now: map, CLS, map, CLS."""
    from tiny_seg import ADE_CFG, SHRINK, options

    from lookhere_dense.apis.export import export_model, onnxruntime_session

    opts = options(
        *SHRINK, 'model.backbone.output_cls_token=True', 'model.backbone.out_indices=[0,1]'
    )
    rep = export_model(
        ADE_CFG,
        None,
        (48, 64),
        str(tmp_path / 'bb.onnx'),
        part='backbone',
        cfg_options=opts,
        log=lambda _: None,
    )
    assert rep['output_shapes'] == [[1, 96, 3, 4], [1, 96]] * 2 and rep['max_abs_diff'] < 1e-4
    # the file's outputs by name, the same at every size (torch generated them before)
    assert rep['output_names'] == ['block0', 'cls0', 'block1', 'cls1']
    session = onnxruntime_session(str(tmp_path / 'bb.onnx'))
    assert [o.name for o in session.get_outputs()] == ['block0', 'cls0', 'block1', 'cls1']
    assert session.get_inputs()[0].name == 'images'


def test_export_refuses_what_it_cannot_write_before_building(tmp_path: Path):
    """Each of these failed only after the export, in a traceback or a misleading error:
    ``--out`` naming a folder (``IsADirectoryError``) or ending in ``/`` (``No such file
    '.../.x.data...'``); ``--part backbone`` below one patch (the model's error under a
    torch traceback); a LookWhere segmentor (its selector's grid was prepared at the
    image's: "export at the input size it serves"); ``--out m.PT2`` without ``--format``
    (refused as "the format is 'onnx' ... leave --format out")."""
    import importlib.util

    from tiny_seg import ADE_CFG, REPO, SHRINK, options

    from lookhere_dense.apis.export import export_model
    from lookhere_dense.errors import ConfigError

    opts = options(*SHRINK)
    quiet = dict(cfg_options=opts, log=lambda _: None)
    with pytest.raises(ConfigError, match=r"--out '.*' is a folder: give the file to write"):
        export_model(ADE_CFG, None, (64, 64), str(tmp_path), **quiet)
    with pytest.raises(ConfigError, match='is a folder'):
        export_model(ADE_CFG, None, (64, 64), str(tmp_path / 'new') + '/', **quiet)
    with pytest.raises(
        ConfigError,
        match=r'--shape 8 40: the backbone alone takes images of at least one 16x16 patch',
    ):
        export_model(ADE_CFG, None, (8, 40), str(tmp_path / 'b.onnx'), part='backbone', **quiet)
    lookwhere = str(Path(REPO) / 'configs' / 'segmenter_lookwhere_vit-t_tiny-ade.py')
    with pytest.raises(
        ConfigError, match=r'backbone is a LookWhereViT \(LookWhere\): .*not supported'
    ):
        export_model(lookwhere, None, (64, 64), str(tmp_path / 'lw.onnx'), log=lambda _: None)
    assert not any(tmp_path.iterdir())
    spec = importlib.util.spec_from_file_location(
        'export_tool', Path(REPO) / 'tools' / 'export.py'
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    args = tool.parse_args([ADE_CFG, '--random-weights', '--shape', '64', '64', '--out', 'm.PT2'])
    assert args.format == 'pt2'
