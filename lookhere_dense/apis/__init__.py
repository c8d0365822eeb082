"""What the tools do, as functions (in the spirit of ``mmseg.apis``): the tools in
``tools/`` parse arguments, call these and print.

* ``tools/train.py``: :func:`~.train.train_model`;
* ``tools/test.py``: :func:`~.test.evaluate_checkpoint`;
* ``tools/infer.py``: :func:`~.inference.segment_images`; a model from a config and a
  checkpoint (loaded strictly): :func:`~.inference.build_model_from_checkpoint`;
* ``tools/swap_backbone.py``: :func:`~.swap.swap_config_file`;
* research tooling (:mod:`research`, on top of this layer):
  ``tools/demo.py``: :func:`research.demo.run_demo`; ``tools/extrapolate.py``:
  :func:`research.extrapolation.extrapolation_report`;
* ``tools/extrapolation_study.py``: :mod:`research.study`;
* ``tools/plot_heads.py``: :func:`research.head_plots.draw_head_fields`.

The tools share :mod:`.cli` (config loading, pre-flight checks, one-line errors).
Importing this package loads no OpenMMLab module; the functions do, when called.
"""

from .inference import build_model_from_checkpoint, segment_images
from .swap import swap_config_file
from .test import build_test_config, evaluate_checkpoint
from .train import build_train_config, train_model

__all__ = [
    'train_model',
    'build_train_config',
    'evaluate_checkpoint',
    'build_test_config',
    'segment_images',
    'build_model_from_checkpoint',
    'swap_config_file',
]
