"""FGSM / PGD on a segmentation model: the decode head's loss, the attacked evaluation
(:func:`evaluate_attack`, through the one evaluation loop :func:`~..evaluate.evaluate`) and
the sweep over attacks and strengths (:func:`robustness_sweep`).

The perturbed batch takes the real test path: the segmentor's ``predict`` with
``test_cfg=dict(mode='whole')`` -- the very call ``test_step`` makes after the data
preprocessor, so ``eps=0`` reproduces the clean evaluation exactly -- scored by the config's
evaluator (mmseg's ``IoUMetric``). The attack's forward pass is the same whole-image pass.
Model weights get no gradients (frozen while attacking).

The summary of an attack is its mean over the strengths > 0 (the rebuttal averages over
strengths, :func:`strength_means`).

Note: a data preprocessor that pads test images (its ``test_cfg``) makes the decode head
stretch its logits over the padding to the label size in the loss; the attack still
maximises that loss, but the gradient is then not exactly the one of the predicted pixels.
"""

from __future__ import annotations

import copy
import statistics
from typing import Any, Callable, Dict, Optional

import torch
from torch import Tensor

from lookhere_dense.errors import ConfigError
from lookhere_dense.evaluation.resize import transform_name

from ..evaluate import evaluate
from .attacks import ATTACKS, AttackSettings, fgsm, pgd, pixel_box

__all__ = [
    'decode_loss',
    'check_attackable',
    'perturb',
    'evaluate_attack',
    'robustness_sweep',
    'strength_means',
    'eps_key',
    'ROW_KEYS',
]


def decode_loss(model, inputs: Tensor, data_samples) -> Tensor:
    """The decode head's loss of ``inputs`` against the samples' ``gt_sem_seg``: the sum of
    the ``decode.*loss*`` terms of ``model.loss`` (auxiliary heads left out).

    Raises:
        lookhere_dense.errors.ConfigError: samples without ``gt_sem_seg`` (a pipeline
            without ``LoadAnnotations``), or a model whose losses have no ``decode.*loss*``
            term (:func:`robustness_report` checks the config for both before building the
            model: :func:`check_attackable`).
    """
    if any('gt_sem_seg' not in s for s in data_samples):
        raise ConfigError(
            'the attack needs the ground-truth labels, and these samples have '
            "none: add dict(type='LoadAnnotations') to the split's pipeline "
            '(after the image loading), or attack a split that has labels'
        )
    losses = model.loss(inputs, data_samples)
    terms = [v for k, v in losses.items() if k.startswith('decode.') and 'loss' in k]
    if not terms:
        raise ConfigError(
            f"the attack maximises the decode head's loss, and the model's "
            f'losses have no decode-head term (decode.*loss*): got '
            f'{sorted(losses)}'
        )
    total = 0.0
    for value in terms:
        total = total + (sum(value) if isinstance(value, (list, tuple)) else value)
    return total


def check_attackable(cfg, split: str) -> None:
    """What the attacks need from an mmseg config, checked before any model is built: a
    ``decode_head`` in ``cfg.model`` (its loss is attacked) and, in the ``split``
    dataloader's pipeline, a transform that loads the annotations (``LoadAnnotations``:
    the loss needs the ground-truth labels).

    Raises:
        lookhere_dense.errors.ConfigError: naming the split (or the model key) and what to do.
    """
    if not cfg.model.get('decode_head'):
        raise ConfigError(
            f"the attack maximises the decode head's loss, and model "
            f'(type={cfg.model.get("type")!r}) has no decode_head'
        )
    dataset = (cfg.get(f'{split}_dataloader') or {}).get('dataset') or {}
    pipeline = dataset.get('pipeline')
    if pipeline is None:  # a dataset wrapper: the samples are checked when loaded
        return
    names = [transform_name(t) for t in pipeline]
    if not any(n.startswith('Load') and 'Annotation' in n for n in names):
        other = 'val' if split == 'test' else 'test'
        raise ConfigError(
            f'the {split} split cannot be attacked: {split}_dataloader.dataset.pipeline has no '
            f'LoadAnnotations ({" -> ".join(names)}), and the attack maximises the loss '
            f'against the ground-truth labels. Attack a split with labels (--split {other}) '
            f"or add dict(type='LoadAnnotations') after the image loading"
        )


