"""What a training run takes from its launcher and its resumed checkpoint: the work-dir
lock is taken by rank 0 of the launcher the run uses (srun's ``SLURM_PROCID``, Open MPI's
``OMPI_COMM_WORLD_RANK`` / ``PMI_RANK``, torchrun's ``RANK``: under srun and mpirun
mmengine sets ``RANK`` only later, and every rank took the lock, all but the first refused
as "in use by another training run"); and ``--resume`` from a checkpoint of another
optimizer type stops before the first step with one line (it ended in torch's
``KeyError: 'momentum'``)."""

from __future__ import annotations

import os.path as osp

import pytest
import torch
from tiny_seg import ADE_CFG, SHRINK, make_ade, options, roots

from lookhere_dense.errors import CheckpointError, WorkDirLockedError

pytestmark = pytest.mark.usefixtures('one_torch_thread')

#: Every variable a launcher names a process's rank in.
RANK_VARS = ('RANK', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK', 'PMI_RANK')


@pytest.fixture
def no_rank_env(monkeypatch):
    for name in RANK_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    'launcher, environ, rank',
    [
        ('none', {'RANK': '3', 'SLURM_PROCID': '3'}, 0),  # one process, whatever is set
        ('pytorch', {'RANK': '2'}, 2),
        ('pytorch', {}, 0),
        ('slurm', {'SLURM_PROCID': '1', 'SLURM_NTASKS': '2'}, 1),
        ('slurm', {'SLURM_PROCID': '0', 'RANK': '1'}, 0),  # mmengine sets RANK from it
        ('mpi', {'OMPI_COMM_WORLD_RANK': '3'}, 3),
        ('mpi', {'PMI_RANK': '1'}, 1),  # MPICH / Intel MPI
        ('mpi', {}, 0),
    ],
)
def test_launcher_rank_reads_the_variable_of_the_launcher(launcher, environ, rank):
    from lookhere_dense.apis.train import launcher_rank

    assert launcher_rank(launcher, environ) == rank


@pytest.mark.parametrize(
    'launcher, variable',
    [
        ('slurm', 'SLURM_PROCID'),
        ('mpi', 'OMPI_COMM_WORLD_RANK'),
        ('mpi', 'PMI_RANK'),
        ('pytorch', 'RANK'),
    ],
)
def test_only_rank_0_of_the_launcher_takes_the_work_dir_lock(
    tmp_path, no_rank_env, launcher, variable
):
    """A live run holds the work dir: the other ranks of a job (``RANK`` not set yet
    under srun / mpirun) pass without a lock; its rank 0 is refused."""
    from lookhere_dense.apis.train import lock_work_dir
    from lookhere_dense.engine.workdir_lock import WorkDirLock

    work = str(tmp_path / 'work')
    held = WorkDirLock(work).acquire()
    try:
        no_rank_env.setenv(variable, '1')
        assert lock_work_dir(work, launcher=launcher) is None  # not refused
        no_rank_env.setenv(variable, '0')
        with pytest.raises(WorkDirLockedError, match='is in use by another training run'):
            lock_work_dir(work, launcher=launcher)
    finally:
        held.release()
    lock = lock_work_dir(work, launcher=launcher)  # rank 0 of a free work dir takes it
    assert lock is not None
    lock.release()


def test_a_launcher_less_process_under_srun_takes_the_lock(tmp_path, no_rank_env):
    """``--launcher none`` in a job step of several tasks: each process is a run of its
    own, so each needs the lock."""
    from lookhere_dense.apis.train import lock_work_dir
    from lookhere_dense.engine.workdir_lock import WorkDirLock

    work = str(tmp_path / 'work')
    held = WorkDirLock(work).acquire()
    try:
        no_rank_env.setenv('SLURM_PROCID', '1')
        with pytest.raises(WorkDirLockedError):
            lock_work_dir(work, launcher='none')
    finally:
        held.release()


