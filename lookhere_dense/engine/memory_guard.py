"""Refuse a forward pass that cannot fit in memory, before it allocates
(:func:`estimate_peak`, :func:`estimate_model_peak`, :func:`available_memory`,
:func:`install_memory_guard`, :class:`MemoryGuardHook`).

A whole 2048x4096 frame on a ViT-B is 32,769 tokens; with a dense-bias backend, a large
batch of training crops or a long schedule's validation on full frames, a pass can need
more memory than the machine has, and the kernel's OOM killer then ends the process
without a word (or the machine swaps for an hour). The guard estimates the peak before the
pass runs and raises :class:`~lookhere_dense.errors.MemoryBudgetError` with the estimate,
the limit and the cheaper options (sliding windows, the largest frame that fits, another
attention backend, bfloat16) when the estimate exceeds the limit.

**The estimate** (:func:`estimate_peak`) is the rise of memory during the pass above what
is allocated when it starts (model weights and the input are already there), from the
numbers the benchmarks measure (``PeakMemory``: the rise of the process's peak RSS;
``docs/performance.md``, ``docs/benchmark_cpu.json``). Per token of the ``d``-wide trunk,
in the activation dtype's bytes ``s``:

* inference: ``ACT_INFER * d * s`` (one block's activations at a time: residual, norm,
  ``qkv``, MLP hidden and its activation): 14, the middle of what CPU runs measured
  (11.9 for width 768 and 2,049 tokens, 15.2 for widths 192 / 384 and 4,097 tokens;
  fused / tiled backends);
* training: ``ACT_TRAIN_PER_LAYER * d * s`` per layer (what autograd keeps for the
  backward, measured 17.5) plus the inference term, plus gradients and two Adam moments
  for the parameters that train (``3 * params * 4`` bytes);
* the attention backend's workspace: ``fused`` / ``tiled`` / ``flex`` none
  beyond the above; ``chunked`` a bias block the size of the MLP hidden activation
  (``CHUNKED_WORKSPACE * d * s``, 5 per token: the benchmark's ViT-B whole frame,
  8,193 tokens, measured 514 MB against 485 MB estimated); ``sdpa`` / ``reference`` the
  cached dense bias of every layer (``layers * heads * T^2 * s``; the CPU flash kernel
  never builds the attention matrix); without LookHere (``nobias``) nothing;
* a fixed ``FIXED_BYTES`` (allocator and kernel buffers, 6 MiB);
* for a segmentor (mmseg), its ``C`` class logits (4 bytes each), checked per frame
  before ``inference`` allocates: the frame's logits (``4 C`` bytes per pixel) and the
  prediction at the original image's size (8-byte labels per pixel, and a resized copy of
  the logits where the sizes differ); sliding windows first hold the frame-sized sum of
  the windows' logits, the padded window added to it and the window count
  (``(2 C + 1) * 4`` bytes per frame pixel) and one window's logits, and the trunk sees
  one window. Measured with a ViT-T (19 classes, 1024x2048, CPU): sliding 96x96 windows
  320.5 MiB estimated, 317-333 MiB measured; whole, 258 MiB estimated, 208-251 MiB
  measured;
* for a detector (mmdet), its neck and heads, **measured** once per model, device and
  dtype by a calibration: the detector predicts two frames of the first frame's aspect,
  with short sides ``s/8`` and ``s/4`` (at least 128 and 256 px, at most the frame),
  under ``torch.profiler``'s memory events, with every module call other than the
  trunk's marked. The live tensor bytes of each stretch between two marks are fitted as
  a line in the pixels over the two frames, and the heads' estimate is the largest of
  those lines at the frame's pixels (the trunk's stretch, fitted the same way, raises
  the formula's trunk where it is larger). The score threshold is set to 0 during the
  calibration, so the heads are measured with the most detections the config keeps
  (``max_per_img``; the masks are pasted at the input's size): the worst case, not the
  typical image (a smaller frame in the advice keeps the heads at the frame's estimate:
  the masks are pasted at the original image's size). The trunk's peak and the heads'
  peak are added: glibc keeps most of the trunk's freed heap while the heads run (the
  tiny detector's trunk left 49 MiB resident of its 82 MiB peak), so in the process's
  memory they add up. Measured against a fresh process by ``tests/test_memory_guard.py``
  (Mask R-CNN shrunk to width 48, 1024x2048: on an AVX2 EPYC 284-298 MiB estimated and
  320-380 MiB measured, the rise 1.11-1.27x the estimate: the estimate counts live tensors,
  the process also holds what glibc's heap keeps of the trunk's and neck's freed blocks;
  the test accepts 0.75-1.40x; the ViT-B one by hand: 1.08 GiB estimated, 1051 MiB
  measured). Where the
  calibration cannot run (a training pass, a model that is neither an mmseg segmentor
  nor an mmdet detector, a profiler already running), a refusal says that its number
  covers the LookHere backbone only.

Measured against the estimate by ``tests/test_faults_cluster.py`` (a fresh process, within
25 %). Calibrated on CPU; on CUDA the same formula (and the same calibration, on the
device's memory events) is used against the free device memory
(``torch.cuda.mem_get_info``), unmeasured there.

**The limit** (:func:`available_memory`): the user's budget (``max_memory``, e.g.
``--max-memory 8G``) if given, else the memory the process can still take: the smaller of
``MemAvailable`` (``/proc/meminfo``) and the cgroup's limit minus its usage (v2
``memory.max`` / ``memory.current``, v1 ``memory.limit_in_bytes`` / ``usage_in_bytes``).
A pass whose estimate is at or below the limit is never refused; ``--max-memory off``
(:data:`NO_LIMIT`) refuses nothing.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import types
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..errors import ConfigError, MemoryBudgetError
from ..lookhere.attention.chooser import pass_conditions
from .ranks import unwrap_model

__all__ = [
    'estimate_peak',
    'estimate_model_peak',
    'check_frame_size',
    'available_memory',
    'parse_memory',
    'format_size',
    'check_memory',
    'unscaled_detection_sample',
    'install_memory_guard',
    'remove_memory_guard',
    'MemoryGuardHook',
    'ACT_INFER',
    'ACT_TRAIN_PER_LAYER',
    'CHUNKED_WORKSPACE',
    'FIXED_BYTES',
    'CALIBRATION_SIDE',
    'NO_LIMIT',
]

#: Inference activations per token, in units of ``embed_dims * itemsize`` (measured).
ACT_INFER = 14.0
#: Activations autograd keeps per token and layer, same units (measured).
ACT_TRAIN_PER_LAYER = 17.5
#: The ``chunked`` backend's bias block per token, same units.
CHUNKED_WORKSPACE = 5.0
#: Allocator and kernel buffers of a pass.
FIXED_BYTES = 6 * 2**20
#: The smallest short side (px) of a detector's larger calibration frame (the smaller one
#: is half of it; both are a quarter and an eighth of the frame's short side when larger).
CALIBRATION_SIDE = 256
#: What :func:`parse_memory` gives for ``--max-memory off``: no pass is refused.
NO_LIMIT = -1
#: Backends whose bias is dense (cached for every layer).
DENSE_BACKENDS = ('sdpa', 'reference')
_UNITS = {'': 1, 'b': 1, 'k': 2**10, 'm': 2**20, 'g': 2**30, 't': 2**40}
#: How a refusal names the parts of :func:`estimate_peak`.
_LABELS = {
    'trunk_excess': 'trunk above the formula (calibrated)',
    'heads': 'neck and heads (calibrated)',
}
_DEFAULT_SLIDE_HINT = "--cfg-options model.test_cfg.mode='slide'"


def format_size(n: float) -> str:
    """Bytes as ``'1.25 GiB'`` (from 1 GiB) or ``'90.0 MiB'``."""
    return f'{n / 2**30:.2f} GiB' if n >= 2**30 else f'{n / 2**20:.1f} MiB'


def parse_memory(text: Union[str, int, float]) -> int:
    """``'8G'``, ``'512M'``, ``'1.5GiB'``, ``'2000000000'`` (bytes) -> bytes; ``'off'``
    -> :data:`NO_LIMIT` (nothing is refused).

    Raises:
        lookhere_dense.errors.ConfigError: not a positive size, or a text without a unit
            below one MiB (``'100'``: a forgotten unit, not a budget of 100 bytes).
    """
    if isinstance(text, str) and text.strip().lower() in ('off', 'none') or text == NO_LIMIT:
        return NO_LIMIT  # (also NO_LIMIT itself, parsed again by MemoryGuardHook)
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(r'\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(i?[bB])?\s*', str(text))
        if not m:
            raise ConfigError(
                f'--max-memory {text!r} is not a size: give e.g. 8G, 512M or 1.5GiB (bytes '
                'without a unit), or off (no limit)'
            )
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
        if not (m.group(2) or m.group(3)) and 0 < value < 2**20:  # '100': not 100 bytes
            raise ConfigError(
                f'--max-memory {text!r} has no unit, so it is {int(value)} bytes, less than '
                f'one MiB: give the unit, e.g. {m.group(1)}M or {m.group(1)}G'
            )
    if not value > 0:
        raise ConfigError(f'--max-memory must be positive, got {text!r}')
    return int(value)


def _line_max(lines: Sequence[Tuple[float, float]], pixels: float) -> float:
    """The largest of the lines ``a + b * pixels`` (0 without lines, never below 0)."""
    return max([0.0] + [a + b * pixels for a, b in lines])


def estimate_peak(
    tokens: int,
    embed_dims: int,
    num_layers: int,
    num_heads: int,
    backend: str,
    dtype: torch.dtype = torch.float32,
    training: bool = False,
    batch: int = 1,
    trainable_params: int = 0,
    extra_bytes: int = 0,
    pixels: int = 0,
    logits_bytes: int = 0,
    calibration: Optional[Dict[str, Any]] = None,
    heads_pixels: Optional[int] = None,
) -> Dict[str, int]:
    """The estimated rise of memory during one pass (see the module docstring).

    Args:
        tokens: tokens per image the trunk sees (patches + prefix tokens; in sliding
            windows, one window's).
        embed_dims, num_layers, num_heads: the trunk's width, depth and heads.
        backend: the attention backend that runs (``'fused'``, ``'tiled'``,
            ``'chunked'``, ``'flex'``, ``'sdpa'``, ``'reference'``,
            ``'nobias'``).
        dtype: the activations' dtype. Default: float32.
        training: forward + backward with autograd (else inference). Default: False.
        batch: images per pass. Default: 1.
        trainable_params: parameters that get gradients and Adam moments (training).
            Default: 0.
        extra_bytes: anything else the pass allocates, fixed. Default: 0.
        pixels: pixels per image of the frame (what the calibration scales with).
            Default: 0.
        logits_bytes: a segmentor's logits per image, in bytes (see
            :func:`_logits_bytes`). Default: 0.
        calibration: a detector's measured lines (``heads`` and ``trunk``: lists of
            ``(bytes, bytes per pixel)``, at ``itemsize``; see the module docstring).
            Default: None.
        heads_pixels: the pixels the calibrated heads are evaluated at. Default: None
            (``pixels``; a smaller frame of the same image keeps the original's, as the
            detector pastes its masks at the original image's size).

    Returns:
        The parts in bytes (``activations``, ``attention``, ``params``, ``fixed``,
        ``extra``, ``logits``, ``trunk_excess``, ``heads``) and their ``total``.
    """
    size = torch.empty((), dtype=dtype).element_size()
    per_unit = batch * tokens * embed_dims * size
    act = ACT_INFER + (ACT_TRAIN_PER_LAYER * num_layers if training else 0.0)
    if backend in DENSE_BACKENDS:
        attention = num_layers * num_heads * tokens * tokens * size
    elif backend == 'chunked':
        attention = CHUNKED_WORKSPACE * per_unit
    else:
        attention = 0
    parts = dict(
        activations=int(act * per_unit),
        attention=int(attention),
        params=int(3 * 4 * trainable_params) if training else 0,
        fixed=FIXED_BYTES,
        extra=int(extra_bytes),
        logits=int(batch * logits_bytes),
        trunk_excess=0,
        heads=0,
    )
    if calibration:
        scale = size / calibration.get('itemsize', size)
        trunk = batch * scale * _line_max(calibration.get('trunk', ()), pixels)
        parts['trunk_excess'] = int(max(0, trunk - parts['activations'] - parts['attention']))
        at = pixels if heads_pixels is None else heads_pixels
        parts['heads'] = int(batch * _line_max(calibration.get('heads', ()), at))
    parts['total'] = sum(parts.values())
    return parts


# ----------------------------------------------------------------------------------------
# how much memory there is
# ----------------------------------------------------------------------------------------
def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo_available() -> Optional[int]:
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> Optional[Tuple[int, str]]:
    """The cgroup's limit minus its usage (v2, else v1), or None without a limit."""
    for limit_file, usage_file in (
        ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory.current'),
        (
            '/sys/fs/cgroup/memory/memory.limit_in_bytes',
            '/sys/fs/cgroup/memory/memory.usage_in_bytes',
        ),
    ):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < 2**60:
            return max(
                0, limit - usage
            ), f'cgroup limit {format_size(limit)} ({limit_file}) - usage'
    return None


def available_memory(
    device: Union[str, torch.device] = 'cpu', max_memory: Optional[int] = None
) -> Tuple[Optional[int], str]:
    """The limit a pass's estimate is checked against, and where it comes from.

    Args:
        device: where the pass runs. Default: ``'cpu'``.
        max_memory: the user's budget in bytes (wins when given; :data:`NO_LIMIT`: none).
            Default: None.

    Returns:
        ``(bytes or None when unknown or switched off, source)``.
    """
    if max_memory == NO_LIMIT:
        return None, 'no limit (--max-memory off)'
    if max_memory is not None:
        return int(max_memory), 'the --max-memory budget'
    if torch.device(device).type == 'cuda':
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free), f'free memory of {device}'
    found: List[Tuple[int, str]] = []
    avail = _meminfo_available()
    if avail is not None:
        found.append((avail, 'MemAvailable (/proc/meminfo)'))
    room = _cgroup_room()
    if room is not None:
        found.append(room)
    if not found:
        return None, 'unknown'
    return min(found)


