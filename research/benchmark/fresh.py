"""Benchmark cases in a fresh interpreter (torch only; the case decides the rest).

A case is a JSON-able dict with a ``kind`` (:data:`~.child.CASE_KINDS`); :func:`run_child`
starts ``python -m research.benchmark.child '<case JSON>'`` and reads the
result, the child's last stdout line that is a JSON object. A fresh process gives every
case the same clean start: peak-memory figures are not inflated by what an earlier case
left behind, and no case inherits another's warm caches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

__all__ = ['run_child', 'CHILD_MODULE']

#: the module the child runs (:mod:`.child`), by name: this module does not import it
CHILD_MODULE = 'research.benchmark.child'


def _child_env() -> Dict[str, str]:
    """This environment, with the folders of the imported ``research`` and ``lookhere_dense``
    first on ``PYTHONPATH``: the child runs the same code as the parent (a checkout, not
    another installed copy), and finds ``research`` (never installed) wherever it starts."""
    import lookhere_dense

    roots = [str(Path(__file__).resolve().parents[2])]  # the folder holding research/
    library = str(Path(lookhere_dense.__file__).resolve().parents[1])
    if library not in roots:
        roots.append(library)
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(p for p in (*roots, env.get('PYTHONPATH')) if p)
    return env


def run_child(case: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """Run ``case`` in a fresh interpreter.

    Args:
        case: a dict with ``kind`` (one of :data:`~.child.CASE_KINDS`) and the case's settings;
            ``child_env`` (optional): variables set for the child (``TRITON_INTERPRET``).
        timeout: seconds before the child is abandoned.

    Returns:
        The child's result, or ``case`` plus ``error`` (a one-line reason: timeout, exit
        status and the last lines of its stderr) and, where it exited, ``stderr_tail``
        (the last 4000 characters of its stderr: the whole traceback) when it failed.
    """
    cmd = [sys.executable, '-m', CHILD_MODULE, json.dumps(case)]
    env = {**_child_env(), **(case.get('child_env') or {})}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(case, error=f'timed out after {timeout:.0f} s')
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return dict(
            case,
            error=f'exit {proc.returncode}: ' + ' | '.join(tail),
            stderr_tail=(proc.stderr or '')[-4000:],
        )
    return json.loads(lines[-1])
