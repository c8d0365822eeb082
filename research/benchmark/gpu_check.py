"""The one prepared GPU run behind ``tools/gpu_check.sh``, and its CPU simulation.

``python3 -m research.benchmark.gpu_check [--simulate-cpu] [--out PATH]``
runs four sections in order, each under its own time budget (:data:`BUDGET_S`):

``env``          torch / CUDA / timm / Triton / C compiler, dynamo's recompile settings, and
                 one tiny compiled flex call (the probe: no Triton or no compiler shows
                 here, once, and the flex cases are then recorded as skipped).
``correctness``  compiled flex against the reference backend (float32 math on the same
                 inputs) in bfloat16, float16 and float32, fixed and learnable slopes:
                 forward, and the gradients of ``q, k, v`` (and of the slopes where
                 learnable) at the tolerances of :data:`TOLERANCES`; in bfloat16 and
                 float16 also the forward's rounding bound (:func:`roundings`: the score
                 and the softmax kept in float32).
``attn``         attention alone at each token count: a correctness check first (sampled
                 query rows against float32 rows of the dense bias), then warm-up and
                 interleaved timed rounds (medians) of flex (block mask), flex computing
                 every tile, SDPA without bias (flash) and SDPA with the dense bias, and
                 the ``triton`` backend's forward (checked on the same rows first),
                 forward and forward + backward, peak memory per case; after the first
                 size, ``parts``: where flex's time goes (the flex kernel alone, with our
                 tiles, the block mask, the table ``score_mod``, a bias from coordinates
                 instead, the token reorder: :func:`attn_parts_case`).
``peer``         timm's ViT-B against our trunk without bias and with lh180 / lh90 / lh45
                 through ``triton`` (frames) and flex: whole frames and train steps, each
                 case in its own process
                 (:func:`~.fresh.run_child`) with warm-up steps and timed steps.

Every case is appended to the JSON file and the file rewritten (atomically) at once, so a
kill at any moment leaves valid JSON with everything finished so far; every case prints
one progress line with the elapsed time. A dynamo recompile-limit hit (flex silently run
eagerly) makes the case fail and is never timed as flex. ``--simulate-cpu`` runs the same
sections, cases, compile calls (``torch.compile(backend='aot_eager')``: dynamo's tracing,
guards and recompile accounting without code generation), checks and JSON layout at tiny
sizes on CPU. Torch (+ timm for the peer rows) only: nothing here imports OpenMMLab.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from lookhere_dense.lookhere import LookHereAttentionEngine, resolve_lh_config
from lookhere_dense.lookhere.attention.common import flex_function
from lookhere_dense.lookhere.flex import (
    FLEX_INDEX_PAD,
    flex_attention_lookhere,
    flex_available,
    flex_kernel_options,
    flex_score_mod,
    flex_slope_grads_available,
    raise_recompile_limit,
)
from lookhere_dense.lookhere.slopes import LookHereSlopes

from . import DTYPES
from .attention import grid_for
from .fresh import run_child
from .timing import interleaved, paired_ratio

__all__ = [
    'SECTIONS',
    'BUDGET_S',
    'TOLERANCES',
    'Plan',
    'cuda_plan',
    'simulate_plan',
    'relative_error',
    'within',
    'roundings',
    'Recorder',
    'RecompileWatch',
    'correctness_case',
    'attn_case',
    'ATTN_PARTS',
    'ATTN_PART_STEPS',
    'coords_score_mod',
    'attn_part_variants',
    'check_parts',
    'attn_parts_case',
    'FLEX_KERNEL_MARKERS',
    'inductor_cache_dir',
    'save_kernel_sources',
    'peer_cases',
    'goals',
    'run',
    'main',
]

#: the sections, in the order they run
SECTIONS = ('env', 'correctness', 'attn', 'peer')
#: seconds per section on the GPU (whole run 360 s = 6 min; the estimate is in
#: tools/gpu_check.sh's header); a case that would start with too little left is skipped
BUDGET_S: Dict[str, float] = {'env': 20, 'correctness': 70, 'attn': 110, 'peer': 200}
#: per dtype: the largest ``max|got - ref| / max|ref|`` allowed for the forward output and
#: for each gradient (flex in ``dtype`` vs the float32 reference on the same rounded inputs);
#: in the reduced dtypes also ``roundings``, the largest :func:`roundings` of the forward:
#: flex keeps the modified score and the softmax in float32 and rounds the probabilities
#: before ``P V`` and the output, 2 roundings (measured on CPU 1.2-1.7,
#: tests/test_flex_precision.py, which bounds it at 2.5; a score_mod adding the bias in the
#: low dtype gave 6.8-14 there); 4 leaves room for the GPU kernel's float32 arithmetic (not
#: measured on a GPU)
TOLERANCES: Dict[str, Dict[str, float]] = {
    'float32': {'forward': 2e-3, 'grad': 5e-3},
    'bfloat16': {'forward': 3e-2, 'grad': 6e-2, 'roundings': 4.0},
    'float16': {'forward': 5e-3, 'grad': 1e-2, 'roundings': 4.0},
}
#: what a case's ``status`` can be
OK, FAILED, SKIPPED = 'ok', 'failed', 'skipped'
#: the largest dense bias SDPA is timed with: its memory-efficient CUDA kernel computes bias
#: offsets in 32 bits (pytorch/pytorch#187227, #150054, #147585: wrong rows or an illegal
#: memory access, which would end every later case of this process), so 12 heads stop
#: below 13.4k tokens (8k timed, 16k and 32k not)
DENSE_BIAS_MAX_ELEMENTS = 2**31
HEADS, HEAD_DIM = 12, 64


@dataclasses.dataclass
class Plan:
    """What one run does (:func:`cuda_plan`, :func:`simulate_plan`)."""

    device: str
    compile_backend: str
    correctness_grid: Tuple[int, int]
    attn_tokens: Tuple[int, ...]
    attn_dtype: str
    model_dtype: str
    frame: Tuple[int, int]
    big_frame: Tuple[int, int]
    train_sizes: Tuple[int, ...]
    presets: Tuple[str, ...]
    train_backend: str
    warmup: int
    rounds: int
    budgets: Dict[str, float]
    child_timeout: float
    check_rows: int
    max_dense_gib: float
    #: seconds a case is expected to need at least, per section (below that: skipped)
    min_case_s: Dict[str, float]
    #: reset dynamo before every flex case (each compiles once per shape). Default: True
    reset: bool = True
    #: set dynamo's recompile limit to exactly this after the probe (None: flex's raised
    #: limit). Default: None
    recompile_limit: Optional[int] = None
    #: the sections to run (``env`` always runs). Default: all
    sections: Tuple[str, ...] = SECTIONS
    #: the peer ViT's ``embed_dims`` / ``num_layers`` / ``num_heads`` where not ViT-B (timm's
    #: and ours alike). Default: ViT-B
    peer_arch: Optional[Dict[str, int]] = None
    #: the token count of the ``attn parts`` case (:func:`attn_parts_case`: where flex's
    #: time goes), run before the sizes of ``attn_tokens``; None: not run. Default: None
    attn_parts_tokens: Optional[int] = None


def cuda_plan() -> Plan:
    """The GPU run: bfloat16, 1k-32k attention tokens, ViT-B frames of 1024x2048 and
    2048x4096, train steps at 512 and 1024."""
    return Plan(
        device='cuda',
        compile_backend='inductor',
        correctness_grid=(24, 40),
        # the sizes the goals are about first (a budget stop costs the last ones)
        attn_tokens=(8192, 16384, 32768, 4096, 1024),
        attn_dtype='bfloat16',
        model_dtype='bfloat16',
        frame=(1024, 2048),
        big_frame=(2048, 4096),
        train_sizes=(512, 1024),
        presets=('lh180', 'lh90', 'lh45'),
        train_backend='flex',
        warmup=2,
        rounds=5,
        budgets=dict(BUDGET_S),
        child_timeout=120,
        check_rows=256,
        max_dense_gib=32.0,
        min_case_s={'env': 1, 'correctness': 8, 'attn': 20, 'peer': 15},
        attn_parts_tokens=8192,
    )


def simulate_plan() -> Plan:
    """The CPU simulation: the same control flow at tiny sizes, float32 models two layers
    deep and 192 wide (12 heads), flex compiled with ``aot_eager``; train rows through
    ``auto`` (flex has no CPU backward)."""
    return Plan(
        device='cpu',
        compile_backend='aot_eager',
        correctness_grid=(6, 10),
        attn_tokens=(64, 256),
        attn_dtype='bfloat16',
        model_dtype='float32',
        frame=(64, 128),
        big_frame=(128, 128),
        train_sizes=(64, 96),
        presets=('lh180', 'lh90', 'lh45'),
        train_backend='auto',
        warmup=1,
        rounds=3,
        budgets={k: 10 * v for k, v in BUDGET_S.items()},
        child_timeout=120,
        check_rows=32,
        max_dense_gib=1.0,
        min_case_s={'env': 0, 'correctness': 0, 'attn': 0, 'peer': 0},
        peer_arch=dict(embed_dims=192, num_layers=2, num_heads=12),
        attn_parts_tokens=256,
    )


# ---------------------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------------------
def relative_error(got: Tensor, ref: Tensor) -> float:
    """``max|got - ref| / max|ref|`` in float32 (inf where ``got`` is not finite)."""
    got, ref = got.detach().float(), ref.detach().float()
    if not bool(torch.isfinite(got).all()):
        return math.inf
    scale = ref.abs().max().item() or 1.0
    return (got - ref).abs().max().item() / scale


def within(got: Tensor, ref: Tensor, tol: float) -> Dict[str, Any]:
    """``{'rel_err', 'tol', 'ok'}`` of :func:`relative_error` against ``tol``."""
    err = relative_error(got, ref)
    return dict(rel_err=err, tol=tol, ok=err <= tol)


def roundings(got: Tensor, ref: Tensor, size: Tensor) -> float:
    """``max |got - ref| / (u * size)`` elementwise (inf where ``got`` is not finite):
    the error of an attention output ``got`` in a reduced dtype in units of that dtype's
    unit roundoff ``u`` (2^-8 bfloat16, 2^-11 float16) times ``size``, the reference's
    attention of ``|v|`` (``P |V|``, the size of the terms summed). Rounding the
    probabilities before ``P V`` costs at most 1, rounding the output at most 1 more."""
    unit = torch.finfo(got.dtype).eps / 2
    got, ref, size = got.detach().float(), ref.detach().float(), size.detach().float()
    if not bool(torch.isfinite(got).all()):
        return math.inf
    return ((got - ref).abs() / (unit * size).clamp_min(1e-30)).max().item()


# ---------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------
class Recorder:
    """The results dict, rewritten to ``path`` after every case (write to a temporary file,
    then rename: a kill never leaves half a file), and the progress lines.

    Args:
        path: the JSON file.
        data: the results so far (``sections`` is filled in here).
    """

    def __init__(self, path: Path, data: Dict[str, Any]):
        self.path = Path(path)
        self.data = data
        self.t0 = time.monotonic()
        data.setdefault('sections', {})
        self.write()

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.t0

    def say(self, text: str) -> None:
        """One progress line, prefixed by the elapsed time."""
        print(f'[{self.elapsed():6.1f} s] {text}', flush=True)

    def section(self, name: str, budget: float) -> Dict[str, Any]:
        """Start section ``name`` (its entry, with ``budget_s`` and an empty ``cases``)."""
        entry = dict(budget_s=budget, cases=[], started_s=self.elapsed())
        self.data['sections'][name] = entry
        self.write()
        return entry

    def add(self, section: str, case: Dict[str, Any]) -> Dict[str, Any]:
        """Append ``case`` to ``section``, rewrite the file, print its progress line."""
        case.setdefault('elapsed_s', self.elapsed())
        if _SIGNALLED and case['status'] == FAILED:
            # the failure may be the interrupt itself, wrapped by the code it landed in
            case['error'] = f'interrupted by signal {_SIGNALLED[0]}: {case.get("error")}'
        self.data['sections'][section]['cases'].append(case)
        self.write()
        note = case.get('summary') or case.get('reason') or case.get('error') or ''
        self.say(f'{section:<11} {case["name"]}: {case["status"].upper()} {note}'.rstrip())
        if _SIGNALLED:
            raise KeyboardInterrupt(f'signal {_SIGNALLED[0]}')
        return case

    def write(self) -> None:
        """Rewrite the JSON file (atomically)."""
        self.data['elapsed_s'] = self.elapsed()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + '.tmp')
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + '\n')
        os.replace(tmp, self.path)


class RecompileWatch(logging.Handler):
    """Collects dynamo's "hit config.recompile_limit" warnings (every torch since 2.0 logs
    one when it gives up compiling a function and runs it eagerly from then on)."""

    LOGGER = 'torch._dynamo'

    def __init__(self):
        super().__init__(logging.WARNING)
        self.hits: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the first line of a recompile-limit warning."""
        msg = record.getMessage()
        if 'hit config.' in msg:
            self.hits.append(msg.splitlines()[0])

    def __enter__(self) -> 'RecompileWatch':
        logger = logging.getLogger(self.LOGGER)
        logger.addHandler(self)
        if logger.level == logging.NOTSET or logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger(self.LOGGER).removeHandler(self)


