"""The LookWhere study on generated Cityscapes-layout frames: mIoU, time and peak memory of
LookWhere at several ``k_ratio`` against the full-resolution LookHere whole frame and
sliding windows, at several frame sizes up to 1024x2048.

Everything is small so that it runs on a shared 2-core CPU in minutes (the numbers are a
smoke-scale measurement, not a benchmark of a real model):

1. frames: :func:`research.datasets.synthetic_seg.cityscapes_scene` rendered at every
   test size (the same kind of street, drawn larger in pixels on larger frames; task
   ``cityscapes-small`` adds traffic lights of a fixed pixel size, detail that a lower
   resolution loses);
2. teacher: a LookHere ViT (lh180, patch 16) + a linear head, trained with plain PyTorch
   on random 128x128 crops of training frames of every size (labels used here only);
3. student: a LookWhere (3-block selector on a 64x128 copy, ``selector_input``; extractor = a copy of the
   teacher's trunk) distilled from the frozen teacher on whole training frames without
   labels (:func:`lookhere_dense.lookwhere.distill.distillation_losses`, ``k_ratio`` drawn
   from the study's ratios each step; frames up to 256x512 only, for time); the teacher's linear head is applied unchanged
   to the student's dense map, then (``finetune_iters > 0``) extractor + head are
   fine-tuned for segmentation with the selector frozen, as in the paper (cross-entropy on
   whole training frames up to 256x512);
4. evaluation per size: the teacher on the whole frame (one pass, the engine's fused
   kernel), the teacher on the whole frame shrunk to LookWhere's token count at each
   ``k_ratio`` (:func:`resized_logits`, ``method='resized'``), the teacher with sliding 128x128 windows (stride 96, logits averaged), and
   LookWhere at each ``k_ratio`` (nearest-kept fill, or ``fill='propagate'``); mIoU over the test frames
   (19 classes, 255 ignored; the IoU per class beside it), the median time of ``repeats`` passes per frame and the
   peak memory (:class:`research.memory.PeakMemory`, process RSS rise).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from lookhere_dense.lookhere import create_model
from lookhere_dense.lookwhere import LookWhere, LookWhereExtractor
from lookhere_dense.lookwhere.distill import distillation_losses, teacher_targets
from lookhere_dense.lookwhere.fill import FILL_MODES

__all__ = ['run_study', 'summarize', 'SegModel', 'resized_logits', 'miou', 'class_iou']

MEAN = torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1)
STD = torch.tensor([58.395, 57.12, 57.375]).view(1, 3, 1, 1)


def _cityscapes_frame(size: Tuple[int, int], rng: np.random.Generator, small_objects: float = 0.0):
    from research.datasets.synthetic_seg import cityscapes_scene

    return cityscapes_scene(size[0], size[1], rng, small_objects=small_objects)


def _fov_frame(size: Tuple[int, int], rng: np.random.Generator):
    from research.datasets.fov_scenes import render_scene, sample_scene

    return render_scene(sample_scene(rng, size))


@dataclass(frozen=True)
class Task:
    """One generated segmentation task of the study: its classes, training crop, teacher
    trunk, the selector's input size, the sliding-window stride and a frame generator
    ``frame(size, rng) -> (HxWx3 uint8, HxW labels)``."""

    name: str
    num_classes: int
    crop: int
    trunk: Dict[str, Any]
    selector_input: Tuple[int, int]
    stride: int
    frame: Callable[[Tuple[int, int], np.random.Generator], Tuple[np.ndarray, np.ndarray]]
    train_sizes: Tuple[Tuple[int, int], ...]


#: the generated Cityscapes-layout frames (19 classes, 16 px patches, 128 px crops)
CITYSCAPES = Task(
    'cityscapes',
    19,
    128,
    dict(embed_dims=192, num_layers=6, num_heads=12, patch_size=16, preset='lh180'),
    (64, 128),
    96,
    _cityscapes_frame,
    ((256, 512), (512, 1024), (1024, 2048)),
)
#: traffic lights per 256x512 pixels in :data:`CITYSCAPES_SMALL`'s frames
SMALL_OBJECTS = 2.0
#: the same frames with :data:`SMALL_OBJECTS` traffic lights of a fixed pixel size
#: (12-28 px wide at every frame size, :func:`~research.datasets.synthetic_seg.cityscapes_scene`):
#: detail that the whole frame at a lower resolution loses, where LookWhere's kept
#: high-resolution patches should pay
CITYSCAPES_SMALL = Task(
    'cityscapes-small',
    19,
    128,
    CITYSCAPES.trunk,
    (64, 128),
    96,
    functools.partial(_cityscapes_frame, small_objects=SMALL_OBJECTS),
    CITYSCAPES.train_sizes,
)
#: the field-of-view scenes (:mod:`research.datasets.fov_scenes`: 5 classes decided by a
#: horizon and a tower that a 64 px crop often does not show; 8 px patches)
FOV = Task(
    'fov',
    5,
    64,
    dict(embed_dims=192, num_layers=6, num_heads=12, patch_size=8, preset='lh180'),
    (64, 64),
    48,
    _fov_frame,
    ((128, 128), (192, 192), (256, 256)),
)
TASKS = {t.name: t for t in (CITYSCAPES, CITYSCAPES_SMALL, FOV)}
#: the Cityscapes task's constants (kept for callers of the first version)
NUM_CLASSES, CROP, TRUNK = CITYSCAPES.num_classes, CITYSCAPES.crop, CITYSCAPES.trunk


class SegModel(nn.Module):
    """A backbone returning NCHW maps + LayerNorm + linear classifier, logits upsampled to
    the image (bilinear)."""

    def __init__(self, backbone: nn.Module, dims: int, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.backbone = backbone
        self.norm = nn.LayerNorm(dims)
        self.cls = nn.Linear(dims, num_classes)

    def head(self, fmap: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
        x = self.cls(self.norm(fmap.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return F.interpolate(x, size=size, mode='bilinear', align_corners=False)

    def forward(self, images: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.head(self.backbone(images, **kwargs)[-1], tuple(images.shape[-2:]))


def _frames(
    size: Tuple[int, int], count: int, seed: int, task: Task = CITYSCAPES
) -> Tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    imgs, labels = [], []
    for _ in range(count):
        rgb, lab = task.frame(size, rng)
        imgs.append(torch.from_numpy(rgb).permute(2, 0, 1).float())
        labels.append(torch.from_numpy(lab.astype(np.int64)))
    x = (torch.stack(imgs) - MEAN) / STD
    return x, torch.stack(labels)


def _present_iou(conf: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(class ids, IoU in percent)`` of the classes present in prediction or label, from
    the confusion matrix ``conf[label, prediction]`` (float64)."""
    inter = conf.diag().double()
    union = conf.sum(0).double() + conf.sum(1).double() - inter
    ids = torch.nonzero(union > 0).flatten()
    return ids, inter[ids] / union[ids] * 100


