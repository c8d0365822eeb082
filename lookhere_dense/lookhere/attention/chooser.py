"""The registry of LookHere attention backends and the one chooser of ``attn_backend='auto'``.

``auto`` asks the backends in :data:`AUTO_ORDER` (fastest first, where each is fastest)
and takes the first whose ``can_run`` answers None:

==============  ===========================================================================
``fused``       CPU, a compiled kernel, from ``FUSED_MIN_TOKENS`` (400) tokens on
``tiled``       CPU from ``TILED_MIN_TOKENS`` (1024) tokens on (where ``fused`` is not)
``sdpa``        while every layer's dense bias fits ``max_dense_mb``
``flex``        CUDA, where the dense biases do not fit
``chunked``     everywhere, with everything (attention dropout, slope gradients)
==============  ===========================================================================

``reference`` (the tests' ground truth) and ``triton`` (a CUDA forward not yet timed on a
GPU, :mod:`.flash_triton`) are registered but never chosen by ``auto``. The
CPU kernels refuse attention dropout, and ``tiled`` learnable slopes while they train
(``fused``'s backward gives the table its gradient); the reasons are each backend's own
``can_run`` (:mod:`.common`). :func:`explain` lists, for one
request, every backend asked and why it was skipped; :func:`explain_backend` prints that
for each layer of a model at an image size.
"""

from __future__ import annotations

import operator
import re
from types import ModuleType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from . import chunked, flash_triton, flex, fused, reference, sdpa, tiled
from .common import AttentionRequest
from .windows import effective_window

__all__ = [
    'BACKENDS',
    'REGISTRY',
    'AUTO_ORDER',
    'RETIRED',
    'choose',
    'explain',
    'explain_backend',
    'pass_conditions',
    'backend_summary',
    'inside_window',
]

#: every registered backend module by name
REGISTRY: Dict[str, ModuleType] = {
    m.NAME: m for m in (reference, sdpa, chunked, tiled, fused, flex, flash_triton)
}

#: the order ``auto`` asks the backends in (the first that can run is used)
AUTO_ORDER: Tuple[str, ...] = ('fused', 'tiled', 'sdpa', 'flex', 'chunked')

#: Values of the engine's ``backend`` (and the backbone's ``attn_backend``).
BACKENDS: Tuple[str, ...] = ('auto', *REGISTRY)

#: backends that were removed, and the one that runs in their place (a config or a
#: checkpoint that names them keeps working, with a warning): ``buffered`` (CPU flash
#: calls with the dense bias rebuilt per call) won nowhere that mattered against
#: ``tiled`` / ``fused`` (docs/attention.md, "Retired: buffered")
RETIRED: Dict[str, str] = {'buffered': 'tiled'}

#: why ``auto`` passes over a backend that raised in this model (the engine records it in
#: ``failed`` when a ``FALLIBLE`` backend ``auto`` chose raises, and warns)
FAILED = 'failed earlier in this model (see the warning)'


def explain(
    request: AttentionRequest, skip: Optional[Mapping[str, str]] = None
) -> List[Tuple[str, Optional[str]]]:
    """``[(backend, reason it cannot run or None)]`` in :data:`AUTO_ORDER`, up to and
    including the first that can run (the one ``auto`` picks). ``skip``: backends passed
    over whatever the request, with the reason given (e.g. the engine's ``UNTRACEABLE``
    under ``torch.jit.trace``). Default: None. A backend in ``request.failed`` (it raised
    in this model) is passed over here, with :data:`FAILED`: no backend checks that
    itself."""
    out = []
    for name in AUTO_ORDER:
        reason = (
            (skip or {}).get(name)
            or (FAILED if name in request.failed else None)
            or REGISTRY[name].can_run(request)
        )
        out.append((name, reason))
        if reason is None:
            break
    return out


def choose(request: AttentionRequest) -> str:
    """The backend ``auto`` picks for ``request``: the first of :data:`AUTO_ORDER` whose
    ``can_run`` answers None (``chunked`` always can)."""
    return explain(request)[-1][0]


def _layers(model: Any) -> List[Tuple[int, int, float]]:
    """``[(layer index, window size, attention dropout)]`` of the model's blocks (window
    size 0: global)."""
    out = []
    for i, blk in enumerate(getattr(model, 'blocks', None) or ()):
        drop = float(getattr(getattr(blk, 'attn', None), 'attn_drop', 0.0) or 0.0)
        out.append((i, int(getattr(blk, 'window_size', 0) or 0), drop))
    return out


