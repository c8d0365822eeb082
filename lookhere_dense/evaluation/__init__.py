"""Evaluation components of the OpenMMLab layer.

* :mod:`.resize` -- the one test-time ``Resize`` rewrite of a pipeline (plain Python);
* :mod:`.metrics` -- :class:`~.metrics.PerClassIoUMetric` (registered in mmseg's
  ``METRICS`` by :func:`lookhere_dense.register_all_modules`).

The reports (extrapolation, robustness, the study) are research tooling:
:mod:`research`. Import the submodules directly.
"""
