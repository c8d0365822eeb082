"""What the tools do, as functions (in the spirit of ``mmseg.apis``): the tools in
``tools/`` parse arguments, call these and print.

* ``tools/train.py``: :func:`~.train.train_model`;
* ``tools/test.py``: :func:`~.test.evaluate_checkpoint`;
* ``tools/infer.py``: :func:`~.inference.segment_images`;
* ``tools/demo.py``: :func:`~.demo.generate_dataset`, :func:`~.demo.run_demo`;
* ``tools/swap_backbone.py``: :func:`~.swap.swap_config_file`;
* ``tools/extrapolate.py``:
  :func:`lookhere_dense.evaluation.extrapolation.extrapolation_report`;
* ``tools/extrapolation_study.py``: :mod:`lookhere_dense.study`;
* ``tools/plot_heads.py``: :func:`lookhere_dense.visualization.heads.draw_head_fields`.

Importing this package loads no OpenMMLab module; the functions do, when called.
"""
from .demo import generate_dataset, run_demo
from .inference import segment_images
from .swap import swap_config_file
from .test import build_test_config, evaluate_checkpoint
from .train import build_train_config, train_model

__all__ = ['train_model', 'build_train_config', 'evaluate_checkpoint', 'build_test_config',
           'segment_images', 'generate_dataset', 'run_demo', 'swap_config_file']
