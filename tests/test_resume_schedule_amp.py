"""Resuming with other LR schedulers than the checkpoint's, and a CPU ``--amp`` checkpoint
resumed where the loss scaler is on (CUDA).

mmengine pairs the checkpoint's scheduler states with the config's schedulers one by one,
whatever their number and types: a run trained with ``[LinearLR, PolyLR]`` resumed with
``[PolyLR]`` went on with the warm-up's state in its PolyLR (its ``start_factor`` /
``end_factor`` beside ``eta_min`` / ``power``) and the old schedule's LR, without a word.
torch's enabled ``GradScaler`` refuses the empty state a disabled one (CPU) saved."""

from __future__ import annotations

import glob
import types

import pytest
import torch
from tiny_seg import ADE_CFG, SHRINK, assert_resume_follows_fresh, make_ade, options, roots
from torch import nn

from lookhere_dense.apis.train import train_model
from lookhere_dense.errors import CheckpointError

pytestmark = pytest.mark.usefixtures('one_torch_thread')

#: the config's schedule replaced by one PolyLR over a 6-iteration run
POLY = [dict(type='PolyLR', eta_min=1e-5, power=0.9, by_epoch=False, begin=0, end=6)]


def test_a_resume_with_fewer_schedulers_replays_the_config_schedule(tmp_path):
    """A 3-iteration run of the config's ``[LinearLR, PolyLR]`` resumed to 6 iterations
    with ``[PolyLR]`` only: every checkpoint after the resume holds what a fresh run of the
    new config holds (the schedulers' states and the LR of every group), and the log says
    that the schedule was replayed and which schedulers changed."""
    data = make_ade(tmp_path / 'data', num_train=2, num_val=1)
    keep = ['default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=10']
    opts = [*roots(data), *SHRINK, 'train_cfg.val_interval=100', *keep]

    def run(work: str, iters: int, scheduler=None, resume: bool = False):
        cfg_options = options(*opts, f'train_cfg.max_iters={iters}')
        if scheduler is not None:
            cfg_options['param_scheduler'] = scheduler
        train_model(
            ADE_CFG,
            work_dir=str(tmp_path / work),
            resume='auto' if resume else None,
            cfg_options=cfg_options,
        )

    def saved(work: str, it: int):
        ckpt = torch.load(str(tmp_path / work / f'iter_{it}.pth'), weights_only=False)
        return ckpt['param_schedulers'], [g['lr'] for g in ckpt['optimizer']['param_groups']]

    run('two', 3)  # the config's warm-up and decay
    states, _ = saved('two', 3)
    assert [s['end'] for s in states] == [3, 3] and 'start_factor' in states[0]
    run('fresh', 6, POLY)  # the reference: a fresh run of the new config
    run('two', 6, POLY, resume=True)
    for it in (4, 5, 6):
        schedulers, lrs = saved('two', it)
        assert len(schedulers) == 1 and 'start_factor' not in schedulers[0], it
        assert (schedulers, lrs) == saved('fresh', it), it
    log = open(sorted(glob.glob(str(tmp_path / 'two' / '*' / '*.log')))[-1]).read()
    note = next(ln for ln in log.splitlines() if 'resume: the LR schedule' in ln)
    assert (
        "the LR schedule follows this run's config, not the checkpoint's, replayed to "
        'iteration 3: param_scheduler: [LinearLR, PolyLR] -> [PolyLR] (other schedulers); '
        "at iteration 3 the lr is the new schedule's"
    ) in note


def _wrapper():
    from mmengine.optim import OptimWrapper

    torch.manual_seed(0)
    return OptimWrapper(torch.optim.AdamW(nn.Linear(2, 2).parameters(), lr=1e-3))


def _run(make, steps: int = 0):
    """Schedulers ``make(wrapper)`` on a fresh wrapper, stepped ``steps`` times."""
    wrapper = _wrapper()
    schedulers = make(wrapper)
    for _ in range(steps):
        for sch in schedulers:
            sch.step()
    return wrapper, schedulers


def _checkpoint(make, steps: int) -> dict:
    wrapper, schedulers = _run(make, steps)
    return dict(
        meta=dict(iter=steps),
        optimizer=wrapper.state_dict(),
        param_schedulers=[sch.state_dict() for sch in schedulers],
    )


def _warm_decay(wrapper):
    from mmengine.optim.scheduler import LinearLR, PolyLR

    return [
        LinearLR(wrapper, start_factor=0.1, by_epoch=False, begin=0, end=10),
        PolyLR(wrapper, eta_min=1e-6, power=0.9, by_epoch=False, begin=10, end=30),
    ]


def _warm_decay_momentum(wrapper):
    from mmengine.optim.scheduler import LinearMomentum

    warm_decay = _warm_decay(wrapper)  # built first, as the Runner builds them in order
    return [*warm_decay, LinearMomentum(wrapper, start_factor=0.8, by_epoch=False, end=10)]


def _constant_decay(wrapper):
    from mmengine.optim.scheduler import ConstantLR, PolyLR

    return [
        ConstantLR(wrapper, factor=0.5, by_epoch=False, begin=0, end=10),
        PolyLR(wrapper, eta_min=1e-6, power=0.9, by_epoch=False, begin=10, end=30),
    ]


