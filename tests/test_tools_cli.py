"""The command lines of ``tools/``: each tool answers ``--help``, and cheap real invocations
go through its argument parsing to the clear message (or the output) a user sees. What
the tools do is tested through the package functions they call (``test_tools_seg.py``,
``test_study.py``, ``test_evaluation.py``, ...); no test imports a tool script."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch
from tiny_seg import SHRINK, env, run_tools, write_checkpoint, write_study_reports

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = (
    'train',
    'test',
    'infer',
    'extrapolate',
    'extrapolation_study',
    'demo',
    'swap_backbone',
    'plot_heads',
    'convert_checkpoint',
    'robustness',
    'deploy_memory',
)


ADE_CFG = os.path.join(REPO, 'configs', 'segmenter_lookhere_vit-t_tiny-ade.py')
DEIT_UPERNET = 'mmseg::vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py'


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """Every command line below, run once; ``runs[key] = dict(rc, stdout, stderr, tmp)``."""
    tmp = tmp_path_factory.mktemp('cli')
    no_test_labels = tmp / 'no_test_labels.py'  # a label-less test split
    no_test_labels.write_text(
        f'_base_ = [{os.path.join(REPO, "configs", "study", "relational_vit_tiny.py")!r}]\n'
        "test_dataloader = dict(dataset=dict(pipeline=[dict(type='LoadImageFromFile'), "
        "dict(type='PackSegInputs')]))\n"
    )
    (tmp / 'not_a_checkpoint.pth').write_text('x')
    ckpt = write_checkpoint(str(tmp / 'tiny.pth'))  # untrained, for the infer runs
    image = str(tmp / 'image.png')  # 64x80 px, kept so by --native
    cv2.imwrite(image, np.random.default_rng(0).integers(0, 255, (64, 80, 3), np.uint8))
    infer = [ADE_CFG, ckpt, image, '--native', '--cfg-options', *SHRINK, '--out-dir']
    calls = {f'help:{tool}': (tool, ['--help']) for tool in TOOLS}
    calls.update(
        {
            'train:missing config': ('train', [str(tmp / 'nope.py')]),
            'test:missing checkpoint': ('test', [ADE_CFG, str(tmp / 'none.pth')]),
            'extrapolate:bad test': ('extrapolate', [ADE_CFG, 'x.pth', '--tests', 'whole:2x']),
            'infer:missing input': ('infer', [ADE_CFG, 'x.pth', str(tmp / 'missing')]),
            'infer:bad size': ('infer', [ADE_CFG, 'x.pth', str(tmp), '--size', '10y20']),
            'infer:cuda without a GPU': (
                'infer',
                [ADE_CFG, 'x.pth', str(tmp), '--device', 'cuda'],
            ),
            'extrapolate:cuda without a GPU': (
                'extrapolate',
                [ADE_CFG, 'x.pth', '--device', 'cuda'],
            ),
            'infer:crop below a patch': (
                'infer',
                [*infer, str(tmp / 'o1'), '--slide', '--crop', '8x8', '--stride', '8x8'],
            ),
            'test:amp-dtype without amp': (
                'test',
                [ADE_CFG, 'x.pth', '--amp-dtype', 'float16'],
            ),
            'infer:float16 on cpu': (
                'infer',
                [ADE_CFG, 'x.pth', str(tmp), '--amp', '--amp-dtype', 'float16', '--device', 'cpu'],
            ),
            'deploy_memory:bad interval': ('deploy_memory', ['--interval', '0', '--png', 'm.png']),
            'deploy_memory:no output': ('deploy_memory', []),
            'deploy_memory:missing onnx': (
                'deploy_memory',
                ['--onnx', str(tmp / 'none.onnx'), '--json', str(tmp / 'm.json')],
            ),
            'plot_heads': (
                'plot_heads',
                [
                    '--preset',
                    'lh90',
                    '--grid',
                    '4',
                    '4',
                    '--depth',
                    '2',
                    '--out',
                    str(tmp / 'heads.png'),
                ],
            ),
            'demo:data only': (
                'demo',
                [
                    '--data-only',
                    '--datasets',
                    'cityscapes',
                    '--num-train',
                    '1',
                    '--num-val',
                    '1',
                    '--data-root',
                    str(tmp / 'data'),
                ],
            ),
            'study:merge': (
                'extrapolation_study',
                [
                    '--merge',
                    *write_study_reports(tmp, [(0, 40.0), (1, 60.0)]),
                    '--out-dir',
                    str(tmp / 'm'),
                    '--name',
                    'merged',
                ],
            ),
            'swap:not python': ('swap_backbone', [DEIT_UPERNET, str(tmp / 'x.txt')]),
            'robustness:bad eps': ('robustness', [ADE_CFG, 'x.pth', '--eps', '4', '0']),
            'robustness:missing checkpoint': ('robustness', [ADE_CFG, str(tmp / 'none.pth')]),
            'robustness:no labels': (
                'robustness',
                [str(no_test_labels), str(tmp / 'not_a_checkpoint.pth'), '--split', 'test'],
            ),
        }
    )
    results = run_tools(list(calls.values()))
    return {key: dict(res, tmp=tmp) for key, res in zip(calls, results)}


@pytest.mark.parametrize('tool', TOOLS)
def test_every_tool_answers_help(runs, tool):
    res = runs[f'help:{tool}']
    assert res['rc'] == 0, res['stderr']
    assert res['stdout'].startswith('usage: ') and f'{tool}.py' in res['stdout']


@pytest.mark.parametrize('tool', ['train', 'test', 'infer', 'extrapolate', 'robustness'])
def test_model_running_tools_take_amp(runs, tool):
    help_text = runs[f'help:{tool}']['stdout']
    assert '--amp ' in help_text and '--amp-dtype {bfloat16,float16}' in help_text


@pytest.mark.parametrize(
    'tool', sorted(f[:-3] for f in os.listdir(os.path.join(REPO, 'tools')) if f.endswith('.py'))
)
def test_tool_docstring_examples_keep_their_line_breaks(tool):
    """A single ``\\`` at a line end inside a (non-raw) docstring joins the lines of an
    example command; the examples write ``\\\\``. Every line of the source must be a line
    of the docstring."""
    import ast

    with open(os.path.join(REPO, 'tools', f'{tool}.py')) as f:
        node = ast.parse(f.read()).body[0]
    assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    lines = node.value.value.split('\n')
    assert len(lines) == node.end_lineno - node.lineno + 1, [
        ln for ln in lines if '  --' in ln or '\\  ' in ln
    ]


def _error_line(res: dict) -> str:
    assert res['rc'] == 2, res
    assert 'Traceback' not in res['stderr']
    lines = [ln for ln in res['stderr'].splitlines() if ln.startswith('error: ')]
    assert len(lines) == 1, res['stderr']
    return lines[0]


def test_a_tool_run_as_a_script_reports_a_user_error_without_a_traceback(tmp_path):
    """The real ``python tools/train.py ...`` process (the others run in one interpreter)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get('PYTHONPATH', ''))
    res = subprocess.run(
        [sys.executable, 'tools/train.py', str(tmp_path / 'nope.py')],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2 and 'Traceback' not in res.stderr
    assert f'error: config file {str(tmp_path / "nope.py")!r} not found' in res.stderr


def test_a_misspelt_config_path_names_the_nearest_config():
    from lookhere_dense.apis.cli import resolve_config_path

    with pytest.raises(FileNotFoundError) as exc:
        resolve_config_path('configs/segmenter_lookhere_vit-t_tiny_ade.py')
    assert str(exc.value) == (
        "config file 'configs/segmenter_lookhere_vit-t_tiny_ade.py' not found; did you mean "
        "'configs/segmenter_lookhere_vit-t_tiny-ade.py'?"
    )


def test_train_and_test_name_a_missing_config_or_checkpoint(runs):
    tmp = runs['train:missing config']['tmp']
    err = _error_line(runs['train:missing config'])
    assert err == f'error: config file {str(tmp / "nope.py")!r} not found'
    err = _error_line(runs['test:missing checkpoint'])
    assert err == f'error: checkpoint {str(tmp / "none.pth")!r} not found'


def test_extrapolate_and_infer_say_what_is_wrong(runs):
    err = _error_line(runs['extrapolate:bad test'])
    assert "bad test 'whole:2x': write MODE@SIZE" in err
    err = _error_line(runs['infer:missing input'])
    assert 'is neither an image file nor a folder' in err
    res = runs['infer:bad size']
    assert res['rc'] == 2 and "expected HxW such as 1024x2048, got '10y20'" in res['stderr']
    res = runs['infer:float16 on cpu']  # --amp: bfloat16 on CPU, float16 on CUDA only
    assert res['rc'] == 2 and '--amp-dtype=float16 on CPU' in res['stderr']
    res = runs['test:amp-dtype without amp']
    assert res['rc'] == 2 and '--amp-dtype float16 needs --amp' in res['stderr']


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks a machine without CUDA')
def test_a_cuda_device_without_cuda_is_named_before_any_work(runs):
    # not torch's 'Found no NVIDIA driver' traceback from the model's .to(device)
    for key in ('infer:cuda without a GPU', 'extrapolate:cuda without a GPU'):
        err = _error_line(runs[key])
        assert err.startswith('error: --device cuda: no CUDA device here'), err


def test_check_device_names_a_device_this_machine_lacks(monkeypatch):
    from lookhere_dense.apis.cli import check_device
    from lookhere_dense.errors import ConfigError

    assert check_device('cpu') == 'cpu'
    assert check_device(None) == ('cuda' if torch.cuda.is_available() else 'cpu')
    with pytest.raises(
        ConfigError, match=r'--device gpu: not a device name \(expected cpu or cuda'
    ):
        check_device('gpu')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    with pytest.raises(ConfigError, match='--device cuda:0: no CUDA device here'):
        check_device('cuda:0')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    assert check_device('cuda') == 'cuda' and check_device('cuda:1') == 'cuda:1'
    with pytest.raises(
        ConfigError,
        match=r'--device cuda:2: this machine has 2 CUDA device\(s\), cuda:0 to cuda:1',
    ):
        check_device('cuda:2')


def test_infer_refuses_a_slide_crop_below_one_patch(runs):
    # not the backbone's 'image of 8x8 px is smaller than one 16x16 patch' traceback
    err = _error_line(runs['infer:crop below a patch'])
    assert err.startswith('error: --crop 8x8 is smaller than one 16x16 patch of the backbone')
    assert 'at least 16x16' in err
    assert not (runs['infer:crop below a patch']['tmp'] / 'o1' / 'image.png').exists()


def test_infer_logs_the_backend_at_the_window_and_the_autocast_dtype(runs):
    """Its own process: the log line goes to the terminal of the first tool that logs."""
    tmp = runs['infer:crop below a patch']['tmp']
    res = subprocess.run(
        [sys.executable, 'tools/infer.py', ADE_CFG, str(tmp / 'tiny.pth'), str(tmp / 'image.png')]
        + ['--native', '--cfg-options', *SHRINK, '--out-dir', str(tmp / 'o2'), '--amp']
        + ['--slide', '--crop', '32x48', '--stride', '32x32', '--device', 'cpu'],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if 'LookHere attention at' in ln]
    # the 32x48 window of the 64x80 image, in --amp's bfloat16 (it said the image, float32)
    expected = 'at 32x48 (grid 2x3, 7 tokens, batch 1, bfloat16, cpu, inference)'
    assert len(lines) == 1 and expected in lines[0], lines
    assert (tmp / 'o2' / 'image.png').exists()
    # no library warning reaches the terminal (mmseg's build_loss / avg_non_ignore notes)
    assert 'Warning' not in res.stderr, res.stderr
    # plain progress lines (stderr is a pipe here, where tqdm showed nothing)
    assert 'infer: 1/1 img (' in res.stderr, res.stderr


def test_deploy_memory_says_what_is_wrong(runs):
    err = _error_line(runs['deploy_memory:bad interval'])
    assert '--interval must be in (0, 60] seconds, got 0.0' in err
    err = _error_line(runs['deploy_memory:no output'])
    assert 'give --png and/or --json' in err
    err = _error_line(runs['deploy_memory:missing onnx'])
    assert (
        f'--onnx: no such file: {runs["deploy_memory:missing onnx"]["tmp"] / "none.onnx"}' in err
    )


def test_robustness_says_what_is_wrong(runs):
    err = _error_line(runs['robustness:bad eps'])
    assert "argument --eps: expected a number in (0, 255] (pixel units), got '0'" in err
    err = _error_line(runs['robustness:missing checkpoint'])
    tmp = runs['robustness:missing checkpoint']['tmp']
    assert err == f'error: checkpoint {str(tmp / "none.pth")!r} not found'
    err = _error_line(runs['robustness:no labels'])  # before the model: no traceback
    assert (
        err.startswith(
            'error: the test split cannot be attacked: test_dataloader.dataset.'
            'pipeline has no LoadAnnotations'
        )
        and '--split val' in err
    )


def test_plot_heads_writes_its_png(runs):
    res = runs['plot_heads']
    out = res['tmp'] / 'heads.png'
    assert res['rc'] == 0, res['stderr']
    assert res['stdout'].strip() == f'wrote {out}'
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_demo_data_only_writes_a_dataset(runs):
    res = runs['demo:data only']
    assert res['rc'] == 0, res['stderr']
    assert '[demo] cityscapes: wrote a tiny dataset in' in res['stdout']
    assert (res['tmp'] / 'data' / 'cityscapes' / 'gtFine' / 'val').is_dir()


def test_study_merge_writes_the_report_files(runs):
    res = runs['study:merge']
    assert res['rc'] == 0, res['stderr']
    stem = res['tmp'] / 'm' / 'merged'
    assert f'wrote {stem}.json, .csv, _table.md, .png' in res['stdout']
    assert '| abs | 50.00 ± 14.14 |' in res['stdout']
    merged = json.loads((res['tmp'] / 'm' / 'merged.json').read_text())
    assert merged['command'].startswith('python ') and '--merge' in merged['command']
    assert merged['settings']['seeds'] == [0, 1]
    for name in ('merged.csv', 'merged.png', 'merged_table.md'):
        assert (res['tmp'] / 'm' / name).is_file()


def test_swap_backbone_refuses_an_output_that_is_not_python(runs):
    res = runs['swap:not python']
    assert res['rc'] == 1
    assert 'the output config must end in .py, got ' in res['stderr']


def test_progress_prints_plain_lines_where_there_is_no_terminal():
    """``tools/infer.py`` and the evaluation passes of ``tools/extrapolate.py`` /
    ``robustness.py`` under nohup, Slurm or CI: about ten lines, the last one at the end
    (tqdm's bar printed nothing there)."""
    import io

    from lookhere_dense.apis.cli import progress

    out = io.StringIO()
    assert list(progress(range(25), 'whole@1024x2048', stream=out)) == list(range(25))
    lines = out.getvalue().splitlines()
    assert [ln.split(' (')[0] for ln in lines] == [
        f'whole@1024x2048: {k}/25 img' for k in (3, 6, 9, 12, 15, 18, 21, 24, 25)
    ]  # it printed 13 (every 2nd); 16 images printed 16
    assert 'ETA' in lines[0] and 'ETA' not in lines[-1]
    for n, shown in ((16, 8), (10, 10), (7, 7), (101, 10)):
        out = io.StringIO()
        list(progress(range(n), 'infer', stream=out))
        assert len(out.getvalue().splitlines()) == shown, n
    out = io.StringIO()
    list(progress(iter(range(3)), 'infer', stream=out))  # no length: counts only
    assert [ln.split(' (')[0] for ln in out.getvalue().splitlines()] == [
        'infer: 1 img',
        'infer: 2 img',
        'infer: 3 img',
    ]
    out = io.StringIO()
    list(progress(iter(range(120)), 'pass', stream=out))  # 1, 2, 5, ... and the end
    counts = [int(ln.split()[1]) for ln in out.getvalue().splitlines()]
    assert counts == [1, 2, 5, 10, 20, 50, 100, 120]


def test_quiet_mmengine_logger_drops_the_named_notes_and_keeps_other_warnings():
    """The evaluation passes (research/evaluate.py) build IoUMetric inside it, dropping its
    'The prefix is not set' note; another warning still shows."""
    import logging

    from mmengine.logging import MMLogger

    from lookhere_dense.apis.cli import quiet_mmengine_logger

    logger = MMLogger.get_instance('test_quiet_drop', logger_name='test_quiet_drop')
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    try:
        with quiet_mmengine_logger(drop=('The prefix is not set',)):
            logger.warning('The prefix is not set in metric class IoUMetric.')
            logger.warning('something to act on')
            logger.info('an info line')
        logger.warning('The prefix is not set, outside the block')
    finally:
        logger.removeHandler(handler)
        MMLogger._instance_dict.pop('test_quiet_drop', None)  # not the current logger after
    assert seen == ['something to act on', 'The prefix is not set, outside the block']
