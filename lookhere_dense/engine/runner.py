"""The Runner the tools build (:func:`lookhere_dense.apis.train.build_runner`): mmengine's
``Runner`` whose logger's terminal handler gets a
:class:`~lookhere_dense.engine.terminal.TerminalFilter` from the first line (the run header,
config dump and library noise go to the log file only), unless ``quiet_terminal`` is False
(:class:`VerboseToolRunner`, ``--verbose``); what datasets and evaluation ``print`` (pycocotools'
annotation loading and tables) goes to the log file too. Nothing else differs: multi-process runs use
mmengine's own weight sync (every ``state_dict`` entry of lookhere-dense models is a
tensor, ``LookHereViT``'s record included), so mmseg's and mmdet's own ``tools/train.py``
run them too.

A config's own ``runner_type`` is respected instead (then the terminal filter is added
after the Runner is built).
"""

from __future__ import annotations

from mmengine.runner import Runner

from .terminal import (
    attach_terminal_filter,
    evaluate_into_log,
    prints_into_log,
    terminal_filter_of,
)

__all__ = ['ToolRunner', 'VerboseToolRunner']


class ToolRunner(Runner):
    """mmengine's ``Runner`` with a quiet terminal (see the module docstring). Build it
    like the Runner: ``ToolRunner.from_cfg(cfg)``."""

    #: attach the terminal filter to the logger
    quiet_terminal = True

    def build_logger(self, log_level='INFO', log_file=None, **kwargs):
        logger = super().build_logger(log_level=log_level, log_file=log_file, **kwargs)
        if self.quiet_terminal and terminal_filter_of(logger) is None:
            attach_terminal_filter(logger)
        return logger

    def build_evaluator(self, evaluator):
        """mmengine's, whose building and ``evaluate`` print into the log file only (quiet
        terminal: :func:`~lookhere_dense.engine.terminal.evaluate_into_log`; mmdet's
        ``CocoMetric`` reads its annotation file with pycocotools, which prints)."""
        if not self.quiet_terminal:
            return super().build_evaluator(evaluator)
        with prints_into_log(self.logger):
            built = super().build_evaluator(evaluator)
        return evaluate_into_log(built, self.logger)

    def build_dataloader(self, dataloader, seed=None, diff_rank_seed=False):
        """mmengine's (a static method there; the loops call it on the runner), whose
        dataset's ``print``s go to the log file only (quiet terminal: an mmdet COCO
        dataset's pycocotools "loading annotations into memory..." lines)."""
        if not self.quiet_terminal:
            return Runner.build_dataloader(dataloader, seed, diff_rank_seed)
        with prints_into_log(self.logger):
            return Runner.build_dataloader(dataloader, seed, diff_rank_seed)


class VerboseToolRunner(ToolRunner):
    """:class:`ToolRunner` that shows everything mmengine logs on the terminal."""

    quiet_terminal = False
