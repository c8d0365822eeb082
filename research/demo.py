"""The end-to-end demo on CPU (``tools/demo.py``): tiny datasets, train, validate,
extrapolation report.

1. :func:`generate_dataset` writes a tiny ADE20K-layout dataset (and a Cityscapes-layout
   one) of procedurally drawn scenes (:mod:`research.datasets.synthetic_seg`), stamped
   with the settings that made it (:data:`STAMP`);
2. :func:`run_demo` trains a LookHere ViT-T Segmenter on each
   (:func:`lookhere_dense.apis.train.train_model`: mmengine Runner, mmseg's IoUMetric
   validation at the end), runs the extrapolation report on each checkpoint
   (:func:`research.extrapolation.extrapolation_report`), writes the
   field-of-view view of the Cityscapes layout (the whole frame vs sliding windows of the
   training crop at the frame's own pixel scale, :func:`write_fov_view`) and writes
   ``<work_dir>/demo_summary.json`` with the validation mIoU next to chance levels
   (:func:`research.chance.chance_levels`) of the same validation labels
   and the environment (:func:`environment`).

Reproducible: on one machine and software environment the demo gives the same numbers on
every run (tested: ``tests/test_tools_seg.py``). The data are written from fixed seeds
and reused only when their stamp matches; training runs with ``randomness=dict(seed=0)``
(mmengine seeds Python, NumPy, PyTorch, the sampler and every dataloader worker from it)
on ``--threads`` PyTorch threads. Other CPUs, thread counts or library builds round
floating point differently, and 300 steps from scratch amplify that (see
docs/segmentation.md).
"""

from __future__ import annotations

import functools
import gc
import glob
import json
import os
import os.path as osp
import time
from typing import Any, Callable, Dict, Optional, Sequence

from lookhere_dense.errors import ConfigError

__all__ = [
    'DEMOS',
    'STAMP',
    'DemoDataError',
    'dataset_digest',
    'generate_dataset',
    'last_val_miou',
    'environment',
    'write_fov_view',
    'run_demo',
]

#: Per dataset: its name, config, dataset folder under the data root, validation labels
#: (glob), how the labels are read, default extrapolation tests and the tests of the
#: field-of-view view (:func:`write_fov_view`).
DEMOS: Dict[str, Dict[str, Any]] = {
    'ade20k': dict(
        layout='ADE20K',
        config='configs/segmenter_lookhere_vit-t_tiny-ade.py',
        folder='ade/ADEChallengeData2016',
        val_labels='annotations/validation/*.png',
        reduce_zero_label=True,
        tests=['slide@x1', 'whole@x1', 'whole@x1.5', 'whole@x2', 'whole@x3'],
    ),
    'cityscapes': dict(
        layout='Cityscapes',
        config='configs/segmenter_lookhere_vit-t_tiny-cityscapes.py',
        folder='cityscapes',
        val_labels='gtFine/val/*/*_gtFine_labelTrainIds.png',
        reduce_zero_label=False,
        tests=['slide@x1', 'whole@x1', 'whole@x2'],
        fov_view=('slide@x1', 'whole@x1'),
    ),
}
#: the file in a generated dataset's root that records what wrote it
STAMP = 'lookhere_demo_data.json'
#: version of the demo datasets' content (bump when the generator's output changes)
DATA_VERSION = 1

_print = functools.partial(print, flush=True)


class DemoDataError(ConfigError):
    """A dataset folder the demo must not use or overwrite (a ``ConfigError``: the tools
    print its message without a traceback)."""


