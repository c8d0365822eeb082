"""lookhere-dense: LookHere plain-ViT backbones for mmsegmentation and mmdetection.

Importing the package applies the documented version fixes (:mod:`.compat`) and registers
the model components in mmseg's and mmdet's registries, so configs can say
``custom_imports=dict(imports=['lookhere_dense'], allow_failed_imports=False)``.
The LookHere math itself is in :mod:`lookhere_dense.lookhere` (plain PyTorch).
"""
from . import compat

compat.apply()

from . import models  # noqa: E402,F401  (registers modules)
from . import engine  # noqa: E402,F401  (registers the layer-decay optimizer constructor)
from .data import checks  # noqa: E402,F401  (registers the CheckSegLabels transform)

__version__ = '0.1.0'
