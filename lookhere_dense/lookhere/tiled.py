"""Old import path of :mod:`lookhere_dense.lookhere.attention.tiled` (the same module object:
names, private ones and monkeypatching included)."""

import sys

from .attention import tiled as _module

sys.modules[__name__] = _module
