"""The extrapolation report: one segmentation checkpoint evaluated at several test
resolutions (``tools/extrapolate.py``; ``tools/demo.py`` runs it after training).

For every test (``MODE@SIZE``, :func:`parse_spec`) the config's test pipeline resizes the
images to SIZE (:func:`spec_pipeline`) and the model predicts the whole image at once
(``whole``) or in windows of the config's slide crop (``slide``, :func:`slide_settings`);
mmseg's ``IoUMetric`` scores it (:func:`evaluate_spec`). The report gives mIoU, the patch
grid the backbone saw (vs the training grid), time per image and peak memory
(:class:`research.memory.PeakMemory`) as a Markdown table
(:func:`format_table`), a JSON file and a PNG plot (:func:`plot_report`);
:func:`extrapolation_report` does all of it.

SIZE is ``x<f>`` (the config's test scale times f; ``x0.5`` tests below the training
size), ``<S>`` (short side S px, aspect kept), ``long<L>`` (long side L px, the image's
native aspect kept) or ``<H>x<W>`` (exactly H x W).
"""

from __future__ import annotations

import copy
import functools
import math
import os.path as osp
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lookhere_dense.errors import ConfigError, MemoryBudgetError
from lookhere_dense.evaluation.resize import (
    check_resize_sides,
    exact_resize,
    is_resize,
    long_side_resize,
    replace_resize,
    scale_resizes,
    short_side_resize,
)
from lookhere_dense.validation import check_int, positive_pair

from .evaluate import evaluate_loader, refusal
from .reporting import (
    check_report_target,
    checkpoint_report,
    config_stem,
    figure,
    markdown_table,
    position_encoding_label,
    precision_label,
    write_json,
)

__all__ = [
    'DEFAULT_TESTS',
    'TestSpec',
    'parse_spec',
    'config_patch_size',
    'spec_pipeline',
    'slide_settings',
    'training_crop',
    'stored_value',
    'median_shape',
    'evaluate_spec',
    'refused_row',
    'format_table',
    'plot_report',
    'extrapolation_report',
]

#: the tests of ``tools/extrapolate.py`` when none are given
DEFAULT_TESTS = ('slide@x1', 'whole@x1', 'whole@x1.5', 'whole@x2', 'whole@x3')
#: print that flushes (progress lines interleave with the progress bars on stderr)
_print = functools.partial(print, flush=True)
_SPEC = re.compile(
    r'^(whole|slide)@(?:x(?P<f>\d+(?:\.\d+)?)|(?P<h>\d+)x(?P<w>\d+)|(?P<s>\d+)'
    r'|long(?P<l>\d+))$'
)


@dataclass(frozen=True)
class TestSpec:
    """One test: inference ``mode`` and how the test pipeline resizes.

    Attributes:
        text: the spec as written (``whole@x2``).
        mode: ``'whole'`` or ``'slide'``.
        factor: multiply the config's test ``Resize`` scale (or None).
        short_side: resize to this short side, aspect kept (or None).
        size: resize to exactly ``(H, W)`` (or None).
        long_side: resize to this long side, aspect kept (or None).
    """

    __test__ = False  # not a pytest test class

    text: str
    mode: str
    factor: Optional[float] = None
    short_side: Optional[int] = None
    size: Optional[Tuple[int, int]] = None
    long_side: Optional[int] = None


