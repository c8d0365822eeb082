"""Adversarial robustness (:mod:`lookhere_dense.evaluation.robustness`): FGSM / PGD on plain
tensors, the pixel-unit box of mmseg's data preprocessor, and the attack of a tiny
segmentor through the real test path (data preprocessor, whole inference, IoUMetric)."""
from __future__ import annotations

import pytest
import torch

from lookhere_dense.evaluation.robustness import (AttackSettings, fgsm, format_robustness_table,
                                                  pgd, pixel_box, settings_from_dict,
                                                  strength_means)

pytestmark = pytest.mark.usefixtures('one_torch_thread')


def _linear_loss(weight):
    return lambda x: (weight * x).sum()


# -- the attacks on plain tensors -------------------------------------------------------------
def test_fgsm_moves_every_value_by_eps_along_the_gradient_sign():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 5, 5, generator=g) * 0.8 + 0.1   # inside [0, 1], away from the ends
    w = torch.randn(2, 3, 5, 5, generator=g)
    eps = torch.tensor([0.05, 0.02, 0.08]).view(1, 3, 1, 1)   # per channel, as pixel_box gives
    adv = fgsm(_linear_loss(w), x, eps, torch.zeros(1), torch.ones(1))
    delta = adv - x
    assert torch.allclose(delta.abs(), eps.expand_as(x), atol=1e-6)   # L-inf norm eps, everywhere
    assert torch.equal(delta.sign(), w.sign())                          # the gradient's sign
    # clipped to the valid range; eps = 0 gives the input exactly
    top = fgsm(_linear_loss(torch.ones_like(x)), torch.full_like(x, 0.99), eps, 0.0, 1.0)
    assert top.max() == 1.0
    assert torch.equal(fgsm(_linear_loss(w), x, torch.zeros(1), 0.0, 1.0), x)


def test_pgd_stays_in_the_ball_and_in_valid_pixels():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(1, 3, 6, 6, generator=g)
    x[0, 0, 0, :2] = torch.tensor([0.0, 1.0])   # at the ends of the valid range
    eps = torch.full((1, 3, 1, 1), 0.1)

    def outward(v):  # pushes away from 0.5: the ball's edge and the valid range both bind
        return ((v - 0.5) ** 2).sum()

    for random_start in (True, False):
        adv = pgd(outward, x, eps, eps / 4, 8, 0.0, 1.0, random_start,
                  torch.Generator().manual_seed(2))
        delta = adv - x
        assert delta.abs().max() <= 0.1 + 1e-6 and adv.min() >= 0 and adv.max() <= 1
        # 8 steps of eps / 4 reach the edge of the ball wherever the valid range allows
        inside = ((x - 0.1) >= 0) & ((x + 0.1) <= 1)
        assert torch.allclose(delta.abs()[inside], torch.full_like(delta[inside], 0.1),
                              atol=1e-6)
    assert torch.equal(pgd(outward, x, torch.zeros(1), torch.zeros(1), 3, 0.0, 1.0), x)
    # the random start is reproducible and inside the ball
    a, b = (pgd(lambda v: v.sum() * 0, x, eps, eps, 1, 0.0, 1.0, True,
                torch.Generator().manual_seed(3)) for _ in range(2))
    assert torch.equal(a, b) and not torch.equal(a, x) and (a - x).abs().max() <= 0.1 + 1e-6


def test_pixel_box_is_the_data_preprocessor_s_own_normalisation():
    from mmseg.models.data_preprocessor import SegDataPreProcessor
    dp = SegDataPreProcessor(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375],
                             bgr_to_rgb=True)
    unit, lower, upper = pixel_box(dp)
    images = [torch.zeros(3, 2, 2, dtype=torch.uint8),
              torch.full((3, 2, 2), 255, dtype=torch.uint8)]
    out = dp(dict(inputs=images, data_samples=None), False)['inputs']
    assert torch.equal(out[0], lower[0].expand(3, 2, 2))
    assert torch.equal(out[1], upper[0].expand(3, 2, 2))
    # eps pixel levels in normalised units, back in pixels: eps
    assert torch.allclose(4 * unit * dp.std.view(1, 3, 1, 1), torch.full((1, 3, 1, 1), 4.0))
    unit, lower, upper = pixel_box(SegDataPreProcessor())   # no normalisation: pixels
    assert (float(unit), float(lower), float(upper)) == (1.0, 0.0, 255.0)


