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
  resumed to train longer kept the old end; and it loads the saved states into the
  config's schedulers in order, whatever their number and types): the config's schedule
  is replayed to the resume point (:func:`replay_schedule`).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..validation import keyword_arguments

__all__ = [
    'schedule_to',
    'describe_schedule',
    'unfinished_schedulers',
    'keep_config_schedule',
    'replay_schedule',
]

#: The settings of a scheduler that a change of the run's length moves.
_LENGTH_KEYS = ('begin', 'end', 'T_max', 'total_steps', 'milestones')


def schedule_to(cfg: Any, iters: int) -> List[str]:
    """Set the train loop of ``cfg`` to ``iters`` (in place) and clip / stretch its
    iteration-based schedulers: a scheduler that ran to the old end now runs to ``iters``
    (its ``T_max`` / ``total_steps`` with it, a ``MultiStepLR``'s milestones scaled by
    ``iters / old``), none runs past it (epoch-based ones are left alone).

    Returns:
        One line per scheduler changed (``param_scheduler[1] PolyLR: end 160000 -> 80``),
        and one for a warm-up the new length ends inside (:func:`describe_schedule`).

    Raises:
        ValueError: ``cfg.train_cfg`` has no ``max_iters``.
    """
    import copy

    old = cfg.train_cfg.get('max_iters')
    if old is None:
        raise ValueError('--iters needs an iteration-based train_cfg (max_iters)')
    cfg.train_cfg.max_iters = iters
    schedulers = cfg.get('param_scheduler') or []
    before = copy.deepcopy(schedulers)
    for sch in [schedulers] if isinstance(schedulers, dict) else schedulers:
        if sch.get('by_epoch', True):
            continue
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
    return describe_schedule(before, schedulers, old, iters)


def describe_schedule(before: Any, after: Any, old: int, new: int) -> List[str]:
    """What moved between the iteration-based schedulers ``before`` and ``after`` (a
    config's ``param_scheduler``: a list or one dict) of a run whose length went from
    ``old`` to ``new``: one line per scheduler changed (``param_scheduler[1] PolyLR: end
    160000 -> 80``), and one more where ``new`` ends inside a warm-up that ended before
    ``old`` (a scheduler that ended before the old length and after the new one): the
    warm-up is cut short and the schedulers after it (the decay) keep at most the last
    iterations, so the run ends at about the peak LR."""
    single = isinstance(after, dict)
    befores = [before] if isinstance(before, dict) else list(before or [])
    afters = [after] if single else list(after or [])
    changes = []
    for i, sch in enumerate(afters):
        if sch.get('by_epoch', True):
            continue
        where = 'param_scheduler' if single else f'param_scheduler[{i}]'
        b = befores[i] if i < len(befores) else None
        if b is None or b.get('type') != sch.get('type'):  # given whole (--cfg-options)
            changes.append(
                f'{where} {sch.get("type")}: begin {sch.get("begin", 0)}, end '
                f"{sch.get('end')} (not the config file's scheduler)"
            )
            continue
        moved = [
            f'{k} {b.get(k)} -> {sch[k]}'
            for k in _LENGTH_KEYS
            if k in sch and b.get(k) != sch[k] and not (k == 'end' and b.get(k) is None)
        ] + (
            [f'end {sch["end"]} (was the length)'] if b.get('end') is None and 'end' in sch else []
        )
        if moved:
            changes.append(f'{where} {sch.get("type")}: {", ".join(moved)}')

    def kept(j: int) -> bool:  # the config file's scheduler still at its place
        return j < len(afters) and afters[j].get('type') == befores[j].get('type')

    for i, b in enumerate(befores):
        end = b.get('end', old)
        if b.get('by_epoch', True) or not isinstance(end, int) or not new < end < old:
            continue
        if not kept(i):
            continue
        later = [
            f'param_scheduler[{j}] {c.get("type")}: iterations {afters[j].get("begin", 0)}-'
            f'{afters[j].get("end", new)} of {c.get("begin") or 0}-{c.get("end", old)} in the '
            'config'
            for j, c in enumerate(befores)
            if j != i and kept(j) and not c.get('by_epoch', True) and (c.get('begin') or 0) >= end
        ]
        if later:
            changes.append(
                f'max_iters={new} ends inside param_scheduler[{i}] {b.get("type")} (to {end} in '
                f'the config): the warm-up is cut short and the decay after it '
                f'({"; ".join(later)}) has (almost) nothing left: the run ends at about the '
                'peak LR'
            )
    return changes


