"""Adversarial robustness (:mod:`research.robustness.segmentor`): FGSM / PGD on plain
tensors, the pixel-unit box of mmseg's data preprocessor, and the attack of a tiny
segmentor through the real test path (data preprocessor, whole inference, IoUMetric)."""

from __future__ import annotations

import pytest
import torch

from research.robustness import (
    AttackSettings,
    fgsm,
    format_robustness_table,
    pgd,
    pixel_box,
    settings_from_dict,
    strength_means,
)

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _linear_loss(weight):
    return lambda x: (weight * x).sum()


# -- the attacks on plain tensors -------------------------------------------------------------
def test_fgsm_moves_every_value_by_eps_along_the_gradient_sign():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 5, 5, generator=g) * 0.8 + 0.1  # inside [0, 1], away from the ends
    w = torch.randn(2, 3, 5, 5, generator=g)
    eps = torch.tensor([0.05, 0.02, 0.08]).view(1, 3, 1, 1)  # per channel, as pixel_box gives
    adv = fgsm(_linear_loss(w), x, eps, torch.zeros(1), torch.ones(1))
    delta = adv - x
    assert torch.allclose(delta.abs(), eps.expand_as(x), atol=1e-6)  # L-inf norm eps, everywhere
    assert torch.equal(delta.sign(), w.sign())  # the gradient's sign
    # clipped to the valid range; eps = 0 gives the input exactly
    top = fgsm(_linear_loss(torch.ones_like(x)), torch.full_like(x, 0.99), eps, 0.0, 1.0)
    assert top.max() == 1.0
    assert torch.equal(fgsm(_linear_loss(w), x, torch.zeros(1), 0.0, 1.0), x)


def test_pgd_stays_in_the_ball_and_in_valid_pixels():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 3, 6, 6, generator=g)
    x[0, 0, 0, :2] = torch.tensor([0.0, 1.0])  # at the ends of the valid range
    eps = torch.full((1, 3, 1, 1), 0.1)

    def outward(v):  # pushes away from 0.5: the ball's edge and the valid range both bind
        return ((v - 0.5) ** 2).sum()

    for random_start in (True, False):
        adv = pgd(
            outward, x, eps, eps / 4, 8, 0.0, 1.0, random_start, torch.Generator().manual_seed(2)
        )
        delta = adv - x
        assert delta.abs().max() <= 0.1 + 1e-6 and adv.min() >= 0 and adv.max() <= 1
        # 8 steps of eps / 4 reach the edge of the ball wherever the valid range allows
        inside = ((x - 0.1) >= 0) & ((x + 0.1) <= 1)
        assert torch.allclose(delta.abs()[inside], torch.full_like(delta[inside], 0.1), atol=1e-6)
        # along the gradient's sign, away from 0.5 (where the random start cannot cross it)
        away = inside & ((x - 0.5).abs() > 0.1)
        assert away.sum() > 40
        assert torch.equal(delta.sign()[away], (x - 0.5).sign()[away])
    assert torch.equal(pgd(outward, x, torch.zeros(1), torch.zeros(1), 3, 0.0, 1.0), x)
    # the random start is reproducible and inside the ball
    a, b = (
        pgd(
            lambda v: v.sum() * 0, x, eps, eps, 1, 0.0, 1.0, True, torch.Generator().manual_seed(3)
        )
        for _ in range(2)
    )
    assert torch.equal(a, b) and not torch.equal(a, x) and (a - x).abs().max() <= 0.1 + 1e-6


def test_pixel_box_is_the_data_preprocessor_s_own_normalisation():
    from mmseg.models.data_preprocessor import SegDataPreProcessor

    dp = SegDataPreProcessor(
        mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], bgr_to_rgb=True
    )
    unit, lower, upper = pixel_box(dp)
    images = [
        torch.zeros(3, 2, 2, dtype=torch.uint8),
        torch.full((3, 2, 2), 255, dtype=torch.uint8),
    ]
    out = dp(dict(inputs=images, data_samples=None), False)['inputs']
    assert torch.equal(out[0], lower[0].expand(3, 2, 2))
    assert torch.equal(out[1], upper[0].expand(3, 2, 2))
    # eps pixel levels in normalised units, back in pixels: eps
    assert torch.allclose(4 * unit * dp.std.view(1, 3, 1, 1), torch.full((1, 3, 1, 1), 4.0))
    unit, lower, upper = pixel_box(SegDataPreProcessor())  # no normalisation: pixels
    assert (float(unit), float(lower), float(upper)) == (1.0, 0.0, 255.0)