def miou(conf: torch.Tensor) -> float:
    """Mean IoU (percent) over the classes present in prediction or label."""
    _, iou = _present_iou(conf)
    return float(iou.mean()) if iou.numel() else 0.0


def class_iou(conf: torch.Tensor) -> Dict[int, float]:
    """IoU (percent) per class id present in prediction or label, from the confusion
    matrix ``conf[label, prediction]``."""
    ids, iou = _present_iou(conf)
    return {int(c): round(float(v), 2) for c, v in zip(ids, iou)}


def _confusion(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    c = logits.shape[1]
    pred = logits.argmax(1).flatten()
    lab = labels.flatten()
    keep = lab != 255
    idx = lab[keep] * c + pred[keep]
    return torch.bincount(idx, minlength=c**2).view(c, c)


def _random_crops(
    pool: List[Tuple[torch.Tensor, torch.Tensor]],
    batch: int,
    gen: torch.Generator,
    crop: int = CROP,
):
    xs, ys = [], []
    for _ in range(batch):
        imgs, labs = pool[int(torch.randint(len(pool), (1,), generator=gen))]
        i = int(torch.randint(imgs.shape[0], (1,), generator=gen))
        h, w = imgs.shape[-2:]
        y0 = int(torch.randint(h - crop + 1, (1,), generator=gen))
        x0 = int(torch.randint(w - crop + 1, (1,), generator=gen))
        xs.append(imgs[i, :, y0 : y0 + crop, x0 : x0 + crop])
        ys.append(labs[i, y0 : y0 + crop, x0 : x0 + crop])
    return torch.stack(xs), torch.stack(ys)


def new_teacher(task: Task = CITYSCAPES) -> SegModel:
    """The study's teacher for ``task``, untrained: its LookHere trunk + LayerNorm + linear
    classifier."""
    trunk = task.trunk
    return SegModel(
        create_model(**trunk, img_size=task.crop), trunk['embed_dims'], task.num_classes
    )


def train_teacher(pool, iters: int, log, task: Task = CITYSCAPES) -> SegModel:
    """The LookHere teacher + linear head on random crops (AdamW, warm-up + cosine)."""
    torch.manual_seed(0)
    model = new_teacher(task)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for it in range(iters):
        lr = 1e-3 * min(1.0, (it + 1) / 30) * 0.5 * (1 + math.cos(math.pi * it / iters))
        for g in opt.param_groups:
            g['lr'] = lr
        x, y = _random_crops(pool, 8, gen, task.crop)
        loss = F.cross_entropy(model(x), y, ignore_index=255)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if it % 50 == 0 or it == iters - 1:
            log(f'teacher iter {it + 1}/{iters} loss {loss.item():.3f}')
    return model.eval()


def load_or_train_teacher(
    path: str, make_pool: Callable[[], list], iters: int, log, task: Task = CITYSCAPES
) -> SegModel:
    """The teacher from the state dict at ``path`` if it is there, else trained
    (:func:`train_teacher` on ``make_pool()``, seeded) and saved at ``path``; ``path=''``:
    no cache."""
    return _cached_teacher(
        path, lambda: train_teacher(make_pool(), iters, log, task), log, 'teacher', task
    )


def _cached_teacher(
    path: str, train: Callable[[], SegModel], log, what: str, task: Task = CITYSCAPES
) -> SegModel:
    """A teacher's state dict from ``path`` if it is there (logged as ``what``), else
    ``train()`` and its state dict saved at ``path`` (through a temporary file and a rename,
    so that a parallel study never reads half a file); ``path=''``: no cache."""
    if path and os.path.exists(path):
        model = new_teacher(task)
        model.load_state_dict(torch.load(path))
        log(f'{what} from {path}')
        return model.eval()
    model = train()
    if path:
        os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
        tmp = f'{path}.{os.getpid()}.tmp'
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, path)
    return model


