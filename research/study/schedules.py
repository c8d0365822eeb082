"""Training-length rewriting of a config: a run's ``--iters`` with its LR schedule
stretched or clipped to match."""

from __future__ import annotations

__all__ = ['schedule_to']


def schedule_to(cfg, iters: int) -> None:
    """Set the train loop of ``cfg`` to ``iters`` (in place) and clip / stretch its
    iteration-based schedulers: a scheduler that ran to the old end now runs to ``iters``,
    none runs past it (epoch-based ones are left alone).

    Raises:
        ValueError: ``cfg.train_cfg`` has no ``max_iters``.
    """
    old = cfg.train_cfg.get('max_iters')
    if old is None:
        raise ValueError('--iters needs an iteration-based train_cfg (max_iters)')
    cfg.train_cfg.max_iters = iters
    schedulers = cfg.get('param_scheduler') or []
    for sch in [schedulers] if isinstance(schedulers, dict) else schedulers:
        if sch.get('by_epoch', True):
            continue
        end = sch.get('end', old)
        sch['end'] = iters if end >= old else min(end, iters)
        sch['begin'] = min(sch.get('begin', 0), sch['end'] - 1)
        if 'T_max' in sch:
            sch['T_max'] = sch['end'] - sch['begin']
