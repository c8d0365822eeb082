"""Mixed precision through mmengine, on CUDA and on CPU (``docs/mixed_precision.md``).

mmengine 0.10.7's ``AmpOptimWrapper`` asserts a GPU / NPU / MLU / MUSA device in its
constructor, although its autocast (``mmengine.runner.amp.autocast``) runs
``torch.autocast('cpu', dtype=torch.bfloat16)`` on CPU. :class:`MixedPrecisionOptimWrapper`
is that wrapper without the assertion: with an accelerator it *is* ``AmpOptimWrapper``
(float16 with a dynamic loss scale by default, or bfloat16); on CPU it trains in bfloat16
autocast without loss scaling (bfloat16 has float32's exponent range, and
``torch.cuda.amp.GradScaler`` switches itself off there anyway), and refuses float16;
mmcv's CPU NMS and RoIAlign, which have no bfloat16 kernel, get float32 inputs there
(:func:`float32_mmcv_cpu_ops`).
:func:`lookhere_dense.apis.train.build_train_config` puts it in place of a config's
``AmpOptimWrapper`` on a machine without CUDA.

:class:`AmpTestLoop` is mmengine's ``TestLoop`` under ``torch.autocast`` of a chosen dtype
(mmengine's own ``fp16=True`` means float16 on CUDA), its predictions handed to the
evaluator in float32 (:func:`outputs_to_float32`). :func:`inference_autocast` is the
context the inference tools run their model in.

In all three (:func:`inference_autocast` when it is given the model) an mmdet detector
computes only its features (``extract_feat``: backbone and
neck) in the reduced dtype; its heads (RPN, RoI box and mask heads: anchors, box
regression and decoding, NMS, targets and losses) run in float32 on float32 copies of the
features (:func:`float32_detection_heads`): bfloat16 has 8 significant bits, so box
coordinates above 1024 px would be multiples of 8 and the scores would tie. Segmentors run
wholly under autocast.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from typing import Any, Iterator, Optional, Sequence, Union

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import LOOPS, OPTIM_WRAPPERS
from mmengine.runner import TestLoop

from ..errors import ConfigError
from .ranks import unwrap_model

__all__ = [
    'AMP_DTYPES',
    'AmpTestLoop',
    'MMCV_FLOAT32_OPS',
    'MixedPrecisionOptimWrapper',
    'cpu_bf16_products',
    'note_slow_cpu_bf16',
    'float32_mmcv_cpu_ops',
    'accelerator_available',
    'amp_dtype',
    'float32_detection_heads',
    'inference_autocast',
    'outputs_to_float32',
    'train_autocast_dtype',
]

#: The autocast dtypes the tools take (``--amp-dtype``).
AMP_DTYPES = ('bfloat16', 'float16')


def accelerator_available() -> bool:
    """Whether mmengine's ``AmpOptimWrapper`` accepts this machine (CUDA, NPU, MLU or
    MUSA)."""
    from mmengine.device import (
        is_cuda_available,
        is_mlu_available,
        is_musa_available,
        is_npu_available,
    )

    return is_cuda_available() or is_npu_available() or is_mlu_available() or is_musa_available()


def cpu_bf16_products() -> Optional[bool]:
    """Whether this CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX-BF16, from
    ``/proc/cpuinfo``'s x86 ``flags``); None where there are no such flags to read (not
    Linux, or not x86: ARM's cpuinfo lists ``Features``), and nothing is said then."""
    try:
        with open('/proc/cpuinfo') as f:
            flags = next(
                (line.split(':', 1)[1].split() for line in f if line.startswith('flags')), None
            )
    except OSError:
        return None
    if flags is None:
        return None
    return 'avx512_bf16' in flags or 'amx_bf16' in flags


