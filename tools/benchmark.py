#!/usr/bin/env python
"""Benchmarks of the LookHere attention engine, ratios measured side by side in one run.

Sections (``--sections`` by name, or ``--section attention`` / ``models`` / ``all``;
default all). The cases live in :mod:`research.benchmark`; this script parses the
command line, calls them and prints.

``bias``   Building the LookHere bias of a 64x64 grid for 12 layers x 12 heads: our
           relative-offset tables (what every backend uses) vs a loop-based
           construction that follows the official algorithm (Python loops over query
           patches, per-query triangle masks with ``np.tri``, float64 numpy, dense
           ``(depth, heads, N, N)`` result, bf16 rounding). Each case runs in a fresh
           subprocess; peak memory is the rise of the process's peak RSS (``VmHWM``,
           reset after imports and a tiny warm-up: ``research.memory``).
           The baseline runs ``--baseline-depth`` layers (default 1: 12 would need
           ~40 GB) and is extrapolated linearly in depth from its measured per-layer
           stage; the output says so.
``vit``    ViT-B forward at 512x512 (batch 1, inference): LookHereViT (``auto`` backend,
           plus each of ``--vit-backends``) vs the same trunk with plain SDPA and no
           position bias vs mmseg's ``VisionTransformer``. Repeats are interleaved
           (rotating order); ratios are medians of per-round ratios. The no-bias
           trunk is ``LookHereViT(pos_encoding='none')`` built from the same seed.
``frame``  ViT-B whole-frame 1024x2048 inference (batch 1): peak memory and time per
           backend, each case in a fresh subprocess (order interleaved over repeats).
``segmenter``  Whole-frame inference (``--frame-size``, default 1024x2048) of
           segmentation configs (``--segmenter-configs``, default the two Cityscapes
           whole-frame Segmenter configs, mask transformer and linear), peak memory side
           by side: the config's backbone alone vs the whole model (``predict``, whole
           mode) vs the same model with mmseg's original classes in place of our lean
           drop-ins; each case in a fresh subprocess, random weights, float32; target:
           model peak <= 1.3x backbone. ``--quick`` uses the ViT-T tiny Cityscapes
           config, backbone and model only.
``compile``  (by name only: not in ``all``) ``torch.compile`` of the ViT at
           ``--vit-size`` against eager, one fresh process per ``--compile-modes``
           (inference, train step): the first call (compilation), steady-state seconds
           of both in interleaved rounds, their ratio, the largest output difference.
``deploy``  (by name only) the segmentor of ``--deploy-config`` (random weights) exported
           to ONNX at ``--frame-size`` and run by onnxruntime against the same model in
           torch, each stage in a fresh process: export time, file sizes (vs the fp32
           weights), seconds and peak memory (what the model adds to the process's RSS)
           of both, and the largest output difference.
``peer``   (by name only) against timm's ViT-B (``vit_base_patch16_224``,
           ``dynamic_img_size=True``), fresh process per case, ``--frame-repeats``
           interleaved rounds: whole-frame inference at ``--frame-size`` (timm, our
           trunk without bias, each of ``--peer-presets``; the first frame of each
           process, or with ``--peer-frame-steps N`` the median of N frames after an
           untimed one), one round at
           ``--peer-big-frame`` (``lh90``), the train step at ``--vit-size`` (lh180,
           lh90), and with ``--peer-segmenter-config`` a Segmenter train step with its
           LookHere trunk vs timm's ViT-B in its place; beside them the FLOP bound of
           each preset (every invisible pair skipped) and of the ``tiled`` plan, and
           (CPU) one attention layer at the frame's token count in process: dense SDPA
           without bias vs ``tiled`` / ``chunked`` (``--peer-layer-rounds``).
``attn``   (``--device cuda`` only) attention-only microbenchmark at 1024 / 4096 / 8192
           tokens (``--attn-tokens``): LookHere flex (compiled, block mask) vs SDPA without
           bias vs SDPA with the materialised bias, forward and forward + backward. On CPU this section only reports the block-mask tile
           sparsity (the fraction of tiles flex skips), which needs no GPU.

``--section attention`` (= ``bias attn``) and the sections ``vit`` and ``frame`` need torch
alone (numpy for the bias baseline; no mmcv / mmengine / mmseg / mmdet, no timm; mmseg's
ViT joins the ``vit`` section where mmseg is installed). ``segmenter`` builds whole mmseg
models and needs OpenMMLab.

Output: a table on stdout and, with ``--json``, the results and the exact command.

Examples::

    python tools/benchmark.py --json docs/benchmark_cpu.json          # full CPU run
    python tools/benchmark.py --quick                                 # < 1 min smoke run
    python tools/benchmark.py --device cuda --section attention       # torch + CUDA only
    python tools/benchmark.py --device cuda --json docs/benchmark_cuda.json
    python tools/benchmark.py --sections segmenter --threads 1 \\
        --json docs/segmenter_whole_frame_cpu.json                     # Segmenter vs backbone
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from lookhere_dense.apis.cli import (  # noqa: E402
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    quiet_known_warnings,
    resolve_config_path,
)
from lookhere_dense.lookhere import BACKENDS  # noqa: E402
from research.benchmark import (  # noqa: E402
    DTYPES,
    SECTION_GROUPS,
    SECTIONS,
    models,  # noqa: E402
)
from research.benchmark.attention import bench_attention  # noqa: E402
from research.benchmark.bias import bench_bias  # noqa: E402
from research.benchmark.compiled import bench_compile  # noqa: E402
from research.benchmark.deploy import bench_deploy  # noqa: E402
from research.benchmark.peer import PARTS as PEER_PARTS  # noqa: E402
from research.benchmark.peer import bench_peer  # noqa: E402
from research.benchmark.report import environment, format_table  # noqa: E402
from research.benchmark.segmenter import CASES as SEGMENTER_CASES  # noqa: E402
from research.benchmark.segmenter import bench_segmenter  # noqa: E402
from research.reporting import write_json  # noqa: E402

#: Side of one ViT patch in pixels: the smallest image side the sections take.
PATCH = 16


def image_side(text: str) -> int:
    """argparse type: an image side in pixels, at least one patch (16)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a whole number, got {text!r}') from None
    if value < PATCH:
        raise argparse.ArgumentTypeError(f'must be at least one {PATCH} px patch, got {value}')
    return value