# ----------------------------------------------------------------------------------------
# the check
# ----------------------------------------------------------------------------------------
def _pair(crop) -> Optional[Tuple[int, int]]:
    """A window ``(H, W)`` from an int, a pair or None."""
    if isinstance(crop, (list, tuple)) and len(crop) == 2:
        return int(crop[0]), int(crop[1])
    if isinstance(crop, (list, tuple)) and crop:
        return int(max(crop)), int(max(crop))
    return (int(crop), int(crop)) if isinstance(crop, int) and crop > 0 else None


def _logits_bytes(info: Dict[str, Any], h: int, w: int, mode: str) -> int:
    """A segmentor's logits per image on a frame of ``h x w`` px (measured on mmseg 1.2):
    the frame's ``C`` logits (4 bytes each) and the prediction at the original image's
    size (``ori``: its int64 labels, and a resized copy of the logits where the sizes
    differ); sliding windows first hold the frame-sized sum of the windows' logits, the
    padded window added to it and the window count, ``(2 C + 1) * 4`` bytes per pixel,
    plus one window's logits."""
    classes = info['classes']
    if info['training'] or not classes:
        return 0
    _, fh, fw = info['frame']
    oh, ow = info.get('ori') or (fh, fw)
    ph, pw = (info.get('padding') or (0, 0)) if (h, w) == (fh, fw) else (0, 0)
    resized = (oh, ow) != (h - ph, w - pw)
    post = classes * 4 * h * w + oh * ow * (8 + (classes * 4 if resized else 0))
    if mode != 'slide':
        return post
    ch, cw = min(info['crop'][0], h), min(info['crop'][1], w)
    return max((2 * classes + 1) * 4 * h * w, post) + 2 * classes * 4 * ch * cw