@functools.lru_cache(maxsize=None)
def note_slow_cpu_bf16() -> Optional[str]:
    """Warn once per process where bfloat16 autocast runs on a CPU without bfloat16
    products (AVX2-only CPUs, AVX-512 ones without BF16): PyTorch emulates its matrix
    products there, and mixed precision runs slower than float32 (a new user's trial on an
    AVX2 EPYC: ``tools/infer.py`` / ``extrapolate.py`` 2.5-2.7x per image, a training
    iteration ~3x; docs/mixed_precision.md). Returns the warning, or None."""
    if cpu_bf16_products() is not False:
        return None
    from mmengine.logging import print_log

    msg = (
        'bfloat16 on a CPU without AVX512-BF16 or AMX: PyTorch emulates its matrix products '
        'here, so mixed precision runs slower than float32 on this machine (the accuracy is '
        'the same as elsewhere); leave --amp off for speed (docs/mixed_precision.md)'
    )
    print_log(msg, logger='current', level=logging.WARNING)
    return msg


def amp_dtype(
    dtype: Union[str, torch.dtype, None],
    device_type: str,
    what: str = 'dtype',
    training: bool = True,
) -> torch.dtype:
    """The autocast dtype for ``device_type``, checked.

    Args:
        dtype: ``'bfloat16'`` / ``'float16'`` (or the torch dtypes); None: bfloat16.
        device_type: ``'cpu'``, ``'cuda'``, ...
        what: how the error names the setting, e.g. ``'--amp-dtype'``. Default: ``'dtype'``.
        training: whether the dtype is for training (the refusal of float16 on CPU names
            loss scaling) or inference. Default: True.

    Returns:
        ``torch.bfloat16`` or ``torch.float16``.

    Raises:
        lookhere_dense.errors.ConfigError: an unknown dtype, or float16 on CPU (float16
            autocast with loss scaling needs CUDA; PyTorch's CPU autocast and mmengine's
            take bfloat16).
    """
    if dtype is None:
        return torch.bfloat16
    name = str(dtype).replace('torch.', '')
    if name not in AMP_DTYPES:
        raise ConfigError(f'{what}={dtype!r}: mixed precision takes one of {list(AMP_DTYPES)}')
    if name == 'float16' and device_type == 'cpu':
        if training:
            raise ConfigError(
                f'{what}=float16 on CPU: float16 mixed precision (with loss scaling) runs on '
                'CUDA only; on CPU use bfloat16'
            )
        raise ConfigError(
            f'{what}=float16 on CPU: the tools run float16 inference on CUDA only; on CPU '
            "use bfloat16, the type of the CPUs' matrix units (AMX, AVX512-BF16); "
            "torch.autocast('cpu', dtype=torch.float16) runs the model outside the tools"
        )
    return getattr(torch, name)


def train_autocast_dtype(optim_wrapper: Any) -> Optional[torch.dtype]:
    """The dtype a config's ``optim_wrapper`` section trains under: None (float32) unless
    its type is ``AmpOptimWrapper`` / ``MixedPrecisionOptimWrapper``; then its ``dtype``,
    or where that is None what the wrapper takes (float16 with an accelerator, as
    mmengine's; bfloat16 on CPU)."""
    kind = str((optim_wrapper or {}).get('type', '')).split('.')[-1]
    if kind not in ('AmpOptimWrapper', 'MixedPrecisionOptimWrapper'):
        return None
    dtype = optim_wrapper.get('dtype')
    if dtype is None:
        return torch.float16 if accelerator_available() else torch.bfloat16
    return getattr(torch, str(dtype).replace('torch.', ''))