def test_attack_settings_and_the_table():
    s = settings_from_dict(dict(attacks=('pgd',), eps=(8, 2, 2), steps=4))
    assert s.eps == (2.0, 8.0) and s.pgd_step(8.0) == 5.0
    assert AttackSettings(step_size=1.5).pgd_step(8.0) == 1.5
    for bad, match in ((dict(attacks=('cw',)), 'attacks must be'), (dict(eps=(0,)), 'eps must'),
                       (dict(eps=(300,)), 'eps must'), (dict(steps=0), 'steps must'),
                       (dict(max_images=0), 'max_images'), (dict(flip=1), 'unknown robustness')):
        with pytest.raises(ValueError, match=match):
            settings_from_dict(bad)
    row = {'clean': {'mIoU': 60.0}, 'fgsm': {'2': {'mIoU': 50.0}, '8': {'mIoU': 30.0}}}
    assert strength_means(row) == {'fgsm': 40.0}
    table = format_robustness_table({'a': row, 'b': [row, dict(row, clean={'mIoU': 70.0})]},
                                    AttackSettings(attacks=('fgsm',), eps=(2, 8)))
    assert '| model | clean | fgsm 2/255 | fgsm 8/255 | fgsm mean |' in table
    assert '| a | 60.00 | 50.00 | 30.00 | 40.00 |' in table
    assert '| b | 65.00 ± 7.07 | 50.00 ± 0.00 |' in table


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

    from lookhere_dense.cli import parse_cfg_options
    from lookhere_dense.data.relational import RelationalSettings, ensure_relational_dataset
    init_default_scope('mmseg')
    root = str(tmp_path_factory.mktemp('rel'))
    ensure_relational_dataset(root, RelationalSettings(num_train=64, num_val=8,
                                                       scales=(1.0,)))
    cfg = Config.fromfile(str(repo_root / 'configs' / 'study' / 'relational_vit_tiny.py'))
    cfg.merge_from_dict(parse_cfg_options([
        f'train_dataloader.dataset.data_root={root}', f'val_dataloader.dataset.data_root={root}',
        'model.backbone.num_layers=2', 'train_dataloader.batch_size=8',
        'val_dataloader.batch_size=4', 'optim_wrapper.optimizer.lr=0.003']))
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
    from lookhere_dense.evaluation.extrapolation import evaluate_loader
    from lookhere_dense.evaluation.robustness import evaluate_attack
    model, cfg = trained
    dl, ev = cfg.val_dataloader.to_dict(), cfg.val_evaluator.to_dict()
    clean = evaluate_loader(model, dl, ev, 'whole', 'cpu')['metrics']   # model.test_step
    settings = AttackSettings(steps=2)
    for attack in (None, 'fgsm', 'pgd'):
        res = evaluate_attack(model, dl, ev, attack, 0.0, settings)
        assert res['metrics'] == {k: round(float(v), 4) for k, v in clean.items()}, attack
        assert res['max_linf'] == 0.0 and res['images'] == 8
    assert all(p.requires_grad for p in model.parameters())   # unfrozen afterwards


def test_a_stronger_attack_lowers_miou_of_a_trained_model(trained):
    from lookhere_dense.evaluation.robustness import robustness_sweep
    model, cfg = trained
    settings = AttackSettings(eps=(2, 16), steps=3)
    res = robustness_sweep(model, cfg.val_dataloader.to_dict(), cfg.val_evaluator.to_dict(),
                           settings)
    clean = res['clean']
    assert clean['mIoU'] > 25   # it learned the anchor, not only the background (~15)
    for attack in ('fgsm', 'pgd'):
        weak, strong = res[attack]['2'], res[attack]['16']
        assert clean['loss'] < weak['loss'] < strong['loss']
        assert strong['mIoU'] < clean['mIoU'] - 3
        assert weak['max_linf'] <= 2 + 1e-3 and strong['max_linf'] <= 16 + 1e-3
    assert res['fgsm']['16']['max_linf'] > 15.99   # FGSM moves by eps (not clipped everywhere)
    assert res['pgd']['16']['loss'] >= res['fgsm']['16']['loss']