def pass_conditions(model: Any, training: bool) -> Tuple[float, bool]:
    """``(attention dropout, slope gradients)`` a pass of ``model`` asks the backends for:
    the largest attention dropout of its blocks and whether learnable LookHere slopes need
    gradients -- both only in a training pass (fused and tiled run neither)."""
    if not training:
        return 0.0, False
    dropout = max((drop for _, _, drop in _layers(model)), default=0.0)
    slopes = getattr(getattr(model, 'pos_enc', None), 'slopes', None)
    slope_grads = slopes is not None and any(p.requires_grad for p in slopes.parameters())
    return dropout, bool(slope_grads)


def inside_window(pos_enc: Any) -> str:
    """What runs inside each window of a ViTDet window block with ``pos_enc``: windows are
    a layer transform (:func:`~.windows.attend_in_windows` partitions the tokens, one
    batched SDPA call attends in every window), not a backend of the registry."""
    if hasattr(pos_enc, 'choose_backend'):  # LEDiT
        return "sdpa per window, causal in the window's raster order; pos_encoding ledit"
    if hasattr(getattr(pos_enc, 'engine', None), 'window_attention'):
        return 'sdpa per window, the dense bias of one window'
    name = getattr(pos_enc, 'name', type(pos_enc).__name__)
    return f'sdpa per window; pos_encoding {name}: no LookHere bias'


