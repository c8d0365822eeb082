#!/usr/bin/env python
"""The slow fault checks of issue 34 (docs/faults.md), with real torchrun, real signals and
real files on the tiny ADE20K-layout config (CPU, Gloo, 2 processes):

* ``kill_rank``: SIGKILL to rank 1 of ``torchrun --nproc_per_node 2`` mid-run: how long
  until torchrun exits, whether its message names the lost rank, and ``--resume``
  (torchrun again) continuing from the last complete checkpoint to the end;
* ``kill_during_save``: SIGKILL to rank 0 while it writes a checkpoint (caught by polling
  for the temporary file): no partial file under a final name, ``last_checkpoint`` names a
  loadable checkpoint, ``--resume`` finishes;
* ``sigterm_torchrun``: SIGTERM to torchrun (what a scheduler sends): the workers save the
  iteration they end, say so, exit; ``--resume`` finishes;
* ``two_runs``: a second ``tools/train.py`` in the work dir of a live one is refused;
* ``worker_killed``: SIGKILL to a dataloader worker: the run stops (no hang) naming it;
* ``image_deleted``: the training images removed after the dataset was listed: the run
  stops naming the file.

Each resumed run's final weights are compared with an uninterrupted 2-process run (the
``reference`` case, run first whenever a selected case needs it): they must be
bit-identical (:data:`RESUME_TOLERANCE` is 0: every rank's generators are in the
checkpoint; see ExactResumeHook). The relative L2 difference is reported as well; a
resumed run without that comparison is a failure.

Usage::

    python tools/fault_check.py --out work_dirs/fault_check [--cases kill_rank two_runs]

What ``OUT`` holds is removed first, so it must not exist, be empty, or be an earlier
output of this tool (it holds ``fault_check.json``, written at the start); any other
folder is refused before anything is removed. Writes ``OUT/fault_check.json`` and prints
one line per case; exit status 1 if a case failed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import os.path as osp
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
# the repository root (research/, not installed, is imported by tests/tiny_seg.py) and
# tests/ (tiny_seg itself)
for _path in (str(REPO), str(REPO / 'tests')):
    if _path not in sys.path:
        sys.path.insert(0, _path)
from tiny_seg import ADE_CFG, SHRINK, env, make_ade, roots  # noqa: E402

N = 8  # iterations of every run
RUN = [
    f'train_cfg.max_iters={N}',
    'train_cfg.val_interval=100',
    'default_hooks.checkpoint.interval=2',
    'default_hooks.checkpoint.max_keep_ckpts=2',
]
#: The largest absolute difference of a resumed 2-process run's final weights from the
#: uninterrupted run's: 0, bit-identical (every rank's generators are in the checkpoint).
RESUME_TOLERANCE = 0.0
#: A wider model for the save-time kill (a checkpoint of ~50 MB takes long enough to hit).
WIDE = [
    'model.backbone.embed_dims=384',
    'model.decode_head.in_channels=384',
    'model.decode_head.channels=384',
    'model.decode_head.embed_dims=384',
]


def _torchrun(work: str, opts: List[str], log: str, resume: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node', '2']
    cmd += ['--master_port', str(29500 + os.getpid() % 1000), 'tools/train.py', ADE_CFG]
    cmd += ['--launcher', 'pytorch', '--work-dir', work, '--threads', '1']
    cmd += ['--resume'] if resume else []
    cmd += ['--cfg-options', *opts]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env(), stdout=open(log, 'w'), stderr=subprocess.STDOUT
    )


def _train(work: str, opts: List[str], log: str) -> subprocess.Popen:
    cmd = [sys.executable, 'tools/train.py', ADE_CFG, '--work-dir', work, '--threads', '1']
    return subprocess.Popen(
        cmd + ['--cfg-options', *opts],
        cwd=REPO,
        env=env(),
        stdout=open(log, 'w'),
        stderr=subprocess.STDOUT,
    )


def _children(pid: int) -> List[int]:
    out = []
    for stat in glob.glob('/proc/[0-9]*/stat'):
        try:
            fields = open(stat).read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split('/')[2]))
    return out


def _worker(torchrun: int, local_rank: int) -> Optional[int]:
    for pid in _children(torchrun):
        try:
            environ = open(f'/proc/{pid}/environ', 'rb').read().split(b'\0')
        except OSError:
            continue
        if f'LOCAL_RANK={local_rank}'.encode() in environ:
            return pid
    return None


def _pointer(work: str) -> str:
    path = osp.join(work, 'last_checkpoint')
    return open(path).read().strip() if osp.isfile(path) else ''


def _iteration(path: str) -> int:
    return int(osp.basename(path)[len('iter_') : -len('.pth')]) if path else -1


def _wait(cond: Callable[[], bool], child: subprocess.Popen, timeout: float, poll=0.02) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline and child.poll() is None:
        if cond():
            return True
        time.sleep(poll)
    return False


def _loadable(path: str) -> bool:
    import torch

    try:
        torch.load(path, map_location='cpu', weights_only=False)['state_dict']
        return True
    except Exception:  # noqa: BLE001 - any failure means not loadable
        return False


def _weights(path: str) -> Dict:
    import torch

    sd = torch.load(path, map_location='cpu', weights_only=False)['state_dict']
    return {
        k: v.float()
        for k, v in sd.items()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    }


def _difference(a: str, b: str) -> Dict[str, float]:
    """Largest absolute and relative L2 difference of two checkpoints' weights."""
    wa, wb = _weights(a), _weights(b)
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    num = sum(float((wa[k] - wb[k]).pow(2).sum()) for k in wa)
    den = sum(float(wb[k].pow(2).sum()) for k in wb)
    return dict(max_abs=diff, rel_l2=(num / den) ** 0.5 if den else 0.0)


