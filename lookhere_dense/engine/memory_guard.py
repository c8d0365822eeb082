"""Refuse a forward pass that cannot fit in memory, before it allocates
(:func:`estimate_peak`, :func:`available_memory`, :func:`install_memory_guard`,
:class:`MemoryGuardHook`).

A whole 2048x4096 frame on a ViT-B is 32,769 tokens; with a dense-bias backend, a large
batch of training crops or a long schedule's validation on full frames, a pass can need
more memory than the machine has, and the kernel's OOM killer then ends the process
without a word (or the machine swaps for an hour). The guard estimates the peak before the
backbone runs and raises :class:`~lookhere_dense.errors.MemoryBudgetError` with the
estimate, the limit and the cheaper options (sliding windows, the largest frame that fits,
another attention backend, bfloat16) when the estimate exceeds the limit.

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
* a fixed ``FIXED_BYTES`` (allocator and kernel buffers, 6 MiB) and, for a segmentor,
  ``extra_per_pixel`` (e.g. the ``C x H x W`` class logits of a whole-frame prediction).

Measured against the estimate by ``tests/test_faults_cluster.py`` (a fresh process, within
25 %). Calibrated on CPU; on CUDA the same formula is used against the free device memory
(``torch.cuda.mem_get_info``), unmeasured there.

**The limit** (:func:`available_memory`): the user's budget (``max_memory``, e.g.
``--max-memory 8G``) if given, else the memory the process can still take: the smaller of
``MemAvailable`` (``/proc/meminfo``) and the cgroup's limit minus its usage (v2
``memory.max`` / ``memory.current``, v1 ``memory.limit_in_bytes`` / ``usage_in_bytes``).
A pass whose estimate is at or below the limit is never refused.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..errors import ConfigError, MemoryBudgetError

__all__ = [
    'estimate_peak',
    'available_memory',
    'parse_memory',
    'format_size',
    'check_memory',
    'install_memory_guard',
    'remove_memory_guard',
    'MemoryGuardHook',
    'ACT_INFER',
    'ACT_TRAIN_PER_LAYER',
    'CHUNKED_WORKSPACE',
    'FIXED_BYTES',
]

#: Inference activations per token, in units of ``embed_dims * itemsize`` (measured).
ACT_INFER = 14.0
#: Activations autograd keeps per token and layer, same units (measured).
ACT_TRAIN_PER_LAYER = 17.5
#: The ``chunked`` backend's bias block per token, same units.
CHUNKED_WORKSPACE = 5.0
#: Allocator and kernel buffers of a pass.
FIXED_BYTES = 6 * 2**20
#: Backends whose bias is dense (cached for every layer).
DENSE_BACKENDS = ('sdpa', 'reference')
_UNITS = {'': 1, 'b': 1, 'k': 2**10, 'm': 2**20, 'g': 2**30, 't': 2**40}


def format_size(n: float) -> str:
    """Bytes as ``'1.25 GiB'`` (from 1 GiB) or ``'90.0 MiB'``."""
    return f'{n / 2**30:.2f} GiB' if n >= 2**30 else f'{n / 2**20:.1f} MiB'


def parse_memory(text: Union[str, int, float]) -> int:
    """``'8G'``, ``'512M'``, ``'1.5GiB'``, ``'2000000000'`` (bytes) -> bytes.

    Raises:
        lookhere_dense.errors.ConfigError: not a positive size.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(r'\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(?:i?[bB])?\s*', str(text))
        if not m:
            raise ConfigError(
                f'--max-memory {text!r} is not a size: give e.g. 8G, 512M or 1.5GiB (bytes '
                'without a unit)'
            )
        value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not value > 0:
        raise ConfigError(f'--max-memory must be positive, got {text!r}')
    return int(value)


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
) -> Dict[str, int]:
    """The estimated rise of memory during one pass (see the module docstring).

    Args:
        tokens: tokens per image (patches + prefix tokens).
        embed_dims, num_layers, num_heads: the trunk's width, depth and heads.
        backend: the attention backend that runs (``'fused'``, ``'tiled'``,
            ``'chunked'``, ``'flex'``, ``'sdpa'``, ``'reference'``,
            ``'nobias'``).
        dtype: the activations' dtype. Default: float32.
        training: forward + backward with autograd (else inference). Default: False.
        batch: images per pass. Default: 1.
        trainable_params: parameters that get gradients and Adam moments (training).
            Default: 0.
        extra_bytes: anything else the pass allocates (e.g. class logits). Default: 0.

    Returns:
        The parts in bytes (``activations``, ``attention``, ``params``, ``fixed``,
        ``extra``) and their ``total``.
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
    )
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
        max_memory: the user's budget in bytes (wins when given). Default: None.

    Returns:
        ``(bytes or None when unknown, source)``.
    """
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
def _alternatives(info: Dict[str, Any], limit: int) -> List[str]:
    """Cheaper ways to run the refused pass, each with its estimate."""
    tips: List[str] = []
    est = lambda **kw: estimate_peak(**dict(info['args'], **kw))['total']  # noqa: E731
    crop = info.get('slide_tokens')
    if crop and not info['args']['training'] and crop < info['args']['tokens']:
        tips.append(
            "sliding windows of the training crop (--cfg-options model.test_cfg.mode='slide'"
            f'; ~{format_size(est(tokens=crop))} per window)'
        )
    for backend in ('fused', 'tiled', 'chunked'):
        if backend != info['args']['backend'] and est(backend=backend) <= limit:
            tips.append(
                f"attn_backend='{backend}' (--cfg-options model.backbone.attn_backend="
                f'{backend}; ~{format_size(est(backend=backend))})'
            )
            break
    scale = _largest_scale(est, info['args']['tokens'], limit)
    if scale:
        tips.append(f'a frame {scale:.2f}x as large per side (~{format_size(limit)} or less)')
    if info['args']['dtype'] == torch.float32:
        tips.append(f'bfloat16 activations (~{format_size(est(dtype=torch.bfloat16))})')
    if info['args']['training'] and info['args']['batch'] > 1:
        tips.append(f'batch size 1 (~{format_size(est(batch=1))})')
    return tips


