"""``LookWhereViT``: the LookWhere backbone for mmseg / mmdet, and ``LookWhereDistiller``,
the what-where distillation model for mmengine's Runner.

Both are thin wrappers of the torch-only :mod:`lookhere_dense.lookwhere`:

* ``LookWhereViT`` is :class:`~lookhere_dense.lookwhere.LookWhere` + ``BaseModule``
  (``init_cfg`` loading, e.g. a distilled student with ``prefix='student.'``); it returns a
  tuple of NCHW maps of every patch, so Segmenter heads and SimpleFPN take it unchanged.
  ``k`` / ``k_ratio`` can be changed per call (``backbone(images, k_ratio=0.1)``) or on the
  module (``model.backbone.k_ratio = 0.1``).
* ``LookWhereDistiller`` holds a frozen LookHere teacher and a LookWhere student; its
  ``loss`` is the selector's KL to the teacher's CLS attention map plus the extractor's
  error against the teacher's patch features (:mod:`lookhere_dense.lookwhere.distill`).
  Images only: no labels are read.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Union

import torch
from mmengine.model import BaseModel, BaseModule

from lookhere_dense.checkpoint import load_checkpoint_file, load_state_dict_strict
from lookhere_dense.errors import CheckpointError
from lookhere_dense.lookhere import create_model
from lookhere_dense.lookhere.weights import HEADS_KEY, vit_key_hints, vit_shape_summary
from lookhere_dense.lookwhere import LookWhere
from lookhere_dense.lookwhere.distill import SELECTOR_TARGETS, distillation_losses, teacher_targets

from ..registry import MMSEG_MODELS, register_model
from .lookhere_vit import (
    PRETRAINED_KEYS,
    pretrained_checkpoint,
    run_mmengine_inits,
    split_init_cfg,
    weights_with_prefix,
)

__all__ = ['LookWhereViT', 'LookWhereDistiller']


@register_model()
class LookWhereViT(LookWhere, BaseModule):
    """LookWhere (selector + LookHere extractor on the top-k patches) as a backbone.

    Args:
        selector (dict): :class:`~lookhere_dense.lookwhere.LookWhereSelector` arguments.
        extractor (dict): :class:`~lookhere_dense.lookwhere.LookWhereExtractor` (LookHere
            ViT) arguments, e.g. ``embed_dims``, ``num_layers``, ``num_heads``,
            ``out_indices``, ``preset``.
        k, k_ratio, fill, use_selector_prefix, freeze_selector, attn_path, coverage: see
            :class:`~lookhere_dense.lookwhere.LookWhere`. Defaults: None, None (0.25 without ``k``),
            ``'nearest'``, True, False, ``'auto'``, 0.0.
        init_cfg (dict, optional): mmengine init config, e.g.
            ``dict(type='Pretrained', checkpoint=PATH, prefix='student.')`` for the
            student of a distillation run. Default: None.
    """

    def __init__(
        self,
        selector: Optional[dict] = None,
        extractor: Optional[dict] = None,
        k: Optional[int] = None,
        k_ratio: Optional[float] = None,
        fill: str = 'nearest',
        use_selector_prefix: bool = True,
        freeze_selector: bool = False,
        attn_path: str = 'auto',
        coverage: float = 0.0,
        init_cfg: Optional[Union[dict, List[dict]]] = None,
    ):
        super().__init__(
            selector=selector,
            extractor=extractor,
            k=k,
            k_ratio=k_ratio,
            fill=fill,
            use_selector_prefix=use_selector_prefix,
            freeze_selector=freeze_selector,
            attn_path=attn_path,
            coverage=coverage,
        )
        self.init_cfg = init_cfg  # BaseModule's (its __init__ ran with None in the MRO)
        self._is_init = False

    def init_weights(self) -> None:
        """Load the ``Pretrained`` checkpoint of ``init_cfg`` strictly (mmengine's loader
        would load what fits and warn: a file of another model loaded nothing, and training
        went on from random weights), a list's ``Pretrained`` entry too, after mmengine's
        other initialisers; no ``Pretrained``: mmengine's init.

        Raises:
            ConfigError: unknown ``init_cfg`` keys, no ``checkpoint``, or two
                ``Pretrained`` entries in a list.
            CheckpointError: a file that does not fit (``strict=False`` loads what fits),
                naming the likely cause (e.g. a LookHereViT file: the extractor's
                ``pretrained``; a distillation run's: ``prefix='student.'``).
        """
        cfg, others = split_init_cfg(self.init_cfg, 'LookWhereViT')
        if others or cfg is None:
            run_mmengine_inits(self, others)
        if cfg is None:
            return
        path, ckpt = pretrained_checkpoint(cfg, 'LookWhereViT', PRETRAINED_KEYS)
        if not isinstance(ckpt, Mapping):
            ckpt = load_checkpoint_file(path)
        weights = next((ckpt[k] for k in ('state_dict', 'model') if k in ckpt), ckpt)
        load_state_dict_strict(
            self,
            weights,
            path,
            strict=cfg.get('strict', True),
            what='backbone',
            hints=_lookwhere_key_hints,
            summary=vit_shape_summary,
        )
        self._is_init = True


def _lookwhere_key_hints(missing, unexpected, model_keys, file_keys) -> List[str]:
    """:func:`~lookhere_dense.lookhere.weights.vit_key_hints`, and a LookWhere's likely
    causes first: a Runner checkpoint of a distillation run (``student.*``) or of a
    segmentor (``backbone.*``) without its ``prefix`` -- only where the keys under that
    prefix are this model's (``selector.*`` / ``extractor.*``): a LookHereViT segmentor's
    ``backbone.*`` are a plain trunk's, which ``prefix='backbone.'`` refused again; for
    those :func:`vit_key_hints` names the extractor's ``pretrained``."""
    own = set(model_keys)
    for head, what in (('student.', 'a distillation run'), ('backbone.', 'a segmentor')):
        under = {k[len(head) :] for k in file_keys if k.startswith(head)}
        if under & own and not any(k.startswith(head) for k in model_keys):
            return [f"the file is {what}'s checkpoint ({head}*): add prefix='{head}' to init_cfg"]
    return vit_key_hints(missing, unexpected, model_keys, file_keys)


def _build_teacher(teacher: Dict[str, Any]) -> torch.nn.Module:
    cfg = dict(teacher)
    checkpoint = cfg.pop('checkpoint', None)
    prefix = cfg.pop('prefix', None)
    heads = cfg.pop(HEADS_KEY, None)
    model = create_model(**cfg)
    # a teacher has no init_cfg to load loosely: its refusals say what to build instead
    model.loose_loading = (
        'a teacher takes none (strict=False would distil from random layers): build '
        'model.teacher as its file was trained'
    )
    if checkpoint is not None:
        # the trunk's strict loader (its messages: what differs and what to set; mmengine's
        # was a RuntimeError listing every key); a segmentor's file needs no prefix
        ckpt: Any = checkpoint
        if prefix:
            ckpt = weights_with_prefix(
                load_checkpoint_file(checkpoint), prefix, checkpoint, owner='model.teacher'
            )
        try:
            model.load_pretrained(
                ckpt, strict=True, checkpoint_num_heads=heads, source=str(checkpoint)
            )
        except CheckpointError as err:  # the keys to set are the teacher's
            msg = str(err).replace('model.backbone.', 'model.teacher.')
            raise CheckpointError(
                f"model.teacher: {msg} (the teacher's arguments are model.teacher.*: e.g. "
                f'model.teacher.num_layers, model.teacher.{HEADS_KEY})'
            ) from None
    for p in model.parameters():
        p.requires_grad = False
    return model.eval()


def _check_student_fits_teacher(teacher: torch.nn.Module, trunk: torch.nn.Module) -> None:
    """What the distillation loss needs of the student's extractor ``trunk`` and the
    ``teacher`` (both LookHere ViTs), checked when the distiller is built (the loss gave a
    raw reshape RuntimeError for another width): the same ``embed_dims`` (its patch
    features ``(B, N, D)`` and CLS ``(B, D)`` are the extractor's targets), ``patch_size``
    (the same high-resolution grid) and input channels (the same images). Depth and heads
    may differ: only the last block's output and the teacher's own last attention are
    used (unless ``init_extractor_from_teacher``, whose copy checks them).

    Raises:
        ValueError: naming ``model.teacher.*`` and ``model.student.extractor.*``.
    """
    pairs = (
        ('embed_dims', teacher.embed_dims, trunk.embed_dims),
        ('patch_size', teacher.patch_size, trunk.patch_size),
        (
            'in_channels',
            teacher.patch_embed.proj.in_channels,
            trunk.patch_embed.proj.in_channels,
        ),
    )
    for key, want, have in pairs:
        if want != have:
            raise ValueError(
                f'LookWhereDistiller: model.teacher.{key}={want} but '
                f'model.student.extractor.{key}={have}: the extractor learns the '
                "teacher's features on the teacher's patch grid, so the two must match "
                f'(set model.student.extractor.{key}={want}; model.teacher.* describes the '
                'teacher as its checkpoint was trained)'
            )


@MMSEG_MODELS.register_module(force=True)
class LookWhereDistiller(BaseModel):
    """What-where distillation of a LookWhere student from a frozen LookHere teacher.

    Args:
        teacher (dict): :func:`~lookhere_dense.lookhere.create_model` arguments of the
            teacher, plus ``checkpoint`` (a file, loaded strictly by the trunk's loader:
            a trained mmseg segmentor's checkpoint as it is, or with ``prefix``, e.g.
            ``'backbone.'``) -- it must have a CLS token.
        student (dict): :class:`~lookhere_dense.lookwhere.LookWhere` arguments
            (``selector``, ``extractor``, ``k_ratio``, ...).
        init_extractor_from_teacher (bool): start the extractor from the teacher's
            weights (same architecture needed; its refusals name
            ``model.student.extractor.*``). Default: True. Either way the extractor needs
            the teacher's ``embed_dims``, ``patch_size`` and input channels (checked when
            built, naming both keys).
        select_by (str): which map picks the kept patches during distillation:
            ``'teacher'`` (its attention map) or ``'selector'``. Default: ``'teacher'``.
        selector_weight, extractor_weight (float): loss weights. Default: 1, 1.
        selector_target (str): what the selector learns: ``'attn'`` (the teacher's CLS
            attention; not the official pre-training's patch-query logits) or
            ``'boundary'`` (where its features change;
            :func:`~lookhere_dense.lookwhere.distill.distillation_losses`).
            Default: ``'attn'``.
        data_preprocessor (dict): e.g. mmseg's ``SegDataPreProcessor``.
        pretrained, train_cfg (None): taken for mmseg's ``init_model``, which sets
            ``model.pretrained=None`` and ``model.train_cfg=None`` in every config it
            builds; the teacher's weights come from ``teacher.checkpoint``. Default: None.
    """

    def __init__(
        self,
        teacher: Dict[str, Any],
        student: Dict[str, Any],
        init_extractor_from_teacher: bool = True,
        select_by: str = 'teacher',
        selector_weight: float = 1.0,
        extractor_weight: float = 1.0,
        selector_target: str = 'attn',
        data_preprocessor: Optional[dict] = None,
        init_cfg: Optional[dict] = None,
        pretrained: None = None,
        train_cfg: None = None,
    ):
        teacher_weights = (
            "the teacher's weights are teacher.checkpoint, a student to start from is load_from"
        )
        unused = (
            ('pretrained', pretrained, teacher_weights),
            ('train_cfg', train_cfg, 'the distiller has no training settings of its own'),
        )
        for key, value, instead in unused:
            if value is not None:
                raise ValueError(f'LookWhereDistiller: {key}={value!r} is not used ({instead})')
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        if select_by not in ('teacher', 'selector'):
            raise ValueError(
                f"LookWhereDistiller: select_by must be 'teacher' or 'selector', got {select_by!r}"
            )
        if selector_target not in SELECTOR_TARGETS:
            raise ValueError(
                f'LookWhereDistiller: selector_target={selector_target!r} is not one of '
                f'{list(SELECTOR_TARGETS)}'
            )
        self.selector_target = selector_target
        self.teacher = _build_teacher(teacher)
        self.student = LookWhere(**dict(student))
        _check_student_fits_teacher(self.teacher, self.student.extractor.trunk)
        if init_extractor_from_teacher:
            try:
                missing = self.student.extractor.trunk.load_state_dict(
                    self.teacher.state_dict(), strict=False
                )
            except CheckpointError as err:  # the keys to set are the student extractor's
                msg = str(err).replace('model.backbone.', 'model.student.extractor.')
                raise CheckpointError(
                    f'model.student.extractor: {msg} (init_extractor_from_teacher=True copies '
                    "the teacher's weights into the student's extractor: build "
                    'model.student.extractor.* as model.teacher.*, or set '
                    'init_extractor_from_teacher=False)'
                ) from None
            if missing.missing_keys or missing.unexpected_keys:
                raise ValueError(
                    'LookWhereDistiller: init_extractor_from_teacher needs the same '
                    f'architecture; missing {missing.missing_keys[:5]}, unexpected '
                    f'{missing.unexpected_keys[:5]}'
                )
        self.select_by = select_by
        self.selector_weight = float(selector_weight)
        self.extractor_weight = float(extractor_weight)

    def init_weights(self) -> None:
        """mmengine's initialisation (``init_cfg``; the student, a plain module, keeps its
        weights as built, or from ``init_extractor_from_teacher``) with the teacher left as
        built: mmengine's ``BaseModule.init_weights`` calls each child's ``init_weights``
        unless it is marked ``is_init``, and the trunk's redraws every weight -- the Runner
        distilled from a random teacher, whatever ``teacher.checkpoint`` held."""
        self.teacher.is_init = True  # built complete: its checkpoint, or its own init
        super().init_weights()

    def train(self, mode: bool = True) -> 'LookWhereDistiller':
        super().train(mode)
        self.teacher.eval()
        return self

    def forward(self, inputs, data_samples=None, mode: str = 'tensor'):
        """``mode='loss'``: the distillation losses; ``'tensor'`` / ``'predict'``: the
        student's dense maps."""
        if mode == 'loss':
            return self.loss(inputs)
        return self.student(inputs)

    def loss(self, inputs: torch.Tensor) -> Dict[str, torch.Tensor]:
        targets = teacher_targets(self.teacher, inputs)
        return distillation_losses(
            self.student,
            inputs,
            targets,
            select_by=self.select_by,
            selector_target=self.selector_target,
            selector_weight=self.selector_weight,
            extractor_weight=self.extractor_weight,
        )
