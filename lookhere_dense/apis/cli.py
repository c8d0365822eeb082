"""What the command-line tools in ``tools/`` share: loading a config (also ``mmseg::`` /
``mmdet::`` package paths), the pre-flight checks, and turning the checks' errors into a
one-paragraph message instead of a traceback.

The tools work for mmseg and mmdet configs alike; the config's ``default_scope`` says
which (the segmentation data checks run for ``mmseg`` configs only).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import os.path as osp
import re
import sys
import warnings
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ..errors import USER_ERRORS, ConfigError
from ..validation import close_names, is_int, is_number, keyword_arguments

__all__ = [
    'quiet_mmengine_logger',
    'quiet_known_warnings',
    'resolve_config_path',
    'load_config',
    'set_work_dir',
    'preflight',
    'check_attn_backend',
    'check_flex_training',
    'run_main',
    'ToolArgumentParser',
    'CfgOptionsAction',
    'add_cfg_options_arg',
    'check_cfg_options',
    'add_threads_arg',
    'apply_threads',
    'positive_int',
    'non_negative_int',
    'positive_float',
    'non_negative_float',
    'parse_cfg_options',
    'add_launch_args',
    'parse_launch_args',
    'add_checkpoint_report_args',
    'checkpoint_report_parser',
    'start_checkpoint_report',
    'checkpoint_report_kwargs',
    'runner_job_kwargs',
    'add_amp_args',
    'amp_setting',
    'add_runner_job_args',
    'run_runner_job',
    'console_script',
    'progress',
    'amp_context',
    'report_device',
    'check_device',
    'start_tool',
    'tool_command',
    'log_rank0',
]


class ToolArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors end in one ``error: <message>`` line (exit
    status 2), like every other mistake :func:`run_main` reports."""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f'error: {message}\n')


