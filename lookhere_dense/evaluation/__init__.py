"""Evaluation: what the tools and the study measure and how.

* :mod:`.memory` -- the one peak-memory meter (torch only);
* :mod:`.resize` -- the one test-time ``Resize`` rewrite of a pipeline (plain Python);
* :mod:`.extrapolation` -- the extrapolation report (test specs, slide settings, one test,
  table, plot; ``tools/extrapolate.py``);
* :mod:`.metrics` -- :class:`~.metrics.PerClassIoUMetric` (registered in mmseg's
  ``METRICS`` by :func:`lookhere_dense.register_all_modules`);
* :mod:`.chance` -- chance levels of mIoU;
* :mod:`.robustness` -- FGSM / PGD attacks of a segmentor's pixel loss, mIoU per strength
  (``tools/robustness.py``, the study's ``--robustness``).

Import the submodules directly; this package imports nothing on its own, so the
torch-only ones stay usable without OpenMMLab.
"""
