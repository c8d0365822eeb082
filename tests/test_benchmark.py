"""The benchmark package (:mod:`research.benchmark`) and its command line.

The torch-only cases (bias build, the official-style baseline, the attention section, the
report, the fresh-process runner) are tested directly; the model cases (need OpenMMLab)
on a tiny ViT; ``tools/benchmark.py`` itself only as a subprocess (``--quick``, ``-h``).
Running the ``attention`` group without OpenMMLab is in ``tests/test_torch_only.py``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

from lookhere_dense.lookhere import (
    PRESETS,
    LookHereAttentionEngine,
    LookHereConfig,
    build_grid_bias,
    lookhere_bias,
)
from lookhere_dense.lookhere.bias import offset_index
from lookhere_dense.lookhere.flex import FLEX_BLOCK, flex_available, tile_order
from research.benchmark import DTYPES, SECTION_GROUPS, SECTIONS
from research.benchmark.attention import (
    bench_attention,
    grid_for,
    skipped_tile_fraction,
)
from research.benchmark.bias import bias_case
from research.benchmark.child import run_case
from research.benchmark.fresh import run_child
from research.benchmark.official import baseline_matches, official_style_bias
from research.benchmark.report import environment, format_table
from research.benchmark.timing import interleaved, paired_ratio, rotations

pytestmark = pytest.mark.usefixtures('one_torch_thread')  # tiny tensors: see conftest
needs_flex = pytest.mark.skipif(not flex_available(), reason='no flex_attention in this torch')


# ----------------------------------------------------------------------------------------
# Sections and timing
# ----------------------------------------------------------------------------------------
def test_section_groups_cover_the_sections():
    assert SECTIONS == (
        'bias',
        'vit',
        'frame',
        'segmenter',
        'attn',
        'compile',
        'deploy',
        'peer',
    )
    assert SECTION_GROUPS['all'] == SECTIONS[:-3]  # compile, deploy and peer: by name only
    assert SECTION_GROUPS['attention'] == ('bias', 'attn')
    assert set(SECTION_GROUPS['attention']) | set(SECTION_GROUPS['models']) == set(
        SECTION_GROUPS['all']
    )
    assert SECTION_GROUPS['models'] == ('vit', 'frame', 'segmenter')
    assert DTYPES['bfloat16'] is torch.bfloat16


def test_interleaved_rotates_the_order_every_round():
    calls = []
    cases = {name: (lambda name=name: calls.append(name)) for name in 'abc'}
    times = interleaved(cases, 4, 'cpu')
    assert calls == list('abcbcacababc')
    assert {n: len(t) for n, t in times.items()} == dict(a=4, b=4, c=4)
    assert all(s >= 0 for t in times.values() for s in t)


def test_rotations_start_each_round_one_further():
    assert list(rotations('abc', 4)) == [
        (0, list('abc')),
        (1, list('bca')),
        (2, list('cab')),
        (3, list('abc')),
    ]
    assert list(rotations([], 2)) == [(0, []), (1, [])]


def test_paired_ratio_is_the_median_of_per_round_ratios():
    assert paired_ratio([2.0, 9.0, 3.0], [1.0, 3.0, 1.0]) == 3.0  # ratios 2, 3, 3
    assert paired_ratio([1.0, 4.0], [1.0, 1.0]) == 2.5
    with pytest.raises(ValueError, match='equally long'):
        paired_ratio([1.0], [1.0, 2.0])


# ----------------------------------------------------------------------------------------
# The official-style baseline and the bias section
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'config',
    [
        PRESETS['lh45'],
        PRESETS['lh90'],
        PRESETS['lh180'],
        LookHereConfig('triangles-none', fill_with='max', distance='sqrt', layer_slopes=(1, 2)),
        LookHereConfig('halves-none', fill_with='zero', global_slope=0.5, distance='square'),
    ],
)
def test_official_style_baseline_gives_our_bias(config):
    """Two independent constructions (per-query loops + np.tri vs offset tables) agree
    bit for bit on a rectangular grid (bf16 max <-> -inf)."""
    grid = (4, 6)
    ours = lookhere_bias(config, grid, 3, 12, dtype=torch.float32)
    theirs = official_style_bias(config, grid, 3, 12)
    assert theirs.dtype == torch.bfloat16 and theirs.shape == ours.shape
    theirs = theirs.float()
    theirs[theirs == -torch.finfo(torch.bfloat16).max] = -math.inf
    assert torch.equal(ours, theirs)
    assert baseline_matches('lh45', (3, 5))


def test_official_style_baseline_reports_its_stages():
    marks = {}
    official_style_bias(PRESETS['lh90'], (3, 3), 2, 12, marks)
    assert set(marks) == {'shared_s', 'layers_s', 'shared_rss', 'layers_rss'}
    assert marks['layers_rss'] >= marks['shared_rss'] > 0


def test_bias_case_measures_ours_and_the_baseline_in_process():
    base = dict(kind='bias', preset='lh45', grid=[5, 6], heads=12)
    ours = bias_case(dict(base, impl='ours', depth=2, repeats=2))
    assert ours['seconds'] > 0 and ours['first_seconds'] > 0
    assert ours['table_bytes'] == 2 * 12 * 9 * 11 * 4  # (depth, heads, 2H-1, 2W-1) float32
    assert ours['peak_rise'] >= 0 and ours['peak'] > 0 and ours['dense_layer_seconds'] > 0
    theirs = bias_case(dict(base, impl='baseline', depth=1))
    assert theirs['seconds'] > 0 and theirs['shared_s'] > 0 and theirs['layers_s'] > 0
    assert theirs['impl'] == 'baseline' and theirs['grid'] == [5, 6]
    with pytest.raises(ValueError, match="unknown bias implementation 'fast'"):
        bias_case(dict(base, impl='fast', depth=1))


def test_run_child_runs_a_case_in_a_fresh_process_and_reports_failures():
    case = dict(
        kind='bias',
        preset='lh90',
        grid=[4, 4],
        heads=12,
        impl='ours',
        depth=1,
        repeats=1,
        threads=1,
    )
    done = run_child(case, timeout=300)
    assert 'error' not in done, done
    assert done['table_bytes'] == 12 * 7 * 7 * 4 and done['seconds'] > 0
    failed = run_child(dict(kind='nonsense'), timeout=300)
    assert failed['kind'] == 'nonsense'
    assert (
        failed['error'].startswith('exit 1') and 'unknown benchmark case kind' in failed['error']
    )
    with pytest.raises(
        ValueError,
        match="allowed: \\['bias', 'frame', 'segmenter', 'compile', 'deploy', 'peer'\\]",
    ):
        run_case(dict(kind='nonsense'))


# ----------------------------------------------------------------------------------------
# The attention section
# ----------------------------------------------------------------------------------------
def test_grid_for_is_as_square_as_possible():
    assert grid_for(8192) == (64, 128)
    assert grid_for(1024) == (32, 32)
    assert grid_for(4096) == (64, 64)
    assert grid_for(7) == (1, 7)
    assert grid_for(12) == (3, 4)
    with pytest.raises(ValueError, match='tokens must be >= 1'):
        grid_for(0)


def _skipped_by_definition(config, grid, order=None, block=FLEX_BLOCK):
    """Fraction of all-blocked ``block`` x ``block`` tiles of the dense visibility (all
    heads of layer 0, no CLS), from :func:`offset_index` (the plain definition)."""
    gb = build_grid_bias(config, grid, 1, 12)
    n = grid[0] * grid[1]
    idx = torch.arange(n) if order is None else order
    visible = gb.visible[0].flatten(1)[:, offset_index(grid, idx, idx)]  # (heads, n, n)
    tiles = math.ceil(n / block)
    padded = torch.zeros(12, tiles * block, tiles * block, dtype=torch.bool)
    padded[:, :n, :n] = visible
    seen = padded.view(12, tiles, block, tiles, block).any(dim=4).any(dim=2)
    return 1 - seen.float().mean().item()


@needs_flex
@pytest.mark.parametrize('preset,tokens', [('lh90', 1024), ('lh45', 512), ('lh45', 300)])
def test_skipped_tile_fraction_is_the_fraction_of_all_blocked_tiles(preset, tokens):
    grid = grid_for(tokens)  # 32x32, 16x32, 15x20 (ragged last tile)
    eng = LookHereAttentionEngine(PRESETS[preset], 1, 12, 'flex')
    got = skipped_tile_fraction(eng, grid, torch.device('cpu'))
    assert got['row order'] == pytest.approx(_skipped_by_definition(PRESETS[preset], grid))
    assert got['tile order'] == pytest.approx(
        _skipped_by_definition(PRESETS[preset], grid, tile_order(grid, False))
    )
    assert 0 < got['row order'] < 1 and 0 < got['tile order'] < 1
    if tokens == 1024:  # docs/performance.md: LH-90 at 1024 tokens, 29 % vs 35 %
        assert (round(got['row order'], 2), round(got['tile order'], 2)) == (0.29, 0.35)


@needs_flex
def test_bench_attention_on_cpu_reports_tile_sparsity_only():
    res = bench_attention('lh90', [64, 256], num_heads=12, embed_dims=96, device='cpu')
    assert res['preset'] == 'lh90' and res['dtype'] == 'bfloat16'
    assert set(res['cases']) == {'64', '256'}
    assert res['cases']['64'] == dict(
        grid=[8, 8], skipped_tile_fraction={'row order': 0.0, 'tile order': 0.0}
    )  # one tile, every head sees some key
    assert res['cases']['256']['skipped_tile_fraction']['tile order'] > 0
    assert 'seconds' not in res['cases']['256']  # timings are CUDA only
    table = format_table(dict(env=environment('cpu'), attn=res))
    assert '[attn] preset lh90, bfloat16' in table and '256 tokens 16x16: row order' in table


def test_format_table_shows_what_did_not_run():
    env = environment('cpu')
    assert env['device'] == 'cpu' and env['torch'] == torch.__version__ and env['threads'] >= 1
    table = format_table(
        dict(
            env=env,
            attn=dict(
                preset='lh90',
                dtype='bfloat16',
                cases={
                    '64': dict(
                        grid=[8, 8], skipped='no torch.nn.attention.flex_attention in this torch'
                    )
                },
            ),
            frame=dict(
                size=[64, 128],
                tokens=33,
                dense_bias_gib_all_layers=0.0,
                cases={'auto': dict(error='exit 1: boom')},
                skipped={'flex': 'flex is benchmarked on CUDA only'},
            ),
            segmenter=dict(
                size=[64, 128],
                device='cpu',
                target=1.3,
                results=[
                    dict(
                        config='configs/x.py',
                        size=[64, 128],
                        device='cpu',
                        threads=1,
                        cases=dict(
                            backbone=dict(
                                peak_bytes=100 * 2**20,
                                rise_bytes=10 * 2**20,
                                seconds=1.5,
                                types=dict(backbone='LookHereViT'),
                            ),
                            model=dict(error='timed out after 9 s'),
                            mmseg=dict(skipped='the config uses no lean drop-in'),
                        ),
                        ratios={},
                        target=1.3,
                        meets_target=None,
                    )
                ],
            ),
        )
    )
    assert '64 tokens 8x8: not run: no torch.nn.attention.flex_attention' in table
    assert 'auto          error: exit 1: boom' in table
    assert 'flex          not run: flex is benchmarked on CUDA only' in table
    assert '[segmenter] whole frame 64x128, batch 1, process peak RSS' in table
    assert '    backbone      100 MiB      10 MiB     1.50   1.000  LookHereViT' in table
    assert '    model    error: timed out after 9 s' in table
    assert '    mmseg    not run: the config uses no lean drop-in' in table
    assert 'backbone: yes' not in table and 'backbone: NO' not in table  # no model: no verdict
    assert '[bias]' not in table and '[vit]' not in table


# ----------------------------------------------------------------------------------------
# The model sections (OpenMMLab)
# ----------------------------------------------------------------------------------------
TINY = dict(patch_size=16, embed_dims=48, num_layers=2, num_heads=12, mlp_ratio=2)


def test_nobias_baseline_is_the_trunk_without_position():
    """The benchmark's baseline must really drop the bias: same weights as
    ``pos_encoding='none'`` give the same output, and it differs from LookHere's."""
    from lookhere_dense.models.backbones.lookhere_vit import LookHereViT
    from research.benchmark.models import build_vit

    plain = build_vit(TINY, 'lh180', pos_encoding='none')
    biased = build_vit(TINY, 'lh180')
    none = LookHereViT(**TINY, pos_encoding='none').eval()
    trunk = plain.state_dict()
    trunk.pop('_extra_state')  # the encodings differ on purpose
    none.load_state_dict(trunk, strict=False)
    # the same trunk by construction: equal initial weights, not copied ones
    lh_trunk = biased.state_dict()
    lh_trunk.pop('_extra_state')
    assert trunk.keys() == lh_trunk.keys()
    assert all(torch.equal(trunk[k], lh_trunk[k]) for k in trunk)
    x = torch.randn(1, 3, 64, 80)

    def attn_out(model):  # the first block's attention output (the trunk barely moves at init)
        got = []
        handle = model.blocks[0].attn.register_forward_hook(lambda m, i, o: got.append(o))
        with torch.no_grad():
            model(x)
        handle.remove()
        return got[0]

    out_plain, out_none, out_lh = attn_out(plain), attn_out(none), attn_out(biased)
    torch.testing.assert_close(out_plain, out_none, rtol=0, atol=1e-7)
    assert (out_plain - out_lh).abs().max() > 100 * out_plain.abs().max() * 1e-4


