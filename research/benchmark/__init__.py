"""Benchmarks of the LookHere attention engine: the cases behind ``tools/benchmark.py``.

Sections (see ``docs/performance.md`` for the method and the recorded results):

=============  =======================================================  ==================
section        what                                                     needs
=============  =======================================================  ==================
``bias``       build the bias of a large grid: our tables vs a          torch (+ numpy for
               loop-based construction that follows the official        the baseline)
               algorithm (:mod:`.bias`, baseline in :mod:`.official`)
``attn``       attention alone: flex vs SDPA without / with the         torch
               materialised bias on CUDA; on CPU the block-mask tile
               sparsity (:mod:`.attention`)
``vit``        ViT-B forward: LookHereViT per backend vs the same       OpenMMLab
               trunk without position encoding vs mmseg's ViT
               (:mod:`.models`)
``frame``      whole-frame inference, peak memory and time per          OpenMMLab
               backend, fresh process per case (:mod:`.models`)
``compile``    ``torch.compile`` of the trunk vs eager: first call      torch
               (compilation) and steady state, inference and train
               step, fresh process per mode (:mod:`.compiled`)
``deploy``     an exported segmentor in onnxruntime vs torch: export,    OpenMMLab
               sizes, time, peak memory, difference (:mod:`.deploy`)
``peer``       against timm's ViT-B: whole frames, the train step,      torch + timm
               a Segmenter train step, FLOP bounds (:mod:`.peer`)       (+ OpenMMLab)
``segmenter``  whole-frame inference of segmentation configs, peak      OpenMMLab
               memory: the backbone alone vs the whole model
               (``predict``, whole mode) vs mmseg's original classes,
               fresh process per case (:mod:`.segmenter`)
=============  =======================================================  ==================

The torch-only modules (:mod:`.timing`, :mod:`.fresh`, :mod:`.child`, :mod:`.official`, :mod:`.bias`,
:mod:`.attention`, :mod:`.report`) import nothing from OpenMMLab, so the ``attention``
group (``bias`` + ``attn``) runs where only torch is installed. :mod:`.models` imports
the backbone (mmcv / mmengine) and mmseg; :mod:`.segmenter` imports OpenMMLab inside its
functions (its cases build whole mmseg models). This package imports no
submodule on its own.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

__all__ = ['SECTIONS', 'SECTION_GROUPS', 'DTYPES']

#: Every section, in the order they run.
SECTIONS: Tuple[str, ...] = (
    'bias',
    'vit',
    'frame',
    'segmenter',
    'attn',
    'compile',
    'deploy',
    'peer',
)
#: Named groups of sections: ``attention`` and ``vit`` / ``frame`` need torch alone,
#: ``segmenter`` and ``deploy`` need OpenMMLab; ``all`` leaves out ``compile``, ``deploy``
#: and ``peer`` (minutes of compilation / export / whole frames: ask for them by name).
SECTION_GROUPS: Dict[str, Tuple[str, ...]] = {
    'all': ('bias', 'vit', 'frame', 'segmenter', 'attn'),
    'attention': ('bias', 'attn'),
    'models': ('vit', 'frame', 'segmenter'),
}
#: dtype names accepted on the command line.
DTYPES: Dict[str, torch.dtype] = {
    'float32': torch.float32,
    'bfloat16': torch.bfloat16,
    'float16': torch.float16,
}
