"""Adversarial robustness of a segmentation model: FGSM and PGD on its pixel loss, mIoU per
attack strength (``tools/robustness.py``; ``tools/extrapolation_study.py --robustness``).

Threat model (the LookHere rebuttal's FGSM / PGD rows, for dense prediction): white box,
untargeted, an L-inf perturbation of the input image of at most ``eps`` in **0-255 pixel
units** (``eps=4`` is the literature's 4/255). The attack maximises the decode head's loss
against the ground-truth labels -- the ``decode.*loss*`` terms of the segmentor's ``loss``
(its ``loss_decode``, e.g. the pixel cross-entropy); auxiliary heads are not attacked
(:func:`decode_loss`).

Where it runs: on the data preprocessor's output (normalised RGB, ``(pixel - mean) /
std``). That map is affine per channel, so the pixel-space ball of radius ``eps`` is the
box of radius ``eps / std_c`` there, and valid pixels ``[0, 255]`` are ``[(0 - mean_c) /
std_c, (255 - mean_c) / std_c]`` (:func:`pixel_box`): the attack is exactly an L-inf ball of
``eps`` in pixel space, clipped to valid pixels. Perturbed images are not re-quantised to
integers (as usual for these attacks).

* **FGSM** (Goodfellow et al. 2015): ``x + eps * sign(grad)``, clipped to valid pixels
  (:func:`fgsm`);
* **PGD** (Madry et al. 2018): a uniform random start in the ball (``random_start``), then
  ``steps`` steps of ``step_size * sign(grad)`` (default ``2.5 * eps / steps``), each
  projected back onto the ball and onto valid pixels (:func:`pgd`).

The perturbed batch then takes the real test path: the segmentor's ``predict`` with
``test_cfg=dict(mode='whole')`` -- the very call ``test_step`` makes after the data
preprocessor, so ``eps=0`` reproduces the clean evaluation exactly -- scored by the config's
evaluator (mmseg's ``IoUMetric``) (:func:`evaluate_attack`). The attack's forward pass is the
same whole-image pass. Model weights get no gradients (frozen while attacking).

:func:`robustness_sweep` evaluates the clean model and every attack at every strength;
the summary of an attack is its mean over the strengths > 0 (the rebuttal averages over
strengths, :func:`strength_means`). :func:`robustness_report` is ``tools/robustness.py``:
table, JSON and plot.

Note: a data preprocessor that pads test images (its ``test_cfg``) makes the decode head
stretch its logits over the padding to the label size in the loss; the attack still
maximises that loss, but the gradient is then not exactly the one of the predicted pixels.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import os
import os.path as osp
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from lookhere_dense.validation import settings_from_dict as _from_dict

__all__ = ['ATTACKS', 'AttackSettings', 'settings_from_dict', 'pixel_box', 'input_gradient',
           'fgsm', 'pgd', 'decode_loss', 'check_attackable', 'perturb', 'evaluate_attack', 'robustness_sweep',
           'strength_means', 'format_robustness_table', 'plot_robustness',
           'robustness_report']

#: the attacks, in table order
ATTACKS = ('fgsm', 'pgd')
_print = functools.partial(print, flush=True)


@dataclass(frozen=True)
class AttackSettings:
    """What a robustness evaluation runs.

    Attributes:
        attacks: attacks of :data:`ATTACKS`, in order. Default: ``('fgsm', 'pgd')``.
        eps: strengths, L-inf radius in 0-255 pixel units (``4`` = 4/255), each > 0; the
            clean model (0) is always evaluated too. Default: ``(1, 2, 4, 8)``.
        steps: PGD steps. Default: 10.
        step_size: PGD step in pixel units; None: ``2.5 * eps / steps`` (Madry et al.).
            Default: None.
        random_start: PGD starts from a uniform random point of the ball (a bool).
            Default: True.
        seed: seed of PGD's random start (an int; each strength starts from this seed).
            Default: 0.
        max_images: only the first N images of the split; None: all. Default: None.
    """

    attacks: Tuple[str, ...] = ATTACKS
    eps: Tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    steps: int = 10
    step_size: Optional[float] = None
    random_start: bool = True
    seed: int = 0
    max_images: Optional[int] = None

    def __post_init__(self):
        attacks = (self.attacks,) if isinstance(self.attacks, str) else tuple(self.attacks)
        object.__setattr__(self, 'attacks', attacks)
        unknown = [a for a in attacks if a not in ATTACKS]
        if not attacks or unknown or len(set(attacks)) != len(attacks):
            raise ValueError(f'attacks must be distinct names of {list(ATTACKS)}, got '
                             f'{list(attacks)}')
        eps = (self.eps,) if isinstance(self.eps, (int, float)) else tuple(self.eps)
        if not eps or any(isinstance(e, bool) or not isinstance(e, (int, float)) or
                          not math.isfinite(e) or not 0 < e <= 255 for e in eps):
            raise ValueError(f'eps must be strengths in (0, 255] (0-255 pixel units, 4 = '
                             f'4/255; the clean model is always evaluated), got {list(eps)}')
        object.__setattr__(self, 'eps', tuple(sorted({float(e) for e in eps})))
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f'steps must be a whole number >= 1, got {self.steps!r}')
        if self.step_size is not None and (isinstance(self.step_size, bool) or not isinstance(
                self.step_size, (int, float)) or not 0 < self.step_size <= 255):
            raise ValueError(f'step_size must be in (0, 255] pixel units or None, got '
                             f'{self.step_size!r}')
        if not isinstance(self.random_start, bool):
            raise ValueError(f'random_start must be True or False, got {self.random_start!r}')
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f'seed must be a whole number, got {self.seed!r}')
        if self.max_images is not None and (isinstance(self.max_images, bool) or not
                                            isinstance(self.max_images, int) or
                                            self.max_images < 1):
            raise ValueError(f'max_images must be a whole number >= 1 or None, got '
                             f'{self.max_images!r}')

    def pgd_step(self, eps: float) -> float:
        """PGD's step in pixel units at strength ``eps``."""
        return float(self.step_size) if self.step_size is not None else 2.5 * eps / self.steps

    def to_json(self) -> Dict[str, Any]:
        """A JSON-able dict (lists for tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def settings_from_dict(cfg: Optional[Dict[str, Any]]) -> AttackSettings:
    """:class:`AttackSettings` from a config dict (unknown keys are an error, by name).

    Raises:
        ValueError: an unknown key or a bad value.
    """
    return _from_dict(AttackSettings, cfg, 'robustness settings')


# ----------------------------------------------------------------------------------------
# The attacks (plain torch)
# ----------------------------------------------------------------------------------------
def pixel_box(data_preprocessor, device: Any = 'cpu') -> Tuple[Tensor, Tensor, Tensor]:
    """How pixel units map to the data preprocessor's normalised input space.

    Returns:
        ``(unit, lower, upper)``, each ``(1, C, 1, 1)`` float32: ``unit`` is one pixel level
        in normalised units (``1 / std``), ``lower`` / ``upper`` the normalised values of
        pixels 0 and 255, computed with the preprocessor's own ``(x - mean) / std``. A
        preprocessor that does not normalise gives ``(1, 0, 255)``.
    """
    if getattr(data_preprocessor, '_enable_normalize', False):
        mean = data_preprocessor.mean.to(device).float()
        std = data_preprocessor.std.to(device).float()
        lower = (torch.zeros_like(mean) - mean) / std
        upper = (torch.full_like(mean, 255.0) - mean) / std
        return (1.0 / std)[None], lower[None], upper[None]
    one = torch.ones(1, 1, 1, 1, device=device)
    return one, one * 0.0, one * 255.0


def input_gradient(loss_fn: Callable[[Tensor], Tensor], x: Tensor) -> Tuple[Tensor, Tensor]:
    """``(loss, d loss / d x)`` of the scalar ``loss_fn(x)`` (``x`` is not changed; no
    other gradient is kept)."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_fn(x)
        grad, = torch.autograd.grad(loss, x)
    return loss.detach(), grad


