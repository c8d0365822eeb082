"""The what-where distillation entry: an mmengine ``Runner`` on a ``LookWhereDistiller``
config (``configs/lookwhere_distill_vit-t_tiny-ade.py``); ``tools/lookwhere_study.py
distill`` calls :func:`run_distillation`."""

from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = ['run_distillation']


def run_distillation(
    config: str, work_dir: Optional[str] = None, cfg_options: Optional[Dict[str, Any]] = None
):
    """Train the student of ``config`` with the tools' Runner (mmengine's, its terminal
    quiet as in ``tools/train.py``: the run header and the libraries' warnings go to the
    log file; the work dir locked against a second run); returns the runner (its
    ``work_dir`` holds the checkpoint, whose ``student.*`` weights load into
    ``LookWhereViT`` with ``init_cfg=dict(type='Pretrained', checkpoint=..., prefix='student.')``).

    Raises:
        ConfigError / ValueError: the config's model is not a ``LookWhereDistiller``, or a
            bad option (named).
    """
    from lookhere_dense.apis.cli import load_config
    from lookhere_dense.apis.train import announce_log_file, build_runner, lock_work_dir
    from lookhere_dense.engine.terminal import warnings_to_run_log
    from lookhere_dense.registry import register_all_modules

    register_all_modules(init_default_scope=True)
    cfg = load_config(config, cfg_options)
    if cfg.model.get('type') != 'LookWhereDistiller':
        raise ValueError(
            f'{config}: model.type is {cfg.model.get("type")!r}; the distillation entry needs '
            "'LookWhereDistiller'"
        )
    if work_dir is not None:
        cfg.work_dir = work_dir
    lock = lock_work_dir(cfg.work_dir, launcher=cfg.get('launcher', 'none'))  # two runs: refused
    try:
        with warnings_to_run_log():  # the libraries' deprecation warnings: log file only
            runner = build_runner(cfg)  # the tools' Runner: a quiet terminal
            announce_log_file(runner)
            runner.train()
    finally:
        if lock is not None:
            lock.release()
    return runner