#: what a frame case may be besides ``chunked:<block rows>``
FRAME_CASES = (models.NOBIAS, *BACKENDS)


def frame_case(text: str) -> str:
    """argparse type of ``--frame-backends``: ``nobias``, a LookHere backend, or
    ``chunked:<block rows>`` (rows >= 0; 0: automatic)."""
    backend, colon, block = text.partition(':')
    if backend not in FRAME_CASES:
        raise argparse.ArgumentTypeError(
            f'invalid frame case {text!r}: choose from {", ".join(FRAME_CASES)} '
            "or 'chunked:<block rows>'"
        )
    if colon:
        if backend != 'chunked':
            raise argparse.ArgumentTypeError(
                f"invalid frame case {text!r}: only 'chunked' takes ':<block rows>'"
            )
        try:
            non_negative_int(block)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(
                f'invalid frame case {text!r}: block rows {err}'
            ) from None
    return text


#: Default configs of the segmenter section (relative to the repository).
SEGMENTER_CONFIGS = [
    'configs/segmenter_lookhere_cityscapes_whole.py',
    'configs/segmenter_lookhere_linear_cityscapes_whole.py',
]
QUICK = dict(
    grid=12,
    bias_layers=3,
    baseline_depth=1,
    embed_dims=96,
    num_layers=2,
    vit_size=64,
    frame_size=[64, 128],
    repeats=2,
    frame_repeats=1,
    attn_tokens=[64, 256],
    compile_backend='aot_eager',
    vit_backends=['chunked'],
    threads=1,
    frame_backends=['nobias', 'auto'],
    segmenter_configs=['configs/segmenter_lookhere_vit-t_tiny-cityscapes.py'],
    segmenter_cases=['backbone', 'model'],
    deploy_config='configs/segmenter_lookhere_vit-t_tiny-cityscapes.py',
    peer_presets=['lh90'],
    peer_big_frame=[],
    peer_train_steps=1,
    peer_layer_rounds=1,
)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        epilog='Sections and measurement method: see the module '
        'docstring and docs/performance.md.',
    )
    p.add_argument(
        '--device',
        choices=('cpu', 'cuda'),
        default='cpu',
        help='where to run (cuda adds the attention timings); default: cpu',
    )
    p.add_argument(
        '--section',
        choices=tuple(SECTION_GROUPS),
        default=None,
        help="a group of sections: 'attention' = bias attn (torch alone, no "
        "OpenMMLab needed), 'models' = vit frame (torch alone) segmenter (OpenMMLab), 'all' "
        '(default: all)',
    )
    p.add_argument(
        '--sections',
        nargs='+',
        choices=SECTIONS,
        default=None,
        help='sections to run, by name (default: all: bias vit frame segmenter attn)',
    )
    p.add_argument(
        '--quick',
        action='store_true',
        help='tiny sizes for a smoke test (< 1 min); explicit flags still win',
    )
    p.add_argument(
        '--json', type=Path, default=None, help='write the results as JSON here (default: no file)'
    )
    p.add_argument(
        '--preset', default='lh90', help='LookHere preset of the models (default: lh90)'
    )
    p.add_argument(
        '--bias-preset',
        default='lh45',
        help='preset of the bias-build section; lh45 uses the triangle masks (default: lh45)',
    )
    p.add_argument(
        '--grid',
        type=positive_int,
        default=None,
        help='side of the square grid of the bias section (default 64)',
    )
    p.add_argument(
        '--bias-layers',
        type=positive_int,
        default=None,
        help='layers of our bias build (default 12)',
    )
    p.add_argument(
        '--baseline-depth',
        type=positive_int,
        default=None,
        help='layers the baseline really builds; the rest is extrapolated (default 1)',
    )
    p.add_argument('--embed-dims', type=positive_int, default=None, help='ViT width (default 768)')
    p.add_argument('--num-layers', type=positive_int, default=None, help='ViT depth (default 12)')
    p.add_argument('--num-heads', type=positive_int, default=12, help='ViT heads (default: 12)')
    p.add_argument(
        '--dtype',
        choices=tuple(DTYPES),
        default='float32',
        help='model dtype of the vit and frame sections (default: float32)',
    )
    p.add_argument(
        '--vit-size',
        type=image_side,
        default=None,
        help='image side of the vit section (default 512)',
    )
    p.add_argument(
        '--vit-batch', type=positive_int, default=1, help='batch of the vit section (default: 1)'
    )
    p.add_argument(
        '--compile-modes',
        nargs='+',
        choices=('inference', 'train'),
        default=['inference', 'train'],
        help='what the compile section compiles, at --vit-size (default: inference train)',
    )
    p.add_argument(
        '--compile-backend',
        default=None,
        help="torch.compile backend of the compile section (default: inductor; 'aot_eager' "
        'traces without generating code, the --quick default)',
    )
    p.add_argument(
        '--vit-backends',
        nargs='*',
        default=None,
        choices=BACKENDS[1:],
        metavar='BACKEND',
        help="LookHere backends timed besides 'auto' in the vit section, of "
        + ' '.join(BACKENDS[1:])
        + ' (default: chunked; on cuda chunked flex)',
    )
    p.add_argument(
        '--no-mmseg', action='store_true', help="skip mmseg's VisionTransformer in the vit section"
    )
    p.add_argument(
        '--frame-size',
        type=image_side,
        nargs=2,
        default=None,
        metavar=('H', 'W'),
        help='image size of the frame and segmenter sections (default 1024 2048)',
    )
    p.add_argument(
        '--frame-backends',
        nargs='+',
        default=None,
        type=frame_case,
        metavar='CASE',
        help="frame cases: 'nobias', a backend, or 'chunked:<block rows>' "
        '(default: nobias auto chunked:256 sdpa; on cuda nobias auto flex '
        'chunked sdpa)',
    )
    p.add_argument(
        '--frame-repeats',
        type=positive_int,
        default=None,
        help='fresh-process runs per frame case, interleaved (default 2)',
    )
    p.add_argument(
        '--max-dense-gib',
        type=non_negative_float,
        default=8.0,
        help='skip frame cases whose dense biases would exceed this many GiB (default: 8)',
    )
    p.add_argument(
        '--block-size',
        type=non_negative_int,
        default=0,
        help='query rows per block of the chunked backend (default: 0 = automatic)',
    )
    p.add_argument(
        '--segmenter-configs',
        nargs='+',
        default=None,
        metavar='CONFIG',
        help="mmseg configs of the segmenter section (default: the repository's "
        + ' '.join(SEGMENTER_CONFIGS)
        + ')',
    )
    p.add_argument(
        '--deploy-config',
        default=None,
        metavar='CONFIG',
        help='segmentation config of the deploy section (default: '
        'configs/segmenter_lookhere_cityscapes_whole.py; random weights), exported at '
        '--frame-size',
    )
    p.add_argument(
        '--deploy-dir',
        default='work_dirs/deploy',
        help='where the deploy section writes the exported file (default: work_dirs/deploy)',
    )
    p.add_argument(
        '--segmenter-cases',
        nargs='+',
        default=None,
        choices=SEGMENTER_CASES,
        help='cases of the segmenter section (default: backbone model mmseg)',
    )
    p.add_argument(
        '--segmenter-cfg-options',
        nargs='+',
        default=None,
        metavar='KEY=VALUE',
        help="overrides merged into every segmenter config, as a tool's "
        '--cfg-options (e.g. model.backbone.attn_backend=flex)',
    )
    p.add_argument(
        '--peer-presets',
        nargs='+',
        default=None,
        help='presets of the peer whole-frame cases (default: lh180 lh90 lh45)',
    )
    p.add_argument(
        '--peer-big-frame',
        type=image_side,
        nargs='*',
        default=None,
        metavar='H W',
        help='the larger frame of the peer section, lh90 vs timm, one round '
        '(default 2048 4096; no values: skip)',
    )
    p.add_argument(
        '--peer-train-steps',
        type=positive_int,
        default=None,
        help='timed steps per train case of the peer section (default 3)',
    )
    p.add_argument(
        '--peer-frame-steps',
        type=non_negative_int,
        default=0,
        help='peer frame cases: 0 times the first frame of each fresh process; N > 0 one '
        'untimed frame, then the median of N timed ones (the steady state), the table also '
        'giving the ratio of the best step (default 0)',
    )
    p.add_argument(
        '--peer-train-backends',
        nargs='+',
        default=(),
        choices=BACKENDS[1:],
        metavar='BACKEND',
        help='extra peer train cases per preset with the LookHere backend forced (e.g. '
        "'tiled' beside what auto picks; default: none)",
    )
    p.add_argument(
        '--peer-frame-backends',
        nargs='+',
        default=(),
        choices=BACKENDS[1:],
        metavar='BACKEND',
        help='extra peer whole-frame cases per preset with the LookHere backend forced (e.g. '
        "'tiled' beside what auto picks; default: none)",
    )
    p.add_argument(
        '--peer-plain-mlp',
        nargs='+',
        default=(),
        metavar='PRESET',
        help="extra peer whole-frame cases of these presets with the MLP's plain path "
        '(LOOKHERE_FUSED_MLP=0 in their processes), beside the fused MLP that bf16 '
        'inference on CPU takes (default: none)',
    )
    p.add_argument(
        '--peer-parts',
        nargs='+',
        default=None,
        choices=PEER_PARTS,
        help='parts of the peer section to run (default: all: ' + ' '.join(PEER_PARTS) + ')',
    )
    p.add_argument(
        '--peer-layer-rounds',
        type=non_negative_int,
        default=None,
        help='rounds of the peer one-attention-layer case (CPU; 0: skip; default 3)',
    )
    p.add_argument(
        '--peer-registered',
        nargs='*',
        default=['lh180'],
        metavar='PRESET',
        help='presets of the registered backbone as users build it (MODELS.build of the '
        "ADE20K Segmenter config's LookHereViT dict) beside the torch-only trunk in the peer "
        'frame and train cases (OpenMMLab; default: lh180; no values: none)',
    )
    p.add_argument(
        '--peer-autocast',
        default=None,
        choices=('bfloat16', 'float16'),
        help='run the peer frame / train / segmenter cases under torch.autocast in this dtype '
        '(mixed precision, float32 weights; default: off)',
    )
    p.add_argument(
        '--peer-segmenter-config',
        default=None,
        metavar='CONFIG',
        help='Segmenter config of the peer train step with a Segmenter head (OpenMMLab; '
        'default: none; e.g. configs/segmenter_lookhere_ade20k.py)',
    )
    p.add_argument(
        '--attn-tokens',
        type=positive_int,
        nargs='+',
        default=None,
        help='token counts of the attn section (default 1024 4096 8192)',
    )
    p.add_argument(
        '--attn-dtype',
        choices=tuple(DTYPES),
        default='bfloat16',
        help='dtype of the attn section (default: bfloat16)',
    )
    p.add_argument(
        '--repeats',
        type=positive_int,
        default=None,
        help='timed repeats per case in-process (default 5)',
    )
    p.add_argument(
        '--threads',
        type=positive_int,
        default=None,
        help='torch threads (default: torch default; 1 with --quick, where tiny '
        'ops on busy cores otherwise spend their time in thread hand-offs)',
    )
    p.add_argument(
        '--child-timeout',
        type=positive_float,
        default=1800,
        help='seconds before a subprocess case is abandoned (default: 1800)',
    )
    args = p.parse_args(argv)
    defaults = dict(
        grid=64,
        bias_layers=12,
        baseline_depth=1,
        embed_dims=768,
        num_layers=12,
        vit_size=512,
        frame_size=[1024, 2048],
        repeats=5,
        frame_repeats=2,
        attn_tokens=[1024, 4096, 8192],
        vit_backends=['chunked'],
        threads=None,
        frame_backends=['nobias', 'auto', 'chunked:256', 'sdpa'],
        segmenter_configs=SEGMENTER_CONFIGS,
        segmenter_cases=list(SEGMENTER_CASES),
        compile_backend='inductor',
        deploy_config='configs/segmenter_lookhere_cityscapes_whole.py',
        peer_presets=['lh180', 'lh90', 'lh45'],
        peer_big_frame=[2048, 4096],
        peer_train_steps=3,
        peer_layer_rounds=3,
    )
    if args.device == 'cuda':  # flex is the CUDA path for large grids
        defaults.update(
            vit_backends=['chunked', 'flex'],
            frame_backends=['nobias', 'auto', 'flex', 'chunked', 'sdpa'],
        )
    default_configs = args.segmenter_configs is None
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, QUICK[key] if args.quick and key in QUICK else value)
    if default_configs:  # the repository's, from any working directory
        args.segmenter_configs = repo_configs(args.segmenter_configs)
    if args.deploy_config in (defaults['deploy_config'], QUICK['deploy_config']):
        (args.deploy_config,) = repo_configs([args.deploy_config])
    if args.peer_big_frame and len(args.peer_big_frame) != 2:
        p.error(f'--peer-big-frame takes H W (or nothing), got {args.peer_big_frame}')
    if args.embed_dims % args.num_heads:
        p.error(f'--embed-dims {args.embed_dims} is not divisible by --num-heads {args.num_heads}')
    if args.section is not None and args.sections is not None:
        p.error('give --section (a group) or --sections (names), not both')
    if args.sections is None:
        args.sections = list(SECTION_GROUPS[args.section or 'all'])
    return args


