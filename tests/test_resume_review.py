"""Review fixes of resuming and schedules: a save_best file refused by --resume, hook
arguments the config leaves out accepted by --cfg-options, a changed optimizer lr or
scheduler setting followed on resume, load_from checked before the Runner, and the
max_iters note describing the schedule that runs."""

from __future__ import annotations

import pytest
import torch
from tiny_seg import ADE_CFG, SHRINK, options

from lookhere_dense.apis.train import build_train_config, train_model
from lookhere_dense.errors import ConfigError, ToolError


def _config(tmp_path, *pairs, **kwargs):
    return build_train_config(
        ADE_CFG,
        work_dir=str(tmp_path / 'work'),
        check_data=False,
        cfg_options=options(*SHRINK, *pairs),
        **kwargs,
    )


# 1 ---------------------------------------------------------------------------------------
def test_resume_from_a_save_best_file_is_refused_naming_it(tmp_path):
    best = str(tmp_path / 'best_mIoU_iter_10.pth')
    torch.save(
        dict(
            meta=dict(iter=10, epoch=0),
            state_dict={'w': torch.zeros(2)},
            message_hub=dict(log_scalars={}),
            lookhere_resume_state=dict(),
        ),
        best,
    )
    with pytest.raises(ToolError) as exc:
        _config(tmp_path, resume=best)
    msg = str(exc.value)
    assert best in msg and 'no optimizer or LR scheduler state' in msg and 'save_best' in msg
    assert "one of the run's iteration checkpoints" in msg
    assert f'load_from={best}' in msg and len(msg.splitlines()) == 1


def test_resume_from_a_training_checkpoint_is_not_refused(tmp_path):
    ckpt = str(tmp_path / 'iter_10.pth')
    torch.save(
        dict(
            meta=dict(iter=10, epoch=0),
            state_dict={'w': torch.zeros(2)},
            optimizer=dict(state={}, param_groups=[]),
            param_schedulers=[],
        ),
        ckpt,
    )
    cfg, _ = _config(tmp_path, resume=ckpt)
    assert cfg.resume is True and cfg.load_from == ckpt
    # default_hooks.checkpoint.save_optimizer=False: the run's own file, its schedulers kept
    kept = str(tmp_path / 'iter_12.pth')
    torch.save(
        dict(meta=dict(iter=12, epoch=0), state_dict={'w': torch.zeros(2)}, param_schedulers=[]),
        kept,
    )
    cfg, _ = _config(tmp_path, resume=kept)
    assert cfg.resume is True and cfg.load_from == kept


def test_a_load_from_under_home_is_found_as_mmengine_finds_it(tmp_path, monkeypatch):
    from lookhere_dense.apis.train import _check_load_from

    monkeypatch.setenv('HOME', str(tmp_path))
    torch.save(dict(state_dict={'w': torch.zeros(2)}), str(tmp_path / 'init.pth'))
    _check_load_from({'load_from': '~/init.pth'})
    with pytest.raises(FileNotFoundError, match="load_from checkpoint '.*gone.pth' not found"):
        _check_load_from({'load_from': '~/gone.pth'})


# 2 ---------------------------------------------------------------------------------------
def test_cfg_options_accept_a_hook_argument_the_config_leaves_out():
    from lookhere_dense.apis.cli import load_config

    cfg = load_config(ADE_CFG, options('default_hooks.checkpoint.save_best=mIoU'))
    assert cfg.default_hooks.checkpoint.save_best == 'mIoU'
    with pytest.raises(ConfigError, match='did you mean'):  # a typo is still one
        load_config(ADE_CFG, options('default_hooks.checkpoint.save_lst=True'))


# 3 ---------------------------------------------------------------------------------------
def _run(lr: float, power: float, steps: int = 0):
    """SGD with a LinearLR warm-up to 4 and a PolyLR to 12, stepped ``steps`` times."""
    from mmengine.optim import OptimWrapper
    from mmengine.optim.scheduler import LinearLR, PolyLR

    model = torch.nn.Linear(2, 2)
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=lr))
    schedulers = [
        LinearLR(wrapper, start_factor=0.1, by_epoch=False, begin=0, end=4),
        PolyLR(wrapper, eta_min=1e-6, power=power, by_epoch=False, begin=4, end=12),
    ]
    for _ in range(steps):
        for sch in schedulers:
            sch.step()
    return wrapper, schedulers


def _resume(saved_lr, saved_power, lr, power, at=6):
    import types

    from lookhere_dense.engine.schedules import keep_config_schedule

    wrapper, schedulers = _run(saved_lr, saved_power, at)
    checkpoint = dict(
        meta=dict(iter=at),
        optimizer=wrapper.state_dict(),
        param_schedulers=[sch.state_dict() for sch in schedulers],
    )
    _, built = _run(lr, power)  # as the Runner builds them from the config
    note = keep_config_schedule(types.SimpleNamespace(param_schedulers=built), checkpoint)
    fresh, _ = _run(lr, power, at)
    return note, checkpoint, fresh