def test_train_model_under_srun_locks_on_rank_0_only(tmp_path, no_rank_env):
    """``train_model(launcher='slurm')`` on rank 1 of an srun job while rank 0 holds the
    lock goes on to train (refused before: it looked at ``RANK``, which srun does not
    set)."""
    import lookhere_dense.apis.train as train
    from lookhere_dense.engine.workdir_lock import WorkDirLock

    work = str(tmp_path / 'work')
    trained = []
    no_rank_env.setattr(train, '_train', lambda cfg, notes, verbose: trained.append(cfg))
    no_rank_env.setenv('SLURM_NTASKS', '2')
    no_rank_env.setenv('SLURM_PROCID', '0')
    held = WorkDirLock(work).acquire()  # rank 0's lock
    try:
        no_rank_env.setenv('SLURM_PROCID', '1')
        train.train_model(
            ADE_CFG,
            work_dir=work,
            launcher='slurm',
            check_data=False,
            cfg_options=options(*SHRINK),
        )
        assert [cfg.launcher for cfg in trained] == ['slurm']
    finally:
        held.release()


# ----------------------------------------------------------------------------------------
# --resume from a checkpoint of another optimizer type
# ----------------------------------------------------------------------------------------
def _param_and_step(optimizer_cls, **kwargs):
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = optimizer_cls([param], **kwargs)
    param.grad = torch.ones(3)
    optimizer.step()
    return optimizer


def test_optimizer_state_problem_names_what_each_optimizer_holds():
    from lookhere_dense.engine.hooks import optimizer_state_problem

    def fresh(optimizer_cls, **kwargs):
        return optimizer_cls([torch.nn.Parameter(torch.ones(3))], **kwargs)

    # an AdamW state in an SGD run: torch loads it, the first step ends in KeyError
    saved = _param_and_step(torch.optim.AdamW, lr=1e-3).state_dict()
    problem = optimizer_state_problem(
        fresh(torch.optim.SGD, lr=0.1, momentum=0.9), saved, '/w/iter_2.pth'
    )
    assert problem == (
        "--resume: the optimizer state in '/w/iter_2.pth' was saved by another optimizer "
        "type: this run's SGD needs momentum, dampening in its parameter groups; the "
        "checkpoint's hold betas, eps, amsgrad, capturable, decoupled_weight_decay instead "
        '(per-parameter state: step, exp_avg, exp_avg_sq). Resume with the config it was '
        'trained with (its optim_wrapper.optimizer), or start a new run from its weights: '
        '--cfg-options load_from=/w/iter_2.pth without --resume.'
    )
    # an SGD state in an AdamW run (torch's load_state_dict ends in KeyError: 'step')
    saved = _param_and_step(torch.optim.SGD, lr=0.1, momentum=0.9).state_dict()
    problem = optimizer_state_problem(
        fresh(torch.optim.AdamW, lr=1e-3), saved, 'the checkpoint', name='head'
    )
    assert "this run's AdamW (optim_wrapper 'head') needs betas, eps in its parameter" in problem
    assert "the checkpoint's hold momentum, dampening, nesterov instead" in problem
    assert 'load_from=CKPT without --resume' in problem
    # the same optimizer type with other hyper-parameters fits
    saved = _param_and_step(torch.optim.AdamW, lr=1e-3).state_dict()
    adamw = fresh(torch.optim.AdamW, lr=1e-4, betas=(0.8, 0.9))
    assert optimizer_state_problem(adamw, saved, 'x.pth') is None
    # ... and so does a state saved before torch added a flag (torch fills it in on load)
    for group in saved['param_groups']:
        del group['decoupled_weight_decay'], group['fused']
    assert optimizer_state_problem(adamw, saved, 'x.pth') is None
    adamw.load_state_dict(saved)
    assert adamw.param_groups[0]['fused'] is None


