"""The LookHere core and the benchmark's ``attention`` group run with torch alone.

Each test runs a fresh interpreter in which importing mmcv, mmengine, mmseg or mmdet (and,
in one variant, timm) fails, as on a machine where they are not installed: a
``sitecustomize`` module on ``PYTHONPATH`` puts an import blocker on ``sys.meta_path``
before anything else runs, so the benchmark's own child processes are blocked too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lookhere_dense.lookhere.flex import flex_available

OPENMMLAB = ('mmcv', 'mmengine', 'mmseg', 'mmdet')

SITECUSTOMIZE = '''
"""Test helper: make the packages named in $LOOKHERE_BLOCKED_IMPORTS unimportable."""
import os
import sys

BLOCKED = frozenset(filter(None, os.environ.get('LOOKHERE_BLOCKED_IMPORTS', '').split(',')))


class BlockedImports:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in BLOCKED:
            raise ModuleNotFoundError(f'blocked for this test: {name}', name=name)
        return None


sys.meta_path.insert(0, BlockedImports())
'''

#: Runs in the blocked interpreter: every CPU backend, window attention, the benchmark's
#: torch-only modules; then checks that no blocked package was loaded.
CORE = """
import sys

import torch

import lookhere_dense.lookhere as lh
from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine, reference_attention
from lookhere_dense.lookhere.flex import flex_available

torch.manual_seed(0)
grid, cls_token = (5, 6), True
eng = LookHereAttentionEngine(PRESETS['lh90'], 2, 12, block_size=7)
q, k, v = (torch.randn(2, 12, 31, 8) for _ in range(3))
ref = eng(q, k, v, 1, grid, cls_token, backend='reference')
bias = eng.grid_bias(grid, q.device).dense(1, cls_token)
torch.testing.assert_close(reference_attention(q, k, v, bias), ref, atol=0, rtol=0)
backends = ['sdpa', 'chunked', 'tiled'] + (['flex'] if flex_available() else [])
with torch.no_grad():
    for backend in backends:
        out = eng(q, k, v, 1, grid, cls_token, backend=backend)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=0)
    eng(q, k, v, 1, grid, cls_token)
    assert eng.last_backend == 'sdpa', eng.last_backend
    for ws in (3, 4):  # 4 pads the grid
        win = eng.window_attention(q, k, v, 0, grid, ws, cls_token)
        assert win.shape == q.shape and bool(torch.isfinite(win).all())
    # one window covering the grid is global attention
    qs, ks, vs = (t[:, :, :25] for t in (q, k, v))
    torch.testing.assert_close(eng.window_attention(qs, ks, vs, 0, (5, 5), 5, False),
                               eng(qs, ks, vs, 0, (5, 5), False, backend='reference'),
                               atol=2e-5, rtol=0)

# the whole model: built, loaded with official weights, run (windows and CLS too)
import os
from lookhere_dense.errors import CheckpointError
from lookhere_dense.lookhere import create_model, LookHereVisionTransformer
ref = os.environ['LOOKHERE_REFERENCE']
io = torch.load(os.path.join(ref, 'official_tiny_halves_none_io.pt'), weights_only=True)
arch = io['model']
model = create_model(os.path.join(ref, 'official_tiny_halves_none.pth'),
                     embed_dims=arch['embed_dim'], num_layers=arch['depth'],
                     num_heads=arch['num_heads'], patch_size=arch['patch_size'],
                     init_values=arch['init_values']).eval()
with torch.no_grad():
    for name, case in io['cases'].items():
        torch.testing.assert_close(model.forward_features(case['input']),
                                   case['forward_features'], atol=1e-4, rtol=0, msg=name)
try:
    create_model(os.path.join(ref, 'official_tiny_halves_none.pth'), embed_dims=96,
                 num_layers=3, num_heads=6, init_values=0.1)
except CheckpointError as err:
    assert 'num_heads=6' in str(err), err
else:
    raise AssertionError('a 12-head file loaded into a 6-head model')
vit = create_model(embed_dims=48, num_layers=4, num_heads=12, out_indices=(1, 3),
                   window_size=3, window_block_indexes=(0, 2), preset='lh45').eval()
with torch.no_grad():
    maps = vit(torch.randn(1, 3, 80, 112))
assert [tuple(m.shape) for m in maps] == [(1, 48, 5, 7)] * 2
encodings = ['abs', 'rope2d', 'rope2d_mixed', 'pape', 'alibi2d', 'ledit', 'none']
if 'timm' not in sys.argv[1]:
    encodings.append('rope_dinov3')
for enc in encodings:
    m = LookHereVisionTransformer(embed_dims=48, num_layers=2, num_heads=12, pos_encoding=enc)
    m.init_weights()
    m(torch.randn(1, 3, 48, 64))[0].sum().backward()

import research.benchmark.attention
import research.benchmark.bias
import research.benchmark.child
import research.benchmark.fresh
import research.benchmark.models
import research.benchmark.official
import research.benchmark.peer
import research.benchmark.report
import research.benchmark.timing
import research.memory