def test_resume_follows_a_changed_optimizer_lr():
    note, checkpoint, fresh = _resume(1e-3, 0.9, 2e-3, 0.9)
    assert (
        note is not None and "the optimizer's lr (optim_wrapper.optimizer) 0.001 -> 0.002" in note
    )
    assert note.startswith("the LR schedule follows this run's config")
    saved = checkpoint['optimizer']['param_groups'][0]
    assert saved['lr'] == pytest.approx(fresh.param_groups[0]['lr'])
    assert saved['initial_lr'] == 2e-3
    assert [s['base_values'] for s in checkpoint['param_schedulers']] == [[2e-3], [2e-3]]


def test_resume_follows_a_changed_scheduler_setting():
    note, checkpoint, fresh = _resume(1e-3, 0.9, 1e-3, 2.0)
    assert note is not None and 'param_scheduler[1] PolyLR: power 0.9 -> 2.0' in note
    assert 'optimizer' not in note.split('replayed')[1]  # the lr is the same
    assert checkpoint['param_schedulers'][1]['power'] == 2.0
    saved = checkpoint['optimizer']['param_groups'][0]
    assert saved['lr'] == pytest.approx(fresh.param_groups[0]['lr'])


def test_resume_with_the_same_settings_leaves_the_checkpoint_alone():
    note, _, _ = _resume(1e-3, 0.9, 1e-3, 0.9)
    assert note is None


# 4 ---------------------------------------------------------------------------------------
def test_a_truncated_or_missing_load_from_is_one_error_naming_load_from(tmp_path):
    path = tmp_path / 'init.pth'
    torch.save(dict(state_dict={'w': torch.zeros(1000)}, meta=dict(iter=1)), str(path))
    size = path.stat().st_size
    with open(path, 'r+b') as f:
        f.truncate(size // 2)

    def train(load_from):
        train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'work'),
            check_data=False,
            cfg_options=options(*SHRINK, f'load_from={load_from}'),
        )

    with pytest.raises(ToolError, match=r"^load_from checkpoint '.*init\.pth' cannot be read"):
        train(path)
    with pytest.raises(FileNotFoundError, match=r"^load_from checkpoint '.*gone\.pth' not found"):
        train(tmp_path / 'gone.pth')
    assert not (tmp_path / 'work').exists() or not list((tmp_path / 'work').iterdir())


# 5, 6 ------------------------------------------------------------------------------------
def _schedule_notes(monkeypatch, *pairs):
    from lookhere_dense.apis import cli

    said = []
    monkeypatch.setattr(cli, 'log_rank0', lambda msg, level=None: said.append(msg))
    cfg = cli.load_config(ADE_CFG, options(*pairs))
    return cfg, said


def test_the_max_iters_note_gives_the_schedule_the_user_overrides_too(monkeypatch):
    cfg, said = _schedule_notes(monkeypatch, 'train_cfg.max_iters=13', 'param_scheduler.0.end=20')
    assert cfg.param_scheduler[0].end == 20
    note = next(m for m in said if 'train_cfg.max_iters=13' in m and 'LR schedule' in m)
    assert 'param_scheduler[0] LinearLR: end 30 -> 20' in note and 'end 30 -> 13' not in note
    unfinished = [m for m in said if 'cannot finish' in m]
    assert len(unfinished) == 1
    assert (
        'param_scheduler[0] LinearLR ends at iteration 20, after train_cfg.max_iters=13'
        in (unfinished[0])
    )


def test_a_warm_up_longer_than_the_run_says_the_decay_is_dropped(monkeypatch):
    cfg, said = _schedule_notes(monkeypatch, 'train_cfg.max_iters=20')
    note = next(m for m in said if 'train_cfg.max_iters=20' in m and 'LR schedule' in m)
    assert 'param_scheduler[0] LinearLR: end 30 -> 20' in note
    assert (
        'max_iters=20 ends inside param_scheduler[0] LinearLR (to 30 in the config): the '
        'warm-up is cut short and the decay after it (param_scheduler[1] PolyLR: iterations '
        '19-20 of 30-300 in the config) has (almost) nothing left: the run ends at about the '
        'peak LR'
    ) in note
    assert not [m for m in said if 'cannot finish' in m]  # the clipped warm-up ends at 20
    _, longer = _schedule_notes(monkeypatch, 'train_cfg.max_iters=100')
    assert not [m for m in longer if 'dropped' in m or 'cannot finish' in m]


def test_a_schedule_given_whole_is_described_as_given():
    from lookhere_dense.engine.schedules import describe_schedule

    config = [
        dict(type='LinearLR', by_epoch=False, begin=0, end=30),
        dict(type='PolyLR', by_epoch=False, begin=30, end=300),
    ]
    given = [dict(type='PolyLR', by_epoch=False, begin=0, end=6)]
    assert describe_schedule(config, given, 300, 6) == [
        "param_scheduler[0] PolyLR: begin 0, end 6 (not the config file's scheduler)"
    ]
