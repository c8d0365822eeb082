"""lookhere-dense as a user installs it: a wheel, no repository.

The wheel is built from a copy of the sources (``pip wheel --no-deps``; the copy keeps
setuptools' ``build/`` folder out of the checkout), checked (no research code, no
generated data, every config, the kernel source, the entry points, the dependencies) and
installed with ``pip install --no-deps --target`` into a scratch folder. Fresh processes
with that folder first on ``sys.path`` and their working directory outside the repository
then: build the torch-only model, build segmentors from the packaged configs with
``mmseg.apis.init_model``, compile the fused kernel from the packaged ``csrc/`` into the
user cache (a fresh ``$HOME``), and train and test through the installed entry points
(``lookhere-train`` and ``python -m lookhere_dense.test``) on a config named
``lookhere_dense::NAME.py``. The pins of ``pyproject.toml``, ``requirements.txt`` and
``setup.sh`` must agree.
"""

from __future__ import annotations

import email
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest
from tiny_seg import SHRINK, make_ade, roots

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TINY = 'segmenter_lookhere_vit-t_tiny-ade.py'


def _pip(*args: str, cwd: Path) -> None:
    res = subprocess.run(
        [PYTHON, '-m', 'pip', *args, '--no-deps', '--no-build-isolation', '-q'],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def _copy_sources(dst: Path) -> Path:
    """What ``pip wheel .`` reads from a checkout: pyproject, README, LICENSE, the package
    (with its ``.mim/configs`` link) and ``configs/``."""
    src = dst / 'src'
    src.mkdir()
    for name in ('pyproject.toml', 'README.md', 'LICENSE'):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns('__pycache__', '*.pyc', '*.egg-info')
    shutil.copytree(REPO / 'configs', src / 'configs', ignore=ignore)
    shutil.copytree(REPO / 'lookhere_dense', src / 'lookhere_dense', symlinks=True, ignore=ignore)
    return src


@pytest.fixture(scope='module')
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of this checkout."""
    tmp = tmp_path_factory.mktemp('wheel')
    src = _copy_sources(tmp)
    _pip('wheel', '-w', str(tmp / 'dist'), str(src), cwd=tmp)
    (path,) = (tmp / 'dist').glob('lookhere_dense-*.whl')
    return path


@pytest.fixture(scope='module')
def site(wheel: Path, tmp_path_factory) -> Path:
    """The wheel installed with ``--no-deps --target`` into a scratch folder."""
    target = tmp_path_factory.mktemp('site')
    _pip('install', '--target', str(target), str(wheel), cwd=target)
    return target


#: removes the import finder of this checkout's editable install (``setup.sh`` installs
#: one into the venv) from a process, as in a user's environment without the checkout:
#: else a module missing from the wheel would still be found in the repository
NO_EDITABLE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]
"""


def _env(site: Path, home: Path) -> Dict[str, str]:
    """The installed copy first on the path, without the checkout's editable finder
    (:data:`NO_EDITABLE` as ``sitecustomize``); a fresh ``$HOME`` for the kernel cache."""
    hooks = home / 'hooks'
    hooks.mkdir(parents=True, exist_ok=True)
    (hooks / 'sitecustomize.py').write_text(NO_EDITABLE)
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'LOOKHERE_BUILD_DIR')}
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), str(hooks)]),
        HOME=str(home),
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1',
    )
    return env


def _run(args: List[str], site: Path, cwd: Path, timeout: int = 900):
    home = cwd / 'home'
    home.mkdir(exist_ok=True)
    return subprocess.run(
        args, cwd=cwd, env=_env(site, home), capture_output=True, text=True, timeout=timeout
    )


def _repo_configs() -> List[str]:
    return sorted(str(p.relative_to(REPO / 'configs')) for p in (REPO / 'configs').rglob('*.py'))


