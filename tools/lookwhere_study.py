#!/usr/bin/env python
"""LookWhere (lookhere_dense/lookwhere): the distillation entry and the measurement study.

    python tools/lookwhere_study.py distill configs/lookwhere_distill_vit-t_tiny-ade.py \\
        [--work-dir DIR] [--cfg-options KEY=VALUE ...]
    python tools/lookwhere_study.py study [--sizes 256x512 512x1024 1024x2048] \\
        [--k-ratios 0.1 0.25 0.5] [--out-dir docs] [--name lookwhere_study] \\
        [--task cityscapes|cityscapes-small|fov] [--selector-target attn|boundary] [--coverage 0.5] \\
        [--fill nearest|propagate]
    python tools/lookwhere_study.py diagnose [--sizes 256x512 512x1024] [--json FILE]
    python tools/lookwhere_study.py timing [--size 1024x2048] [--k-ratios 0.25]
    python tools/lookwhere_study.py summary RUN.json [RUN.json ...] [--size 1024x2048] \\
        [--k-ratio 0.25] [--class-id N]
    python tools/lookwhere_study.py extractor-memory [--size 1024x2048] [--k-ratio 0.25] \\
        [--paths sdpa-coords chunked-coords] [--json FILE]

``distill`` runs mmengine's Runner on a ``LookWhereDistiller`` config (what-where
distillation from a frozen LookHere teacher, no labels). ``study`` trains a small LookHere
teacher on generated Cityscapes-layout frames, distils a LookWhere student from it, and
measures mIoU, time and peak memory of the whole frame, sliding windows and LookWhere at
each k_ratio and frame size (research/lookwhere/study.py), writing a JSON and a plot.
``diagnose`` measures which part loses mIoU: the nearest fill of the teacher's own
features at kept sets chosen several ways vs the extractor on them
(research/lookwhere/diagnose.py). ``timing`` times whole frame vs LookWhere, interleaved;
``extractor-memory`` measures one extractor forward's peak memory and time per attention
path (dense coordinate bias vs the chunked one); ``summary`` prints one Markdown table of
several study results (seeds, training-set sizes) at one frame size and ratio, with the
mean and range of LookWhere's gap to the whole frame.
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def _size(text: str):
    try:
        h, w = (int(v) for v in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'size must be HxW (e.g. 512x1024), got {text!r}'
        ) from None
    if h < 16 or w < 16:
        raise argparse.ArgumentTypeError(f'size {text!r} is smaller than one 16 px patch')
    return h, w


def _k_ratio(text: str) -> float:
    """A kept fraction in ``(0, 1]`` (``resolve_k``'s rule), refused by the parser (it was
    checked only by ``study``; ``diagnose`` met it after training its teacher, ``timing``
    and ``extractor-memory`` as a traceback)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'k ratio must be a number, got {text!r}') from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f'{text} is outside (0, 1]')
    return value


