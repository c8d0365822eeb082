"""Adversarial robustness of a segmentation model: FGSM and PGD on its pixel loss, mIoU per
attack strength (``tools/robustness.py``; ``tools/extrapolation_study.py --robustness``).

Threat model (the LookHere rebuttal's FGSM / PGD rows, for dense prediction): white box,
untargeted, an L-inf perturbation of the input image of at most ``eps`` in **0-255 pixel
units** (``eps=4`` is the literature's 4/255), maximising the decode head's loss against the
ground-truth labels.

* :mod:`.attacks` -- FGSM, PGD and their settings, in plain torch;
* :mod:`.segmentor` -- the attacks on an mmseg segmentor: its decode loss, the attacked
  evaluation, the sweep over attacks and strengths;
* :mod:`.report` -- table, JSON and plot (``tools/robustness.py``).
"""

from .attacks import (
    ATTACKS,
    AttackSettings,
    fgsm,
    input_gradient,
    pgd,
    pixel_box,
    settings_from_dict,
)
from .report import format_robustness_table, plot_robustness, robustness_report
from .segmentor import (
    check_attackable,
    decode_loss,
    evaluate_attack,
    perturb,
    robustness_sweep,
    strength_means,
)

__all__ = [
    'ATTACKS',
    'AttackSettings',
    'settings_from_dict',
    'pixel_box',
    'input_gradient',
    'fgsm',
    'pgd',
    'decode_loss',
    'check_attackable',
    'perturb',
    'evaluate_attack',
    'robustness_sweep',
    'strength_means',
    'format_robustness_table',
    'plot_robustness',
    'robustness_report',
]