def _largest_scale(est, tokens: int, limit: int) -> Optional[float]:
    """The largest side scale (< 1) of the frame whose estimate fits, by bisection."""
    lo, hi = 0.0, 1.0
    if est(tokens=max(1, int(tokens * 0.01))) > limit:
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        if est(tokens=max(1, int(tokens * mid * mid))) <= limit:
            lo = mid
        else:
            hi = mid
    return math.floor(lo * 100) / 100 or None


def check_memory(info: Dict[str, Any], limit: Optional[int], source: str, what: str) -> None:
    """Raise :class:`~lookhere_dense.errors.MemoryBudgetError` when the estimate of
    ``info['args']`` (:func:`estimate_peak`'s arguments) exceeds ``limit``.

    Args:
        info: ``args`` for :func:`estimate_peak`, optionally ``slide_tokens`` (tokens of
            one sliding window, for the advice).
        limit: bytes (None: unknown, nothing is refused).
        source: where the limit comes from (for the message).
        what: the pass, e.g. ``'whole-frame inference of 1x3x2048x4096'``.
    """
    if limit is None:
        return
    parts = estimate_peak(**info['args'])
    if parts['total'] <= limit:
        return
    a = info['args']
    detail = ', '.join(f'{k} {format_size(v)}' for k, v in parts.items() if k != 'total' and v)
    tips = _alternatives(info, limit)
    raise MemoryBudgetError(
        f'{what} refused before it allocates: its estimated peak is {format_size(parts["total"])} '
        f'({detail}; {a["tokens"]} tokens x {a["batch"]}, width {a["embed_dims"]}, depth '
        f'{a["num_layers"]}, backend {a["backend"]}, {str(a["dtype"]).replace("torch.", "")}'
        f') and {source} is {format_size(limit)}. '
        + ('Cheaper: ' + '; '.join(tips) + '. ' if tips else '')
        + 'A larger budget: --max-memory SIZE.'
    )


# ----------------------------------------------------------------------------------------
# on a model
# ----------------------------------------------------------------------------------------
_HANDLES = '_lookhere_memory_guard'


def _trunks(model: torch.nn.Module) -> List[torch.nn.Module]:
    from ..lookhere.vit import LookHereVisionTransformer

    return [m for m in model.modules() if isinstance(m, LookHereVisionTransformer)]


