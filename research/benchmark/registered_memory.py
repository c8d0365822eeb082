"""One-off probes behind docs/performance.md "The registered backbone against the
torch-only trunk" (issue 31, fp32).

``python -m research.benchmark.registered_memory imports`` prints the process RSS after
each import step (torch, timm, the torch-only model, mmseg's registry,
``register_all_modules``); ``python -m research.benchmark.registered_memory rise --rounds 2``
runs, one fresh process per case and round, two 512x512 train steps (after one warm-up)
of the torch-only ViT-B lh180 and of the registered backbone (the ADE20K Segmenter
config's dict) with drop path 0 and 0.1, and prints the memory the steps add
(:class:`~research.memory.PeakMemory`).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from typing import List, Optional, Sequence

GIB = 2**30
#: this module, run as ``python -m`` in each fresh child
MODULE = 'research.benchmark.registered_memory'


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def imports() -> None:
    """Print the peak RSS after each import step, in this process."""
    import torch  # noqa: F401

    print(f'torch {_rss_mb():.0f} MB')
    import timm  # noqa: F401

    print(f'+ timm {_rss_mb():.0f} MB')
    import lookhere_dense.lookhere  # noqa: F401

    print(f'+ lookhere_dense.lookhere {_rss_mb():.0f} MB')
    import mmseg.registry  # noqa: F401

    print(f'+ mmseg.registry {_rss_mb():.0f} MB')
    from lookhere_dense.registry import register_all_modules

    register_all_modules(init_default_scope=True)
    print(f'+ register_all_modules {_rss_mb():.0f} MB')


def rise_case(kind: str) -> dict:
    """One case in this process: ``'torch'`` or a drop path rate of the registered
    backbone; returns ``start`` and ``rise`` in GiB over two train steps."""
    import torch
    from mmseg.registry import MODELS

    from lookhere_dense.lookhere import create_model
    from lookhere_dense.registry import register_all_modules

    from ..memory import PeakMemory, free_memory
    from .peer import registered_backbone_cfg

    register_all_modules(init_default_scope=True)  # every case holds the same imports
    torch.set_num_threads(2)
    torch.manual_seed(0)
    arch = dict(embed_dims=768, num_layers=12, num_heads=12)
    if kind == 'torch':
        model = create_model(preset='lh180', **arch)

        def features(x):
            return model.forward_features(x)
    else:
        cfg = registered_backbone_cfg('lh180', **arch)
        cfg['drop_path_rate'] = float(kind)
        model = MODELS.build(cfg)
        model.init_weights()

        def features(x):
            return model(x)[-1]

    model.train()
    x = torch.randn(1, 3, 512, 512)

    def step():
        features(x).float().mean().backward()
        model.zero_grad(set_to_none=True)

    step()
    free_memory()
    with PeakMemory('cpu') as mem:
        for _ in range(2):
            step()
    return dict(case=kind, start=mem.start_bytes / GIB, rise=mem.rise_bytes / GIB)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('probe', choices=('imports', 'rise', 'case'))
    p.add_argument('--rounds', type=int, default=2)
    p.add_argument('--kind', default='torch', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.probe == 'imports':
        imports()
    elif args.probe == 'case':
        print(json.dumps(rise_case(args.kind)))
    else:
        for r in range(args.rounds):
            for kind in ('torch', '0.0', '0.1'):
                cmd = [sys.executable, '-m', MODULE, 'case', '--kind', kind]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    raise RuntimeError(f'{" ".join(cmd)} failed:\n{done.stderr[-2000:]}')
                line: List[str] = done.stdout.splitlines()
                res = json.loads(line[-1])
                name = 'torch-only' if kind == 'torch' else f'registered, drop path {kind}'
                print(
                    f'round {r + 1}: {name}: start {res["start"]:.3f} GiB, '
                    f'rise {res["rise"]:.3f} GiB',
                    flush=True,
                )


if __name__ == '__main__':
    main()