def test_adam_and_adamw_states_are_told_apart_on_resume():
    """Adam and AdamW hold the same keys: torch loads either into the other, and an
    AdamW state makes an Adam run decay weights as AdamW (``decoupled_weight_decay`` is
    loaded with the groups). Refused both ways, naming both rules; the same type fits."""
    from lookhere_dense.engine.hooks import optimizer_state_problem

    adamw_state = _param_and_step(torch.optim.AdamW, lr=1e-3).state_dict()
    adam = torch.optim.Adam([torch.nn.Parameter(torch.ones(3))], lr=1e-3, weight_decay=1e-4)
    # what the check prevents: the loaded Adam run silently becomes AdamW
    probe = torch.optim.Adam([torch.nn.Parameter(torch.ones(3))], lr=1e-3)
    probe.load_state_dict(adamw_state)
    assert probe.param_groups[0]['decoupled_weight_decay'] is True
    problem = optimizer_state_problem(adam, adamw_state, '/w/iter_2.pth')
    assert problem.startswith(
        "--resume: the optimizer state in '/w/iter_2.pth' was saved with "
        "decoupled_weight_decay=True (AdamW's decoupled weight decay), this run's Adam has "
        "decoupled_weight_decay=False (Adam's L2 weight decay)"
    ), problem
    assert 'load_from=/w/iter_2.pth without --resume' in problem
    adam_state = _param_and_step(torch.optim.Adam, lr=1e-3).state_dict()
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.ones(3))], lr=1e-3)
    problem = optimizer_state_problem(adamw, adam_state, 'the checkpoint', name='head')
    assert "this run's AdamW (optim_wrapper 'head') has decoupled_weight_decay=True" in problem
    assert optimizer_state_problem(adam, adam_state, 'x.pth') is None
    assert optimizer_state_problem(adamw, adamw_state, 'x.pth') is None
    # a state saved before torch recorded the flag cannot be told apart: not refused
    del adamw_state['param_groups'][0]['decoupled_weight_decay']
    assert optimizer_state_problem(adam, adamw_state, 'x.pth') is None


def test_resuming_an_adamw_checkpoint_with_sgd_is_one_checkpoint_error(tmp_path):
    """An AdamW run resumed with an SGD (momentum) optim_wrapper: a CheckpointError naming
    the checkpoint, both optimizers' keys and what to do, before the first step (it ended
    in ``KeyError: 'momentum'`` inside torch's SGD); the same optimizer type resumes."""
    from lookhere_dense.apis.train import train_model

    data = make_ade(tmp_path / 'data', num_train=2, num_val=1)
    work = str(tmp_path / 'w')
    base = [*roots(data), *SHRINK, 'train_cfg.val_interval=100']
    train_model(ADE_CFG, work_dir=work, cfg_options=options(*base, 'train_cfg.max_iters=1'))
    ckpt = osp.join(work, 'iter_1.pth')
    assert osp.isfile(ckpt)

    longer = options(*base, 'train_cfg.max_iters=2')
    sgd = {'optim_wrapper.optimizer': dict(_delete_=True, type='SGD', lr=0.01, momentum=0.9)}
    with pytest.raises(CheckpointError) as exc:
        train_model(ADE_CFG, work_dir=work, resume='auto', cfg_options={**longer, **sgd})
    msg = str(exc.value)
    assert '\n' not in msg
    assert msg.startswith(
        f'--resume: the optimizer state in {ckpt!r} was saved by another optimizer type: '
        "this run's SGD needs momentum, dampening in its parameter groups; the checkpoint's "
        'hold betas, eps, '
    ), msg
    assert 'exp_avg' in msg
    assert msg.endswith(
        'Resume with the config it was trained with (its optim_wrapper.optimizer), or start '
        f'a new run from its weights: --cfg-options load_from={ckpt} without --resume.'
    )
    assert not osp.exists(osp.join(work, 'iter_2.pth'))  # stopped before a step

    # the config it was trained with (AdamW, another lr) resumes and trains on
    runner = train_model(
        ADE_CFG,
        work_dir=work,
        resume='auto',
        cfg_options={**longer, 'optim_wrapper.optimizer.lr': 5e-4},
    )
    assert runner.iter == 2 and osp.isfile(osp.join(work, 'iter_2.pth'))