def test_attack_settings_and_the_table():
    s = settings_from_dict(dict(attacks=('pgd',), eps=(8, 2, 2), steps=4))
    assert s.eps == (2.0, 8.0) and s.pgd_step(8.0) == 5.0
    assert AttackSettings(step_size=1.5).pgd_step(8.0) == 1.5
    for bad, match in (
        (dict(attacks=('cw',)), 'attacks must be'),
        (dict(eps=(0,)), 'eps must'),
        (dict(eps=(300,)), 'eps must'),
        (dict(steps=0), 'steps must'),
        (dict(max_images=0), 'max_images'),
        (dict(flip=1), 'unknown robustness'),
    ):
        with pytest.raises(ValueError, match=match):
            settings_from_dict(bad)
    row = {'clean': {'mIoU': 60.0}, 'fgsm': {'2': {'mIoU': 50.0}, '8': {'mIoU': 30.0}}}
    assert strength_means(row) == {'fgsm': 40.0}
    table = format_robustness_table(
        {'a': row, 'b': [row, dict(row, clean={'mIoU': 70.0})]},
        AttackSettings(attacks=('fgsm',), eps=(2, 8)),
    )
    assert '| model | clean | fgsm 2/255 | fgsm 8/255 | fgsm mean |' in table
    assert '| a | 60.00 | 50.00 | 30.00 | 40.00 |' in table
    assert '| b | 65.00 ± 7.07 | 50.00 ± 0.00 |' in table


def test_an_attack_that_raises_miou_is_flagged():
    """A sweep where PGD raised mIoU above the clean model's (a new-user trial saw it on
    an undertrained demo checkpoint) is flagged as measuring no robustness, naming the
    attack and its strengths; a drop, or a rise within 0.5 points (fgsm here), is not."""
    from research.robustness.report import attack_warnings

    row = {
        'clean': {'mIoU': 6.5},
        'fgsm': {'2': {'mIoU': 6.2}, '8': {'mIoU': 6.9}},
        'pgd': {'2': {'mIoU': 7.1}, '8': {'mIoU': 7.4}},
    }
    (line,) = attack_warnings(row)
    assert line.startswith(
        "pgd raised mIoU above the clean model's 6.50 (7.10 at eps 2, 7.40 at eps 8)"
    )
    assert 'undertrained' in line and '--steps' in line
    row['pgd'] = {'2': {'mIoU': 5.0}, '8': {'mIoU': 1.0}}
    assert attack_warnings(row) == []


def test_attack_settings_refuse_a_bad_seed_or_random_start():
    """Both would pass a study's settings and fail (or silently mean the opposite) only
    after training: ``int(None)``, and the string 'false' is truthy."""
    for bad, match in (
        (dict(seed=None), 'seed must be a whole number, got None'),
        (dict(seed='0'), "seed must be a whole number, got '0'"),
        (dict(seed=1.5), 'seed must be a whole number, got 1.5'),
        (dict(seed=True), 'seed must be a whole number, got True'),
        (dict(random_start='false'), "random_start must be True or False, got 'false'"),
        (dict(random_start=0), 'random_start must be True or False, got 0'),
        (dict(random_start=None), 'random_start must be True or False'),
    ):
        with pytest.raises(ValueError, match=match):
            settings_from_dict(bad)
    s = settings_from_dict(dict(seed=7, random_start=False))
    assert (s.seed, s.random_start) == (7, False)


class _LinearLossSegmentor(torch.nn.Module):
    """What :func:`perturb` uses of a segmentor: mmseg's data preprocessor (per-channel
    std, so one pixel level is a different step per channel) and ``loss``. The decode loss
    is linear in the input (gradient ``weight``); an auxiliary term that would flip many
    signs must be left out."""

    def __init__(self, weight, decode_key='decode.loss_ce'):
        super().__init__()
        from mmseg.models.data_preprocessor import SegDataPreProcessor

        self.data_preprocessor = SegDataPreProcessor(
            mean=[127.5, 127.5, 127.5], std=[10.0, 20.0, 40.0]
        )
        self.weight, self.decode_key = weight, decode_key

    def loss(self, inputs, data_samples):
        return {self.decode_key: (self.weight * inputs).sum(), 'aux.loss_ce': 1e3 * inputs.sum()}


def _samples(n, h, w, labels=True):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    samples = [SegDataSample() for _ in range(n)]
    if labels:
        for s in samples:
            s.gt_sem_seg = PixelData(data=torch.zeros(1, h, w, dtype=torch.long))
    return samples