def strict_compile() -> Dict[str, Any]:
    """Make a recompile-limit hit raise where torch can (``fail_on_recompile_limit_hit``,
    torch >= 2.6) and raise the limit for flex; returns what was set."""
    import torch._dynamo.config as dynamo_config

    out = dict(recompile_limit=raise_recompile_limit())
    if hasattr(dynamo_config, 'fail_on_recompile_limit_hit'):
        dynamo_config.fail_on_recompile_limit_hit = True
        out['fail_on_recompile_limit_hit'] = True
    else:
        out['fail_on_recompile_limit_hit'] = 'not in this torch (the log watch still sees hits)'
    return out


# ---------------------------------------------------------------------------------------
# section env
# ---------------------------------------------------------------------------------------
def _version(module: str) -> Optional[str]:
    """``module.__version__``, or None where it does not import."""
    try:
        mod = __import__(module)
    except Exception:
        return None
    return str(getattr(mod, '__version__', 'unknown'))


def _safe(fn: Callable[[], Any]) -> Any:
    """``fn()``, or ``'error: <type>: <message>'`` where it raises (a fact must never stop
    the run: e.g. reading a TF32 flag that a newer torch deprecates)."""
    try:
        return fn()
    except Exception as err:
        return f'error: {_error(err)}'


def _error(err: BaseException, limit: int = 500) -> str:
    """``'<type>: <first lines of the message>'`` of ``err`` on one line."""
    msg = ' '.join(str(err).strip().splitlines()[:3])[:limit]
    return f'{type(err).__name__}: {msg}'


def _traceback() -> str:
    """The end of the traceback being handled (the JSON keeps what stdout may lose)."""
    return traceback.format_exc()[-3000:]


def _compiler() -> Optional[str]:
    """The C compiler Triton would use (``$CC``, then cc / gcc / clang), or None."""
    for name in (os.environ.get('CC'), 'cc', 'gcc', 'clang'):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _tiny_flex(plan: Plan) -> None:
    """One compiled flex call on a 4x4 grid (the probe of section ``env``)."""
    eng = LookHereAttentionEngine(resolve_lh_config('lh90'), 1, HEADS, 'flex')
    grid, dev = (4, 4), torch.device(plan.device)
    q = torch.randn(1, HEADS, 17, 16, device=dev, dtype=DTYPES[plan.attn_dtype])
    with torch.no_grad():
        _flex_call(eng, plan, q, q, q, grid, 1)


