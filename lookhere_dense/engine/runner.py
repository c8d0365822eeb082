"""The Runner the tools build (:func:`lookhere_dense.apis.train.build_runner`): mmengine's
``Runner`` with two changes.

* Its logger's terminal handler gets a
  :class:`~lookhere_dense.engine.terminal.TerminalFilter` from the first line (the run
  header, config dump and library noise go to the log file only), unless
  ``quiet_terminal`` is False (:class:`VerboseToolRunner`, ``--verbose``).
* After ``init_weights`` in a distributed run, mmengine broadcasts every ``state_dict``
  entry from rank 0 and fails on entries that are not tensors (a module's
  ``get_extra_state``, e.g. ``LookHereViT``'s position-encoding record); this Runner
  broadcasts the tensors and leaves the rest (they are built from the config, identical on
  every rank).

A config's own ``runner_type`` is respected instead (then only the terminal filter is
added, after the Runner is built).
"""
from __future__ import annotations

import torch
from mmengine.dist import broadcast
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner

from .terminal import attach_terminal_filter, terminal_filter_of

__all__ = ['ToolRunner', 'VerboseToolRunner']


class ToolRunner(Runner):
    """mmengine's ``Runner`` with a quiet terminal and a tensor-only weight sync (see the
    module docstring). Build it like the Runner: ``ToolRunner.from_cfg(cfg)``."""

    #: attach the terminal filter to the logger
    quiet_terminal = True

    def build_logger(self, log_level='INFO', log_file=None, **kwargs):
        logger = super().build_logger(log_level=log_level, log_file=log_file, **kwargs)
        if self.quiet_terminal and terminal_filter_of(logger) is None:
            attach_terminal_filter(logger)
        return logger

    def _init_model_weights(self) -> None:
        model = self.model.module if is_model_wrapper(self.model) else self.model
        if hasattr(model, 'init_weights'):
            model.init_weights()
            # sync params and buffers from rank 0 (a no-op in one process)
            for value in model.state_dict().values():
                if isinstance(value, torch.Tensor):
                    broadcast(value)


class VerboseToolRunner(ToolRunner):
    """:class:`ToolRunner` that shows everything mmengine logs on the terminal."""

    quiet_terminal = False