def fgsm(loss_fn: Callable[[Tensor], Tensor], x: Tensor, eps: Tensor, lower: Tensor,
         upper: Tensor) -> Tensor:
    """FGSM: ``clip(x + eps * sign(d loss / d x), lower, upper)``.

    Args:
        loss_fn: ``x -> scalar loss`` to increase.
        x: the input, ``(B, C, H, W)``.
        eps / lower / upper: radius and valid range, broadcastable to ``x`` (e.g.
            ``(1, C, 1, 1)`` from :func:`pixel_box`).

    Returns:
        The perturbed input (detached), same shape.
    """
    _, grad = input_gradient(loss_fn, x)
    return torch.clamp(x.detach() + eps * grad.sign(), lower, upper)


def pgd(loss_fn: Callable[[Tensor], Tensor], x: Tensor, eps: Tensor, step: Tensor, steps: int,
        lower: Tensor, upper: Tensor, random_start: bool = True,
        generator: Optional[torch.Generator] = None) -> Tensor:
    """PGD (L-inf): from ``x`` (or a uniform random point of the ball), ``steps`` times
    ``x' <- clip(proj_ball(x' + step * sign(grad)), lower, upper)``.

    Args:
        loss_fn: ``x -> scalar loss`` to increase.
        x: the input, ``(B, C, H, W)``.
        eps / step / lower / upper: radius, step and valid range, broadcastable to ``x``.
        steps: number of steps (>= 1).
        random_start: start from a uniform point of the ball (clipped). Default: True.
        generator: CPU generator of the random start. Default: None (the global one).

    Returns:
        The perturbed input (detached): within ``eps`` of ``x`` and within
        ``[lower, upper]``.
    """
    x = x.detach()
    adv = x
    if random_start:
        noise = torch.rand(x.shape, generator=generator, dtype=torch.float32).to(x)
        adv = torch.clamp(x + (2 * noise - 1) * eps, lower, upper)
    for _ in range(steps):
        _, grad = input_gradient(loss_fn, adv)
        adv = adv + step * grad.sign()
        adv = torch.clamp(torch.min(torch.max(adv, x - eps), x + eps), lower, upper)
    return adv