def explain_backend(
    model: Any,
    image_size: Union[int, Sequence[int]],
    batch: Optional[int] = 1,
    dtype: Optional[torch.dtype] = None,
    device: Optional[Union[str, torch.device]] = None,
    training: Optional[bool] = None,
    print_fn: Any = print,
) -> List[str]:
    """Which attention backend each layer of ``model`` runs at ``image_size``, and why the
    faster ones were skipped; printed with ``print_fn`` (None: not printed) and returned.

    Args:
        model: a ``LookHereVisionTransformer`` (or the mmseg / mmdet backbone around one,
            or a model with one as ``.backbone``).
        image_size: ``H`` or ``(H, W)`` of the input in pixels (an image tensor: its last
            two dimensions).
        batch: images per call (reported only: the choice does not depend on it); None:
            not reported. Default: 1.
        dtype: the compute dtype; None: the autocast's where this is called under
            ``torch.autocast`` of the device, else the model's parameters'. Default: None.
        device: None: the model's. Default: None.
        training: autograd records; None: ``model.training``. Default: None.
        print_fn: where each line goes. Default: ``print``.

    Returns:
        One line per layer (``layer 3: fused``, ``layer 4 (window 14): windows (sdpa per
        window)``), after a header line.
    """
    vit = model
    # mmseg / mmdet models, our wrappers, timm's features_only wrapper, mmseg's
    # TIMMBackbone, nested (a segmentor's TIMMBackbone's features wrapper)
    for _ in range(4):
        if hasattr(vit, 'pos_enc'):
            break
        attrs = ('backbone', 'vit', 'trunk', 'model', 'timm_model')
        inner = next(
            (getattr(vit, a) for a in attrs if hasattr(getattr(vit, a, None), 'modules')), None
        )
        if inner is None:
            break
        vit = inner
    if not hasattr(vit, 'pos_enc'):
        raise ValueError(f'explain_backend: {type(model).__name__} has no LookHere ViT (pos_enc)')
    if isinstance(image_size, torch.Tensor):  # an image batch given where a size goes
        image_size = tuple(image_size.shape[-2:])
    try:
        size = tuple(image_size)  # (H, W), a list, a numpy array
    except TypeError:
        size = (image_size,) * 2  # H
    try:  # ints, numpy ints; not bools or floats
        size = tuple(operator.index(s) for s in size if not isinstance(s, bool))
    except TypeError:
        size = ()
    if len(size) != 2 or not all(s > 0 for s in size):
        raise ValueError(
            f'explain_backend: image_size must be H or (H, W) in pixels (positive ints), '
            f'got {image_size!r}'
        )
    patch = int(getattr(vit, 'patch_size', 16))
    grid = tuple(-(-int(s) // patch) for s in size)
    prefix = int(getattr(vit, 'num_prefix_tokens', 0))
    tokens = grid[0] * grid[1] + prefix
    param = next(iter(vit.parameters()), None)
    device = (
        torch.device(device)
        if device is not None
        else (param.device if param is not None else torch.device('cpu'))
    )
    if dtype is None and torch.is_autocast_enabled(device.type):
        dtype = torch.get_autocast_dtype(device.type)  # called under torch.autocast
    dtype = dtype or (param.dtype if param is not None else torch.float32)
    training = vit.training if training is None else bool(training)
    engine = getattr(vit.pos_enc, 'engine', None)
    _, slope_grads = pass_conditions(vit, training)
    lines = [
        f'attention backends at {size[0]}x{size[1]} (grid {grid[0]}x{grid[1]}, {tokens} tokens, '
        + ('' if batch is None else f'batch {batch}, ')
        + f'{str(dtype).replace("torch.", "")}, {device}, '
        f'{"training" if training else "inference"}):'
    ]
    for layer, window, dropout in _layers(vit):
        dropout = dropout if training else 0.0
        lh_config = getattr(vit.pos_enc, 'lh_config', None)
        cut = effective_window(grid, window, lh_config) if window else 0
        head = f'layer {layer}' + (
            f' (window {cut}' + (f', cut from {window}: the grid' if cut != window else '') + ')'
            if window
            else ''
        )
        if window:
            lines.append(f'{head}: windows ({inside_window(vit.pos_enc)})')
        elif hasattr(vit.pos_enc, 'choose_backend'):  # LEDiT: causal attention
            lines.append(f'{head}: causal ({vit.pos_enc.choose_backend()}; pos_encoding ledit)')
        elif engine is None or not hasattr(engine, 'explain'):
            name = getattr(vit.pos_enc, 'name', type(vit.pos_enc).__name__)
            lines.append(f'{head}: sdpa (pos_encoding {name}: no LookHere bias)')
        else:
            steps = engine.explain(tokens, device, dtype, dropout, slope_grads, training)
            chosen, refused = steps[-1]
            skipped = '; '.join(f'{n}: {r}' for n, r in steps[:-1] if r is not None)
            why = (
                f'skipped {skipped}'
                if skipped
                else f'attn_backend={engine.backend!r}'
                + (f', which cannot run here: {refused}' if refused else '')
                if engine.backend != 'auto'
                else "the first of auto's order that runs here"
            )
            lines.append(f'{head}: {chosen} ({why})')
    if print_fn is not None:
        for line in lines:
            print_fn(line)
    return lines


def backend_summary(
    model: Any,
    image_size: Union[int, Sequence[int]],
    training: Optional[bool] = None,
    dtype: Optional[torch.dtype] = None,
    batch: Optional[int] = 1,
) -> Optional[str]:
    """:func:`explain_backend` in one log line (``attention at 512x512 (1025 tokens,
    batch 1, float32, cpu, training): fused x 12``), or None for a model without a LookHere
    ViT (``model.module`` of a ``DistributedDataParallel`` is looked into). ``dtype``: the
    compute dtype (an autocast's); None: the parameters'. Default: None. ``batch``: images
    per call, None: not reported. Default: 1. Where ``fused`` runs in bfloat16 the line
    also names its products (:func:`~.fused.bf16_products`: ``brgemm``, ``vdpbf16ps`` or
    ``float32``)."""
    model = getattr(model, 'module', model)
    try:
        lines = explain_backend(
            model, image_size, batch, training=training, dtype=dtype, print_fn=None
        )
    except ValueError:
        return None
    counts: Dict[str, int] = {}
    for line in lines[1:]:
        chosen = line.split(': ', 1)[1].split(' (', 1)[0]
        counts[chosen] = counts.get(chosen, 0) + 1
    # another position encoding (rope2d, abs, none, ...): no LookHere bias in any layer
    other = re.search(r'\(pos_encoding (\S+): no LookHere bias\)', ' '.join(lines[1:]))
    label = f'attention (pos_encoding {other.group(1)}) at' if other else 'LookHere attention at'
    head = lines[0].rstrip(':').replace('attention backends at', label)
    uses = ', '.join(f'{name} x {n}' for name, n in counts.items())
    if 'fused' in counts and ', bfloat16, ' in head:
        uses += f' (bf16 products: {fused.bf16_products()})'
    return f'{head}: {uses} (lookhere_dense.lookhere.explain_backend(model, size) says why)'
