"""What the command-line tools in ``tools/`` share: loading a config (also ``mmseg::`` /
``mmdet::`` package paths), the pre-flight checks, and turning the checks' errors into a
one-paragraph message instead of a traceback.

The tools work for mmseg and mmdet configs alike; the config's ``default_scope`` says
which (the segmentation data checks run for ``mmseg`` configs only).
"""
from __future__ import annotations

import argparse
import copy
import logging
import re
import os.path as osp
import sys
import warnings
from typing import Callable, List, Optional, Sequence

__all__ = ['quiet_known_warnings', 'resolve_config_path', 'load_config', 'set_work_dir',
           'preflight', 'run_main', 'build_model_from_checkpoint',
           'add_threads_arg', 'apply_threads', 'parse_cfg_options', 'REPO']

#: The repository root (``tools/`` and ``configs/`` live here).
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def quiet_known_warnings() -> None:
    """Hide the warnings every run prints that are not the user's to fix
    (``pkg_resources is deprecated`` from mmengine's and mmcv's imports)."""
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated')
    # mmseg's own ADE20K configs pass reduce_zero_label to LoadAnnotations, which then
    # warns about its own planned deprecation on every pipeline build
    warnings.filterwarnings('ignore', message='`reduce_zero_label` will be deprecated')


def resolve_config_path(path: str) -> str:
    """``mmseg::segmenter/x.py`` -> the file inside the installed package; other paths
    unchanged.

    Raises:
        FileNotFoundError: naming the path (and the resolved one for package paths).
    """
    if '::' in path:
        from mmengine.utils import get_installed_path
        package, rel = path.split('::', 1)
        full = osp.join(get_installed_path(package), '.mim', 'configs', rel)
        if not osp.isfile(full):
            raise FileNotFoundError(f'config {path!r} not found (looked for {full!r})')
        return full
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file {path!r} not found')
    return path


def load_config(path: str, cfg_options: Optional[dict] = None):
    """``Config.fromfile`` (package paths allowed) with ``--cfg-options`` merged in."""
    from mmengine.config import Config

    cfg = Config.fromfile(resolve_config_path(path))
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    return cfg


def parse_cfg_options(pairs: Sequence[str]) -> dict:
    """``['a.b=1', 'c=[2,3]']`` -> ``{'a.b': 1, 'c': [2, 3]}``: ``KEY=VALUE`` overrides read
    exactly as a tool's ``--cfg-options`` reads them (mmengine's ``DictAction``; a later
    key wins)."""
    from mmengine.config import DictAction

    namespace = argparse.Namespace()
    DictAction(option_strings=['--cfg-options'], dest='cfg_options')(
        None, namespace, list(pairs))
    return getattr(namespace, 'cfg_options', None) or {}


def set_work_dir(cfg, work_dir: Optional[str], config_path: str) -> None:
    """``--work-dir`` > the config's ``work_dir`` > ``work_dirs/<config name>``."""
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        name = osp.splitext(osp.basename(config_path.split('::')[-1]))[0]
        cfg.work_dir = osp.join('./work_dirs', name)


def add_threads_arg(parser, default: Optional[int] = None) -> None:
    """Add ``--threads`` (PyTorch intra-op CPU threads) to a tool's parser."""
    parser.add_argument(
        '--threads', type=int, default=default,
        help='CPU threads for PyTorch ops (torch.set_num_threads); default: '
        + ("PyTorch's choice" if default is None else str(default))
        + '. On a busy machine 1 thread can be several times faster for small models')


def apply_threads(threads: Optional[int]) -> None:
    """``torch.set_num_threads(threads)`` unless None."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f'--threads must be >= 1, got {threads}')
        import torch
        torch.set_num_threads(threads)


def _log(msg: str, level: int = logging.INFO) -> None:
    from mmengine.logging import print_log
    print_log(msg, logger='current', level=level)


def preflight(cfg, splits: Sequence[str], require_pretrained: bool = False,
              check_pretrained: bool = True, check_data: bool = True) -> List[str]:
    """The checks run before the Runner is built.

    * the model part (:func:`lookhere_dense.swap.check_model_cfg`);
    * pretrained files named by the config that do not exist: an error with
      ``require_pretrained``, else dropped with a warning (training starts from
      scratch) — only when ``check_pretrained``;
    * the data of ``splits``: folders for any config; for mmseg configs also label
      values and the training crop size (:mod:`lookhere_dense.data.checks`).

    Returns:
        The dropped pretrained paths.

    Raises:
        lookhere_dense.swap.ConfigError, lookhere_dense.data.checks.DataCheckError.
    """
    from .data.checks import check_dataset_layout, check_seg_data
    from .swap import ConfigError, check_model_cfg, drop_missing_pretrained

    check_model_cfg(cfg)
    dropped: List[str] = []
    if check_pretrained:
        if require_pretrained:
            missing: List[str] = []
            drop_missing_pretrained(copy.deepcopy(cfg), missing.append)
            if missing:
                raise ConfigError('--require-pretrained: ' + missing[0])
        dropped = drop_missing_pretrained(cfg, lambda m: _log(m, logging.WARNING))
    if check_data:
        if (cfg.get('default_scope') or 'mmseg') == 'mmseg':
            sizes = check_seg_data(cfg, splits)
            for where, n in sizes.items():
                _log(f'data check passed: {where} has {n} images with annotations')
        else:
            check_dataset_layout(cfg, splits)
    return dropped


def _user_errors() -> tuple:
    """Exception types whose message is shown without a traceback."""
    from .data.checks import DataCheckError
    from .swap import ConfigError
    return (ConfigError, DataCheckError, FileNotFoundError)


def run_main(main: Callable[[Optional[List[str]]], object],
             argv: Optional[List[str]] = None) -> None:
    """Run a tool's ``main``; a configuration or data mistake prints ``error: <message>``
    to stderr and exits with status 2 instead of a traceback."""
    try:
        main(argv)
    except _user_errors() as err:
        msg = str(err)
        if 'Original Traceback' in msg:  # raised in a dataloader worker: keep the message
            msg = re.sub(r'^[\w.]+Error: ', '', msg.strip().splitlines()[-1])
        print(f'error: {msg}', file=sys.stderr)
        sys.exit(2)


def build_model_from_checkpoint(cfg, checkpoint: str, device: str = 'cpu'):
    """Build ``cfg.model`` in its scope, load ``checkpoint`` into it (pretrained-weight
    settings of the config are ignored: the checkpoint has the weights), move it to
    ``device`` in eval mode.

    Returns:
        ``(model, dataset_meta)``; ``dataset_meta`` comes from the checkpoint's ``meta``
        (written by the Runner) or None.
    """
    from mmengine.registry import init_default_scope
    from mmengine.runner import load_checkpoint

    from .swap import model_registry

    if not osp.isfile(checkpoint):
        raise FileNotFoundError(f'checkpoint {checkpoint!r} not found')
    scope = cfg.get('default_scope') or 'mmseg'
    init_default_scope(scope)
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.pop('pretrained', None)
    backbone = model_cfg.get('backbone')
    if isinstance(backbone, dict):
        backbone.pop('init_cfg', None)
        backbone.pop('pretrained', None)
    model = model_registry(scope).build(model_cfg)
    ckpt = load_checkpoint(model, checkpoint, map_location='cpu', logger='silent')
    model.to(device).eval()
    meta = (ckpt.get('meta') or {}).get('dataset_meta') if isinstance(ckpt, dict) else None
    return model, meta