def _tail(log: str, n: int = 25) -> str:
    return ''.join(open(log).readlines()[-n:])


def _finish(child: subprocess.Popen, timeout: float) -> Optional[int]:
    """``child``'s exit status, or ``None`` (and the child killed) when it has not ended
    within ``timeout`` seconds."""
    try:
        return child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        return None


def _resume(ctx: dict, work: str, opts: List[str], name: str, compare: bool = True) -> dict:
    log = osp.join(ctx['out'], f'{name}_resume.log')
    child = _torchrun(work, opts, log, resume=True)
    rc = child.wait(600)
    final = osp.join(work, f'iter_{N}.pth')
    res = dict(resume_rc=rc, resume_finished=rc == 0 and osp.isfile(final))
    if compare and res['resume_finished']:
        # never a pass without the comparison: main() runs the reference case first
        if ctx.get('reference') and osp.isfile(ctx['reference']):
            res['vs_uninterrupted'] = _difference(final, ctx['reference'])
            res['resume_finished'] = res['vs_uninterrupted']['max_abs'] <= RESUME_TOLERANCE
        else:
            res['vs_uninterrupted'] = None
            res['resume_finished'] = False
            res['why'] = 'no uninterrupted reference run to compare the resumed weights with'
    if rc != 0:
        res['resume_tail'] = _tail(log)
    return res


# ----------------------------------------------------------------------------------------
# cases
# ----------------------------------------------------------------------------------------
def case_reference(ctx: dict) -> dict:
    """An uninterrupted 2-process run (the weights the resumed runs are compared with)."""
    work = osp.join(ctx['out'], 'reference')
    child = _torchrun(work, ctx['opts'], osp.join(ctx['out'], 'reference.log'))
    rc = child.wait(600)
    ctx['reference'] = osp.join(work, f'iter_{N}.pth') if rc == 0 else None
    return dict(ok=rc == 0, rc=rc)