def distill_student(
    teacher: SegModel,
    frames: List[torch.Tensor],
    k_ratios: Sequence[float],
    iters: int,
    log,
    task: Task = CITYSCAPES,
    selector_target: str = 'attn',
    coverage: float = 0.0,
    fill: str = 'nearest',
    seed: int = 0,
) -> LookWhere:
    """A LookWhere student from the frozen teacher trunk on whole frames (no labels);
    ``fill``: its dense fill (``'propagate'``'s learned correction is trained here too,
    through the extractor loss on every patch); ``seed``: the student's initialisation
    and the order of its frames (0 is the seed every earlier study used)."""
    torch.manual_seed(1 + 100 * seed)
    trunk = copy.deepcopy(teacher.backbone)
    trunk.out_indices = [len(trunk.blocks) - 1]
    student = LookWhere(
        selector=dict(input_size=task.selector_input, embed_dims=192, num_layers=3, num_heads=12),
        extractor=LookWhereExtractor(trunk),
        k_ratio=k_ratios[0],
        coverage=coverage,
        fill=fill,
    )
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1 + 100 * seed)
    t_trunk = teacher.backbone
    student.train()
    t0 = time.perf_counter()
    for it in range(iters):
        imgs = frames[int(torch.randint(len(frames), (1,), generator=gen))]
        i = torch.randint(imgs.shape[0], (2,), generator=gen)
        x = imgs[i]
        student.k_ratio = float(k_ratios[int(torch.randint(len(k_ratios), (1,), generator=gen))])
        targets = teacher_targets(t_trunk, x)
        losses = distillation_losses(student, x, targets, selector_target=selector_target)
        loss = losses['loss_selector'] + losses['loss_extractor']
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if it % 25 == 0 or it == iters - 1:
            log(
                f'distill iter {it + 1}/{iters} selector {losses["loss_selector"].item():.4f} '
                f'extractor {losses["loss_extractor"].item():.4f} '
                f'({(time.perf_counter() - t0) / (it + 1):.2f} s/step)'
            )
    return student.eval()


def finetune_student(
    seg: SegModel, pool, k_ratios: Sequence[float], iters: int, log, seed: int = 0
) -> SegModel:
    """Segmentation fine-tuning of the distilled student with the selector frozen (the
    paper's recipe): extractor + head, cross-entropy on whole training frames, ``k_ratio``
    drawn from the study's ratios each step; ``seed``: the order of frames and ratios."""
    student = seg.backbone
    student.freeze_selector = True
    for p in student.selector.parameters():
        p.requires_grad = False
    return _finetune(seg, pool, k_ratios, iters, log, lambda x, r: seg(x, k_ratio=r), seed=seed)


def finetune_whole(
    seg: SegModel, pool, k_ratios: Sequence[float], iters: int, log, seed: int = 0
) -> SegModel:
    """The control for :func:`finetune_student`: the same steps (frames, optimiser, seed)
    on a model that sees the whole frame (e.g. a copy of the teacher), so that labelled
    whole-frame training is not credited to LookWhere alone."""
    return _finetune(
        seg, pool, k_ratios, iters, log, lambda x, r: seg(x), 'whole finetune', seed=seed
    )


def whole_frame_teacher(
    teacher: SegModel, pool, iters: int, log, path: str = '', task: Task = CITYSCAPES
) -> SegModel:
    """The crop-trained ``teacher`` trained ``iters`` more steps on whole frames of ``pool``
    (:func:`_finetune`'s steps with a fixed seed of their own, independent of the study's
    ratios and ``seed``), so that it has seen full-resolution frames before it teaches;
    cached at ``path`` like the teacher (``''``: no cache)."""
    return _cached_teacher(
        path,
        lambda: _finetune(
            teacher,
            pool,
            [1.0],
            iters,
            log,
            lambda x, r: teacher(x),
            'teacher whole-frame',
            seed=10,
        ),
        log,
        'whole-frame teacher',
        task,
    )