def perturb(
    model,
    inputs: Tensor,
    data_samples,
    attack: str,
    eps: float,
    settings: AttackSettings,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """``inputs`` (the data preprocessor's output) attacked with ``attack`` at strength
    ``eps`` (pixel units; ``eps == 0`` runs the attack and returns the inputs unchanged).
    The model is used as it is (call in eval mode, weights frozen: :func:`evaluate_attack`
    does)."""
    unit, lower, upper = pixel_box(model.data_preprocessor, inputs.device)

    def loss_fn(x):
        return decode_loss(model, x, data_samples)

    if attack == 'fgsm':
        return fgsm(loss_fn, inputs, eps * unit, lower, upper)
    if attack == 'pgd':
        return pgd(
            loss_fn,
            inputs,
            eps * unit,
            settings.pgd_step(eps) * unit,
            settings.steps,
            lower,
            upper,
            settings.random_start,
            generator,
        )
    raise ValueError(f'unknown attack {attack!r}; allowed: {list(ATTACKS)}')


class _Frozen:
    """Context: the model's parameters do not require gradients; restored afterwards."""

    def __init__(self, model):
        self.params = list(model.parameters())

    def __enter__(self):
        self.flags = [p.requires_grad for p in self.params]
        for p in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc):
        for p, flag in zip(self.params, self.flags):
            p.requires_grad_(flag)


def evaluate_attack(
    model,
    dataloader: Dict[str, Any],
    evaluator: Dict[str, Any],
    attack: Optional[str],
    eps: float,
    settings: AttackSettings,
    device: str = 'cpu',
    desc: str = '',
) -> Dict[str, Any]:
    """Attack every batch of a dataloader and score the predictions of the perturbed
    inputs (see the module docstring); ``attack=None`` (or ``eps=0``) is the clean model.

    Args:
        model: an mmseg segmentor; evaluated in eval mode with ``test_cfg`` ``'whole'``
            (both restored afterwards), weights frozen while attacking.
        dataloader: the dataloader config (built with ``Runner.build_dataloader``); its
            pipeline must load the annotations.
        evaluator: the evaluator config (e.g. ``IoUMetric``).
        attack: ``'fgsm'``, ``'pgd'`` or None.
        eps: strength in pixel units (>= 0).
        settings: PGD's steps / step size / random start / seed.
        device: ``'cpu'`` / ``'cuda[:N]'`` (timing). Default: ``'cpu'``.
        desc: progress-bar label. Default: ``''``.

    Returns:
        ``dict(metrics, loss, max_linf, images, seconds)``: the evaluator's metrics, the
        decode loss at the (perturbed) inputs (mean over images), the largest
        perturbation measured in pixel units, the number of images and the seconds spent
        (attack and prediction; data loading excluded).
    """
    from mmengine.config import ConfigDict

    generator = torch.Generator().manual_seed(int(settings.seed))
    totals = dict(loss=0.0, max_linf=0.0)

    def step(data):
        batch = model.data_preprocessor(data, False)
        inputs, samples = batch['inputs'], batch['data_samples']
        adv = (
            perturb(model, inputs, samples, attack, eps, settings, generator) if attack else inputs
        )
        unit, _, _ = pixel_box(model.data_preprocessor, inputs.device)
        totals['max_linf'] = max(totals['max_linf'], float(((adv - inputs) / unit).abs().max()))
        with torch.no_grad():
            loss = decode_loss(model, adv, samples)
            outputs = model(adv, samples, mode='predict')
        totals['loss'] += float(loss) * len(outputs)
        return outputs

    was_training, before = model.training, model.test_cfg
    model.eval()
    model.test_cfg = ConfigDict(mode='whole')
    try:
        with _Frozen(model):
            result = evaluate(model, dataloader, evaluator, step, device, desc, memory=False)
    finally:
        model.test_cfg = before
        model.train(was_training)
    images = result['images']
    return dict(
        metrics={k: _plain(v) for k, v in result['metrics'].items()},
        loss=round(totals['loss'] / max(1, images), 5),
        max_linf=round(totals['max_linf'], 4),
        images=images,
        seconds=round(result['total_seconds'], 2),
    )