def case_kill_rank(ctx: dict) -> dict:
    work, log = osp.join(ctx['out'], 'kill_rank'), osp.join(ctx['out'], 'kill_rank.log')
    opts = ctx['opts']
    child = _torchrun(work, opts, log)
    if not _wait(lambda: _iteration(_pointer(work)) >= 2, child, 300):
        child.kill()
        return dict(ok=False, why='no checkpoint before the kill', tail=_tail(log))
    victim = _worker(child.pid, 1)
    t0 = time.time()
    os.kill(victim, signal.SIGKILL)
    rc = _finish(child, 1800)
    stopped = time.time() - t0
    text = open(log).read()
    named = 'rank      : 1' in text and 'Signal 9 (SIGKILL)' in text
    last = _pointer(work)
    res = dict(
        killed_pid=victim,
        stopped_after_s=round(stopped, 1),
        torchrun_rc=rc,
        names_lost_rank=named,
        last_checkpoint=last,
        last_loadable=_loadable(last),
    )
    res.update(_resume(ctx, work, opts, 'kill_rank'))
    res['ok'] = bool(rc and named and res['last_loadable'] and res['resume_finished'])
    res['ok'] = res['ok'] and stopped < 60
    return res


def case_kill_during_save(ctx: dict) -> dict:
    work = osp.join(ctx['out'], 'kill_during_save')
    log = osp.join(ctx['out'], 'kill_during_save.log')
    opts = ctx['opts'] + WIDE + ['default_hooks.checkpoint.interval=1']
    child = _torchrun(work, opts, log)
    partial = lambda: glob.glob(osp.join(work, '.iter_*.pth.partial-*'))  # noqa: E731
    # the first save is let through; then rank 0 is killed while it writes a checkpoint
    # file (its temporary exists), or, if the write is never caught by polling, while it
    # serialises the 4th checkpoint (mmengine has logged 'Saving checkpoint at 4')
    if not _wait(lambda: _iteration(_pointer(work)) >= 1, child, 300):
        child.kill()
        return dict(ok=False, why='no first checkpoint', tail=_tail(log))
    writer = _worker(child.pid, 0)
    saving = lambda: 'Saving checkpoint at 4 iterations' in open(log).read()  # noqa: E731
    if not _wait(lambda: bool(partial()) or saving(), child, 300, 0.0005):
        child.kill()
        return dict(ok=False, why='no save in progress was caught', tail=_tail(log))
    os.kill(writer, signal.SIGKILL)
    hit = partial()
    rc = child.wait(600)
    last = _pointer(work)
    finals = sorted(glob.glob(osp.join(work, 'iter_*.pth')))
    res = dict(
        hit_while_writing=[osp.basename(p) for p in hit],
        phase='writing the file' if hit else 'serialising the checkpoint',
        torchrun_rc=rc,
        last_checkpoint=last,
        last_loadable=_loadable(last),
        all_final_names_loadable=all(_loadable(p) for p in finals),
        final_names=[osp.basename(p) for p in finals],
    )
    res.update(_resume(ctx, work, opts, 'kill_during_save', compare=False))  # a wider model
    res['ok'] = bool(
        res['last_loadable'] and res['all_final_names_loadable'] and res['resume_finished']
    )
    return res


def case_sigterm_torchrun(ctx: dict) -> dict:
    work = osp.join(ctx['out'], 'sigterm')
    log = osp.join(ctx['out'], 'sigterm.log')
    child = _torchrun(work, ctx['opts'], log)
    if not _wait(lambda: _iteration(_pointer(work)) >= 2, child, 300):
        child.kill()
        return dict(ok=False, why='no checkpoint before the signal', tail=_tail(log))
    t0 = time.time()
    child.send_signal(signal.SIGTERM)
    rc = child.wait(600)
    stopped = time.time() - t0
    text = open(log).read()
    lines = [ln for ln in text.splitlines() if 'training stopped by SIGTERM after iteration' in ln]
    last = _pointer(work)
    res = dict(
        stopped_after_s=round(stopped, 1),
        torchrun_rc=rc,
        stop_lines=lines,
        last_checkpoint=last,
        last_loadable=_loadable(last),
    )
    res.update(_resume(ctx, work, ctx['opts'], 'sigterm'))
    said = bool(lines) and all(f'saved {last}' in ln for ln in lines)
    res['ok'] = bool(said and res['last_loadable'] and res['resume_finished'] and stopped < 30)
    return res


