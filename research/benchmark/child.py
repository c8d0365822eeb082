"""Benchmark cases that run in a fresh interpreter (torch only; the case decides the rest).

What runs in the child: ``python -m research.benchmark.child '<case JSON>'``
runs one case (:func:`run_case`) and prints its result as the last stdout line. The
parent side, :func:`research.benchmark.fresh.run_child`, starts it; the
case modules import that, never this one, so the dispatch below does not import back.

=============  ==================================================  ==================
kind           what                                                needs
=============  ==================================================  ==================
``bias``       :func:`.bias.bias_case` (one bias construction)     torch (+ numpy)
``frame``      :func:`.models.frame_case` (whole-frame forward)    OpenMMLab
``segmenter``  :func:`.segmenter.segmenter_case` (whole-frame      OpenMMLab
               memory of a config's backbone or model)
``compile``    :func:`.compiled.compile_case` (compiled vs eager)  torch
``deploy``     :func:`.deploy.deploy_case` (export / onnxruntime)  OpenMMLab, onnx
``peer``       :func:`.peer.peer_case` (vs timm's ViT-B: frame,    torch + timm
               train step; Segmenter step)                         (+ OpenMMLab)
=============  ==================================================  ==================
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, Optional, Sequence

__all__ = ['CASE_KINDS', 'run_case', 'main']

#: Case kinds a child can run.
CASE_KINDS = ('bias', 'frame', 'segmenter', 'compile', 'deploy', 'peer')


def run_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """Run one case in this process (what the child does); returns its result dict."""
    kind = case.get('kind')
    if kind == 'bias':
        from .bias import bias_case

        return bias_case(case)
    if kind == 'frame':
        from .models import frame_case

        return frame_case(case)
    if kind == 'segmenter':
        from .segmenter import segmenter_case

        return segmenter_case(case)
    if kind == 'compile':
        from .compiled import compile_case

        return compile_case(case)
    if kind == 'deploy':
        from .deploy import deploy_case

        return deploy_case(case)
    if kind == 'peer':
        from .peer import peer_case

        return peer_case(case)
    raise ValueError(f'unknown benchmark case kind {kind!r}; allowed: {list(CASE_KINDS)}')


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m research.benchmark.child '<case JSON>'``: print the result JSON."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        raise SystemExit("usage: python -m research.benchmark.child '<case JSON>'")
    print(json.dumps(run_case(json.loads(args[0]))))


if __name__ == '__main__':
    main()
