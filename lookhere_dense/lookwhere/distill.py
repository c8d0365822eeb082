"""What-where distillation (LookWhere, arXiv 2505.18051): a frozen teacher ViT tells the
selector where to look (a map over the patches) and the extractor what to see
(its patch and CLS features). No labels. Torch alone.

Losses (:func:`distillation_losses`):

* ``loss_selector`` -- ``KL(teacher map || softmax(selector scores))`` over the patches
  of the high-resolution grid; the teacher map (``selector_target``) is either
  ``'attn'``: the last block's attention of the CLS query to the patch keys, averaged
  over heads and renormalised over the patches (the CLS row of LookHere carries no bias,
  so this is the plain content attention; not the official pre-training's target, the
  last block's attention logits averaged over heads and the patch queries), or
  ``'boundary'``: where the teacher's final patch features change, :func:`boundary_map` (for dense prediction: the
  patches a nearest-kept fill gets wrong; ``docs/lookwhere.md``, the diagnosis);
* ``loss_extractor`` -- mean squared error of the student's dense map (every patch,
  after the fill) against the teacher's final patch features, plus that of the
  extractor's first prefix token against the teacher's CLS.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
import torch.nn.functional as F
from torch import Tensor

from .select import top_k_with_coverage

__all__ = ['teacher_targets', 'distillation_losses', 'boundary_map', 'SELECTOR_TARGETS']

#: what the selector learns to predict
SELECTOR_TARGETS = ('attn', 'boundary')


def boundary_map(features: Tensor) -> Tensor:
    """Where the content changes: ``(B, D, H, W)`` -> ``(B, H*W)``, each patch's summed L2
    feature change to its 4 neighbours (none across the border), normalised to sum 1 per
    image (uniform for a constant map)."""
    f = features.float()
    score = f.new_zeros(f.shape[0], *f.shape[-2:])
    dy = (f[:, :, 1:] - f[:, :, :-1]).norm(dim=1)
    dx = (f[:, :, :, 1:] - f[:, :, :, :-1]).norm(dim=1)
    score[:, 1:] += dy
    score[:, :-1] += dy
    score[:, :, 1:] += dx
    score[:, :, :-1] += dx
    score = score.flatten(1) + 1e-12
    return score / score.sum(-1, keepdim=True)


@torch.no_grad()
def teacher_targets(teacher, images: Tensor) -> Dict[str, Tensor]:
    """The teacher's attention map and features for ``images``.

    Args:
        teacher: a :class:`~lookhere_dense.lookhere.LookHereVisionTransformer` with a CLS
            token (global blocks).
        images: ``(B, C, H, W)``.

    Returns:
        dict: ``attn`` and ``boundary`` (:func:`boundary_map`) ``(B, N)`` (each sums to
        1 per image), ``features`` ``(B, N, D)``, ``cls`` ``(B, D)``, ``grid`` ``(H, W)``.
    """
    if not teacher.with_cls_token:
        raise ValueError(
            'LookWhere distillation: the teacher needs a CLS token (with_cls_token=True)'
        )
    last = teacher.blocks[-1]
    if last.window_size:
        raise ValueError("LookWhere distillation: the teacher's last block must be global")
    captured = {}
    handle = last.norm1.register_forward_hook(lambda m, i, o: captured.setdefault('h', o))
    try:
        tokens = teacher.forward_features(images)
    finally:
        handle.remove()
    h = captured['h']  # (B, T, D): the input of the last attention
    attn = last.attn
    b, t, d = h.shape
    heads, hd = attn.num_heads, attn.head_dim
    qkv = attn.qkv(h).reshape(b, t, 3, heads, hd)
    q_cls, keys = qkv[:, 0, 0], qkv[:, :, 1]  # (B, heads, hd), (B, T, heads, hd)
    logits = torch.einsum('bhd,bthd->bht', q_cls, keys) * hd**-0.5
    j = teacher.num_prefix_tokens
    probs = logits.softmax(-1)[:, :, j:].mean(1)  # (B, N)
    probs = probs / probs.sum(-1, keepdim=True)
    p = teacher.patch_size
    grid = (-(-images.shape[-2] // p), -(-images.shape[-1] // p))
    feats = tokens[:, j:]
    fmap = feats.transpose(1, 2).reshape(b, d, *grid)
    return {
        'attn': probs,
        'boundary': boundary_map(fmap),
        'features': feats,
        'cls': tokens[:, 0],
        'grid': grid,
    }


def distillation_losses(
    student,
    images: Tensor,
    targets: Dict[str, Any],
    select_by: str = 'teacher',
    selector_weight: float = 1.0,
    extractor_weight: float = 1.0,
    selector_target: str = 'attn',
) -> Dict[str, Tensor]:
    """The two losses of one batch (see the module docstring).

    Args:
        student: a :class:`~lookhere_dense.lookwhere.LookWhere` whose extractor has the
            teacher's patch size (the same high-resolution grid) and width (its
            ``embed_dims``; others: ValueError naming both).
        images: ``(B, C, H, W)``.
        targets: :func:`teacher_targets` of ``images``.
        select_by: ``'teacher'`` (top-k of the teacher's map) or ``'selector'``.
        selector_weight, extractor_weight: loss weights.
        selector_target: ``'attn'`` or ``'boundary'`` (the module docstring); the
            teacher's kept set (``select_by='teacher'``) is the top-k of the same map,
            with the student's ``coverage`` share on a lattice. Default: ``'attn'``.

    Returns:
        ``{'loss_selector': ..., 'loss_extractor': ...}`` (weighted).
    """
    grid = student.extractor.grid_of(images.shape[-2:])
    if tuple(grid) != tuple(targets['grid']):
        raise ValueError(
            f'LookWhere distillation: the student grid {grid} differs from the teacher '
            f'grid {targets["grid"]} (use the same patch size)'
        )
    trunk = student.extractor.trunk
    if max(trunk.out_indices) != len(trunk.blocks) - 1:
        raise ValueError(
            f'LookWhere distillation: the extractor out_indices {trunk.out_indices} must '
            f'include the last block ({len(trunk.blocks) - 1}), whose output is distilled'
        )
    if selector_target not in SELECTOR_TARGETS:
        raise ValueError(
            f'LookWhere distillation: selector_target={selector_target!r} is not one of '
            f'{list(SELECTOR_TARGETS)}'
        )
    width = targets['features'].shape[-1]
    if width != trunk.embed_dims:
        raise ValueError(
            f"LookWhere distillation: the teacher's features are {width} wide, the "
            f"student's extractor embed_dims={trunk.embed_dims}: build the extractor with "
            f"the teacher's width (embed_dims={width})"
        )
    n = grid[0] * grid[1]
    k = student.resolve_k(n)
    sel = student.run_selector(images, grid)
    log_p = F.log_softmax(sel['scores'].float(), -1)
    target = targets[selector_target].float()
    loss_sel = F.kl_div(log_p, target, reduction='batchmean')
    source = target if select_by == 'teacher' else sel['scores']
    keep = top_k_with_coverage(source, k, grid, getattr(student, 'coverage', 0.0))
    out = student.forward_tokens(images, keep=keep, selection=sel)
    last = out['tokens'][-1]
    dense = student.densify(last, out['num_prefix'], keep, grid)  # (B, D, H, W)
    feats = targets['features'].transpose(1, 2).reshape(dense.shape)
    loss_ext = F.mse_loss(dense, feats)
    if out['num_prefix']:
        loss_ext = loss_ext + F.mse_loss(last[:, 0], targets['cls'])
    return {
        'loss_selector': selector_weight * loss_sel,
        'loss_extractor': extractor_weight * loss_ext,
    }
