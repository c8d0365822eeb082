#!/usr/bin/env python
"""Train a segmentor (mmseg config) or detector (mmdet config) with mmengine's Runner.

The code is :mod:`lookhere_dense.train` (also ``python -m lookhere_dense.train`` and the
``lookhere-train`` console script); ``--help`` lists the options.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lookhere_dense.train import cli, main, parse_args  # noqa: E402

__all__ = ['main', 'parse_args']

if __name__ == '__main__':
    cli()
