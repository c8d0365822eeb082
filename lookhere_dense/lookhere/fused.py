"""Old import path of :mod:`lookhere_dense.lookhere.attention.fused` (the same module object:
names, private ones and monkeypatching included)."""

import sys

from .attention import fused as _module

sys.modules[__name__] = _module