def parse_spec(text: str) -> TestSpec:
    """``'whole@x2'`` / ``'whole@x0.5'`` / ``'slide@512'`` / ``'whole@long512'`` /
    ``'whole@1024x2048'`` -> :class:`TestSpec`.

    Raises:
        lookhere_dense.errors.ConfigError: naming the accepted forms.
    """

    m = _SPEC.match(text.strip())
    if not m:
        raise ConfigError(
            f'bad test {text!r}: write MODE@SIZE with MODE whole or slide and '
            'SIZE x<factor> (x2, x0.5), <short side> (768), long<long side> '
            '(long512: aspect kept) or <H>x<W> (1024x2048)'
        )
    mode = m.group(1)
    if m.group('f'):
        spec = TestSpec(text, mode, factor=float(m.group('f')))
        values = [spec.factor]
    elif m.group('s'):
        spec = TestSpec(text, mode, short_side=int(m.group('s')))
        values = [spec.short_side]
    elif m.group('l'):
        spec = TestSpec(text, mode, long_side=int(m.group('l')))
        values = [spec.long_side]
    else:
        spec = TestSpec(text, mode, size=(int(m.group('h')), int(m.group('w'))))
        values = list(spec.size)
    if min(values) <= 0:
        raise ConfigError(f'bad test {text!r}: the size must be positive')
    return spec


def config_patch_size(cfg) -> Optional[int]:
    """The patch size the config gives its backbone (``model.backbone.patch_size``; the
    smaller side of an ``(h, w)`` patch), or None when it gives none."""
    patch = (cfg.model.get('backbone') or {}).get('patch_size')
    if patch is None:
        return None
    return int(min(patch)) if isinstance(patch, (list, tuple)) else int(patch)


def _check_sides(spec: TestSpec, target: Any, what: str, patch_size: Optional[int]) -> None:
    """Refuse a test whose resize gives a side of 0 px or, with ``patch_size``, below one
    patch (the backbone cannot embed it): one rule with ``tools/infer.py``'s sizes
    (:func:`~lookhere_dense.evaluation.resize.check_resize_sides`)."""
    if isinstance(target, (list, tuple)) and len(target) == 1:
        target = target[0]
    check_resize_sides(f'{spec.text}: {what}', target, patch_size, advice='test at')


def spec_pipeline(
    pipeline: Sequence[Dict[str, Any]], spec: TestSpec, patch_size: Optional[int] = None
) -> List[Dict[str, Any]]:
    """The test pipeline resized for ``spec`` (:mod:`lookhere_dense.evaluation.resize`):
    ``x<f>`` multiplies its ``Resize`` transforms, a short side or an exact size replaces
    the first one (inserted after the image loading when the config has none), as does a
    long side (:func:`~lookhere_dense.evaluation.resize.long_side_resize`).

    Args:
        pipeline: the config's test pipeline (not changed).
        spec: the test.
        patch_size: the model's patch size (e.g. :func:`config_patch_size`): resized sizes
            below one patch are refused. Default: None (only sizes of 0 px are refused).

    Raises:
        lookhere_dense.errors.ConfigError: ``x<f>`` on a pipeline without a ``Resize`` to
            multiply; a resize to a side of 0 px or below one patch (``x<f>`` checks the
            scaled ``scale`` of every ``Resize``; a ``scale_factor`` is not checked), naming
            the spec, the size and the patch.
    """
    if spec.factor is not None:
        out, scaled = scale_resizes(pipeline, spec.factor)
        if not scaled:
            raise ConfigError(
                f'{spec.text}: the test pipeline has no Resize scale to '
                'multiply; give the size in px (e.g. whole@512)'
            )
        for before, after in zip(pipeline, out):
            if is_resize(after) and after.get('scale') is not None:
                scale = after['scale']
                _check_sides(
                    spec,
                    scale,
                    f'the test Resize scale {before["scale"]} x {spec.factor:g} = {scale}',
                    patch_size,
                )
        return out
    if spec.short_side is not None:
        _check_sides(spec, (spec.short_side,), f'the short side {spec.short_side} px', patch_size)
        return replace_resize(pipeline, short_side_resize(spec.short_side))
    if spec.long_side is not None:
        _check_sides(spec, (spec.long_side,), f'the long side {spec.long_side} px', patch_size)
        return replace_resize(pipeline, long_side_resize(spec.long_side))
    _check_sides(spec, spec.size, f'the size {spec.size[0]}x{spec.size[1]} px', patch_size)
    return replace_resize(pipeline, exact_resize(spec.size))