def env_section(plan: Plan, rec: Recorder, budget: 'Budget') -> Optional[str]:
    """Facts and the flex probe; returns why flex cannot run here (None: it can)."""
    cuda = torch.cuda.is_available()
    facts = dict(
        name='versions',
        status=OK,
        python=platform.python_version(),
        executable=sys.executable,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        device_name=_safe(
            lambda: torch.cuda.get_device_name(0) if cuda else platform.processor() or 'cpu'
        ),
        capability=_safe(lambda: list(torch.cuda.get_device_capability(0)) if cuda else None),
        timm=_version('timm'),
        triton=_version('triton'),
        c_compiler=_compiler(),
        flex_available=flex_available(),
        tf32_matmul=_safe(lambda: torch.backends.cuda.matmul.allow_tf32),
        dynamo=_safe(strict_compile),
    )
    facts['summary'] = (
        f'torch {facts["torch"]}, CUDA {facts["cuda"]}, {facts["device_name"]}, timm '
        f'{facts["timm"]}, triton {facts["triton"]}, cc {facts["c_compiler"]}'
    )
    rec.add('env', facts)
    problem = None
    if not flex_available():
        problem = f'no torch.nn.attention.flex_attention in torch {torch.__version__}'
    elif plan.device == 'cuda' and facts['triton'] is None:
        problem = 'no Triton: compiled flex cannot run (pip install triton)'
    elif plan.device == 'cuda' and facts['c_compiler'] is None:
        problem = 'no C compiler (cc / gcc / clang, or $CC): Triton cannot build its launcher'
    probe = dict(name='flex compile probe', backend=plan.compile_backend)
    if problem:
        rec.add('env', dict(probe, status=FAILED, error=problem))
        return problem
    t0 = time.perf_counter()
    try:
        _tiny_flex(plan)
    except Exception as err:  # the probe's whole point: record why compiled flex fails
        problem = f'compiled flex failed: {_error(err, 400)}'
        rec.add('env', dict(probe, status=FAILED, error=problem, traceback=_traceback()))
        return problem
    seconds = time.perf_counter() - t0
    rec.add('env', dict(probe, status=OK, seconds=seconds, summary=f'compiled in {seconds:.1f} s'))
    return None


# ---------------------------------------------------------------------------------------
# flex and the reference
# ---------------------------------------------------------------------------------------
def _flex_call(
    eng: LookHereAttentionEngine,
    plan: Plan,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid: Tuple[int, int],
    cls: int,
    slopes: Optional[LookHereSlopes] = None,
    masked: bool = True,
) -> Tensor:
    """Compiled flex of layer 0 (block mask, tile order), as the engine runs it, with
    ``plan.compile_backend``; ``slopes``: learnable slopes (a fresh table, as in training);
    ``masked=False``: no block mask (every tile computed)."""
    dev = q.device
    order = eng.flex_order(grid, cls, dev)
    mask = eng.block_mask(0, grid, cls, dev) if masked else None
    if slopes is None:
        gb = eng.grid_bias(grid, dev)
        mod = eng.score_mod(0, grid, cls, dev)
    else:
        gb = eng.slope_bias(0, grid, dev, torch.float32, slopes)
        mod = flex_score_mod(gb, 0, cls, order)
    return flex_attention_lookhere(
        q, k, v, gb, 0, cls, mask, True, mod, order, compile_backend=plan.compile_backend
    )


def _inputs(
    n: int, dev: torch.device, dtype: torch.dtype, seed: int = 0, scale: float = 1.0
) -> List[Tensor]:
    """``q, k, v`` and an output gradient, ``(1, 12, n, 64)``, from ``seed`` (CPU generator:
    the same values on every device); ``q`` and ``k`` times ``scale``."""
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(1, HEADS, n, HEAD_DIM, generator=g) for _ in range(4)]
    out[0], out[1] = out[0] * scale, out[1] * scale
    return [t.to(device=dev, dtype=dtype) for t in out]


def correctness_case(
    plan: Plan, dtype: str, learnable: bool, watch: RecompileWatch
) -> Dict[str, Any]:
    """Compiled flex vs the ``reference`` backend (float32 on the same rounded inputs) on
    ``plan.correctness_grid`` + CLS, lh90, layer 0: forward, and the gradients of ``q, k,
    v`` (on CPU torch has no flex backward for them: recorded as skipped) and, where
    ``learnable``, of the slopes, each within :data:`TOLERANCES` of ``dtype``; in
    bfloat16 / float16 also the forward's :func:`roundings` (``forward_roundings``)."""
    dev, tdt, tol = torch.device(plan.device), DTYPES[dtype], TOLERANCES[dtype]
    if learnable and not flex_slope_grads_available():
        return dict(
            status=SKIPPED,
            reason=f'torch {torch.__version__}: flex gives captured tensors gradients from 2.6',
        )
    eng = LookHereAttentionEngine(resolve_lh_config('lh90'), 1, HEADS, 'flex')
    grid, cls = plan.correctness_grid, 1
    n = cls + grid[0] * grid[1]
    # fixed slopes: q and k twice the timed sections' size, scores of about 4 standard
    # deviations, peaky softmaxes where the bias and the score's precision matter (a sum
    # rounded to bfloat16 in the score_mod: 8.8 roundings here, 1.8 at unit size); not with
    # learnable slopes, whose global-slope gradient (a sum over every pair) then cancels
    # down to where float16 missed it by 0.13 in the CPU simulation
    q, k, v, gout = _inputs(n, dev, tdt, scale=1.0 if learnable else 2.0)
    slopes = LookHereSlopes(eng.config, 1, HEADS).to(dev) if learnable else None
    ref_slopes = LookHereSlopes(eng.config, 1, HEADS).to(dev) if learnable else None
    qkv_grads = dev.type != 'cpu'
    leaves = [t.detach().requires_grad_(qkv_grads) for t in (q, k, v)]
    ref_leaves = [t.detach().float().requires_grad_(qkv_grads) for t in (q, k, v)]
    hits = len(watch.hits)
    t0 = time.perf_counter()
    out = _flex_call(eng, plan, *leaves, grid, cls, slopes)
    ref = eng(*ref_leaves, 0, grid, cls, backend='reference', slopes=ref_slopes)
    res: Dict[str, Any] = dict(tokens=n, forward=within(out, ref, tol['forward']))
    if 'roundings' in tol:  # the reduced dtypes: the forward within its rounding bound
        with torch.no_grad():
            size = eng(
                *ref_leaves[:2],
                v.float().abs(),
                0,
                grid,
                cls,
                backend='reference',
                slopes=ref_slopes,
            )
        err = roundings(out, ref, size)
        res['forward_roundings'] = dict(
            roundings=err, tol=tol['roundings'], ok=err <= tol['roundings']
        )
    wrt = (leaves if qkv_grads else []) + (list(slopes.parameters()) if learnable else [])
    ref_wrt = (ref_leaves if qkv_grads else []) + (
        list(ref_slopes.parameters()) if learnable else []
    )
    names = (['q', 'k', 'v'] if qkv_grads else []) + (
        [f'slopes.{p}' for p, _ in slopes.named_parameters()] if learnable else []
    )
    grads: Dict[str, Any] = {}
    if not qkv_grads:
        grads['qkv'] = 'skipped: torch has no flex backward for q, k, v on CPU'
    if wrt:
        got = torch.autograd.grad(out, wrt, gout)
        want = torch.autograd.grad(ref, ref_wrt, gout.float())
        for name, a, b in zip(names, got, want):
            grads[name] = within(a, b, tol['grad'])
    res.update(grads=grads, seconds=time.perf_counter() - t0)
    checks = {'forward': res['forward'], **{n: g for n, g in grads.items() if isinstance(g, dict)}}
    bad = [n for n, c in checks.items() if not c['ok']]
    worst = max(c['rel_err'] for c in checks.values())
    res['summary'] = f'max rel err {worst:.2e} ({len(checks)} checks)'
    if 'forward_roundings' in res:
        bad += [] if res['forward_roundings']['ok'] else ['forward_roundings']
        res['summary'] += f', forward {res["forward_roundings"]["roundings"]:.2f} roundings'
    if len(watch.hits) > hits:
        return dict(res, status=FAILED, error=f'eager fallback: {watch.hits[-1]}')
    if bad:
        return dict(res, status=FAILED, error=f'outside tolerance: {", ".join(bad)}')
    return dict(res, status=OK)


