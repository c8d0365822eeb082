"""tools/fault_check.py without its slow cases: the imports of the tool run as a script,
the ``--out`` folder it clears, the order of its cases (the resumed runs are compared with
the ``reference`` run, which must come first) and the failure paths of its case bodies.
The expensive parts (torchrun, training) are replaced by cheap stand-ins."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOL = REPO / 'tools' / 'fault_check.py'


@pytest.fixture(scope='module')
def fc():
    spec = importlib.util.spec_from_file_location('fault_check_tool_under_test', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_data(monkeypatch, fc):
    """``make_ade`` replaced by an empty folder (the cases are stand-ins too)."""

    def make_ade(folder):
        os.makedirs(folder, exist_ok=True)
        return str(folder)

    monkeypatch.setattr(fc, 'make_ade', make_ade)


def _record_cases(monkeypatch, fc, calls):
    """Every case replaced by one that records its name (and whether the reference
    weights were known when it ran); ``reference`` sets them."""
    for name in list(fc.CASES):

        def case(ctx, name=name):
            calls.append((name, ctx.get('reference')))
            if name == 'reference':
                ctx['reference'] = 'REF'
            return dict(ok=True)

        monkeypatch.setitem(fc.CASES, name, case)


def test_the_tool_run_as_a_script_imports_the_research_code(tmp_path):
    """As ``python tools/fault_check.py`` runs it (``tools/`` first on ``sys.path``, no
    ``PYTHONPATH``, another working directory): the tiny dataset (``research``) is made,
    and the case (a stand-in) runs."""
    driver = (
        'import importlib.util, json, sys\n'
        'tool, out = sys.argv[1:3]\n'
        'sys.path[0] = str(__import__("pathlib").Path(tool).parent)\n'
        'spec = importlib.util.spec_from_file_location("fault_check", tool)\n'
        'fc = importlib.util.module_from_spec(spec)\n'
        'spec.loader.exec_module(fc)\n'
        'fc.CASES["two_runs"] = lambda ctx: dict(ok=True, opts=len(ctx["opts"]))\n'
        'sys.exit(fc.main(["--out", out, "--cases", "two_runs"]))\n'
    )
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    out = tmp_path / 'fc'
    res = subprocess.run(
        [sys.executable, '-c', driver, str(TOOL), str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert 'two_runs: ok' in res.stdout
    assert (out / 'data' / 'ade' / 'ADEChallengeData2016' / 'images').is_dir()
    assert json.loads((out / 'fault_check.json').read_text())['results']['two_runs']['ok']


def test_a_folder_of_other_files_is_refused_before_anything_is_removed(
    fc, tmp_path, monkeypatch, capsys
):
    _fake_data(monkeypatch, fc)
    calls = []
    _record_cases(monkeypatch, fc, calls)
    mine = tmp_path / 'work_dirs'
    (mine / 'run1').mkdir(parents=True)
    (mine / 'run1' / 'iter_100.pth').write_text('weights')
    (mine / 'notes.txt').write_text('mine')
    with pytest.raises(SystemExit) as exc:
        fc.main(['--out', str(mine), '--cases', 'two_runs'])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert str(mine) in err and 'not an earlier output of fault_check.py' in err, err
    assert (mine / 'notes.txt').read_text() == 'mine'
    assert (mine / 'run1' / 'iter_100.pth').read_text() == 'weights'
    assert calls == []
    # the working directory as '.'
    monkeypatch.chdir(mine)
    with pytest.raises(SystemExit):
        fc.main(['--out', '.', '--cases', 'two_runs'])
    assert (mine / 'notes.txt').read_text() == 'mine'
    # a file named --out, and a folder whose fault_check.json is someone else's
    with pytest.raises(SystemExit):
        fc.main(['--out', 'notes.txt', '--cases', 'two_runs'])
    assert (mine / 'notes.txt').read_text() == 'mine'
    (mine / 'run1' / 'fault_check.json').write_text('[1, 2]')
    with pytest.raises(SystemExit):
        fc.main(['--out', 'run1', '--cases', 'two_runs'])
    assert (mine / 'run1' / 'iter_100.pth').read_text() == 'weights'
    assert calls == []
    # a new folder and an empty one are fine
    assert fc.main(['--out', str(tmp_path / 'new'), '--cases', 'two_runs']) == 0
    (tmp_path / 'empty').mkdir()
    assert fc.main(['--out', str(tmp_path / 'empty'), '--cases', 'two_runs']) == 0
    # a link to an earlier output (work_dirs -> /scratch): its entries go, the link stays
    (tmp_path / 'link').symlink_to(tmp_path / 'empty')
    assert fc.main(['--out', str(tmp_path / 'link'), '--cases', 'two_runs']) == 0
    assert (tmp_path / 'link').is_symlink()
    assert [c[0] for c in calls] == ['two_runs', 'two_runs', 'two_runs']


def test_the_output_is_marked_first_so_a_crashed_run_is_replaced_by_the_next(
    fc, tmp_path, monkeypatch
):
    _fake_data(monkeypatch, fc)
    out = tmp_path / 'fc'
    seen = []

    def crash(ctx):
        seen.append((Path(ctx['out']) / 'fault_check.json').is_file())
        (Path(ctx['out']) / 'two_runs.log').write_text('half')
        raise RuntimeError('a case crashed')

    monkeypatch.setitem(fc.CASES, 'two_runs', crash)
    with pytest.raises(RuntimeError):
        fc.main(['--out', str(out), '--cases', 'two_runs'])
    assert seen == [True]  # the folder was marked before the case ran
    monkeypatch.setitem(fc.CASES, 'two_runs', lambda ctx: dict(ok=True))
    assert fc.main(['--out', str(out), '--cases', 'two_runs']) == 0
    assert not (out / 'two_runs.log').exists()  # the earlier output was replaced
    assert json.loads((out / 'fault_check.json').read_text())['results']['two_runs']['ok']


@pytest.mark.parametrize(
    'cases, order',
    [
        (['kill_rank', 'two_runs'], ['reference', 'kill_rank', 'two_runs']),
        (['kill_rank', 'reference'], ['reference', 'kill_rank']),
        (['two_runs', 'sigterm_torchrun'], ['reference', 'two_runs', 'sigterm_torchrun']),
    ],
)
def test_cases_that_resume_run_after_the_reference(fc, tmp_path, monkeypatch, cases, order):
    _fake_data(monkeypatch, fc)
    calls = []
    _record_cases(monkeypatch, fc, calls)
    assert fc.main(['--out', str(tmp_path / 'fc'), '--cases', *cases]) == 0
    assert [c[0] for c in calls] == order
    for name, reference in calls:
        if name in ('kill_rank', 'sigterm_torchrun'):
            assert reference == 'REF', name
    results = json.loads((tmp_path / 'fc' / 'fault_check.json').read_text())['results']
    assert list(results) == order
    # cases that compare with nothing run alone, in the order given
    calls.clear()
    assert fc.main(['--out', str(tmp_path / 'fc'), '--cases', 'two_runs', 'kill_during_save']) == 0
    assert [c[0] for c in calls] == ['two_runs', 'kill_during_save']


class _Done:
    """A finished ``Popen`` stand-in."""

    def __init__(self, args, rc):
        self.args, self.returncode, self.pid = args, rc, 0

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        return self.returncode

    def send_signal(self, sig):
        pass

    def kill(self):
        pass


def test_a_resume_is_ok_only_when_compared_with_the_reference(fc, tmp_path, monkeypatch):
    work = tmp_path / 'kill_rank'
    work.mkdir()
    (work / f'iter_{fc.N}.pth').write_text('final')
    monkeypatch.setattr(fc, '_torchrun', lambda *a, **k: _Done(['torchrun'], 0))
    # no reference run (not selected, not run first, or failed): not ok
    res = fc._resume(dict(out=str(tmp_path), reference=None), str(work), [], 'kill_rank')
    assert res['resume_finished'] is False and res['vs_uninterrupted'] is None
    assert 'reference' in res['why']
    res = fc._resume(dict(out=str(tmp_path)), str(work), [], 'kill_rank')
    assert res['resume_finished'] is False
    # with it: the comparison decides
    ref = tmp_path / 'reference.pth'
    ref.write_text('ref')
    for diff, ok in ((0.0, True), (1e-7, False)):
        monkeypatch.setattr(fc, '_difference', lambda a, b, d=diff: dict(max_abs=d, rel_l2=d))
        res = fc._resume(dict(out=str(tmp_path), reference=str(ref)), str(work), [], 'k')
        assert res['resume_finished'] is ok and res['vs_uninterrupted']['max_abs'] == diff
    # compare=False (the wider model of kill_during_save) needs no reference
    res = fc._resume(dict(out=str(tmp_path)), str(work), [], 'k', compare=False)
    assert res['resume_finished'] is True and 'vs_uninterrupted' not in res


def test_two_runs_reports_the_first_runs_log_when_it_does_not_start(fc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def train(work, opts, log):
        Path(log).write_text('Traceback: the first run failed at once\n')
        return _Done(['python', 'tools/train.py', '--cfg-options', *opts], 1)

    monkeypatch.setattr(fc, '_train', train)
    res = fc.case_two_runs(dict(out=str(tmp_path), opts=['train_cfg.max_iters=8']))
    assert res['ok'] is False and res['why'] == 'the first run did not start'
    assert 'the first run failed at once' in res['tail']
