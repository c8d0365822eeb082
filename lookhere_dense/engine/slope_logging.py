"""Report learnable LookHere slopes while training (``lh_config.learnable_slopes=True``).

Add the hook to a config::

    custom_hooks = [dict(type='LookHereSlopeLoggerHook')]

Every ``interval`` training iterations (default: the ``LoggerHook``'s) it logs one line with
the global and per-layer slopes and sends every slope (global, layer, and the effective
slope ``global x layer x head`` of each head) to the visualizer's scalars
(``vis_data/scalars.json``, TensorBoard, ... under ``lookhere_slopes/...``); after each
validation and at the end of training it logs the full table (each value with its ratio to
the configured one) and writes ``{work_dir}/lookhere_slopes.json``. Models without learnable
slopes are skipped with one warning. The learned values are also in every checkpoint;
``tools/plot_heads.py --checkpoint CKPT`` draws them.
"""

from __future__ import annotations

import json
import os.path as osp
from typing import Any, Dict, List, Optional, Tuple

from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ..lookhere.slopes import LookHereSlopes, format_slope_table
from .ranks import unwrap_model

__all__ = ['LookHereSlopeLoggerHook', 'learnable_slopes_of']


def learnable_slopes_of(model: Any) -> List[Tuple[str, LookHereSlopes]]:
    """``(name, module)`` of every :class:`LookHereSlopes` in ``model`` (unwrapped from
    DDP / FSDP wrappers)."""
    model = unwrap_model(model)
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LookHereSlopes)]


def slope_scalars(prefix: str, values: Dict[str, Any]) -> Dict[str, float]:
    """The visualizer scalars of one :meth:`LookHereSlopes.values`: ``{prefix}/global``,
    ``{prefix}/layer_{l}`` and ``{prefix}/l{l}_h{h}`` (effective slopes)."""
    out = {f'{prefix}/global': float(values['global'])}
    out.update({f'{prefix}/layer_{l}': float(v) for l, v in enumerate(values['layer'])})
    eff = values['effective']
    out.update(
        {
            f'{prefix}/l{l}_h{h}': float(eff[l, h])
            for l in range(eff.shape[0])
            for h in range(eff.shape[1])
        }
    )
    return out


@HOOKS.register_module()
class LookHereSlopeLoggerHook(Hook):
    """Log learnable LookHere slopes (see the module docstring).

    Args:
        interval: training iterations between reports; None: the ``LoggerHook``'s
            interval (50 without one). Default: None.
        out_file: JSON written after each validation and at the end of training, relative
            to the work dir; None: none. Default: ``'lookhere_slopes.json'``.
    """

    priority = 'BELOW_NORMAL'

    def __init__(
        self, interval: Optional[int] = None, out_file: Optional[str] = 'lookhere_slopes.json'
    ):
        if interval is not None and (not isinstance(interval, int) or interval < 1):
            raise ValueError(
                f'LookHereSlopeLoggerHook: interval must be a positive int or '
                f'None, got {interval!r}'
            )
        self.interval = interval
        self.out_file = out_file
        self._slopes: List[Tuple[str, LookHereSlopes]] = []

    def before_train(self, runner) -> None:
        self._slopes = learnable_slopes_of(runner.model)
        if not self._slopes:
            print_log(
                'LookHereSlopeLoggerHook: the model has no learnable LookHere slopes '
                '(lh_config learnable_slopes=True); nothing to log',
                logger='current',
                level=30,
            )
            return
        if self.interval is None:
            loggers = [h for h in runner.hooks if isinstance(h, LoggerHook)]  # ours too
            self.interval = getattr(loggers[0], 'interval', 50) if loggers else 50
        self._report(runner, 'initial', runner.iter, table=True)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._slopes and self.every_n_train_iters(runner, self.interval):
            self._report(runner, f'iter {runner.iter + 1}', runner.iter + 1, table=False)

    def after_val_epoch(self, runner, metrics=None) -> None:
        if self._slopes:  # set by before_train: validation during training
            self._report(
                runner, f'validation at iter {runner.iter}', runner.iter, table=True, write=True
            )

    def after_train(self, runner) -> None:
        if self._slopes:
            self._report(
                runner, f'end of training, iter {runner.iter}', runner.iter, table=True, write=True
            )

    # -- reporting ---------------------------------------------------------------------
    def _report(self, runner, when: str, step: int, table: bool, write: bool = False) -> None:
        records = {}
        scalars = {}
        for name, slopes in self._slopes:
            values, configured = slopes.values(), slopes.configured()
            where = name or 'model'
            records[where] = {k: v.tolist() for k, v in values.items()}
            records[where]['configured'] = {k: v.tolist() for k, v in configured.items()}
            prefix = 'lookhere_slopes' if len(self._slopes) == 1 else f'lookhere_slopes/{where}'
            scalars.update(slope_scalars(prefix, values))
            if table:
                text = format_slope_table(values, configured)
            else:
                layers = ' '.join(f'{float(v):.4g}' for v in values['layer'])
                eff = values['effective']
                text = (
                    f'global {float(values["global"]):.4g} | layer {layers} | effective '
                    f'{float(eff.min()):.3g}..{float(eff.max()):.3g}'
                )
            print_log(
                f'LookHere slopes, {when} ({where}): ' + ('\n' if table else '') + text,
                logger='current',
            )
        runner.visualizer.add_scalars(scalars, step=step)
        if write and self.out_file:
            path = osp.join(runner.work_dir, self.out_file)
            with open(path, 'w') as f:
                json.dump(dict(iter=runner.iter, when=when, slopes=records), f, indent=1)