def _finetune(
    seg: SegModel, pool, k_ratios, iters: int, log, forward, tag: str = 'finetune', seed: int = 0
):
    params = [p for p in seg.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.01)
    gen = torch.Generator().manual_seed(2 + 100 * seed)
    seg.train()
    t0 = time.perf_counter()
    for it in range(iters):
        imgs, labs = pool[int(torch.randint(len(pool), (1,), generator=gen))]
        i = torch.randint(imgs.shape[0], (2,), generator=gen)
        r = float(k_ratios[int(torch.randint(len(k_ratios), (1,), generator=gen))])
        loss = F.cross_entropy(forward(imgs[i], r), labs[i], ignore_index=255)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if it % 25 == 0 or it == iters - 1:
            log(
                f'{tag} iter {it + 1}/{iters} loss {loss.item():.3f} '
                f'({(time.perf_counter() - t0) / (it + 1):.2f} s/step)'
            )
    return seg.eval()


def slide_logits(
    model: SegModel, x: torch.Tensor, stride: int = 96, crop: int = CROP
) -> torch.Tensor:
    """mmseg-style sliding windows of the training crop: logits averaged where they
    overlap."""
    b, _, h, w = x.shape
    out = x.new_zeros(b, model.cls.out_features, h, w)
    count = x.new_zeros(1, 1, h, w)
    ys = list(range(0, max(h - crop, 0) + 1, stride))
    xs = list(range(0, max(w - crop, 0) + 1, stride))
    if ys[-1] + crop < h:
        ys.append(h - crop)
    if xs[-1] + crop < w:
        xs.append(w - crop)
    for y0 in ys:
        for x0 in xs:
            out[:, :, y0 : y0 + crop, x0 : x0 + crop] += model(
                x[:, :, y0 : y0 + crop, x0 : x0 + crop]
            )
            count[:, :, y0 : y0 + crop, x0 : x0 + crop] += 1
    return out / count


def resized_size(size: Tuple[int, int], k_ratio: float, patch: int) -> Tuple[int, int]:
    """The frame size with about ``k_ratio`` of ``size``'s patches: each side times
    ``sqrt(k_ratio)``, rounded to a multiple of ``patch`` (at least one patch)."""
    scale = math.sqrt(k_ratio)
    return tuple(max(patch, int(round(side * scale / patch)) * patch) for side in size)


def resized_logits(model: SegModel, x: torch.Tensor, k_ratio: float, patch: int) -> torch.Tensor:
    """``model`` on ``x`` shrunk to :func:`resized_size` (box filter, ``mode='area'``), its
    patch map's logits upsampled (bilinear) to ``x``'s size: the whole frame with as many
    tokens as LookWhere keeps at ``k_ratio`` -- the baseline that asks whether the kept
    high-resolution patches beat the whole frame at a lower resolution.

    x: (B, 3, H, W) -> logits (B, C, H, W).
    """
    if not 0 < k_ratio <= 1:
        raise ValueError(f'resized_logits: k_ratio={k_ratio!r} is not in (0, 1]')
    h, w = x.shape[-2:]
    small = F.interpolate(x, size=resized_size((h, w), k_ratio, patch), mode='area')
    return model.head(model.backbone(small)[-1], (h, w))


def _measure(fn, frames: torch.Tensor, labels: torch.Tensor, repeats: int) -> Dict[str, Any]:
    from research.memory import PeakMemory, free_memory

    conf = 0
    times, peaks = [], []
    for i in range(frames.shape[0]):
        x = frames[i : i + 1]
        per = []
        for _ in range(repeats):
            logits = None
            free_memory()  # the previous pass's heap back to the OS: the rise is this pass's
            with PeakMemory('cpu') as mem:
                t0 = time.perf_counter()
                logits = fn(x)
                per.append(time.perf_counter() - t0)
            peaks.append(mem.rise_mb)
        times.append(statistics.median(per))
        conf += _confusion(logits, labels[i : i + 1])
    return {
        'miou': round(miou(conf), 2),
        'class_iou': class_iou(conf),
        's_per_frame': round(statistics.median(times), 4),
        'peak_rise_mb': round(max(peaks), 1),
    }


