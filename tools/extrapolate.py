#!/usr/bin/env python
"""Evaluate one segmentation checkpoint at several test resolutions: the extrapolation report.

For every test (``MODE@SIZE``) the config's test pipeline resizes the images to SIZE and
the model predicts the whole image at once (``whole``) or in windows of the config's
slide crop (``slide``); mmseg's ``IoUMetric`` scores it. The report gives mIoU, the patch
grid the backbone saw (vs the training grid), time per image and peak memory, as a table
on stdout, a JSON file and a PNG plot.

SIZE is ``x<f>`` (the config's test scale times f), ``<S>`` (short side S px, aspect
kept) or ``<H>x<W>`` (exactly H x W). Examples::

    # ADE20K: short side 512 / 768 / 1024 / 1536, whole image, plus the usual slide test
    python tools/extrapolate.py configs/segmenter_lookhere_ade20k.py CKPT \\
        --tests slide@x1 whole@512 whole@768 whole@1024 whole@1536
    # Cityscapes: slide-768 vs whole 1024x2048 vs whole 2048x4096 (upsampled)
    python tools/extrapolate.py configs/segmenter_lookhere_cityscapes.py CKPT \\
        --tests slide@1024x2048 whole@1024x2048 whole@2048x4096
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import os.path as osp
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DEFAULT_TESTS = ('slide@x1', 'whole@x1', 'whole@x1.5', 'whole@x2', 'whole@x3')
_SPEC = re.compile(r'^(whole|slide)@(?:x(?P<f>\d+(?:\.\d+)?)|(?P<h>\d+)x(?P<w>\d+)|(?P<s>\d+))$')


@dataclass(frozen=True)
class TestSpec:
    """One test: inference ``mode`` and how the test pipeline resizes.

    Attributes:
        text: the spec as written (``whole@x2``).
        mode: ``'whole'`` or ``'slide'``.
        factor: multiply the config's test ``Resize`` scale (or None).
        short_side: resize to this short side, aspect kept (or None).
        size: resize to exactly ``(H, W)`` (or None).
    """

    text: str
    mode: str
    factor: Optional[float] = None
    short_side: Optional[int] = None
    size: Optional[Tuple[int, int]] = None


def parse_spec(text: str) -> TestSpec:
    """``'whole@x2'`` / ``'slide@512'`` / ``'whole@1024x2048'`` -> :class:`TestSpec`.

    Raises:
        lookhere_dense.swap.ConfigError: naming the accepted forms.
    """
    from lookhere_dense.swap import ConfigError

    m = _SPEC.match(text.strip())
    if not m:
        raise ConfigError(f'bad test {text!r}: write MODE@SIZE with MODE whole or slide and '
                         'SIZE x<factor> (x2), <short side> (768) or <H>x<W> (1024x2048)')
    mode = m.group(1)
    if m.group('f'):
        spec = TestSpec(text, mode, factor=float(m.group('f')))
        values = [spec.factor]
    elif m.group('s'):
        spec = TestSpec(text, mode, short_side=int(m.group('s')))
        values = [spec.short_side]
    else:
        spec = TestSpec(text, mode, size=(int(m.group('h')), int(m.group('w'))))
        values = list(spec.size)
    if min(values) <= 0:
        raise ConfigError(f'bad test {text!r}: the size must be positive')
    return spec


def _is(t: Dict[str, Any], name: str) -> bool:
    return str(t.get('type', '')).split('.')[-1] == name


def spec_pipeline(pipeline: Sequence[Dict[str, Any]], spec: TestSpec) -> List[Dict[str, Any]]:
    """The test pipeline with its ``Resize`` set for ``spec`` (inserted after the image
    loading when the config has none)."""
    pipeline = [copy.deepcopy(dict(t)) for t in pipeline]
    idx = next((i for i, t in enumerate(pipeline) if _is(t, 'Resize')), None)
    old = pipeline[idx] if idx is not None else None
    if spec.factor is not None:
        if old is None or old.get('scale') is None:
            from lookhere_dense.swap import ConfigError
            raise ConfigError(f'{spec.text}: the test pipeline has no Resize scale to '
                             'multiply; give the size in px (e.g. whole@512)')
        sw, sh = old['scale'] if not isinstance(old['scale'], int) else (old['scale'],) * 2
        new = dict(type='Resize', scale=(round(sw * spec.factor), round(sh * spec.factor)),
                   keep_ratio=old.get('keep_ratio', False))
    elif spec.short_side is not None:
        new = dict(type='Resize', scale=(1 << 20, spec.short_side), keep_ratio=True)
    else:
        h, w = spec.size
        new = dict(type='Resize', scale=(w, h), keep_ratio=False)
    if idx is not None:
        pipeline[idx] = new
    else:
        load = next((i for i, t in enumerate(pipeline) if _is(t, 'LoadImageFromFile')), 0)
        pipeline.insert(load + 1, new)
    return pipeline


def slide_settings(cfg) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """``(crop, stride)`` for slide tests: the config's slide ``test_cfg``, else the
    training crop (``data_preprocessor.size``) with a 2/3 stride."""
    tc = cfg.model.get('test_cfg') or {}
    if tc.get('mode') == 'slide' and tc.get('crop_size'):
        return tuple(tc['crop_size']), tuple(tc.get('stride') or tc['crop_size'])
    size = (cfg.model.get('data_preprocessor') or {}).get('size')
    if not size:
        from lookhere_dense.swap import ConfigError
        raise ConfigError('slide tests need a crop: the config has neither a slide test_cfg '
                         'nor model.data_preprocessor.size')
    crop = tuple(size)
    return crop, tuple(max(1, c * 2 // 3) for c in crop)


class PeakMemory:
    """Peak memory while a block runs: CUDA peak allocated bytes on a GPU, else the
    process's peak resident set size (sampled every 5 ms)."""

    def __init__(self, device: str):
        self.device = device
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = None

    @staticmethod
    def _rss_mb() -> float:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2 ** 20

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, self._rss_mb())
            time.sleep(0.005)

    def __enter__(self) -> 'PeakMemory':
        import torch
        if self.device.startswith('cuda'):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        elif osp.exists('/proc/self/statm'):
            self.peak_mb = self._rss_mb()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        import torch
        if self.device.startswith('cuda'):
            torch.cuda.synchronize()
            self.peak_mb = torch.cuda.max_memory_allocated() / 2 ** 20
        elif self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak_mb = max(self.peak_mb, self._rss_mb())