def _reference_rows(
    q: Tensor, k: Tensor, v: Tensor, bias_rows: Tensor, start: int, stop: int
) -> Tensor:
    """float32 ``softmax(q k^T / sqrt(d) + bias) v`` for query rows ``start:stop``."""
    scores = q[:, :, start:stop].float() @ k.float().transpose(-1, -2)
    scores = scores / math.sqrt(q.shape[-1]) + bias_rows.float()
    return scores.softmax(-1) @ v.float()


def _peak(device: torch.device, fn: Callable[[], Any]) -> Tuple[Optional[float], ...]:
    """``(peak, rise)`` in GiB over one call of ``fn``: ``torch.cuda.max_memory_allocated``
    and its rise over what was allocated before the call (None, None on CPU)."""
    if device.type != 'cuda':
        fn()
        return None, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak / 2**30, (peak - before) / 2**30


def _timed_cases(
    fns: Dict[str, Callable[[], Any]], plan: Plan, device: torch.device
) -> Dict[str, Any]:
    """Warm-up (the first call's seconds kept: compilation), peak memory (and its rise over
    what was allocated before), then ``plan.rounds`` interleaved timed rounds; median
    seconds per case."""
    first, peak, rise = {}, {}, {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        for _ in range(max(1, plan.warmup)):
            fn()
            if device.type == 'cuda':
                torch.cuda.synchronize()
            first.setdefault(name, time.perf_counter() - t0)
        peak[name], rise[name] = _peak(device, fn)
    times = interleaved(fns, max(3, plan.rounds), str(device))
    return dict(
        first_call_s=first,
        peak_gib=peak,
        rise_gib=rise,
        seconds={n: statistics.median(t) for n, t in times.items()},
        times=times,
    )


def _train(fn: Callable[[], Tensor], leaves: Sequence[Tensor], gout: Tensor) -> None:
    """Forward + backward of one attention call; the leaves' gradients dropped."""
    fn().backward(gout)
    for t in leaves:
        t.grad = None


def _scores_gib(n: int) -> float:
    """GiB of a float32 ``(12, n, n)`` score matrix (what eager flex materialises; compiled
    flex adds about ``12 * n * 64 * 2 * 5`` bytes: the reordered inputs and the output)."""
    return HEADS * n * n * 4 / 2**30


def attn_case(plan: Plan, tokens: int, watch: RecompileWatch) -> Dict[str, Any]:
    """Section ``attn`` at ``tokens`` patches (lh90, layer 0, no CLS): the correctness check
    of flex with and without the block mask on ``plan.check_rows`` sampled query rows,
    then the timings (see the module
    docstring); flex's ratios against SDPA without bias are medians of per-round ratios."""
    dev, tdt = torch.device(plan.device), DTYPES[plan.attn_dtype]
    eng = LookHereAttentionEngine(resolve_lh_config('lh90'), 1, HEADS, 'flex')
    grid = grid_for(tokens)
    q, k, v, gout = _inputs(tokens, dev, tdt)
    hits = len(watch.hits)
    res: Dict[str, Any] = dict(tokens=tokens, grid=list(grid), dtype=plan.attn_dtype)
    gb32 = eng.grid_bias(grid, dev)
    # the engine's caches (token order, block mask, score_mod) are filled by the first call
    # below, in inference mode, and are normal tensors all the same (BoundedCache builds
    # outside it): the train step's backward saves the token order (the first GPU run
    # failed here: its entries were pre-built under the key 'cuda', the calls asked 'cuda:0')
    checks = {}
    # both flex variants that are timed, with the block mask and without, in inference mode
    # like the timed forward (one compiled entry for both: dynamo guards on the mode)
    with torch.inference_mode():
        for label, masked in (('', True), ('all tiles ', False)):
            out = _flex_call(eng, plan, q, k, v, grid, 0, None, masked)
            for start in (0, tokens // 2):
                stop = min(tokens, start + plan.check_rows // 2)
                ref = _reference_rows(q, k, v, gb32.rows(0, start, stop, 0), start, stop)
                checks[f'{label}rows {start}:{stop}'] = within(
                    out[:, :, start:stop], ref, TOLERANCES[plan.attn_dtype]['forward']
                )
            del out
    res['check'] = checks
    flex_ok = all(c['ok'] for c in checks.values())  # before triton's rows join the dict
    triton_problem = _triton_check(res, eng, q, k, v, grid, gb32, plan)
    if len(watch.hits) > hits:
        return dict(res, status=FAILED, error=f'eager fallback: {watch.hits[-1]}')
    if not flex_ok:
        return dict(res, status=FAILED, error='flex outside tolerance (not timed)')
    dense_gib = HEADS * tokens * tokens * tdt.itemsize / 2**30
    bias, no_bias = None, None
    if dense_gib > plan.max_dense_gib:
        no_bias = f'skipped: the dense bias needs {dense_gib:.1f} GiB'
    elif HEADS * tokens * tokens >= DENSE_BIAS_MAX_ELEMENTS:
        no_bias = (
            f"skipped: a dense bias of {HEADS * tokens * tokens:.2e} elements (SDPA's "
            'memory-efficient kernel offsets the bias in 32 bits: wrong rows or a crashed CUDA '
            'context past 2**31)'
        )
    else:
        bias = eng.dense_bias(0, grid, False, dev, tdt)[None]

    def calls(q, k, v) -> Dict[str, Callable[[], Tensor]]:
        fns = {
            'flex': partial(_flex_call, eng, plan, q, k, v, grid, 0),
            'flex_all_tiles': partial(_flex_call, eng, plan, q, k, v, grid, 0, None, False),
            'sdpa_nobias': partial(F.scaled_dot_product_attention, q, k, v),
        }
        if bias is not None:
            fns['sdpa_dense_bias'] = partial(F.scaled_dot_product_attention, q, k, v, bias)
        return fns

    forward = calls(q, k, v)
    if triton_problem is None:  # forward only: not in the train step's calls
        forward['triton'] = partial(eng, q, k, v, 0, grid, 0, backend='triton')
    with torch.inference_mode():
        res['forward'] = _timed_cases(forward, plan, dev)
    if len(watch.hits) > hits:
        return dict(res, status=FAILED, error=f'eager fallback: {watch.hits[-1]}')
    fwd = res['forward']
    res['flex_vs_nobias'] = paired_ratio(fwd['times']['flex'], fwd['times']['sdpa_nobias'])
    if triton_problem is None:
        res['triton_vs_nobias'] = paired_ratio(fwd['times']['triton'], fwd['times']['sdpa_nobias'])
        res['triton_vs_flex'] = paired_ratio(fwd['times']['triton'], fwd['times']['flex'])
    res['all_tiles_vs_nobias'] = paired_ratio(
        fwd['times']['flex_all_tiles'], fwd['times']['sdpa_nobias']
    )
    if bias is None:
        res['sdpa_dense_bias'] = no_bias
    res['summary'] = f'forward flex {res["flex_vs_nobias"]:.2f}x sdpa without bias'
    if triton_problem is None:
        res['summary'] += f', triton {res["triton_vs_nobias"]:.2f}x'
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    if dev.type == 'cpu':
        res['train'] = 'skipped: torch has no flex backward for q, k, v on CPU'
    else:
        steps = {n: partial(_train, fn, leaves, gout) for n, fn in calls(*leaves).items()}
        res['train'] = _timed_cases(steps, plan, dev)
        tr = res['train']['times']
        res['train_flex_vs_nobias'] = paired_ratio(tr['flex'], tr['sdpa_nobias'])
        res['summary'] += f', train {res["train_flex_vs_nobias"]:.2f}x'
    rise = res['forward']['rise_gib'].get('flex')
    if len(watch.hits) > hits:
        return dict(res, status=FAILED, error=f'eager fallback: {watch.hits[-1]}')
    if rise is not None and tokens >= 2048 and rise > _scores_gib(tokens) / 4:
        err = f'flex forward allocated {rise:.2f} GiB: the scores were materialised (eager)'
        return dict(res, status=FAILED, error=err)
    return dict(res, status=OK)


def _triton_check(
    res: Dict[str, Any],
    eng: LookHereAttentionEngine,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid: Tuple[int, int],
    gb32: Any,
    plan: Plan,
) -> Optional[str]:
    """The ``triton`` backend's forward (:mod:`~lookhere_dense.lookhere.attention.flash_triton`)
    on the sampled rows of the flex check, into ``res['check']``; why it is not timed
    (``res['triton']``: not installed, CPU outside the interpreter, an error, outside
    tolerance), or None: timed beside flex. An error here never stops the flex rows."""
    from lookhere_dense.lookhere.attention.common import AttentionRequest
    from lookhere_dense.lookhere.attention.flash_triton import can_run

    tokens = q.shape[-2]
    problem = can_run(AttentionRequest(tokens, q.device, q.dtype, auto=False))
    if problem is None:
        try:
            with torch.inference_mode():
                out = eng(q, k, v, 0, grid, 0, backend='triton')
            for start in (0, tokens // 2):
                stop = min(tokens, start + plan.check_rows // 2)
                ref = _reference_rows(q, k, v, gb32.rows(0, start, stop, 0), start, stop)
                res['check'][f'triton rows {start}:{stop}'] = check = within(
                    out[:, :, start:stop], ref, TOLERANCES[plan.attn_dtype]['forward']
                )
                if not check['ok']:
                    problem = 'outside tolerance (not timed)'
            del out
        except Exception as err:  # a compile error on this GPU / Triton: recorded, not fatal
            problem = f'failed: {_error(err, 400)}'
            res['triton_traceback'] = _traceback()
    if problem is not None:
        res['triton'] = f'skipped: {problem}'
    return problem


#: the variants of the ``attn parts`` case, in order: each adds one thing to the one
#: before (:func:`attn_parts_case`), so a ratio of neighbours is what that thing costs
ATTN_PARTS: Tuple[str, ...] = (
    'sdpa_nobias',
    'flex_plain',
    'flex_plain_ours',
    'flex_mask',
    'flex_table',
    'flex_table_mask',
    'flex_table_mask_asserts',
    'flex_coords_mask',
    'flex_lookhere',
    'flex_lookhere_cls',
)
#: ``(what, numerator, denominator)``: the steps :func:`attn_parts_case` reports
ATTN_PART_STEPS: Tuple[Tuple[str, str, str], ...] = (
    ('flex kernel alone (stock compile) vs flash SDPA', 'flex_plain', 'sdpa_nobias'),
    ('our compile: kernel options, no bounds asserts', 'flex_plain_ours', 'flex_plain'),
    ('block mask: tiles skipped, mask_mod on partial tiles', 'flex_mask', 'flex_plain_ours'),
    ('table score_mod, every tile', 'flex_table', 'flex_plain_ours'),
    ('table score_mod on the masked kernel', 'flex_table_mask', 'flex_mask'),
    ("inductor's bounds asserts on the gathers", 'flex_table_mask_asserts', 'flex_table_mask'),
    ('distance from coordinates instead of the table', 'flex_coords_mask', 'flex_table_mask'),
    ('token reorder, as the engine calls flex', 'flex_lookhere', 'flex_table_mask'),
    ('a CLS token (one more: not a multiple of 128)', 'flex_lookhere_cls', 'flex_lookhere'),
)


def coords_score_mod(grid: Tuple[int, int], order: Tensor, slopes: Tensor) -> Callable:
    """A diagnostic ``score_mod`` for :func:`attn_parts_case`: ``score - slope[h] * |dq -
    dk|`` with the Euclidean distance computed from per-token ``(y, x)`` int32 arrays (in
    the order of ``order``, padded like :func:`~lookhere_dense.lookhere.flex.flex_index`)
    instead of gathered from the table: what the bias costs without the table gather.
    Not LookHere's bias (no official rounding, one slope per head): timed, never checked."""
    width = grid[1]
    pad = -(-order.numel() // FLEX_INDEX_PAD) * FLEX_INDEX_PAD - order.numel()
    y = F.pad(order // width, (0, pad)).to(torch.int32)
    x = F.pad(order % width, (0, pad)).to(torch.int32)
    slopes = slopes.float()

    def score_mod(score, b, h, q_idx, kv_idx):
        dy = (y[kv_idx] - y[q_idx]).float()
        dx = (x[kv_idx] - x[q_idx]).float()
        return score.float() - slopes[h] * torch.sqrt(dy * dy + dx * dx)

    return score_mod


def attn_part_variants(
    eng: LookHereAttentionEngine,
    plan: Plan,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid: Tuple[int, int],
) -> Dict[str, Callable[[], Tensor]]:
    """The calls of :data:`ATTN_PARTS` for layer 0 of ``eng`` (no CLS) on ``q, k, v`` in the
    model's order. The flex variants run on inputs put in tile order once here, compiled
    with ``plan.compile_backend``: ``flex_plain`` and ``flex_table_mask_asserts`` as
    anyone would (``torch.compile(flex_attention)``: inductor's settings, with its bounds
    asserts on computed indices), the others as the engine does (:func:`flex_function`:
    :data:`~lookhere_dense.lookhere.attention.common.FLEX_INDUCTOR_OPTIONS`, and our kernel
    options); ``flex_lookhere`` is the engine's whole call (:func:`_flex_call`),
    ``flex_lookhere_cls`` the same with a CLS token in front (``T + 1`` tokens, as in the
    model: not a multiple of the tile)."""
    from torch.nn.attention.flex_attention import flex_attention

    dev = q.device
    ours = flex_function(True, plan.compile_backend)
    stock = torch.compile(flex_attention, dynamic=False, backend=plan.compile_backend)
    options = flex_kernel_options(dev.type, q.dtype, q.shape[-1], compiled=True)
    order = eng.flex_order(grid, 0, dev)
    mask = eng.block_mask(0, grid, 0, dev)
    table_mod = eng.score_mod(0, grid, 0, dev)
    # a slope per head giving biases of the table's size: its largest finite magnitude
    # over the grid's largest distance
    table = eng.grid_bias(grid, dev).table[0].float().flatten(1)
    biggest = torch.where(torch.isfinite(table), table, 0.0).abs().amax(1)
    coords_mod = coords_score_mod(grid, order, biggest / math.hypot(grid[0] - 1, grid[1] - 1))
    qo, ko, vo = (t.index_select(2, order) for t in (q, k, v))
    qc, kc, vc = (torch.cat([t[:, :, -1:], t], 2) for t in (q, k, v))  # + a CLS token

    def flex(score_mod=None, block_mask=None, opts=options, fn=ours):
        extra = {} if opts is None else dict(kernel_options=opts)
        return fn(qo, ko, vo, score_mod=score_mod, block_mask=block_mask, **extra)

    return dict(
        sdpa_nobias=partial(F.scaled_dot_product_attention, q, k, v),
        flex_plain=partial(flex, opts=None, fn=stock),
        flex_plain_ours=flex,
        flex_mask=partial(flex, block_mask=mask),
        flex_table=partial(flex, table_mod),
        flex_table_mask=partial(flex, table_mod, mask),
        # our kernel options still: inductor's own 16-bit tiles do not fit our score_mod
        flex_table_mask_asserts=partial(flex, table_mod, mask, fn=stock),
        flex_coords_mask=partial(flex, coords_mod, mask),
        flex_lookhere=partial(_flex_call, eng, plan, q, k, v, grid, 0),
        flex_lookhere_cls=partial(_flex_call, eng, plan, qc, kc, vc, grid, 1),
    )


def check_parts(
    variants: Dict[str, Callable[[], Tensor]], order: Tensor, tol: float = 1e-5
) -> Dict[str, Any]:
    """Whether ``flex_table_mask`` (tile order) put back in the model's order is the
    engine's call ``flex_lookhere``: the parts measure the kernel the model runs."""
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    got = variants['flex_table_mask']().index_select(2, back)
    return within(got, variants['flex_lookhere'](), tol)


def attn_parts_case(plan: Plan, tokens: int, watch: RecompileWatch) -> Dict[str, Any]:
    """Where flex's time goes, at ``tokens`` patches (lh90, layer 0, no CLS, forward in
    inference mode): each of :data:`ATTN_PARTS` (:func:`attn_part_variants`) adds one
    thing to the one before -- flex with no callbacks (a stock compile, then ours), the
    block mask, the table ``score_mod`` (every tile, then masked; then with inductor's
    bounds asserts, which our compile drops), the bias computed from coordinates
    (:func:`coords_score_mod`), the engine's whole call (token reorder), and that call with
    a CLS token (the model's ``T + 1`` tokens: flex's boundary checks). A variant that
    raises is recorded with its error and left out of the timing; the masked table
    variant is checked against the engine's call (:func:`check_parts`)."""
    dev, tdt = torch.device(plan.device), DTYPES[plan.attn_dtype]
    eng = LookHereAttentionEngine(resolve_lh_config('lh90'), 1, HEADS, 'flex')
    grid = grid_for(tokens)
    q, k, v, _ = _inputs(tokens, dev, tdt)
    hits = len(watch.hits)
    res: Dict[str, Any] = dict(kind='parts', tokens=tokens, grid=list(grid), dtype=plan.attn_dtype)
    res['kernel_options'] = flex_kernel_options(dev.type, tdt, HEAD_DIM, compiled=True)
    variants = attn_part_variants(eng, plan, q, k, v, grid)
    errors: Dict[str, str] = {}
    res['errors'] = errors
    with torch.inference_mode():
        for name, call in list(variants.items()):
            try:
                call()
            except Exception as err:  # one variant's compile error costs that variant
                errors[name] = _error(err)
                del variants[name]
        if {'flex_table_mask', 'flex_lookhere'} <= set(variants):
            res['check'] = check_parts(variants, eng.flex_order(grid, 0, dev))
        if len(watch.hits) == hits:
            res['forward'] = _timed_cases(variants, plan, dev)
    if len(watch.hits) > hits:
        return dict(res, status=FAILED, error=f'eager fallback: {watch.hits[-1]}')
    times = res['forward']['times']
    res['vs_sdpa'] = {
        n: paired_ratio(times[n], times['sdpa_nobias'])
        for n in times
        if n != 'sdpa_nobias' and 'sdpa_nobias' in times
    }
    res['steps'] = [
        dict(step=what, ratio=paired_ratio(times[a], times[b]), of=f'{a} / {b}')
        for what, a, b in ATTN_PART_STEPS
        if a in times and b in times
    ]
    res['summary'] = (
        ', '.join(f'{n.replace("flex_", "")} {r:.2f}x' for n, r in res['vs_sdpa'].items())
        + ' sdpa'
    )
    if errors:
        res['summary'] += f'; {len(errors)} failed: {", ".join(errors)}'
    if 'check' in res and not res['check']['ok']:
        return dict(res, status=FAILED, error='the masked table variant is not the engine call')
    return dict(res, status=FAILED if errors else OK)


# ---------------------------------------------------------------------------------------
# section peer
# ---------------------------------------------------------------------------------------
def peer_cases(plan: Plan) -> List[Dict[str, Any]]:
    """The peer cases in the order they run (most important first: a budget stop costs the
    last ones): the whole frame for timm, nobias and every preset through flex, the train
    step at the smaller size, the big frame, the train step at the larger size."""
    common = dict(
        kind='peer',
        device=plan.device,
        dtype=plan.model_dtype,
        steps=plan.rounds,
        warmup=plan.warmup,
        strict_compile=True,
        compile_backend=plan.compile_backend,
        profile=True,  # one more step under torch.profiler: kernel time vs call overhead
        **({'arch': plan.peer_arch} if plan.peer_arch else {}),
    )
    flex = [f'{p}:flex' for p in plan.presets]
    # the Triton forward (frames only: it has no backward); on CPU its children run in
    # Triton's interpreter (the simulation: float32 models)
    triton = [f'{p}:triton' for p in plan.presets]
    train = [
        f'{p}:{plan.train_backend}' if plan.train_backend != 'auto' else p
        for p in plan.presets
        if p != 'lh45'
    ]
    small, large = plan.train_sizes
    groups = [
        ('frame', plan.frame, ['timm', 'nobias', *triton, *flex, 'lh90:chunked']),
        ('train', (small, small), ['timm', 'nobias', *train]),
        ('frame', plan.big_frame, ['timm', 'nobias', 'lh90:triton', 'lh90:flex']),
        ('train', (large, large), ['timm', train[-1]]),
    ]
    interpret = {'TRITON_INTERPRET': '1'} if plan.device == 'cpu' else None
    return [
        dict(
            common,
            mode=mode,
            size=list(size),
            model=m,
            group=f'{mode} {size[0]}x{size[1]}',
            **({'child_env': interpret} if interpret and m.endswith(':triton') else {}),
        )
        for mode, size, models in groups
        for m in models
    ]


def _peer_summary(res: Dict[str, Any]) -> str:
    """One line: median seconds, peak, backend."""
    peak = res.get('peak') or 0
    return (
        f'{res["seconds"]:.3f} s (first {res.get("first_seconds") or 0:.1f} s), peak '
        f'{peak / 2**30:.2f} GiB, backend {res.get("backend")}'
    )


def peer_ratios(cases: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per group and model: median seconds and peak over timm's (and over ``nobias``'s)."""
    rows = []
    by_group: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for c in cases:
        if c['status'] == OK:
            by_group.setdefault(c['group'], {})[c['model']] = c
    for group, runs in by_group.items():
        for model, c in runs.items():
            row = dict(group=group, model=model, seconds=c['seconds'], peak=c['peak'])
            for base in ('timm', 'nobias'):
                if base in runs and model != base:
                    row[f'time_vs_{base}'] = c['seconds'] / runs[base]['seconds']
                    row[f'peak_vs_{base}'] = c['peak'] / max(runs[base]['peak'], 1)
            rows.append(row)
    return rows


def peer_section(plan: Plan, rec: Recorder, budget: 'Budget', flex_problem: Optional[str]):
    """Each peer case in its own process, within the section budget."""
    entry = rec.data['sections']['peer']
    if _version('timm') is None:
        for case in peer_cases(plan):
            rec.add('peer', dict(case, name=_peer_name(case), status=SKIPPED, reason='no timm'))
        return
    for case in peer_cases(plan):
        name = _peer_name(case)
        if flex_problem and case['model'].endswith(':flex'):
            rec.add('peer', dict(case, name=name, status=SKIPPED, reason=flex_problem))
            continue
        if not budget.allows(plan.min_case_s['peer']):
            rec.add('peer', dict(case, name=name, status=SKIPPED, reason=budget.reason()))
            continue
        timeout = min(plan.child_timeout, budget.left())
        try:
            res = run_child(case, timeout)
        except Exception as err:  # e.g. a stdout line that is not JSON: one row, not the run
            res = dict(case, error=_error(err), traceback=_traceback())
        if 'error' in res and timeout < plan.child_timeout and res['error'].startswith('timed'):
            reason = f'{budget.reason()}: stopped after {timeout:.0f} s'
            rec.add('peer', dict(res, name=name, status=SKIPPED, reason=reason))
        elif 'error' in res:
            rec.add('peer', dict(res, name=name, status=FAILED))
        elif res.get('recompile_limit_hits'):
            err = f'eager fallback: {res["recompile_limit_hits"][0]}'
            rec.add('peer', dict(res, name=name, status=FAILED, error=err))
        else:
            rec.add('peer', dict(res, name=name, status=OK, summary=_peer_summary(res)))
        entry['ratios'] = peer_ratios(entry['cases'])
        rec.write()


def _peer_name(case: Dict[str, Any]) -> str:
    return f'{case["group"]} {case["model"]}'


# ---------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------
class Budget:
    """The time left to a section.

    Args:
        seconds: the section's budget.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds left (>= 0)."""
        return max(0.0, self.end - time.monotonic())

    def allows(self, need: float) -> bool:
        """Whether a case that needs about ``need`` seconds may start."""
        return self.left() > need

    def reason(self) -> str:
        """Why a case was skipped."""
        return f'section budget of {self.seconds:.0f} s spent ({self.left():.0f} s left)'


def goals(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The goals of docs/gpu.md against what was measured (``met``: True / False / None
    where the case did not run)."""
    secs = data.get('sections', {})
    attn = [
        c
        for c in secs.get('attn', {}).get('cases', [])
        if c['status'] == OK and c.get('kind') != 'parts'  # parts: a diagnosis, no goal
    ]
    ratios = secs.get('peer', {}).get('ratios', [])
    out = []
    for c in attn:
        value = c.get('all_tiles_vs_nobias')
        out.append(
            dict(
                goal=f'attn {c["tokens"]}: flex computing every tile <= 1.3x SDPA without bias',
                value=value,
                met=None if value is None else value <= 1.3,
            )
        )
    for r in ratios:
        model = r['model']
        if r['group'].startswith('frame') and model.split(':')[0] in ('lh180', 'lh90'):
            value = r.get('time_vs_nobias')
            out.append(
                dict(
                    goal=f'{r["group"]} {model}: < 1.0x our trunk with flash SDPA, no bias',
                    value=value,
                    met=None if value is None else value < 1.0,
                )
            )
        if r['group'].startswith('train') and model not in ('timm', 'nobias'):
            value = r.get('time_vs_timm')
            out.append(
                dict(
                    goal=f'{r["group"]} {model}: <= 1.1x timm',
                    value=value,
                    met=None if value is None else value <= 1.1,
                )
            )
    return out


def _table(data: Dict[str, Any]) -> str:
    """The closing table: every case's status, then the goals."""
    lines = ['', 'case                                              status   note']
    for section, entry in data['sections'].items():
        for c in entry['cases']:
            note = c.get('summary') or c.get('reason') or c.get('error') or ''
            lines.append(f'{section + " " + c["name"]:<50}{c["status"]:<9}{note}'[:200])
    for g in data.get('goals', []):
        value = '-' if g['value'] is None else f'{g["value"]:.3f}'
        verdict = {True: 'met', False: 'NOT met', None: 'not measured'}[g['met']]
        lines.append(f'goal {g["goal"]}: {value} ({verdict})')
    return '\n'.join(lines)


#: what marks inductor's output code of a flex graph: the Triton template's block-sparse
#: loop, or the name of the operator (the CPU kernel's code, the source-node comments)
FLEX_KERNEL_MARKERS = ('SPARSE_KV_BLOCK_SIZE', 'flex_attention')


def inductor_cache_dir() -> Path:
    """Where inductor writes its generated code in this process and its children:
    ``$TORCHINDUCTOR_CACHE_DIR``, else torch's default (``/tmp/torchinductor_<user>``)."""
    for module in (
        'torch._inductor.runtime.cache_dir_utils',
        'torch._inductor.runtime.runtime_utils',
    ):
        try:
            return Path(__import__(module, fromlist=['cache_dir']).cache_dir())
        except (ImportError, AttributeError):
            continue
    import getpass
    import tempfile

    default = Path(tempfile.gettempdir()) / f'torchinductor_{getpass.getuser()}'
    return Path(os.environ.get('TORCHINDUCTOR_CACHE_DIR') or default)


def save_kernel_sources(cache: Path, dest: Path, max_bytes: int = 12 * 2**20) -> Dict[str, Any]:
    """Write the generated code of the flex kernels under ``cache`` (the run's own:
    ``tools/gpu_check.sh`` gives each run a fresh one) to ``dest``, one text file: every
    output-code file (inductor's ``<2 chars>/c*.py``) that holds
    :data:`FLEX_KERNEL_MARKERS`, and Triton's metadata (``*.json``: shared memory, warps,
    stages) of the template kernels (``triton_tem_*``), newest first, each headed by its
    path, at most ``max_bytes`` in all (one file: the device returns at most 8 files).
    Returns ``{'files': n, 'bytes': n, 'left_out': n, 'path': str}``."""
    found: List[Tuple[float, Path, str]] = []  # (modified, path, text), each file read once
    if cache.is_dir():
        candidates = [(p, False) for p in cache.glob('*/c*.py')] + [
            (p, True) for p in cache.glob('**/triton_tem_*.json')
        ]
        for path, metadata in candidates:
            try:
                text = path.read_text(errors='replace')
                if metadata or any(m in text for m in FLEX_KERNEL_MARKERS):
                    found.append((path.stat().st_mtime, path, text))
            except OSError:
                continue
    found.sort(key=lambda item: item[0], reverse=True)
    parts, size, left_out = [], 0, 0
    for _, path, text in found:
        entry = f'===== {path.relative_to(cache)}\n{text}\n'
        if size + len(entry) > max_bytes:
            left_out += 1
            continue
        parts.append(entry)
        size += len(entry)
    info = dict(files=len(parts), bytes=size, left_out=left_out)
    if parts:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(''.join(parts))
        info['path'] = str(dest)
    return info


_SIGNALLED: List[int] = []
"""Signals received during :func:`run`. The handler raises KeyboardInterrupt, but code it
lands in may turn that into an ordinary exception (dynamo wraps what is raised while it
traces or compiles), which one case's ``except Exception`` would then record as a failure
and go on: :meth:`Recorder.add` raises again after any case that finished with a signal
pending, so an interrupt always ends the run (exit 130)."""


def _interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    _SIGNALLED.append(signum)
    raise KeyboardInterrupt(f'signal {signum}')


def run(plan: Plan, out: Path, command: str) -> int:
    """Run every section into ``out``; returns the exit status (0: every case ok, 3: some
    failed or were skipped, 130: interrupted; the JSON says which)."""
    data: Dict[str, Any] = dict(
        command=command,
        mode='cuda' if plan.device == 'cuda' else 'simulate-cpu',
        plan=dataclasses.asdict(plan),
        tolerances=TOLERANCES,
        finished=False,
    )
    rec = Recorder(out, data)
    signals = (signal.SIGTERM, signal.SIGINT)
    handlers = {sig: signal.getsignal(sig) for sig in signals}
    _SIGNALLED.clear()
    for sig in signals:  # also where SIGINT came in ignored
        signal.signal(sig, _interrupt)
    status = 0
    try:
        with RecompileWatch() as watch:
            flex_problem = None
            todo = [n for n in SECTIONS if n == 'env' or n in plan.sections]
            end = time.monotonic() + sum(plan.budgets[n] for n in todo)
            for name in todo:
                # a section that ran over (its last case) leaves the later ones less: the
                # sections end within the sum of the budgets, well inside the shell's cap
                seconds = min(plan.budgets[name], max(0.0, end - time.monotonic()))
                budget = Budget(seconds)
                rec.section(name, seconds)
                rec.say(f'section {name} (budget {seconds:.0f} s)')
                try:
                    if name == 'env':
                        flex_problem = env_section(plan, rec, budget)
                        if plan.recompile_limit is not None:
                            _set_recompile_limit(plan.recompile_limit)
                    elif name == 'peer':
                        peer_section(plan, rec, budget, flex_problem)
                    else:
                        _flex_section(name, plan, rec, budget, watch, flex_problem)
                except Exception as err:  # a section that raises costs that section only
                    msg = f'section {name} stopped: {_error(err)}'
                    if name == 'env':
                        flex_problem = flex_problem or msg
                    rec.add(
                        name,
                        dict(name='section', status=FAILED, error=msg, traceback=_traceback()),
                    )
                data['sections'][name]['seconds'] = (
                    rec.elapsed() - data['sections'][name]['started_s']
                )
        data['finished'] = True
    except KeyboardInterrupt as err:
        data['interrupted'] = f'{err or "SIGINT"} after {rec.elapsed():.0f} s'
        rec.say(f'interrupted ({data["interrupted"]}): the JSON holds every finished case')
        status = 130
    for sig in signals:  # the last write must not be interrupted (the cap's SIGINT)
        signal.signal(sig, signal.SIG_IGN)
    _SIGNALLED.clear()
    try:
        data['goals'] = goals(data)
    except Exception as err:  # never at the cost of the file
        data['goals'], data['goals_error'] = [], _error(err)
    try:  # what inductor generated for flex (read offline: tiles, loads, shared memory)
        data['kernel_sources'] = save_kernel_sources(
            inductor_cache_dir(), out.with_name(out.stem + '_kernels.txt')
        )
    except Exception as err:  # never at the cost of the file
        data['kernel_sources'] = dict(error=_error(err))
    cases = [c for e in data['sections'].values() for c in e['cases']]
    data['counts'] = {s: sum(c['status'] == s for c in cases) for s in (OK, FAILED, SKIPPED)}
    rec.write()
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)
    print(_table(data), flush=True)
    rec.say(f'done: {data["counts"]}; wrote {out}')
    if status == 0 and (data['counts'][FAILED] or data['counts'][SKIPPED]):
        status = 3
    return status


def _flex_section(
    name: str,
    plan: Plan,
    rec: Recorder,
    budget: Budget,
    watch: RecompileWatch,
    flex_problem: Optional[str],
) -> None:
    """Sections ``correctness`` and ``attn``: one case at a time, each after a dynamo reset
    (compile once per shape: never near the recompile limit), errors recorded per case."""
    if name == 'correctness':
        todo = [
            (
                f'{dtype} {"learnable" if learn else "fixed"} slopes',
                partial(correctness_case, plan, dtype, learn, watch),
            )
            for dtype, learn in _correctness_order(plan)
        ]
    else:
        todo = [(f'{n} tokens', partial(attn_case, plan, n, watch)) for n in plan.attn_tokens]
        if plan.attn_parts_tokens:  # first: the diagnosis of the 12x before the goals' sizes
            n = plan.attn_parts_tokens
            todo.insert(0, (f'parts {n} tokens', partial(attn_parts_case, plan, n, watch)))
    for case_name, fn in todo:
        if flex_problem:
            rec.add(name, dict(name=case_name, status=SKIPPED, reason=flex_problem))
            continue
        if not budget.allows(plan.min_case_s[name]):
            rec.add(name, dict(name=case_name, status=SKIPPED, reason=budget.reason()))
            continue
        if plan.device == 'cuda':
            torch.cuda.empty_cache()
        if plan.reset:
            torch._dynamo.reset()
        hits = len(watch.hits)
        try:
            res = fn()
        except KeyboardInterrupt:
            raise
        except Exception as err:  # one failure costs one case
            res = dict(status=FAILED, error=_error(err), traceback=_traceback())
            if len(watch.hits) > hits:
                res['error'] = f'eager fallback: {watch.hits[-1]} ({res["error"]})'
        rec.add(name, dict(res, name=case_name))


def _correctness_order(plan: Plan) -> List[Tuple[str, bool]]:
    """``(dtype, learnable)`` most important first (a budget stop costs the last ones): the
    reduced dtypes, the one the other sections time (``plan.attn_dtype``) first, with
    fixed slopes (the forward and the ``q, k, v`` gradients), then with learnable slopes,
    then float32 fixed and learnable."""
    reduced = sorted((d for d in TOLERANCES if d != 'float32'), key=lambda d: d != plan.attn_dtype)
    return [(d, learn) for learn in (False, True) for d in reduced] + [
        ('float32', False),
        ('float32', True),
    ]


def _set_recompile_limit(limit: int) -> None:
    """Set dynamo's per-function recompile limit to exactly ``limit``."""
    import torch._dynamo.config as dynamo_config

    name = 'recompile_limit' if hasattr(dynamo_config, 'recompile_limit') else 'cache_size_limit'
    setattr(dynamo_config, name, int(limit))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument(
        '--simulate-cpu',
        action='store_true',
        help='the same sections and checks on CPU at tiny sizes (default: the CUDA run)',
    )
    p.add_argument(
        '--out',
        type=Path,
        default=None,
        help='the JSON file (default: $OUT/gpu_check.json where $OUT is set, else '
        'docs/benchmark_cuda.json)',
    )
    p.add_argument(
        '--budget-scale',
        type=float,
        default=1.0,
        help='multiply every section budget (default: 1)',
    )
    p.add_argument(
        '--attn-tokens',
        type=int,
        nargs='+',
        default=None,
        help='token counts of section attn (default: 1024 to 32768; simulated: 64 256)',
    )
    p.add_argument(
        '--attn-parts-tokens',
        type=int,
        default=None,
        metavar='N',
        help="token count of the attn section's 'parts' case, where flex's time goes "
        '(default: 8192; simulated: 256; 0: not run)',
    )
    p.add_argument(
        '--sections',
        nargs='+',
        choices=SECTIONS,
        default=list(SECTIONS),
        help='sections to run (default: all; env always runs)',
    )
    p.add_argument(
        '--recompile-limit',
        type=int,
        default=None,
        metavar='N',
        help="dynamo's recompile limit (default: raised to flex's 64; a small value with "
        '--no-reset shows the eager-fallback detection)',
    )
    p.add_argument(
        '--compile-backend',
        default=None,
        help='torch.compile backend of the flex calls (default: inductor; simulated: aot_eager)',
    )
    p.add_argument(
        '--no-reset',
        action='store_true',
        help='no dynamo reset between cases (default: reset)',
    )
    args = p.parse_args(argv)
    if args.budget_scale <= 0:
        p.error(f'--budget-scale must be > 0, got {args.budget_scale}')
    if args.attn_tokens and min(args.attn_tokens) < 1:
        p.error(f'--attn-tokens must be >= 1, got {args.attn_tokens}')
    if args.attn_parts_tokens is not None and args.attn_parts_tokens < 0:
        p.error(f'--attn-parts-tokens must be >= 0 (0: not run), got {args.attn_parts_tokens}')
    return args


def default_out() -> Path:
    """``$OUT/gpu_check.json`` where ``$OUT`` is set (the device tool returns only files
    under it), else ``docs/benchmark_cuda.json`` of the checkout."""
    if os.environ.get('OUT'):
        return Path(os.environ['OUT']) / 'gpu_check.json'
    return Path(__file__).resolve().parents[2] / 'docs' / 'benchmark_cuda.json'


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse, check the device, run; returns the exit status."""
    args = parse_args(argv)
    plan = simulate_plan() if args.simulate_cpu else cuda_plan()
    if plan.device == 'cuda' and not torch.cuda.is_available():
        print('gpu_check: no CUDA device here (--simulate-cpu runs the same steps on CPU)')
        return 2
    plan.budgets = {k: v * args.budget_scale for k, v in plan.budgets.items()}
    plan.sections = tuple(args.sections)
    if args.attn_tokens:
        plan.attn_tokens = tuple(args.attn_tokens)
    if args.attn_parts_tokens is not None:
        plan.attn_parts_tokens = args.attn_parts_tokens or None
    plan.reset = not args.no_reset
    plan.compile_backend = args.compile_backend or plan.compile_backend
    plan.recompile_limit = args.recompile_limit
    out = args.out or default_out()
    command = 'python3 -m research.benchmark.gpu_check ' + ' '.join(
        sys.argv[1:] if argv is None else list(argv)
    )
    return run(plan, out, command.strip())


if __name__ == '__main__':
    sys.exit(main())
