"""``tools/benchmark.py`` and ``tools/plot_benchmark.py``: arguments refused when parsed,
the ``deploy`` section after a failed export, failed peer rows in the plot, and the
settings the results record (commit, tokens, repeats). All fast: no model is exported or
timed at full size."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures('one_torch_thread')  # tiny tensors: see conftest


def _tool(name: str) -> ModuleType:
    """``tools/<name>.py`` imported as a module (its ``parse_args`` / ``main``)."""
    spec = importlib.util.spec_from_file_location(f'{name}_tool', REPO / 'tools' / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def benchmark_tool() -> ModuleType:
    return _tool('benchmark')


# ----------------------------------------------------------------------------------------
# Arguments: refused when parsed, before any section runs
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'argv, message',
    [
        (['--repeats', '0'], '--repeats: must be >= 1'),
        (['--frame-repeats', '0'], '--frame-repeats: must be >= 1'),
        (['--frame-size', '0', '0'], '--frame-size: must be at least one 16 px patch'),
        (['--frame-size', '1024', '8'], '--frame-size: must be at least one 16 px patch'),
        (['--vit-size', '8'], '--vit-size: must be at least one 16 px patch'),
        (['--grid', '0'], '--grid: must be >= 1'),
        (['--threads', '-1'], '--threads: must be >= 1'),
        (['--threads', 'two'], "--threads: expected a whole number, got 'two'"),
        (['--frame-backends', 'bogus'], "--frame-backends: invalid frame case 'bogus'"),
        (['--frame-backends', 'sdpa:64'], "only 'chunked' takes ':<block rows>'"),
        (['--frame-backends', 'chunked:x'], "invalid frame case 'chunked:x'"),
        (['--vit-backends', 'bogus'], "--vit-backends: invalid choice: 'bogus'"),
        (['--peer-frame-steps', '-1'], '--peer-frame-steps: must be >= 0'),
        (['--peer-train-steps', '0'], '--peer-train-steps: must be >= 1'),
        (['--peer-layer-rounds', '-1'], '--peer-layer-rounds: must be >= 0'),
        (['--peer-big-frame', '8', '8'], '--peer-big-frame: must be at least one 16 px'),
        (['--attn-tokens', '0'], '--attn-tokens: must be >= 1'),
        (['--block-size', '-1'], '--block-size: must be >= 0'),
        (['--num-heads', '0'], '--num-heads: must be >= 1'),
        (['--embed-dims', '100'], '--embed-dims 100 is not divisible by --num-heads 12'),
        (['--child-timeout', '0'], '--child-timeout: must be > 0'),
    ],
)
def test_benchmark_refuses_bad_arguments_when_parsing(benchmark_tool, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        benchmark_tool.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_benchmark_backend_choices_come_from_the_package(benchmark_tool, capsys):
    """Every backend of the package is accepted (and nothing else), checked when parsed."""
    from lookhere_dense.lookhere import BACKENDS

    for flag in ('--frame-backends', '--vit-backends'):
        with pytest.raises(SystemExit):
            benchmark_tool.parse_args([flag, 'chunked', 'bogus'])
        assert 'bogus' in capsys.readouterr().err
    args = benchmark_tool.parse_args(
        ['--frame-backends', 'nobias', 'auto', 'chunked:256', 'chunked:0', *BACKENDS[1:]]
        + ['--vit-backends', *BACKENDS[1:]]
        + ['--peer-frame-steps', '0', '--peer-layer-rounds', '0', '--block-size', '0']
    )
    assert args.frame_backends[:4] == ['nobias', 'auto', 'chunked:256', 'chunked:0']
    assert args.vit_backends == list(BACKENDS[1:])
    assert benchmark_tool.parse_args(['--vit-backends']).vit_backends == []  # only auto
    quick = benchmark_tool.parse_args(['--quick', '--frame-size', '16', '16'])
    assert quick.frame_size == [16, 16] and quick.repeats == 2


def test_bench_peer_refuses_negative_frame_steps_before_any_part_runs(monkeypatch):
    """The check comes first: the ``layer`` part (minutes in process) does not run."""
    from research.benchmark import peer

    def ran(*args, **kwargs):
        raise AssertionError('a part ran before frame_steps was checked')

    monkeypatch.setattr(peer, 'attention_layer', ran)
    monkeypatch.setattr(peer, 'run_child', ran)
    with pytest.raises(ValueError, match='frame_steps must be >= 0, got -1'):
        peer.bench_peer(
            presets=['lh90'],
            frame_size=(64, 64),
            parts=['layer', 'train_layer', 'frame'],
            registered_presets=(),
            frame_steps=-1,
            layer_rounds=1,
            device='cpu',
        )


# ----------------------------------------------------------------------------------------
# deploy: a failed export runs nothing on a stale file
# ----------------------------------------------------------------------------------------
def _fake_stages(monkeypatch, export_error=None):
    """``run_child`` of the deploy section replaced: the export fails with
    ``export_error`` (or succeeds and writes the file); torch / onnxruntime write their
    output. Returns the list of stages run."""
    from research.benchmark import deploy

    ran = []

    def child(case, timeout):
        ran.append(case['stage'])
        if case['stage'] == 'export':
            if export_error:
                return dict(case, error=export_error)
            Path(case['out']).write_bytes(b'onnx')
            return dict(case, total_bytes=4)
        np.save(case['out'] + f'.{case["stage"]}.npy', np.zeros((1, 2), 'float32'))
        peak = 100 if case['stage'] == 'torch' else 150
        return dict(case, seconds=1.0, peak_over_before=peak, output_shape=[1, 2])

    monkeypatch.setattr(deploy, 'run_child', child)
    return ran


def test_deploy_skips_the_runs_and_ratios_when_the_export_fails(tmp_path, monkeypatch):
    from research.benchmark.deploy import bench_deploy, export_path
    from research.benchmark.report import format_table

    ran = _fake_stages(monkeypatch, export_error='RuntimeError: export broke')
    config = 'configs/segmenter_lookhere_vit-t_tiny-cityscapes.py'
    out = export_path(config, (64, 128), str(tmp_path))
    # an earlier run's files: the export, its weights and the stages' outputs
    Path(out).write_bytes(b'stale')
    Path(out + '.data').write_bytes(b'stale')
    for stage in ('torch', 'onnxruntime'):
        np.save(out + f'.{stage}.npy', np.full((1, 2), 7 if stage == 'torch' else 0, 'float32'))
    res = bench_deploy(config, (64, 128), str(tmp_path), repeats=1)
    assert ran == ['export']  # neither torch nor onnxruntime ran
    assert not Path(out).exists() and not Path(out + '.data').exists()
    assert not Path(out + '.onnxruntime.npy').exists()
    assert 'export broke' in res['error']
    for key in ('max_abs_diff', 'peak_ratio', 'time_ratio'):
        assert key not in res
    assert res['stages']['torch']['skipped'] == res['stages']['onnxruntime']['skipped']
    text = format_table(dict(env=dict(device_name='cpu', torch='x', threads=1), deploy=res))
    assert 'export: error: RuntimeError: export broke' in text
    assert 'onnxruntime: not run: the export failed' in text and 'onnxruntime / torch' not in text
    # a good export: every stage runs, the ratios are of this run's outputs
    ran = _fake_stages(monkeypatch)
    res = bench_deploy(config, (64, 128), str(tmp_path), repeats=1)
    assert ran == ['export', 'torch', 'onnxruntime'] and 'error' not in res
    assert res['max_abs_diff'] == 0.0 and res['peak_ratio'] == 1.5 and res['time_ratio'] == 1.0


# ----------------------------------------------------------------------------------------
# plot_benchmark: a failed peer row is left out and named
# ----------------------------------------------------------------------------------------
def test_plot_benchmark_leaves_out_and_names_failed_peer_rows(tmp_path, capsys):
    size = [64, 96]
    rows = [
        dict(model='timm', backend=None, seconds=1.0, time_ratio=1.0, rounds=1),
        dict(model='lh90', backend='fused', seconds=0.7, time_ratio=0.7, rounds=1),
        dict(model='lh45', error='RuntimeError: out of memory'),
    ]
    peer = dict(frame=dict(rows=rows, runs={'timm': [dict(size=size)]}))
    path = tmp_path / 'peer.json'
    path.write_text(json.dumps(dict(peer=peer)))
    png = tmp_path / 'peer.png'
    _tool('plot_benchmark').main([str(path), '--png', str(png)])
    assert png.stat().st_size > 1000
    err = capsys.readouterr().err
    assert 'lh45' in err and 'out of memory' in err and 'lh90' not in err

    from research.benchmark.peer_plot import _panels

    failed = []
    (panel,) = _panels([peer], failed)
    assert [b[0] for b in panel['bars']] == ['lh90 (fused)']
    assert 'failed, not drawn: lh45' in panel['title']
    assert failed == ['frame: lh45: RuntimeError: out of memory']


def test_plot_benchmark_refuses_when_every_peer_row_failed(tmp_path, capsys):
    rows = [dict(model='timm', error='boom'), dict(model='lh90', error='boom')]
    peer = dict(frame=dict(rows=rows, runs={'timm': [dict(size=[64, 64], error='boom')]}))
    path = tmp_path / 'peer.json'
    path.write_text(json.dumps(dict(peer=peer)))
    with pytest.raises(SystemExit, match='no peer results to draw.*every row failed'):
        _tool('plot_benchmark').main([str(path), '--png', str(tmp_path / 'p.png')])


# ----------------------------------------------------------------------------------------
# Recorded settings
# ----------------------------------------------------------------------------------------
def test_environment_records_the_commit_with_a_dirty_mark(monkeypatch):
    import subprocess

    from research.benchmark import report

    calls = []

    real_run = subprocess.run

    def run(cmd, *args, **kwargs):
        if cmd[0] != 'git':
            return real_run(cmd, *args, **kwargs)
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout='abc1234-dirty\n', stderr='')

    monkeypatch.setattr(subprocess, 'run', run)
    env = report.environment('cpu')
    assert env['commit'] == 'abc1234-dirty'
    (cmd,) = calls
    assert cmd[-3:] == ['describe', '--always', '--dirty']
    monkeypatch.undo()
    assert report.environment('cpu')['commit']  # the real checkout's


def test_bench_vit_reports_the_tokens_the_trunk_runs(monkeypatch):
    """72 px: the trunk pads to 5x5 patches, 25 + CLS = 26 tokens (not (72 // 16)**2 + 1);
    the sequence lengths the blocks' norms really see are recorded to compare."""
    import torch

    from research.benchmark import models

    seen = set()
    build = models.build_vit

    def build_and_watch(*args, **kwargs):
        model = build(*args, **kwargs)
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.register_forward_pre_hook(lambda _, inp: seen.add(inp[0].shape[1]))
        return model

    monkeypatch.setattr(models, 'build_vit', build_and_watch)
    arch = models.vit_arch(embed_dims=48, num_layers=1, num_heads=12)
    res = models.bench_vit(arch, 72, backends=(), with_mmseg=False, repeats=1)
    assert seen == {26}
    assert res['tokens'] == math.ceil(72 / 16) ** 2 + 1 == 26


def test_attn_section_records_the_repeats_it_used():
    from research.benchmark.attention import bench_attention
    from research.benchmark.report import format_table

    res = bench_attention('lh90', [64], 12, 96, 'cpu', 'float32', repeats=5)
    assert 'repeats' in res and res['repeats'] is None  # CPU: nothing timed
    env = dict(device_name='gpu', torch='x', threads=1)
    res = dict(res, repeats=10, cases={})  # what CUDA records for --repeats 5: max(5, 10)
    assert '; 10 interleaved rounds' in format_table(dict(env=env, attn=res))


if __name__ == '__main__':
    sys.exit(pytest.main([__file__, '-q']))