def release_memory(model) -> None:
    """Start a test from a clean slate: empty the LookHere bias caches (each test pays for
    its own biases), collect garbage and hand freed heap back to the OS, so the peak
    memory of one test does not carry the previous test's leftovers."""
    import gc

    import torch
    for module in model.modules():
        engine = getattr(module, 'lookhere', None)
        if engine is not None and callable(getattr(engine, 'reset', None)):
            engine.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        import ctypes
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _silence_metric_tables():
    """IoUMetric logs a 150-row per-class table per test; keep only warnings."""
    import logging
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    old = logger.level
    logger.setLevel(logging.WARNING)
    return logger, old


def evaluate_spec(model, cfg, spec: TestSpec, split: str, device: str,
                  max_images: Optional[int], patch_size: int) -> Dict[str, Any]:
    """Run one test; returns its report row."""
    import torch
    from mmengine.config import ConfigDict
    from mmengine.evaluator import Evaluator
    from mmengine.runner import Runner
    from tqdm import tqdm

    dl_cfg = copy.deepcopy(cfg.get(f'{split}_dataloader'))
    dl_cfg['dataset']['pipeline'] = spec_pipeline(dl_cfg['dataset']['pipeline'], spec)
    dl_cfg['batch_size'] = 1
    dl_cfg['persistent_workers'] = False
    dl_cfg['num_workers'] = min(int(dl_cfg.get('num_workers', 0)), 2)
    if max_images:
        dl_cfg['dataset']['indices'] = max_images
    loader = Runner.build_dataloader(dl_cfg)
    evaluator = Evaluator(copy.deepcopy(cfg.get(f'{split}_evaluator')))
    evaluator.dataset_meta = loader.dataset.metainfo
    if spec.mode == 'whole':
        model.test_cfg = ConfigDict(mode='whole')
    else:
        crop, stride = slide_settings(cfg)
        model.test_cfg = ConfigDict(mode='slide', crop_size=crop, stride=stride)
    seconds, shapes = [], []
    release_memory(model)
    with PeakMemory(device) as mem:
        for data in tqdm(loader, desc=f'{spec.text:>16}', unit='img', leave=False,
                         dynamic_ncols=True, disable=None):  # no bars in logs
            t0 = time.perf_counter()
            with torch.no_grad():
                outputs = model.test_step(data)
            if device.startswith('cuda'):
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
            shapes.append(tuple(outputs[0].metainfo['img_shape'][:2]))
            evaluator.process(data_samples=outputs, data_batch=data)
    logger, level = _silence_metric_tables()
    try:
        metrics = evaluator.evaluate(len(loader.dataset))
    finally:
        logger.setLevel(level)
    hs = sorted(s[0] for s in shapes)
    ws = sorted(s[1] for s in shapes)
    h, w = hs[len(hs) // 2], ws[len(ws) // 2]
    if spec.mode == 'slide':
        crop, _ = slide_settings(cfg)
        grid_h, grid_w = (math.ceil(min(c, d) / patch_size) for c, d in zip(crop, (h, w)))
    else:
        grid_h, grid_w = math.ceil(h / patch_size), math.ceil(w / patch_size)
    return dict(
        test=spec.text, mode=spec.mode, input_h=h, input_w=w, grid_h=grid_h, grid_w=grid_w,
        mIoU=float(metrics.get('mIoU', float('nan'))),
        aAcc=float(metrics.get('aAcc', float('nan'))),
        mAcc=float(metrics.get('mAcc', float('nan'))),
        sec_per_img=sum(seconds) / max(1, len(seconds)), peak_mem_mb=mem.peak_mb,
        memory_kind='cuda_max_allocated' if device.startswith('cuda') else 'process_rss',
        images=len(seconds))


def format_table(rows: List[Dict[str, Any]], train_grid: Optional[Tuple[int, int]]) -> str:
    """The report rows as a Markdown table."""
    mem = 'peak GPU MB' if rows and rows[0]['memory_kind'] == 'cuda_max_allocated' \
        else 'peak RSS MB'
    lines = [f'| test | input (median HxW) | patch grid | mIoU | aAcc | s / img | {mem} |',
             '|---|---|---|---|---|---|---|']
    for r in rows:
        grid = f"{r['grid_h']}x{r['grid_w']}"
        if r['mode'] == 'slide':
            grid += ' (windows)'
        lines.append(f"| {r['test']} | {r['input_h']}x{r['input_w']} | {grid} | "
                     f"{r['mIoU']:.2f} | {r['aAcc']:.2f} | {r['sec_per_img']:.3f} | "
                     f"{r['peak_mem_mb']:.0f} |")
    if train_grid:
        lines.append(f'\ntraining crop grid: {train_grid[0]}x{train_grid[1]} patches')
    return '\n'.join(lines)


def plot_report(rows: List[Dict[str, Any]], path: str, title: str,
                train_grid: Optional[Tuple[int, int]]) -> None:
    """PNG: mIoU vs test (patch grid), and time / memory per test."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    labels = [f"{r['test']}\n{r['input_h']}x{r['input_w']}\ngrid {r['grid_h']}x{r['grid_w']}"
              for r in rows]
    x = list(range(len(rows)))
    colours = ['tab:orange' if r['mode'] == 'slide' else 'tab:blue' for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(10.0, 2.4 * len(rows) + 2), 4.8))
    ax1.bar(x, [r['mIoU'] for r in rows], color=colours)
    for xi, r in zip(x, rows):
        ax1.annotate(f"{r['mIoU']:.1f}", (xi, r['mIoU']), ha='center', va='bottom', fontsize=9)
    ax1.set_xticks(x, labels, fontsize=8)
    ax1.set_ylabel('mIoU (%)')
    ax1.set_ylim(0, max(100, max((r['mIoU'] for r in rows), default=0) * 1.1))
    note = f' (trained on {train_grid[0]}x{train_grid[1]} crops)' if train_grid else ''
    ax1.set_title('mIoU per test' + note, fontsize=10)
    ax2.plot(x, [r['sec_per_img'] for r in rows], 'o-', color='tab:green', label='s / image')
    ax2.set_ylabel('seconds per image', color='tab:green')
    ax2.set_xticks(x, labels, fontsize=8)
    ax3 = ax2.twinx()
    kind = 'peak GPU MB' if rows and rows[0]['memory_kind'] == 'cuda_max_allocated' \
        else 'peak RSS MB'
    ax3.plot(x, [r['peak_mem_mb'] for r in rows], 's--', color='tab:red', label=kind)
    ax3.set_ylabel(kind, color='tab:red')
    ax2.set_title('cost per test', fontsize=10)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    from mmengine.config import DictAction

    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='the segmentation config the checkpoint was trained with')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('--tests', nargs='+', default=list(DEFAULT_TESTS), metavar='MODE@SIZE',
                        help='tests to run, in order (default: %(default)s); MODE whole or '
                        'slide, SIZE x<factor of the config test scale>, <short side px> '
                        'or <H>x<W>')
    parser.add_argument('--split', choices=['test', 'val'], default='test',
                        help='which dataloader of the config to use (default: test)')
    parser.add_argument('--max-images', type=int, default=None,
                        help='evaluate only the first N images of the split')
    parser.add_argument('--out-dir', default=None,
                        help='folder for extrapolation.json / extrapolation.png (default: '
                        'work_dirs/<config name>/extrapolation)')
    parser.add_argument('--name', default='extrapolation',
                        help='file name stem of the JSON / PNG (default: extrapolation)')
    parser.add_argument('--device', default=None,
                        help='cpu or cuda[:N] (default: cuda when available, else cpu)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries, e.g. test_dataloader.dataset.data_root=...')
    from lookhere_dense.cli import add_threads_arg
    add_threads_arg(parser)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run the report; returns the JSON content."""
    from lookhere_dense.cli import quiet_known_warnings
    quiet_known_warnings()
    import lookhere_dense
    lookhere_dense.register_all_modules()
    import torch
    from mmengine.registry import init_default_scope

    from lookhere_dense.cli import build_model_from_checkpoint, load_config, preflight
    from lookhere_dense.swap import ConfigError

    args = parse_args(argv)
    from lookhere_dense.cli import apply_threads
    apply_threads(args.threads)
    specs = [parse_spec(t) for t in args.tests]
    if not osp.isfile(args.checkpoint):
        raise FileNotFoundError(f'checkpoint {args.checkpoint!r} not found')
    cfg = load_config(args.config, args.cfg_options)
    scope = cfg.get('default_scope') or 'mmseg'
    if scope != 'mmseg':
        raise ConfigError('extrapolate.py reports segmentation (mmseg) configs; this one '
                          f'has default_scope={scope!r}')
    init_default_scope(scope)
    preflight(cfg, (args.split,), check_pretrained=False)
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')

    model, _ = build_model_from_checkpoint(cfg, args.checkpoint, device)
    patch = int(cfg.model.get('backbone', {}).get('patch_size', 16))
    size = (cfg.model.get('data_preprocessor') or {}).get('size')
    train_grid = tuple(math.ceil(s / patch) for s in size) if size else None

    rows = []
    print(f'{len(specs)} tests on the {args.split} split, device {device}', flush=True)
    for spec in specs:
        row = evaluate_spec(model, cfg, spec, args.split, device, args.max_images, patch)
        rows.append(row)
        print(f"{row['test']:>18}: mIoU {row['mIoU']:6.2f}  input {row['input_h']}x"
              f"{row['input_w']}  grid {row['grid_h']}x{row['grid_w']}  "
              f"{row['sec_per_img']:.3f} s/img  peak {row['peak_mem_mb']:.0f} MB", flush=True)

    name = osp.splitext(osp.basename(args.config.split('::')[-1]))[0]
    out_dir = args.out_dir or osp.join('work_dirs', name, 'extrapolation')
    os.makedirs(out_dir, exist_ok=True)
    table = format_table(rows, train_grid)
    print('\n' + table)
    report = dict(
        config=args.config, checkpoint=args.checkpoint, split=args.split, device=device,
        torch=torch.__version__, train_crop=list(size) if size else None,
        train_grid=list(train_grid) if train_grid else None, patch_size=patch,
        command='python tools/extrapolate.py ' + ' '.join(
            argv if argv is not None else sys.argv[1:]),
        rows=rows)
    json_path = osp.join(out_dir, f'{args.name}.json')
    png_path = osp.join(out_dir, f'{args.name}.png')
    with open(json_path, 'w') as f:
        json.dump(report, f, indent=2)
    plot_report(rows, png_path, f'{name} — {osp.basename(args.checkpoint)} ({device})',
                train_grid)
    print(f'\nwrote {json_path} and {png_path}')
    report['json'], report['png'] = json_path, png_path
    return report


if __name__ == '__main__':
    from lookhere_dense.cli import run_main
    run_main(main)