@OPTIM_WRAPPERS.register_module()
class MixedPrecisionOptimWrapper(AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` that also trains on CPU (bfloat16 autocast).

    With CUDA (or NPU / MLU / MUSA) it is ``AmpOptimWrapper`` unchanged. On CPU the
    forward of ``train_step`` runs under ``torch.autocast('cpu', dtype=torch.bfloat16)``
    (the parent's ``optim_context``); parameters, gradients and optimizer state stay
    float32; the loss is not scaled (``loss_scale`` is ignored: bfloat16 underflows no
    sooner than float32). Checkpoints have the parent's keys (an empty ``loss_scaler``
    state on CPU), so a run can resume on the other kind of machine (on CUDA, from a CPU
    checkpoint, the loss scale starts afresh: :meth:`load_state_dict`).

    Args:
        loss_scale: ``'dynamic'``, a number or a ``GradScaler`` dict (CUDA only).
            Default: ``'dynamic'``.
        dtype: ``'bfloat16'`` or ``'float16'`` (CUDA only). Default: None (CUDA: float16,
            as mmengine; CPU: bfloat16).
        use_fsdp: ``ShardedGradScaler`` (CUDA only). Default: False.
        **kwargs: ``OptimWrapper``'s arguments (``optimizer``, ``clip_grad``, ...).

    Raises:
        lookhere_dense.errors.ConfigError: float16 or an unknown dtype on CPU.
    """

    def __init__(
        self,
        loss_scale: Union[str, float, dict] = 'dynamic',
        dtype: Union[str, torch.dtype, None] = None,
        use_fsdp: bool = False,
        **kwargs,
    ):
        if accelerator_available():
            super().__init__(loss_scale=loss_scale, dtype=dtype, use_fsdp=use_fsdp, **kwargs)
            return
        cast = amp_dtype(dtype, 'cpu', 'optim_wrapper.dtype')
        float32_mmcv_cpu_ops()
        note_slow_cpu_bf16()
        OptimWrapper.__init__(self, **kwargs)
        self._scale_update_param = None
        self.loss_scaler = torch.amp.GradScaler('cpu', enabled=False)
        self.cast_dtype = cast

    def load_state_dict(self, state_dict: dict) -> None:
        """The parent's, except that an empty ``loss_scaler`` state (saved by a run without
        loss scaling: on CPU, where the scaler is disabled) is dropped where this wrapper's
        scaler is enabled (a CUDA machine): torch's ``GradScaler`` refuses it (``The source
        state dict is empty, possibly because it was saved from a disabled instance of
        GradScaler``). The scaler then starts afresh from the config's ``loss_scale``, as in
        a new run, and the log says so. (On CPU the scaler is disabled and loads nothing.)
        """
        scaler = state_dict.get('loss_scaler')
        if isinstance(scaler, dict) and not scaler and self.loss_scaler.is_enabled():
            from mmengine.logging import print_log

            state_dict.pop('loss_scaler')
            print_log(
                'resume: the checkpoint has no loss scale (it was trained without loss '
                'scaling, e.g. with --amp on CPU); the loss scaler starts afresh from '
                'optim_wrapper.loss_scale, as in a new run',
                logger='current',
                level=logging.WARNING,
            )
        super().load_state_dict(state_dict)

    @contextlib.contextmanager
    def optim_context(self, model: torch.nn.Module) -> Iterator[None]:
        """The parent's context (autocast of ``cast_dtype``), in which an mmdet detector's
        heads compute in float32 (:func:`float32_detection_heads`)."""
        with super().optim_context(model), float32_detection_heads(model):
            yield


#: mmcv's CPU ops that have no bfloat16 kernel: ``(module, autograd Function)``. Under CPU
#: autocast their inputs are made float32 (:func:`float32_mmcv_cpu_ops`), as autocast does
#: for PyTorch's own float32-only ops; on CUDA they are left alone (mmcv has float16 and
#: bfloat16 CUDA kernels).
MMCV_FLOAT32_OPS = (('mmcv.ops.nms', 'NMSop'), ('mmcv.ops.roi_align', 'RoIAlignFunction'))


_REDUCED = (torch.bfloat16, torch.float16)


def _cpu_reduced(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor) and value.dtype in _REDUCED and value.device.type == 'cpu'
    )


def _float32_forward(forward):
    """``forward`` with reduced-precision CPU tensor arguments made float32 under CPU
    autocast, and a floating result cast back to the first such argument's dtype."""

    def forward_float32(ctx, *args, **kwargs):
        reduced = [a.dtype for a in args if _cpu_reduced(a)]
        if not reduced or not torch.is_autocast_enabled('cpu'):
            return forward(ctx, *args, **kwargs)
        out = forward(ctx, *(a.float() if _cpu_reduced(a) else a for a in args), **kwargs)
        return out.to(reduced[0]) if out.is_floating_point() else out

    forward_float32.float32_under_cpu_autocast = True
    return forward_float32


def _float32_backward(backward):
    """``backward`` with reduced-precision CPU gradients made float32 (autograd casts the
    float32 input gradients back to the inputs' dtypes)."""

    def backward_float32(ctx, *grads):
        return backward(ctx, *(g.float() if _cpu_reduced(g) else g for g in grads))

    backward_float32.float32_under_cpu_autocast = True
    return backward_float32


def float32_mmcv_cpu_ops() -> None:
    """Make the ops of :data:`MMCV_FLOAT32_OPS` take float32 copies of reduced-precision
    inputs while CPU autocast is on (mmdet's NMS and RoIAlign in a bfloat16 Mask R-CNN
    step; without it: ``expected scalar type Float but found BFloat16``). Idempotent; the
    ops are unchanged outside CPU autocast; gradients come back in the input's dtype
    (autograd casts them)."""
    import importlib

    for module, name in MMCV_FLOAT32_OPS:
        try:
            function = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):  # mmcv without its compiled ops
            continue
        for name, wrap in (('forward', _float32_forward), ('backward', _float32_backward)):
            method = function.__dict__.get(name)
            if method is None or getattr(method.__func__, 'float32_under_cpu_autocast', False):
                continue
            setattr(function, name, staticmethod(wrap(method.__func__)))


def outputs_to_float32(obj: Any) -> Any:
    """``obj`` with every bfloat16 / float16 tensor in it made float32, in place where it
    can be (data samples, dicts, lists; tuples are rebuilt): what a model predicted under
    autocast, before it is scored or written. Integer tensors (label maps) are kept."""
    from mmengine.structures import BaseDataElement

    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in (torch.bfloat16, torch.float16) else obj
    if isinstance(obj, BaseDataElement):
        for key, value in list(obj.items()):
            setattr(obj, key, outputs_to_float32(value))
        return obj
    if isinstance(obj, dict):
        for key in list(obj):
            obj[key] = outputs_to_float32(obj[key])
        return obj
    if isinstance(obj, list):
        obj[:] = [outputs_to_float32(v) for v in obj]
        return obj
    if isinstance(obj, tuple):
        return tuple(outputs_to_float32(v) for v in obj)
    return obj


def _is_detector(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an mmdet detector (without importing mmdet: a model built from
    an mmdet config has imported it)."""
    base = sys.modules.get('mmdet.models.detectors.base')
    return base is not None and isinstance(model, base.BaseDetector)


@contextlib.contextmanager
def float32_detection_heads(model: torch.nn.Module) -> Iterator[None]:
    """Inside an autocast region, an mmdet detector's heads in float32.

    Where ``model`` (or the model a DDP wrapper holds) is an mmdet ``BaseDetector`` and
    autocast is on for its device, the region's autocast is switched off for the
    detector's forward except in ``extract_feat`` (backbone and neck), which runs under the
    region's autocast dtype and hands its features on as float32 (a differentiable cast:
    their gradients come back in the reduced dtype). So the RPN (anchors, deltas, decoding,
    NMS), the RoI heads (RoIAlign, box regression and decoding, per-class NMS, mask
    logits) and every target and loss compute in float32, in ``loss`` (training),
    ``predict`` and ``_forward`` alike: box coordinates keep float32's 24 significant
    bits instead of bfloat16's 8 (multiples of 8 px above 1024 px) or float16's 11, and
    the scores are not rounded to the reduced dtype. A detector that computes its features elsewhere than in
    ``extract_feat`` runs wholly in float32. Anything else (segmentors), or no autocast:
    nothing changes. ``extract_feat`` is replaced on the instance for the region only.
    """
    model = unwrap_model(model)
    device_type = _model_device_type(model)
    if not _is_detector(model) or not torch.is_autocast_enabled(device_type):
        yield
        return
    dtype = torch.get_autocast_dtype(device_type)
    features = model.extract_feat
    missing = object()
    own = model.__dict__.get('extract_feat', missing)

    def extract_feat(*args, **kwargs):
        with torch.autocast(device_type, dtype=dtype):
            feats = features(*args, **kwargs)
        return outputs_to_float32(feats)

    model.extract_feat = extract_feat
    try:
        with torch.autocast(device_type, enabled=False):
            yield
    finally:
        if own is missing:
            del model.extract_feat
        else:
            model.extract_feat = own


@contextlib.contextmanager
def inference_autocast(
    dtype: Optional[str],
    device: Union[str, torch.device],
    model: Optional[torch.nn.Module] = None,
) -> Iterator[None]:
    """``torch.autocast(device type, dtype)`` for inference, or nothing when ``dtype`` is
    None.

    Args:
        dtype: ``'bfloat16'`` / ``'float16'`` (CUDA only) or None (float32).
        device: where the model runs (``'cpu'``, ``'cuda:0'``, a ``torch.device``).
        model: the model that runs in it; an mmdet detector's heads then compute in
            float32 (:func:`float32_detection_heads`). Default: None.

    Raises:
        lookhere_dense.errors.ConfigError: float16 on CPU, an unknown dtype.
    """
    if dtype is None:
        yield
        return
    device_type = torch.device(device).type
    cast = amp_dtype(dtype, device_type, '--amp-dtype', training=False)
    if device_type == 'cpu':
        float32_mmcv_cpu_ops()
        note_slow_cpu_bf16()
    with torch.autocast(device_type, dtype=cast):
        if model is None:
            yield
        else:
            with float32_detection_heads(model):
                yield


def _model_device_type(model: torch.nn.Module) -> str:
    param = next(model.parameters(), None)
    return param.device.type if param is not None else 'cpu'


@LOOPS.register_module()
class AmpTestLoop(TestLoop):
    """mmengine's ``TestLoop`` with the model's ``test_step`` under
    ``torch.autocast(<the model's device type>, dtype)`` (an mmdet detector's heads in
    float32: :func:`float32_detection_heads`); the predictions reach the evaluator (and
    ``--out`` files) in float32 (:func:`outputs_to_float32`).

    Args:
        runner, dataloader, evaluator: as ``TestLoop``.
        dtype: ``'bfloat16'`` or ``'float16'`` (CUDA only). Default: ``'bfloat16'``.
    """

    def __init__(self, runner, dataloader, evaluator, dtype: str = 'bfloat16'):
        super().__init__(runner, dataloader, evaluator, fp16=False)
        self.device_type = _model_device_type(runner.model)
        self.dtype = amp_dtype(dtype, self.device_type, 'test_cfg.dtype', training=False)
        if self.device_type == 'cpu':
            float32_mmcv_cpu_ops()
            note_slow_cpu_bf16()
        from mmengine.logging import print_log

        print_log(
            f'testing in {str(self.dtype).replace("torch.", "")} autocast on '
            f'{self.device_type} (the predictions; scored in float32)',
            logger='current',
        )

    @torch.no_grad()
    def run_iter(self, idx: int, data_batch: Sequence[dict]) -> None:
        """Predict one batch in mixed precision, score it in float32."""
        from mmengine.runner.loops import _update_losses

        self.runner.call_hook('before_test_iter', batch_idx=idx, data_batch=data_batch)
        model = self.runner.model
        with torch.autocast(self.device_type, dtype=self.dtype), float32_detection_heads(model):
            outputs = model.test_step(data_batch)
        outputs = outputs_to_float32(outputs)
        outputs, self.test_loss = _update_losses(outputs, self.test_loss)
        self.evaluator.process(data_samples=outputs, data_batch=data_batch)
        self.runner.call_hook(
            'after_test_iter', batch_idx=idx, data_batch=data_batch, outputs=outputs
        )