def test_frame_case_measures_a_forward_and_names_the_chosen_backend():
    from research.benchmark.models import frame_case

    base = dict(
        kind='frame',
        size=[32, 48],
        arch=TINY,
        preset='lh90',
        device='cpu',
        dtype='float32',
        repeats=2,
        block_size=0,
    )
    auto = frame_case(dict(base, backend='auto', spec='auto'))
    assert auto['chosen'] == 'sdpa' and auto['tokens'] == 2 * 3 + 1
    assert len(auto['times']) == 2 and auto['seconds'] > 0 and auto['peak'] > 0
    chunked = frame_case(dict(base, backend='chunked', spec='chunked:4', block_size=4))
    assert chunked['chosen'] == 'chunked'
    assert frame_case(dict(base, backend='nobias', spec='nobias'))['chosen'] is None


def test_bench_segmenter_refuses_bad_input_before_running_anything():
    from research.benchmark.segmenter import bench_segmenter

    with pytest.raises(ValueError, match='at least one config'):
        bench_segmenter([])
    with pytest.raises(ValueError, match="unknown cases \\['head'\\]"):
        bench_segmenter(['configs/segmenter_lookhere_cityscapes_whole.py'], cases=['head'])
    with pytest.raises(FileNotFoundError, match="config file 'no/such.py' not found"):
        bench_segmenter(['no/such.py'])