# ----------------------------------------------------------------------------------------
# On a segmentor
# ----------------------------------------------------------------------------------------
def decode_loss(model, inputs: Tensor, data_samples) -> Tensor:
    """The decode head's loss of ``inputs`` against the samples' ``gt_sem_seg``: the sum of
    the ``decode.*loss*`` terms of ``model.loss`` (auxiliary heads left out).

    Raises:
        lookhere_dense.errors.ConfigError: samples without ``gt_sem_seg`` (a pipeline
            without ``LoadAnnotations``), or a model whose losses have no ``decode.*loss*``
            term (:func:`robustness_report` checks the config for both before building the
            model: :func:`check_attackable`).
    """
    from lookhere_dense.errors import ConfigError

    if any('gt_sem_seg' not in s for s in data_samples):
        raise ConfigError('the attack needs the ground-truth labels, and these samples have '
                          "none: add dict(type='LoadAnnotations') to the split's pipeline "
                          '(after the image loading), or attack a split that has labels')
    losses = model.loss(inputs, data_samples)
    terms = [v for k, v in losses.items() if k.startswith('decode.') and 'loss' in k]
    if not terms:
        raise ConfigError(f'the attack maximises the decode head\'s loss, and the model\'s '
                          f'losses have no decode-head term (decode.*loss*): got '
                          f'{sorted(losses)}')
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
    from lookhere_dense.errors import ConfigError

    from lookhere_dense.evaluation.resize import transform_name

    if not cfg.model.get('decode_head'):
        raise ConfigError(f"the attack maximises the decode head's loss, and model "
                          f"(type={cfg.model.get('type')!r}) has no decode_head")
    dataset = (cfg.get(f'{split}_dataloader') or {}).get('dataset') or {}
    pipeline = dataset.get('pipeline')
    if pipeline is None:  # a dataset wrapper: the samples are checked when loaded
        return
    names = [transform_name(t) for t in pipeline]
    if not any(n.startswith('Load') and 'Annotation' in n for n in names):
        other = 'val' if split == 'test' else 'test'
        raise ConfigError(
            f"the {split} split cannot be attacked: {split}_dataloader.dataset.pipeline has no "
            f"LoadAnnotations ({' -> '.join(names)}), and the attack maximises the loss "
            f"against the ground-truth labels. Attack a split with labels (--split {other}) "
            f"or add dict(type='LoadAnnotations') after the image loading")


