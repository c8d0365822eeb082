"""``tools/export.py`` / ``export_model`` after a deployment review: a check that fails on
NaN outputs and fails the command, output paths refused before any work (``--out`` /
``--json`` under a file, an ``--out`` that would overwrite the checkpoint or is no
``.onnx`` / ``.pt2``), a segmentor shape below one patch refused by ``--shape``, a note
for a config that infers in slide mode, and stable input / output names in the ONNX
file."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures('one_torch_thread')
pytest.importorskip('onnx')
pytest.importorskip('onnxruntime')


@pytest.fixture(scope='module')
def ckpt(tmp_path_factory) -> str:
    from tiny_seg import write_checkpoint

    return write_checkpoint(str(tmp_path_factory.mktemp('ckpt') / 'iter_0.pth'))


@pytest.fixture(scope='module')
def segmentor_export(ckpt, tmp_path_factory):
    """The tiny Segmenter (its config infers in slide mode) exported at 40x72 (padded in
    the graph to 48x80): ``(report, log lines, path)``."""
    from tiny_seg import ADE_CFG, SHRINK, options

    from lookhere_dense.apis.export import export_model

    path = tmp_path_factory.mktemp('seg') / 'seg.onnx'
    lines = []
    report = export_model(
        ADE_CFG, ckpt, (40, 72), str(path), cfg_options=options(*SHRINK), log=lines.append
    )
    return report, lines, path


def _tool():
    from tiny_seg import REPO

    spec = importlib.util.spec_from_file_location(
        'export_tool', Path(REPO) / 'tools' / 'export.py'
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _run_tool(argv) -> int:
    """The tool in this process, as its ``__main__`` runs it; its exit status."""
    from lookhere_dense.apis.cli import run_main

    with pytest.raises(SystemExit) as stop:
        run_main(_tool().main, list(argv))
        raise SystemExit(0)
    return stop.value.code or 0


def _strict_json(path: Path):
    def refuse(name):
        raise ValueError(f'non-standard JSON constant {name}')

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize('fault', ['nan', 'off'])
def test_a_failed_check_warns_writes_valid_json_and_exits_1(
    fault, ckpt, monkeypatch, tmp_path, capsys
):
    """A NaN in the file's output was logged as ``max |diff| nan`` without a warning
    (``nan > 1e-3`` is False), the report held NaN (invalid JSON); a real warning ended
    with exit status 0. Now both fail the check, the JSON holds null, the tool exits 1."""
    from tiny_seg import ADE_CFG, SHRINK

    import lookhere_dense.apis.export as export

    real = export._run_exported

    def broken(path, format, x, threads):
        out = np.array(real(path, format, x, threads)[0])
        if fault == 'nan':
            out[0, 0, 0, 0] = np.nan
        else:
            out = out + 0.5
        return [out]

    monkeypatch.setattr(export, '_run_exported', broken)
    report = tmp_path / 'r.json'
    argv = [ADE_CFG, ckpt, '--shape', '32', '32', '--out', str(tmp_path / 'm.onnx')]
    status = _run_tool([*argv, '--json', str(report), '--cfg-options', *SHRINK])
    out, err = capsys.readouterr()
    assert status == 1, (out, err)
    assert 'error: the check failed' in err, err
    assert 'WARNING: ' in out, out
    data = _strict_json(report)  # no NaN / Infinity
    assert data['check_passed'] is False and data['check_problems'], data
    if fault == 'nan':
        assert data['max_abs_diff'] is None
        assert 'max |diff| nan' not in out and 'NaN' in out, out
    else:
        assert data['max_abs_diff'] > 0.4
    assert (tmp_path / 'm.onnx').is_file()  # kept for inspection


def test_a_passed_check_exits_0_and_max_diff_sets_the_limit(segmentor_export):
    report, lines, _ = segmentor_export
    assert report['check_passed'] is True and report['check_problems'] == []
    assert report['check_max_diff'] == 1e-3 and report['max_abs_diff'] < 1e-4
    assert not any('WARNING' in ln for ln in lines), lines
    args = _tool().parse_args(['c.py', '--random-weights', '--shape', '8', '8', '--out', 'a.onnx'])
    assert args.max_diff == 1e-3
    args = _tool().parse_args(
        ['c.py', '--random-weights', '--shape', '8', '8', '--out', 'a.onnx', '--max-diff', '0.5']
    )
    assert args.max_diff == 0.5


def test_out_in_a_folder_that_cannot_be_written_is_refused_before_the_config(tmp_path):
    """``--out afile/x.onnx`` gave a FileExistsError traceback from os.makedirs;
    ``--out /proc/x.onnx`` traced the whole model, then an error naming neither. Refused
    now before the config is even read (a missing config here)."""
    from lookhere_dense.apis.export import export_model
    from lookhere_dense.errors import ToolError

    (tmp_path / 'afile').write_text('x')
    missing = str(tmp_path / 'no_config.py')
    with pytest.raises(ToolError, match=r"--out '.*afile' cannot be written"):
        export_model(missing, None, (32, 32), str(tmp_path / 'afile' / 'x.onnx'))
    if os.path.isdir('/proc') and not os.access('/proc', os.W_OK):
        with pytest.raises(ToolError, match=r"--out '/proc' cannot be written"):
            export_model(missing, None, (32, 32), '/proc/x.onnx')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['afile']


def test_json_in_a_folder_that_cannot_be_written_is_refused_before_the_export(
    monkeypatch, tmp_path, capsys
):
    """``--json afile/r.json`` failed after the export, in research.reporting's traceback."""
    from tiny_seg import ADE_CFG

    import lookhere_dense.apis.export as export

    def no_export(*args, **kwargs):
        raise AssertionError('exported although --json cannot be written')

    monkeypatch.setattr(export, 'export_model', no_export)
    (tmp_path / 'afile').write_text('x')
    argv = [ADE_CFG, '--random-weights', '--shape', '32', '32', '--out', str(tmp_path / 'm.onnx')]
    status = _run_tool([*argv, '--json', str(tmp_path / 'afile' / 'r.json')])
    err = capsys.readouterr().err
    assert status == 2 and "error: --json '" in err and 'cannot be written' in err, err
    status = _run_tool([*argv, '--json', str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and 'is a folder' in err, err


def test_a_segmentor_shape_below_a_patch_without_padding_is_refused_by_shape(tmp_path):
    """With a data preprocessor that does not pad, ``--shape 8 8`` died in ~70 frames of
    torch.onnx (``image of 8x8 px is smaller than one 16x16 patch``); the size was checked
    only for ``--part backbone``."""
    from tiny_seg import ADE_CFG, SHRINK, options

    from lookhere_dense.apis.export import export_model
    from lookhere_dense.errors import ConfigError

    opts = options(*SHRINK, 'model.data_preprocessor.test_cfg=None')
    for fmt in ('onnx', 'pt2'):
        with pytest.raises(
            ConfigError,
            match=r'--shape 8 8: the segmentor takes images of at least one 16x16 patch',
        ):
            export_model(
                ADE_CFG,
                None,
                (8, 8),
                str(tmp_path / f'm.{fmt}'),
                format=fmt,
                check=False,
                cfg_options=opts,
                log=lambda _: None,
            )
    assert not any(tmp_path.iterdir())


def test_out_never_overwrites_the_checkpoint_or_a_file_of_another_kind(ckpt, tmp_path):
    """``--out ckcopy.pth`` (the checkpoint) replaced the weights by an ONNX graph, exit 0.
    Refused now: a suffix other than .onnx / .pt2, and the checkpoint itself (by its real
    path) under an export suffix."""
    from tiny_seg import ADE_CFG, SHRINK, options

    from lookhere_dense.apis.export import export_model
    from lookhere_dense.errors import ConfigError

    opts = options(*SHRINK)
    copy = tmp_path / 'ckcopy.pth'
    shutil.copy(ckpt, copy)
    before = copy.read_bytes()
    with pytest.raises(ConfigError, match=r'must end in \.onnx or \.pt2'):
        export_model(ADE_CFG, str(copy), (32, 32), str(copy), cfg_options=opts, log=lambda _: None)
    named = tmp_path / 'weights.pt2'
    shutil.copy(ckpt, named)
    (tmp_path / 'link.pt2').symlink_to(named)
    for out in (named, tmp_path / 'link.pt2'):
        with pytest.raises(ConfigError, match='would overwrite the checkpoint'):
            export_model(
                ADE_CFG,
                str(named),
                (32, 32),
                str(out),
                format='pt2',
                cfg_options=opts,
                log=lambda _: None,
            )
    assert copy.read_bytes() == before and named.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ['ckcopy.pth', 'link.pt2', 'weights.pt2']


def test_a_slide_mode_config_is_exported_with_a_note(segmentor_export, tmp_path):
    """The tiny config infers in slide mode: the file computes whole-frame logits, which
    tools/test.py does not give; said in a NOTE and in the report."""
    report, lines, _ = segmentor_export
    notes = [ln for ln in lines if ln.startswith('NOTE: ')]
    assert len(notes) == 1 and "model.test_cfg.mode='slide'" in notes[0], lines
    assert 'whole-frame logits' in notes[0]
    assert report['test_cfg_mode'] == 'slide' and report['notes'] == [notes[0][len('NOTE: ') :]]


def test_the_onnx_file_names_its_input_and_outputs(segmentor_export):
    """The input was ``inputs``, the output a generated name that changed with the size
    (``upsample_bilinear2d``, ``slice_100``): now ``images`` -> ``logits``, runnable by
    name (the backbone's ``block{i}`` / ``cls{i}``: test_export.py's CLS-token export)."""
    from lookhere_dense.apis.export import onnxruntime_session

    report, _, path = segmentor_export
    session = onnxruntime_session(str(path))
    assert [i.name for i in session.get_inputs()] == ['images']
    assert [o.name for o in session.get_outputs()] == ['logits']
    assert report['input_name'] == 'images' and report['output_names'] == ['logits']
    x = np.zeros((1, 3, 40, 72), np.float32)
    assert session.run(['logits'], {'images': x})[0].shape == (1, 150, 40, 72)