def unfinished_schedulers(cfg: Any) -> List[str]:
    """One line per iteration-based scheduler of ``cfg`` that ends after
    ``train_cfg.max_iters``: the run stops before it finishes (a warm-up never reaches its
    peak, a decay never its end value)."""
    max_iters = (cfg.get('train_cfg') or {}).get('max_iters')
    schedulers = cfg.get('param_scheduler') or []
    single = isinstance(schedulers, dict)
    if not isinstance(max_iters, int):
        return []
    lines = []
    for i, sch in enumerate([schedulers] if single else schedulers):
        end = sch.get('end') if hasattr(sch, 'get') else None
        if sch.get('by_epoch', True) or not isinstance(end, int) or end <= max_iters:
            continue
        where = 'param_scheduler' if single else f'param_scheduler[{i}]'
        lines.append(
            f'{where} {sch.get("type")} ends at iteration {end}, after train_cfg.max_iters='
            f'{max_iters}: it cannot finish (the LR never reaches the value it ends at); set '
            f'its end to {max_iters} at most'
        )
    return lines


def keep_config_schedule(runner: Any, checkpoint: Dict[str, Any]) -> Optional[str]:
    """Before a resumed Runner loads the schedulers' and the optimizer's state from
    ``checkpoint``: where a scheduler built from the config begins or ends elsewhere than
    the saved one or has other settings (``PolyLR``'s ``power`` / ``eta_min``, ...: the
    arguments of its constructor), where the optimizer's values it starts from differ
    (``optim_wrapper.optimizer.lr``: the schedulers' ``base_values``), or the config builds other schedulers than the checkpoint saved (another
    number of them, or another type at a place: ``[LinearLR, PolyLR]`` resumed with
    ``[PolyLR]``; a saved state's type is told by its keys and ``param_name``, compared with
    each built scheduler's own ``state_dict()``), the schedule of a fresh run of this config
    is **replayed** up to the iteration the run resumes at (:func:`replay_schedule`), and
    the checkpoint's scheduler states and the optimizer's scheduled values (``lr``, ...;
    a value that only a dropped scheduler set, e.g. a momentum, gets the config's) are
    replaced by the replay's (in place), so the resumed run continues exactly as a fresh
    run of this config would from that iteration: the LR at the resume point may jump (up
    to a warm-up's or a decay's value of the new schedule), and the note gives it beside
    the checkpoint's. (mmengine pairs the saved states with the built schedulers one by
    one, in order: another scheduler got a state of the wrong type, a warm-up's included.)

    Patching only ``begin`` / ``end`` cannot do that: mmengine's schedulers compute each
    step from the last value, so a warm-up (``LinearLR``) stretched after it had ended went
    on multiplying the LR past the config's peak, and a decay whose ``begin`` had been
    clipped never ran. Where no replay is possible (epoch-based schedulers,
    ``ReduceOnPlateau`` ones, several optimizers, a checkpoint without the iteration or
    with other parameter groups) the checkpoint's schedule is kept and the note says so;
    where the config's schedulers are other ones than the checkpoint's there, it cannot
    be kept either, and the resume is refused.

    Returns:
        The note for the log: the schedulers moved or changed and the value at the resume
        point; None when the config's schedule is the checkpoint's.

    Raises:
        lookhere_dense.errors.CheckpointError: the config's schedulers are other ones than
            the checkpoint's (number or types) and the schedule cannot be replayed.
    """
    saved, built = checkpoint.get('param_schedulers'), getattr(runner, 'param_schedulers', None)
    if isinstance(saved, dict) and isinstance(built, dict):  # one list per optimizer
        pairs = [(saved.get(k), built[k], f'param_scheduler[{k!r}]') for k in built]
    else:
        pairs = [(saved, built, 'param_scheduler')]
    moved, other = [], False
    for states, schedulers, where in pairs:
        if not isinstance(states, list) or not isinstance(schedulers, list) or not schedulers:
            return None
        if not all(isinstance(state, dict) for state in states) or not all(
            hasattr(sch, 'state_dict') for sch in schedulers
        ):
            return None
        owns = [sch.state_dict() for sch in schedulers]
        if len(states) != len(schedulers) or not all(map(_same_kind, states, owns)):
            other = True
            names = ', '.join(_kind_name(state, owns, schedulers) for state in states)
            moved.append(
                f'{where}: [{names}] -> [{", ".join(type(s).__name__ for s in schedulers)}] '
                '(other schedulers)'
            )
            continue
        based = set()  # the optimizer's values (lr) the schedulers start from: once each
        for i, (state, sch, own) in enumerate(zip(states, schedulers, owns)):
            diff = [
                f'{k} {state[k]} -> {own.get(k)}'
                for k in ('begin', 'end') + _settings(sch)
                if k in state and k in own and _differ(state[k], own[k])
            ]
            if diff:
                moved.append(f'{where}[{i}] {type(sch).__name__}: {", ".join(diff)}')
            name = own.get('param_name')
            if name not in based and _differ(state.get('base_values'), own.get('base_values')):
                based.add(name)
                moved.append(
                    f"the optimizer's {name} (optim_wrapper.optimizer) "
                    f'{_short(state.get("base_values"))} -> {_short(own.get("base_values"))}'
                )
    if not moved:
        return None
    step = (checkpoint.get('meta') or {}).get('iter')
    optim_state = checkpoint.get('optimizer') or {}
    # what the wrapper's ``param_groups`` lists: the optimizer's groups, then (several
    # groups) mmengine's ``base_param_settings``, which its schedulers step too
    targets = optim_state.get('param_groups')
    if isinstance(targets, list) and optim_state.get('base_param_settings') is not None:
        targets = targets + [optim_state['base_param_settings']]
    why = 'several optimizers' if isinstance(built, dict) else _why_no_replay(built, step, targets)
    if why is not None and other:
        from ..errors import CheckpointError

        raise CheckpointError(
            f"--resume: the config's LR schedulers are other ones than those of "
            f'{getattr(runner, "_load_from", None) or "the checkpoint"!r} '
            f"({'; '.join(moved)}): mmengine would load each saved scheduler's state into "
            f'the one at its place, and a schedule cannot be replayed with {why}. Resume '
            "with the checkpoint's param_scheduler, or start a new run from its weights: "
            '--cfg-options load_from=CKPT without --resume.'
        )
    if why is not None:
        return (
            f"kept the checkpoint's LR schedule, not the config's ({'; '.join(moved)}): a "
            f"schedule cannot be replayed with {why}; for the config's schedule start a "
            'new run from the checkpoint, --cfg-options load_from=CKPT without --resume'
        )
    name = built[0].param_name
    was = targets[0].get(name)
    dropped = {s.get('param_name') for s in saved} - {sch.param_name for sch in built}
    states, values = replay_schedule(built, step)
    saved[:] = states
    fresh_groups = built[0].optimizer.param_groups
    for i, (group, value) in enumerate(zip(targets, values)):
        group.update(value)
        # the values the config's schedulers start from (``initial_lr``): the config's
        fresh = fresh_groups[i] if i < len(fresh_groups) else {}
        for key in [k for k in fresh if str(k).startswith('initial_') and k in group]:
            group[key] = fresh[key]
        # what only a scheduler of the checkpoint set (a momentum): the config's value
        # (base_param_settings, after the groups, has no fresh group of its own)
        for key in dropped | ({'betas'} if 'momentum' in dropped else set()):
            if key in fresh and key not in value:
                group[key] = fresh[key]
    now = values[0].get(name)
    at = (
        f"; at iteration {step} the {name} is the new schedule's {now:.4g} (the checkpoint's "
        f'{was:.4g}), as in a fresh run of this config'
        if isinstance(was, float) and isinstance(now, float)
        else ''
    )
    return (
        "the LR schedule follows this run's config, not the checkpoint's, replayed to "
        f'iteration {step}: {"; ".join(moved)}{at}'
    )


