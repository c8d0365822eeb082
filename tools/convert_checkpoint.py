#!/usr/bin/env python
"""Convert an official LookHere, a timm / DeiT-III, an mmseg ViT or a lookhere-dense
training checkpoint for ``LookHereViT``.

Writes ``{'state_dict': backbone weights, 'meta': {'lookhere_config': ..., 'num_heads': ...,
'source': ...}}``, which ``LookHereViT(init_cfg=dict(type='Pretrained', checkpoint=OUT))``
loads (taking the LookHere config from ``meta`` when the source had one, and checking the
head count). The head count written is ``--num-heads``, else the one the source records,
else 12 for official LookHere files; otherwise none is written and loading applies the
usual convention (timm / DeiT-III: ``channels / 64``) or asks for ``checkpoint_num_heads``.
A file in mmseg ``VisionTransformer``'s names (``layers.{i}.attn.attn.in_proj_weight``:
what mmseg's ``vit2mmseg.py`` writes, e.g. its model zoo's ViT pretraining files) is
renamed back to timm's (``init_cfg=Pretrained`` reads such a file as it is, too).

A training run's checkpoint (``WORK_DIR/iter_N.pth``, written by mmengine's Runner) holds
mmengine's message-hub objects besides the weights; the tool allows exactly those classes
itself (as ``lookhere_dense.register_all_modules`` does), so such a file converts as it is
where mmengine is installed. Plain weight files need torch alone.

Examples::

    python tools/convert_checkpoint.py LH_180_weights_and_config.pth pretrain/lh180_mmseg.pth
    python tools/convert_checkpoint.py deit3_base_patch16_224.pth pretrain/deit3_b.pth
    python tools/convert_checkpoint.py work_dirs/run/iter_160000.pth pretrain/run_backbone.pth
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv=None) -> argparse.Namespace:
    from lookhere_dense.apis.cli import ToolArgumentParser, positive_int

    parser = ToolArgumentParser(
        description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        'src',
        help='official LookHere (.pth with weights+config), timm or '
        "DeiT-III checkpoint (.pth / .safetensors), or a training run's "
        'WORK_DIR/iter_N.pth',
    )
    parser.add_argument('dst', help='output file (mmseg-style backbone checkpoint)')
    parser.add_argument(
        '--keep-pos-embed',
        action='store_true',
        help="keep a timm / DeiT-III pos_embed, for LookHereViT(pos_encoding='abs'), "
        'which resamples it to its grid; dropped by default since LookHere has '
        'none',
    )
    parser.add_argument(
        '--num-heads',
        type=positive_int,
        default=None,
        metavar='N',
        help='the head count the source was trained with, recorded in DST '
        '(for files that do not record it; must equal a recorded one)',
    )
    return parser.parse_args(argv)


def _mmengine_installed() -> bool:
    try:
        import mmengine  # noqa: F401
    except ImportError:
        return False
    return True


def _check_heads(args, weights) -> None:
    """``--num-heads`` that cannot be the source's: its width does not split into that
    many heads, or its LookHere layout does not fit them (a file no model could load)."""
    from lookhere_dense.errors import ToolError
    from lookhere_dense.lookhere.config import resolve_lh_config
    from lookhere_dense.lookhere.weights import file_depth

    proj = weights.state_dict.get('patch_embed.projection.weight')
    if proj is None:
        proj = weights.state_dict.get('patch_embed.proj.weight')
    width = int(proj.shape[0]) if proj is not None else None
    if width is not None and width % args.num_heads:
        raise ToolError(
            f'--num-heads {args.num_heads}: {args.src!r} is {width} channels wide, which '
            f'does not split into {args.num_heads} heads'
        )
    layers = file_depth(weights.state_dict)
    if weights.lh_config is not None and layers > 0:
        try:
            resolve_lh_config(dict(weights.lh_config)).validate(args.num_heads, layers)
        except ValueError as err:
            raise ToolError(
                f'--num-heads {args.num_heads} does not fit {args.src!r}: {err}'
            ) from None


def _check_dst(args) -> None:
    """Refuse an output that cannot be written as asked, before reading the source: a
    folder, the source itself, a ``.safetensors`` name (its reader keeps tensors alone, not
    the ``meta`` this tool records), or a path under an existing file."""
    from lookhere_dense.errors import ToolError

    dst = args.dst
    if os.path.isdir(dst) or dst.endswith(os.sep):
        raise ToolError(f'dst {dst!r} is a folder: give the file to write, e.g. FOLDER/x.pth')
    if os.path.realpath(dst) == os.path.realpath(args.src) or (
        os.path.exists(dst) and os.path.exists(args.src) and os.path.samefile(dst, args.src)
    ):
        raise ToolError(
            f'dst {dst!r} is the source file {args.src!r}: converting in place would '
            'overwrite the original; give another output file'
        )
    if dst.lower().endswith('.safetensors'):
        raise ToolError(
            f'dst {dst!r}: a .safetensors file keeps tensors alone, not the LookHere config, '
            'head count and position encoding this tool records: name the output .pth'
        )
    parent = os.path.dirname(os.path.abspath(dst))
    while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if os.path.lexists(parent) and not os.path.isdir(parent):
        raise ToolError(f'dst {dst!r} cannot be written: {parent!r} is a file, not a folder')


def main(argv=None) -> int:
    """Convert; a file that is missing, unreadable or holds no ViT weights ends in one
    ``error:`` line (exit status 2)."""
    args = parse_args(argv)
    from lookhere_dense import compat
    from lookhere_dense.checkpoint import load_checkpoint_file
    from lookhere_dense.errors import CheckpointError, ToolError, UnreadableCheckpointError
    from lookhere_dense.lookhere.weights import (
        OFFICIAL_NUM_HEADS,
        backbone_weights,
        file_depth,
        missing_blocks,
        save_backbone_checkpoint,
    )

    _check_dst(args)
    # a Runner checkpoint (work_dir/iter_N.pth) holds mmengine's message-hub objects: allow
    # exactly those, as register_all_modules does (torch alone without mmengine: nothing)
    compat.apply()
    try:
        weights = backbone_weights(
            load_checkpoint_file(args.src), keep_pos_embed=args.keep_pos_embed, source=args.src
        )
    except CheckpointError as err:
        if (
            isinstance(err, UnreadableCheckpointError)
            and (err.refused_class or '').startswith('mmengine.')
            and not _mmengine_installed()
        ):
            raise ToolError(
                f'checkpoint {args.src!r} cannot be read: {err.problem}: an mmengine Runner '
                'checkpoint, which only reads with mmengine installed (pip install mmengine; '
                'its classes are then allowed, nothing else)'
            ) from None
        raise ToolError(str(err) if args.src in str(err) else f'{args.src!r}: {err}') from None
    if not file_depth(weights.state_dict):
        raise ToolError(
            f'{args.src!r} holds no transformer blocks (blocks.N.*) after reading it as a '
            f'{weights.format} file; first keys: {sorted(weights.state_dict)[:6]}'
        )
    gaps = missing_blocks(weights.state_dict)
    if gaps:
        raise ToolError(
            f'{args.src!r} lacks the blocks {", ".join(f"blocks.{i}" for i in gaps)} below its '
            f'last, blocks.{file_depth(weights.state_dict) - 1}: no whole trunk (a damaged '
            'or filtered file); nothing was written'
        )
    num_heads, how = weights.num_heads, 'recorded in the file'
    if args.num_heads is not None:
        if num_heads is not None and num_heads != args.num_heads:
            raise ToolError(
                f'--num-heads {args.num_heads}, but {args.src!r} records '
                f'{num_heads} heads: remove --num-heads'
            )
        num_heads, how = args.num_heads, 'stated by --num-heads'
        _check_heads(args, weights)
    elif num_heads is None and weights.format == 'official':
        num_heads, how = OFFICIAL_NUM_HEADS, 'official LookHere file: the official models have 12'
    try:
        save_backbone_checkpoint(
            args.dst,
            weights.state_dict,
            weights.lh_config,
            source=args.src,
            num_heads=num_heads,
            pos_encoding=weights.pos_encoding,
        )
    except (OSError, RuntimeError) as err:  # torch's writer raises RuntimeError
        from lookhere_dense.checkpoint.atomic import describe_path_error

        why = describe_path_error(err) if isinstance(err, OSError) else str(err).split('\n')[0]
        kept = ' (the file already there is left as it was)' if os.path.exists(args.dst) else ''
        raise ToolError(f'could not write {args.dst!r}: {why}{kept}') from None
    n_params = sum(v.numel() for v in weights.state_dict.values())
    print(
        f'{args.src}: {weights.format} format, {len(weights.state_dict)} tensors '
        f'({n_params / 1e6:.2f} M parameters, {file_depth(weights.state_dict)} blocks)'
    )
    print(f'  dropped: {", ".join(weights.dropped) or "nothing"}')
    print(f'  LookHere config: {weights.lh_config or "none in the file (set preset/lh_config)"}')
    print(
        f'  heads: {num_heads} ({how})'
        if num_heads is not None
        else '  heads: not recorded (loading assumes channels/64 for timm / DeiT-III files, '
        'else set checkpoint_num_heads; --num-heads N records it)'
    )
    print(f'  wrote {args.dst}')
    return 0


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