def _plain(value: Any) -> Any:
    """numpy / tensor scalars -> Python numbers (floats rounded to 4 decimals)."""
    value = value.item() if hasattr(value, 'item') else value
    return round(value, 4) if isinstance(value, float) else value


def eps_key(eps: float) -> str:
    return f'{eps:g}'


#: what a sweep row adds to the evaluator's metrics
ROW_KEYS = ('loss', 'max_linf', 'images', 'seconds')


def robustness_sweep(
    model,
    dataloader: Dict[str, Any],
    evaluator: Dict[str, Any],
    settings: AttackSettings,
    device: str = 'cpu',
    log: Optional[Callable[[str], None]] = None,
    label: str = '',
    metric: Optional[str] = 'mIoU',
) -> Dict[str, Any]:
    """The clean model and every attack of ``settings`` at every strength
    (:func:`evaluate_attack`).

    Args:
        metric: the evaluator's metric the summaries use (:func:`strength_means`), checked
            right after the clean evaluation, before any attack runs; None: not checked.
            Default: ``'mIoU'``.

    Returns:
        ``{'clean': row, attack: {eps: row}}`` with ``eps`` as ``'4'``, ``'0.5'``, and
        ``row = dict(metrics..., loss, max_linf, images, seconds)`` (the evaluator's
        metrics flattened into the row).

    Raises:
        lookhere_dense.errors.ConfigError: the evaluator does not report ``metric`` (naming
            the metrics it does report).
    """
    dataloader = copy.deepcopy(dataloader)
    if settings.max_images:
        dataloader['dataset']['indices'] = settings.max_images

    def row(attack, eps):
        desc = 'clean' if attack is None else f'{attack} eps={eps:g}'
        res = evaluate_attack(
            model, dataloader, evaluator, attack, eps, settings, device, f'{label} {desc}'.strip()
        )
        out = dict(
            res['metrics'],
            loss=res['loss'],
            max_linf=res['max_linf'],
            images=res['images'],
            seconds=res['seconds'],
        )
        if log:
            log(
                f'{label + ": " if label else ""}{desc:>14}: mIoU {out.get("mIoU")}  '
                f'loss {out["loss"]:.4f}  max |delta| {out["max_linf"]:g}/255  '
                f'{out["seconds"]:.1f} s'
            )
        return out

    results: Dict[str, Any] = {'clean': row(None, 0.0)}
    reported = sorted(k for k in results['clean'] if k not in ROW_KEYS)
    if metric is not None and metric not in reported:
        raise ConfigError(
            f'the evaluator reports no {metric!r}, which the robustness summary '
            f'uses; it reports {reported} (use an evaluator that reports '
            f'{metric}, e.g. IoUMetric, before running the attacks)'
        )
    for attack in settings.attacks:
        results[attack] = {eps_key(e): row(attack, e) for e in settings.eps}
    return results


def strength_means(results: Dict[str, Any], metric: str = 'mIoU') -> Dict[str, float]:
    """``{attack: mean of metric over its strengths > 0}`` (the rebuttal's summary)."""
    return {
        a: round(statistics.fmean(r[metric] for r in per_eps.values()), 4)
        for a, per_eps in results.items()
        if a != 'clean'
    }