def _differ(a: Any, b: Any) -> bool:
    """Whether two saved settings differ (values that cannot be compared do not)."""
    try:
        return bool(a != b)
    except Exception:  # noqa: B902 - arrays and the like: taken as equal
        return False


def _short(values: Any) -> str:
    """Per-group values as the note gives them: one value where the groups agree."""
    if isinstance(values, (list, tuple)) and values and all(v == values[0] for v in values):
        values = values[0]
    if isinstance(values, float):
        return f'{values:.4g}'
    if isinstance(values, (list, tuple)):
        return (
            '[' + ', '.join(f'{v:.4g}' if isinstance(v, float) else str(v) for v in values) + ']'
        )
    return str(values)


def _settings(scheduler: Any) -> Tuple[str, ...]:
    """The settings a scheduler's constructor takes besides the ones every scheduler has
    (``LinearLR``: ``start_factor``, ``end_factor``; ``PolyLR``: ``eta_min``, ``power``),
    as its ``state_dict()`` keeps them: a config that changes one of them changes the
    schedule (its run state -- steps, last values -- is not a setting)."""
    return tuple(n for n in keyword_arguments(type(scheduler)) if n not in _COMMON)


def _same_kind(state: Dict[str, Any], own: Dict[str, Any]) -> bool:
    """Whether a saved scheduler state is of the type of a built scheduler whose
    ``state_dict()`` is ``own``: the same keys (each type has its own settings:
    ``start_factor`` / ``end_factor``, ``eta_min`` / ``power``, ...) and ``param_name``."""
    return state.keys() == own.keys() and state.get('param_name') == own.get('param_name')


