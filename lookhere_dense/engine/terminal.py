"""What a training or test run prints on the terminal, and what only its log file gets.

mmengine's Runner prints everything it logs on the terminal: the environment, the whole
config, the hook order, the 150-row per-class table of every validation, and the
libraries' deprecation warnings (about 600 lines for a 4-iteration run). The tools keep
all of it in the run's log file (``<work_dir>/<timestamp>/<timestamp>.log``) and show on
the terminal what a person acts on: the checks, progress and loss lines, metrics,
checkpoints, and warnings that are theirs to fix.

* :class:`TerminalFilter` is a ``logging.Filter`` for the Runner logger's terminal
  handler; records it drops still reach the log file.
* :class:`lookhere_dense.engine.runner.ToolRunner` puts that filter on its terminal
  handler from the first line (the environment and config are logged while the Runner is
  built, so the filter has to be there before).
* :func:`warnings_to_run_log` routes Python warnings (``warnings.warn``) into the
  current run's logger, so they land in the log file too; the known library noise only
  there.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from typing import Iterator, Optional, Pattern, Sequence

__all__ = [
    'TerminalFilter',
    'LogLines',
    'evaluate_into_log',
    'attach_terminal_filter',
    'terminal_filter_of',
    'prints_into_log',
    'warnings_to_run_log',
    'FILE_ONLY',
    'MMSEG_LOSS_WARNINGS',
    'CLASS_TABLE',
]

#: mmseg's warnings at every build of a decode head (regular expressions, matched at the
#: start of the message): its heads build their losses through its own deprecated
#: ``build_loss``, and its ``CrossEntropyLoss`` announces its default. Training and test
#: runs keep them in their log file (:data:`FILE_ONLY`); an inference model, which computes
#: no loss, drops them (:func:`lookhere_dense.apis.inference.build_model_from_checkpoint`).
MMSEG_LOSS_WARNINGS: Sequence[str] = (
    r'``build_loss`` would be deprecated',
    r'Default ``avg_non_ignore`` is False',
)
#: Messages (regular expressions, matched at the start of the message) that go to the log
#: file only: mmengine's run header, and warnings of the libraries that are not the user's
#: to act on.
FILE_ONLY: Sequence[str] = (
    r'\n-+\nSystem environment:',  # environment block
    r'Config:\n',  # the whole config
    r'Hooks will be executed in the following order',  # hook table
    r'Distributed training is not used, all SyncBatchNorm',
    r'The prefix is not set in metric class',
    r'"FileClient" will be deprecated',
    r'"HardDiskBackend" is the alias of "LocalBackend"',
    r'Exp name: ',
    # Python warnings of mmseg / mmengine / torch that every run triggers
    *MMSEG_LOSS_WARNINGS,
    r'The draw is False, it means that the hook for visualization',
    r'This DataLoader will create \d+ worker processes',
    r'`reduce_zero_label` will be deprecated',
    r'pkg_resources is deprecated',
    r'Setting (OMP|MKL)_NUM_THREADS environment variable for each process',
    r'`broadcast_buffers` is deprecated',
)
#: mmseg's per-class IoU table (and its heading), printed at every validation.
CLASS_TABLE: Sequence[str] = (r'per class results:', r'\n\+-+\+')


class TerminalFilter(logging.Filter):
    """Drops, from the handler it is attached to, the records whose message starts like one
    of ``patterns`` (and those logged with ``extra={'file_only': True}``).

    Args:
        patterns: regular expressions. Default: :data:`FILE_ONLY`.
        class_table: also show mmseg's per-class table (``tools/test.py`` shows it once;
            training validations do not). Default: False.
    """

    def __init__(self, patterns: Sequence[str] = FILE_ONLY, class_table: bool = False):
        super().__init__()
        self._patterns: Pattern = re.compile('|'.join(f'(?:{p})' for p in patterns))
        self._table: Pattern = re.compile('|'.join(f'(?:{p})' for p in CLASS_TABLE))
        self.class_table = class_table

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, 'file_only', False):
            return False
        msg = str(record.msg)
        if self._patterns.match(msg):
            return False
        return self.class_table or not self._table.match(msg)


def attach_terminal_filter(
    logger: logging.Logger, terminal_filter: Optional[TerminalFilter] = None
) -> TerminalFilter:
    """Add ``terminal_filter`` (default: a new :class:`TerminalFilter`) to every handler of
    ``logger`` that writes to a terminal stream (not to a file)."""
    terminal_filter = terminal_filter or TerminalFilter()
    for handler in logger.handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(
            handler, logging.FileHandler
        ):
            handler.addFilter(terminal_filter)
    return terminal_filter


def terminal_filter_of(logger: logging.Logger) -> Optional[TerminalFilter]:
    """The :class:`TerminalFilter` attached to ``logger``'s terminal handler, if any."""
    for handler in logger.handlers:
        for flt in handler.filters:
            if isinstance(flt, TerminalFilter):
                return flt
    return None


class LogLines:
    """A text stream whose lines go to ``logger`` as INFO records for the log file only
    (``extra={'file_only': True}``): what a library ``print``s during evaluation."""

    def __init__(self, logger: logging.Logger):
        self.logger = logger
        self._buffer = ''

    def write(self, text: str) -> int:
        self._buffer += text
        *lines, self._buffer = self._buffer.split('\n')
        for line in lines:
            if line.strip():
                self.logger.info(line, extra=dict(file_only=True))
        return len(text)

    def flush(self) -> None:
        if self._buffer.strip():
            self.logger.info(self._buffer, extra=dict(file_only=True))
        self._buffer = ''


@contextlib.contextmanager
def prints_into_log(logger: logging.Logger) -> Iterator[None]:
    """Within the block, what is ``print``ed to ``stdout`` goes to ``logger``'s log file
    only (:class:`LogLines`): pycocotools' "loading annotations into memory..." of every
    COCO dataset and metric built, its tables of every evaluation."""
    stream = LogLines(logger)
    try:
        with contextlib.redirect_stdout(stream):
            yield
    finally:
        stream.flush()


def evaluate_into_log(evaluator, logger: logging.Logger):
    """``evaluator`` (an mmengine ``Evaluator``) whose ``evaluate`` sends what it prints
    to ``stdout`` to the run's log file only (pycocotools prints its 12-line tables and
    'Loading and preparing results...' of every COCO evaluation; the metrics themselves
    are logged by the metric and stay on the terminal)."""
    evaluate = evaluator.evaluate

    def evaluate_logged(*args, **kwargs):
        with prints_into_log(logger):
            return evaluate(*args, **kwargs)

    evaluator.evaluate = evaluate_logged
    return evaluator


@contextlib.contextmanager
def warnings_to_run_log(patterns: Sequence[str] = FILE_ONLY) -> Iterator[None]:
    """Within the block, ``warnings.warn`` messages go to the current mmengine logger (the
    run's, once a Runner exists) as WARNING records: the log file gets them all, the
    terminal all but those matching ``patterns``. Python's warning filters still apply
    (a warning shown once stays shown once)."""
    from mmengine.logging import MMLogger

    noise = re.compile('|'.join(f'(?:{p})' for p in patterns))
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        logger = MMLogger.get_current_instance()
        logger.warning(
            f'{category.__name__}: {text} ({filename}:{lineno})',
            extra=dict(file_only=bool(noise.match(text))),
        )

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous
