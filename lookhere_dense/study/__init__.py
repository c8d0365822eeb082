"""The extrapolation study (``tools/extrapolation_study.py``): position encodings x seeds x
test ladders, trained and evaluated with the real mmengine Runner, merged across seeds and
written as reports.

* :mod:`.encodings` -- the encodings compared (``'lookhere:lh45'``, ...) and their backbones;
* :mod:`.aids` -- extrapolation aids: ``log_n`` (test time) and ``mixed_crops`` (training),
  run specs such as ``'abs+mixed_crops'``;
* :mod:`.schedules` -- a run's training length with its LR schedule stretched to match;
* :mod:`.ladders` -- the test ladders (``rendered`` / ``resize``: zoom ladders; ``fov``:
  whole frames vs sliding windows at one pixel scale), their modes, settings, data and
  evaluator;
* :mod:`.runs` -- one run's config, training and evaluation; the whole study;
* :mod:`.reports` -- mean / std over seeds, table, CSV, plot, merging, writing.

Import the submodules directly.
"""
