"""The one reporting layer: Markdown tables, CSV, JSON, text and PNG figures, written the
same way by every report (the extrapolation report, the robustness report, the study and
the benchmark). Each writer creates the folder it writes into.

Figures use matplotlib's ``Agg`` backend (no screen needed), imported on first use.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import os.path as osp
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Tuple

__all__ = [
    'markdown_table',
    'write_csv',
    'write_json',
    'write_text',
    'figure',
    'ensure_dir',
    'config_stem',
    'checkpoint_report',
    'precision_label',
]


def ensure_dir(path: str) -> str:
    """Create the folder ``path`` (and its parents) if needed; return it."""
    if path:
        os.makedirs(path, exist_ok=True)
    return path


def config_stem(config: str) -> str:
    """The config's file name without folder and ``.py`` (``mmseg::a/b.py`` -> ``b``)."""
    return osp.splitext(osp.basename(config.split('::')[-1]))[0]


def checkpoint_report(
    config: str,
    checkpoint: str,
    split: str,
    device: str,
    command: str,
    out_dir: Optional[str],
    kind: str,
    **fields: Any,
) -> Tuple[str, dict]:
    """The output folder and the JSON head of a report on one checkpoint (the
    extrapolation and robustness reports).

    Returns:
        ``out_dir`` (:func:`report_folder`), created, and the dict
        ``config``, ``checkpoint``, ``split``, ``device``, ``precision``
        (:func:`precision_label`: the autocast the report is made under, e.g. the tools'
        ``--amp``), ``torch`` (its version), ``cpu_capability`` (torch's: ``AVX2``,
        ``AVX512``, ...), ``cpu_bf16_products`` (AVX512-BF16 / AMX:
        :func:`~lookhere_dense.engine.amp.cpu_bf16_products`), ``command``, then ``fields``.
    """
    import torch

    from lookhere_dense.engine.amp import cpu_bf16_products

    out_dir = ensure_dir(report_folder(config, out_dir, kind))
    report = dict(
        config=config,
        checkpoint=checkpoint,
        split=split,
        device=device,
        precision=precision_label(device),
        torch=torch.__version__,
        # the speed depends on it (and, for bfloat16, whether the CPU has its products)
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_bf16_products=cpu_bf16_products(),
        command=command,
    )
    report.update(fields)
    return out_dir, report


def precision_label(device: str) -> str:
    """``'float32'``, or the autocast active on ``device``'s type now (``'bfloat16
    autocast'``: the tools' ``--amp`` wraps the report's passes in it)."""
    import torch

    kind = str(device).split(':')[0]
    if torch.is_autocast_enabled(kind):
        return f'{str(torch.get_autocast_dtype(kind)).replace("torch.", "")} autocast'
    return 'float32'


def report_folder(config: str, out_dir: Optional[str], kind: str) -> str:
    """Where a report on one checkpoint goes: ``out_dir``, else
    ``work_dirs/<config stem>/<kind>``."""
    return out_dir or osp.join('work_dirs', config_stem(config), kind)


def position_encoding_label(cfg) -> Optional[str]:
    """The backbone's position encoding as a report names it (``lookhere lh90``,
    ``rope2d``), from the config; None for a backbone that is no LookHere ViT."""
    backbone = (cfg.get('model') or {}).get('backbone') or {}
    if not str(backbone.get('type', '')).split('.')[-1].startswith('LookHere'):
        return None
    pos = backbone.get('pos_encoding') or 'lookhere'
    pos = pos if isinstance(pos, str) else str(dict(pos).get('type'))
    preset = backbone.get('preset')
    return f'{pos} {preset}' if pos == 'lookhere' and isinstance(preset, str) else pos


def check_report_target(
    config: str, checkpoint: str, out_dir: Optional[str], kind: str, name: str
) -> None:
    """Refuse, before any work, a report that would replace the one another checkpoint
    wrote there (``<name>.json`` in :func:`report_folder`): evaluating two checkpoints of one config (two position
    encodings, two schedules) with the defaults overwrote the first report without a word.
    The same checkpoint again (a rerun) replaces its own report. A folder that cannot be
    written is refused here too (it was found after every test had run).

    Raises:
        lookhere_dense.errors.ToolError: naming both checkpoints, ``--name`` and
            ``--out-dir``; or the folder that cannot be written.
    """
    from lookhere_dense.checkpoint.atomic import check_output_folder
    from lookhere_dense.errors import ToolError

    folder = report_folder(config, out_dir, kind)
    check_output_folder(folder, '--out-dir')  # before the work, not after it
    path = osp.join(folder, f'{name}.json')
    try:
        with open(path) as f:
            old = json.load(f).get('checkpoint')
    except (OSError, ValueError, AttributeError):
        return  # none there, or not a report of ours: written as before
    if isinstance(old, str) and osp.abspath(old) != osp.abspath(checkpoint):
        raise ToolError(
            f'{path!r} is the {kind} report of {old!r}; this one, of {checkpoint!r}, would '
            'replace it: give it another --name (e.g. the encoding or the checkpoint) or '
            '--out-dir, or remove that file'
        )


def _parent(path: str) -> None:
    ensure_dir(osp.dirname(osp.abspath(path)))


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table (``| a | b |`` lines under a ``|---|`` rule); cells as ``str``."""
    lines = ['| ' + ' | '.join(str(h) for h in header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)


def write_csv(path: str, header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> str:
    """Write a CSV file with one header row; returns ``path``."""
    _parent(path)
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def write_json(
    path: str, data: Any, indent: int = 2, default: Optional[Callable[[Any], Any]] = None
) -> str:
    """Write ``data`` as JSON; returns ``path``."""
    _parent(path)
    with open(path, 'w') as f:
        json.dump(data, f, indent=indent, default=default)
    return path


def write_text(path: str, text: str) -> str:
    """Write ``text``; returns ``path``."""
    _parent(path)
    with open(path, 'w') as f:
        f.write(text)
    return path


@contextlib.contextmanager
def figure(
    path: str,
    nrows: int = 1,
    ncols: int = 1,
    figsize: Tuple[float, float] = (7, 4.5),
    dpi: int = 110,
    title: Optional[str] = None,
    title_size: float = 10,
    squeeze: bool = True,
    **subplots: Any,
) -> Iterator[Tuple[Any, Any]]:
    """A matplotlib figure saved to ``path`` (PNG) when the block ends.

    Yields ``(fig, axes)`` of ``plt.subplots(nrows, ncols, ...)``; on leaving, the title is
    set (``title``, as ``suptitle`` of ``title_size`` points), the layout tightened, the figure written and closed
    (also when the block raises: then nothing is written).
    """
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=squeeze, **subplots)
    try:
        yield fig, axes
        if title:
            fig.suptitle(title, fontsize=title_size)
        fig.tight_layout()
        _parent(path)
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