def case_two_runs(ctx: dict) -> dict:
    work = osp.join(ctx['out'], 'two_runs')
    opts = [o for o in ctx['opts'] if not o.startswith('train_cfg.max_iters=')]
    first_log = osp.join(ctx['out'], 'two_a.log')
    first = _train(work, opts + ['train_cfg.max_iters=400'], first_log)
    try:
        if not _wait(lambda: bool(_pointer(work)), first, 300):
            return dict(ok=False, why='the first run did not start', tail=_tail(first_log))
        before = {p: os.path.getmtime(p) for p in glob.glob(osp.join(work, '*.pth'))}
        second_log = osp.join(ctx['out'], 'two_b.log')
        rc = _train(work, ctx['opts'], second_log).wait(300)
        line = [ln for ln in open(second_log).read().splitlines() if ln.startswith('error:')]
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(120)
    refused = rc == 2 and bool(line) and 'is in use by another training run' in line[-1]
    untouched = all(os.path.getmtime(p) == t for p, t in before.items() if osp.exists(p))
    return dict(ok=refused and untouched, second_rc=rc, second_error=line, untouched=untouched)


def case_worker_killed(ctx: dict) -> dict:
    work = osp.join(ctx['out'], 'worker_killed')
    log = osp.join(ctx['out'], 'worker_killed.log')
    opts = ctx['opts'] + [
        'train_dataloader.num_workers=2',
        'train_dataloader.persistent_workers=True',
        'train_cfg.max_iters=400',
    ]
    child = _train(work, opts, log)
    if not _wait(lambda: bool(_pointer(work)) and len(_children(child.pid)) >= 2, child, 300):
        child.kill()
        return dict(ok=False, why='no dataloader workers seen', tail=_tail(log))
    victim = _children(child.pid)[0]
    t0 = time.time()
    os.kill(victim, signal.SIGKILL)
    rc = _finish(child, 300)
    line = [ln for ln in open(log).read().splitlines() if ln.startswith('error:')]
    named = (
        bool(line) and f'a dataloader worker died (DataLoader worker (pid {victim})' in line[-1]
    )
    return dict(
        ok=rc == 2 and named and _loadable(_pointer(work)),
        rc=rc,
        stopped_after_s=round(time.time() - t0, 1),
        names_worker=named,
        error=line,
    )


def _data_fault(ctx: dict, name: str, damage: Callable[[str], str]) -> dict:
    """Train on a fresh copy of the tiny data; after the first checkpoint ``damage(root)``
    the data (it returns the folder the error must name); the run must stop with one
    ``error:`` line naming it and leave a loadable checkpoint."""
    root = make_ade(osp.join(ctx['out'], f'data_{name}'))
    work, log = osp.join(ctx['out'], name), osp.join(ctx['out'], f'{name}.log')
    child = _train(work, [*roots(root), *SHRINK, *RUN[1:], 'train_cfg.max_iters=400'], log)
    if not _wait(lambda: bool(_pointer(work)), child, 300):
        child.kill()
        return dict(ok=False, why='no checkpoint before the damage', tail=_tail(log))
    folder = damage(root)
    rc = _finish(child, 300)
    line = [ln for ln in open(log).read().splitlines() if ln.startswith('error:')]
    named = bool(line) and folder in line[-1]
    return dict(ok=rc == 2 and named and _loadable(_pointer(work)), rc=rc, error=line)