# -- the wheel ---------------------------------------------------------------------------
def test_wheel_holds_the_library_configs_and_kernel_source_and_nothing_else(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    files = [n for n in names if '.dist-info/' not in n]
    # the library alone: no research/ (a top-level folder of the checkout), no other package
    assert {n.split('/')[0] for n in files} == {'lookhere_dense'}, files
    # no generated data: Python sources, the packaged configs and the kernel source only
    assert {os.path.splitext(n)[1] for n in files} == {'.py', '.cpp'}, files
    assert 'lookhere_dense/lookhere/attention/csrc/fused_tiles.cpp' in files
    shipped = sorted(n[len('lookhere_dense/.mim/configs/') :] for n in files if '/.mim/' in n)
    assert shipped == _repo_configs()
    for module in ('train', 'test', 'timm_models', 'lookhere/vit', 'openmmlab'):
        assert f'lookhere_dense/{module}.py' in files


def test_wheel_declares_dependencies_extras_and_entry_points(wheel: Path):
    with zipfile.ZipFile(wheel) as z:
        meta = email.message_from_bytes(z.read('lookhere_dense-0.1.0.dist-info/METADATA'))
        scripts = z.read('lookhere_dense-0.1.0.dist-info/entry_points.txt').decode()
    requires = meta.get_all('Requires-Dist')
    core = sorted(r.split(';')[0].strip() for r in requires if 'extra ==' not in r)
    assert core == ['ninja', 'numpy<2.5', 'torch>=2.11']
    assert sorted(meta.get_all('Provides-Extra')) == ['dev', 'export', 'openmmlab', 'timm']
    assert 'mmsegmentation==1.2.2; extra == "openmmlab"' in requires
    assert 'timm>=1.0.20; extra == "timm"' in requires
    assert 'lookhere-train = lookhere_dense.train:cli' in scripts
    assert 'lookhere-test = lookhere_dense.test:cli' in scripts
    # the license the metadata declares, with its text
    assert meta['License-Expression'] == 'Apache-2.0'
    with zipfile.ZipFile(wheel) as z:
        text = z.read('lookhere_dense-0.1.0.dist-info/licenses/LICENSE').decode()
    assert 'Apache License' in text and 'Version 2.0, January 2004' in text


def test_the_editable_install_maps_the_package_folder_and_not_research(tmp_path: Path):
    """The checkout's editable install maps the ``lookhere_dense`` folder (setuptools maps
    the package folder, not the package list) and nothing else: ``research/`` is not
    installed, the tools and tests import it from the checkout's root."""
    src = _copy_sources(tmp_path)
    code = "from setuptools import build_meta; print(build_meta.build_editable('ed'))"
    res = subprocess.run(
        [PYTHON, '-c', code], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (path,) = (src / 'ed').glob('*.whl')
    with zipfile.ZipFile(path) as z:
        (finder,) = [n for n in z.namelist() if n.endswith('_finder.py')]
        text = z.read(finder).decode()
    assert f"{{'lookhere_dense': '{src / 'lookhere_dense'}'}}" in text
    assert "'research'" not in text  # no second package mapped


# -- the installed package, outside the repository ---------------------------------------
CHECKS = r"""
import importlib, json, os, sys
site = sys.argv[1]
import lookhere_dense
assert lookhere_dense.__file__.startswith(site), lookhere_dense.__file__
try:
    importlib.import_module('research')
except ModuleNotFoundError:
    pass
else:
    raise AssertionError('research is installed')

import torch
from lookhere_dense.lookhere import create_model
vit = create_model(embed_dims=48, num_layers=2, num_heads=12, out_indices=(1,)).eval()
with torch.no_grad():
    (fmap,) = vit(torch.randn(1, 3, 48, 80))
print('create_model', tuple(fmap.shape))

from lookhere_dense import config_path
from lookhere_dense.lookhere import fused
assert str(fused._SOURCE).startswith(site), fused._SOURCE
if sys.argv[2] == 'kernel':
    fused.load_fused_ops()
    built = sorted(p for p in fused.build_directory().rglob('*.so'))
    assert str(fused.build_directory()).startswith(os.path.expanduser('~')), fused.build_directory()
    print('kernel', [p.name for p in built])

from mmseg.apis import inference_model, init_model
big = init_model(config_path('segmenter_lookhere_ade20k.py'), device='cpu')
assert type(big.backbone).__name__ == 'LookHereViT'
print('init_model', type(big).__name__, big.backbone.embed_dims)
tiny = init_model(config_path('TINY'), device='cpu')
import numpy as np
result = inference_model(tiny, np.random.RandomState(0).randint(0, 255, (96, 160, 3), np.uint8))
print('inference', tuple(result.pred_sem_seg.data.shape))
# a config of one's own built on a shipped one: its absolute path in _base_ (README)
import tempfile
from mmengine.config import Config
mine = os.path.join(tempfile.mkdtemp(), 'mine.py')
with open(mine, 'w') as f:
    f.write(f"_base_ = [{config_path('TINY')!r}]\nmodel = dict(backbone=dict(drop_path_rate=0.0))\n")
inherited = Config.fromfile(mine)
print('inherit', inherited.model.backbone.type, inherited.model.backbone.drop_path_rate)
outside = [m for m, mod in list(sys.modules.items()) if m.startswith('lookhere_dense')
           and not (getattr(mod, '__file__', None) or site).startswith(site)]
assert not outside, outside
assert not any('__editable__' in getattr(f, '__module__', '') for f in sys.meta_path)
""".replace('TINY', TINY)


def _has_compiler() -> bool:
    import importlib.util

    return bool(shutil.which('c++') or shutil.which('g++')) and bool(
        importlib.util.find_spec('ninja')
    )


def test_installed_package_builds_models_configs_and_kernel(site: Path, tmp_path: Path):
    kernel = 'kernel' if _has_compiler() else 'no-kernel'
    res = _run([PYTHON, '-c', CHECKS, str(site), kernel], site, tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    out = res.stdout
    assert 'create_model (1, 48, 3, 5)' in out
    assert 'init_model EncoderDecoder 768' in out or 'init_model LeanEncoderDecoder 768' in out
    assert 'inference (1, 96, 160)' in out
    assert 'inherit LookHereViT 0.0' in out
    if kernel == 'kernel':
        assert re.search(r"kernel \['lookhere_fused_\w+\.so'\]", out), out


def test_installed_entry_points_train_and_test_a_packaged_config(site: Path, tmp_path: Path):
    data = make_ade(tmp_path / 'data', num_train=4, num_val=2)
    work = tmp_path / 'work'
    options = [
        *SHRINK,
        *roots(data),
        'train_cfg.max_iters=2',
        'train_cfg.val_interval=2',
        'default_hooks.checkpoint.interval=2',
    ]
    config = f'lookhere_dense::{TINY}'
    train = [str(site / 'bin' / 'lookhere-train'), config, '--work-dir', str(work)]
    res = _run([*train, '--threads', '1', '--cfg-options', *options], site, tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    ckpt = work / 'iter_2.pth'
    assert ckpt.is_file()
    test = [PYTHON, '-m', 'lookhere_dense.test', config, str(ckpt), '--work-dir', str(work)]
    res = _run([*test, '--threads', '1', '--cfg-options', *options], site, tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert 'mIoU' in res.stdout + res.stderr
    # a name that is not shipped: one line naming it and the near miss
    res = _run([*train[:1], 'lookhere_dense::segmenter_lookhere_vit-t_tiny-ad.py'], site, tmp_path)
    assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr[-3000:]
    assert 'is not shipped with lookhere_dense' in res.stderr
    assert f"did you mean '{TINY}'" in res.stderr


def _readme_commands() -> List[str]:
    """The command lines of README's "Install into your own environment" block."""
    text = (REPO / 'README.md').read_text()
    section = text.split('## Install into your own environment', 1)[1]
    block = section.split('```bash\n', 1)[1].split('```', 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_install_commands_work_outside_the_repository(tmp_path: Path):
    """README's three commands: its ``pip install`` (from a copy of the checkout, with
    ``--no-deps --target``: the dependencies are this environment's), then its two
    ``python -c`` lines in another folder with the installed copy on the path."""
    pip_line, *python_lines = _readme_commands()
    args = shlex.split(pip_line, comments=True)
    assert args[:2] == ['pip', 'install'] and len(python_lines) == 2, _readme_commands()
    src = _copy_sources(tmp_path)
    target = tmp_path / 'site'
    _pip(*args[1:], '--target', str(target), cwd=src)
    outputs = []
    for line in python_lines:
        args = shlex.split(line)
        assert args[0] == 'python', line
        res = _run([PYTHON, *args[1:]], target, tmp_path)
        assert res.returncode == 0, line + res.stderr[-5000:]
        outputs.append(res.stdout.strip().splitlines()[-1])
    assert outputs == ['LookHereViT', '[768, 768, 768, 768]']


# -- in this checkout -------------------------------------------------------------------
def test_config_path_finds_every_shipped_config_and_names_a_missing_one():
    import lookhere_dense

    assert lookhere_dense.config_names() == _repo_configs()
    path = lookhere_dense.config_path('segmenter_lookhere_ade20k.py')
    assert (
        Path(path).read_bytes() == (REPO / 'configs' / 'segmenter_lookhere_ade20k.py').read_bytes()
    )
    assert lookhere_dense.config_path(
        'configs/study/fov_vit_tiny.py'
    ) == lookhere_dense.config_path('lookhere_dense::study/fov_vit_tiny.py')
    with pytest.raises(FileNotFoundError, match="did you mean 'segmenter_lookhere_ade20k.py'"):
        lookhere_dense.config_path('segmenter_lookhere_ade20.py')
    with pytest.raises(FileNotFoundError, match='relative to the shipped configs folder'):
        lookhere_dense.config_path('../pyproject.toml')


def _requirements() -> Dict[str, str]:
    """``requirements.txt`` (and setup.sh's torch / mmcv) as ``{name: specifier}``."""
    reqs = {}
    for line in (REPO / 'requirements.txt').read_text().splitlines():
        line = line.split('#')[0].strip()
        if line:
            name = re.split(r'[<>=!~\[]', line, maxsplit=1)[0]
            reqs[name.lower()] = line[len(name) :]
    setup = (REPO / 'setup.sh').read_text()
    reqs['mmcv'] = '==' + re.search(r'^MMCV_VERSION=([\d.]+)$', setup, re.M).group(1)
    for name, version in re.findall(r'(torch|torchvision)==([\d.]+)', setup):
        assert reqs[name] == f'=={version}', (name, version, 'setup.sh vs requirements.txt')
    return reqs


def test_pyproject_and_requirements_pin_the_same_versions():
    """Every package pyproject names is in requirements.txt / setup.sh, with a version
    that satisfies pyproject's specifier (equal, where pyproject pins one)."""
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip('tomllib')  # Python >= 3.11
    project = tomllib.loads((REPO / 'pyproject.toml').read_text())['project']
    declared = list(project['dependencies'])
    for extra in project['optional-dependencies'].values():
        declared += extra
    reqs = _requirements()
    for text in declared:
        req = Requirement(text)
        name = req.name.lower()
        if name == 'ninja':  # setup.sh installs it with the build tooling
            assert 'ninja' in (REPO / 'setup.sh').read_text()
            continue
        assert name in reqs, f'{name} (pyproject) is not in requirements.txt'
        pinned = reqs[name]
        if pinned.startswith('=='):
            assert req.specifier.contains(pinned[2:]), (text, pinned)
        else:
            assert str(req.specifier) == pinned, (text, pinned)
        if any(s.operator == '==' for s in req.specifier):
            assert pinned == str(req.specifier), (text, pinned)
    names = {Requirement(t).name.lower() for t in declared}
    assert set(reqs) - names <= {'setuptools'}, set(reqs) - names