def slide_settings(cfg) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """``(crop, stride)`` for slide tests: the config's slide ``test_cfg``, else the
    training crop (``data_preprocessor.size``) with a 2/3 stride.

    Raises:
        lookhere_dense.errors.ConfigError: the config has neither.
    """
    tc = cfg.model.get('test_cfg') or {}
    if tc.get('mode') == 'slide' and tc.get('crop_size'):
        return tuple(tc['crop_size']), tuple(tc.get('stride') or tc['crop_size'])
    size = (cfg.model.get('data_preprocessor') or {}).get('size')
    if not size:
        raise ConfigError(
            'slide tests need a crop: the config has neither a slide test_cfg '
            'nor model.data_preprocessor.size'
        )
    crop = tuple(size)
    return crop, tuple(max(1, c * 2 // 3) for c in crop)


#: Where the training crop of a report comes from (:func:`training_crop`).
CONFIG_CROP = "the config's data_preprocessor.size"
CHECKPOINT_CROP = "the checkpoint's training config: data_preprocessor.size"


def training_crop(cfg, checkpoint: Optional[str]) -> Tuple[Optional[Tuple[int, int]], str]:
    """The crop ``(H, W)`` the checkpoint was trained at, and where it comes from: the
    ``model.data_preprocessor.size`` of the training config that mmengine's Runner stores
    as text in a checkpoint's ``meta['cfg']`` (a checkpoint trained at another crop than
    the config given now says so; the text is parsed, never run: :func:`stored_value`),
    else the config's (a weights-only file, one of another trainer, or a stored config
    without it). ``(None, ...)`` when neither has one."""
    from lookhere_dense.checkpoint.reading import training_meta

    text = (training_meta(checkpoint) or {}).get('cfg') if checkpoint else None
    if isinstance(text, str):
        size = positive_pair(stored_value(text, ('model', 'data_preprocessor', 'size')))
        if size is not None:
            return size, CHECKPOINT_CROP
    return positive_pair((cfg.model.get('data_preprocessor') or {}).get('size')), CONFIG_CROP


def stored_value(text: str, keys: Sequence[str]) -> Any:
    """The literal at ``keys`` (``('model', 'data_preprocessor', 'size')``) of a config
    stored as Python text (mmengine's ``pretty_text``: ``model = dict(..., size=(512,
    512))``), read with :mod:`ast` (nothing of the text is executed); None where the text
    does not parse, lacks a key or holds no literal there."""
    import ast

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    node: Any = None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == keys[0] for t in stmt.targets
        ):
            node = stmt.value
    for key in keys[1:]:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == 'dict'
        ):
            node = next((k.value for k in node.keywords if k.arg == key), None)
        elif isinstance(node, ast.Dict):
            node = next(
                (
                    v
                    for k, v in zip(node.keys, node.values)
                    if isinstance(k, ast.Constant) and k.value == key
                ),
                None,
            )
        else:
            return None
    try:
        return None if node is None else ast.literal_eval(node)
    except ValueError:
        return None