def _frame_args(info: Dict[str, Any], h: int, w: int, mode: str) -> Dict[str, Any]:
    """:func:`estimate_peak`'s arguments for a frame of ``h x w`` px (per image) run
    ``'whole'`` or in ``'slide'`` windows, the rest (the original image's size among it)
    as in ``info``."""
    b, training = info['frame'][0], info['training']
    th, tw = (min(info['crop'][0], h), min(info['crop'][1], w)) if mode == 'slide' else (h, w)
    args = _trunk_args(info['trunk'], b, th, tw, info['device'], info['dtype'], training)
    args.update(
        pixels=h * w,
        logits_bytes=_logits_bytes(info, h, w, mode),
        calibration=info.get('calibration'),
        heads_pixels=info['frame'][1] * info['frame'][2],
    )
    return args


def _alternatives(info: Dict[str, Any], limit: int) -> List[str]:
    """Cheaper ways to run the refused pass, each with its estimate."""
    tips: List[str] = []
    a = info['args']
    est = lambda **kw: estimate_peak(**dict(a, **kw))['total']  # noqa: E731
    total = est()
    crop, frame = info.get('crop'), info.get('frame')
    if (
        info.get('trunk') is not None
        and info.get('mode', 'whole') == 'whole'
        and crop
        and not a['training']
        and (crop[0] < frame[1] or crop[1] < frame[2])
    ):
        slide = estimate_peak(**_frame_args(info, frame[1], frame[2], 'slide'))['total']
        if slide < total:  # with many classes the frame's logits dominate: no help then
            tips.append(
                f'sliding windows of {crop[0]}x{crop[1]} '
                f'({info.get("slide_hint") or _DEFAULT_SLIDE_HINT}; ~{format_size(slide)} '
                "for the pass, the frame's logits included)"
            )
    for backend in ('fused', 'tiled', 'chunked'):
        if backend != a['backend'] and _runs_here(info, backend) and est(backend=backend) <= limit:
            tips.append(
                f"attn_backend='{backend}' (--cfg-options model.backbone.attn_backend="
                f'{backend}; ~{format_size(est(backend=backend))})'
            )
            break
    scaled = _largest_scale(info, limit)
    if scaled:
        scale, fits = scaled
        side = ''
        if frame and len(frame) == 3:
            side = f'{int(frame[1] * scale)}x{int(frame[2] * scale)}, '
        tips.append(f'a frame {scale:.2f}x as large per side ({side}~{format_size(fits)})')

    def size(n: int) -> str:  # an option that helps without fitting says so
        return f'~{format_size(n)}' + ('' if n <= limit else ', still above the budget')

    ori, classes = info.get('ori'), info.get('classes')
    if ori and classes and not a['training'] and frame and tuple(ori) != tuple(frame[1:]):
        at_ori = ori[0] * ori[1] * (8 + 4 * classes)  # resized logits and labels
        if at_ori > limit // 2:
            tips.append(
                f"a smaller image file: the prediction is returned at the image's own size "
                f'({ori[0]}x{ori[1]}), whose {classes} class scores alone take '
                f'~{format_size(at_ori)} whatever size the model sees'
            )
    if a['dtype'] == torch.float32:
        tips.append(f'bfloat16 activations (--amp; {size(est(dtype=torch.bfloat16))})')
    if a['training'] and a['batch'] > 1:
        tips.append(f'batch size 1 (train_dataloader.batch_size=1; {size(est(batch=1))})')
    return tips


