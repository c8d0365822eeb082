"""Export a segmentor (whole mode) or its backbone for deployment: ONNX (run by onnxruntime)
or a ``torch.export`` program (``.pt2``), for one input size (``tools/export.py``).

The exported function:

* ``segmentor`` (Segmenter, UPerNet, any mmseg ``EncoderDecoder``): a normalised
  ``(1, 3, H, W)`` tensor -> the segmentation logits ``(1, classes, H, W)``, what mmseg's
  whole-mode inference gives for that input (the whole image in one pass, as mmdeploy's
  ``whole`` mode): the graph pads the input at the bottom and right as the data
  preprocessor's ``test_cfg`` pads it (``size_divisor``, or ``size``; with its
  ``pad_val``), runs ``encode_decode`` on the padded tensor (the head's logits resized to
  the padded size) and crops the logits back to ``H x W`` (:func:`whole_mode_padding`);
* ``backbone``: the same input -> the backbone's NCHW maps of ``out_indices``, for the
  input as given (no padding: a caller that wants mmseg's pads it first).

The data preprocessing (BGR->RGB, mean / std) stays outside, as in mmdeploy; the test-time
padding, which mmseg applies to the normalised tensor, is in the graph. The check of
:func:`export_model` runs a random image through mmseg's own path (the data preprocessor,
then ``predict`` in whole mode: padding, ``encode_decode``, the crop) and compares the
file's logits, on the preprocessor's unpadded output, with those. Every LookHere
ViT attends through :func:`~lookhere_dense.lookhere.export.static_grid_attention` while it
is traced, so the file holds the weights plus the small per-layer tables and computes the
bias in the graph. ONNX: opset 23 (SDPA becomes the fused ``Attention`` op), exported with
``dynamo=True``; of onnxscript's optimiser only constant folding, dead-node removal and
common-subexpression elimination run (its pattern rewriter takes minutes per layer on
these graphs), and the per-node metadata (stack traces with local paths, 90 % of the graph
file) is removed. Weights go to ``FILE.data`` beside ``FILE`` (loaded by that name).

Run an exported file with :func:`onnxruntime_session`: onnxruntime's memory pattern and its
buffer reuse off, its CPU arena on. Buffer reuse (a freed buffer handed to the next tensor
of exactly the same size) keeps one buffer per size alive from its first to its last user
-- across all layers, about three times the activations the graph needs at any one time;
the memory pattern planned one arena for the whole run (twice the peak on the first
exported graphs). Without reuse, the arena (not the C allocator, which kept the freed
blocks) takes the many short-lived tensors; measured in ``docs/deploy.md``.
"""

from __future__ import annotations

import contextlib
import math
import os
import os.path as osp
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ConfigError, ToolError
from ..lookhere.export import DEFAULT_BUDGET_MB
from ..validation import check_int
from .cli import quiet_mmengine_logger

__all__ = [
    'SegmentorLogits',
    'BackboneMaps',
    'whole_mode_padding',
    'export_model',
    'onnxruntime_session',
    'exported_file_bytes',
    'EXPORT_FORMATS',
    'EXPORT_PARTS',
    'EXPORT_SUFFIXES',
    'INPUT_NAME',
    'SEGMENTOR_OUTPUT_NAME',
    'ONNX_OPSET',
]

#: file formats of :func:`export_model`
EXPORT_FORMATS = ('onnx', 'pt2')
#: what :func:`export_model` exports
EXPORT_PARTS = ('segmentor', 'backbone')
#: the ONNX opset: from 23 on, SDPA exports as the fused ``Attention`` op
ONNX_OPSET = 23
#: :func:`export_model`'s check fails (a warning line; ``tools/export.py`` exits with
#: status 1) above this max |diff| by default (docs/deploy.md: the target at 1024x2048)
CHECK_WARN_ABS_DIFF = 1e-3
#: the suffixes of :func:`export_model`'s ``out``, per format
EXPORT_SUFFIXES = {'onnx': '.onnx', 'pt2': '.pt2'}
#: the name of the exported graph's input (ONNX)
INPUT_NAME = 'images'
#: the name of the segmentor's output (ONNX)
SEGMENTOR_OUTPUT_NAME = 'logits'


