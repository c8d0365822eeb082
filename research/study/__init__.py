"""The extrapolation study (``tools/extrapolation_study.py``): position encodings x seeds x
test ladders, trained and evaluated with the real mmengine Runner, merged across seeds and
written as reports.

* :mod:`.encodings` -- the encodings compared (``'lookhere:lh45'``, ...) and their backbones;
* :mod:`.aids` -- extrapolation aids: ``log_n`` (test time), ``mixed_crops`` and
  ``learnable_slopes`` (training), run specs such as ``'abs+mixed_crops'`` or
  ``'lookhere+learnable_slopes'``;
* a run's training length with its LR schedule stretched to match:
  :func:`lookhere_dense.engine.schedules.schedule_to` (the library's, also used by the tools);
* :mod:`.ladders` -- the test ladders (``rendered`` / ``resize``: zoom ladders, scales
  below 1 too, and their native-aspect rows; ``fov``: whole frames vs sliding windows at
  one pixel scale), their modes, settings, data and evaluator;
* :mod:`.runs` -- one run's config, training and evaluation (and, with ``robustness``, its
  FGSM / PGD attacks); the whole study;
* :mod:`.reports` -- mean / std over seeds, tables (mIoU, robustness, learned slopes), CSV,
  plots, merging, writing.

Import the submodules directly.
"""