@pytest.mark.parametrize(
    'old, new, changed',
    [
        # the same number, begin and end: another type at [0]
        (
            _warm_decay,
            _constant_decay,
            'param_scheduler: [LinearLR, PolyLR] -> [ConstantLR, PolyLR] (other schedulers)',
        ),
        # the momentum warm-up dropped: AdamW's betas go back to the config's
        (
            _warm_decay_momentum,
            _warm_decay,
            'param_scheduler: [LinearLR, PolyLR, LinearMomentum] -> [LinearLR, PolyLR] (other',
        ),
    ],
    ids=['other-type', 'momentum-dropped'],
)
def test_other_schedulers_are_replayed_not_loaded_into_each_other(old, new, changed):
    """After mmengine loads the patched checkpoint (the optimizer, then each scheduler its
    state in order), the groups' ``lr`` and ``betas`` are a fresh run's of the new
    schedulers at the resume point and keep being so."""
    from lookhere_dense.engine.schedules import keep_config_schedule

    checkpoint = _checkpoint(old, steps=6)
    wrapper, schedulers = _run(new)  # as the Runner builds them from the config
    runner = types.SimpleNamespace(param_schedulers=schedulers)
    note = keep_config_schedule(runner, checkpoint)
    assert note is not None and changed in note, note
    assert note.startswith("the LR schedule follows this run's config, not the checkpoint's")
    assert len(checkpoint['param_schedulers']) == len(schedulers)
    fresh, fresh_schedulers = _run(new, steps=6)
    assert_resume_follows_fresh(wrapper, schedulers, checkpoint, fresh, fresh_schedulers, 30)


def test_other_schedulers_that_cannot_be_replayed_are_refused():
    """Epoch-based schedulers cannot be replayed from the iteration: the config's other
    schedulers would get the checkpoint's states of another type, so the resume stops and
    says what to do (the same schedulers with another end keep the checkpoint's, with a
    note)."""
    from mmengine.optim.scheduler import LinearLR, PolyLR

    from lookhere_dense.engine.schedules import keep_config_schedule

    def epochs(wrapper, end=12):
        return [
            LinearLR(wrapper, start_factor=0.1, by_epoch=True, begin=0, end=2),
            PolyLR(wrapper, eta_min=1e-6, power=0.9, by_epoch=True, begin=2, end=end),
        ]

    checkpoint = _checkpoint(epochs, steps=3)
    _, schedulers = _run(lambda w: epochs(w)[1:])
    runner = types.SimpleNamespace(param_schedulers=schedulers, _load_from='/w/epoch_3.pth')
    with pytest.raises(
        CheckpointError,
        match=r"--resume: the config's LR schedulers are other ones than those of "
        r"'/w/epoch_3\.pth' \(param_scheduler: \[LinearLR, PolyLR\] -> \[PolyLR\] \(other "
        r'schedulers\)\).* cannot be replayed with epoch-based schedulers\. Resume with '
        r"the checkpoint's param_scheduler, or start a new run from its weights",
    ):
        keep_config_schedule(runner, checkpoint)
    _, longer = _run(lambda w: epochs(w, end=24))
    note = keep_config_schedule(types.SimpleNamespace(param_schedulers=longer), checkpoint)
    assert note.startswith("kept the checkpoint's LR schedule, not the config's")


def test_a_cpu_amp_checkpoint_resumes_where_the_loss_scaler_is_on(monkeypatch):
    """A CPU ``--amp`` run saves its disabled scaler's empty state; mmengine's
    ``AmpOptimWrapper.load_state_dict`` on a CUDA machine (an enabled scaler, simulated
    here with torch's CPU ``GradScaler``) handed it to torch, which raised 'The source
    state dict is empty'. The optimizer state loads; the scaler starts afresh; a line says
    so."""
    import mmengine.logging

    from lookhere_dense.engine.amp import MixedPrecisionOptimWrapper

    def wrapper():
        torch.manual_seed(0)
        model = nn.Linear(2, 2)
        return model, MixedPrecisionOptimWrapper(optimizer=torch.optim.AdamW(model.parameters()))

    model, cpu = wrapper()
    model(torch.ones(1, 2)).sum().backward()
    cpu.step()
    state = cpu.state_dict()
    assert state['loss_scaler'] == {}  # a disabled scaler's
    logged = []
    monkeypatch.setattr(mmengine.logging, 'print_log', lambda msg, **kw: logged.append(msg))
    _, cuda = wrapper()
    cuda.loss_scaler = torch.amp.GradScaler('cpu', init_scale=1024.0, enabled=True)
    cuda.load_state_dict(state)
    assert cuda.loss_scaler.get_scale() == 1024.0  # the config's, as in a new run
    saved = state['state'][0]['exp_avg']
    assert torch.equal(cuda.optimizer.state_dict()['state'][0]['exp_avg'], saved)
    assert any('the loss scaler starts afresh' in msg for msg in logged), logged
    # a scaler's own state still loads
    _, again = wrapper()
    again.loss_scaler = torch.amp.GradScaler('cpu', init_scale=1024.0, enabled=True)
    again.load_state_dict(
        dict(cuda.state_dict(), loss_scaler=dict(cuda.loss_scaler.state_dict(), scale=8.0))
    )
    assert again.loss_scaler.get_scale() == 8.0