def whole_mode_padding(segmentor: nn.Module, size: Sequence[int]) -> Tuple[Tuple[int, int], float]:
    """``((H', W'), value)``: what mmseg's whole-mode inference pads an input of ``size``
    ``(H, W)`` to, and with which value.

    mmseg's ``SegDataPreProcessor`` pads the *normalised* test images at the bottom and
    right (``stack_batch``) when it has a ``test_cfg``: to the next multiple of its
    ``size_divisor``, or to its fixed ``size`` (never smaller than the image), with its
    ``pad_val``; ``encode_decode`` then runs on the padded tensor (the head's logits
    resized to the padded size) and ``postprocess_result`` crops the padding off. Without a
    ``test_cfg`` nothing is padded: ``((H, W), 0.0)``.
    """
    h, w = (int(s) for s in size)
    dp = getattr(segmentor, 'data_preprocessor', None)
    test_cfg = getattr(dp, 'test_cfg', None)
    value = float(getattr(dp, 'pad_val', 0) or 0)
    if not test_cfg:
        return (h, w), value
    fixed = test_cfg.get('size', None)
    divisor = test_cfg.get('size_divisor', None)
    if fixed is not None:  # stack_batch takes ``size`` first
        return (max(h, int(fixed[-2])), max(w, int(fixed[-1]))), value
    if divisor is not None and int(divisor) > 1:
        d = int(divisor)
        return (-(-h // d) * d, -(-w // d) * d), value
    return (h, w), value


class SegmentorLogits(nn.Module):
    """``(1, 3, H, W)`` normalised images -> ``(1, classes, H, W)`` logits of an mmseg
    segmentor in whole mode, for one static size: what mmseg's inference gives.

    As mmseg does (:func:`whole_mode_padding`): the input is padded at the bottom and
    right to the data preprocessor's test-time size with its pad value, ``encode_decode``
    runs on the padded tensor (``pad_shape``: the head's logits come at the padded size),
    and the logits are cropped back to ``H x W``. ``mmseg_padding=False``:
    ``encode_decode`` of the input as it is.
    """

    def __init__(self, segmentor: nn.Module, size: Tuple[int, int], mmseg_padding: bool = True):
        super().__init__()
        self.segmentor = segmentor
        self.size = (int(size[0]), int(size[1]))
        self.padded_size, self.pad_value = (
            whole_mode_padding(segmentor, self.size) if mmseg_padding else (self.size, 0.0)
        )

    def forward(self, inputs: Tensor) -> Tensor:
        (h, w), (ph, pw) = self.size, self.padded_size
        if (ph, pw) != (h, w):
            inputs = F.pad(inputs, (0, pw - w, 0, ph - h), value=self.pad_value)
        metas = [dict(img_shape=self.size, pad_shape=self.padded_size, ori_shape=self.size)]
        logits = self.segmentor.encode_decode(inputs, metas)
        if (ph, pw) != (h, w):
            logits = logits[:, :, :h, :w]
        return logits


class BackboneMaps(nn.Module):
    """``(1, 3, H, W)`` normalised images -> the backbone's outputs as one flat tuple: the
    maps of ``out_indices``; with ``output_cls_token=True`` each index's map, then its CLS
    token (the file's outputs are flat either way).

    :attr:`output_names` (set by each call): the outputs' names in the exported file,
    ``block{i}`` for the map of out index ``i`` and ``cls{i}`` for its CLS token (the
    position in the outputs where the backbone has no ``out_indices`` of that length).
    """

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.output_names: List[str] = []

    def forward(self, inputs: Tensor) -> Tuple[Tensor, ...]:
        flat: List[Tensor] = []
        names: List[str] = []
        outs = list(self.backbone(inputs))
        indices = getattr(self.backbone, 'out_indices', None)
        indices = [indices] if isinstance(indices, int) else list(indices or [])
        if len(indices) != len(outs) or len(set(indices)) != len(indices):
            indices = list(range(len(outs)))
        for i, out in zip(indices, outs):
            parts = list(out) if isinstance(out, (list, tuple)) else [out]
            flat.extend(parts)
            if len(parts) <= 2:  # the map, and its CLS token with output_cls_token=True
                names.extend([f'block{i}', f'cls{i}'][: len(parts)])
            else:  # pragma: no cover - no backbone here returns more per index
                names.extend(f'block{i}_{j}' for j in range(len(parts)))
        self.output_names = names
        return tuple(flat)


def exported_file_bytes(path: str) -> Dict[str, int]:
    """``{file: bytes}`` of an exported model: the file and, for ONNX, its external data."""
    out = {path: os.path.getsize(path)}
    data = path + '.data'
    if osp.isfile(data):
        out[data] = os.path.getsize(data)
    return out


def onnxruntime_session(
    path: str,
    threads: Optional[int] = None,
    mem_pattern: bool = False,
    mem_reuse: bool = False,
    cpu_arena: bool = True,
):
    """An onnxruntime CPU session for an exported file.

    Args:
        path: the exported ``.onnx`` file (its ``.data`` beside it).
        threads: intra-op threads. Default: None (onnxruntime's default).
        mem_pattern: onnxruntime's memory-pattern planner. Default: False.
        mem_reuse: onnxruntime's buffer reuse between tensors of the same size.
            Default: False.
        cpu_arena: onnxruntime's CPU arena. Default: True.

    The defaults hold the least memory on these graphs (see the module docstring and
    ``docs/deploy.md``); onnxruntime's own defaults are all three on.
    """
    try:
        import onnxruntime as ort
    except ImportError as err:  # pragma: no cover - installed by setup.sh
        raise ToolError(f'onnxruntime is not installed ({err}): pip install onnxruntime') from err
    options = ort.SessionOptions()
    options.enable_mem_pattern = bool(mem_pattern)
    options.enable_mem_reuse = bool(mem_reuse)
    options.enable_cpu_mem_arena = bool(cpu_arena)
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def save_onnx(program: Any, path: str) -> None:
    """Save an ONNX program of ``torch.onnx.export(..., dynamo=True, optimize=False)``:
    constant folding, dead nodes and common subexpressions removed, metadata cleared,
    weights in ``path + '.data'`` (an old pair at ``path`` is replaced)."""
    import onnx_ir.passes.common as passes
    import onnxscript.optimizer as optimizer

    model = program.model
    optimizer.fold_constants(model)
    passes.RemoveUnusedNodesPass()(model)
    passes.RemoveUnusedOpsetsPass()(model)
    passes.CommonSubexpressionEliminationPass()(model)
    passes.ClearMetadataAndDocStringPass()(model)
    for stale in (path, path + '.data'):
        if osp.exists(stale):
            os.remove(stale)
    program.save(path, external_data=True)


def _name_outputs(program: Any, names: Sequence[str]) -> None:
    """Give the ONNX program's graph outputs ``names`` (torch generates names that change
    with the input size: ``upsample_bilinear2d``, ``slice_100``, ...)."""
    outputs = list(program.model.graph.outputs)
    if len(outputs) != len(names):  # pragma: no cover - BackboneMaps names every output
        raise ToolError(f'the export has {len(outputs)} outputs, expected {list(names)}')
    for value, name in zip(outputs, names):
        value.name = name


def _strip_program(program: Any) -> Any:
    """A ``torch.export`` program without its example inputs and per-node stack traces
    (they would add the input's bytes and megabytes of local paths to the ``.pt2``)."""
    program._example_inputs = None
    for node in program.graph.nodes:
        for key in ('stack_trace', 'nn_module_stack', 'source_fn_stack', 'from_node'):
            node.meta.pop(key, None)
    return program


def refuse_unexportable(model: nn.Module) -> None:
    """Refuse a model the static-grid export cannot serve: a LookWhere backbone (its
    selector runs at its own low resolution and the extractor attends over the patches
    the selector picks, not over one grid per file).

    Raises:
        ConfigError: naming the module.
    """
    from ..lookwhere import LookWhere

    for name, module in model.named_modules():
        if isinstance(module, LookWhere):
            raise ConfigError(
                f'{name or "the model"} is a {type(module).__name__} (LookWhere): the export '
                'serves LookHere ViTs on one patch grid per file, and LookWhere attends over '
                'a low-resolution copy and the patches its selector picks -- not supported; '
                'export a LookHere segmentor'
            )


def export_model(
    config: str,
    checkpoint: Optional[str],
    shape: Sequence[int],
    out: str,
    format: str = 'onnx',
    part: str = 'segmentor',
    cfg_options: Optional[dict] = None,
    check: bool = True,
    threads: Optional[int] = None,
    budget_mb: float = DEFAULT_BUDGET_MB,
    log=print,
    max_diff: float = CHECK_WARN_ABS_DIFF,
    out_flag: str = '--out',
) -> Dict[str, Any]:
    """Export ``config`` with the weights of ``checkpoint`` for inputs of ``shape``.

    Args:
        config: the mmseg config (``mmseg::`` paths allowed).
        checkpoint: the checkpoint (loaded strictly); None: the model's random
            initialisation (to measure the cost of deployment without trained weights).
        shape: ``(H, W)`` of the input, in pixels.
        out: the file to write (``.onnx`` / ``.pt2``; ONNX weights go to ``out + '.data'``).
        format: ``'onnx'`` or ``'pt2'``. Default: ``'onnx'``.
        part: ``'segmentor'`` (logits, whole mode) or ``'backbone'`` (its maps).
            Default: ``'segmentor'``.
        cfg_options: config overrides. Default: None.
        check: run the file (onnxruntime / ``torch.export.load``) on a random input and
            compare it with the torch model as it runs in torch (its own attention engine):
            the segmentor with mmseg's own whole-mode inference of a random image (the data
            preprocessor, padding included, then ``predict``; the file gets the
            preprocessor's output without the padding), the backbone with its maps of a
            random tensor. Default: True.
        threads: torch (and onnxruntime) threads for the check. Default: None.
        budget_mb: the largest bias block of a global layer (the export's query blocks).
            Default: :data:`~lookhere_dense.lookhere.export.DEFAULT_BUDGET_MB` (48).
        log: where progress lines go. Default: print.
        max_diff: the check fails above this max |diff| (and where an output is NaN /
            infinite or of another shape). Default: :data:`CHECK_WARN_ABS_DIFF` (1e-3).
        out_flag: the caller's name for ``out``'s folder in a refusal (the benchmark's
            ``--deploy-dir``). Default: ``'--out'``.

    Returns:
        ``dict(out, files, total_bytes, weights_bytes, ratio_to_weights, largest_constant,
        largest_weight_bytes, export_seconds, grid, padded_size, pad_value, ...)`` (the
        grid of the padded size; the backbone: the size itself) and, with ``check``,
        ``max_abs_diff`` (None where an output is NaN / infinite or of another shape), the
        output shapes, ``check_passed``, ``check_problems`` (what failed, as sentences) and
        ``check_max_diff`` (the segmentor also ``argmax_agreement``, the share of pixels
        whose class is mmseg's); ``input_name`` / ``output_names`` (the file's; ONNX),
        ``test_cfg_mode`` and ``notes`` (e.g. a config that infers in ``slide`` mode).
        A failed check logs a ``WARNING`` line and is reported, not raised.

    Raises:
        ConfigError: a bad shape (below one patch per side, for the segmentor after the
            data preprocessor's padding), format, part or ``out`` (a folder, a suffix
            other than ``.onnx`` / ``.pt2``, the checkpoint or the config itself), a model
            without ``encode_decode``, a LookWhere model (:func:`refuse_unexportable`).
        ToolError: ``out``'s folder cannot be written (before any work).
        FileNotFoundError, CheckpointError: as :func:`~.inference.build_model_from_checkpoint`.
    """
    import lookhere_dense

    lookhere_dense.register_all_modules()
    from mmengine.registry import init_default_scope

    from ..checkpoint.atomic import check_output_folder
    from ..config_checks import model_registry
    from ..lookhere.export import QUERY_BLOCK_BUDGET, static_grid_attention
    from .cli import load_config
    from .inference import build_model_from_checkpoint

    if format not in EXPORT_FORMATS:
        raise ConfigError(f'format must be one of {list(EXPORT_FORMATS)}, got {format!r}')
    if osp.isdir(out) or str(out).endswith(('/', os.sep)):
        raise ConfigError(
            f'--out {out!r} is a folder: give the file to write, e.g. {osp.join(out, "model." + format)!r}'
        )
    if not str(out).lower().endswith(tuple(EXPORT_SUFFIXES.values())):
        raise ConfigError(
            f'--out {out!r}: the file to write must end in '
            f'{" or ".join(EXPORT_SUFFIXES.values())} (the format follows it; a file of '
            'another name, such as the checkpoint, is never overwritten)'
        )
    other = [f for f in EXPORT_FORMATS if f != format and str(out).lower().endswith(f'.{f}')]
    if other:
        raise ConfigError(
            f'--out {out!r} names a .{other[0]} file but the format is {format!r}: the file '
            f'would hold a {format} export under the other suffix (name it .{format}, or '
            f'leave --format out: it follows the suffix)'
        )
    if part not in EXPORT_PARTS:
        raise ConfigError(f'part must be one of {list(EXPORT_PARTS)}, got {part!r}')
    if len(shape) != 2:
        raise ConfigError(f'shape must be (H, W), got {list(shape)}')
    size = tuple(check_int(f'shape {n}', s, error=ConfigError) for n, s in zip('HW', shape))
    written = [out] + ([out + '.data'] if format == 'onnx' else [])
    for flag, source in (('the checkpoint', checkpoint), ('the config', config)):
        if source is None or not osp.isfile(str(source)):
            continue
        for path in written:
            if osp.realpath(path) == osp.realpath(str(source)):
                raise ConfigError(
                    f'--out {out!r} would overwrite {flag} {source!r} ({path!r} is that '
                    'file): write the export to another file'
                )
    check_output_folder(osp.dirname(osp.abspath(out)), out_flag)
    if threads:
        torch.set_num_threads(threads)
    cfg = load_config(config, cfg_options)
    scope = cfg.get('default_scope') or 'mmseg'
    if checkpoint is not None:
        model, _ = build_model_from_checkpoint(cfg, checkpoint)
    else:
        init_default_scope(scope)
        model_cfg = cfg.model.copy()
        model_cfg.pop('pretrained', None)
        model_cfg.get('backbone', {}).pop('init_cfg', None)
        torch.manual_seed(0)  # random weights: the same ones on every call
        model = model_registry(scope).build(model_cfg)
        with quiet_mmengine_logger():
            model.init_weights()
        model.eval()
    refuse_unexportable(model)
    patch = getattr(getattr(model, 'backbone', None), 'patch_size', 16)
    if part == 'backbone' and min(size) < patch:
        raise ConfigError(
            f'--shape {size[0]} {size[1]}: the backbone alone takes images of at least one '
            f'{patch}x{patch} patch per side (the segmentor pads its input as mmseg does)'
        )
    notes: List[str] = []
    mode = None
    if part == 'segmentor':
        if not hasattr(model, 'encode_decode'):
            raise ConfigError(
                f'{type(model).__name__} has no encode_decode: export '
                "part='backbone', or a segmentor"
            )
        module = SegmentorLogits(model, size).eval()
        padded, pad_value = module.padded_size, module.pad_value
        if min(padded) < patch:
            how = (
                f'padded by the data preprocessor to {padded[0]}x{padded[1]}'
                if tuple(padded) != tuple(size)
                else 'not padded: the data preprocessor has no test_cfg size / size_divisor'
            )
            raise ConfigError(
                f'--shape {size[0]} {size[1]}: the segmentor takes images of at least one '
                f'{patch}x{patch} patch per side and this one is {how}: give a --shape of at '
                f'least {patch} px per side'
            )
        mode = (getattr(model, 'test_cfg', None) or {}).get('mode', 'whole')
        if mode == 'slide':
            crop = model.test_cfg.get('crop_size')
            stride = model.test_cfg.get('stride')
            notes.append(
                f"the config's model.test_cfg.mode='slide' (crop_size {crop}, stride "
                f'{stride}): tools/test.py and inference_model slide a window over the image, '
                'the file computes whole-frame logits (mmseg whole mode, the one pass over '
                'the padded frame the check compares with); the two differ (docs/deploy.md, '
                'Limits)'
            )
    else:
        module = BackboneMaps(model.backbone).eval()
        padded, pad_value = size, 0.0
    floats = [
        t for t in module.state_dict().values() if torch.is_tensor(t) and t.is_floating_point()
    ]
    weights = sum(t.numel() * t.element_size() for t in floats)
    largest_weight = max(t.numel() * t.element_size() for t in floats)
    grid = [math.ceil(s / patch) for s in padded]
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    pads = (
        f'padded in the graph to {padded[0]}x{padded[1]} as mmseg pads it, value {pad_value:g}; '
        if tuple(padded) != tuple(size)
        else ''
    )
    log(
        f'exporting {part} of {osp.basename(config)} for {size[0]}x{size[1]} px '
        f'({pads}patch grid {grid[0]}x{grid[1]}) as {format} to {out}'
    )
    for note in notes:
        log(f'NOTE: {note}')
    # the check's reference: the model as it runs in torch (its own engine), not the
    # export's attention; the segmentor through mmseg's own inference path
    torch.manual_seed(0)
    x, reference = torch.randn(1, 3, *size), None
    if check and part == 'segmentor':
        x, reference = _mmseg_whole_mode(model, size)
    elif check:
        with torch.no_grad():
            reference = module(x)
    t0 = time.perf_counter()
    with static_grid_attention(module, padded, budget_mb) as stand_ins:
        if format == 'onnx':
            program = torch.onnx.export(
                module,
                (x,),
                dynamo=True,
                opset_version=ONNX_OPSET,
                optimize=False,
                input_names=[INPUT_NAME],
            )
            # the segmentor's one output; the backbone's as its forward named them
            # while it was traced (block{i}, cls{i})
            output_names = (
                [SEGMENTOR_OUTPUT_NAME] if part == 'segmentor' else list(module.output_names)
            )
            _name_outputs(program, output_names)
            save_onnx(program, out)
        else:
            program = _strip_program(torch.export.export(module, (x,)))
            torch.export.save(program, out)
    seconds = time.perf_counter() - t0
    files = exported_file_bytes(out)
    total = sum(files.values())
    report: Dict[str, Any] = dict(
        config=config,
        checkpoint=checkpoint,
        part=part,
        format=format,
        size=list(size),
        padded_size=list(padded),
        pad_value=pad_value,
        grid=grid,
        out=out,
        files=files,
        total_bytes=total,
        weights_bytes=weights,
        ratio_to_weights=total / max(weights, 1),
        largest_weight_bytes=largest_weight,
        export_seconds=round(seconds, 1),
        lookhere_layers_served=len(stand_ins),
        query_blocked_modules=sum(hasattr(m, QUERY_BLOCK_BUDGET) for m in module.modules()),
        tables_bytes=sum(t.numel() * t.element_size() for s in stand_ins for t in s.tables),
        test_cfg_mode=mode,
        notes=notes,
    )
    if format == 'onnx':
        report['input_name'], report['output_names'] = INPUT_NAME, output_names
    report['largest_constant'] = _largest_constant(out, format)
    log(
        f'wrote {", ".join(f"{osp.basename(f)} ({b / 2**20:.1f} MiB)" for f, b in files.items())}:'
        f' {report["ratio_to_weights"]:.3f}x the fp32 weights; export {seconds:.1f} s'
    )
    if check:
        outputs = [torch.as_tensor(o) for o in _run_exported(out, format, x, threads)]
        expected = reference if isinstance(reference, (tuple, list)) else (reference,)
        if part == 'segmentor' and expected[0].shape[1] == 1:
            outputs[0] = outputs[0].sigmoid()  # mmseg's result of one class: the sigmoid
        report.update(_compare(outputs, expected, max_diff))
        diff = report['max_abs_diff']
        shown = f'{diff:.2e}' if diff is not None else 'not measured (see below)'
        runner = 'onnxruntime' if format == 'onnx' else 'torch.export.load'
        if part == 'segmentor':
            same = outputs[0].shape == expected[0].shape
            agree = float((outputs[0].argmax(1) == expected[0].argmax(1)).float().mean())
            report['argmax_agreement'] = agree if same else 0.0
            log(
                f'{runner} vs torch (mmseg whole-mode inference, padding included): max |diff| '
                f'{shown} on outputs {report["output_shapes"]}, '
                f'argmax agrees on {100 * report["argmax_agreement"]:.2f} % of the pixels'
            )
        else:
            log(f'{runner} vs torch: max |diff| {shown} on outputs {report["output_shapes"]}')
        for problem in report['check_problems']:
            log(f'WARNING: {problem}')
    return report


def _compare(outputs: Sequence[Tensor], expected: Sequence[Tensor], max_diff: float) -> dict:
    """The check's verdict on the file's ``outputs`` against the torch model's:
    ``max_abs_diff`` (None where it cannot be measured: an output of another shape, or
    NaN / infinite values -- never NaN, which JSON has no value for), ``output_shapes``,
    ``check_passed``, ``check_problems`` (sentences; empty when it passed) and
    ``check_max_diff``. NaN / infinite outputs, of the file or of torch, fail the check
    (``NaN > limit`` is False: a comparison alone would pass them)."""
    problems: List[str] = []
    if len(outputs) != len(expected):
        problems.append(
            f'the exported file gives {len(outputs)} outputs, the torch model {len(expected)}'
        )
    pairs = list(zip(outputs, expected))
    shapes = [(list(o.shape), list(e.shape)) for o, e in pairs if o.shape != e.shape]
    if shapes:
        problems.append(
            'the exported file gives outputs of other shapes than the torch model '
            f'(file, torch: {shapes})'
        )
    for who, tensors in (('the exported file', outputs), ('the torch model', expected)):
        bad = [i for i, t in enumerate(tensors) if not bool(torch.isfinite(t).all())]
        if bad:
            problems.append(
                f'{who} gives NaN / infinite values (output {", ".join(map(str, bad))}): '
                'the difference cannot be measured'
            )
    diff = None
    if not problems:
        diff = max(float((o - e).abs().max()) for o, e in pairs)
        if diff > max_diff:
            problems.append(
                f'the exported file differs from the torch model by {diff:.2e} (more than '
                f'{max_diff:g})'
            )
    return dict(
        max_abs_diff=diff,
        output_shapes=[list(e.shape) for e in expected],
        check_passed=not problems,
        check_problems=problems,
        check_max_diff=max_diff,
    )


@contextlib.contextmanager
def _whole_mode(segmentor: nn.Module) -> Iterator[None]:
    """``segmentor.test_cfg`` with ``mode='whole'`` for the time of the block."""
    from mmengine.config import ConfigDict

    old = segmentor.test_cfg
    segmentor.test_cfg = ConfigDict({**dict(old or {}), 'mode': 'whole'})
    try:
        yield
    finally:
        segmentor.test_cfg = old


def _mmseg_whole_mode(segmentor: nn.Module, size: Tuple[int, int]) -> Tuple[Tensor, Tensor]:
    """``(inputs, logits)``: a random ``uint8`` BGR image of ``size`` through mmseg's own
    whole-mode inference -- the data preprocessor (BGR->RGB, mean / std, the test-time
    padding) and ``predict`` (``encode_decode`` on the padded tensor, the padding cropped
    off the logits) -- and the preprocessor's normalised output without its padding (what
    the exported segmentor takes; mmseg pads at the bottom and right)."""
    from mmseg.structures import SegDataSample

    gen = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, *size), generator=gen, dtype=torch.uint8)
    sample = SegDataSample(metainfo=dict(img_shape=tuple(size), ori_shape=tuple(size)))
    with torch.no_grad(), _whole_mode(segmentor):
        data = segmentor.data_preprocessor(dict(inputs=[image], data_samples=[sample]), False)
        result = segmentor.predict(data['inputs'], data['data_samples'])[0]
    inputs = data['inputs'][:, :, : size[0], : size[1]].contiguous()
    return inputs, result.seg_logits.data[None]