def _kind_name(state: Dict[str, Any], owns: List[Dict[str, Any]], schedulers: List[Any]) -> str:
    """A saved scheduler state's type, as the note names it: that of a built scheduler of
    its kind, else the mmengine scheduler whose settings are the state's
    (:func:`_registered_kind`), else its own settings (the keys no built one has)."""
    for own, sch in zip(owns, schedulers):
        if _same_kind(state, own):
            return type(sch).__name__
    common = set.intersection(*(set(own) for own in owns))
    settings = sorted(k for k in state if k not in common)
    return _registered_kind(state) or f'a scheduler with {", ".join(settings)}'


#: What every mmengine scheduler's constructor takes or its state holds besides the type's
#: own settings.
_COMMON = {
    'self', 'optimizer', 'param_name', 'begin', 'end', 'last_step', 'by_epoch', 'verbose',
    'total_iters', 'use_betas', 'base_values', '_last_value', '_global_step',
}  # fmt: skip


def _registered_kind(state: Dict[str, Any]) -> Optional[str]:
    """The one scheduler of mmengine's registry whose constructor takes just the saved
    state's settings (``LinearLR``: ``start_factor``, ``end_factor``) and whose name says
    its ``param_name`` (``...LR``, ``...Momentum``), or None."""
    import inspect

    from mmengine.registry import PARAM_SCHEDULERS

    settings = set(state) - _COMMON
    suffix = {'lr': 'LR', 'momentum': 'Momentum'}.get(state.get('param_name'), 'ParamScheduler')
    found = []
    for name, cls in PARAM_SCHEDULERS.module_dict.items():
        if not name.endswith(suffix) or not isinstance(cls, type):
            continue
        for klass in cls.__mro__:  # the first constructor that names its arguments
            init = vars(klass).get('__init__')
            if init is None:
                continue
            try:
                params = inspect.signature(init).parameters.values()
            except (TypeError, ValueError):
                break
            if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
                continue
            if {p.name for p in params} - _COMMON == settings:
                found.append(name)
            break
    return found[0] if len(found) == 1 else None


def _why_no_replay(built: List[Any], step: Any, targets: Any) -> Optional[str]:
    """Why :func:`replay_schedule` cannot give a resumed run its config's schedule, or
    None when it can. ``targets``: the checkpoint's parameter groups as the wrapper lists
    them (``param_groups`` + ``base_param_settings``)."""
    optimizer = getattr(built[0], 'optimizer', None)
    if any(getattr(sch, 'by_epoch', True) for sch in built):
        return 'epoch-based schedulers'
    plateau = [type(s).__name__ for s in built if 'ReduceOnPlateau' in type(s).__name__]
    if plateau:  # its steps depend on the validation metrics of the run, not on the count
        return f'{plateau[0]} (it steps on validation results)'
    if optimizer is None or any(getattr(sch, 'optimizer', None) is not optimizer for sch in built):
        return 'several optimizers'
    if not isinstance(step, int):
        return 'no iteration in the checkpoint'
    if not isinstance(targets, list) or len(targets) != len(optimizer.param_groups):
        return 'another number of optimizer parameter groups in the checkpoint'
    return None


def replay_schedule(
    schedulers: List[Any], steps: int
) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """Step freshly built iteration-based mmengine ``schedulers`` (one optimizer or
    ``OptimWrapper``) ``steps`` times, as ``ParamSchedulerHook`` does after every training
    iteration, on their optimizer's hyperparameters (not the weights).

    Returns:
        Each scheduler's ``state_dict()`` after the steps, and per entry of the optimizer's
        ``param_groups`` the values the schedulers set (their ``param_name``, and what else
        the steps changed, e.g. ``betas`` of a momentum schedule on Adam): what a run of
        these schedulers has saved in its checkpoint of iteration ``steps``.
    """
    import copy
    import warnings

    groups = schedulers[0].optimizer.param_groups
    before = [{k: copy.deepcopy(v) for k, v in g.items() if k != 'params'} for g in groups]
    with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": on purpose
        warnings.simplefilter('ignore')
        for _ in range(steps):
            for sch in schedulers:
                sch.step()
    names = {sch.param_name for sch in schedulers}
    values = [
        {k: v for k, v in g.items() if k in names or (k != 'params' and b.get(k, v) != v)}
        for g, b in zip(groups, before)
    ]
    return [sch.state_dict() for sch in schedulers], values