def test_bench_vit_times_every_model_against_the_nobias_trunk():
    from research.benchmark.models import bench_vit

    res = bench_vit(TINY, size=32, backends=['chunked'], with_mmseg=False, repeats=2)
    assert set(res['seconds']) == {'lookhere', 'lookhere-chunked', 'nobias'}
    assert res['ratio_vs_nobias']['nobias'] == 1.0
    assert res['auto_backend'] == 'sdpa' and res['tokens'] == 5
    assert res['cache']['dense']['misses'] == TINY['num_layers']


# ----------------------------------------------------------------------------------------
# The command line (a subprocess: tests never import tools/)
# ----------------------------------------------------------------------------------------
def _benchmark(
    repo_root: Path, *args: str, timeout: int, cwd: Optional[Path] = None
) -> subprocess.CompletedProcess:
    """``python tools/benchmark.py ARGS`` in a fresh process, output captured as text."""
    cmd = [sys.executable, str(repo_root / 'tools' / 'benchmark.py'), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_benchmark_quick_mode_runs(tmp_path: Path, repo_root: Path):
    out = tmp_path / 'bench.json'
    proc = _benchmark(repo_root, '--quick', '--json', str(out), timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res['bias']['baseline_matches_ours'] is True
    assert res['bias']['ours']['seconds'] > 0 and res['bias']['baseline']['seconds'] > 0
    assert set(res['vit']['seconds']) >= {'lookhere', 'nobias', 'mmseg_vit'}
    assert res['frame']['cases']['auto']['chosen'] == 'sdpa'
    assert 'error' not in res['frame']['cases']['nobias']
    assert '[frame]' in proc.stdout and '[bias]' in proc.stdout
    assert res['args']['sections'] == list(SECTION_GROUPS['all'])  # not compile, deploy
    # segmenter: the tiny Cityscapes config, backbone alone vs whole model, side by side
    seg = res['segmenter']
    assert seg['size'] == [64, 128] and seg['cases'] == ['backbone', 'model']
    (one,) = seg['results']
    assert one['config'].endswith('configs/segmenter_lookhere_vit-t_tiny-cityscapes.py')
    for case in ('backbone', 'model'):
        assert 'error' not in one['cases'][case], one['cases'][case]
        assert one['cases'][case]['peak_bytes'] >= one['cases'][case]['start_bytes'] > 0
    assert one['cases']['model']['types'] == dict(
        segmentor='LeanEncoderDecoder',
        backbone='LookHereViT',
        head='LeanSegmenterMaskTransformerHead',
    )
    assert one['ratios']['model_peak'] == pytest.approx(
        one['cases']['model']['peak_bytes'] / one['cases']['backbone']['peak_bytes']
    )
    assert one['meets_target'] is (one['ratios']['model_peak'] <= 1.3)
    assert '[segmenter] whole frame 64x128' in proc.stdout
    helped = _benchmark(repo_root, '-h', timeout=120)
    assert helped.returncode == 0 and '--device' in helped.stdout and '--quick' in helped.stdout
    assert '--section {all,attention,models}' in helped.stdout
    assert '--segmenter-configs' in helped.stdout


def test_benchmark_keeps_the_other_sections_when_one_fails(tmp_path: Path, repo_root: Path):
    """A section that raises (here: attn with an unknown preset) is recorded under
    ``failed_sections`` and named on stdout; the sections before it stay in the JSON."""
    out = tmp_path / 'bench.json'
    proc = _benchmark(
        repo_root,
        '--quick',
        '--sections',
        'bias',
        'attn',
        '--preset',
        'nope',
        '--json',
        str(out),
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res['bias']['baseline_matches_ours'] is True and 'attn' not in res
    assert "'nope'" in res['failed_sections']['attn']
    assert 'section attn FAILED: ' in proc.stdout


def test_benchmark_refuses_a_group_and_names_together(repo_root: Path):
    proc = _benchmark(repo_root, '--section', 'attention', '--sections', 'bias', timeout=120)
    assert proc.returncode == 2
    assert 'give --section (a group) or --sections (names), not both' in proc.stderr


def test_benchmark_names_a_missing_segmenter_config_before_running(repo_root: Path):
    proc = _benchmark(
        repo_root,
        '--sections',
        'bias',
        'segmenter',
        '--segmenter-configs',
        'configs/no_such_config.py',
        timeout=120,
    )
    assert proc.returncode == 1
    assert "--segmenter-configs: config file 'configs/no_such_config.py' not found" in proc.stderr
    assert '[bias]' not in proc.stdout  # nothing ran


def test_benchmark_compile_section_compares_compiled_and_eager(tmp_path: Path, repo_root: Path):
    out = tmp_path / 'compile.json'
    proc = _benchmark(
        repo_root,
        '--sections',
        'compile',
        '--quick',
        '--json',
        str(out),
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())['compile']
    assert res['backend'] == 'aot_eager' and set(res['cases']) == {'inference', 'train'}
    for mode, r in res['cases'].items():
        assert 'error' not in r, r
        assert r['first_call_seconds'] > 0 and r['ratio'] > 0, (mode, r)
        assert r['dynamo']['frames'] >= 1, r  # it compiled
    assert res['cases']['inference']['max_abs_diff'] < 1e-5
    assert '[compile]' in proc.stdout


def test_benchmark_deploy_section_runs_the_export_in_onnxruntime(tmp_path: Path, repo_root: Path):
    pytest.importorskip('onnxruntime')
    out = tmp_path / 'deploy.json'
    proc = _benchmark(
        repo_root,
        '--sections',
        'deploy',
        '--quick',
        '--deploy-dir',
        str(tmp_path / 'files'),
        '--json',
        str(out),
        timeout=900,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())['deploy']
    assert res['size'] == [64, 128] and set(res['stages']) == {'export', 'torch', 'onnxruntime'}
    for stage in res['stages'].values():
        assert 'error' not in stage, stage
    assert res['stages']['torch']['output_shape'] == [1, 19, 64, 128]
    assert res['max_abs_diff'] < 1e-4 and res['peak_ratio'] > 0 and res['time_ratio'] > 0
    assert res['stages']['export']['ratio_to_weights'] < 1.10
    assert '[deploy]' in proc.stdout


def test_deploy_memory_tool_traces_torch_and_each_session_variant(tmp_path: Path, repo_root: Path):
    """tools/deploy_memory.py: export, then torch and every onnxruntime session variant in
    its own process, each with the settings the session really has, its RSS samples, exact
    peak and the moment the runs start; the picture and the command are written."""
    pytest.importorskip('onnxruntime')
    from research.benchmark.deploy import SESSION_VARIANTS

    out, png = tmp_path / 'trace.json', tmp_path / 'trace.png'
    config = repo_root / 'configs' / 'segmenter_lookhere_vit-t_tiny-cityscapes.py'
    cmd = [sys.executable, str(repo_root / 'tools' / 'deploy_memory.py'), str(config)]
    cmd += ['--shape', '64', '128', '--interval', '0.005', '--json', str(out), '--png', str(png)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(out.read_text())
    assert list(res['runs']) == ['torch', *SESSION_VARIANTS]
    assert res['command'].startswith('python ') and 'deploy_memory.py' in res['command']
    for label, run in res['runs'].items():
        assert 'error' not in run, run
        assert run['stage'] == ('torch' if label == 'torch' else 'onnxruntime')
        if label != 'torch':  # what the session really got
            want = dict(mem_pattern=False, mem_reuse=False, cpu_arena=True)
            assert run['session_options'] == want | SESSION_VARIANTS[label], label
        t, mib = zip(*run['trace'])
        assert 0 < run['trace_loaded_at'] <= t[-1]
        # during the runs the samples never exceed the kernel's exact peak (reset when the
        # runs start; 1 MiB for rounding)
        during = [m for s, m in run['trace'] if s >= run['trace_loaded_at']]
        assert during and max(during) <= run['peak_over_before'] / 2**20 + 1, label
        assert run['output_shape'] == [1, 19, 64, 128]
    assert png.stat().st_size > 10_000
    assert '[deploy trace]' in proc.stdout


# ----------------------------------------------------------------------------------------
# peer: against timm's ViT-B
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize('preset', ['lh180', 'lh90', 'lh45'])
def test_flop_bound_counts_the_visible_pairs_of_the_dense_bias(preset):
    from research.benchmark.peer import flop_bound

    size, grid = (96, 160), (6, 10)
    got = flop_bound(preset, size, embed_dims=64)
    bias = build_grid_bias(PRESETS[preset], grid, depth=12, num_heads=12)
    visible = torch.stack([~torch.isneginf(bias.dense(layer)) for layer in range(12)])
    assert got['grid'] == list(grid) and got['tokens'] == 61
    assert got['visible'] == pytest.approx(visible.double().mean().item(), abs=1e-9)
    assert got['visible'] <= got['computed'] <= 1
    share = 61 / (61 + 6 * 64)
    assert got['attention_share'] == pytest.approx(share)
    assert got['bound'] == pytest.approx(1 - share + share * got['visible'])
    assert got['plan_bound'] == pytest.approx(1 - share + share * got['computed'])
    assert got['visible'] <= got['fused_computed'] <= 1
    assert got['fused_plan_bound'] == pytest.approx(1 - share + share * got['fused_computed'])


def test_flop_bound_matches_the_issue_figures_at_1024x2048():
    from research.benchmark.peer import flop_bound

    bounds = {p: flop_bound(p, (1024, 2048))['bound'] for p in ('lh180', 'lh90', 'lh45')}
    assert bounds == pytest.approx(dict(lh180=0.79, lh90=0.68, lh45=0.63), abs=0.006)


def test_peer_cases_run_timm_and_lookhere_in_process():
    pytest.importorskip('timm')
    from research.benchmark.peer import peer_case

    base = dict(kind='peer', size=[32, 48], device='cpu', dtype='float32', steps=2)
    timm_run = peer_case(dict(base, mode='frame', model='timm'))
    assert timm_run['backend'] is None and len(timm_run['times']) == 2
    assert timm_run['peak'] > 0 and timm_run['seconds'] > 0
    lh = peer_case(dict(base, mode='train', model='lh90:chunked'))
    assert lh['backend'] == 'chunked' and lh['seconds'] > 0
    assert peer_case(dict(base, mode='frame', model='nobias'))['backend'] is None


def test_peer_segmenter_case_puts_timm_in_the_backbone_place(repo_root: Path):
    pytest.importorskip('timm')
    from research.benchmark.peer import TimmTrunk, _segmenter, peer_case

    config = str(repo_root / 'configs' / 'segmenter_lookhere_vit-t_tiny-ade.py')
    case = dict(kind='peer', mode='segmenter', config=config, size=[32, 32], device='cpu')
    model, x, samples = _segmenter(dict(case, model='timm'))
    assert isinstance(model.backbone, TimmTrunk)
    assert model.backbone.vit.embed_dim == 192  # the config's ViT-T width
    (feat,) = model.backbone(x)
    assert feat.shape == (1, 192, 2, 2)
    # the ViT-T ADE20K config trains with drop path 0.1: off here, the same work every step
    vit_t = str(repo_root / 'configs' / 'segmenter_lookhere_vit-t_ade20k.py')
    ours, _, _ = _segmenter(dict(case, config=vit_t, model='lookhere'))
    assert not [m for m in ours.backbone.modules() if getattr(m, 'drop_prob', 0) > 0]
    run = peer_case(dict(case, model='lookhere', dtype='float32', steps=1))
    assert run['backend'] == 'sdpa' and run['seconds'] > 0


@needs_flex
def test_attn_cases_agree_and_train_steps_drop_their_gradients():
    from research.benchmark.attention import _cases, _train_step

    eng = LookHereAttentionEngine(PRESETS['lh90'], 1, 12, 'flex')
    grid = (8, 16)
    q, k, v = (torch.randn(1, 12, 128, 16) for _ in range(3))
    extra = (
        eng.grid_bias(grid, q.device),
        eng.block_mask(0, grid, False, q.device),
        eng.score_mod(0, grid, False, q.device),
        eng.flex_order(grid, False, q.device),
        eng.dense_bias(0, grid, False, q.device, q.dtype)[None],
    )
    with torch.no_grad():
        out = {name: fn() for name, fn in _cases(q, k, v, *extra).items()}
    torch.testing.assert_close(out['flex'], out['sdpa_dense_bias'], atol=2e-5, rtol=0)
    assert (out['sdpa_nobias'] - out['sdpa_dense_bias']).abs().max() > 1e-2
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grads = []
    for t in leaves:
        t.register_hook(grads.append)
    fn = _cases(*leaves, *extra)['sdpa_dense_bias']
    _train_step(fn, leaves, torch.randn_like(q))
    assert len(grads) == 3 and all(g.abs().sum() > 0 for g in grads)  # backward ran
    assert all(t.grad is None for t in leaves)  # and the next step starts clean


def test_attention_layer_times_lookhere_backends_against_dense_sdpa():
    from research.benchmark.peer import attention_layer

    res = attention_layer(['lh90', 'lh45'], (64, 128), rounds=2, num_heads=12, head_dim=8)
    assert res['tokens'] == 4 * 8 + 1 and res['grid'] == [4, 8]
    names = [r['case'] for r in res['rows']]
    assert names == [
        'dense sdpa, no bias',
        'lh90 fused',
        'lh90 tiled',
        'lh90 chunked',
        'lh45 fused',
        'lh45 tiled',
        'lh45 chunked',
    ]
    assert res['rows'][0]['ratio'] == 1.0
    assert all(r['seconds'] > 0 for r in res['rows'])
    assert res['dtype'] == 'float32'


def test_attention_layer_in_bfloat16_hands_the_backends_bfloat16(monkeypatch):
    """The per-layer ratio under ``--peer-autocast bfloat16`` is measured on bf16
    ``q, k, v`` (what the model's attention gets under autocast), SDPA's and ours."""
    import torch.nn.functional as F

    from research.benchmark.peer import attention_layer

    seen = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F,
        'scaled_dot_product_attention',
        lambda q, *a, **k: seen.append(q.dtype) or real(q, *a, **k),
    )
    res = attention_layer(['lh90'], (64, 64), ('fused',), 1, head_dim=16, dtype=torch.bfloat16)
    assert res['dtype'] == 'bfloat16' and seen and set(seen) == {torch.bfloat16}


def test_attention_layer_train_times_forward_and_backward(monkeypatch):
    from lookhere_dense.lookhere.attention.tiled import _TiledAttention
    from research.benchmark.peer import attention_layer

    backwards = []
    real = _TiledAttention.backward
    monkeypatch.setattr(
        _TiledAttention,
        'backward',
        staticmethod(lambda ctx, dout: backwards.append(1) or real(ctx, dout)),
    )
    res = attention_layer(['lh90'], (64, 64), ('chunked', 'tiled'), 2, head_dim=8, train=True)
    assert res['train'] and res['tokens'] == 17
    assert [r['case'] for r in res['rows']] == [
        'dense sdpa, no bias',
        'lh90 chunked',
        'lh90 tiled',
    ]
    assert len(backwards) == 3  # the warm-up call and one per round
    assert attention_layer(['lh90'], (64, 64), ('tiled',), 1, head_dim=8)['train'] is False


def test_peer_frame_steps_time_the_steady_state(monkeypatch):
    """``frame_steps`` (``--peer-frame-steps``): 0 times each process's first frame; N > 0
    one untimed frame, then N timed ones (issue 31's protocol), and the table says which."""
    from research.benchmark import peer
    from research.benchmark.report import format_peer

    seen = []

    def child(case, timeout):
        seen.append(case)
        steps = case['steps']
        # the peer's steps 1.0 s and 3.0 s, the others' 1.0 s and 1.2 s: medians 2.0 / 1.1 s
        times = [1.0, 3.0][:steps] if case['model'] == peer.PEER else [1.0, 1.2][:steps]
        return dict(case, seconds=sum(times) / steps, times=times, peak=2**30, backend=None)

    monkeypatch.setattr(peer, 'run_child', child)
    common = dict(presets=['lh90'], parts=['frame'], registered_presets=(), rounds=1)
    res = peer.bench_peer(frame_steps=2, **common)
    assert seen and all(c['warmup'] == 1 and c['steps'] == 2 for c in seen)
    text = '\n'.join(format_peer(res))
    assert '(median of 2 frames after 1 untimed)' in text and 'x timm, best step' in text
    lh90 = next(r for r in res['frame']['rows'] if r['model'] == 'lh90')
    assert lh90['time_ratio'] == pytest.approx(0.55) and lh90['best_ratio'] == pytest.approx(1.0)
    seen.clear()
    res = peer.bench_peer(**common)
    assert seen and all('warmup' not in c and c['steps'] == 1 for c in seen)
    text = '\n'.join(format_peer(res))
    assert '(the first frame of each process)' in text and 'best step' not in text
    with pytest.raises(ValueError, match='frame_steps must be >= 0'):
        peer.bench_peer(frame_steps=-1, **common)


def test_peer_layer_parts_follow_the_weights_dtype_and_the_train_size(monkeypatch):
    """``--dtype bfloat16`` without ``--peer-autocast`` ran the one-layer parts in float32,
    and ``train_layer`` timed 512 / 640 px whatever ``--vit-size`` (``--quick``) said."""
    from research.benchmark import peer

    calls = []

    def layer(presets, size, backends=(), rounds=3, train=False, dtype=torch.float32, **kw):
        calls.append((tuple(size), train, dtype))
        return dict(tokens=1, rows=[])

    monkeypatch.setattr(peer, 'attention_layer', layer)
    common = dict(presets=['lh90'], parts=['layer', 'train_layer'], registered_presets=())
    peer.bench_peer(frame_size=(64, 128), train_size=64, dtype='bfloat16', **common)
    assert calls == [
        ((64, 128), False, torch.bfloat16),
        ((64, 64), True, torch.bfloat16),
        ((80, 80), True, torch.bfloat16),
    ]
    calls.clear()
    peer.bench_peer(frame_size=(64, 128), autocast='bfloat16', **common)
    assert [c[0] for c in calls] == [(64, 128), (512, 512), (640, 640)]
    assert {c[2] for c in calls} == {torch.bfloat16}
    calls.clear()
    peer.bench_peer(frame_size=(64, 128), train_layer_sizes=(96,), **common)
    assert calls == [((64, 128), False, torch.float32), ((96, 96), True, torch.float32)]


def test_bench_peer_refuses_unknown_parts():
    from research.benchmark.peer import bench_peer

    with pytest.raises(ValueError, match="unknown peer parts \\['frames'\\]"):
        bench_peer(parts=['frames'])


def test_plot_benchmark_tool_draws_the_peer_results(tmp_path: Path, repo_root: Path):
    """tools/plot_benchmark.py: a picture of the peer results (layer, frames, train),
    goals and bounds; files without peer results are refused by name."""
    from PIL import Image

    from research.benchmark.peer import flop_bound

    def rows(models, ratios, backend=None):
        return [
            dict(model=m, backend=backend if m != 'timm' else None, seconds=r, time_ratio=r)
            for m, r in zip(models, ratios)
        ]

    size = [96, 160]
    peer = dict(
        bounds=[flop_bound(p, size, embed_dims=64) for p in ('lh90', 'lh45')],
        layer=dict(
            tokens=61,
            rows=[
                dict(case='dense sdpa, no bias', ratio=1.0),
                dict(case='lh90 fused', ratio=0.5),
                dict(case='lh90 tiled', ratio=0.7),
            ],
        ),
        frame=dict(
            rows=rows(['timm', 'lh90', 'lh45'], [1.0, 0.7, 0.69], 'fused'),
            runs={'timm': [dict(size=size)]},
        ),
    )
    first = tmp_path / 'peer.json'
    first.write_text(json.dumps(dict(peer=peer)))
    png = tmp_path / 'peer.png'
    tool = str(repo_root / 'tools' / 'plot_benchmark.py')
    proc = subprocess.run(
        [sys.executable, tool, str(first), '--png', str(png)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert Image.open(png).size[0] > 1.5 * Image.open(png).size[1]  # two panels side by side
    empty = tmp_path / 'empty.json'
    empty.write_text(json.dumps(dict(env={})))
    proc = subprocess.run(
        [sys.executable, tool, str(empty), '--png', str(png)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        proc.returncode != 0 and 'no peer results' in proc.stderr and 'empty.json' in proc.stderr
    )


def test_peer_registered_case_builds_the_config_backbone_as_users_do():
    from research.benchmark.peer import _build, peer_case, registered_backbone_cfg

    narrow = dict(embed_dims=72, num_layers=2, num_heads=6)
    cfg = registered_backbone_cfg('lh90', **narrow)
    # the ADE20K Segmenter's backbone dict, as MODELS.build gets it from a user's config
    assert cfg['type'] == 'LookHereViT' and cfg['drop_path_rate'] == 0.1
    assert cfg['img_size'] == (512, 512) and cfg['preset'] == 'lh90'
    case = dict(kind='peer', size=[32, 48], device='cpu', dtype='float32', steps=1)
    case.update(model='registered:lh90:chunked', arch=narrow)
    model = _build(case)
    assert type(model).__name__ == 'LookHereViT' and model.init_cfg is None
    assert model.pos_enc.engine.backend == 'chunked' and len(model.blocks) == 2
    assert max(getattr(m, 'drop_prob', 0) for m in model.modules()) > 0  # as configured
    run = peer_case(dict(case, mode='train'))
    assert run['backend'] == 'chunked' and run['seconds'] > 0
    assert run['start'] > 0 and run['rise'] >= 0


def test_peer_with_openmmlab_imports_is_the_registered_backbones_second_baseline():
    """``timm+openmmlab`` builds the same timm ViT in a process that imported what the
    registered case imports (mmseg's model modules: their memory is not the backbone's);
    the registered rows get their ratios against it beside those against the bare peer."""
    import research.benchmark.peer as peer

    case = dict(kind='peer', size=[32, 48], device='cpu', dtype='float32', steps=1)
    case.update(model=peer.PEER_OPENMMLAB, arch=dict(embed_dims=48, num_layers=1, num_heads=6))
    model = peer._build(case)
    assert type(model).__module__.startswith('timm.') and len(model.blocks) == 1
    assert 'mmseg.models' in sys.modules

    def run(seconds, peak):
        return dict(seconds=seconds, peak=peak, start=1, rise=1)

    results = {
        peer.PEER: [run(2.0, 100), run(2.2, 100)],
        peer.PEER_OPENMMLAB: [run(2.0, 120), run(2.0, 130)],
        'registered:lh180': [run(1.0, 132), run(1.1, 130)],
        'lh180': [run(1.0, 90), run(1.0, 90)],
    }
    rows = {r['model']: r for r in peer._rows(results)}
    reg = rows['registered:lh180']
    assert reg['peak_ratio'] == pytest.approx(1.31) and reg['time_ratio'] == pytest.approx(0.5)
    assert reg['peak_ratio_same_imports'] == pytest.approx((1.1 + 1.0) / 2)
    assert reg['time_ratio_same_imports'] == pytest.approx((0.5 + 0.55) / 2)
    assert 'peak_ratio_same_imports' not in rows['lh180']
    del results[peer.PEER_OPENMMLAB]
    assert 'peak_ratio_same_imports' not in peer._rows(results)[1]


def test_peer_autocast_cases_run_the_linear_layers_in_bfloat16(monkeypatch):
    import research.benchmark.peer as peer

    seen = []
    build = peer._build

    def spy(case):
        model = build(case)
        model.blocks[0].attn.qkv.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        return model

    monkeypatch.setattr(peer, '_build', spy)
    case = dict(kind='peer', mode='frame', size=[32, 48], device='cpu', dtype='float32')
    case.update(model='lh90', arch=dict(embed_dims=48, num_layers=1, num_heads=6), steps=1)
    peer.peer_case(case)
    peer.peer_case(dict(case, autocast='bfloat16'))
    assert seen == [torch.float32, torch.bfloat16]


def test_peer_plain_mlp_cases_run_the_mlp_plain_path_and_restore_the_environment(monkeypatch):
    """``'<preset>+plain-mlp'`` runs with ``LOOKHERE_FUSED_MLP=0`` (its MLP never takes the
    fused path of bf16 inference, which the plain case does) and leaves the variable as it
    was."""
    import lookhere_dense.lookhere.layers as layers
    import research.benchmark.peer as peer
    from lookhere_dense.lookhere.fused_mlp import fused_mlp_available

    if not fused_mlp_available():
        pytest.skip('no fused MLP on this CPU: both cases take the plain path')
    fused = []
    run = layers.fused_mlp
    monkeypatch.setattr(layers, 'fused_mlp', lambda *a: fused.append(1) or run(*a))
    monkeypatch.delenv('LOOKHERE_FUSED_MLP', raising=False)
    case = dict(kind='peer', mode='frame', size=[32, 48], device='cpu', dtype='float32')
    case.update(arch=dict(embed_dims=48, num_layers=1, num_heads=6), autocast='bfloat16')
    peer.peer_case(dict(case, model='lh90'))
    assert fused  # the default case: the fused MLP
    fused.clear()
    peer.peer_case(dict(case, model='lh90' + peer.PLAIN_MLP))
    assert not fused
    assert 'LOOKHERE_FUSED_MLP' not in os.environ