def _run_exported(path: str, format: str, x: Tensor, threads: Optional[int]) -> List[Any]:
    if format == 'onnx':
        session = onnxruntime_session(path, threads)
        return session.run(None, {session.get_inputs()[0].name: x.numpy()})
    program = torch.export.load(path)
    with torch.no_grad():
        res = program.module()(x)
    return list(res) if isinstance(res, (tuple, list)) else [res]


def _largest_constant(path: str, format: str) -> Tuple[str, List[int], int]:
    """``(name, shape, bytes)`` of the largest constant of an exported file (ONNX
    initializers and constant nodes; ``.pt2`` constants and weights)."""
    if format == 'pt2':
        program = torch.export.load(path)
        tensors = {
            **program.state_dict,
            **{k: v for k, v in program.constants.items() if torch.is_tensor(v)},
        }
        name, t = max(tensors.items(), key=lambda kv: kv[1].numel() * kv[1].element_size())
        return name, list(t.shape), t.numel() * t.element_size()
    import onnx

    model = onnx.load(path, load_external_data=False)
    best = ('', [], 0)
    sizes = {1: 4, 2: 1, 3: 1, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 16: 2}
    for t in model.graph.initializer:
        n = math.prod(t.dims) * sizes.get(t.data_type, 4)
        if n > best[2]:
            best = (t.name, list(t.dims), n)
    for node in model.graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                n = math.prod(a.t.dims) * sizes.get(a.t.data_type, 4)
                if n > best[2]:
                    best = (node.output[0], list(a.t.dims), n)
    return best