def run_study(
    sizes: Sequence[Tuple[int, int]],
    k_ratios: Sequence[float],
    train_iters: int = 300,
    distill_iters: int = 150,
    finetune_iters: int = 60,
    test_frames: int = 2,
    repeats: int = 2,
    threads: int = 2,
    out_dir: str = 'docs',
    name: str = 'lookwhere_study',
    command: str = '',
    task: str = 'cityscapes',
    selector_target: str = 'attn',
    coverage: float = 0.0,
    cache_dir: str = '',
    fill: str = 'nearest',
    finetune_teacher: bool = False,
    seed: int = 0,
    teacher_whole_iters: int = 0,
    train_frames: int = 16,
    selector_input: Optional[Tuple[int, int]] = None,
) -> Dict[str, Any]:
    """Run the study (see the module docstring) on ``task`` (a key of :data:`TASKS`);
    writes ``OUT_DIR/NAME.json`` and ``OUT_DIR/NAME.png`` and returns the results.
    ``selector_target`` / ``coverage``: the selector's distillation target and the
    lattice share of the kept set (:func:`lookhere_dense.lookwhere.distill.distillation_losses`);
    ``cache_dir``: keep the trained teacher's state dict there and reuse it (same task,
    sizes and ``train_iters``: the same seeded teacher); ``fill``: the student's dense fill
    (:data:`lookhere_dense.lookwhere.fill.FILL_MODES`), used in distillation, fine-tuning
    and evaluation; ``finetune_teacher``: also fine-tune a copy of the teacher on the
    whole frames with the student's fine-tuning steps (:func:`finetune_whole`) and evaluate
    it on the whole frame (``method='whole-ft'``) and shrunk to each ``k_ratio``'s token
    count (``method='resized-ft'``), the controls for the student's labelled whole-frame
    steps; ``seed``: the student's initialisation and the order of its
    distillation and fine-tuning steps (and the control's), the teacher and the test
    frames stay the same; 0 is the seed of every earlier study; ``teacher_whole_iters``:
    train the crop-trained teacher this many more steps on whole training frames
    (:func:`whole_frame_teacher`) before anything else, so that the teacher, the student's
    start and the ``whole`` row are a model trained at full resolution (0: the crop-trained
    teacher, as in every earlier study); ``train_frames``: generated training frames at
    256x512 (fewer at larger sizes, the same pixel count, at least 2; 16 in every earlier
    study), the pool of the teacher, the distillation and the fine-tuning;
    ``selector_input``: the selector's low-resolution input ``(H, W)`` (None: the task's,
    64x128 for the Cityscapes frames), a multiple of the patch size."""
    if teacher_whole_iters < 0:
        raise ValueError(f'LookWhere study: teacher_whole_iters={teacher_whole_iters!r} < 0')
    if train_frames < 2:
        raise ValueError(f'LookWhere study: train_frames={train_frames!r} < 2')
    if seed < 0:
        raise ValueError(f'LookWhere study: seed={seed!r} < 0')
    from research.reporting import figure, write_json

    if task not in TASKS:
        raise ValueError(f'LookWhere study: task={task!r} is not one of {sorted(TASKS)}')
    if fill not in FILL_MODES:
        raise ValueError(f'LookWhere study: fill={fill!r} is not one of {list(FILL_MODES)}')
    torch.set_num_threads(threads)
    start = time.time()

    def log(msg: str) -> None:
        print(f'[{time.time() - start:7.1f}s] {msg}', flush=True)

    spec = TASKS[task]
    if selector_input is not None:
        patch = spec.trunk['patch_size']
        h, w = (int(v) for v in selector_input)
        if h < patch or w < patch or h % patch or w % patch:
            raise ValueError(
                f'LookWhere study: selector_input={tuple(selector_input)!r} is not a '
                f'multiple of the {patch} px patch'
            )
        spec = dataclasses.replace(spec, selector_input=(h, w))
    sizes = [tuple(s) for s in sizes]
    n = train_frames
    counts = {s: max(2, min(n, n * 256 * 512 // (s[0] * s[1]))) for s in sizes}
    pool = [_frames(s, counts[s], seed=100 + i, task=spec) for i, s in enumerate(sizes)]
    log(f'training frames: {[(s, counts[s]) for s in sizes]}')
    tag = '_'.join(f'{h}x{w}' for h, w in sizes)
    cached = (
        os.path.join(
            cache_dir,
            f'teacher_{task}_{tag}_{train_iters}'
            + ('' if train_frames == 16 else f'_frames{train_frames}')
            + '.sd.pt',
        )
        if cache_dir
        else ''
    )
    teacher = load_or_train_teacher(cached, lambda: pool, train_iters, log, spec)
    small_pool = [p for p, s in zip(pool, sizes) if s[0] * s[1] <= 256 * 512] or pool[:1]
    if teacher_whole_iters:
        teacher = whole_frame_teacher(
            teacher,
            small_pool,
            teacher_whole_iters,
            log,
            cached.replace('.sd.pt', f'_whole{teacher_whole_iters}.sd.pt') if cached else '',
            spec,
        )
    student = distill_student(
        teacher,
        [frames for frames, _ in small_pool],
        k_ratios,
        distill_iters,
        log,
        spec,
        selector_target,
        coverage,
        fill,
        seed,
    )
    seg_student = SegModel(student, spec.trunk['embed_dims'], spec.num_classes)
    seg_student.norm = copy.deepcopy(teacher.norm)
    seg_student.cls = copy.deepcopy(teacher.cls)
    if finetune_iters:
        finetune_student(seg_student, small_pool, k_ratios, finetune_iters, log, seed)
    teacher_ft = None
    if finetune_teacher and finetune_iters:
        teacher_ft = finetune_whole(
            copy.deepcopy(teacher), small_pool, k_ratios, finetune_iters, log, seed
        )
    rows: List[Dict[str, Any]] = []
    with torch.inference_mode():
        for j, size in enumerate(sizes):
            frames, labels = _frames(size, test_frames, seed=900 + j, task=spec)
            cases = (
                [('whole', None)]
                + [('whole-ft', None)] * (teacher_ft is not None)
                + [('slide', None)]
                + [('resized', r) for r in k_ratios]
                + [('resized-ft', r) for r in k_ratios if teacher_ft is not None]
                + [('lookwhere', r) for r in k_ratios]
            )
            for method, ratio in cases:
                if method == 'whole-ft':

                    def fn(x):
                        return teacher_ft(x)
                elif method == 'slide':

                    def fn(x):
                        return slide_logits(teacher, x, spec.stride, spec.crop)
                elif method == 'whole':

                    def fn(x):
                        return teacher(x)
                elif method in ('resized', 'resized-ft'):
                    model = teacher if method == 'resized' else teacher_ft

                    def fn(x, r=ratio, model=model):
                        return resized_logits(model, x, r, spec.trunk['patch_size'])
                else:

                    def fn(x, r=ratio):
                        return seg_student(x, k_ratio=r)

                res = _measure(fn, frames, labels, repeats)
                row = dict(size=f'{size[0]}x{size[1]}', method=method, k_ratio=ratio, **res)
                if method in ('resized', 'resized-ft'):
                    small = resized_size(size, ratio, spec.trunk['patch_size'])
                    row['resized_to'] = f'{small[0]}x{small[1]}'
                if method == 'lookwhere':
                    row['attention_path'] = student.last_backend
                rows.append(row)
                log(str(row))
    for row in rows:
        whole = next(r for r in rows if r['size'] == row['size'] and r['method'] == 'whole')
        row['speedup_vs_whole'] = round(whole['s_per_frame'] / row['s_per_frame'], 2)
        row['miou_minus_whole'] = round(row['miou'] - whole['miou'], 2)
    results = {
        'command': command,
        'threads': threads,
        'task': task,
        'teacher': dict(
            spec.trunk,
            head='LayerNorm + Linear',
            train_iters=train_iters,
            crop=spec.crop,
            whole_frame_iters=teacher_whole_iters,
            train_frames={f'{h}x{w}': c for (h, w), c in counts.items()},
        ),
        'student': dict(
            selector=f'3 blocks, 192 dims, {spec.selector_input[0]}x{spec.selector_input[1]} input',
            extractor='copy of the teacher trunk',
            distill_iters=distill_iters,
            finetune_iters=finetune_iters,
            fill=fill,
            finetune_teacher=bool(finetune_teacher and finetune_iters),
            selector_target=selector_target,
            coverage=coverage,
            seed=seed,
        ),
        'test_frames_per_size': test_frames,
        'repeats': repeats,
        'rows': rows,
        'wall_s': round(time.time() - start, 1),
    }
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, f'{name}.json'), results)
    with figure(
        os.path.join(out_dir, f'{name}.png'),
        figsize=(7, 4.5),
        title=f'LookWhere vs whole frame / resized / sliding windows ({task} frames)',
    ) as (_, ax):
        markers = {
            'whole': 'o',
            'whole-ft': 'D',
            'resized': 'v',
            'resized-ft': '<',
            'slide': 's',
            'lookwhere': '^',
        }
        for size in sizes:
            key = f'{size[0]}x{size[1]}'
            sub = [r for r in rows if r['size'] == key]
            line = ax.plot(
                [r['s_per_frame'] for r in sub if r['method'] == 'lookwhere'],
                [r['miou'] for r in sub if r['method'] == 'lookwhere'],
                '-',
                alpha=0.5,
            )[0]
            ax.plot(
                [r['s_per_frame'] for r in sub if r['method'] == 'resized'],
                [r['miou'] for r in sub if r['method'] == 'resized'],
                ':',
                alpha=0.5,
                color=line.get_color(),
            )
            for r in sub:
                ax.scatter(
                    r['s_per_frame'],
                    r['miou'],
                    marker=markers[r['method']],
                    color=line.get_color(),
                )
                label = (
                    r['method']
                    if r['k_ratio'] is None
                    else f'{"k=" if r["method"] == "lookwhere" else r["method"] + " k="}{r["k_ratio"]}'
                )
                ax.annotate(f'{key} {label}', (r['s_per_frame'], r['miou']), fontsize=6)
        ax.set_xscale('log')
        ax.set_xlabel('seconds per frame (CPU, log scale)')
        ax.set_ylabel('mIoU')
    log(f'wrote {out_dir}/{name}.json and .png')
    return results


def summarize(
    runs: Sequence[Dict[str, Any]],
    size: str = '1024x2048',
    k_ratio: float = 0.25,
    names: Sequence[str] = (),
    class_id: Optional[int] = None,
) -> Tuple[List[Dict[str, Any]], str]:
    """One line per study result (:func:`run_study`'s dicts, e.g. several seeds) at one frame
    ``size`` and ``k_ratio``: the training frames, the seed, the whole frame, the control,
    the resized whole frame and LookWhere at ``k_ratio``, LookWhere's gaps to the whole
    frame and to the control, and its speed-up; then the mean, closest and farthest gap to
    the whole frame over the runs. ``names``: one per run (e.g. its file), the first
    column; default: ``run 1``, ``run 2``, ...; ``class_id``: also that class's IoU in the
    whole frame, the resized frame and LookWhere (``-`` where a run did not record it).

    Returns:
        ``(lines, markdown)``: the lines as dicts (``None`` where a run has no such row)
        and a Markdown table of them with the gap statistics below it.
    """
    if not runs:
        raise ValueError('LookWhere summary: no study results given')
    names = list(names) or [f'run {i + 1}' for i in range(len(runs))]
    if len(names) != len(runs):
        raise ValueError(f'LookWhere summary: {len(names)} names for {len(runs)} runs')
    lines = []
    for name, res in zip(names, runs):
        if not (
            isinstance(res, dict)
            and {'rows', 'teacher', 'student'} <= set(res)
            and all(
                {'size', 'method', 'k_ratio', 'miou', 's_per_frame'} <= set(r) for r in res['rows']
            )
        ):
            raise ValueError(
                f'LookWhere summary: {name} is not a study result (needs "rows" with size, '
                'method, k_ratio, miou and s_per_frame, "teacher" and "student")'
            )
        rows = [r for r in res['rows'] if r['size'] == size]
        if not rows:
            raise ValueError(f'LookWhere summary: {name} has no rows at {size}')

        def pick(method, ratio=None, rows=rows):
            return next((r for r in rows if r['method'] == method and r['k_ratio'] == ratio), None)

        lw = pick('lookwhere', k_ratio)
        if lw is None:
            raise ValueError(
                f'LookWhere summary: {name} has no LookWhere row at {size}, k_ratio {k_ratio}'
            )
        whole, ft, small = pick('whole'), pick('whole-ft'), pick('resized', k_ratio)
        small_ft = pick('resized-ft', k_ratio)
        frames = res['teacher'].get('train_frames', {})
        lines.append(
            dict(
                run=name,
                train_frames=max(frames.values()) if frames else None,
                seed=res['student'].get('seed', 0),
                whole=whole['miou'],
                whole_ft=ft and ft['miou'],
                resized=small and small['miou'],
                resized_ft=small_ft and small_ft['miou'],
                lookwhere=lw['miou'],
                gap=round(lw['miou'] - whole['miou'], 2),
                gap_ft=ft and round(lw['miou'] - ft['miou'], 2),
                speedup=round(whole['s_per_frame'] / lw['s_per_frame'], 2),
            )
        )
        if class_id is not None:
            for key, row in (('whole', whole), ('resized', small), ('lookwhere', lw)):
                iou = (row or {}).get('class_iou') or {}
                # JSON keys are strings, run_study's dicts have ints
                lines[-1][f'class_{key}'] = iou.get(class_id, iou.get(str(class_id)))

    def cell(v):
        return '-' if v is None else f'{v:.2f}' if isinstance(v, float) else f'{v}'

    columns = [
        ('run', 'run'),
        ('train_frames', 'train frames'),
        ('seed', 'seed'),
        ('whole', 'whole'),
        ('whole_ft', 'whole-ft'),
        ('resized', f'resized {k_ratio}'),
        ('resized_ft', f'resized-ft {k_ratio}'),
        ('lookwhere', f'LookWhere {k_ratio}'),
        ('gap', 'gap'),
        ('gap_ft', 'gap to whole-ft'),
        ('speedup', 'whole time / time'),
    ]
    if class_id is not None:
        columns += [
            ('class_whole', f'class {class_id}: whole'),
            ('class_resized', 'resized'),
            ('class_lookwhere', 'LookWhere'),
        ]
    keys = [k for k, _ in columns]
    md = ['| ' + ' | '.join(t for _, t in columns) + ' |', '|' + '---|' * len(columns)]
    for ln in lines:
        md.append('| ' + ' | '.join(cell(ln[k]) for k in keys) + ' |')
    gaps = [ln['gap'] for ln in lines]
    md.append('')
    md.append(
        f'{size}, k_ratio {k_ratio}, {len(gaps)} run(s): gap to the whole frame mean '
        f'{statistics.mean(gaps):.2f}, closest {max(gaps):.2f}, farthest {min(gaps):.2f}'
    )
    return lines, '\n'.join(md)


def run_timing(
    size: Tuple[int, int] = (1024, 2048),
    k_ratios: Sequence[float] = (0.25,),
    rounds: int = 3,
    threads: int = 2,
) -> List[Dict[str, Any]]:
    """Time the study's architectures (untrained: time does not depend on the weights) on
    one frame of ``size``: whole frame vs LookWhere per ``k_ratio``, interleaved in each of
    ``rounds`` rounds (so load from other jobs hits every case alike); per case the median
    and the per-round ratio to the whole frame's time of that round (median)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    teacher = create_model(**TRUNK, img_size=CROP).eval()
    trunk = copy.deepcopy(teacher)
    student = LookWhere(
        selector=dict(input_size=(64, 128), embed_dims=192, num_layers=3, num_heads=12),
        extractor=LookWhereExtractor(trunk),
    ).eval()
    x = torch.randn(1, 3, *size)
    times: Dict[str, List[float]] = {'whole': [], **{f'k={r}': [] for r in k_ratios}}
    with torch.inference_mode():
        teacher(x), student(x, k_ratio=k_ratios[0])  # warm-up (caches, kernel build)
        for _ in range(rounds):
            t0 = time.perf_counter()
            teacher(x)
            times['whole'].append(time.perf_counter() - t0)
            for r in k_ratios:
                t0 = time.perf_counter()
                student(x, k_ratio=r)
                times[f'k={r}'].append(time.perf_counter() - t0)
    rows = []
    for name, ts in times.items():
        ratios = [w / t for w, t in zip(times['whole'], ts)]
        rows.append(
            dict(
                case=name,
                size=f'{size[0]}x{size[1]}',
                median_s=round(statistics.median(ts), 3),
                speedup_vs_whole=round(statistics.median(ratios), 2),
                backend=student.last_backend if name != 'whole' else teacher.lookhere.last_backend,
            )
        )
    return rows


def run_extractor_memory(
    size: Tuple[int, int] = (1024, 2048),
    k_ratio: float = 0.25,
    paths: Sequence[str] = ('sdpa-coords', 'chunked-coords'),
    rounds: int = 3,
    threads: int = 2,
    block_rows: int = 0,
) -> List[Dict[str, Any]]:
    """Peak memory and time of one LookWhere extractor forward (the study's trunk: 192
    dims, 6 blocks, 12 heads, lh180, patch 16, untrained; no selector, no fill) on a
    random kept set of ``ceil(k_ratio * N)`` patches of one ``size`` frame, per attention
    ``path`` (:data:`lookhere_dense.lookwhere.subset.SUBSET_BACKENDS`), interleaved in each
    of ``rounds`` rounds. Memory: the rise of the process's peak RSS during the pass (heap
    returned to the OS before each, :class:`research.memory.PeakMemory`); per path the
    median time, the largest and the median rise, and the largest output difference to
    the first path."""
    from lookhere_dense.lookwhere.select import resolve_k
    from research.memory import PeakMemory, free_memory

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    trunk = create_model(**TRUNK, img_size=CROP).eval()
    extractor = LookWhereExtractor(trunk, subset_block_rows=block_rows or None)
    grid = extractor.grid_of(size)
    n = grid[0] * grid[1]
    k = resolve_k(n, k_ratio=k_ratio)
    keep = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:k].sort().values[None]
    x = torch.randn(1, 3, *size)
    times: Dict[str, List[float]] = {p: [] for p in paths}
    rises: Dict[str, List[float]] = {p: [] for p in paths}
    ran: Dict[str, str] = {}
    first: Dict[str, torch.Tensor] = {}
    diff: Dict[str, float] = {}
    with torch.inference_mode():
        extractor(x, keep, None, paths[0])  # warm-up
        for _ in range(rounds):
            for path in paths:
                out = None
                free_memory()
                with PeakMemory('cpu') as mem:
                    t0 = time.perf_counter()
                    out = extractor(x, keep, None, path)[0][-1]
                    times[path].append(time.perf_counter() - t0)
                rises[path].append(mem.rise_mb)
                ran[path] = str(extractor.last_backend)
                first.setdefault(path, out)
                diff[path] = float((out - first[paths[0]]).abs().max())
                del out
    dense_mb = TRUNK['num_heads'] * (k + 1) ** 2 * 4 / 2**20  # float32, + the CLS
    return [
        dict(
            path=p,
            ran=ran[p],
            size=f'{size[0]}x{size[1]}',
            k_ratio=k_ratio,
            kept=k,
            dense_bias_mb_per_layer=round(dense_mb, 1),
            median_s=round(statistics.median(times[p]), 3),
            peak_rise_mb_max=round(max(rises[p]), 1),
            peak_rise_mb_median=round(statistics.median(rises[p]), 1),
            max_abs_diff_to_first=diff[p],
        )
        for p in paths
    ]
