"""Every error and warning class of lookhere-dense, in one module (no imports).

Each class marks a mistake the user can act on; its message names the key, value or file
at fault and what to change. The tools print these as one ``error:`` line instead of a
traceback (:data:`USER_ERRORS`, used by :func:`lookhere_dense.apis.cli.run_main`).

==========================  ============================================================
class                       raised when
==========================  ============================================================
:class:`ConfigError`        a config (or argument) cannot work as written
:class:`PosEncodingError`   a ``pos_encoding`` / ``preset`` / ``lh_config`` that cannot
                            work (``key`` names the backbone argument at fault)
:class:`CheckpointError`    a checkpoint that cannot be read or does not fit the model
:class:`DataCheckError`     the data named by a config is missing or unusable (and its
                            subclasses: layout, label range, crop size, label size,
                            unreadable file)
:class:`TrainingDivergedError`  a loss became NaN or infinite
:class:`NonFiniteFeaturesError`  in inference, the backbone's features became NaN or
                            infinite although its input images are finite (values
                            that overflow inside it, or non-finite weights)
:class:`ToolError`          anything else a tool user can fix (a file that cannot be
                            written, a launcher without its environment; and its
                            subclasses: a checkpoint save that failed, a run stopped
                            by SIGTERM / SIGINT, a work dir another run holds or
                            that cannot be written)
:class:`MissingExtrasError` the OpenMMLab parts used without the ``[openmmlab]`` extras
:class:`MemoryBudgetError`  a whole-frame pass whose estimated peak memory exceeds what
                            the machine (or ``--max-memory``) allows
==========================  ============================================================
"""

from __future__ import annotations

__all__ = [
    'ConfigError',
    'PosEncodingError',
    'CheckpointError',
    'UnreadableCheckpointError',
    'DataCheckError',
    'DatasetLayoutError',
    'LabelRangeError',
    'CropSizeError',
    'LabelSizeError',
    'UnreadableFileError',
    'NonFiniteInputError',
    'DataCheckWarning',
    'TrainingDivergedError',
    'NonFiniteFeaturesError',
    'ToolError',
    'CheckpointSaveError',
    'TrainingInterruptedError',
    'WorkDirLockedError',
    'WorkDirNotWritableError',
    'MissingExtrasError',
    'MemoryBudgetError',
    'USER_ERRORS',
]


class ConfigError(ValueError):
    """A config that cannot work as written; the message says which key to set."""


class PosEncodingError(ValueError):
    """A ``pos_encoding`` / ``preset`` / ``lh_config`` that cannot work.

    Attributes:
        key: the backbone argument at fault: ``'pos_encoding'``, ``'preset'`` or
            ``'lh_config'`` (config checks prefix it, e.g. ``model.backbone.preset``).
    """

    def __init__(self, message: str, key: str = 'pos_encoding'):
        super().__init__(message)
        self.key = key


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read, or whose weights do not fit the model; the
    message names the file and what to change."""


class UnreadableCheckpointError(CheckpointError):
    """A checkpoint file that cannot be read: ``checkpoint PATH cannot be read: PROBLEM``.

    Attributes:
        path: the file.
        problem: why, in a few words.
        refused_class: the qualified name of the Python class weights-only reading
            refused (e.g. ``'mmengine.logging.history_buffer.HistoryBuffer'``), or None
            when that was not the problem.
    """

    def __init__(
        self, path: str, problem: str, advice: str = '', refused_class: str | None = None
    ):
        self.path, self.problem, self.refused_class = path, problem, refused_class
        super().__init__(
            f'checkpoint {path!r} cannot be read: {problem}' + (f'; {advice}' if advice else '')
        )


class DataCheckError(ValueError):
    """Base class of the data checks' errors (the message says what to fix)."""


class DatasetLayoutError(DataCheckError, FileNotFoundError):
    """A dataset folder or file named by the config is missing or holds no data."""


class LabelRangeError(DataCheckError):
    """An annotation holds label values the model cannot take."""


class CropSizeError(DataCheckError):
    """The training crop is larger than the (resized) images."""


class LabelSizeError(DataCheckError):
    """An annotation has another size than its image."""


class UnreadableFileError(DataCheckError):
    """An image or annotation file cannot be read (corrupt, truncated, not an image)."""


class NonFiniteInputError(DataCheckError):
    """An input image holds NaN or infinite values (which would give a NaN prediction)."""


class DataCheckWarning(UserWarning):
    """Data that trains, but probably not as meant (e.g. annotations with only the ignore
    index)."""


class TrainingDivergedError(RuntimeError):
    """A loss became NaN or infinite (raised by the ``FiniteLossHook``)."""


class NonFiniteFeaturesError(RuntimeError):
    """In inference, the backbone's features became NaN or infinite although its input
    images are finite: input values or weights so large that they overflow inside the
    backbone (normalisation left out; weights of a diverging run), or NaN / infinite
    weights; the message says which."""


class ToolError(RuntimeError):
    """A failure the user can act on that is not a config or data mistake (a file that
    cannot be read or written, a launcher without its environment)."""


class CheckpointSaveError(ToolError):
    """A checkpoint could not be written (disk full, file-size limit, read-only or removed
    work dir). The message names the file and the cause; the previous checkpoint and the
    ``last_checkpoint`` pointer are left as they were."""


class TrainingInterruptedError(ToolError):
    """Training stopped on SIGTERM / SIGINT after saving (or keeping) a checkpoint.

    Attributes:
        signum: the signal received.
        exit_status: ``128 + signum``, the status a process killed by it would have.
    """

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_status = 128 + signum


class WorkDirLockedError(ToolError):
    """Another live training run holds the work dir's lock file."""


class WorkDirNotWritableError(ToolError):
    """The work dir cannot be created or written (a read-only mount, an immutable folder,
    no permission, a path under a regular file)."""


class MissingExtrasError(ModuleNotFoundError, ToolError):
    """An OpenMMLab part of lookhere-dense (registries, configs, tools, entry points) used
    where the ``[openmmlab]`` extras are not installed; the message names the missing
    packages and how to install them. Also a ``ModuleNotFoundError``, for code that
    tries the import and falls back."""


class MemoryBudgetError(ConfigError):
    """The estimated peak memory of a pass exceeds the memory available (or the budget
    given); the message has the estimate, the limit and cheaper options.

    Attributes:
        estimate: the pass's estimated peak in bytes (None when not given).
        limit: the limit it exceeds, in bytes (None when not given).
        source: what the limit is (``'the --max-memory budget'``, ``'MemAvailable
            (/proc/meminfo)'``, ...; None when not given).
    """

    def __init__(
        self,
        message: str,
        estimate: int | None = None,
        limit: int | None = None,
        source: str | None = None,
    ):
        super().__init__(message)
        self.estimate, self.limit, self.source = estimate, limit, source


#: The errors the tools report as one ``error:`` line (exit status 2), never a traceback.
USER_ERRORS = (
    FileNotFoundError,
    ConfigError,
    PosEncodingError,
    CheckpointError,
    DataCheckError,
    TrainingDivergedError,
    NonFiniteFeaturesError,
    ToolError,
)