def _num_classes(model: torch.nn.Module) -> int:
    head = getattr(model, 'decode_head', None)
    return int(getattr(head, 'num_classes', 0) or getattr(head, 'out_channels', 0) or 0)


def _backend(trunk, tokens: int, device, dtype, training: bool) -> str:
    engine = getattr(trunk, 'lookhere', None)
    if engine is None:
        return 'nobias'
    return engine.choose_backend(tokens, device, dtype, training=training)


def _pass_info(trunk, x: torch.Tensor, num_classes: int, crop: Optional[int]) -> Dict[str, Any]:
    b, _, h, w = x.shape
    p = trunk.patch_size
    tokens = math.ceil(h / p) * math.ceil(w / p) + trunk.num_prefix_tokens
    training = trunk.training and torch.is_grad_enabled()
    autocast = torch.is_autocast_enabled(x.device.type)
    dtype = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
    if not dtype.is_floating_point:
        dtype = torch.float32
    params = sum(q.numel() for q in trunk.parameters() if q.requires_grad) if training else 0
    logits = 0 if training else 2 * b * num_classes * h * w * 4
    args = dict(
        tokens=tokens,
        embed_dims=trunk.embed_dims,
        num_layers=trunk.num_layers,
        num_heads=trunk.num_heads,
        backend=_backend(trunk, tokens, x.device, dtype, training),
        dtype=dtype,
        training=training,
        batch=b,
        trainable_params=params,
        extra_bytes=logits,
    )
    slide = crop and math.ceil(crop / p) ** 2 + trunk.num_prefix_tokens
    return dict(args=args, slide_tokens=slide)


def install_memory_guard(
    model: torch.nn.Module,
    max_memory: Optional[int] = None,
    crop: Optional[int] = None,
) -> int:
    """Check every forward of the model's LookHere trunks against the memory limit
    (:func:`available_memory`) before it runs; a pass whose estimate exceeds it raises
    :class:`~lookhere_dense.errors.MemoryBudgetError`. Idempotent (a second call replaces
    the first's settings).

    Args:
        model: a backbone, a segmentor or a detector (its LookHere trunks are found).
        max_memory: the budget in bytes. Default: None (what the machine has left).
        crop: the training crop side, for the sliding-window advice. Default: None.

    Returns:
        How many trunks are guarded.
    """
    remove_memory_guard(model)
    classes = _num_classes(model)
    trunks = _trunks(model)
    for trunk in trunks:

        def guard(module, args, _classes=classes):
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                return
            info = _pass_info(module, x, _classes, crop)
            limit, source = available_memory(x.device, max_memory)
            kind = 'training' if info['args']['training'] else 'inference'
            check_memory(info, limit, source, f'{kind} of a {tuple(x.shape)} input')

        setattr(trunk, _HANDLES, trunk.register_forward_pre_hook(guard))
    return len(trunks)


def remove_memory_guard(model: torch.nn.Module) -> None:
    """Undo :func:`install_memory_guard`."""
    for trunk in _trunks(model):
        handle = getattr(trunk, _HANDLES, None)
        if handle is not None:
            handle.remove()
            delattr(trunk, _HANDLES)


def _crop_of(cfg) -> Optional[int]:
    crop = (cfg.get('model') or {}).get('test_cfg', {}).get('crop_size') if cfg else None
    if isinstance(crop, (list, tuple)) and crop:
        return int(max(crop))
    return int(crop) if isinstance(crop, int) else None


@HOOKS.register_module()
class MemoryGuardHook(Hook):
    """:func:`install_memory_guard` on the Runner's model before training, validation
    and testing: every training step and every (whole-frame) validation or test pass is
    checked before it allocates.

    Args:
        max_memory: the budget (bytes, or a size such as ``'8G'``). Default: None (what
            the machine, or its cgroup, has left).
    """

    priority = 'VERY_HIGH'

    def __init__(self, max_memory: Union[None, int, str] = None):
        self.max_memory = None if max_memory is None else parse_memory(max_memory)

    def before_run(self, runner) -> None:
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        install_memory_guard(model, self.max_memory, _crop_of(runner.cfg))