blocked = set(sys.argv[1].split(','))
loaded = sorted(m for m in sys.modules if m.split('.')[0] in blocked)
assert not loaded, loaded
assert 'lookhere_dense.models' not in sys.modules
print('torch-only core ok:', ', '.join(['reference'] + backends + ['window']))
print('torch-only model ok:', ', '.join(encodings))
m = LookHereVisionTransformer(
    embed_dims=48, num_layers=2, num_heads=12, with_cls_token=False, jumbo_tokens=3,
    output_cls_token=True, attn_backend='tiled',
)
m.init_weights()
(fmap, jumbo), = m(torch.randn(1, 3, 512, 512))  # 1024 patches: the tiled backend
assert tuple(jumbo.shape) == (1, 3 * 48), jumbo.shape
(fmap.sum() + jumbo.sum()).backward()
print('torch-only Jumbo ok')
"""


def _env(tmp_path: Path, repo_root: Path, blocked) -> dict:
    site = tmp_path / 'site'
    site.mkdir(exist_ok=True)
    (site / 'sitecustomize.py').write_text(SITECUSTOMIZE)
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([str(site), str(repo_root)])
    env['LOOKHERE_BLOCKED_IMPORTS'] = ','.join(blocked)
    return env


def _run(args, env, cwd, timeout=300):
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )


@pytest.mark.parametrize(
    'blocked', [OPENMMLAB, OPENMMLAB + ('timm',)], ids=['no-openmmlab', 'no-openmmlab-no-timm']
)
def test_core_runs_without_openmmlab(
    blocked, tmp_path: Path, repo_root: Path, reference_dir: Path
):
    env = _env(tmp_path, repo_root, blocked)
    env['LOOKHERE_REFERENCE'] = str(reference_dir)
    probe = (
        'import importlib, sys\n'
        'for name in sys.argv[1:]:\n'
        '    try:\n'
        '        importlib.import_module(name)\n'
        '    except ImportError as err:\n'
        '        print(err)\n'
    )
    proc = _run(['-c', probe, *blocked], env, tmp_path)  # else this test proves nothing
    assert proc.stdout.splitlines() == [f'blocked for this test: {name}' for name in blocked]
    proc = _run(['-c', textwrap.dedent(CORE), ','.join(blocked)], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'torch-only core ok: reference, sdpa, chunked, tiled' in proc.stdout
    if flex_available():
        assert 'tiled, flex, window' in proc.stdout
    assert (
        'torch-only model ok: abs, rope2d, rope2d_mixed, pape, alibi2d, ledit, none' in proc.stdout
    )
    assert 'torch-only Jumbo ok' in proc.stdout


def test_benchmark_torch_sections_run_without_openmmlab_and_timm(tmp_path: Path, repo_root: Path):
    env = _env(tmp_path, repo_root, OPENMMLAB + ('timm',))
    tool = str(repo_root / 'tools' / 'benchmark.py')
    out = tmp_path / 'attention.json'
    proc = _run(
        [tool, '--sections', 'bias', 'vit', 'frame', 'attn', '--quick', '--json', str(out)],
        env,
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res['args']['sections'] == ['bias', 'vit', 'frame', 'attn']
    # the model cases: the torch-only trunk, mmseg's ViT skipped and said so
    vit = res['vit']
    assert {'lookhere', 'nobias'} <= set(vit['seconds']) and 'mmseg_vit' not in vit['seconds']
    assert 'mmseg is not installed' in vit['skipped']['mmseg_vit']
    frame = res['frame']['cases']
    assert set(frame) == {'nobias', 'auto'}, frame
    assert all('error' not in c and c['seconds'] > 0 for c in frame.values()), frame
    bias = res['bias']
    assert 'error' not in bias['ours'] and 'error' not in bias['baseline'], bias
    assert bias['baseline_matches_ours'] is True and bias['speedup_vs_measured'] > 0
    assert set(res['attn']['cases']) == {'64', '256'}
    assert '[bias]' in proc.stdout and '[attn]' in proc.stdout
    # the section that builds mmseg models says what it needs, before running anything,
    # without a traceback
    proc = _run([tool, '--quick'], env, tmp_path)
    assert proc.returncode == 1 and '[bias]' not in proc.stdout
    assert 'section segmenter builds whole mmseg models and needs OpenMMLab' in proc.stderr
    assert 'run --sections bias vit frame attn' in proc.stderr
    assert 'Traceback' not in proc.stderr


def test_the_openmmlab_parts_without_openmmlab_say_what_to_install(
    tmp_path: Path, repo_root: Path
):
    """The training entry point (``lookhere-train`` runs the same ``cli``) and
    ``register_all_modules`` where mmcv / mmengine / mmseg / mmdet are missing: one
    ``error:`` line naming them and the extras (was: an import traceback)."""
    env = _env(tmp_path, repo_root, OPENMMLAB)
    config = 'lookhere_dense::segmenter_lookhere_vit-t_tiny-ade.py'
    proc = _run(
        [
            '-c',
            'import sys; from lookhere_dense.train import cli; sys.argv[1:] = ['
            f'{config!r}]; cli()',
        ],
        env,
        tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        'error: the OpenMMLab parts of lookhere-dense (configs, registries, tools) need '
        'mmengine, mmcv, mmseg, mmdet, not installed here: pip install '
        "'lookhere-dense[openmmlab]'"
    ), proc.stderr[-3000:]
    probe = (
        'import lookhere_dense\n'
        'try:\n'
        '    lookhere_dense.register_all_modules()\n'
        'except ModuleNotFoundError as err:\n'
        '    print(type(err).__name__, err.name)\n'
    )
    proc = _run(['-c', probe], env, tmp_path)
    assert proc.stdout.strip() == 'MissingExtrasError mmengine', proc.stderr[-3000:]