def _largest_scale(info: Dict[str, Any], limit: int) -> Optional[Tuple[float, int]]:
    """The largest side scale (< 1, two decimals) of the frame whose estimate fits, and
    that estimate: the trunk's tokens and a segmentor's logits at the frame follow it (a
    sliding window's trunk, the prediction at the original image's size and a detector's
    heads, whose masks are pasted at that size, do not)."""
    if info.get('trunk') is None:  # an info without its trunk: scale tokens and pixels
        a = info['args']

        def estimate(s: float) -> int:
            kw = dict(
                tokens=max(1, int(a['tokens'] * s * s)), pixels=int(a.get('pixels', 0) * s * s)
            )
            return estimate_peak(**dict(a, **kw))['total']

    else:
        _, h, w = info['frame']
        p = int(getattr(info['trunk'], 'patch_size', 1) or 1)

        def estimate(s: float) -> int:
            # at the size the offered frame reaches the model: padded to whole patches (a
            # test pipeline's size_divisor / the backbone pad it; else the user passing the
            # offered size is refused again, and offered a size one pixel smaller)
            hs, ws = (-(-max(1, int(side * s)) // p) * p for side in (h, w))
            return estimate_peak(**_frame_args(info, hs, ws, info.get('mode', 'whole')))['total']

    if estimate(0.01) > limit:
        return None
    lo, hi = 0.01, 1.0
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if estimate(mid) <= limit else (lo, mid)
    scale = math.floor(lo * 100) / 100
    while scale >= 0.01:  # the patch grid rounds up: confirm the two-decimal scale fits
        fits = estimate(scale)
        if fits <= limit:
            return scale, fits
        scale = round(scale - 0.01, 2)
    return None


def check_memory(info: Dict[str, Any], limit: Optional[int], source: str, what: str) -> None:
    """Raise :class:`~lookhere_dense.errors.MemoryBudgetError` when the estimate of
    ``info['args']`` (:func:`estimate_peak`'s arguments) exceeds ``limit``.

    Args:
        info: what :func:`_pass_info` returns (``args`` at least; the frame, window and
            trunk for the cheaper options; ``note`` for what the estimate covers).
        limit: bytes (None: unknown, nothing is refused).
        source: where the limit comes from (for the message).
        what: the pass, e.g. ``'inference of a (1, 3, 2048, 4096) input'``.
    """
    if limit is None:
        return
    parts = estimate_peak(**info['args'])
    if parts['total'] <= limit:
        return
    a = info['args']
    detail = ', '.join(
        f'{_LABELS.get(k, k)} {format_size(v)}' for k, v in parts.items() if k != 'total' and v
    )
    tips = _alternatives(info, limit)
    peak = (
        'the estimated peak of its LookHere backbone alone is'
        if info.get('trunk_only')
        else 'its estimated peak is'
    )
    window = ' per window' if info.get('mode') == 'slide' else ''
    note = f'; {info["note"]}' if info.get('note') else ''
    raise MemoryBudgetError(
        f'{what} refused before it allocates: {peak} {format_size(parts["total"])} '
        f'({detail}; {a["tokens"]} tokens x {a["batch"]}{window}, width {a["embed_dims"]}, '
        f'depth {a["num_layers"]}, backend {a["backend"]}, '
        f'{str(a["dtype"]).replace("torch.", "")}{note}) and {source} is {format_size(limit)}. '
        + ('Cheaper: ' + '; '.join(tips) + '. ' if tips else '')
        + 'A larger budget: --max-memory SIZE.',
        estimate=parts['total'],
        limit=limit,
        source=source,
    )


# ----------------------------------------------------------------------------------------
# on a model
# ----------------------------------------------------------------------------------------
_HANDLES = '_lookhere_memory_guard'
_STATE = '_lookhere_memory_guard_state'
_CALIBRATION = '_lookhere_memory_calibration'
_MARK = 'lookhere_memory_guard:'
_TRUNK = '@trunk'


def _trunks(model: torch.nn.Module) -> List[torch.nn.Module]:
    from ..lookhere.vit import LookHereVisionTransformer

    return [m for m in model.modules() if isinstance(m, LookHereVisionTransformer)]


def _num_classes(model: torch.nn.Module) -> int:
    """The channels of a segmentor's logits (0 for anything else)."""
    head = getattr(model, 'decode_head', None)
    return int(getattr(head, 'out_channels', 0) or getattr(head, 'num_classes', 0) or 0)


def _segmentor(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    """``model`` if it is an mmseg encoder-decoder (whole / slide inference)."""
    names = ('decode_head', 'inference', 'slide_inference', 'test_cfg')
    return model if all(hasattr(model, n) for n in names) else None


def _detector(model: torch.nn.Module) -> Optional[torch.nn.Module]:
    """``model`` if it is an mmdet detector (mmdet is not imported for anything else)."""
    base = sys.modules.get('mmdet.models.detectors.base')
    return model if base is not None and isinstance(model, base.BaseDetector) else None


def _backend(trunk, tokens: int, device, dtype, training: bool) -> str:
    engine = getattr(trunk, 'lookhere', None)
    if engine is None:
        return 'nobias'
    dropout, slope_grads = pass_conditions(trunk, training)
    return engine.choose_backend(tokens, device, dtype, dropout, slope_grads, training=training)


def _runs_here(info: Dict[str, Any], backend: str) -> bool:
    """Whether the refused pass's trunk could run ``backend`` (named by the user, as the
    advice would have it): not without a LookHere engine, not one its ``can_run`` refuses
    (fused on CUDA or where it is not built, fused / tiled with attention dropout)."""
    from ..lookhere.attention import REGISTRY

    trunk, a = info.get('trunk'), info['args']
    engine = getattr(trunk, 'lookhere', None)
    if engine is None or backend not in REGISTRY:
        return False
    request = engine.request(
        a['tokens'],
        info['device'],
        a['dtype'],
        *pass_conditions(trunk, a['training']),
        training=a['training'],
        auto=False,
    )
    return REGISTRY[backend].can_run(request) is None


def _dtype_of(x: torch.Tensor) -> torch.dtype:
    """The activations' dtype: the autocast's around the call, else the input's."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype if x.dtype.is_floating_point else torch.float32


def _trunk_args(trunk, b: int, h: int, w: int, device, dtype, training: bool) -> Dict[str, Any]:
    p = trunk.patch_size
    tokens = math.ceil(h / p) * math.ceil(w / p) + trunk.num_prefix_tokens
    params = sum(q.numel() for q in trunk.parameters() if q.requires_grad) if training else 0
    return dict(
        tokens=tokens,
        embed_dims=trunk.embed_dims,
        num_layers=trunk.num_layers,
        num_heads=trunk.num_heads,
        backend=_backend(trunk, tokens, device, dtype, training),
        dtype=dtype,
        training=training,
        batch=b,
        trainable_params=params,
    )


def _pass_info(
    trunk,
    x: torch.Tensor,
    num_classes: int,
    crop,
    mode: str = 'whole',
    calibration: Optional[Dict[str, Any]] = None,
    note: Optional[str] = None,
    slide_hint: Optional[str] = None,
    ori: Optional[Tuple[int, int]] = None,
    padding: Optional[Tuple[int, int]] = None,
) -> Dict[str, Any]:
    """What :func:`check_memory` needs about one pass of ``trunk``'s model on the frame
    ``x`` (``(B, 3, H, W)``): ``args`` for :func:`estimate_peak` and what the cheaper
    options are computed from.

    Args:
        num_classes: the segmentor's logit channels (0: no logits).
        crop: the sliding window (``(H, W)`` or a side): the pass's own in ``'slide'``
            mode, else the one the advice offers (None: no sliding-window advice).
        mode: ``'whole'`` (the trunk sees ``x``) or ``'slide'``. Default: ``'whole'``.
        calibration: a detector's measured heads (see :func:`estimate_peak`).
        note: what the estimate covers, for the message.
        slide_hint: how the tool switches to sliding windows, for the message.
        ori: the original image's ``(H, W)``, where a segmentor's prediction is resized
            to. Default: None (the frame's).
        padding: rows and columns of padding in ``x`` (removed before that resize).
            Default: None.
    """
    b, _, h, w = x.shape
    crop = _pair(crop)
    info = dict(
        trunk=trunk,
        frame=(b, h, w),
        mode=mode if crop else 'whole',
        crop=crop,
        classes=num_classes,
        device=x.device,
        dtype=_dtype_of(x),
        training=trunk.training and torch.is_grad_enabled(),
        calibration=calibration,
        note=note,
        slide_hint=slide_hint,
        ori=ori,
        padding=padding,
    )
    info['args'] = _frame_args(info, h, w, info['mode'])
    return info


# ---- a detector's neck and heads, measured -----------------------------------------------
def _round32(v: float) -> int:
    return max(32, int(math.ceil(v / 32)) * 32)


def _calibration_sizes(h: int, w: int) -> List[Tuple[int, int]]:
    """The warm-up frame and the two calibration frames (aspect kept, multiples of 32):
    short sides 64, ``s/8`` and ``s/4`` (at least 128 / ``CALIBRATION_SIDE`` px, at
    most the frame's short side ``s``)."""
    short = min(h, w)
    big = min(short, max(CALIBRATION_SIDE, short / 4))
    return [(_round32(h * s / short), _round32(w * s / short)) for s in (64, big / 2, big)]


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (kineto prints its start / stop lines there)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _mark(name: str) -> None:
    with torch.profiler.record_function(_MARK + name):
        pass


def _stretch_peaks(fn, device: torch.device) -> Dict[str, int]:
    """Run ``fn`` under ``torch.profiler``'s memory events: the peak of the live tensor
    bytes (from the start) in each stretch that a mark (:func:`_mark`) opens, by mark."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == 'cuda'
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=acts, profile_memory=True)
    with _quiet_stderr():
        prof.start()
    try:
        fn()
        if cuda:
            torch.cuda.synchronize(device)
    finally:
        with _quiet_stderr():
            prof.stop()
            raw = list(prof.profiler.kineto_results.events())
    kind = torch._C._autograd.DeviceType.CUDA if cuda else torch._C._autograd.DeviceType.CPU
    events = []
    for e in raw:
        name = e.name()
        if name == '[memory]' and e.device_type() == kind:
            events.append((e.start_ns(), 1, e.nbytes()))
        elif name.startswith(_MARK):
            events.append((e.start_ns(), 0, name[len(_MARK) :]))
    events.sort(key=lambda ev: (ev[0], ev[1]))
    live, key, peaks = 0, '^', {'^': 0}
    for _, is_memory, value in events:
        if is_memory:
            live += value
            peaks[key] = max(peaks[key], live)
        else:
            key = value
            peaks[key] = max(peaks.get(key, 0), live)
    return peaks


def _lookup(peaks: Dict[str, int], key: str) -> Optional[int]:
    """A stretch's peak, else its module's parent's (a call one frame did not make)."""
    while key not in peaks:
        if '.' not in key:
            return None
        key = key.rsplit('.', 1)[0]
    return peaks[key]


def _fit(p1: int, a: Dict[str, int], p2: int, b: Dict[str, int]):
    """Lines ``(bytes, bytes per pixel)`` through each stretch's two peaks (a peak that
    shrinks with the frame: flat at its larger value), the trunk's and the others'."""
    trunk, heads = [], []
    for key in set(a) | set(b):
        va, vb = _lookup(a, key), _lookup(b, key)
        va, vb = (vb, vb) if va is None else (va, va) if vb is None else (va, vb)
        if va is None:
            continue
        slope = max(0.0, (vb - va) / (p2 - p1)) if p2 > p1 else 0.0
        line = (float(vb - slope * p2), slope) if slope else (float(max(va, vb)), 0.0)
        (trunk if key == '>' + _TRUNK else heads).append(line)
    # keep the upper envelope only: a line below another at 0 px and in slope never wins
    heads = [
        line
        for line in heads
        if not any(o != line and o[0] >= line[0] and o[1] >= line[1] for o in heads)
    ]
    return trunk, sorted(set(heads))


@contextlib.contextmanager
def _most_detections(model: torch.nn.Module) -> Iterator[int]:
    """Score threshold 0 in every ``test_cfg`` that has one, so a pass keeps the most
    detections its config allows; yields that number (``max_per_img``)."""
    saved, most = [], 0
    for m in model.modules():
        cfg = getattr(m, 'test_cfg', None)
        if isinstance(cfg, dict) and 'score_thr' in cfg:
            saved.append((cfg, cfg['score_thr']))
            cfg['score_thr'] = 0.0
            most = max(most, int(cfg.get('max_per_img', 0) or 0))
    try:
        yield most
    finally:
        for cfg, value in reversed(saved):
            cfg['score_thr'] = value


def unscaled_detection_sample(h: int, w: int):
    """An mmdet ``DetDataSample`` for an ``h x w`` frame taken as it is: image, original,
    padded and batch shapes all ``(h, w)``, scale factor 1 (what ``model.predict`` needs
    to run a frame that no pipeline resized). Needs mmdet."""
    from mmdet.structures import DetDataSample

    meta = dict(
        img_shape=(h, w),
        ori_shape=(h, w),
        scale_factor=(1.0, 1.0),
        batch_input_shape=(h, w),
        pad_shape=(h, w),
    )
    return DetDataSample(metainfo=meta)


def _calibrate_detector(det: torch.nn.Module, trunk, x: torch.Tensor) -> Dict[str, Any]:
    """Measure ``det``'s neck and heads (see the module docstring) on two frames of
    ``x``'s aspect; returns the lines for :func:`estimate_peak` and a note."""
    warm, small, large = _calibration_sizes(*x.shape[-2:])
    trunk_ids = {id(m) for m in trunk.modules()}
    handles = []
    for name, m in det.named_modules():
        if m is det or id(m) in trunk_ids:
            continue
        handles.append(m.register_forward_pre_hook(lambda mod, args, n=name: _mark('>' + n)))
        handles.append(m.register_forward_hook(lambda mod, args, out, n=name: _mark('<' + n)))
    handles.append(trunk.register_forward_pre_hook(lambda mod, args: _mark('>' + _TRUNK)))
    handles.append(trunk.register_forward_hook(lambda mod, args, out: _mark('<' + _TRUNK)))
    gen = torch.Generator(device=x.device).manual_seed(0)

    def predict(h: int, w: int):
        inputs = torch.randn((1, 3, h, w), generator=gen, device=x.device, dtype=x.dtype)
        samples = [unscaled_detection_sample(h, w)]
        return lambda: det.predict(inputs, samples)

    try:
        with torch.no_grad(), _most_detections(det) as most:
            predict(*warm)()  # one-time buffers and kernels: not the pass's
            peaks = [(h * w, _stretch_peaks(predict(h, w), x.device)) for h, w in (small, large)]
    finally:
        for handle in handles:
            handle.remove()
    (p1, a), (p2, b) = peaks
    trunk_lines, head_lines = _fit(p1, a, p2, b)
    name = type(det).__name__
    return dict(
        heads=head_lines,
        trunk=trunk_lines,
        itemsize=torch.empty((), dtype=_dtype_of(x)).element_size(),
        note=(
            f"{name}'s neck and heads measured at {small[0]}x{small[1]} and "
            f'{large[0]}x{large[1]} px with up to {most} detections and scaled with the pixels'
        ),
    )


# ---- the guard -----------------------------------------------------------------------------
class _Guard:
    """What the hooks of one :func:`install_memory_guard` share."""

    def __init__(self, root, max_memory, crop, slide_hint):
        self.root = root
        self.max_memory = max_memory
        self.crop = _pair(crop)
        self.slide_hint = slide_hint
        self.segmentor = _segmentor(root)
        self.detector = _detector(root)
        self.classes = _num_classes(root) if self.segmentor is not None else 0
        self.busy = 0  # inside a checked frame or a calibration: the trunks' hooks stand by
        self.previous_inference = None
        trunk_ids = {id(p) for t in _trunks(root) for p in t.parameters()}
        self.more_than_trunks = any(id(p) not in trunk_ids for p in root.parameters())

    def calibration(self, trunk, x: torch.Tensor) -> Dict[str, Any]:
        """The detector's measured heads for ``x``'s device and dtype (measured once)."""
        cache = self.root.__dict__.setdefault(_CALIBRATION, {})
        key = (x.device.type, str(_dtype_of(x)))
        if key not in cache:
            self.busy += 1
            try:
                cache[key] = _calibrate_detector(self.detector, trunk, x)
            except Exception as err:  # noqa: BLE001 - reported in the refusal, and logged
                from mmengine.logging import print_log

                reason = f'{type(err).__name__}: {err}'.splitlines()[0][:200]
                cache[key] = dict(error=reason)
                print_log(
                    f'memory guard: could not measure the neck and heads of '
                    f'{type(self.root).__name__} ({reason}); its estimates cover the '
                    'LookHere backbone only',
                    logger='current',
                    level=30,
                )
            finally:
                self.busy -= 1
        return cache[key]

    def trunk_info(self, trunk, x: torch.Tensor) -> Dict[str, Any]:
        """A pass as the trunk sees it (training, detectors, a bare trunk)."""
        training = trunk.training and torch.is_grad_enabled()
        calibration, note, trunk_only = None, None, False
        if self.segmentor is None and self.more_than_trunks:
            name = type(self.root).__name__
            cal = None
            if self.detector is not None and not training:
                cal = self.calibration(trunk, x)
            if cal and 'error' not in cal:
                calibration, note = cal, cal['note']
            else:
                trunk_only = True
                what = 'neck, heads and losses' if training else 'neck and heads'
                why = f' (not measured: {cal["error"]})' if cal else ''
                note = (
                    f"the LookHere backbone only: {name}'s {what} are not counted{why}, "
                    'so the pass needs more'
                )
        info = _pass_info(
            trunk, x, self.classes, self.crop, 'whole', calibration, note, self.slide_hint
        )
        info['trunk_only'] = trunk_only
        return info

    def frame_info(self, inputs: torch.Tensor, metas=None) -> Dict[str, Any]:
        """A segmentor's inference on the frame ``inputs``, whole or in sliding windows
        (``metas``: mmseg's ``batch_img_metas``, for the original image's size)."""
        seg = self.segmentor
        trunk = seg.backbone if seg.backbone in _trunks(seg) else _trunks(seg)[0]
        tc = seg.test_cfg or {}
        mode = 'slide' if tc.get('mode', 'whole') == 'slide' else 'whole'
        crop = tc.get('crop_size') if mode == 'slide' else self.crop or tc.get('crop_size')
        ori = padding = None
        meta = metas[0] if isinstance(metas, (list, tuple)) and metas else None
        if isinstance(meta, dict) and meta.get('ori_shape') is not None:
            ori = tuple(int(v) for v in meta['ori_shape'][:2])
            left, right, top, bottom = meta.get('padding_size') or (0, 0, 0, 0)
            padding = (int(top) + int(bottom), int(left) + int(right))
        return _pass_info(
            trunk, inputs, self.classes, crop, mode, None, None, self.slide_hint, ori, padding
        )

    def check_frame(self, inputs: torch.Tensor, metas=None) -> None:
        """:func:`check_memory` on a segmentor's inference of the frame ``inputs`` (its
        shape, device and dtype are what count), against the limit on its device."""
        limit, source = available_memory(inputs.device, self.max_memory)
        if limit is None:
            return
        info = self.frame_info(inputs, metas)
        what = f'inference of a {tuple(inputs.shape)} input'
        if info['mode'] == 'slide':
            what += f' in sliding {info["crop"][0]}x{info["crop"][1]} windows'
        check_memory(info, limit, source, what)

    def check_trunk(self, module, args) -> None:
        x = args[0] if args else None
        if self.busy or not isinstance(x, torch.Tensor) or x.dim() != 4:
            return
        limit, source = available_memory(x.device, self.max_memory)
        if limit is None:
            return
        info = self.trunk_info(module, x)
        kind = 'training' if info['training'] else 'inference'
        check_memory(info, limit, source, f'{kind} of a {tuple(x.shape)} input')

    def wrap_inference(self) -> None:
        """Check a segmentor's frame before ``inference`` allocates (sliding windows
        allocate the frame's logits before the first window): a method bound to the
        segmentor, so a deep copy of the model (EMA) checks and runs the copy."""
        seg = self.segmentor
        self.previous_inference = seg.__dict__.get('inference')
        seg.inference = types.MethodType(_guarded_inference, seg)

    def unwrap_inference(self) -> None:
        seg = self.segmentor
        if self.previous_inference is None:
            seg.__dict__.pop('inference', None)
        else:
            seg.inference = self.previous_inference


def _guarded_inference(seg, inputs, *args, **kwargs):
    """A guarded segmentor's ``inference``: :func:`check_memory` on the frame, then the
    segmentor's own ``inference``."""
    guard = seg.__dict__.get(_STATE)
    previous = guard.previous_inference if guard is not None else None
    run = previous or types.MethodType(type(seg).inference, seg)
    if guard is None:
        return run(inputs, *args, **kwargs)
    if not guard.busy and isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
        guard.check_frame(inputs, args[0] if args else kwargs.get('batch_img_metas'))
    guard.busy += 1
    try:
        return run(inputs, *args, **kwargs)
    finally:
        guard.busy -= 1


def install_memory_guard(
    model: torch.nn.Module,
    max_memory: Optional[int] = None,
    crop=None,
    slide_hint: Optional[str] = None,
) -> int:
    """Check every forward of the model against the memory limit
    (:func:`available_memory`) before it allocates; a pass whose estimate exceeds it
    raises :class:`~lookhere_dense.errors.MemoryBudgetError`. An mmseg segmentor's
    inference is checked per frame (whole, or sliding windows with the frame's logits),
    an mmdet detector's inference with its measured neck and heads, anything else at its
    LookHere trunks. Idempotent (a second call replaces the first's settings).

    Args:
        model: a backbone, a segmentor or a detector (its LookHere trunks are found).
        max_memory: the budget in bytes. Default: None (what the machine has left).
        crop: the sliding window (``(H, W)`` or a side) the advice offers for a whole-frame
            pass. Default: None (the segmentor's ``test_cfg.crop_size``, if any).
        slide_hint: how the tool switches to sliding windows (e.g. ``'--slide'``).
            Default: None (``--cfg-options model.test_cfg.mode='slide'``).

    Returns:
        How many trunks are guarded.
    """
    remove_memory_guard(model)
    trunks = _trunks(model)
    guard = _Guard(model, max_memory, crop, slide_hint)
    for trunk in trunks:
        setattr(trunk, _HANDLES, trunk.register_forward_pre_hook(guard.check_trunk))
    if trunks and guard.segmentor is not None:
        guard.wrap_inference()
    model.__dict__[_STATE] = guard
    return len(trunks)


def remove_memory_guard(model: torch.nn.Module) -> None:
    """Undo :func:`install_memory_guard`."""
    for trunk in _trunks(model):
        handle = getattr(trunk, _HANDLES, None)
        if handle is not None:
            handle.remove()
            delattr(trunk, _HANDLES)
    guard = model.__dict__.pop(_STATE, None)
    if guard is not None and guard.segmentor is not None and _trunks(model):
        guard.unwrap_inference()


def check_frame_size(
    model: torch.nn.Module, size: Tuple[int, int], ori_shape: Optional[Tuple[int, int]] = None
) -> None:
    """Refuse a segmentor's inference of an ``H x W`` frame before the image is resized to
    it: the check :func:`install_memory_guard` makes when the frame reaches ``inference``,
    made from the size alone (a tool that resizes images, e.g. ``tools/infer.py --size``,
    would otherwise hold the resized frame and its float copies before the guard sees it:
    a 16384x32768 frame is 6 GiB as float32 pixels alone). Does nothing without an
    installed guard, or for a model that is not a segmentor.

    Args:
        model: the guarded segmentor.
        size: ``(H, W)`` of the frame the pipeline will give.
        ori_shape: the original image's ``(H, W)`` (the prediction is resized to it).
            Default: None (``size``).

    Raises:
        MemoryBudgetError: as the guard's check would.
    """
    guard = model.__dict__.get(_STATE)
    if guard is None or guard.segmentor is None or guard.busy:
        return
    h, w = (int(v) for v in size)
    device = next(model.parameters()).device
    frame = torch.zeros((), device=device).expand(1, 3, h, w)  # the shape, no memory
    training = model.training  # e.g. before mmengine's test loop calls eval()
    model.eval()
    try:
        with torch.no_grad():  # as the inference it stands for
            guard.check_frame(frame, [dict(ori_shape=tuple(ori_shape or (h, w)))])
    finally:
        model.train(training)


def estimate_model_peak(model: torch.nn.Module, inputs: torch.Tensor, crop=None) -> Dict[str, int]:
    """What the guard estimates for ``model``'s pass on ``inputs`` (``(B, 3, H, W)``, as
    the model's ``predict`` / ``inference`` gets it), in the current mode, grad and
    autocast state: :func:`estimate_peak`'s parts and ``total``. A detector's neck and
    heads are measured here if they were not yet (see the module docstring).

    Args:
        crop: as :func:`install_memory_guard` (for a guard not installed). Default: None.
    """
    guard = model.__dict__.get(_STATE) or _Guard(model, None, crop, None)
    if guard.segmentor is not None:
        info = guard.frame_info(inputs)
    else:
        info = guard.trunk_info(_trunks(model)[0], inputs)
    return estimate_peak(**info['args'])


def _crop_of(cfg) -> Optional[Tuple[int, int]]:
    """The sliding window a config's model would use: ``model.test_cfg.crop_size``, else
    the training crop (``model.data_preprocessor.size``)."""
    model = (cfg.get('model') or {}) if cfg else {}
    crop = (model.get('test_cfg') or {}).get('crop_size') or (
        model.get('data_preprocessor') or {}
    ).get('size')
    return _pair(crop)


def _loop_autocast(loop) -> Any:
    """The autocast a validation / test loop runs its passes in (outside ``run_iter``,
    where a hook runs, it is off): this project's ``AmpTestLoop`` (``dtype``,
    ``device_type``), mmengine's ``fp16=True`` loops; else none."""
    dtype, device_type = getattr(loop, 'dtype', None), getattr(loop, 'device_type', None)
    if isinstance(dtype, torch.dtype) and device_type:
        return torch.autocast(device_type, dtype=dtype)
    if getattr(loop, 'fp16', False):
        from mmengine.runner.amp import autocast

        return autocast(enabled=True)
    return contextlib.nullcontext()


@HOOKS.register_module()
class MemoryGuardHook(Hook):
    """:func:`install_memory_guard` on the Runner's model before training, validation
    and testing: every training step and every validation or test pass (a segmentor's
    whole frame or sliding windows, a detector with its neck and heads) is checked before
    it allocates. A segmentor's test and validation sets are checked once more before the
    first image loads: their largest frame, from the image files' headers and the
    pipeline's resize (:func:`~lookhere_dense.data.checks.largest_frame`), so a frame over
    the budget is refused before it is resized into memory.

    Args:
        max_memory: the budget (bytes, or a size such as ``'8G'``). Default: None (what
            the machine, or its cgroup, has left).
    """

    priority = 'VERY_HIGH'

    def __init__(self, max_memory: Union[None, int, str] = None):
        self.max_memory = None if max_memory is None else parse_memory(max_memory)
        self._checked: set = set()

    def before_run(self, runner) -> None:
        install_memory_guard(unwrap_model(runner.model), self.max_memory, _crop_of(runner.cfg))

    def _check_largest_frame(self, runner, loop, key: str) -> None:
        """A segmentor's largest test frame, checked from the image files' headers before
        the first image is loaded and resized (the guard's own check comes when a frame
        reaches the model: a refused 8192x16384 frame would be in memory, with its copies,
        by then). Once per dataset."""
        from ..data.checks import largest_frame

        dataset = getattr(getattr(loop, 'dataloader', None), 'dataset', None)
        if dataset is None or id(dataset) in self._checked:
            return
        self._checked.add(id(dataset))
        dataset_cfg = (runner.cfg.get(key) or {}).get('dataset') or {}
        frame = largest_frame(dataset, dataset_cfg.get('pipeline') or [])
        if frame is None:
            return
        with _loop_autocast(loop):  # the loop's mixed precision, as its passes run in it
            check_frame_size(unwrap_model(runner.model), *frame)

    def before_test(self, runner) -> None:
        self._check_largest_frame(runner, runner.test_loop, 'test_dataloader')

    def before_val(self, runner) -> None:
        self._check_largest_frame(runner, runner.val_loop, 'val_dataloader')