def _literal_with_dicts(text: str) -> Any:
    """A Python literal in which ``dict(key=value, ...)`` calls are allowed too (what a
    config file would say: ``dict(type='Pretrained', checkpoint='w.pth')``).

    Raises:
        ValueError: anything else (names, other calls, expressions).
    """
    import ast

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == 'dict' and not node.args and all(k.arg for k in node.keywords):
                return {k.arg: value(k.value) for k in node.keywords}
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [value(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {value(k): value(v) for k, v in zip(node.keys, node.values)}
        return ast.literal_eval(node)

    return value(ast.parse(text.strip(), mode='eval').body)


#: ``dict(`` as an element of a list / tuple value (``[dict(type='X')]``), where a
#: bracket, parenthesis or comma comes before it
_DICT_IN_LIST = re.compile(r'[\[(,]\s*dict\(')


class CfgOptionsAction(argparse.Action):
    """``--cfg-options KEY=VALUE ...``: mmengine's ``DictAction`` (values parsed as
    numbers, bools, None, lists and tuples), imported when the option is used, with an
    argparse error naming an item that is not ``KEY=VALUE``; a value written as a config
    file writes a dict, ``dict(type='Pretrained', checkpoint='w.pth')``, is read as one
    (mmengine's parser recursed on it until Python gave up) and replaces the config's
    entry (``_delete_=True``), as in a config file that writes it whole; so are dicts in a
    list (``custom_hooks=[dict(type=...)]``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        bad = [v for v in values or [] if '=' not in v or not v.split('=', 1)[0].strip()]
        if bad:
            raise argparse.ArgumentError(
                self,
                f'{bad[0]!r} is not KEY=VALUE (e.g. train_cfg.max_iters=1000 or '
                'model.backbone.preset=lh90)',
            )
        from mmengine.config import DictAction

        action = DictAction(self.option_strings, self.dest)
        for item in values or []:
            key, text = item.split('=', 1)
            starts = text.strip().startswith('dict(')
            if not starts and not _DICT_IN_LIST.search(text):  # a plain value (a path...)
                action(parser, namespace, [item], option_string)
                continue
            try:
                parsed = _literal_with_dicts(text)
            except (ValueError, SyntaxError, TypeError):
                if not starts:  # e.g. a path with '[dict(' in it: mmengine's reading
                    action(parser, namespace, [item], option_string)
                    continue
                raise argparse.ArgumentError(
                    self,
                    f'{item!r}: the value cannot be read as dict(key=value, ...) with quoted '
                    f"strings (e.g. {key}=\"dict(type='Pretrained', checkpoint='w.pth')\"); "
                    'or set its keys one by one',
                ) from None
            if isinstance(parsed, dict):  # a dict given whole replaces the config's
                parsed = dict(parsed, _delete_=True)
            options = dict(getattr(namespace, self.dest, None) or {})
            options[key] = parsed
            setattr(namespace, self.dest, options)


def add_cfg_options_arg(parser: argparse.ArgumentParser, example: str) -> None:
    """Add ``--cfg-options`` (:class:`CfgOptionsAction`) to a tool's parser."""
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=CfgOptionsAction,
        metavar='KEY=VALUE',
        help=f'override config entries, e.g. {example} (lists: key="[a,b]")',
    )


@contextlib.contextmanager
def quiet_mmengine_logger(drop: Sequence[str] = ()) -> Iterator[None]:
    """Keep only warnings of the current mmengine logger inside the block (mmengine's
    ``init_weights`` logs every parameter at INFO, mmseg's ``IoUMetric`` a per-class
    table per evaluation), without those starting with one of ``drop``."""
    from mmengine.logging import MMLogger

    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not record.getMessage().startswith(tuple(drop))

    logger = MMLogger.get_current_instance()
    old, dropper = logger.level, _Drop()
    logger.setLevel(logging.WARNING)
    logger.addFilter(dropper)
    try:
        yield
    finally:
        logger.removeFilter(dropper)
        logger.setLevel(old)


def quiet_known_warnings() -> None:
    """Hide the warnings every run prints that are not the user's to fix
    (``pkg_resources is deprecated`` from mmengine's and mmcv's imports)."""
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated')
    # mmseg's own ADE20K configs pass reduce_zero_label to LoadAnnotations, which then
    # warns about its own planned deprecation on every pipeline build
    warnings.filterwarnings('ignore', message='`reduce_zero_label` will be deprecated')


def resolve_config_path(path: str) -> str:
    """``mmseg::segmenter/x.py`` -> the file inside the installed package,
    ``lookhere_dense::x.py`` -> the config shipped with lookhere-dense
    (:func:`lookhere_dense.config_path`); other paths unchanged.

    Raises:
        FileNotFoundError: naming the path (and the resolved one for package paths).
    """
    if path.startswith('lookhere_dense::'):
        from .. import config_path

        return config_path(path)
    if '::' in path:
        from mmengine.utils import get_installed_path

        package, rel = path.split('::', 1)
        full = osp.join(get_installed_path(package), '.mim', 'configs', rel)
        if not osp.isfile(full):
            raise FileNotFoundError(f'config {path!r} not found (looked for {full!r})')
        return full
    if not osp.isfile(path):
        from ..validation import close_names

        folder = osp.dirname(path)
        files = os.listdir(folder or '.') if osp.isdir(folder or '.') else []
        near = close_names(osp.basename(path), [f for f in files if f.endswith('.py')])
        raise FileNotFoundError(
            f'config file {path!r} not found'
            + (f'; did you mean {osp.join(folder, near[0])!r}?' if near else '')
        )
    if not path.endswith(('.py', '.json', '.yml', '.yaml')):
        kind = 'a checkpoint' if path.endswith(('.pth', '.pt', '.safetensors')) else 'no config'
        raise ConfigError(
            f'config {path!r} is {kind}: a config is a .py (or .json / .yaml) file; the '
            'tools take the config first, then the checkpoint (tools/test.py CONFIG '
            'CHECKPOINT)'
        )
    return path


def load_config(path: str, cfg_options: Optional[dict] = None):
    """``Config.fromfile`` (package paths allowed) with ``--cfg-options`` merged in
    (checked first: :func:`check_cfg_options`)."""
    from mmengine.config import Config
    from mmengine.config.utils import ConfigParsingError

    resolved = resolve_config_path(path)
    try:
        cfg = Config.fromfile(resolved)
    except ConfigParsingError as err:
        first = str(err).split('. You got this error')[0].strip()
        raise ConfigError(
            f'config {resolved!r} (or one of its _base_ files) cannot be read: {first}'
            + (
                ". A config with an import statement (import torch) is read as mmengine's "
                'new-style (lazy-import) config, which cannot inherit _base_ = [...]: drop '
                "the import and write values as plain text (dtype='float16', not "
                'torch.float16)'
                if 'lazy_import' in str(err)
                else ''
            )
        ) from None
    except SyntaxError as err:
        where = err.filename if err.filename and err.filename != '<unknown>' else None
        raise ConfigError(
            f'config {where or resolved!r}'
            + ('' if where else ' (or one of its _base_ files)')
            + f' is not valid Python: {err.msg} (line {err.lineno}: '
            f'{(err.text or "").strip()!r})'
        ) from None
    except TypeError as err:
        if 'cannot inherit from base' not in str(err):
            raise
        raise ConfigError(  # mmengine's merge of a child config into its _base_
            f'config {resolved!r}: {err} (e.g. init_cfg=dict(_delete_=True, '
            "type='Pretrained', checkpoint=...) where the base has init_cfg=None)"
        ) from None
    if cfg_options:
        opened = _open_unset_parents(cfg, cfg_options)
        check_cfg_options(cfg, cfg_options, lambda m: log_rank0(m, logging.WARNING))
        follows = _schedule_follows(cfg, cfg_options)
        cfg.merge_from_dict(cfg_options)
        _drop_delete_marks(cfg, cfg_options)
        _typed_if_built(cfg, opened)
        _report_schedule(cfg, cfg_options, follows)
    return cfg


def _drop_delete_marks(cfg, cfg_options: Mapping[str, Any]) -> None:
    """Remove the ``_delete_`` that :class:`CfgOptionsAction` adds to a dict value where
    mmengine's merge left it: a key the config does not have (``model.backbone.lh_config``
    of a config that leaves it to the default) got the dict with ``_delete_`` in it, and the
    class then refused the unknown key ``_delete_`` the user never wrote."""
    from mmengine.config import ConfigDict

    for key, value in cfg_options.items():
        if not isinstance(value, Mapping):
            continue
        *path, last = key.split('.')
        parent: Any = cfg
        for part in path:
            parent = _child(parent, part)
        if isinstance(parent, list) and last.lstrip('-').isdigit():
            # a list element: mmengine merged the dict into it key by key; given whole,
            # it replaces the element
            parent[int(last)] = ConfigDict({k: v for k, v in value.items() if k != '_delete_'})
            continue
        node = _child(parent, last)
        if hasattr(node, 'pop'):
            node.pop('_delete_', None)


def _child(node: Any, part: str) -> Any:
    """``node[part]`` of a config (a list index for a list), None where there is none."""
    if isinstance(node, (list, tuple)):
        try:
            return node[int(part)]
        except (ValueError, IndexError):
            return None
    return node.get(part) if hasattr(node, 'get') else None


def _typed_if_built(cfg, opened: Sequence[Tuple[str, ...]]) -> None:
    """An ``init_cfg`` or ``default_hooks`` entry that :func:`_open_unset_parents` made
    from keys without a ``type`` (mmengine would fail on it after start-up, ``KeyError:
    'type'``): an ``init_cfg`` with a ``checkpoint`` is ``Pretrained``; anything else is
    refused, asking for the type."""
    for parts in opened:
        node: Any = cfg
        for part in parts:
            node = node.get(part) if hasattr(node, 'get') else None
        built = parts[-1] == 'init_cfg' or (len(parts) == 2 and parts[0] == 'default_hooks')
        if not built or not isinstance(node, Mapping) or 'type' in node:
            continue
        key = '.'.join(parts)
        if parts[-1] == 'init_cfg' and 'checkpoint' in node:
            node['type'] = 'Pretrained'
            log_rank0(
                f"--cfg-options {key}.checkpoint: {key}.type='Pretrained' (the config had {key}=None)"
            )
            continue
        raise ConfigError(
            f'--cfg-options {key}.{next(iter(node), "...")}: the config has {key}=None, so '
            f'there is nothing to change; give its type too ({key}.type=...)'
        )


def _schedule_follows(cfg, cfg_options: Mapping[str, Any]) -> Optional[Tuple[Any, int, int]]:
    """``train_cfg.max_iters=N``: the iteration-based LR schedulers that ended with the
    old length end with the new one (:func:`lookhere_dense.engine.schedules.schedule_to`;
    the config wrote their ``end`` as a number); ``param_scheduler`` options given too are
    merged after and win. Returns ``(the schedulers before, old length, new length)`` for
    the note (:func:`_report_schedule`, after the merge), or None."""
    new = cfg_options.get('train_cfg.max_iters')
    train_cfg = cfg.get('train_cfg')
    if not is_int(new) or new < 1 or not isinstance(train_cfg, Mapping):
        return None
    if not is_int(train_cfg.get('max_iters')) or train_cfg['max_iters'] == new:
        return None
    import copy

    from ..engine.schedules import schedule_to

    old = train_cfg['max_iters']
    before = copy.deepcopy(cfg.get('param_scheduler') or [])
    schedule_to(cfg, new)
    return before, old, new


def _report_schedule(
    cfg, cfg_options: Mapping[str, Any], follows: Optional[Tuple[Any, int, int]]
) -> None:
    """After the merge of ``--cfg-options``: the note on the schedule that runs (what
    :func:`_schedule_follows` and the user's ``param_scheduler`` options moved, compared
    with the config file's), and a warning for each iteration-based scheduler that ends
    after ``max_iters`` (it cannot finish: the LR never reaches the value it ends at)."""
    touched = any(
        k.split('.')[0] == 'param_scheduler' or k.startswith('train_cfg.max_iters')
        for k in cfg_options
    )
    if follows is None and not touched:
        return
    from ..engine.schedules import describe_schedule, unfinished_schedulers

    if follows is not None:
        before, old, new = follows
        changes = describe_schedule(before, cfg.get('param_scheduler') or [], old, new)
        if changes:
            log_rank0(
                f'--cfg-options train_cfg.max_iters={new} (the config: {old}): the LR schedule '
                f'follows: {"; ".join(changes)}',
                logging.WARNING,
            )
    for line in unfinished_schedulers(cfg):
        log_rank0(f'--cfg-options: {line}', logging.WARNING)


def _open_unset_parents(cfg, cfg_options: Mapping[str, Any]) -> List[Tuple[str, ...]]:
    """A key set below an entry the config leaves ``None`` (``init_cfg=None`` and
    ``model.backbone.init_cfg.checkpoint=PATH``), or a dict given for it, makes that entry
    a dict, where mmengine's merge would refuse to put a dict in place of ``None``;
    returns the key paths so opened (checked by :func:`_typed_if_built`)."""
    from mmengine.config import ConfigDict

    opened: List[Tuple[str, ...]] = []
    for key, value in cfg_options.items():
        node: Any = cfg  # a Config (not a Mapping, but read and written like one)
        parts = key.split('.')
        for i, part in enumerate(parts):
            if not hasattr(node, 'keys') or part not in node.keys():
                break
            last = i == len(parts) - 1
            if node[part] is None and (not last or isinstance(value, Mapping)):
                node[part] = ConfigDict()
                opened.append(tuple(parts[: i + 1]))
            node = node[part]
    return opened


def load_segmentation_job(
    config: str, checkpoint: str, split: str, cfg_options: Optional[dict], tool: str
):
    """The config of a tool that evaluates one mmseg checkpoint on one split
    (``tools/extrapolate.py``, ``tools/robustness.py``): the split name and the checkpoint
    file are checked before the config is read (:func:`load_config`), and a config of
    another scope is refused.

    Args:
        tool: how errors name the tool, e.g. ``'extrapolate.py'``.

    Raises:
        ConfigError: ``split`` is not ``'test'`` / ``'val'``, or the config's
            ``default_scope`` is not mmseg.
        FileNotFoundError: the checkpoint or the config is missing.
    """

    if split not in ('test', 'val'):
        raise ConfigError(f"split must be 'test' or 'val', got {split!r}")
    if not osp.isfile(checkpoint):
        raise FileNotFoundError(f'checkpoint {checkpoint!r} not found')
    cfg = load_config(config, cfg_options)
    scope = cfg.get('default_scope') or 'mmseg'
    if scope != 'mmseg':
        raise ConfigError(
            f'{tool} works on segmentation (mmseg) configs; this one has default_scope={scope!r}'
        )
    return cfg


_MISSING = object()

#: Keys that OpenMMLab sections take and configs often leave out, never taken for a
#: misspelling of a key the config has (``optim_wrapper.dtype`` is not ``type``).
OPTIONAL_KEYS = frozenset(
    {'dtype', 'loss_scale', 'fp16', 'clip_grad', 'accumulative_counts', 'decay_type'}
)


#: The registries of mmengine whose classes a config names by ``type`` (hooks, loops,
#: optimizers and their wrappers, schedulers, models, datasets, transforms, ...).
_TYPE_REGISTRIES = (
    'HOOKS', 'LOOPS', 'OPTIM_WRAPPERS', 'OPTIMIZERS', 'OPTIM_WRAPPER_CONSTRUCTORS',
    'PARAM_SCHEDULERS', 'MODELS', 'DATASETS', 'DATA_SAMPLERS', 'TRANSFORMS', 'METRICS',
    'EVALUATOR', 'VISUALIZERS', 'VISBACKENDS', 'LOG_PROCESSORS', 'RUNNERS', 'MODEL_WRAPPERS',
)  # fmt: skip


def _class_arguments(node: Any) -> frozenset:
    """The keyword arguments of the class a config section names by ``type`` (its
    ``__init__``'s, and its bases' where it passes ``**kwargs`` on): keys such a section
    may get though the config leaves them out (``default_hooks.checkpoint.save_best``).
    Empty where the section has no ``type`` or the class cannot be found."""
    typ = node.get('type') if isinstance(node, Mapping) else None
    if typ is None:
        return frozenset()
    cls = typ if isinstance(typ, type) else None
    if cls is None and isinstance(typ, str):
        try:
            import mmengine.registry as registries
        except ImportError:
            return frozenset()
        names = [typ] if '.' in typ else [typ, *(f'{s}.{typ}' for s in ('mmseg', 'mmdet'))]
        for attr in _TYPE_REGISTRIES:
            registry = getattr(registries, attr, None)
            for name in names:
                try:
                    found = registry.get(name) if registry is not None else None
                except Exception:  # noqa: B902 - a scope that is not installed
                    found = None
                if isinstance(found, type):
                    cls = found
                    break
            if cls is not None:
                break
    if cls is None:
        return frozenset()
    return frozenset(keyword_arguments(cls))


def _lookup(node: Any, parts: Sequence[str]):
    """``(value at parts, deepest existing node, index of the first missing part)``."""
    for i, part in enumerate(parts):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif (
            isinstance(node, (list, tuple))
            and part.lstrip('-').isdigit()
            and -len(node) <= int(part) < len(node)
        ):
            node = node[int(part)]
        else:
            return _MISSING, node, i
    return node, None, len(parts)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return 'True or False'
    if isinstance(value, (int, float)):
        return 'a number'
    if isinstance(value, (list, tuple)):
        return 'a list such as [1,2]' if not value else f'a list such as {list(value)}'
    return type(value).__name__


#: The schedule length key of each kind of training loop, and the loop types of each kind.
LOOP_LENGTH = {'epoch': 'max_epochs', 'iter': 'max_iters'}
LOOP_TYPES = {'EpochBasedTrainLoop': 'epoch', 'IterBasedTrainLoop': 'iter'}


def _loop_kind(train_cfg: Any, options: dict) -> Optional[str]:
    """``'epoch'`` / ``'iter'``: how the training loop of ``train_cfg`` (with ``options``'
    ``train_cfg.type`` / ``train_cfg.by_epoch``) counts; None when that is not known (no
    train_cfg, a custom loop)."""
    if not isinstance(train_cfg, dict):
        train_cfg = {}
    typ = options.get('train_cfg.type', train_cfg.get('type'))
    if typ is None:
        by_epoch = options.get('train_cfg.by_epoch', train_cfg.get('by_epoch'))
        return None if by_epoch is None else ('epoch' if by_epoch else 'iter')
    if isinstance(typ, type):
        from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

        if issubclass(typ, EpochBasedTrainLoop):
            return 'epoch'
        return 'iter' if issubclass(typ, IterBasedTrainLoop) else None
    return LOOP_TYPES.get(str(typ).split('.')[-1])


def _check_loop_length(cfg, options: dict) -> None:
    """``train_cfg.max_iters`` for a loop that counts epochs (or ``max_epochs`` for one
    that counts iterations) is an error naming the key the loop takes (the loop's
    constructor would refuse it after the whole set-up); so is a ``train_cfg.type`` that
    switches the kind of loop while the config keeps the other kind's length."""
    train_cfg = cfg.get('train_cfg')
    kind = _loop_kind(train_cfg, options)
    if kind is None:
        return
    train_cfg = train_cfg if isinstance(train_cfg, dict) else {}
    wanted = LOOP_LENGTH[kind]
    other = [k for k in LOOP_LENGTH.values() if k != wanted]
    loop = 'EpochBasedTrainLoop' if kind == 'epoch' else 'IterBasedTrainLoop'
    counts = 'epochs' if kind == 'epoch' else 'iterations'

    def wrong(name: str) -> bool:
        return name != wanted and bool(close_names(name, other))

    for key in options:
        parts = key.split('.')
        if len(parts) == 2 and parts[0] == 'train_cfg' and wrong(parts[1]):
            has = train_cfg.get(wanted)
            raise ConfigError(
                f'--cfg-options {key}={options[key]!r}: this config trains with {loop}, which '
                f'counts {counts} and takes no {parts[1]!r}; set train_cfg.{wanted} instead'
                + (f' (the config has train_cfg.{wanted}={has!r})' if has is not None else '')
                + '.'
            )
    switch = options.get('train_cfg.type')
    kept = [k for k in train_cfg if wrong(k)] if switch is not None else []
    if kept:
        raise ConfigError(
            f"--cfg-options train_cfg.type={switch!r}: the config's train_cfg has "
            f'{kept[0]}={train_cfg[kept[0]]!r}, which {loop} does not take, and --cfg-options '
            'cannot remove a key. Write a config that inherits this one and sets '
            f"train_cfg=dict(_delete_=True, type='{loop}', {wanted}=..., val_interval=...)."
        )


#: Keys that OpenMMLab takes as one number or as several, and what each entry must be: a
#: list of those may replace a number there (``out_indices=-1`` or ``(2, 5, 8, 11)``).
ONE_OR_MORE: Dict[str, Callable[[Any], bool]] = {
    'out_indices': is_int,
    'in_index': is_int,
    'in_channels': is_int,  # SimpleFPN / mmseg heads: one map's, or one per level / input
    'crop_size': is_int,
    'img_size': is_int,
    'size': is_int,
    'stride': is_int,
    'scale': is_number,
    'img_scale': is_number,
    'scale_factor': is_number,
}


def _one_or_more(key: str, value: Any) -> bool:
    """Whether ``value`` is a list that may replace a number at ``key``
    (:data:`ONE_OR_MORE`)."""
    entry = ONE_OR_MORE.get(key)
    return entry is not None and bool(value) and all(map(entry, value))


def _warn_top_level_data_root(
    cfg, options: Mapping[str, Any], warn: Callable[[str], None]
) -> None:
    """``--cfg-options data_root=PATH`` changes the top-level variable only: the datasets
    copied its value when the config was read, so nothing moves. Say which keys do."""
    if 'data_root' not in options or 'data_root' not in cfg.keys():
        return
    keys = [
        f'{split}_dataloader.dataset.data_root'
        for split in ('train', 'val', 'test')
        if isinstance(cfg.get(f'{split}_dataloader'), Mapping)
        and isinstance(cfg[f'{split}_dataloader'].get('dataset'), Mapping)
        and 'data_root' in cfg[f'{split}_dataloader']['dataset']
    ]
    if keys:
        warn(
            f"--cfg-options data_root={options['data_root']!r} changes the config's top-level "
            'data_root only: its datasets copied the old value when the config was read, so '
            f'they keep it. Set {" ".join(k + "=PATH" for k in keys)} instead (the data '
            'check names the keys of wrapped datasets).'
        )


#: the top-level config keys a run reads (mmengine's ``Runner`` arguments; mmseg's
#: ``tta_model``); the others are variables of the file (``train_pipeline``,
#: ``crop_size``, a top-level ``data_preprocessor`` the model's replaces)
RUN_SECTIONS = frozenset(
    (
        'model', 'work_dir', 'train_dataloader', 'val_dataloader', 'test_dataloader',
        'train_cfg', 'val_cfg', 'test_cfg', 'auto_scale_lr', 'optim_wrapper',
        'param_scheduler', 'val_evaluator', 'test_evaluator', 'default_hooks',
        'custom_hooks', 'load_from', 'resume', 'launcher', 'env_cfg', 'log_processor',
        'log_level', 'visualizer', 'default_scope', 'randomness', 'experiment_name',
        'tta_model',
    )
)  # fmt: skip


def _copies_of(value: Any, node: Any, path: str, depth: int = 6) -> List[str]:
    """The keys under ``node`` (at ``path``) whose value equals ``value``."""
    if depth < 0:
        return []
    if node == value:
        return [path]
    items = (
        node.items()
        if isinstance(node, Mapping)
        else enumerate(node)
        if isinstance(node, (list, tuple))
        else ()
    )
    return [c for k, v in items for c in _copies_of(value, v, f'{path}.{k}', depth - 1)]


def _warn_top_level_copies(cfg, options: Mapping[str, Any], warn: Callable[[str], None]) -> None:
    """``--cfg-options train_pipeline.2.scale=...`` (or ``crop_size=...``) changes a variable
    of the config file only: the sections that use it copied its value when the file was
    read (mmseg's ``train_dataloader.dataset.pipeline = train_pipeline``), so the run is as
    before. Say which keys do change it. For list / dict variables, found by value."""
    for key in options:
        top, _, rest = key.partition('.')
        value = cfg.get(top) if top in cfg.keys() else None
        if top in RUN_SECTIONS or not isinstance(value, (list, tuple, Mapping)) or not value:
            continue
        copies = [
            c
            for other in cfg.keys()
            if other in RUN_SECTIONS
            for c in _copies_of(value, cfg[other], other)
        ]
        targets = [f'{c}.{rest}' if rest else c for c in copies]
        if copies and not any(t in options for t in targets):  # not set beside it
            keys = ' '.join(targets)
            warn(
                f'--cfg-options {key}: {top} is a variable of the config file, which '
                f'{", ".join(copies)} copied when the file was read: changing it changes no '
                f'copy, and the run is as before. Set {keys} instead.'
            )


def check_cfg_options(cfg, options: dict, warn: Callable[[str], None]) -> None:
    """Check ``--cfg-options`` against the config they override.

    * a value whose type cannot replace the config's (a word for a number or a bool, a
      word for a list, a plain value for a whole section, a list for a number except where
      OpenMMLab takes one or several: :data:`ONE_OR_MORE`) is an error naming the option
      and what the config has there (``None`` is always allowed: it switches things off);
    * a key the config does not have but that is close to one it has (``max_iter`` for
      ``max_iters``) is an error naming the close keys; other new keys are added (new
      keys are legitimate), with a warning when their section is new too; the keys of
      :data:`OPTIONAL_KEYS` are never taken for misspellings;
    * ``train_cfg.max_iters`` on a loop that counts epochs (``EpochBasedTrainLoop``, as
      mmdet's schedules) is an error that names ``train_cfg.max_epochs``, and the reverse;
    * a top-level ``data_root``, which moves no dataset (they copied it when the config was
      read), gets a warning naming the dataset keys; so does any list / dict variable of
      the file that sections copied (``train_pipeline``, ``crop_size``), naming the copies.

    Raises:
        lookhere_dense.errors.ConfigError: naming the option and the expected value.
    """
    _check_loop_length(cfg, options)
    _warn_top_level_data_root(cfg, options, warn)
    _warn_top_level_copies(cfg, options, warn)

    for key, value in options.items():
        parts = key.split('.')
        old, parent, depth = _lookup(cfg._cfg_dict if hasattr(cfg, '_cfg_dict') else cfg, parts)
        if old is _MISSING:
            where = '.'.join(parts[:depth]) or 'the top level'
            names = list(parent) if isinstance(parent, dict) else []
            close = close_names(parts[depth], names)
            if (
                close
                and parts[depth] not in OPTIONAL_KEYS
                and parts[depth] not in _class_arguments(parent)
            ):
                raise ConfigError(
                    f'--cfg-options {key}: the config has no {parts[depth]!r} '
                    f'in {where}; did you mean {" or ".join(close)}?'
                )
            if depth < len(parts) - 1:
                warn(
                    f'--cfg-options {key}: the config has no {parts[depth]!r} in {where}; '
                    'it is added as a new section'
                )
            continue
        if value is None or old is None:
            continue
        bad = None
        if isinstance(old, bool):
            bad = not isinstance(value, bool)
        elif isinstance(old, (int, float)):
            bad = isinstance(value, (str, dict)) or (
                isinstance(value, (list, tuple)) and not _one_or_more(parts[-1], value)
            )
        elif isinstance(old, (list, tuple)):
            bad = isinstance(value, str)
        elif isinstance(old, dict):
            bad = not isinstance(value, dict)
        if bad:
            shown = (
                f'the section {key} (set one of its keys, e.g. {key}.{next(iter(old))}=...)'
                if isinstance(old, dict) and old
                else _kind(old)
            )
            raise ConfigError(
                f'--cfg-options {key}={value!r}: expected {shown}; the config has {key}={old!r}'
            )


def parse_cfg_options(pairs: Sequence[str]) -> dict:
    """``['a.b=1', 'c=[2,3]']`` -> ``{'a.b': 1, 'c': [2, 3]}``: ``KEY=VALUE`` overrides read
    exactly as a tool's ``--cfg-options`` reads them (:class:`CfgOptionsAction`; a later
    key wins)."""
    namespace = argparse.Namespace()
    CfgOptionsAction(option_strings=['--cfg-options'], dest='cfg_options')(
        None, namespace, list(pairs)
    )
    return getattr(namespace, 'cfg_options', None) or {}


def set_work_dir(cfg, work_dir: Optional[str], config_path: str) -> None:
    """``--work-dir`` > the config's ``work_dir`` > ``work_dirs/<config name>``.

    Raises:
        lookhere_dense.errors.ConfigError: the work dir exists and is not a folder.
    """
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        name = osp.splitext(osp.basename(config_path.split('::')[-1]))[0]
        cfg.work_dir = osp.join('./work_dirs', name)
    if osp.exists(cfg.work_dir) and not osp.isdir(cfg.work_dir):
        raise ConfigError(
            f'the work dir {cfg.work_dir!r} is a file, not a folder: choose another --work-dir'
        )


def _number(text: str, cast: type, low: float, strict: bool) -> Any:
    """``text`` as ``cast`` (int: a whole number), at least ``low`` (above it where
    ``strict``; NaN refused); else an ``argparse.ArgumentTypeError`` argparse names the
    flag in."""
    try:
        value = cast(text)
    except ValueError:
        what = 'a whole number' if cast is int else 'a number'
        raise argparse.ArgumentTypeError(f'expected {what}, got {text!r}') from None
    if not (value > low if strict else value >= low):  # also NaN
        bound = f'> {low}' if strict else f'>= {low}'
        shown = value if cast is int else text.strip()
        raise argparse.ArgumentTypeError(f'must be {bound}, got {shown}')
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    return _number(text, int, 1, strict=False)


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    return _number(text, int, 0, strict=False)


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    return _number(text, float, 0, strict=True)


def non_negative_float(text: str) -> float:
    """argparse type: a number >= 0."""
    return _number(text, float, 0, strict=False)


def add_threads_arg(parser, default: Optional[int] = None) -> None:
    """Add ``--threads`` (PyTorch intra-op CPU threads) to a tool's parser."""
    parser.add_argument(
        '--threads',
        type=positive_int,
        default=default,
        metavar='N',
        help='CPU threads for PyTorch ops (torch.set_num_threads); default: '
        + ("PyTorch's choice" if default is None else str(default))
        + '. On a busy machine 1 thread can be several times faster for small models',
    )


def apply_threads(threads: Optional[int]) -> None:
    """``torch.set_num_threads(threads)`` unless None."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f'--threads must be >= 1, got {threads}')
        import torch

        torch.set_num_threads(threads)


def add_launch_args(parser: argparse.ArgumentParser) -> None:
    """Add what every command that runs a Runner takes: ``--launcher``, ``--local_rank``
    (passed by ``torch.distributed.launch``; :func:`parse_launch_args` hands it on) and
    ``--threads``."""
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher; "pytorch" under torchrun',
    )
    parser.add_argument(
        '--local_rank',
        '--local-rank',
        type=int,
        default=0,
        help='set by torch.distributed.launch; do not pass by hand',
    )
    add_threads_arg(parser)


def parse_launch_args(
    parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]
) -> argparse.Namespace:
    """Parse ``argv`` and set ``LOCAL_RANK`` from ``--local_rank`` where the launcher did
    not (a parser with :func:`add_launch_args`)."""
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def add_checkpoint_report_args(
    parser: argparse.ArgumentParser,
    *,
    split: str,
    images: str,
    outputs: str,
    name: str,
    cfg_example: str,
) -> None:
    """Add the arguments of a report on one checkpoint (``tools/extrapolate.py``,
    ``tools/robustness.py``): ``config``, ``checkpoint``, ``--split`` (default ``split``),
    ``--max-images`` (``images``: what N images get), ``--out-dir`` (default
    ``work_dirs/<config name>/<name>``, holding ``outputs``), ``--name`` (default
    ``name``), ``--device``, ``--cfg-options`` (``cfg_example``), ``--amp`` /
    ``--amp-dtype`` (:func:`add_amp_args`) and ``--threads``."""
    parser.add_argument('config', help='the segmentation config the checkpoint was trained with')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--split',
        choices=[split] + [s for s in ('val', 'test') if s != split],
        default=split,
        help=f'which dataloader of the config to use (default: {split})',
    )
    parser.add_argument(
        '--max-images',
        type=positive_int,
        default=None,
        metavar='N',
        help=f'{images} only the first N images of the split (N >= 1; default: all)',
    )
    parser.add_argument(
        '--out-dir',
        default=None,
        help=f'folder for {outputs} (default: work_dirs/<config name>/{name})',
    )
    parser.add_argument(
        '--name', default=name, help=f'file name stem of the outputs (default: {name})'
    )
    parser.add_argument(
        '--device', default=None, help='cpu or cuda[:N] (default: cuda when available, else cpu)'
    )
    add_cfg_options_arg(parser, cfg_example)
    add_amp_args(parser, 'the model predicts')
    add_threads_arg(parser)


def checkpoint_report_parser(doc: str, **report_args: str) -> ToolArgumentParser:
    """The parser of a report on one checkpoint: described by the first line of ``doc``,
    with :func:`add_checkpoint_report_args` (``report_args`` are its keyword arguments)."""
    parser = ToolArgumentParser(description=doc.split('\n')[0])
    add_checkpoint_report_args(parser, **report_args)
    return parser


def start_checkpoint_report(args: argparse.Namespace):
    """What a report on one checkpoint does first (:func:`start_tool`, then
    :func:`check_device` of ``--device``); returns the context its model runs in
    (:func:`amp_context`: ``--amp``)."""
    start_tool(args.config, args.threads)
    check_device(args.device)
    return amp_context(args, args.device)


def checkpoint_report_kwargs(args: argparse.Namespace, script: str, argv) -> dict:
    """The keyword arguments of a report function that come from
    :func:`add_checkpoint_report_args`: ``split``, ``out_dir``, ``name``, ``device``,
    ``cfg_options`` and ``command`` (:func:`tool_command` of ``script``)."""
    names = ('split', 'out_dir', 'name', 'device', 'cfg_options')
    return dict({k: getattr(args, k) for k in names}, command=tool_command(script, argv))


def add_amp_args(parser: argparse.ArgumentParser, what: str) -> None:
    """Add ``--amp`` (``what`` runs in mixed precision) and ``--amp-dtype``
    (``bfloat16``, the default, or ``float16``, CUDA only; checked where the device is
    known: :func:`lookhere_dense.engine.amp.amp_dtype`)."""
    parser.add_argument(
        '--amp',
        action='store_true',
        help=f'mixed precision: {what} under torch.autocast with --amp-dtype (CPU: bfloat16 '
        'only; CUDA: bfloat16 or float16)',
    )
    parser.add_argument(
        '--amp-dtype',
        choices=['bfloat16', 'float16'],
        default=None,
        help='the autocast dtype with --amp (default: bfloat16; float16 needs CUDA)',
    )


def amp_setting(args: argparse.Namespace) -> Optional[str]:
    """The autocast dtype ``--amp`` / ``--amp-dtype`` ask for (:func:`add_amp_args`), or
    None without ``--amp``.

    Raises:
        lookhere_dense.errors.ConfigError: ``--amp-dtype`` without ``--amp``.
    """
    if args.amp_dtype is not None and not args.amp:
        raise ConfigError(f'--amp-dtype {args.amp_dtype} needs --amp')
    return (args.amp_dtype or 'bfloat16') if args.amp else None


def add_runner_job_args(
    parser: argparse.ArgumentParser,
    *,
    what: str,
    cfg_example: str,
    verbose_extra: str,
    memory_help: str,
    amp_help: str,
) -> None:
    """Add the options of a command that runs a Runner job on a config
    (``tools/train.py``, ``tools/test.py``): ``--work-dir`` (``what`` it holds),
    ``--cfg-options``, ``--skip-data-check``, ``--verbose``, ``--max-memory``, ``--amp`` /
    ``--amp-dtype`` (:func:`add_amp_args`) and the launch options
    (:func:`add_launch_args`); :func:`runner_job_kwargs` reads them back."""
    parser.add_argument(
        '--work-dir',
        help=f"folder for {what} (default: the config's work_dir, else work_dirs/<config name>)",
    )
    add_cfg_options_arg(parser, cfg_example)
    data = parser.add_mutually_exclusive_group()
    data.add_argument(
        '--skip-data-check',
        action='store_true',
        help='do not run the data checks first (folders are still checked when the '
        'dataloaders are built)',
    )
    data.add_argument(
        '--check-all-data',
        action='store_true',
        help='decode every image and annotation of the checked splits before the run '
        '(default: a sample of 64 per split; every file is slow on a large dataset): '
        'finds the corrupt file a run stopped on',
    )
    parser.add_argument(
        '--verbose',
        action='store_true',
        help='also show on the terminal what only the log file gets '
        f"(mmengine's environment, config and hook listing, {verbose_extra})",
    )
    parser.add_argument('--max-memory', metavar='SIZE', help=memory_help)
    add_amp_args(parser, amp_help)
    add_launch_args(parser)


def runner_job_kwargs(args: argparse.Namespace) -> dict:
    """The keyword arguments :func:`lookhere_dense.apis.train.train_model` and
    :func:`lookhere_dense.apis.test.evaluate_checkpoint` share, from their commands'
    arguments (:func:`add_runner_job_args`): ``work_dir``, ``cfg_options``, ``launcher``,
    ``verbose``, ``max_memory``, ``amp``, ``amp_dtype`` and ``check_data`` (False for
    ``--skip-data-check``, ``'all'`` for ``--check-all-data``, else True)."""
    names = ('work_dir', 'cfg_options', 'launcher', 'verbose', 'max_memory')
    dtype = amp_setting(args)
    check = 'all' if getattr(args, 'check_all_data', False) else not args.skip_data_check
    return dict(
        {k: getattr(args, k) for k in names},
        amp=dtype is not None,
        amp_dtype=dtype,
        check_data=check,
    )


def run_runner_job(args: argparse.Namespace, function: str, *positional: Any, **kwargs: Any):
    """What ``tools/train.py`` and ``tools/test.py`` do with their arguments:
    :func:`start_tool`, then import ``function`` (``'module:name'``, after the config was
    found: the heavy imports come last) and call it with ``args.config``, ``positional``,
    ``kwargs`` and :func:`runner_job_kwargs`; returns what it returns."""
    import importlib

    start_tool(args.config, args.threads)  # a missing config fails before the heavy imports
    module, name = function.split(':')
    run = getattr(importlib.import_module(module), name)
    return run(args.config, *positional, **kwargs, **runner_job_kwargs(args))


def progress(
    items: Iterable[Any],
    desc: str,
    unit: str = 'img',
    total: Optional[int] = None,
    leave: bool = True,
    stream: Optional[Any] = None,
) -> Iterator[Any]:
    """``items``, showing how far a long pass is: tqdm's bar on a terminal; elsewhere (a
    log file, ``nohup``, Slurm, CI, a pipe) at most ten plain lines per pass (every
    ``ceil(n / 10)``-th item and the last),
    ``desc: k/n unit (elapsed s, ETA s)``, where tqdm would print nothing.

    Args:
        total: the number of items. Default: None (``len(items)`` where it has one).
        leave: keep the terminal bar when done. Default: True.
        stream: where to write. Default: None (``sys.stderr``).
    """
    import time

    stream = sys.stderr if stream is None else stream
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:  # a generator, a loader over an iterable dataset
            total = None
    if getattr(stream, 'isatty', lambda: False)():
        from tqdm import tqdm

        yield from tqdm(
            items, desc=desc, unit=unit, total=total, leave=leave, dynamic_ncols=True, file=stream
        )
        return
    start = time.perf_counter()
    done = shown = 0

    def line() -> None:
        spent = time.perf_counter() - start
        left = f', ETA {spent / done * (total - done):.0f} s' if total and done < total else ''
        count = f'{done}/{total}' if total else f'{done}'
        print(f'{desc}: {count} {unit} ({spent:.0f} s{left})', file=stream, flush=True)

    every = -(-total // 10) if total else 1  # with the last: at most ten lines
    for item in items:
        yield item
        done += 1
        # a known length: every tenth and the last; else at 1, 2, 5, 10, 20, 50, ...
        if (done % every == 0 or done == total) if total else _round_count(done):
            line()
            shown = done
    if not total and done and shown != done:
        line()  # the end of a pass of unknown length


def _round_count(n: int) -> bool:
    """Whether ``n`` is 1, 2 or 5 times a power of ten."""
    while n % 10 == 0:
        n //= 10
    return n in (1, 2, 5)


def console_script(main: Callable[[Optional[List[str]]], object]) -> Callable[[], None]:
    """The console-script entry point of a tool's ``main``: :func:`run_main` (one-line
    errors)."""

    def cli() -> None:
        run_main(main)

    cli.__doc__ = f'``{main.__module__}``: its ``main`` with one-line errors (run_main).'
    return cli


def report_device(device: Optional[str]) -> str:
    """``device``, or ``'cuda'`` when CUDA is available, else ``'cpu'`` (the inference
    tools' ``--device`` default)."""
    if device:
        return device
    import torch

    return 'cuda' if torch.cuda.is_available() else 'cpu'


def check_device(device: Optional[str], flag: str = '--device') -> str:
    """The device a tool runs on, checked before any work: ``device`` as given, or
    :func:`report_device`'s default (cuda when available, else cpu).

    Raises:
        lookhere_dense.errors.ConfigError: ``device`` is not a device name, or names CUDA
            on a machine without it, or a ``cuda:N`` beyond its device count (``flag``
            names the setting).
    """
    if not device:
        return report_device(None)
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        parsed = None
    if parsed is None:  # a plugin device (npu, mlu, ...) parses once mmengine imported it
        try:
            import mmengine.device  # noqa: F401 - imports the installed device plugins

            parsed = torch.device(device)
        except (ImportError, RuntimeError, ValueError):
            raise ConfigError(
                f'{flag} {device}: not a device name (expected cpu or cuda[:N])'
            ) from None
    if parsed.type == 'cuda':
        if not torch.cuda.is_available():
            raise ConfigError(
                f'{flag} {device}: no CUDA device here (use --device cpu, or leave --device '
                'out: cuda when available, else cpu)'
            )
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise ConfigError(
                f'{flag} {device}: this machine has {count} CUDA device(s), '
                f'cuda:0 to cuda:{count - 1}'
            )
    return device


def amp_context(args: argparse.Namespace, device: Optional[str]):
    """The context an inference tool runs its model in: with ``--amp``,
    ``torch.autocast`` of ``--amp-dtype`` (default bfloat16) on ``device``
    (:func:`report_device`); else nothing
    (:func:`lookhere_dense.engine.amp.inference_autocast`)."""
    from ..engine.amp import inference_autocast

    return inference_autocast(amp_setting(args), report_device(device))


def start_tool(config: str, threads: Optional[int]) -> None:
    """What a tool does before its work: check that ``config`` exists (before the heavy
    imports), hide the known warnings, set the CPU threads."""
    resolve_config_path(config)
    quiet_known_warnings()
    apply_threads(threads)


def tool_command(script: str, argv: Optional[Sequence[str]]) -> str:
    """``python tools/<script> <arguments>``, the command line a report records."""
    return f'python tools/{script} ' + ' '.join(argv if argv is not None else sys.argv[1:])


def log_rank0(msg: str, level: int = logging.INFO) -> None:
    """Log through mmengine's current logger; in a multi-process run only rank 0 logs
    (errors are raised on every rank anyway)."""
    if os.environ.get('RANK', '0') != '0':
        return
    from mmengine.logging import print_log

    print_log(msg, logger='current', level=level)


def check_attn_backend(
    cfg, cuda: Optional[bool] = None, splits: Sequence[str] = ('train',)
) -> None:
    """Refuse an ``attn_backend`` the run cannot use, before the Runner is built (the
    engine refused it in the first step, after start-up, in a traceback). The backend's
    own ``can_run`` is asked (:mod:`lookhere_dense.lookhere.attention`; LEDiT's causal
    backends: ``causal.can_run``), for the run's device, a training pass where ``splits``
    train an unfrozen backbone (with the config's ``attn_drop_rate``), else an inference
    pass: ``'flex'`` training on CPU (no CPU backward), ``'triton'`` training (a forward
    only) or without CUDA, ``'fused'`` / ``'tiled'`` on CUDA or with attention dropout.
    Encodings without a LookHere engine (``rope2d``, ``abs``, ...) run SDPA whatever the
    backend: nothing to refuse. ``cuda``: whether the run is on CUDA (None:
    ``torch.cuda.is_available()``); ``splits``: the run's.

    Raises:
        lookhere_dense.errors.ConfigError: naming the key, its value, the backend's reason
            and what to use.
    """
    import dataclasses

    model = cfg.get('model')
    backbone = model.get('backbone') if isinstance(model, Mapping) else None
    backend = backbone.get('attn_backend') if isinstance(backbone, Mapping) else None
    if not isinstance(backend, str) or backend == 'auto':
        return
    import torch

    from ..lookhere.attention import REGISTRY, RETIRED, AttentionRequest, causal
    from ..lookhere.pos_encoding.spec import parse_pos_encoding

    named, backend = backend, RETIRED.get(backend, backend)  # a retired name's successor

    try:
        encoding = parse_pos_encoding(backbone.get('pos_encoding', 'lookhere')).name
    except Exception:  # the backbone's constructor names a bad spec
        return
    if cuda is None:
        cuda = torch.cuda.is_available()
    # a frozen backbone (frozen_exclude=[]) computes no gradients, but stays in training
    # mode: its attention dropout runs
    frozen = list(backbone.get('frozen_exclude', ['all']) or []) == []
    training = 'train' in splits and not frozen
    dropout = backbone.get('attn_drop_rate', 0.0)
    request = AttentionRequest(
        tokens=1,
        device=torch.device('cuda' if cuda else 'cpu'),
        dropout_p=float(dropout) if 'train' in splits and is_number(dropout) else 0.0,
        training=training,
        auto=False,
    )
    if encoding == 'ledit':
        if backend not in causal.CAUSAL_BACKENDS:
            return  # the constructor names the backends LEDiT runs
        request = causal.CausalRequest(**dataclasses.asdict(request), variant=backend)
        can_run = causal.can_run
    elif encoding in ('lookhere', 'alibi2d') and backend in REGISTRY:
        can_run = REGISTRY[backend].can_run
    else:
        return  # no LookHere engine: SDPA runs; an unknown name is the constructor's
    reason = can_run(request)
    if reason is None:
        return
    where, verb = ('CUDA' if cuda else 'CPU'), ('train' if training else 'run')
    msg = (
        f'model.backbone.attn_backend={named!r}'
        + (f' (now {backend!r})' if named != backend else '')
        + f" cannot {verb} on {where}: {reason}; {verb} with 'auto' (the first backend that "
        'runs here)'
    )
    inference = dataclasses.replace(request, training=False)
    if training and can_run(inference) is None:
        msg += ', or freeze the backbone (frozen_exclude=[]): it then runs inference'
    raise ConfigError(msg)


#: the name before it checked triton too (kept for callers of the old name)
check_flex_training = check_attn_backend


def preflight(
    cfg,
    splits: Sequence[str],
    require_pretrained: bool = False,
    check_pretrained: bool = True,
    check_data: Union[bool, str] = True,
    allow_random_init: bool = False,
    notes: Optional[List[str]] = None,
) -> List[str]:
    """The checks run before the Runner is built.

    * the model part (:func:`lookhere_dense.swap.check_model_cfg`) and the types of the
      optimizer, schedulers, hooks and ``init_cfg``
      (:func:`~lookhere_dense.config_checks.check_section_types`), batch sizes and the
      learning rate (:func:`~lookhere_dense.config_checks.check_loop_values`);
    * a ``model.pretrained`` inherited from a stock config that conflicts with the
      LookHereViT backbone's own weights is cleared, with a message
      (:func:`lookhere_dense.swap.clear_inherited_pretrained`);
    * pretrained files named by the config that do not exist: an error, unless
      ``allow_random_init`` (then dropped with a warning: training starts from random
      weights) — only when ``check_pretrained``;
    * the data of ``splits``: folders for any config; for mmseg configs also label
      values and the training crop size (:mod:`lookhere_dense.data.checks`), and a
      warning for a training crop the data preprocessor pads up
      (:func:`~lookhere_dense.data.checks.crop_padding_note`).

    Args:
        check_data: run the data checks on a sample of each split's files (True), on
            every file (``'all'``: every image and annotation decoded), or not (False).
            Default: True.
        require_pretrained: kept for compatibility: a missing file is an error unless
            ``allow_random_init``. Default: False.
        notes: the warnings printed are also appended here (to repeat them in the run's
            log). Default: None.

    Returns:
        The dropped pretrained paths.

    Raises:
        lookhere_dense.errors.ConfigError, lookhere_dense.errors.DataCheckError.
    """
    from ..config_checks import (
        check_loop_values,
        check_model_cfg,
        check_pretrained_files,
        check_section_types,
        check_training_crop_grid,
        clear_inherited_pretrained,
        preprocessor_scale_note,
    )
    from ..data.checks import (
        check_coco_annotations,
        check_dataset_layout,
        check_seg_data,
        crop_padding_note,
        drop_eval_pads,
        sync_label_checks,
        whole_frame_pad_note,
    )

    def warn(msg: str) -> None:
        log_rank0(msg, logging.WARNING)
        if notes is not None:
            notes.append(msg)

    check_model_cfg(cfg)
    if 'train' in splits:
        check_training_crop_grid(cfg)
    check_section_types(cfg)
    check_loop_values(cfg, splits)
    check_attn_backend(cfg, splits=splits)
    clear_inherited_pretrained(cfg, warn)
    scale = preprocessor_scale_note(cfg)
    if scale:
        warn(scale)
    for note in drop_eval_pads(cfg, splits):  # a pipeline fix, not a data check
        warn(note)
    if (cfg.get('default_scope') or 'mmseg') == 'mmseg':
        for note in sync_label_checks(cfg, splits):
            log_rank0(note)
    dropped: List[str] = []
    if check_pretrained:
        dropped = check_pretrained_files(
            cfg, allow_random_init=allow_random_init and not require_pretrained, warn=warn
        )
    if check_data:
        if (cfg.get('default_scope') or 'mmseg') == 'mmseg':
            every = dict(
                max_label_files=sys.maxsize, max_header_files=sys.maxsize, progress=log_rank0
            )
            unlabelled: dict = {}
            sizes = check_seg_data(
                cfg, splits, images_only=unlabelled, **(every if check_data == 'all' else {})
            )
            for where, n in sizes.items():
                log_rank0(f'data check passed: {where} has {n} images with annotations')
            for where, n in unlabelled.items():
                log_rank0(
                    f'data check passed: {where} has {n} images (its pipeline loads no '
                    'annotations: the predictions are written, not scored)'
                )
            padded = crop_padding_note(cfg) if 'train' in splits else None
            for note in (padded, whole_frame_pad_note(cfg, splits)):
                if note:
                    warn(note)
        else:
            check_dataset_layout(cfg, splits)
            for where, (images, anns) in check_coco_annotations(cfg, splits).items():
                log_rank0(
                    f'data check passed: {where} has {images} images and {anns} annotations, '
                    'every class of the dataset among its categories'
                )
    return dropped


#: mmcv's LoadImageFromFile on a file it cannot decode (also re-raised from a worker,
#: whose traceback quotes mmcv's source line, ``{filename}``, before the message)
_FAILED_IMAGE = re.compile(r'^[\w.]*Error: failed to load image: (.+?)\s*$', re.MULTILINE)

#: What Pillow raises for a file it cannot decode, naming none (an annotation read by
#: mmseg's LoadAnnotations, an image read with ``imdecode_backend='pillow'``)
_UNNAMED_DECODE = re.compile(
    r'^([\w.]*Error: (?:image file is truncated|cannot identify image file|broken data '
    r'stream).*?)\s*$',
    re.MULTILINE,
)


def _library_data_failure(err: BaseException) -> Optional[str]:
    """One line for a data file the libraries could not read in the middle of a run (the
    data checks decode a sample of the files, not all): mmcv's ``failed to load image:
    PATH`` assertion, naming the file, or a decoder's error that names none (a truncated
    annotation: Pillow's ``image file is truncated``), pointing to ``--check-all-data``;
    a 65- to 100-line traceback from a dataloader worker before. None for anything else."""
    text = str(err)
    if not text.startswith(('Caught ', 'Original ')):  # not a worker's re-raised traceback
        text = f'{type(err).__name__}: {text}'
    found = _FAILED_IMAGE.findall(text)
    if found:
        return (
            f'the image {found[-1]!r} could not be decoded (corrupt, truncated or not an '
            'image; the data check decodes a sample of the files, not all). Replace or '
            'remove it; a training run continues from its last checkpoint with --resume.'
        )
    unnamed = _UNNAMED_DECODE.findall(text)
    if unnamed:
        return (
            f'a data file could not be decoded ({unnamed[-1][:120]}), and the library does '
            'not name it: a corrupt or truncated image or annotation (the data check decodes '
            'a sample of 64 files per split, not all). Rerun with --check-all-data to decode '
            'every file first and name it; a training run continues from its last '
            'checkpoint with --resume.'
        )
    return None


def _say(line: str) -> None:
    """``line`` to stderr; nothing where stderr is gone (a SIGHUP: the terminal closed),
    so the exit status stays the run's."""
    try:
        print(line, file=sys.stderr)
    except OSError:
        pass


def _interrupted(err: BaseException) -> bool:
    """Whether ``err`` was raised while a ``KeyboardInterrupt`` was handled: mmengine's
    ``Config.pretty_text`` (called by every checkpoint save) turns any exception, a second
    Ctrl-C's included, into ``SyntaxError: Failed to format the config file`` with the
    whole config (a bare ``except:``). The project's own errors raised then (a checkpoint
    that could not be saved) are reported as themselves by :func:`run_main`."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def _while_stopping(err: BaseException) -> str:
    """``' While stopping: <type>: <first line>'`` for an error raised while a Ctrl-C
    was handled; ``''`` for mmengine's ``SyntaxError: Failed to format the config file``
    (its config formatting's bare ``except:`` around the Ctrl-C itself)."""
    text = str(err).strip()
    if isinstance(err, SyntaxError) and text.startswith('Failed to format the config'):
        return ''
    first = text.splitlines()[0][:200] if text else ''
    return f' While stopping: {type(err).__name__}' + (f': {first}' if first else '') + '.'


def run_main(
    main: Callable[[Optional[List[str]]], object], argv: Optional[List[str]] = None
) -> None:
    """Run a tool's ``main``; a configuration or data mistake prints ``error: <message>``
    to stderr and exits with status 2 instead of a traceback (Ctrl-C: a one-line note and
    status 130; a training run stopped by SIGTERM / SIGINT after saving its iteration:
    its one line and status 128 + the signal)."""
    try:
        main(argv)
    except KeyboardInterrupt:
        _say(
            'interrupted (Ctrl-C). A training run continues from its last checkpoint with --resume.'
        )
        sys.exit(130)
    except Exception as err:  # noqa: B902 - re-raised unless it is a user error
        if _interrupted(err) and not isinstance(err, USER_ERRORS):
            # a Ctrl-C turned into another error by a library (mmengine's config
            # formatting), or an error raised while stopping: the interrupt, and the
            # error's first line where it is not the formatting wrapper
            _say(
                'interrupted (Ctrl-C). A training run continues from its last checkpoint with '
                '--resume.' + _while_stopping(err)
            )
            sys.exit(130)
        known = _library_data_failure(err)
        if known is not None:
            _say(f'error: {known}')
            sys.exit(2)
        if not isinstance(err, USER_ERRORS):
            raise
        msg = str(err)
        if 'Original Traceback' in msg:  # raised in a dataloader worker: keep the message
            msg = re.sub(r'^[\w.]+Error: ', '', msg.strip().splitlines()[-1])
        _say(f'error: {msg}')
        sys.exit(getattr(err, 'exit_status', 2))  # a run stopped by a signal: 128 + signal
