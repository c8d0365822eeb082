#!/usr/bin/env python
"""Test (and evaluate) a checkpoint with mmengine's Runner: mmseg or mmdet configs.

The code is :mod:`lookhere_dense.test` (also ``python -m lookhere_dense.test`` and the
``lookhere-test`` console script); ``--help`` lists the options.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lookhere_dense.test import cli, main, parse_args  # noqa: E402

__all__ = ['main', 'parse_args']

if __name__ == '__main__':
    cli()