def perturb(model, inputs: Tensor, data_samples, attack: str, eps: float,
            settings: AttackSettings, generator: Optional[torch.Generator] = None) -> Tensor:
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
        return pgd(loss_fn, inputs, eps * unit, settings.pgd_step(eps) * unit, settings.steps,
                   lower, upper, settings.random_start, generator)
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


def evaluate_attack(model, dataloader: Dict[str, Any], evaluator: Dict[str, Any],
                    attack: Optional[str], eps: float, settings: AttackSettings,
                    device: str = 'cpu', desc: str = '') -> Dict[str, Any]:
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
        perturbation measured in pixel units, the number of images and the seconds spent.
    """
    from mmengine.config import ConfigDict
    from mmengine.evaluator import Evaluator
    from mmengine.runner import Runner
    from tqdm import tqdm

    from ..extrapolation import _silence_metric_tables

    loader = Runner.build_dataloader(dataloader)
    evaluator = Evaluator(copy.deepcopy(evaluator))
    evaluator.dataset_meta = loader.dataset.metainfo
    generator = torch.Generator().manual_seed(int(settings.seed))
    was_training, before = model.training, model.test_cfg
    model.eval()
    model.test_cfg = ConfigDict(mode='whole')
    loss_sum, images, max_linf = 0.0, 0, 0.0
    start = time.perf_counter()
    try:
        with _Frozen(model):
            for data in tqdm(loader, desc=f'{desc:>16}', unit='batch', leave=False,
                             dynamic_ncols=True, disable=None):
                batch = model.data_preprocessor(data, False)
                inputs, samples = batch['inputs'], batch['data_samples']
                adv = perturb(model, inputs, samples, attack, eps, settings, generator) \
                    if attack else inputs
                unit, _, _ = pixel_box(model.data_preprocessor, inputs.device)
                max_linf = max(max_linf, float(((adv - inputs) / unit).abs().max()))
                with torch.no_grad():
                    loss = decode_loss(model, adv, samples)
                    outputs = model(adv, samples, mode='predict')
                if device.startswith('cuda'):
                    torch.cuda.synchronize()
                loss_sum += float(loss) * len(outputs)
                images += len(outputs)
                evaluator.process(data_samples=outputs, data_batch=data)
    finally:
        model.test_cfg = before
        model.train(was_training)
    seconds = time.perf_counter() - start
    logger, level = _silence_metric_tables()
    try:
        metrics = evaluator.evaluate(len(loader.dataset))
    finally:
        logger.setLevel(level)
    return dict(metrics={k: _plain(v) for k, v in metrics.items()},
                loss=round(loss_sum / max(1, images), 5), max_linf=round(max_linf, 4),
                images=images, seconds=round(seconds, 2))


def _plain(value: Any) -> Any:
    """numpy / tensor scalars -> Python numbers (floats rounded to 4 decimals)."""
    value = value.item() if hasattr(value, 'item') else value
    return round(value, 4) if isinstance(value, float) else value


def _key(eps: float) -> str:
    return f'{eps:g}'


#: what a sweep row adds to the evaluator's metrics
_ROW_KEYS = ('loss', 'max_linf', 'images', 'seconds')


def robustness_sweep(model, dataloader: Dict[str, Any], evaluator: Dict[str, Any],
                     settings: AttackSettings, device: str = 'cpu',
                     log: Optional[Callable[[str], None]] = None,
                     label: str = '', metric: Optional[str] = 'mIoU') -> Dict[str, Any]:
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
        res = evaluate_attack(model, dataloader, evaluator, attack, eps, settings, device,
                              f'{label} {desc}'.strip())
        out = dict(res['metrics'], loss=res['loss'], max_linf=res['max_linf'],
                   images=res['images'], seconds=res['seconds'])
        if log:
            log(f'{label + ": " if label else ""}{desc:>14}: mIoU {out.get("mIoU")}  '
                f'loss {out["loss"]:.4f}  max |delta| {out["max_linf"]:g}/255  '
                f'{out["seconds"]:.1f} s')
        return out

    results: Dict[str, Any] = {'clean': row(None, 0.0)}
    reported = sorted(k for k in results['clean'] if k not in _ROW_KEYS)
    if metric is not None and metric not in reported:
        from lookhere_dense.errors import ConfigError
        raise ConfigError(f'the evaluator reports no {metric!r}, which the robustness summary '
                          f'uses; it reports {reported} (use an evaluator that reports '
                          f'{metric}, e.g. IoUMetric, before running the attacks)')
    for attack in settings.attacks:
        results[attack] = {_key(e): row(attack, e) for e in settings.eps}
    return results


def strength_means(results: Dict[str, Any], metric: str = 'mIoU') -> Dict[str, float]:
    """``{attack: mean of metric over its strengths > 0}`` (the rebuttal's summary)."""
    return {a: round(statistics.fmean(r[metric] for r in per_eps.values()), 4)
            for a, per_eps in results.items() if a != 'clean'}


# ----------------------------------------------------------------------------------------
# Report (tools/robustness.py)
# ----------------------------------------------------------------------------------------
def format_robustness_table(rows: Dict[str, Any], settings: AttackSettings,
                            metric: str = 'mIoU', first: str = 'model') -> str:
    """A Markdown table, one row per model (``rows = {name: sweep results}``, header of the
    name column ``first``): the clean metric, then per attack one column per strength and
    its mean over the strengths. Cells are ``mean`` or ``mean ± std`` when a row holds
    several results (a list, e.g. seeds)."""
    head = [first, 'clean']
    for attack in settings.attacks:
        head += [f'{attack} {e:g}/255' for e in settings.eps] + [f'{attack} mean']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name, results in rows.items():
        many = results if isinstance(results, list) else [results]
        cells = [name, _mean_cell([r['clean'][metric] for r in many])]
        for attack in settings.attacks:
            cells += [_mean_cell([r[attack][_key(e)][metric] for r in many])
                      for e in settings.eps]
            cells.append(_mean_cell([strength_means(r, metric)[attack] for r in many]))
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def _mean_cell(values: Sequence[float]) -> str:
    if len(values) > 1:
        return f'{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}'
    return f'{values[0]:.2f}'


def plot_robustness(path: str, curves: Dict[str, Dict[str, Any]], settings: AttackSettings,
                    title: str, metric: str = 'mIoU') -> None:
    """PNG: ``metric`` vs strength, one panel per attack, one line per model (``curves =
    {name: sweep results or a list of them (mean, ±1 std bars)}``); strength 0 is the
    clean model."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    attacks = list(settings.attacks)
    fig, axes = plt.subplots(1, len(attacks), figsize=(6 * len(attacks), 4.3), squeeze=False)
    xs = [0.0, *settings.eps]
    for ax, attack in zip(axes[0], attacks):
        for name, results in curves.items():
            many = results if isinstance(results, list) else [results]
            series = [[r['clean'][metric] for r in many]]
            series += [[r[attack][_key(e)][metric] for r in many] for e in settings.eps]
            ys = [statistics.fmean(v) for v in series]
            err = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in series]
            ax.errorbar(xs, ys, yerr=err if any(err) else None, marker='o', capsize=3,
                        lw=2.2 if name.startswith('lookhere') else 1.4, label=name)
        ax.set_xscale('symlog', linthresh=1.0)
        ax.set_xticks(xs)
        ax.set_xticklabels([f'{x:g}' for x in xs])
        steps = f', {settings.steps} steps' if attack == 'pgd' else ''
        ax.set_title(f'{attack.upper()}{steps}', fontsize=10)
        ax.set_xlabel('eps (L-inf, pixel units /255; 0 = clean)')
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def robustness_report(config: str, checkpoint: str, settings: AttackSettings = AttackSettings(),
                      split: str = 'val', out_dir: Optional[str] = None,
                      name: str = 'robustness', device: Optional[str] = None,
                      cfg_options: Optional[dict] = None, command: str = '',
                      log: Callable[[str], None] = _print) -> Dict[str, Any]:
    """Attack ``checkpoint`` on the ``split`` set at every strength of ``settings`` and
    write ``<out_dir>/<name>.json``, ``.md`` (the table) and ``.png``.

    Images are predicted one per batch (``whole`` mode), as ``tools/extrapolate.py`` does.

    Args:
        config: the mmseg config the checkpoint was trained with (``mmseg::`` paths allowed).
        checkpoint: the checkpoint file.
        settings: attacks, strengths, PGD settings, ``max_images``. Default:
            :class:`AttackSettings` ``()``.
        split: ``'val'`` or ``'test'``: which dataloader of the config. Default: ``'val'``.
        out_dir: output folder. Default: ``work_dirs/<config name>/robustness``.
        name: file stem. Default: ``'robustness'``.
        device: ``'cpu'`` / ``'cuda[:N]'``. Default: None (cuda when available).
        cfg_options: config overrides. Default: None.
        command: the command line, stored in the report. Default: ``''``.
        log: progress lines, the table and the written paths. Default: print (flushed).

    Returns:
        The JSON content (``results``, ``means``, ``table``, ...), plus ``json`` / ``md`` /
        ``png`` (the written paths).

    Raises:
        lookhere_dense.errors.ConfigError: a non-mmseg config, a bad split, a split whose
        pipeline loads no labels or a model without a decode head (:func:`check_attackable`,
        before the model is built), an evaluator without ``mIoU`` (after the clean
        evaluation, before the attacks);
        FileNotFoundError: config or checkpoint missing; the pre-flight data checks'
        errors (:func:`lookhere_dense.apis.cli.preflight`).
    """
    import lookhere_dense
    lookhere_dense.register_all_modules()
    from mmengine.registry import init_default_scope

    from lookhere_dense.apis.cli import (build_model_from_checkpoint, load_segmentation_job,
                                         preflight)

    cfg = load_segmentation_job(config, checkpoint, split, cfg_options, 'robustness.py')
    scope = cfg.get('default_scope') or 'mmseg'
    check_attackable(cfg, split)
    init_default_scope(scope)
    preflight(cfg, (split,), check_pretrained=False)
    device = device or ('cuda' if torch.cuda.is_available() else 'cpu')
    model, _ = build_model_from_checkpoint(cfg, checkpoint, device)

    dl_cfg = copy.deepcopy(cfg.get(f'{split}_dataloader'))
    dl_cfg = dl_cfg.to_dict() if hasattr(dl_cfg, 'to_dict') else dict(dl_cfg)
    dl_cfg.update(batch_size=1, persistent_workers=False,
                  num_workers=min(int(dl_cfg.get('num_workers', 0)), 2))
    step = '2.5 eps / steps' if settings.step_size is None else f'{settings.step_size:g}'
    steps = f', PGD {settings.steps} steps of {step}' if 'pgd' in settings.attacks else ''
    log(f'{", ".join(settings.attacks)} at eps {", ".join(f"{e:g}" for e in settings.eps)} '
        f'(/255){steps}, on the {split} split'
        f'{f" (first {settings.max_images} images)" if settings.max_images else ""}, '
        f'device {device}')
    results = robustness_sweep(model, dl_cfg, cfg.get(f'{split}_evaluator'), settings, device,
                               log)
    means = strength_means(results)
    stem = osp.splitext(osp.basename(config.split('::')[-1]))[0]
    out_dir = out_dir or osp.join('work_dirs', stem, 'robustness')
    os.makedirs(out_dir, exist_ok=True)
    table = format_robustness_table({osp.basename(checkpoint): results}, settings)
    log('\n' + table)
    report = dict(config=config, checkpoint=checkpoint, split=split, device=device,
                  torch=torch.__version__, command=command, settings=settings.to_json(),
                  space='L-inf in 0-255 pixel units (attacked in the normalised input space, '
                        'clipped to valid pixels, not re-quantised)',
                  loss='decode head (decode.*loss*) against the ground-truth labels',
                  results=results, means=means, table=table)
    paths = {ext: osp.join(out_dir, f'{name}.{ext}') for ext in ('json', 'md', 'png')}
    with open(paths['json'], 'w') as f:
        json.dump(report, f, indent=1)
    with open(paths['md'], 'w') as f:
        f.write(f'mIoU under attack ({osp.basename(checkpoint)}, {split} split)\n\n{table}\n')
    plot_robustness(paths['png'], {osp.basename(checkpoint): results}, settings,
                    f'{stem} — {osp.basename(checkpoint)} ({device})')
    log(f'\nwrote {paths["json"]}, {paths["md"]} and {paths["png"]}')
    report.update(paths)
    return report