def _stamp(name: str, num_train: Optional[int], num_val: Optional[int]) -> Dict[str, Any]:
    """What the demo's generator writes for ``name`` (the content of :data:`STAMP`)."""
    import inspect

    from .datasets.synthetic_seg import make_ade20k_like, make_cityscapes_like

    make = make_ade20k_like if name == 'ade20k' else make_cityscapes_like
    defaults = {
        k: v.default
        for k, v in inspect.signature(make).parameters.items()
        if v.default is not inspect.Parameter.empty
    }
    settings = dict(
        defaults,
        **{k: v for k, v in (('num_train', num_train), ('num_val', num_val)) if v is not None},
    )
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}
    return dict(
        generator=f'research.datasets.synthetic_seg.{make.__name__}',
        version=DATA_VERSION,
        settings=settings,
    )


def dataset_digest(root: str) -> str:
    """SHA-256 over the relative paths and bytes of every file under ``root`` (sorted; the
    :data:`STAMP` file excluded): equal digests, equal data."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(glob.glob(osp.join(root, '**', '*'), recursive=True)):
        if osp.isfile(path) and osp.basename(path) != STAMP:
            digest.update(osp.relpath(path, root).encode() + b'\0')
            with open(path, 'rb') as f:
                digest.update(f.read())
    return digest.hexdigest()


def generate_dataset(
    name: str,
    data_root: str,
    num_train: Optional[int] = None,
    num_val: Optional[int] = None,
    regenerate: bool = False,
    log: Callable[[str], None] = _print,
) -> str:
    """Write the tiny dataset of demo ``name`` into ``data_root``, stamped with the
    settings that made it and the digest of its files (:data:`STAMP`,
    :func:`dataset_digest`).

    A folder whose stamp matches (settings and digest) is kept (unless ``regenerate``); one
    the demo wrote with other settings, or whose files changed since, is deleted and
    written anew, so stale images never mix in; a folder without a stamp (another dataset,
    or an older demo) is left alone and is an error.

    Args:
        name: a key of :data:`DEMOS`.
        data_root: folder the configs' ``data_root`` live in (``data``).
        num_train / num_val: images to generate. Default: None (96 / 16 ADE20K, 48 / 8
            Cityscapes).
        regenerate: rewrite a stamped dataset even when its stamp matches. Default: False.
        log: progress lines. Default: print.

    Returns:
        The dataset's root folder.

    Raises:
        DemoDataError: the folder exists without a stamp.
    """
    import shutil

    from .datasets.synthetic_seg import make_ade20k_like, make_cityscapes_like

    root = osp.join(data_root, DEMOS[name]['folder'])
    stamp = _stamp(name, num_train, num_val)
    stamp_path = osp.join(root, STAMP)
    if osp.isdir(root):
        if not osp.isfile(stamp_path):
            raise DemoDataError(
                f'{root!r} exists but was not written by this demo (no {STAMP}): it may be a '
                'real dataset or the output of an older demo, and training on it would not '
                'give the documented numbers. Move it away (or delete it if it is an old demo '
                'folder), or give the demo another folder with --data-root DIR.'
            )
        with open(stamp_path) as f:
            old = json.load(f)
        digest = old.pop('sha256', None)
        if old == stamp and not regenerate:
            if digest == dataset_digest(root):
                log(
                    f'[demo] {name}: using the dataset in {root} (written with the same '
                    'settings; --regenerate rewrites it)'
                )
                return root
            log(
                f'[demo] {name}: the files in {root} changed since the demo wrote them: '
                'writing them anew'
            )
        shutil.rmtree(root)  # ours (stamped): no stale files from other settings survive
    kw = {k: v for k, v in (('num_train', num_train), ('num_val', num_val)) if v is not None}
    t0 = time.time()
    make = make_ade20k_like if name == 'ade20k' else make_cityscapes_like
    root = str(make(data_root, **kw))
    with open(osp.join(root, STAMP), 'w') as f:
        json.dump(dict(stamp, sha256=dataset_digest(root)), f, indent=1)
    log(f'[demo] {name}: wrote a tiny dataset in {root} ({time.time() - t0:.1f} s)')
    return root


def last_val_miou(log_dir: str) -> float:
    """The last validation mIoU a Runner wrote to ``<log_dir>/vis_data/scalars.json``.

    Raises:
        RuntimeError: the run never validated.
    """
    last = None
    with open(osp.join(log_dir, 'vis_data', 'scalars.json')) as f:
        for line in f:
            rec = json.loads(line)
            if 'mIoU' in rec:
                last = float(rec['mIoU'])
    if last is None:
        raise RuntimeError(f'no validation mIoU in {log_dir}: did training validate?')
    return last


def environment() -> Dict[str, Any]:
    """What a demo's numbers depend on besides the code: library versions, PyTorch
    threads, the CPU and the git commit of the checkout (None outside git)."""
    import platform
    import subprocess

    import cv2
    import mmcv
    import mmengine
    import mmseg
    import numpy
    import torch

    from . import REPO

    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            cpu = next(
                (ln.split(':', 1)[1].strip() for ln in f if ln.startswith('model name')), cpu
            )
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ['git', '-C', str(REPO), 'describe', '--always', '--dirty'],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ''
    return dict(
        commit=commit or None,
        python=platform.python_version(),
        torch=torch.__version__,
        numpy=numpy.__version__,
        opencv=cv2.__version__,
        mmcv=mmcv.__version__,
        mmengine=mmengine.__version__,
        mmseg=mmseg.__version__,
        torch_threads=torch.get_num_threads(),
        cpu=cpu,
        # the vector instructions torch's CPU kernels use (AVX512, AVX2, ...): two CPUs of
        # one name ("AMD EPYC") can differ here, and their float32 rounding with them
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_count=os.cpu_count(),
        device='cuda:' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu',
    )


def write_fov_view(
    report: Dict[str, Any], tests: Sequence[str], out_dir: str, title: str
) -> Optional[Dict[str, Any]]:
    """The field-of-view view of an extrapolation report: its rows ``tests`` (the whole
    frame and sliding windows of the training crop, both at the frame's own pixel scale)
    as ``fov_view.md`` (Markdown table), ``fov_view.json`` and ``fov_view.png`` (mIoU, time
    and peak memory, :func:`~research.extrapolation.plot_report`).

    Returns:
        ``dict(rows, table, json, png, md)``; None when the report lacks one of ``tests``.
    """
    from .extrapolation import format_table, plot_report

    by_test = {r['test']: r for r in report['rows']}
    if not all(t in by_test for t in tests):
        return None
    rows = [by_test[t] for t in tests]
    grid = tuple(report['train_grid']) if report.get('train_grid') else None
    table = format_table(rows, grid)
    paths = {k: osp.join(out_dir, f'fov_view.{k}') for k in ('json', 'png', 'md')}
    with open(paths['md'], 'w') as f:
        f.write(f'{title}\n\n{table}\n')
    plot_report(rows, paths['png'], title, grid)
    view = dict(rows=rows, table=table, **paths)
    with open(paths['json'], 'w') as f:
        json.dump(dict(view, title=title, checkpoint=report.get('checkpoint')), f, indent=2)
    return view


def run_demo(
    roots: Dict[str, str],
    work_dir: str = 'work_dirs/demo',
    iters: int = 300,
    tests: Optional[Sequence[str]] = None,
    cfg_options: Sequence[str] = (),
    log: Callable[[str], None] = _print,
) -> Dict[str, Any]:
    """Train, validate and report every demo of ``roots``; write
    ``<work_dir>/demo_summary.json``.

    Args:
        roots: ``{demo name: dataset root}`` (:func:`generate_dataset`).
        work_dir: checkpoints, logs and reports (``<work_dir>/<name>``). Default:
            ``'work_dirs/demo'``.
        iters: training iterations per dataset. Default: 300.
        tests: extrapolation tests. Default: None (the demo's own, :data:`DEMOS`).
        cfg_options: extra ``KEY=VALUE`` overrides for training and the report (e.g. to
            shrink the model in tests). Default: none.
        log: progress lines. Default: print.

    Returns:
        The summary (``iters``, ``environment`` (:func:`environment`), ``datasets: {name:
        {config, data_sha256, checkpoint, train_seconds, report_seconds, val_mIoU, chance,
        report_json, report_png, rows}}``, plus ``fov_view`` (:func:`write_fov_view`) for
        demos that name one), as written. ``data_sha256`` (:func:`dataset_digest`) tells
        whether two runs trained on the same data.
    """
    import lookhere_dense

    lookhere_dense.register_all_modules()

    from lookhere_dense.apis.cli import parse_cfg_options
    from lookhere_dense.apis.train import train_model

    from . import REPO
    from .chance import chance_levels
    from .extrapolation import extrapolation_report

    summary: Dict[str, Any] = dict(iters=iters, environment=environment(), datasets={})
    for name, root in roots.items():
        demo = DEMOS[name]
        # relative when run from the repository root, so the reports name it portably
        cfg_path = demo['config'] if osp.isfile(demo['config']) else osp.join(REPO, demo['config'])
        work = osp.join(work_dir, name)
        roots_opts = [
            f'{split}_dataloader.dataset.data_root={root}' for split in ('train', 'val', 'test')
        ]
        iter_opts = [
            f'train_cfg.max_iters={iters}',
            f'train_cfg.val_interval={iters}',
            f'default_hooks.checkpoint.interval={iters}',
        ]
        t0 = time.time()
        log(f'[demo] {name}: training {iters} iterations with tools/train.py')
        runner = train_model(
            cfg_path,
            work_dir=work,
            cfg_options=parse_cfg_options([*roots_opts, *iter_opts, *cfg_options]),
        )
        log_dir = runner.log_dir
        del runner  # frees the model, optimizer and dataloader workers before the report
        gc.collect()
        train_s = time.time() - t0
        ckpt = osp.join(work, f'iter_{iters}.pth')
        demo_tests = list(tests or demo['tests'])
        t0 = time.time()
        log(f'[demo] {name}: extrapolation report with tools/extrapolate.py')
        report_opts = [*roots_opts, *cfg_options]
        report = extrapolation_report(
            cfg_path,
            ckpt,
            demo_tests,
            out_dir=work,
            replace=True,  # the demo's own folder: a rerun with other --iters replaces it
            cfg_options=parse_cfg_options(report_opts),
            command='python tools/extrapolate.py '
            + ' '.join(
                [
                    cfg_path,
                    ckpt,
                    '--out-dir',
                    work,
                    '--tests',
                    *demo_tests,
                    '--cfg-options',
                    *report_opts,
                ]
            ),
        )
        labels = sorted(glob.glob(osp.join(root, demo['val_labels'])))
        data_sha256 = dataset_digest(root)
        entry = dict(
            config=demo['config'],
            data_sha256=data_sha256,
            checkpoint=ckpt,
            train_seconds=round(train_s, 1),
            report_seconds=round(time.time() - t0, 1),
            val_mIoU=last_val_miou(log_dir),
            chance=chance_levels(labels, demo['reduce_zero_label']),
            report_json=report['json'],
            report_png=report['png'],
            rows=report['rows'],
        )
        if demo.get('fov_view'):
            view = write_fov_view(
                report,
                demo['fov_view'],
                work,
                f'{demo["layout"]} layout, field of view: the whole frame in '
                'one pass vs sliding windows of the training crop, same '
                'pixel scale',
            )
            if view is not None:
                entry['fov_view'] = dict(table=view['table'], json=view['json'], png=view['png'])
                sizes = {f'{r["input_h"]}x{r["input_w"]}' for r in view['rows'] if 'input_h' in r}
                shown = f' ({", ".join(sorted(sizes))} frames)' if sizes else ''
                log(
                    f'[demo] {name}: field-of-view view{shown}: {view["png"]} (table in the summary)'
                )
        summary['datasets'][name] = entry
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, 'demo_summary.json')
    with open(path, 'w') as f:
        json.dump(summary, f, indent=2)
    return summary