def median_shape(shapes: Sequence[Tuple[int, int]]) -> Tuple[int, int]:
    """The ``(H, W)`` of the median image by area (ties by H, then W): the size of an image
    that was tested, unlike the median H and median W taken apart (on mixed portrait and
    landscape images those give a shape no image has)."""
    ordered = sorted((tuple(s) for s in shapes), key=lambda s: (s[0] * s[1], s[0], s[1]))
    return ordered[len(ordered) // 2]


def evaluate_spec(
    model, cfg, spec: TestSpec, split: str, device: str, max_images: Optional[int], patch_size: int
) -> Dict[str, Any]:
    """Run one test of ``model`` on the ``split`` dataloader of ``cfg``
    (:func:`evaluate_loader`, one image per batch).

    Returns:
        The report row: ``test, mode, input_h, input_w`` (the size of the median image by
        area, :func:`median_shape`), ``input_sizes`` (how many distinct sizes were tested),
        ``input_h_range, input_w_range`` (``[min, max]`` of each side), ``grid_h, grid_w``
        (patch grid the backbone saw for the median image; a window's for slide tests),
        ``mIoU, aAcc, mAcc``, ``sec_per_img`` (model time), ``peak_mem_mb`` (MiB),
        ``memory_kind`` (:attr:`PeakMemory.kind`), ``images``.

    Raises:
        lookhere_dense.errors.ConfigError: a resize below one patch of the config's backbone
            (:func:`spec_pipeline`), before any image is predicted.
    """
    dl_cfg = copy.deepcopy(cfg.get(f'{split}_dataloader'))
    dl_cfg['dataset']['pipeline'] = spec_pipeline(
        dl_cfg['dataset']['pipeline'], spec, config_patch_size(cfg)
    )
    dl_cfg['batch_size'] = 1
    dl_cfg['persistent_workers'] = False
    dl_cfg['num_workers'] = min(int(dl_cfg.get('num_workers', 0)), 2)
    if max_images:
        dl_cfg['dataset']['indices'] = max_images
    slide = slide_settings(cfg) if spec.mode == 'slide' else None
    result = evaluate_loader(
        model, dl_cfg, cfg.get(f'{split}_evaluator'), spec.mode, device, slide, spec.text
    )
    metrics, seconds, shapes = result['metrics'], result['seconds'], result['shapes']
    h, w = median_shape(shapes)
    if spec.mode == 'slide':
        crop, _ = slide
        grid_h, grid_w = (math.ceil(min(c, d) / patch_size) for c, d in zip(crop, (h, w)))
    else:
        grid_h, grid_w = math.ceil(h / patch_size), math.ceil(w / patch_size)
    hs, ws = [s[0] for s in shapes], [s[1] for s in shapes]
    return dict(
        test=spec.text,
        mode=spec.mode,
        input_h=h,
        input_w=w,
        input_sizes=len(set(shapes)),
        input_h_range=[min(hs), max(hs)],
        input_w_range=[min(ws), max(ws)],
        grid_h=grid_h,
        grid_w=grid_w,
        mIoU=float(metrics.get('mIoU', float('nan'))),
        aAcc=float(metrics.get('aAcc', float('nan'))),
        mAcc=float(metrics.get('mAcc', float('nan'))),
        sec_per_img=sum(seconds) / max(1, len(seconds)),
        peak_mem_mb=result['peak_mem_mb'],
        memory_kind=result['memory_kind'],
        images=len(seconds),
    )


def refused_row(spec: TestSpec, err: MemoryBudgetError) -> Dict[str, Any]:
    """The report row of a test the memory guard refused: ``test, mode`` and
    :func:`~research.evaluate.refusal`'s ``refused``, ``estimate_mb``, ``limit_mb``,
    ``limit_source``."""
    return dict(test=spec.text, mode=spec.mode, **refusal(err))


def _measured_rows(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in rows if not r.get('refused')]


def _memory_label(rows: Sequence[Dict[str, Any]]) -> str:
    measured = _measured_rows(rows)
    cuda = measured and measured[0]['memory_kind'] == 'cuda_max_allocated'
    return 'peak GPU MiB' if cuda else 'peak RSS MiB'


def _refusal_cell(row: Dict[str, Any]) -> str:
    """``est. 12595 > 8192``: the refused pass's estimated rise of memory and the limit
    it exceeded, in MiB (the estimate counts what the pass would add to the memory in use,
    not the process's peak)."""
    if row.get('estimate_mb') is None or row.get('limit_mb') is None:
        return 'refused'
    return f'est. {row["estimate_mb"]:.0f} > {row["limit_mb"]:.0f}'


def input_cell(row: Dict[str, Any]) -> str:
    """The input size of a report row: ``HxW`` of its median image, followed by how many
    sizes there were and their ranges when the images were not all one size (``36x48
    (median of 4 sizes: H 24-48, W 24-48)``)."""
    cell = f'{row["input_h"]}x{row["input_w"]}'
    if row.get('input_sizes', 1) > 1:
        (h0, h1), (w0, w1) = row['input_h_range'], row['input_w_range']
        cell += f' (median of {row["input_sizes"]} sizes: H {h0}-{h1}, W {w0}-{w1})'
    return cell


def format_row(row: Dict[str, Any]) -> str:
    """One report row as the progress line ``tools/extrapolate.py`` prints."""
    if row.get('refused'):
        why = (
            f'estimated peak {row["estimate_mb"]:.0f} MiB > {row["limit_mb"]:.0f} MiB, '
            f'{row["limit_source"]}'
            if row.get('estimate_mb') is not None and row.get('limit_mb') is not None
            else 'over the memory limit'
        )
        return f'{row["test"]:>18}: refused before it allocated ({why})'
    return (
        f'{row["test"]:>18}: mIoU {row["mIoU"]:6.2f}  input {input_cell(row)}  '
        f'grid {row["grid_h"]}x{row["grid_w"]}  '
        f'{row["sec_per_img"]:.3f} s/img  peak {row["peak_mem_mb"]:.0f} MiB'
    )


def format_table(
    rows: List[Dict[str, Any]],
    train_grid: Optional[Tuple[int, int]],
    crop_source: str = CONFIG_CROP,
) -> str:
    """The report rows as a Markdown table. The input column is the size of the median
    image by area (:func:`input_cell`: with the number of sizes and their ranges when
    they vary); the patch grid is the median image's; ``crop_source`` says where the
    training crop under the table comes from (:func:`training_crop`)."""
    rows_out = []
    for r in rows:
        if r.get('refused'):
            rows_out.append([r['test'], '-', '-', 'refused', '-', '-', _refusal_cell(r)])
            continue
        grid = f'{r["grid_h"]}x{r["grid_w"]}' + (' (windows)' if r['mode'] == 'slide' else '')
        rows_out.append(
            [
                r['test'],
                input_cell(r),
                grid,
                f'{r["mIoU"]:.2f}',
                f'{r["aAcc"]:.2f}',
                f'{r["sec_per_img"]:.3f}',
                f'{r["peak_mem_mb"]:.0f}',
            ]
        )
    lines = [
        markdown_table(
            [
                'test',
                'input (median HxW)',
                'patch grid',
                'mIoU',
                'aAcc',
                's / img',
                _memory_label(rows),
            ],
            rows_out,
        )
    ]
    if train_grid:
        lines.append(
            f'\ntraining crop grid: {train_grid[0]}x{train_grid[1]} patches ({crop_source})'
        )
    refused = [r for r in rows if r.get('refused')]
    if refused:
        sources = sorted({str(r.get('limit_source') or 'the memory limit') for r in refused})
        lines.append(
            f'\nrefused: {", ".join(r["test"] for r in refused)}: the memory guard '
            f'estimated the rise of memory of their pass above {" / ".join(sources)} '
            '(their memory cell: `est. <estimate> > <limit>`, in MB) and refused it before '
            'it allocated; each '
            'refusal (`refused` in the JSON) names cheaper options'
        )
    return '\n'.join(lines)


def plot_report(
    rows: List[Dict[str, Any]], path: str, title: str, train_grid: Optional[Tuple[int, int]]
) -> None:
    """PNG: mIoU vs test (patch grid), and time / memory per test (a test the memory
    guard refused: a hatched grey bar marked ``refused`` with its estimate, no cost)."""
    nan = float('nan')

    def label(r: Dict[str, Any]) -> str:
        if r.get('refused'):
            return f'{r["test"]}\nrefused\n{_refusal_cell(r)} MB'
        sizes = f' ({r["input_sizes"]} sizes)' if r.get('input_sizes', 1) > 1 else ''
        return (
            f'{r["test"]}\n{r["input_h"]}x{r["input_w"]}{sizes}\ngrid {r["grid_h"]}x{r["grid_w"]}'
        )

    labels = [label(r) for r in rows]
    x = list(range(len(rows)))
    refused = [bool(r.get('refused')) for r in rows]
    colours = [
        'lightgrey' if no else 'tab:orange' if r['mode'] == 'slide' else 'tab:blue'
        for r, no in zip(rows, refused)
    ]
    miou = [0.0 if no else r['mIoU'] for r, no in zip(rows, refused)]
    top = max(100, max(miou, default=0) * 1.1)
    with figure(path, 1, 2, figsize=(max(10.0, 2.4 * len(rows) + 2), 4.8), title=title) as (
        _,
        (ax1, ax2),
    ):
        bars = ax1.bar(x, [top * 0.05 if no else v for v, no in zip(miou, refused)], color=colours)
        for bar, xi, v, no in zip(bars, x, miou, refused):
            if no:
                bar.set_hatch('//')
            text = 'refused' if no else f'{v:.1f}'
            ax1.annotate(text, (xi, top * 0.05 if no else v), ha='center', va='bottom', fontsize=9)
        ax1.set_xticks(x, labels, fontsize=8)
        ax1.set_ylabel('mIoU (%)')
        ax1.set_ylim(0, top)
        note = f' (trained on {train_grid[0]}x{train_grid[1]} crops)' if train_grid else ''
        ax1.set_title('mIoU per test' + note, fontsize=10)
        secs = [nan if no else r['sec_per_img'] for r, no in zip(rows, refused)]
        ax2.plot(x, secs, 'o-', color='tab:green', label='s / image')
        ax2.set_ylabel('seconds per image', color='tab:green')
        ax2.set_xticks(x, labels, fontsize=8)
        ax2.set_xlim(-0.5, len(rows) - 0.5)  # refused tests keep their place (no point)
        ax3 = ax2.twinx()
        kind = _memory_label(rows)
        peaks = [nan if no else r['peak_mem_mb'] for r, no in zip(rows, refused)]
        ax3.plot(x, peaks, 's--', color='tab:red', label=kind)
        ax3.set_ylabel(kind, color='tab:red')
        ax2.set_title('cost per test', fontsize=10)


def extrapolation_report(
    config: str,
    checkpoint: str,
    tests: Sequence[str] = DEFAULT_TESTS,
    split: str = 'test',
    max_images: Optional[int] = None,
    out_dir: Optional[str] = None,
    name: str = 'extrapolation',
    device: Optional[str] = None,
    cfg_options: Optional[dict] = None,
    command: str = '',
    log: Callable[[str], None] = _print,
    max_memory: Optional[str] = None,
    replace: bool = False,
) -> Dict[str, Any]:
    """Evaluate ``checkpoint`` at every test and write ``<out_dir>/<name>.json`` and
    ``.png``.

    Args:
        config: the mmseg config the checkpoint was trained with (``mmseg::`` paths allowed).
        checkpoint: the checkpoint file.
        tests: ``MODE@SIZE`` specs (:func:`parse_spec`), in order. Default:
            :data:`DEFAULT_TESTS`.
        split: ``'test'`` or ``'val'``: which dataloader of the config. Default: ``'test'``.
        max_images: only the first N images of the split (N >= 1). Default: None (all).
        out_dir: output folder. Default: ``work_dirs/<config name>/extrapolation``.
        name: file stem of the JSON / PNG. Default: ``'extrapolation'``.
        device: ``'cpu'`` / ``'cuda[:N]'``. Default: None (cuda when available).
        cfg_options: config overrides (``--cfg-options``). Default: None.
        command: the command line, stored in the report. Default: ``''``.
        log: where the progress lines, the table and the written paths go. Default:
            print (flushed).
        max_memory: the budget of one pass (``'8G'``); a test whose estimated peak
            exceeds it (or, without a budget, the memory left) is refused before it
            allocates (:func:`lookhere_dense.engine.memory_guard.install_memory_guard`)
            and reported as a ``refused`` row (:func:`refused_row`); the other tests run.
            Default: None.
        replace: replace a report of another checkpoint there (the demo's own folder);
            False: refused before any work (:func:`~.reporting.check_report_target`).
            Default: False.

    Returns:
        The JSON content, plus ``json`` and ``png`` (the written paths).

    Raises:
        lookhere_dense.errors.ConfigError: a bad test spec, a test resized below one patch
        of the config's backbone (:func:`spec_pipeline`; checked before the model is built)
        or a non-mmseg config;
        lookhere_dense.errors.MemoryBudgetError: every test refused by the memory guard
        (the first one's refusal; nothing is written);
        FileNotFoundError: config or checkpoint missing; the pre-flight data checks'
        errors (:func:`lookhere_dense.apis.cli.preflight`).
    """
    from .evaluate import model_for_report

    specs = [parse_spec(t) for t in tests]
    if not specs:
        raise ConfigError('no tests given: name at least one MODE@SIZE (e.g. whole@x1)')
    if max_images is not None:
        check_int(
            'max_images',
            max_images,
            error=ConfigError,
            description='a whole number >= 1 (or None for all)',
        )

    def check(cfg) -> None:  # every resize against the patch: before any evaluation work
        dl_cfg = cfg.get(f'{split}_dataloader') or {}
        pipeline = (dl_cfg.get('dataset') or {}).get('pipeline')
        if pipeline is not None:
            for spec in specs:
                spec_pipeline(pipeline, spec, config_patch_size(cfg))

    if not replace:
        check_report_target(config, checkpoint, out_dir, 'extrapolation', name)
    cfg, model, device = model_for_report(
        config, checkpoint, split, cfg_options, 'extrapolate.py', device, check
    )
    from lookhere_dense.engine.memory_guard import install_memory_guard, parse_memory

    budget = None if max_memory is None else parse_memory(max_memory)
    try:  # the sliding window the refusal message offers
        window: Optional[Tuple[int, int]] = tuple(slide_settings(cfg)[0])
    except ConfigError:
        window = None
    install_memory_guard(model, budget, window)
    patch = config_patch_size(cfg) or 16
    size, crop_source = training_crop(cfg, checkpoint)
    if crop_source == CHECKPOINT_CROP and size != training_crop(cfg, None)[0]:
        log(
            f'the checkpoint was trained at {size[0]}x{size[1]} px crops (its stored '
            'training config), not at the crop of the config given: the report takes '
            "the checkpoint's"
        )
    train_grid = tuple(math.ceil(s / patch) for s in size) if size else None

    rows, refusals = [], []
    precision = precision_label(device)
    log(f'{len(specs)} tests on the {split} split, device {device}, {precision}')
    for spec in specs:
        try:
            row = evaluate_spec(model, cfg, spec, split, device, max_images, patch)
        except MemoryBudgetError as err:
            refusals.append(err.with_traceback(None))  # its frames held the refused input
            row = refused_row(spec, err)
            log(format_row(row) + f'\n{"":>20}{err}')
        else:
            log(format_row(row))
        rows.append(row)
    if len(refusals) == len(specs):  # nothing measured: no report, the (first) refusal
        raise refusals[0]

    table = format_table(rows, train_grid, crop_source)
    log('\n' + table)
    out_dir, report = checkpoint_report(
        config,
        checkpoint,
        split,
        device,
        command,
        out_dir,
        'extrapolation',
        pos_encoding=position_encoding_label(cfg),
        train_crop=list(size) if size else None,
        train_crop_source=crop_source if size else None,
        train_grid=list(train_grid) if train_grid else None,
        patch_size=patch,
        rows=rows,
    )
    stem = config_stem(config)
    json_path = osp.join(out_dir, f'{name}.json')
    png_path = osp.join(out_dir, f'{name}.png')
    write_json(json_path, report)
    pos = f', {report["pos_encoding"]}' if report.get('pos_encoding') else ''
    amp = '' if report['precision'] == 'float32' else f', {report["precision"]}'
    title = f'{stem} — {osp.basename(checkpoint)} ({device}{amp}{pos})'
    plot_report(rows, png_path, title, train_grid)
    log(f'\nwrote {json_path} and {png_path}')
    report['json'], report['png'] = json_path, png_path
    return report