def case_image_deleted(ctx: dict) -> dict:
    """The training images removed after the dataset was listed."""

    def damage(root: str) -> str:
        images = osp.join(root, 'images', 'training')
        shutil.rmtree(images)
        return images

    return _data_fault(ctx, 'image_deleted', damage)


def case_label_resized(ctx: dict) -> dict:
    """Every training annotation replaced by one of another size after the data check."""
    from PIL import Image

    def damage(root: str) -> str:
        folder = osp.join(root, 'annotations', 'training')
        for path in glob.glob(osp.join(folder, '*.png')):
            label = Image.open(path)
            label.resize((label.width // 2, label.height // 2), Image.NEAREST).save(path)
        return folder

    return _data_fault(ctx, 'label_resized', damage)


CASES = {
    'reference': case_reference,
    'kill_rank': case_kill_rank,
    'kill_during_save': case_kill_during_save,
    'sigterm_torchrun': case_sigterm_torchrun,
    'two_runs': case_two_runs,
    'worker_killed': case_worker_killed,
    'image_deleted': case_image_deleted,
    'label_resized': case_label_resized,
}
#: The cases whose resumed weights are compared with the ``reference`` run's.
NEEDS_REFERENCE = ('kill_rank', 'sigterm_torchrun')
#: Written into ``--out`` first: marks the folder as this tool's output (safe to remove).
MARKER = 'fault_check.json'


def order_cases(names: List[str]) -> List[str]:
    """``names`` without repeats, in their order, and ``reference`` first whenever a case
    of :data:`NEEDS_REFERENCE` is among them (or ``reference`` itself is)."""
    names = list(dict.fromkeys(names))
    if 'reference' in names or any(n in NEEDS_REFERENCE for n in names):
        names = ['reference'] + [n for n in names if n != 'reference']
    return names


def _earlier_output(folder: str) -> bool:
    """Whether ``folder`` holds this tool's :data:`MARKER` (a JSON object with
    ``command`` and ``results``)."""
    try:
        with open(osp.join(folder, MARKER)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and 'results' in data and 'command' in data


def out_problem(out: str) -> Optional[str]:
    """Why what ``out`` holds must not be removed, or ``None``: it may be absent, an empty
    folder, or an earlier output of this tool."""
    if not osp.exists(out):
        return None
    if not osp.isdir(out):
        return f'--out {out!r} exists and is not a folder'
    if not os.listdir(out) or _earlier_output(out):
        return None
    return (
        f'--out {out!r} is a folder that is not empty and not an earlier output of '
        f'fault_check.py (no {MARKER} in it); it would be removed: give a new or empty folder'
    )


def _write(out: str, results: dict) -> None:
    with open(osp.join(out, MARKER), 'w') as f:
        json.dump(dict(command=' '.join(sys.argv), results=results), f, indent=1)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the cases; returns the exit status (1 if one failed)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', default='work_dirs/fault_check', help='output folder')
    parser.add_argument('--cases', nargs='+', choices=list(CASES), default=list(CASES))
    args = parser.parse_args(argv)
    problem = out_problem(args.out)
    if problem:
        parser.error(problem)
    if osp.isdir(args.out):  # empty or an earlier output: its entries go, the folder stays
        for entry in os.scandir(args.out):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.remove(entry.path)
    os.makedirs(args.out, exist_ok=True)
    out = osp.abspath(args.out)
    results = {}
    _write(out, results)  # marks the folder as this tool's, even if a case crashes
    root = make_ade(osp.join(out, 'data'))
    ctx = dict(out=out, opts=[*roots(root), *SHRINK, *RUN])
    for name in order_cases(args.cases):
        t0 = time.time()
        results[name] = CASES[name](ctx)
        results[name]['seconds'] = round(time.time() - t0, 1)
        print(f'{name}: {"ok" if results[name]["ok"] else "FAILED"} {json.dumps(results[name])}')
        _write(out, results)
    return 0 if all(r['ok'] for r in results.values()) else 1


if __name__ == '__main__':
    sys.exit(main())
