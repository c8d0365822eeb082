"""The attacks, in plain torch: FGSM and PGD in the L-inf ball of a preprocessor's pixel box,
and their settings. On a segmentor: :mod:`.segmentor`; the report: :mod:`.report`.

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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch
from torch import Tensor

from lookhere_dense.validation import check_bool, check_int, check_number, is_number
from lookhere_dense.validation import settings_from_dict as settings_from_dict_

__all__ = [
    'ATTACKS',
    'AttackSettings',
    'settings_from_dict',
    'pixel_box',
    'input_gradient',
    'fgsm',
    'pgd',
]

#: the attacks, in table order
ATTACKS = ('fgsm', 'pgd')


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
            raise ValueError(
                f'attacks must be distinct names of {list(ATTACKS)}, got {list(attacks)}'
            )
        eps = (self.eps,) if isinstance(self.eps, (int, float)) else tuple(self.eps)
        if not eps or any(
            not is_number(e) or not math.isfinite(e) or not 0 < e <= 255 for e in eps
        ):
            raise ValueError(
                f'eps must be strengths in (0, 255] (0-255 pixel units, 4 = '
                f'4/255; the clean model is always evaluated), got {list(eps)}'
            )
        object.__setattr__(self, 'eps', tuple(sorted({float(e) for e in eps})))
        check_int('steps', self.steps, description='a whole number >= 1')
        if self.step_size is not None:
            check_number(
                'step_size',
                self.step_size,
                0,
                strict=True,
                maximum=255,
                description='in (0, 255] pixel units or None',
            )
        check_bool('random_start', self.random_start)
        check_int('seed', self.seed, minimum=None, description='a whole number')
        if self.max_images is not None:
            check_int('max_images', self.max_images, description='a whole number >= 1 or None')

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
    return settings_from_dict_(AttackSettings, cfg, 'robustness settings')


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
        (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


def fgsm(
    loss_fn: Callable[[Tensor], Tensor], x: Tensor, eps: Tensor, lower: Tensor, upper: Tensor
) -> Tensor:
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


def pgd(
    loss_fn: Callable[[Tensor], Tensor],
    x: Tensor,
    eps: Tensor,
    step: Tensor,
    steps: int,
    lower: Tensor,
    upper: Tensor,
    random_start: bool = True,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
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
