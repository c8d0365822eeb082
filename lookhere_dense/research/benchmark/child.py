"""Benchmark cases that run in a fresh interpreter (torch only; the case decides the rest).

A case is a JSON-able dict with a ``kind``; :func:`run_child` starts
``python -m lookhere_dense.research.benchmark.child '<case JSON>'`` and reads the result, the
child's last stdout line that is a JSON object. A fresh process gives every case the
same clean start: peak-memory figures are not inflated by what an earlier case left
behind, and no case inherits another's warm caches.

=============  ==================================================  ==================
kind           what                                                needs
=============  ==================================================  ==================
``bias``       :func:`.bias.bias_case` (one bias construction)     torch (+ numpy)
``frame``      :func:`.models.frame_case` (whole-frame forward)    OpenMMLab
``segmenter``  :func:`.segmenter.segmenter_case` (whole-frame      OpenMMLab
               memory of a config's backbone or model)
=============  ==================================================  ==================
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

__all__ = ['CASE_KINDS', 'run_case', 'run_child']

#: Case kinds a child can run.
CASE_KINDS = ('bias', 'frame', 'segmenter')


def run_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """Run one case in this process (what the child does); returns its result dict."""
    kind = case.get('kind')
    if kind == 'bias':
        from .bias import bias_case
        return bias_case(case)
    if kind == 'frame':
        from .models import frame_case
        return frame_case(case)
    if kind == 'segmenter':
        from .segmenter import segmenter_case
        return segmenter_case(case)
    raise ValueError(f'unknown benchmark case kind {kind!r}; allowed: {list(CASE_KINDS)}')


def _child_env() -> Dict[str, str]:
    """This environment, with the directory of the imported ``lookhere_dense`` first on
    ``PYTHONPATH``: the child runs the same code as the parent (a checkout, not another
    installed copy)."""
    import lookhere_dense
    root = str(Path(lookhere_dense.__file__).resolve().parents[1])
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(p for p in (root, env.get('PYTHONPATH')) if p)
    return env


def run_child(case: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """Run ``case`` in a fresh interpreter.

    Args:
        case: a dict with ``kind`` (one of :data:`CASE_KINDS`) and the case's settings.
        timeout: seconds before the child is abandoned.

    Returns:
        The child's result, or ``case`` plus ``error`` (a one-line reason: timeout, exit
        status and the last lines of its stderr) when it failed.
    """
    cmd = [sys.executable, '-m', 'lookhere_dense.research.benchmark.child', json.dumps(case)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=_child_env())
    except subprocess.TimeoutExpired:
        return dict(case, error=f'timed out after {timeout:.0f} s')
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return dict(case, error=f'exit {proc.returncode}: ' + ' | '.join(tail))
    return json.loads(lines[-1])


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m lookhere_dense.research.benchmark.child '<case JSON>'``: print the result JSON."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        raise SystemExit('usage: python -m lookhere_dense.research.benchmark.child \'<case JSON>\'')
    print(json.dumps(run_case(json.loads(args[0]))))


if __name__ == '__main__':
    main()
