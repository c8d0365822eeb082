"""Section ``peer``: the LookHere ViT-B against timm's ViT-B, the ViT it replaces.

The peer is ``timm.create_model('vit_base_patch16_224', dynamic_img_size=True)`` (fused
SDPA, learned absolute position embedding, no bias). Beside it run our torch-only trunk
(:func:`~.models.build_vit`, ``attn_backend='auto'``) per preset and the same trunk with
no position encoding (``nobias``), from the same seed. Each case runs in a fresh process
(:func:`~.fresh.run_child`, kind ``peer``), cases interleave over rounds (rotating order),
and every ratio is a per-round ratio against the peer of the same round, median over
rounds.

Cases (``mode``):

``frame``     whole-frame inference of ``forward_features`` at ``size`` (the first call at
              that size: LookHere's tables and plans are included), peak memory of the
              process (CPU: peak RSS; CUDA: peak allocated).
``train``     a training step of ``forward_features`` (``mean().backward()``) at ``size``
              after one warm-up step; median seconds over ``steps``, peak memory over them.
``layer``     (CPU, in process) one attention layer at the frame's token count: dense SDPA
              without bias vs LookHere's ``fused``, ``tiled`` and ``chunked``
              (:func:`attention_layer`).
``train_layer`` (CPU, in process) one attention layer, forward + backward, at the token
              counts of training crops: dense SDPA without bias vs ``fused`` and
              ``tiled``.
``segmenter`` (OpenMMLab) a Segmenter training step (``loss`` + backward) of an mmseg
              config at ``size``, with the config's LookHere trunk or with timm's ViT-B in
              its place (:class:`TimmTrunk`: timm's ``VisionTransformer`` of the backbone's width,
              depth and heads; the same head); drop path off in both (stochastic depth
              would make the work per step random).

:func:`flop_bound` gives the best ratio a preset can reach against the dense ViT when
every invisible (query, key) pair is skipped: per layer the dense ViT does
``12 N D^2`` multiply-adds in its linear layers and ``2 N^2 D`` in attention, LookHere
``12 N D^2 + 2 N^2 D f`` with ``f`` the visible fraction of the pairs (averaged over
heads and layers); ``plan_bound`` / ``fused_plan_bound`` use the pairs the ``tiled`` /
``fused`` plan computes instead.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

from ..memory import GiB, PeakMemory, free_memory
from . import DTYPES
from .fresh import run_child
from .models import NOBIAS, build_vit, vit_arch
from .timing import interleaved, paired_ratio, rotations

__all__ = [
    'PEER',
    'PEER_MODEL',
    'PEER_OPENMMLAB',
    'REGISTERED',
    'PARTS',
    'flop_bound',
    'TimmTrunk',
    'peer_case',
    'attention_layer',
    'bench_peer',
]

#: case name of the peer
PEER = 'timm'
#: the peer in a process that has imported OpenMMLab as the ``registered`` cases do
#: (``register_all_modules`` and mmseg's model registry): the baseline that tells the
#: registered backbone's own memory from what importing mmseg costs any backbone
PEER_OPENMMLAB = 'timm+openmmlab'
#: model-name prefix of the registered backbone (``'registered:<preset>[:<backend>]'``)
REGISTERED = 'registered'
#: the model config whose backbone dict the ``registered`` cases build (ViT-B/16, as users do)
REGISTERED_CONFIG = 'configs/_base_/models/segmenter_lookhere_vit-b16_mask.py'
#: model-name suffix of a frame case with the MLP's plain path (``LOOKHERE_FUSED_MLP=0`` in
#: its process; ``'<preset>+plain-mlp'``): what the fused MLP of bf16 inference gives
PLAIN_MLP = '+plain-mlp'
#: the timm model name of the peer
PEER_MODEL = 'vit_base_patch16_224'
#: the parts of :func:`bench_peer`, in the order they run
PARTS = ('layer', 'train_layer', 'frame', 'big_frame', 'train', 'segmenter')


def flop_bound(preset: str, size: Sequence[int], embed_dims: int = 768, patch: int = 16) -> Dict:
    """The FLOP bound of ``preset`` against the dense ViT at an input of ``size``.

    Args:
        preset: a LookHere preset name.
        size: ``(H, W)`` in pixels.
        embed_dims: ``D``. Default: 768.
        patch: patch size. Default: 16.

    Returns:
        ``visible`` / ``computed`` / ``fused_computed``: fractions of the dense patch pairs
        a head sees / the ``tiled`` plan computes / the ``fused`` kernel's plan computes
        (averaged over heads and layers); ``attention_share``: the dense ViT's attention
        share of its work, ``N / (N + 6 D)``; ``bound`` / ``plan_bound`` /
        ``fused_plan_bound``: LookHere's work over the dense ViT's with ``visible`` /
        ``computed`` / ``fused_computed``.
    """
    from lookhere_dense.lookhere import PRESETS
    from lookhere_dense.lookhere.bias import build_grid_bias
    from lookhere_dense.lookhere.fused import get_fused_plan
    from lookhere_dense.lookhere.tiled import get_plan

    grid = (math.ceil(size[0] / patch), math.ceil(size[1] / patch))
    config = PRESETS[preset]
    depth = 12
    grid_bias = build_grid_bias(config, grid, depth=depth, num_heads=12)
    cache: Dict = {}
    computed, visible, fused = [], [], []
    for layer in range(depth):
        c, v = get_plan(grid_bias, layer, cache=cache).fractions()
        computed.append(c)
        visible.append(v)
        fused.append(get_fused_plan(grid_bias, layer, cache=cache).computed)
    n = grid[0] * grid[1] + 1
    share = n / (n + 6 * embed_dims)
    vis, comp, fcomp = (statistics.mean(x) for x in (visible, computed, fused))
    return dict(
        preset=preset,
        grid=list(grid),
        tokens=n,
        visible=vis,
        computed=comp,
        attention_share=share,
        bound=1 - share + share * vis,
        plan_bound=1 - share + share * comp,
        fused_computed=fcomp,
        fused_plan_bound=1 - share + share * fcomp,
    )


class TimmTrunk(nn.Module):
    """timm's ``VisionTransformer`` as a segmentation backbone: the last block's patch
    tokens after the final norm, as one NCHW map (what our Segmenter configs take from
    ``LookHereViT`` with ``out_indices=-1``).

    Args:
        embed_dims, num_layers, num_heads, patch_size, mlp_ratio: the architecture (the
            backbone config's keys). Default: ViT-B/16.
    """

    def __init__(
        self,
        embed_dims: int = 768,
        num_layers: int = 12,
        num_heads: int = 12,
        patch_size: int = 16,
        mlp_ratio: float = 4.0,
    ):
        super().__init__()
        from timm.models.vision_transformer import VisionTransformer

        self.vit = VisionTransformer(
            img_size=224,
            patch_size=patch_size,
            embed_dim=embed_dims,
            depth=num_layers,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            num_classes=0,
            dynamic_img_size=True,
        )
        self.patch_size = patch_size

    def forward(self, x: torch.Tensor):
        tokens = self.vit.forward_features(x)[:, self.vit.num_prefix_tokens :]
        h, w = (math.ceil(s / self.patch_size) for s in x.shape[-2:])
        return (tokens.transpose(1, 2).reshape(x.shape[0], -1, h, w),)


def _build(case: Dict[str, Any]) -> nn.Module:
    """The model of a ``frame`` / ``train`` case (seed 0); ``case['arch']`` (optional:
    ``embed_dims``, ``num_layers``, ``num_heads``) narrows both sides alike (the CPU
    simulation of ``tools/gpu_check.sh``)."""
    device, dtype = case['device'], DTYPES[case['dtype']]
    arch = vit_arch(**case.get('arch', {}))
    if case['model'] == PEER_OPENMMLAB:
        _import_openmmlab()
    if case['model'] in (PEER, PEER_OPENMMLAB):
        import timm

        torch.manual_seed(0)
        narrow = {}
        if case.get('arch'):
            narrow = dict(
                embed_dim=arch['embed_dims'], depth=arch['num_layers'], num_heads=arch['num_heads']
            )
        model = timm.create_model(PEER_MODEL, pretrained=False, dynamic_img_size=True, **narrow)
        return model.to(device=device, dtype=dtype)
    if case['model'].startswith(REGISTERED + ':'):
        return _registered(case)
    preset, _, backend = case['model'].removesuffix(PLAIN_MLP).partition(':')
    if preset == NOBIAS:
        return build_vit(arch, device=device, dtype=dtype, pos_encoding='none')
    return build_vit(arch, preset, backend or 'auto', device=device, dtype=dtype)


def registered_backbone_cfg(preset: str, backend: str = 'auto', **arch: Any) -> Dict[str, Any]:
    """The ``LookHereViT`` dict of :data:`REGISTERED_CONFIG` (the ADE20K Segmenter's ViT-B/16
    backbone: ``img_size`` 512, ``drop_path_rate`` 0.1, ``out_indices=-1``, ...) with
    ``preset`` and ``attn_backend`` set and ``arch`` (``embed_dims``, ``num_layers``,
    ``num_heads``) narrowing it: what ``MODELS.build`` gets from a user's config."""
    import os.path as osp

    from mmengine.config import Config

    from research import REPO

    cfg = Config.fromfile(osp.join(REPO, REGISTERED_CONFIG))
    backbone = dict(cfg.model.backbone)
    backbone.update(preset=preset, attn_backend=backend, **arch)
    return backbone


def _import_openmmlab() -> None:
    """What building a registered backbone imports before the build: lookhere-dense's
    registrations, mmseg as the default scope and mmseg's model registry (whose first
    lookup imports ``mmseg.models``: mmdet, mmcv's ops, scipy, matplotlib, ...)."""
    from mmseg.registry import MODELS

    from lookhere_dense.registry import register_all_modules

    register_all_modules(init_default_scope=True)
    MODELS.get('VisionTransformer')  # mmseg's lazy import of its model modules


def _registered(case: Dict[str, Any]) -> nn.Module:
    """``MODELS.build`` of :func:`registered_backbone_cfg` for a ``registered:<preset>
    [:<backend>]`` case, ``init_weights()`` run, seed 0 (OpenMMLab)."""
    from mmseg.registry import MODELS

    _, preset, backend = (case['model'].split(':') + [''])[:3]
    arch = {}
    if case.get('arch'):
        arch = {k: vit_arch(**case['arch'])[k] for k in ('embed_dims', 'num_layers', 'num_heads')}
    _import_openmmlab()
    torch.manual_seed(0)
    model = MODELS.build(registered_backbone_cfg(preset, backend or 'auto', **arch))
    model.init_weights()
    return model.to(device=case['device'], dtype=DTYPES[case['dtype']])


def _features(model: nn.Module, x: torch.Tensor, registered: bool) -> torch.Tensor:
    """What a step differentiates: ``forward_features`` (timm, the torch-only trunk), or
    for the ``registered`` backbone its ``forward`` (the last NCHW map), as a decode head
    calls it."""
    return model(x)[-1] if registered else model.forward_features(x)


def _segmenter(case: Dict[str, Any]):
    """The Segmenter of a ``segmenter`` case and one training batch (OpenMMLab)."""
    from mmengine.structures import PixelData
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample

    from lookhere_dense.registry import register_all_modules

    from .segmenter import _model_cfg

    register_all_modules(init_default_scope=True)
    model_cfg = _model_cfg(dict(config=case['config']))
    # stochastic depth skips random residual branches: the work would be random
    model_cfg['backbone']['drop_path_rate'] = 0.0
    model = MODELS.build(model_cfg)
    if case['model'] == PEER:
        torch.manual_seed(0)
        bb = model_cfg['backbone']
        arch = dict(embed_dims=768, num_layers=12, num_heads=12, patch_size=16, mlp_ratio=4.0)
        model.backbone = TimmTrunk(**{k: bb.get(k, v) for k, v in arch.items()})
    size = tuple(case['size'])
    g = torch.Generator().manual_seed(0)
    classes = model.decode_head.num_classes
    samples = []
    for _ in range(case.get('batch', 1)):
        s = SegDataSample(metainfo=dict(img_shape=size, pad_shape=size, ori_shape=size))
        label = torch.randint(0, classes, (1, *size), generator=g)
        s.gt_sem_seg = PixelData(data=label.to(case['device']))
        samples.append(s)
    x = torch.randn(len(samples), 3, *size, generator=g)
    return model.to(case['device']), x.to(case['device']), samples


def _profile_step(
    step: Callable[[], Any], sync: Callable[[], None], device: str
) -> Dict[str, Any]:
    """One more step under ``torch.profiler``: where its time goes. Returns ``profile``: the
    10 operators / kernels with the most self time on the device (CUDA) or the CPU, each
    ``name``, ``count``, ``self_ms`` (that time) and ``cpu_ms`` (their self CPU time); and
    ``profile_step_ms`` (wall time of the profiled step) and ``profile_cpu_ms`` (the CPU
    self time of every operator: with ``profile_step_ms`` it tells launch and Python
    overhead from kernel time). A profiler that fails gives ``profile_error`` instead (the
    timed row stays)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        cuda = device.startswith('cuda')
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            t0 = time.perf_counter()
            step()
            sync()
            wall = time.perf_counter() - t0
        events = list(prof.key_averages())

        def device_us(e) -> float:
            for name in ('self_device_time_total', 'self_cuda_time_total'):
                if hasattr(e, name):
                    return float(getattr(e, name))
            return 0.0

        key = device_us if cuda else (lambda e: float(e.self_cpu_time_total))
        top = sorted(events, key=key, reverse=True)[:10]
        return dict(
            profile=[
                dict(
                    name=str(e.key)[:160],
                    count=int(e.count),
                    self_ms=key(e) / 1e3,
                    cpu_ms=float(e.self_cpu_time_total) / 1e3,
                )
                for e in top
            ],
            profile_step_ms=wall * 1e3,
            profile_cpu_ms=sum(float(e.self_cpu_time_total) for e in events) / 1e3,
        )
    except Exception as err:  # pragma: no cover - depends on the profiler's build
        return dict(profile_error=f'{type(err).__name__}: {err}'[:300])


def peer_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """One case in this process (the fresh child of :func:`bench_peer`, kind ``peer``).

    Args:
        case: ``mode`` (``frame``, ``train``, ``segmenter``), ``model`` (``'timm'``,
            ``'nobias'`` or ``'<preset>[:<backend>]'``, with :data:`PLAIN_MLP` appended
            the MLP's plain path: ``LOOKHERE_FUSED_MLP=0`` while the case runs), ``size``
            ``[H, W]``, ``device``, ``dtype``, ``steps``, ``threads``; ``config`` for ``segmenter``; optional
            ``arch`` (a narrower ViT on both sides, see :func:`_build`), ``warmup`` (untimed steps before the timed ones; default 0 for ``frame``,
            whose first call at a size is the measurement, 1 otherwise) and
            ``strict_compile`` (a dynamo recompile-limit hit raises where torch can, and
            is reported either way: ``tools/gpu_check.sh``) and ``compile_backend`` (flex
            compiled with this ``torch.compile`` backend on any device, ``'aot_eager'`` on
            CPU: the simulation) and ``autocast`` (a dtype name: each step runs under
            ``torch.autocast`` in it, the weights in ``dtype``, i.e. mixed precision).

    Returns:
        ``case`` plus ``seconds`` (median), ``times``, ``peak`` (bytes: process peak RSS
        or CUDA peak allocated), ``meter``, ``backend`` (the backend LookHere's engine
        used last; None for the others), ``first_seconds`` (the first warm-up step, with
        compilation; None without warm-up) and, with ``strict_compile``,
        ``recompile_limit_hits``.
    """
    if str(case.get('model', '')).endswith(PLAIN_MLP):
        saved = os.environ.get('LOOKHERE_FUSED_MLP')
        os.environ['LOOKHERE_FUSED_MLP'] = '0'
        try:
            return _peer_case(case)
        finally:
            if saved is None:
                del os.environ['LOOKHERE_FUSED_MLP']
            else:
                os.environ['LOOKHERE_FUSED_MLP'] = saved
    return _peer_case(case)


def _peer_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """:func:`peer_case` in the environment it sets."""
    if case.get('threads'):
        torch.set_num_threads(int(case['threads']))
    watch = None
    if case.get('strict_compile'):
        from .gpu_check import RecompileWatch, strict_compile

        strict_compile()
        watch = RecompileWatch().__enter__()
    device, mode = case['device'], case['mode']
    if mode == 'segmenter':
        model, x, samples = _segmenter(case)
        model.train()

        def step():
            losses = model.loss(x, samples)
            sum(v for k, v in losses.items() if 'loss' in k).backward()
            model.zero_grad(set_to_none=True)

        trunk = model.backbone
    else:
        model = _build(case)
        registered = case['model'].startswith(REGISTERED + ':')
        trunk = model
        engine = getattr(getattr(trunk, 'pos_enc', None), 'engine', None)
        if case.get('compile_backend') and engine is not None and engine.backend == 'flex':
            engine.flex_compile = True  # compiled even on CPU (the simulation: aot_eager)
            engine.flex_compile_backend = case['compile_backend']
        x = torch.randn(1, 3, *case['size'], device=device, dtype=DTYPES[case['dtype']])
        model.train(mode == 'train')

        def step():
            if mode == 'train':
                _features(model, x, registered).float().mean().backward()
                model.zero_grad(set_to_none=True)
            else:
                with torch.inference_mode():
                    _features(model, x, registered)

    def sync():
        if str(device).startswith('cuda'):
            torch.cuda.synchronize(device)

    if case.get('autocast'):  # float32 weights, the forward under torch.autocast (AMP)
        plain_step = step

        def step():
            kind = 'cuda' if str(device).startswith('cuda') else 'cpu'
            with torch.autocast(kind, dtype=DTYPES[case['autocast']]):
                plain_step()

    first = None
    for i in range(int(case.get('warmup', 0 if mode == 'frame' else 1))):
        t0 = time.perf_counter()
        step()  # warm-up at the full size (compilation, autograd, allocator)
        sync()
        first = time.perf_counter() - t0 if i == 0 else first
    free_memory()
    times: List[float] = []
    with PeakMemory(device) as mem:
        for _ in range(int(case.get('steps', 1))):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
    engine = getattr(getattr(trunk, 'pos_enc', None), 'engine', None)
    profiled = _profile_step(step, sync, str(device)) if case.get('profile') else {}
    return dict(
        case,
        **profiled,
        seconds=statistics.median(times),
        times=times,
        peak=mem.peak_bytes,
        start=mem.start_bytes,
        rise=mem.rise_bytes,
        meter=mem.kind,
        backend=getattr(engine, 'last_backend', None),
        first_seconds=first,
        **({} if watch is None else dict(recompile_limit_hits=watch.hits)),
    )


def attention_layer(
    presets: Sequence[str],
    size: Sequence[int],
    backends: Sequence[str] = ('fused', 'tiled', 'chunked'),
    rounds: int = 3,
    num_heads: int = 12,
    head_dim: int = 64,
    train: bool = False,
    dtype: torch.dtype = torch.float32,
) -> Dict[str, Any]:
    """One attention layer at the token count of ``size`` (ViT-B/16 + CLS), in this
    process: dense SDPA without bias (what timm's ViT runs) against LookHere's ``backends``
    per preset; ``q, k, v`` are views of one fused ``qkv`` tensor, as in the models.
    ``train``: each case is a forward and a backward (``sum().backward()`` into the fused
    tensor); else a forward under ``inference_mode``. ``dtype``: of ``q, k, v`` (bfloat16
    for the attention a model runs under bf16 autocast). Default: float32.

    Returns:
        ``tokens``, ``rows`` (``case``, median ``seconds``, ``ratio``: median of per-round
        ratios against dense SDPA).
    """
    import torch.nn.functional as F

    from lookhere_dense.lookhere import PRESETS, LookHereAttentionEngine

    grid = (math.ceil(size[0] / 16), math.ceil(size[1] / 16))
    t = grid[0] * grid[1] + 1
    fused = torch.randn(1, t, 3, num_heads, head_dim).to(dtype).requires_grad_(train)

    def case(attend):
        def run():
            out = attend(*fused.permute(2, 0, 3, 1, 4).unbind(0))
            if train:
                out.sum().backward()
                fused.grad = None

        return run

    cases = {'dense sdpa, no bias': case(F.scaled_dot_product_attention)}
    for preset in presets:
        eng = LookHereAttentionEngine(PRESETS[preset], 1, num_heads)
        for backend in backends:
            cases[f'{preset} {backend}'] = case(
                lambda q, k, v, e=eng, b=backend: e(q, k, v, 0, grid, True, backend=b)
            )
    with torch.inference_mode(not train):
        for fn in cases.values():  # tables, plans
            fn()
        times = interleaved(cases, rounds, 'cpu')
    base = times['dense sdpa, no bias']
    rows = [
        dict(case=name, seconds=statistics.median(ts), ratio=paired_ratio(ts, base))
        for name, ts in times.items()
    ]
    return dict(tokens=t, grid=list(grid), train=train, dtype=str(dtype).split('.')[-1], rows=rows)


def _rise_ratio(pairs) -> Optional[float]:
    """Median per-round ratio of the memory a case's steps add over what the process held
    before them (imports, weights), against the peer's; None without both numbers."""
    got = [a['rise'] / b['rise'] for a, b in pairs if a.get('rise') and b.get('rise')]
    return statistics.median(got) if got else None


def _rows(results: Dict[str, List[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Per model: medians and per-round ratios against the peer; for the ``registered``
    cases also against :data:`PEER_OPENMMLAB` where it ran (``*_same_imports``)."""
    rows = []
    base = results[PEER]
    same = results.get(PEER_OPENMMLAB)
    for name, runs in results.items():
        ok = [(a, b) for a, b in zip(runs, base) if 'error' not in a and 'error' not in b]
        if not ok:
            errors = [r.get('error') for r in runs + base if r.get('error')]
            rows.append(dict(model=name, error=errors[0] if errors else 'no run'))
            continue
        rows.append(
            dict(
                model=name,
                backend=ok[0][0].get('backend'),
                seconds=statistics.median(a['seconds'] for a, _ in ok),
                peak_gib=statistics.median(a['peak'] / GiB for a, _ in ok),
                time_ratio=statistics.median(a['seconds'] / b['seconds'] for a, b in ok),
                peak_ratio=statistics.median(a['peak'] / b['peak'] for a, b in ok),
                start_gib=statistics.median(a.get('start', 0) / GiB for a, _ in ok),
                rise_ratio=_rise_ratio(ok),
                rounds=len(ok),
            )
        )
        if all(len(a.get('times', ())) > 1 and len(b.get('times', ())) > 1 for a, b in ok):
            # several timed steps per process: also the ratio of each process's best step
            # (the "best of 2 steps after a warm-up"; noise only ever adds time)
            rows[-1]['best_ratio'] = statistics.median(
                min(a['times']) / min(b['times']) for a, b in ok
            )
        if same and name.startswith(REGISTERED + ':'):
            pairs = [(a, b) for a, b in zip(runs, same) if 'error' not in a and 'error' not in b]
            if pairs:
                rows[-1].update(
                    time_ratio_same_imports=statistics.median(
                        a['seconds'] / b['seconds'] for a, b in pairs
                    ),
                    peak_ratio_same_imports=statistics.median(
                        a['peak'] / b['peak'] for a, b in pairs
                    ),
                )
    return rows


def _run(cases: Dict[str, Dict[str, Any]], rounds: int, timeout: float, label: str) -> Dict:
    names = list(cases)
    results: Dict[str, List[Dict[str, Any]]] = {n: [] for n in names}
    for r, order in rotations(names, rounds):
        for name in order:
            res = run_child(cases[name], timeout)
            results[name].append(res)
            if 'error' in res:
                print(
                    f'  [{label} round {r + 1}/{rounds}] {name}: ERROR {res["error"]}', flush=True
                )
            else:
                print(
                    f'  [{label} round {r + 1}/{rounds}] {name}: {res["seconds"]:.2f} s, '
                    f'peak {res["peak"] / GiB:.2f} GiB, backend {res.get("backend")}',
                    flush=True,
                )
    return dict(rows=_rows(results), runs=results)


def bench_peer(
    presets: Sequence[str] = ('lh180', 'lh90', 'lh45'),
    frame_size: Sequence[int] = (1024, 2048),
    big_frame_size: Optional[Sequence[int]] = (2048, 4096),
    big_frame_presets: Sequence[str] = ('lh90',),
    train_size: int = 512,
    train_presets: Sequence[str] = ('lh180', 'lh90'),
    train_steps: int = 3,
    frame_steps: int = 0,
    train_layer_sizes: Optional[Sequence[int]] = None,
    train_backends: Sequence[str] = (),
    frame_backends: Sequence[str] = (),
    plain_mlp_presets: Sequence[str] = (),
    segmenter_config: Optional[str] = None,
    registered_presets: Sequence[str] = ('lh180',),
    rounds: int = 2,
    layer_rounds: int = 3,
    device: str = 'cpu',
    dtype: str = 'float32',
    autocast: Optional[str] = None,
    threads: Optional[int] = None,
    timeout: float = 3600,
    parts: Optional[Sequence[str]] = None,
) -> Dict[str, Any]:
    """Every ``peer`` case side by side with timm's ViT-B (see the module docstring).

    Args:
        presets: presets of the whole-frame cases. Default: lh180, lh90, lh45.
        frame_size: the whole frame ``(H, W)``. Default: 1024x2048.
        big_frame_size: a larger frame, one round, ``big_frame_presets`` only; None: skip.
            Default: 2048x4096.
        train_size: side of the square training input. Default: 512.
        train_presets: presets of the training step. Default: lh180, lh90.
        train_steps: timed steps per training case. Default: 3.
        frame_steps: 0: a ``frame`` case times the first frame of its fresh process (the
            first call at that size: plans, kernels, allocations); N > 0: one untimed
            frame, then N timed ones, their median (the steady state of a run over many
            frames, the protocol of issue 31). Default: 0.
        train_layer_sizes: square sides of the ``train_layer`` part (512: 1025 tokens,
            640: 1601). Default: None: ``train_size`` and 5/4 of it rounded up to a patch
            (512, 640 for the default ``train_size``).
        train_backends: extra ``train`` cases per train preset with the backend forced
            (``'<preset>:<backend>'``, e.g. ``tiled`` beside what ``auto`` picks).
            Default: none.
        frame_backends: extra ``frame`` cases per preset with the backend forced (e.g.
            ``tiled`` beside what ``auto`` picks). Default: none.
        plain_mlp_presets: extra ``frame`` cases of these presets with the MLP's plain
            path (``'<preset>+plain-mlp'``, :data:`PLAIN_MLP`), beside the default one
            that takes the fused MLP in bfloat16 inference on CPU. Default: none.
        segmenter_config: an mmseg Segmenter config for the Segmenter training step
            (OpenMMLab); None: skip. Default: None.
        registered_presets: ``frame`` and ``train`` cases of the registered backbone as
            users build it (``'registered:<preset>'``: ``MODELS.build`` of the ADE20K
            Segmenter config's backbone dict, :func:`registered_backbone_cfg`; OpenMMLab)
            beside the torch-only trunk, and the peer in a process with the same imports
            (:data:`PEER_OPENMMLAB`; the rows of the registered cases get ratios against it
            too, ``time_ratio_same_imports`` / ``peak_ratio_same_imports``); empty: none.
            Default: lh180.
        rounds: interleaved rounds (fresh process per case and round). Default: 2.
        layer_rounds: rounds of :func:`attention_layer` (CPU only; 0: skip). Default: 3.
        device, dtype: where and in what the models run. Default: CPU, float32.
        autocast: run the ``frame`` / ``train`` / ``segmenter`` cases under
            ``torch.autocast`` in this dtype (``'bfloat16'``, ``'float16'``; mixed
            precision, weights in ``dtype``); None: off. Default: None.
        threads: ``torch.set_num_threads`` in each child; None: torch's default.
        timeout: seconds per child. Default: 3600.
        parts: which of :data:`PARTS` to run; None: all. Default: None.

    Returns:
        ``frame``, ``big_frame``, ``train``, ``segmenter``: each ``rows`` (per model:
        ``seconds``, ``peak_gib``, ``time_ratio``, ``peak_ratio`` against the peer, and
        with several timed steps per process ``best_ratio``: the median over rounds of the
        ratio of each process's best step) and ``runs``; ``bounds``: :func:`flop_bound` per preset and frame size; ``layer``:
        :func:`attention_layer` at the frame's token count (CPU); ``train_layer``: a list
        of :func:`attention_layer` with ``train=True`` (CPU).
    """
    if frame_steps < 0:  # before any case runs (the layer parts take minutes)
        raise ValueError(f'frame_steps must be >= 0, got {frame_steps}')
    common = dict(kind='peer', device=device, dtype=dtype, threads=threads)
    if autocast:
        common['autocast'] = autocast

    def cases(mode, size, models, steps=1, **extra):
        return {
            m: dict(common, mode=mode, model=m, size=list(size), steps=steps, **extra)
            for m in models
        }

    registered = [f'{REGISTERED}:{p}' for p in registered_presets]
    if registered:  # the peer with the same imports: the registered backbone's own memory
        registered.insert(0, PEER_OPENMMLAB)
    out: Dict[str, Any] = {'bounds': []}
    want = set(PARTS if parts is None else parts)
    unknown = want - set(PARTS)
    if unknown:
        raise ValueError(f'unknown peer parts {sorted(unknown)}; allowed: {list(PARTS)}')
    if want & {'frame', 'layer'}:
        for preset in presets:
            out['bounds'].append(flop_bound(preset, frame_size))
    if big_frame_size and 'big_frame' in want:
        for preset in big_frame_presets:
            out['bounds'].append(flop_bound(preset, big_frame_size))
    # the dtype the models' attention runs in: autocast's, else the weights' (``dtype``)
    layer_dtype = DTYPES[autocast or dtype]
    if train_layer_sizes is None:
        train_layer_sizes = (train_size, -(-train_size * 5 // 64) * 16)
    if layer_rounds and device == 'cpu' and 'layer' in want:
        if threads:
            torch.set_num_threads(int(threads))
        out['layer'] = attention_layer(presets, frame_size, rounds=layer_rounds, dtype=layer_dtype)
        for row in out['layer']['rows']:
            print(
                f'  [attention layer, {out["layer"]["tokens"]} tokens] {row["case"]}: '
                f'{row["seconds"]:.2f} s, x dense {row["ratio"]:.3f}',
                flush=True,
            )
    if layer_rounds and device == 'cpu' and 'train_layer' in want:
        if threads:
            torch.set_num_threads(int(threads))
        out['train_layer'] = []
        for side in train_layer_sizes:
            res = attention_layer(
                train_presets,
                (side, side),
                ('fused', 'tiled'),
                layer_rounds,
                train=True,
                dtype=layer_dtype,
            )
            out['train_layer'].append(res)
            for row in res['rows']:
                print(
                    f'  [attention layer forward + backward, {res["tokens"]} tokens] '
                    f'{row["case"]}: {row["seconds"]:.3f} s, x dense {row["ratio"]:.3f}',
                    flush=True,
                )
    steady = dict(warmup=1, steps=frame_steps) if frame_steps else {}
    if 'frame' in want:
        out['frame'] = _run(
            cases(
                'frame',
                frame_size,
                [PEER, NOBIAS, *presets]
                + [f'{p}:{b}' for p in presets for b in frame_backends]
                + [p + PLAIN_MLP for p in plain_mlp_presets]
                + registered,
                **steady,
            ),
            rounds,
            timeout,
            f'frame {frame_size}',
        )
    if big_frame_size and 'big_frame' in want:
        out['big_frame'] = _run(
            cases('frame', big_frame_size, [PEER, *big_frame_presets]),
            1,
            timeout,
            f'frame {big_frame_size}',
        )
    if train_size and 'train' in want:
        size = (train_size, train_size)
        out['train'] = _run(
            cases(
                'train',
                size,
                [PEER, NOBIAS, *train_presets]
                + [f'{p}:{b}' for p in train_presets for b in train_backends]
                + registered,
                steps=train_steps,
            ),
            rounds,
            timeout,
            f'train {size}',
        )
    if segmenter_config and 'segmenter' in want:
        size = (train_size, train_size)
        out['segmenter'] = _run(
            cases(
                'segmenter', size, [PEER, 'lookhere'], steps=train_steps, config=segmenter_config
            ),
            rounds,
            timeout,
            f'segmenter train {size}',
        )
    return out
