"""Research tooling on top of the library (the library never imports it).

* :mod:`.study` -- the controlled extrapolation study (``tools/extrapolation_study.py``);
* :mod:`.benchmark` -- the benchmark cases behind ``tools/benchmark.py``;
* :mod:`.datasets` -- generated datasets in the real ADE20K / Cityscapes / COCO layouts and
  the study's procedural tasks;
* :mod:`.demo` -- the main job on an embedded default (``tools/demo.py``);
* :mod:`.extrapolation` -- the extrapolation report (``tools/extrapolate.py``);
* :mod:`.robustness` -- FGSM / PGD attacks (``tools/robustness.py``, the study's
  ``--robustness``);
* :mod:`.evaluate` -- the one evaluation loop (whole / sliding windows, time, peak memory)
  of every report; :mod:`.reporting` -- the one reporting layer (tables, CSV, JSON,
  plots); :mod:`.memory` -- the one peak-memory meter; :mod:`.chance` -- chance levels;
* :mod:`.head_plots` -- each LookHere head's field of view and penalty
  (``tools/plot_heads.py``).

Import the submodules directly. Research tooling is a top-level package of the repository,
beside ``lookhere_dense/``: it is not in the wheel and runs from a checkout (``tools/`` put the
repository root on ``sys.path``; so does pytest, ``pythonpath`` in ``pyproject.toml``), and
no library module imports it (an import-linter contract). :data:`REPO` is that checkout's root.
"""

import os.path as osp

#: the repository root (``configs/``, ``tools/``, ``docs/``); research tooling only
REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