def test_pgd_steps_by_step_size_pixel_levels_of_each_channel():
    """One PGD step from the image (no random start), step < eps: every value moves by
    exactly ``step`` pixel levels -- ``step / std_c`` in the normalised input -- along the
    decode loss's gradient sign; FGSM moves by ``eps`` pixel levels."""
    from research.robustness import perturb

    w = torch.randn(1, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    model = _LinearLossSegmentor(w)
    x = torch.zeros(1, 3, 4, 5)  # pixel 127.5: far from the valid range's ends
    unit = 1.0 / torch.tensor([10.0, 20.0, 40.0]).view(1, 3, 1, 1)
    settings = AttackSettings(steps=1, step_size=3.0, random_start=False)
    delta = perturb(model, x, _samples(1, 4, 5), 'pgd', 8.0, settings) - x
    assert torch.equal(delta, 3.0 * unit * w.sign())
    delta = perturb(model, x, _samples(1, 4, 5), 'fgsm', 8.0, settings) - x
    assert torch.equal(delta, 8.0 * unit * w.sign())


def test_decode_loss_refuses_samples_without_labels_or_a_model_without_a_decode_loss():
    from lookhere_dense.errors import ConfigError
    from research.robustness import decode_loss

    x = torch.zeros(1, 3, 2, 2)
    with pytest.raises(ConfigError, match='needs the ground-truth labels.*LoadAnnotations'):
        decode_loss(_LinearLossSegmentor(torch.ones(1)), x, _samples(1, 2, 2, labels=False))
    with pytest.raises(
        ConfigError,
        match=r'no decode-head term \(decode.\*loss\*\): got '
        r"\['aux.loss_ce', 'head.loss_ce'\]",
    ):
        decode_loss(_LinearLossSegmentor(torch.ones(1), 'head.loss_ce'), x, _samples(1, 2, 2))


def test_a_split_without_labels_is_refused_before_the_model_is_built(tmp_path, repo_root):
    """``--split test`` on a label-less test set: a config error naming the split and what to
    do, before the pre-flight data check (no data here) and the model build (the file is not
    a checkpoint)."""
    from mmengine.config import Config

    from lookhere_dense.errors import ConfigError
    from research.robustness import check_attackable, robustness_report

    base = repo_root / 'configs' / 'study' / 'relational_vit_tiny.py'
    config = tmp_path / 'no_test_labels.py'
    config.write_text(
        f'_base_ = [{str(base)!r}]\ntest_dataloader = dict(dataset=dict(pipeline=['
        "dict(type='LoadImageFromFile'), dict(type='PackSegInputs')]))\n"
    )
    not_a_checkpoint = tmp_path / 'x.pth'
    not_a_checkpoint.write_text('not a checkpoint')
    with pytest.raises(
        ConfigError,
        match=r'the test split cannot be attacked: test_dataloader'
        r'.dataset.pipeline has no LoadAnnotations \(LoadImageFromFile -> '
        r'PackSegInputs\).*--split val',
    ):
        robustness_report(
            str(config), str(not_a_checkpoint), split='test', out_dir=str(tmp_path / 'out')
        )
    assert not (tmp_path / 'out').exists()
    cfg = Config.fromfile(str(config))
    check_attackable(cfg, 'val')  # val loads its labels
    cfg.val_dataloader.dataset.pipeline[1] = dict(type='mmseg.LoadAnnotations')
    check_attackable(cfg, 'val')
    cfg.model.pop('decode_head')
    with pytest.raises(ConfigError, match="model \\(type='EncoderDecoder'\\) has no decode_head"):
        check_attackable(cfg, 'val')


# -- a tiny segmentor through the real test path ------------------------------------------------
@pytest.fixture(scope='module')
def trained(tmp_path_factory, repo_root):
    """A 2-block relational model at 64 px, trained for 60 steps with the real train step;
    its config and the val dataloader / evaluator configs."""
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner
    from mmseg.registry import MODELS

    from lookhere_dense.apis.cli import parse_cfg_options
    from research.datasets.relational import (
        RelationalSettings,
        ensure_relational_dataset,
    )

    init_default_scope('mmseg')
    root = str(tmp_path_factory.mktemp('rel'))
    ensure_relational_dataset(root, RelationalSettings(num_train=64, num_val=8, scales=(1.0,)))
    cfg = Config.fromfile(str(repo_root / 'configs' / 'study' / 'relational_vit_tiny.py'))
    cfg.merge_from_dict(
        parse_cfg_options(
            [
                f'train_dataloader.dataset.data_root={root}',
                f'val_dataloader.dataset.data_root={root}',
                'model.backbone.num_layers=2',
                'train_dataloader.batch_size=8',
                'val_dataloader.batch_size=4',
                'optim_wrapper.optimizer.lr=0.003',
            ]
        )
    )
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    optim = build_optim_wrapper(model, cfg.optim_wrapper)
    batches = iter(Runner.build_dataloader(cfg.train_dataloader, seed=0))
    model.train()
    for _ in range(60):
        model.train_step(next(batches), optim)
    return model.eval(), cfg


def test_an_attack_of_strength_zero_is_the_clean_test_path(trained):
    from research.evaluate import evaluate_loader
    from research.robustness import evaluate_attack

    model, cfg = trained
    dl, ev = cfg.val_dataloader.to_dict(), cfg.val_evaluator.to_dict()
    clean = evaluate_loader(model, dl, ev, 'whole', 'cpu')['metrics']  # model.test_step
    settings = AttackSettings(steps=2)
    for attack in (None, 'fgsm', 'pgd'):
        res = evaluate_attack(model, dl, ev, attack, 0.0, settings)
        assert res['metrics'] == {k: round(float(v), 4) for k, v in clean.items()}, attack
        assert res['max_linf'] == 0.0 and res['images'] == 8
    assert all(p.requires_grad for p in model.parameters())  # unfrozen afterwards


def test_a_stronger_attack_lowers_miou_of_a_trained_model(trained):
    from research.robustness import robustness_sweep

    model, cfg = trained
    settings = AttackSettings(eps=(2, 16), steps=3)
    res = robustness_sweep(
        model, cfg.val_dataloader.to_dict(), cfg.val_evaluator.to_dict(), settings
    )
    clean = res['clean']
    assert clean['mIoU'] > 25  # it learned the anchor, not only the background (~15)
    for attack in ('fgsm', 'pgd'):
        weak, strong = res[attack]['2'], res[attack]['16']
        assert clean['loss'] < weak['loss'] < strong['loss']
        assert strong['mIoU'] < clean['mIoU'] - 3
        assert weak['max_linf'] <= 2 + 1e-3 and strong['max_linf'] <= 16 + 1e-3
    assert res['fgsm']['16']['max_linf'] > 15.99  # FGSM moves by eps (not clipped everywhere)
    assert res['pgd']['16']['loss'] >= res['fgsm']['16']['loss']
    from research.robustness.report import attack_warnings

    assert attack_warnings(res) == []  # a trained model's sweep is not flagged


def test_an_attack_restores_train_mode_test_cfg_and_requires_grad(trained):
    """The model is attacked and predicted in eval mode with a whole ``test_cfg``, weights
    frozen; afterwards it is exactly as it was: in train mode, with its own ``test_cfg``
    and each parameter's own ``requires_grad``."""
    from mmengine.config import ConfigDict

    from research.robustness import evaluate_attack

    model, cfg = trained
    dl = cfg.val_dataloader.to_dict()
    dl['dataset']['indices'] = 2
    params = list(model.parameters())
    before = model.test_cfg
    slide = ConfigDict(mode='slide', crop_size=(32, 32), stride=(16, 16))
    try:
        params[0].requires_grad_(False)
        model.test_cfg = slide
        model.train()
        res = evaluate_attack(
            model, dl, cfg.val_evaluator.to_dict(), 'pgd', 2.0, AttackSettings(steps=1)
        )
        assert res['images'] == 2 and 0 < res['max_linf'] <= 2 + 1e-3
        assert model.training and all(m.training for m in model.modules())
        assert model.test_cfg is slide
        assert [p.requires_grad for p in params] == [False] + [True] * (len(params) - 1)
    finally:
        params[0].requires_grad_(True)
        model.test_cfg = before
        model.eval()


def test_an_evaluator_without_the_metric_fails_before_any_attack(trained):
    from lookhere_dense.errors import ConfigError
    from research.robustness import robustness_sweep

    model, cfg = trained
    lines = []
    with pytest.raises(
        ConfigError,
        match=r"the evaluator reports no 'mIoU', which the "
        r"robustness summary uses; it reports \['aAcc', 'mAcc', 'mDice'\]",
    ):
        robustness_sweep(
            model,
            cfg.val_dataloader.to_dict(),
            dict(type='IoUMetric', iou_metrics=['mDice']),
            AttackSettings(steps=1, max_images=2),
            log=lines.append,
        )
    assert len(lines) == 1 and 'clean' in lines[0]  # no attack ran
