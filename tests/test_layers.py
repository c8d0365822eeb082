"""The package's layers point one way, and the code is linted and formatted.

* the import contracts of ``pyproject.toml`` (``[tool.importlinter]``): research tooling ->
  apis -> the OpenMMLab glue -> the torch-only model -> checkpoint files -> errors and
  validators; no OpenMMLab (and timm only where it is optional) in the model core; no
  import cycles between siblings -- checked by import-linter (``lint-imports``) on the
  static imports, the ones inside functions included;
* no import cycle through any module at all (a strongly connected component of the import
  graph, from grimp, the graph import-linter uses);
* ``ruff check`` and ``ruff format --check`` (the rules in ``pyproject.toml``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f'{name} is not installed next to {sys.executable} (setup.sh installs it)')
    return str(path)


def test_import_contracts_hold():
    proc = subprocess.run(
        [_tool('lint-imports'), 'pyproject.toml', '--no-cache'],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert 'BROKEN' not in proc.stdout and ' 0 broken' in proc.stdout.replace(',', ''), (
        proc.stdout[-3000:]
    )


def _cycles(graph) -> list:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, order, out = {}, {}, set(), [], [0], []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = order[0]
        order[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph.modules:
                    continue
                if child not in index:
                    index[child] = low[child] = order[0]
                    order[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_no_module_imports_itself_through_others():
    grimp = pytest.importorskip('grimp')
    graph = grimp.build_graph('lookhere_dense', 'research', cache_dir=None)
    # a package's __init__ importing its own submodules is not a cycle unless they import
    # it back; grimp records exactly the import statements, so any component is one
    cycles = _cycles(graph)
    assert not cycles, f'import cycles: {cycles}'


def test_cycle_finder_finds_a_cycle():
    class Graph:  # the part of grimp's graph _cycles reads
        modules = {'a', 'b', 'c', 'd'}
        edges = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}

        def find_modules_directly_imported_by(self, m):
            return self.edges.get(m, set())

    assert _cycles(Graph()) == [['a', 'b', 'c']]


@pytest.mark.parametrize('args', [['check'], ['format', '--check']], ids=['lint', 'format'])
def test_ruff(args):
    env = dict(os.environ, RUFF_NO_CACHE='true')
    proc = subprocess.run(
        [_tool('ruff'), *args, '--no-cache', '.'],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