def _coverage(text: str) -> float:
    """The lattice's share of ``k``, in ``[0, 1]`` (``LookWhere``'s rule), refused by the
    parser (it was refused only when the student was built, after the teacher's
    training)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'coverage must be a number, got {text!r}') from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f'{text} is outside [0, 1]')
    return value


def _check_study_sizes(parser: argparse.ArgumentParser, sizes, task: str) -> None:
    """Refuse frame sizes smaller than ``task``'s training crop (the study trains its
    teacher on random crops of frames of every size: a smaller frame crashed deep in the
    crop sampling)."""
    from research.lookwhere.study import TASKS

    crop = TASKS[task].crop
    for h, w in sizes:
        if h < crop or w < crop:
            parser.error(
                f'--sizes: {h}x{w} is smaller than the {crop} px training crop of --task '
                f'{task} (its teacher trains on {crop}x{crop} crops of every size): give '
                f'sizes of at least {crop}x{crop}'
            )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    sub = parser.add_subparsers(dest='command', required=True)
    d = sub.add_parser('distill', help='what-where distillation (mmengine Runner)')
    d.add_argument('config')
    d.add_argument('--work-dir', default=None)
    d.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE')
    s = sub.add_parser('study', help='mIoU / time / memory vs whole frame and sliding windows')
    s.add_argument(
        '--sizes', nargs='+', type=_size, default=[(256, 512), (512, 1024), (1024, 2048)]
    )
    s.add_argument('--k-ratios', nargs='+', type=_k_ratio, default=[0.1, 0.25, 0.5])
    s.add_argument('--train-iters', type=int, default=300)
    s.add_argument('--distill-iters', type=int, default=150)
    s.add_argument('--finetune-iters', type=int, default=60, help='0: distillation only')
    s.add_argument('--test-frames', type=int, default=2)
    s.add_argument('--repeats', type=int, default=2, help='timed passes per case (median)')
    s.add_argument('--threads', type=int, default=2)
    s.add_argument('--out-dir', default='docs')
    s.add_argument('--name', default='lookwhere_study')
    s.add_argument(
        '--task',
        default='cityscapes',
        choices=['cityscapes', 'cityscapes-small', 'fov'],
        help='generated Cityscapes-layout frames, the same with small traffic lights of a '
        'fixed pixel size (cityscapes-small: detail a lower resolution loses), or the '
        'field-of-view scenes (research/datasets/fov_scenes.py; sizes e.g. 128x128 192x192 '
        '256x256). Default: cityscapes',
    )
    s.add_argument(
        '--selector-target',
        default='attn',
        choices=['attn', 'boundary'],
        help="what the selector is distilled to predict: the teacher's CLS attention "
        "(not the official's patch-query logits) or where its features change",
    )
    s.add_argument(
        '--coverage',
        type=_coverage,
        default=0.0,
        help='share of k kept on a regular lattice, in [0, 1]',
    )
    s.add_argument('--cache-dir', default='', help='reuse the trained teacher from here')
    s.add_argument(
        '--train-frames',
        type=int,
        default=16,
        help='generated training frames at 256x512 (larger sizes: the same pixel count, at '
        'least 2); a count other than 16 gets its own cached teacher. Default: 16',
    )
    s.add_argument(
        '--teacher-whole-iters',
        type=int,
        default=0,
        help='train the crop-trained teacher this many more steps on whole frames before it '
        'teaches (the whole row is then that teacher). Default: 0',
    )
    s.add_argument(
        '--selector-input',
        type=_size,
        default=None,
        help="the selector's low-resolution input HxW, a multiple of the patch size. "
        "Default: the task's (64x128 for the Cityscapes frames, 64x64 for fov)",
    )
    s.add_argument(
        '--seed',
        type=int,
        default=0,
        help="the student's (and the whole-frame control's) initialisation and step order; "
        'the teacher and the test frames do not change. Default: 0',
    )
    s.add_argument(
        '--fill',
        default='nearest',
        choices=['nearest', 'propagate'],
        help="the student's dense fill: the nearest kept patch or the learned propagation "
        "(trained in distillation and fine-tuning); the official's inverse-distance fill "
        "(fill='idw') is not one of the study's",
    )
    s.add_argument(
        '--finetune-teacher',
        action='store_true',
        help='control: fine-tune a copy of the teacher on the whole frames with the same '
        "steps and evaluate it ('whole-ft')",
    )
    t = sub.add_parser('timing', help='whole frame vs LookWhere time only, interleaved rounds')
    t.add_argument('--size', type=_size, default=(1024, 2048))
    t.add_argument('--k-ratios', nargs='+', type=_k_ratio, default=[0.25])
    t.add_argument('--rounds', type=int, default=3)
    t.add_argument('--threads', type=int, default=2)
    t.add_argument('--json', default=None, help='write the rows here')
    m = sub.add_parser(
        'extractor-memory', help='peak memory / time of one extractor forward per attention path'
    )
    m.add_argument('--size', type=_size, default=(1024, 2048))
    m.add_argument('--k-ratio', type=_k_ratio, default=0.25)
    m.add_argument('--paths', nargs='+', default=['sdpa-coords', 'chunked-coords'])
    m.add_argument('--rounds', type=int, default=3)
    m.add_argument('--threads', type=int, default=2)
    m.add_argument('--block-rows', type=int, default=0, help='0: automatic')
    m.add_argument('--json', default=None, help='write the rows here')
    g = sub.add_parser('diagnose', help='oracle fills: which kept set / extractor loses mIoU')
    g.add_argument('--sizes', nargs='+', type=_size, default=[(256, 512), (512, 1024)])
    g.add_argument('--k-ratios', nargs='+', type=_k_ratio, default=[0.1, 0.25, 0.5])
    g.add_argument('--train-iters', type=int, default=200)
    g.add_argument('--distill-iters', type=int, default=0, help='0: no student (teacher trunk)')
    g.add_argument('--test-frames', type=int, default=2)
    g.add_argument('--threads', type=int, default=2)
    g.add_argument('--cache-dir', default='work_dirs/lookwhere_cache')
    g.add_argument(
        '--extractor-max-patches',
        type=int,
        default=2048,
        help='larger grids get the oracle rows only (time)',
    )
    g.add_argument('--json', default=None, help='write the rows here')
    g.add_argument('--picture', default='', help='PNG of the kept sets (first frame)')
    u = sub.add_parser('summary', help='a table of study JSONs (seeds) at one size and k_ratio')
    u.add_argument('jsons', nargs='+', help="study results (the study's OUT_DIR/NAME.json)")
    u.add_argument('--size', default='1024x2048')
    u.add_argument('--k-ratio', type=float, default=0.25)
    u.add_argument(
        '--class-id',
        type=int,
        default=None,
        help="also this class's IoU (e.g. 6: the small traffic lights of cityscapes-small)",
    )
    args = parser.parse_args(argv)
    if args.command == 'distill':
        from lookhere_dense.apis.cli import parse_cfg_options
        from research.lookwhere.distill import run_distillation

        runner = run_distillation(args.config, args.work_dir, parse_cfg_options(args.cfg_options))
        print(f'distillation done: {runner.work_dir}')
        return 0
    if args.command == 'summary':
        import json

        from research.lookwhere.study import summarize

        runs = []
        for path in args.jsons:
            try:
                with open(path) as f:
                    runs.append(json.load(f))
            except (OSError, ValueError) as e:
                parser.error(f'summary: cannot read study results {path!r}: {e}')
        try:
            names = [os.path.splitext(os.path.basename(p))[0] for p in args.jsons]
            _, table = summarize(runs, args.size, args.k_ratio, names, args.class_id)
        except ValueError as e:
            parser.error(str(e))
        print(table)
        return 0
    command = 'python tools/lookwhere_study.py ' + ' '.join(sys.argv[1:] if argv is None else argv)
    if args.command == 'diagnose':
        import json

        from research.lookwhere.diagnose import run_diagnosis

        res = run_diagnosis(
            args.sizes,
            args.k_ratios,
            args.train_iters,
            args.distill_iters,
            args.test_frames,
            args.threads,
            args.cache_dir,
            extractor_max_patches=args.extractor_max_patches,
            picture=args.picture,
        )
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(dict(command=command, **res), f, indent=2)
        return 0
    if args.command == 'extractor-memory':
        import json

        from lookhere_dense.lookwhere.subset import SUBSET_BACKENDS
        from research.lookwhere.study import run_extractor_memory

        for p in args.paths:
            if p not in SUBSET_BACKENDS:
                parser.error(f'--paths: {p!r} is not one of {list(SUBSET_BACKENDS)}')
        rows = run_extractor_memory(
            args.size, args.k_ratio, args.paths, args.rounds, args.threads, args.block_rows
        )
        for row in rows:
            print(row)
        if args.json:
            with open(args.json, 'w') as f:
                json.dump({'command': command, 'rows': rows}, f, indent=2)
        return 0
    if args.command == 'timing':
        import json

        from research.lookwhere.study import run_timing

        rows = run_timing(args.size, args.k_ratios, args.rounds, args.threads)
        for row in rows:
            print(row)
        if args.json:
            with open(args.json, 'w') as f:
                json.dump(
                    {
                        'command': 'python tools/lookwhere_study.py '
                        + ' '.join(sys.argv[1:] if argv is None else argv),
                        'rows': rows,
                    },
                    f,
                    indent=2,
                )
        return 0
    _check_study_sizes(parser, args.sizes, args.task)
    if args.seed < 0:
        parser.error(f'--seed: {args.seed} is negative')
    if args.train_frames < 2:
        parser.error(f'--train-frames: {args.train_frames} is below 2')
    if args.teacher_whole_iters < 0:
        parser.error(f'--teacher-whole-iters: {args.teacher_whole_iters} is negative')
    from research.lookwhere.study import run_study

    run_study(
        sizes=args.sizes,
        k_ratios=args.k_ratios,
        train_iters=args.train_iters,
        distill_iters=args.distill_iters,
        finetune_iters=args.finetune_iters,
        test_frames=args.test_frames,
        repeats=args.repeats,
        threads=args.threads,
        out_dir=args.out_dir,
        name=args.name,
        command=command,
        task=args.task,
        selector_target=args.selector_target,
        coverage=args.coverage,
        cache_dir=args.cache_dir,
        fill=args.fill,
        finetune_teacher=args.finetune_teacher,
        seed=args.seed,
        teacher_whole_iters=args.teacher_whole_iters,
        train_frames=args.train_frames,
        selector_input=args.selector_input,
    )
    return 0


if __name__ == '__main__':
    sys.exit(main())