def repo_configs(paths: Sequence[str]) -> List[str]:
    """Repository-relative config paths as the command line should use them: unchanged
    when run from the repository root, absolute otherwise (the defaults work from any
    working directory)."""
    here = Path.cwd().resolve() == REPO
    return [p if here else str(REPO / p) for p in paths]


def check_openmmlab() -> None:
    """Exit naming what the ``segmenter`` section needs, where OpenMMLab is missing."""
    try:
        import mmengine  # noqa: F401
        import mmseg  # noqa: F401
    except ImportError as err:
        raise SystemExit(
            f'section segmenter builds whole mmseg models and needs OpenMMLab (mmcv, '
            f'mmengine, mmseg): {err}. Where only torch is installed, run --sections bias '
            'vit frame attn (the ViTs are the torch-only trunk).'
        ) from err


def run_section(section: str, args: argparse.Namespace) -> Dict[str, Any]:
    """Call the package function of ``section`` with the command-line settings."""
    if section == 'bias':
        return bench_bias(
            args.bias_preset,
            args.grid,
            args.bias_layers,
            args.num_heads,
            args.baseline_depth,
            args.repeats,
            args.threads,
            args.child_timeout,
        )
    if section == 'attn':
        return bench_attention(
            args.preset,
            args.attn_tokens,
            args.num_heads,
            args.embed_dims,
            args.device,
            args.attn_dtype,
            args.repeats,
        )
    if section == 'deploy':
        return bench_deploy(
            args.deploy_config,
            tuple(args.frame_size),
            args.deploy_dir,
            args.frame_repeats,
            args.threads,
            None,
            args.child_timeout,
        )
    if section == 'segmenter':
        from lookhere_dense.apis.cli import parse_cfg_options

        cfg_options = (
            parse_cfg_options(args.segmenter_cfg_options) if args.segmenter_cfg_options else None
        )
        return bench_segmenter(
            args.segmenter_configs,
            tuple(args.frame_size),
            args.device,
            args.threads,
            args.segmenter_cases,
            cfg_options,
            args.child_timeout,
        )
    if section == 'peer':
        presets = args.peer_presets
        return bench_peer(
            presets=presets,
            frame_size=tuple(args.frame_size),
            big_frame_size=tuple(args.peer_big_frame) or None,
            big_frame_presets=['lh90'] if 'lh90' in presets else presets[:1],
            train_size=args.vit_size,
            train_presets=[p for p in presets if p != 'lh45'] or presets,
            train_steps=args.peer_train_steps,
            frame_steps=args.peer_frame_steps,
            train_backends=args.peer_train_backends,
            frame_backends=args.peer_frame_backends,
            plain_mlp_presets=args.peer_plain_mlp,
            segmenter_config=args.peer_segmenter_config,
            registered_presets=args.peer_registered,
            rounds=args.frame_repeats,
            layer_rounds=args.peer_layer_rounds,
            device=args.device,
            dtype=args.dtype,
            autocast=args.peer_autocast,
            threads=args.threads,
            timeout=args.child_timeout,
            parts=args.peer_parts,
        )
    arch = models.vit_arch(args.embed_dims, args.num_layers, args.num_heads)
    if section == 'vit':
        return models.bench_vit(
            arch,
            args.vit_size,
            args.vit_batch,
            args.preset,
            args.vit_backends,
            args.block_size,
            not args.no_mmseg,
            args.device,
            args.dtype,
            args.repeats,
        )
    if section == 'compile':
        return bench_compile(
            arch,
            (args.vit_size, args.vit_size),
            args.preset,
            args.compile_modes,
            args.compile_backend,
            args.device,
            args.dtype,
            args.repeats,
            args.threads,
            args.child_timeout,
        )
    return models.bench_frame(
        arch,
        tuple(args.frame_size),
        args.preset,
        args.frame_backends,
        args.block_size,
        args.device,
        args.dtype,
        args.frame_repeats,
        args.max_dense_gib,
        args.threads,
        args.child_timeout,
    )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the chosen sections, print the table, write the JSON; return the results."""
    args = parse_args(argv)
    quiet_known_warnings()
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda: no CUDA device available')
    if {'segmenter', 'deploy'} & set(args.sections) or (
        'peer' in args.sections and args.peer_segmenter_config
    ):
        check_openmmlab()  # fail before the first section, not after it
    if 'segmenter' in args.sections:  # a missing config: before the first section too
        for config in args.segmenter_configs:
            try:
                resolve_config_path(config)
            except (FileNotFoundError, ValueError) as err:  # missing, or no config file
                raise SystemExit(f'--segmenter-configs: {err}') from err
    if args.threads:
        torch.set_num_threads(args.threads)
    results: Dict[str, Any] = dict(
        command='python tools/benchmark.py '
        + ' '.join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        env=environment(args.device),
        args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    )
    t0 = time.perf_counter()
    for section in SECTIONS:  # in this order, whatever the order on the command line
        if section in args.sections:
            s0 = time.perf_counter()
            try:
                results[section] = run_section(section, args)
            except KeyboardInterrupt:  # Ctrl-C / timeout --signal=INT: keep what finished
                results['interrupted'] = section
                print(f'\ninterrupted in section {section}: writing the finished sections')
                break
            except Exception as err:  # one section's failure (e.g. CUDA OOM) costs that section
                msg = f'{type(err).__name__}: {" ".join(str(err).split())[:500]}'
                results.setdefault('failed_sections', {})[section] = msg
                print(f'\nsection {section} failed: {msg}', flush=True)
                continue
            results[section]['section_seconds'] = time.perf_counter() - s0
    results['total_seconds'] = time.perf_counter() - t0
    results['env']['load_avg_end'] = os.getloadavg() if hasattr(os, 'getloadavg') else None
    print(format_table(results))
    for section, msg in results.get('failed_sections', {}).items():
        print(f'section {section} FAILED: {msg}')
    if args.json:
        write_json(str(args.json), results, indent=1, default=str)
        print(f'\nwrote {args.json}')
    return results


if __name__ == '__main__':
    main()
