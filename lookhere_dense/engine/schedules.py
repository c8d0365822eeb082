"""Training length and the LR schedule: a longer or shorter run keeps a schedule that ends
where training ends.

mmseg / mmdet configs write their schedulers' ``end`` as the ``max_iters`` of the file
(``end=max_iters`` is read once, when the config is read), so ``--cfg-options
train_cfg.max_iters=N`` alone left the LR decaying to the old length (or never finishing
its warm-up), without a word:

* :func:`schedule_to` sets a config's ``max_iters`` and moves its iteration-based
  schedulers with it (the tools call it for ``--cfg-options train_cfg.max_iters=N``; the
  extrapolation study for ``--iters``);
* :func:`keep_config_schedule` makes a resumed run follow the config's schedule
  (mmengine restores each scheduler's ``begin`` / ``end`` from the checkpoint, so a run
  resumed to train longer kept the old end).
"""

from __future__ import annotations

from typing import Any, Dict, List

__all__ = ['schedule_to', 'keep_config_schedule', 'PROGRESS_KEYS']


def schedule_to(cfg: Any, iters: int) -> List[str]:
    """Set the train loop of ``cfg`` to ``iters`` (in place) and clip / stretch its
    iteration-based schedulers: a scheduler that ran to the old end now runs to ``iters``
    (its ``T_max`` / ``total_steps`` with it, a ``MultiStepLR``'s milestones scaled by
    ``iters / old``), none runs past it (epoch-based ones are left alone).

    Returns:
        One line per scheduler changed (``param_scheduler[1] PolyLR: end 160000 -> 80``).

    Raises:
        ValueError: ``cfg.train_cfg`` has no ``max_iters``.
    """
    old = cfg.train_cfg.get('max_iters')
    if old is None:
        raise ValueError('--iters needs an iteration-based train_cfg (max_iters)')
    cfg.train_cfg.max_iters = iters
    schedulers = cfg.get('param_scheduler') or []
    single = isinstance(schedulers, dict)
    changes = []
    keys = ('begin', 'end', 'T_max', 'total_steps', 'milestones')
    for i, sch in enumerate([schedulers] if single else schedulers):
        if sch.get('by_epoch', True):
            continue
        before = {k: sch.get(k) for k in keys}
        end = sch.get('end', old)
        stretched = end >= old
        sch['end'] = iters if stretched else min(end, iters)
        sch['begin'] = min(sch.get('begin', 0), sch['end'] - 1)
        if 'T_max' in sch:
            sch['T_max'] = sch['end'] - sch['begin']
        if 'total_steps' in sch:  # OneCycleLR: it refuses to step past them
            sch['total_steps'] = sch['end'] - sch['begin']
        if isinstance(sch.get('milestones'), (list, tuple)):  # MultiStepLR: absolute steps
            scale = iters / old if stretched else 1.0
            sch['milestones'] = [min(iters, max(1, round(m * scale))) for m in sch['milestones']]
        moved = [
            f'{k} {before[k]} -> {sch[k]}'
            for k in keys
            if k in sch and before[k] != sch[k] and not (k == 'end' and before[k] is None)
        ] + ([f'end {sch["end"]} (was the length)'] if before['end'] is None else [])
        if moved:
            where = 'param_scheduler' if single else f'param_scheduler[{i}]'
            changes.append(f'{where} {sch.get("type")}: {", ".join(moved)}')
    return changes


#: A scheduler's state that is progress (kept from the checkpoint on resume); the rest
#: comes from the config (begin, end and what mmengine derives from them, e.g. PolyLR's
#: ``total_iters``).
PROGRESS_KEYS = ('last_step', '_global_step', '_last_value', 'base_values')


def keep_config_schedule(runner: Any, checkpoint: Dict[str, Any]) -> List[str]:
    """Before a resumed Runner loads the schedulers' state from ``checkpoint``: where a
    scheduler built from the config ends elsewhere than the saved one (and begins where
    it began), its saved settings are replaced by the config's (in place; the progress,
    :data:`PROGRESS_KEYS`, is kept), so a run resumed with another length follows its own
    schedule from the step it resumes at. A scheduler whose ``begin`` moved keeps the
    checkpoint's (its progress counts from ``begin``), said in the returned lines.
    mmengine's schedulers compute each step from the last value, so a schedule that had
    already reached its floor stays there.

    Returns:
        One line per scheduler changed (none when the config's schedule is the
        checkpoint's).
    """
    saved, built = checkpoint.get('param_schedulers'), getattr(runner, 'param_schedulers', None)
    if not isinstance(saved, list) or not isinstance(built, list) or len(saved) != len(built):
        return []
    changes = []
    for i, (state, sch) in enumerate(zip(saved, built)):
        if not isinstance(state, dict) or not hasattr(sch, 'state_dict'):
            continue
        own = sch.state_dict()
        if 'end' not in state or state.get('end') == own.get('end'):
            continue
        name = f'param_scheduler[{i}] {type(sch).__name__}'
        if state.get('begin') != own.get('begin'):  # its progress counts from begin
            changes.append(
                f"{name}: kept the checkpoint's (begin {state.get('begin')}, end "
                f"{state['end']}): the config's begins at {own.get('begin')}, and a "
                'schedule cannot move its start while it runs'
            )
            continue
        old = state['end']
        ended = state.get('_global_step', 0) >= old
        state.update({k: v for k, v in own.items() if k not in PROGRESS_KEYS})
        changes.append(
            f'{name}: end {old} -> {own["end"]}'
            + (
                f" (it had ended at step {old}, and mmengine's schedulers step from their "
                'last value: the extra steps stay at its final value; for a fresh schedule '
                'start a new run from the checkpoint, --cfg-options load_from=CKPT without '
                '--resume)'
                if ended
                else ''
            )
        )
    return changes
