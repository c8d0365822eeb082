#!/usr/bin/env python
"""Write a copy of an mmseg config whose plain-ViT backbone is replaced by LookHereViT.

Works for the configs whose backbone is ``VisionTransformer`` (Segmenter, ViT/DeiT UPerNet,
SETR, DPT), ``BEiT`` or ``MAE``: embed dims, layers, heads, out_indices, CLS-token outputs,
norms and drop rates are carried over; position-embedding settings and the source's
pretrained weights are dropped; mmseg's layer-decay optimizer constructor (BEiT and MAE
configs), which knows only BEiT / MAE / ConvNeXt backbones, becomes
``LookHereLayerDecayOptimizerConstructor`` with the same decay rate (see
``lookhere_dense.swap``; each such change is printed). The written file is a flat config
that ``tools/train.py`` runs as it is.

Examples::

    python tools/swap_backbone.py mmseg::vit/vit_deit-s16_upernet_8xb2-80k_ade20k-512x512.py \\
        configs/upernet_lookhere_deit-s16_ade20k.py --preset lh90
    python tools/swap_backbone.py \\
        mmseg::segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py \\
        t.py --num-heads 12       # ViT-T's 3 heads fit no LookHere head layout
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


#: LookHereViT keys that the tool's own flags set: its error messages name the flags
_FLAGS = {'model.backbone.num_heads': '--num-heads', 'model.backbone.preset': '--preset'}


#: --init-values not given
_UNSET = object()


def _init_values(text: str) -> Optional[float]:
    """``--init-values``: a number >= 0, or ``none``."""
    if text.strip().lower() in ('none', 'off'):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'none', got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f'expected a number >= 0 or none, got {text!r}')
    return value


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    from lookhere_dense.apis.cli import ToolArgumentParser, add_cfg_options_arg

    parser = ToolArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='source config (file or mmseg:: package path)')
    parser.add_argument('out', help='where to write the new config (.py)')
    parser.add_argument(
        '--preset',
        choices=['lh180', 'lh90', 'lh45'],
        default=None,
        help='LookHere preset (default: the config stored in --checkpoint, else lh180; '
        'the printed summary says which)',
    )
    parser.add_argument(
        '--num-heads',
        type=int,
        default=None,
        help='override the head count (LookHere layouts need 6, 12 or 16 '
        'heads; 12 or 16 for lh45)',
    )
    parser.add_argument(
        '--checkpoint',
        default=None,
        help='backbone weights (official LookHere, timm / DeiT-III or '
        'lookhere-dense file) for init_cfg=Pretrained',
    )
    parser.add_argument(
        '--init-values',
        type=_init_values,
        default=_UNSET,
        metavar='V',
        help="LayerScale init of the LookHereViT blocks, or 'none' for none (default: the "
        "--checkpoint's: none for a file without LayerScale; else LookHere's 1e-4)",
    )
    parser.add_argument(
        '--keep-pretrained', action='store_true', help="keep the source config's model.pretrained"
    )
    add_cfg_options_arg(
        parser, 'model.backbone.num_layers=24 (applied to the source config before swapping)'
    )
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None):
    """Swap and write (:func:`lookhere_dense.apis.swap.swap_config_file`); returns the new
    config."""
    args = parse_args(argv)
    if not args.out.endswith('.py'):
        raise SystemExit(f'the output config must end in .py, got {args.out!r}')
    from lookhere_dense.apis.cli import quiet_known_warnings

    quiet_known_warnings()
    from lookhere_dense.apis.swap import swap_config_file
    from lookhere_dense.errors import ConfigError
    from lookhere_dense.swap import lookhere_config_summary

    notes: List[str] = []
    try:
        new = swap_config_file(
            args.config,
            args.out,
            preset=args.preset,
            num_heads=args.num_heads,
            checkpoint=args.checkpoint,
            keep_pretrained=args.keep_pretrained,
            cfg_options=args.cfg_options,
            report=notes.append,
            **({} if args.init_values is _UNSET else dict(init_values=args.init_values)),
        )
    except ConfigError as err:  # 'Set model.backbone.num_heads' -> 'Set --num-heads'
        message = str(err)
        for key, flag in _FLAGS.items():
            message = message.replace(key, flag)
        raise ConfigError(message) from None
    bb = new.model.backbone
    print(
        f'wrote {args.out}: LookHereViT embed_dims={bb.get("embed_dims")} '
        f'num_layers={bb.get("num_layers")} num_heads={bb.get("num_heads")} '
        f'out_indices={bb.get("out_indices")} {lookhere_config_summary(bb)}'
    )
    for note in notes:
        print(f'  {note}')
    return new


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
