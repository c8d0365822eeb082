"""Why LookWhere's dense accuracy is low: cheap oracle measurements on the study's teacher
and distilled student (:mod:`.study`).

For each frame size and ``k_ratio``, mIoU of the teacher's head on a dense map made by
the **nearest-kept fill** (:func:`lookhere_dense.lookwhere.nearest_fill`) of:

* ``oracle`` rows -- the teacher's own *whole-frame* features at the kept patches (no
  extractor: the best the fill alone can do with that kept set);
* ``extractor`` rows -- the distilled student's extractor run on the kept set only
  (selector prefix, no fine-tuning), i.e. what the study measures, by kept set; with
  ``distill_iters=0`` the teacher's own trunk run on the kept set (its own CLS), i.e. the
  extractor before any distillation;

with the kept set chosen by (``select``):

* ``teacher-attn`` -- top-k of the teacher's CLS attention (the distillation target);
* ``selector`` -- top-k of the distilled selector's scores (only with a student);
* ``random`` -- uniformly at random (seeded);
* ``grid`` -- a regular lattice (coverage only;
  :func:`lookhere_dense.lookwhere.lattice_patches`);
* ``boundary`` -- top-k of the teacher's feature change to its 4 neighbours
  (:func:`lookhere_dense.lookwhere.distill.boundary_map`);
* ``grid+boundary`` -- half the budget on the lattice, the rest on the boundary score.

Everything at smoke scale, reusing :func:`.study.train_teacher` / :func:`.study.distill_student`
(seeded; the teacher and student are cached under ``cache_dir`` so later runs skip
training).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

import torch
from torch import Tensor

from lookhere_dense.lookwhere import (
    LookWhere,
    LookWhereExtractor,
    lattice_patches,
    nearest_fill,
    top_k_patches,
    top_k_with_coverage,
)
from lookhere_dense.lookwhere.distill import boundary_map, teacher_targets

__all__ = ['SELECTIONS', 'run_diagnosis', 'kept_picture']

SELECTIONS = ('teacher-attn', 'selector', 'random', 'grid', 'boundary', 'grid+boundary')


def _keep(select: str, k: int, grid, t_attn, sel_scores, t_feats, gen: torch.Generator) -> Tensor:
    b, n = t_attn.shape
    if select == 'teacher-attn':
        return top_k_patches(t_attn, k)
    if select == 'selector':
        return top_k_patches(sel_scores, k)
    if select == 'random':
        return top_k_patches(torch.rand(b, n, generator=gen), k)
    if select == 'grid':
        return lattice_patches(grid, k)[None].expand(b, -1).sort(-1).values
    bnd = boundary_map(t_feats)
    if select == 'boundary':
        return top_k_patches(bnd, k)
    if select == 'grid+boundary':
        return top_k_with_coverage(bnd, k, grid, 0.5)
    raise ValueError(f'unknown selection {select!r}; one of {list(SELECTIONS)}')


def run_diagnosis(
    sizes: Sequence[Tuple[int, int]],
    k_ratios: Sequence[float],
    train_iters: int = 200,
    distill_iters: int = 100,
    test_frames: int = 2,
    threads: int = 2,
    cache_dir: str = 'work_dirs/lookwhere_cache',
    log: Callable[[str], None] = print,
    extractor_max_patches: int = 2048,
    picture: str = '',
) -> Dict[str, Any]:
    """Train (or load) the study's teacher and student, then measure every
    (size, k_ratio, select, source) cell; returns ``{'rows': [...], ...}``. Grids of more
    than ``extractor_max_patches`` patches get the oracle rows only (for time).
    ``picture``: a PNG of the kept sets on the first frame of the first size
    (:func:`kept_picture`, ``k_ratio`` 0.25)."""

    from .study import (
        TRUNK,
        SegModel,
        _confusion,
        _frames,
        distill_student,
        load_or_train_teacher,
        miou,
    )

    torch.set_num_threads(threads)
    start = time.time()
    train_sizes = [(256, 512), (512, 1024), (1024, 2048)]
    os.makedirs(cache_dir, exist_ok=True)
    t_path = os.path.join(cache_dir, f'teacher_{train_iters}.sd.pt')  # state dicts
    s_path = os.path.join(cache_dir, f'student_{train_iters}_{distill_iters}.sd.pt')
    counts = {s: max(2, min(16, 16 * 256 * 512 // (s[0] * s[1]))) for s in train_sizes}
    pool: list = []

    def make_pool() -> list:  # the training frames, drawn only when something trains
        if not pool:
            pool.extend(_frames(s, counts[s], seed=100 + i) for i, s in enumerate(train_sizes))
        return pool

    teacher = load_or_train_teacher(t_path, make_pool, train_iters, log)
    if not distill_iters:  # no student: the teacher's trunk is the extractor, no selector
        student = LookWhere(
            selector=dict(input_size=(32, 64), embed_dims=48, num_layers=1, num_heads=12),
            extractor=LookWhereExtractor(teacher.backbone),
            use_selector_prefix=False,
        ).eval()
    elif os.path.exists(s_path):
        student = distill_student(teacher, [], k_ratios, 0, log)
        student.load_state_dict(torch.load(s_path))
        student.eval()
        log(f'student from {s_path}')
    else:
        student = distill_student(teacher, [make_pool()[0][0]], k_ratios, distill_iters, log)
        torch.save(student.state_dict(), s_path)
    seg_student = SegModel(student, TRUNK['embed_dims'])
    seg_student.norm, seg_student.cls = teacher.norm, teacher.cls
    selections = [s for s in SELECTIONS if distill_iters or s != 'selector']
    rows: List[Dict[str, Any]] = []
    with torch.inference_mode():
        for j, size in enumerate(sizes):
            frames, labels = _frames(size, test_frames, seed=900 + j)
            tgt = teacher_targets(teacher.backbone, frames)
            grid = tgt['grid']
            n = grid[0] * grid[1]
            t_feats = teacher.backbone(frames)[-1]  # (B, D, H, W), the whole frame
            whole = teacher.head(t_feats, size)
            conf = _confusion(whole, labels)
            rows.append(
                dict(size=f'{size[0]}x{size[1]}', source='whole', select='all', k_ratio=1.0)
            )
            rows[-1]['miou'] = round(miou(conf), 2)
            log(str(rows[-1]))
            sel_scores = student.selector(frames, grid)['scores'] if distill_iters else None
            tokens = t_feats.flatten(2).transpose(1, 2)  # (B, N, D)
            if picture and j == 0:
                keeps = {}
                k = max(1, math.ceil(0.25 * n))
                for select in selections:
                    gen = torch.Generator().manual_seed(0)
                    keep = _keep(select, k, grid, tgt['attn'], sel_scores, t_feats, gen)
                    keeps[select] = keep[0]
                kept_picture(picture, frames[0], labels[0], grid, keeps)
                log(f'wrote {picture}')
            for ratio in k_ratios:
                k = max(1, math.ceil(ratio * n))
                gen = torch.Generator().manual_seed(0)
                for select in selections:
                    keep = _keep(select, k, grid, tgt['attn'], sel_scores, t_feats, gen)
                    vals = tokens.gather(1, keep[..., None].expand(-1, -1, tokens.shape[-1]))
                    oracle = teacher.head(nearest_fill(vals, keep, grid), size)
                    cases = [('oracle', oracle)]
                    if n <= extractor_max_patches:
                        cases.append(('extractor', seg_student(frames, keep=keep)))
                    for source, logits in cases:
                        conf = _confusion(logits, labels)
                        rows.append(
                            dict(
                                size=f'{size[0]}x{size[1]}',
                                source=source,
                                select=select,
                                k_ratio=ratio,
                                miou=round(miou(conf), 2),
                            )
                        )
                        log(str(rows[-1]))
    return {'rows': rows, 'wall_s': round(time.time() - start, 1)}


def kept_picture(
    path: str, image: Tensor, label: Tensor, grid: Tuple[int, int], keeps: Dict[str, Tensor]
) -> None:
    """The frame, its labels and, per selection, the kept patches (white) on the grid."""
    import numpy as np

    from research.reporting import figure

    from .study import MEAN, STD

    panels = 2 + len(keeps)
    cols = 2
    rows = -(-panels // cols)
    with figure(path, rows, cols, figsize=(8, 1.6 * rows + 0.4), squeeze=False) as (_, axes):
        rgb = (image[None] * STD + MEAN)[0].permute(1, 2, 0).clamp(0, 255).byte().numpy()
        axes[0][0].imshow(rgb)
        axes[0][0].set_title('frame', fontsize=8)
        lab = np.ma.masked_equal(label.numpy(), 255)  # ignored pixels blank
        axes[0][1].imshow(lab, cmap='tab20', vmin=0, vmax=19, interpolation='nearest')
        axes[0][1].set_title('labels', fontsize=8)
        for i, (name, keep) in enumerate(keeps.items()):
            mask = torch.zeros(grid[0] * grid[1])
            mask[keep] = 1
            ax = axes[(i + 2) // cols][(i + 2) % cols]
            ax.imshow(mask.view(*grid).numpy(), cmap='gray', interpolation='nearest')
            ax.set_title(f'kept by {name} (k_ratio 0.25)', fontsize=8)
        for i, row in enumerate(axes):
            for jj, ax in enumerate(row):
                ax.set_xticks([])
                ax.set_yticks([])
                if i * cols + jj >= panels:
                    ax.axis('off')
