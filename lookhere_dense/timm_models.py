"""The LookHere ViTs as timm models: ``timm.create_model('lookhere_vit_base_patch16_224')``.

Importing :mod:`lookhere_dense` registers them when timm is installed (this module is the
only one that imports timm at import time; without timm nothing imports it). Names:

================================  ==========  ======  =====  ==========================
model                             embed dims  blocks  heads  tags
================================  ==========  ======  =====  ==========================
``lookhere_vit_tiny_patch16_224``   192        12      12     lh180, lh90, lh45, alibi2d
``lookhere_vit_small_patch16_224``  384        12      6      lh180, lh90
``lookhere_vit_base_patch16_224``   768        12      12     lh180, lh90, lh45, alibi2d
``lookhere_vit_large_patch16_224``  1024       24      16     lh180, lh90, lh45, alibi2d
================================  ==========  ======  =====  ==========================

The tiny model has 12 heads of 16 channels (the LookHere head layouts need 6, 12 or 16
heads; lh45 and 2D-ALiBi need a multiple of 4). The tag picks the position encoding
(``.lh180`` the default preset; ``.lh90`` / ``.lh45`` the official presets whose released
weights are ``LH_90_…`` / ``LH_45_…``; ``.alibi2d`` 2D-ALiBi in the same trunk). No
weights are downloaded: load a file with ``checkpoint_path=`` (official LookHere files,
timm / DeiT-III ViT weights, lookhere-dense backbone files, and the backbone of a
training checkpoint: ``tools/train.py``'s ``iter_N.pth`` or a segmentor's / detector's
``state_dict``, through :func:`lookhere_dense.lookhere.weights.load_backbone_weights`: a
file's LookHere config is adopted and must equal an explicit tag's, head counts are
checked), or ``pretrained=True, pretrained_cfg_overlay=dict(file=PATH)``.
``pretrained=True`` with ``checkpoint_path=`` loads that file (mmseg's ``TIMMBackbone``
passes ``pretrained=True`` by default); without a file it is an error. The
``checkpoint_path`` is checked before the model is built (missing, not a checkpoint);
for a Runner checkpoint, the mmengine classes it holds are allowed for
``torch.load(weights_only=True)`` exactly as :func:`lookhere_dense.register_all_modules`
allows them (:mod:`lookhere_dense.compat`). ``in_chans`` (or ``in_channels``) sets the
input channels.

What differs from timm's ``VisionTransformer``:

* every model takes any image size (``dynamic_img_size`` is always on; the LookHere bias
  needs no interpolation); ``img_size`` is only recorded;
* the last block's output is after the final norm (``forward_intermediates``,
  ``features_only``), as in mmseg's ViT and :class:`LookHereVisionTransformer`'s
  ``forward``, so the features equal :func:`lookhere_dense.lookhere.create_model`'s maps
  bit for bit; ``norm=True`` also normalises the other blocks' outputs;
* ``features_only=True`` keeps every block (no pruning; the forward stops after the last
  block asked for), so the same files load into it.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from timm.models import build_model_with_cfg, create_model, generate_default_cfgs, register_model
from timm.models._features import FeatureGetterNet, feature_take_indices
from timm.models._pretrained import PretrainedCfg
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys

from .errors import UnreadableCheckpointError
from .lookhere.vit import LookHereVisionTransformer

__all__ = ['LookHereTimmViT', 'LookHereFeatures', 'ARCHS', 'TAGS']

#: architecture per model name (LookHereVisionTransformer arguments)
ARCHS: Dict[str, Dict[str, Any]] = {
    'lookhere_vit_tiny_patch16_224': dict(embed_dims=192, num_layers=12, num_heads=12),
    'lookhere_vit_small_patch16_224': dict(embed_dims=384, num_layers=12, num_heads=6),
    'lookhere_vit_base_patch16_224': dict(embed_dims=768, num_layers=12, num_heads=12),
    'lookhere_vit_large_patch16_224': dict(embed_dims=1024, num_layers=24, num_heads=16),
}
#: the position encoding each tag selects
TAGS: Dict[str, Dict[str, Any]] = {
    'lh180': dict(preset='lh180'),
    'lh90': dict(preset='lh90'),
    'lh45': dict(preset='lh45'),
    'alibi2d': dict(pos_encoding='alibi2d'),
}
_FITS = {  # the tags whose head layout fits the model's head count
    name: [t for t in TAGS if not (arch['num_heads'] % 4 and t in ('lh45', 'alibi2d'))]
    for name, arch in ARCHS.items()
}
#: timm argument names -> LookHereVisionTransformer's
_RENAMES = {
    'in_chans': 'in_channels',
    'embed_dim': 'embed_dims',
    'depth': 'num_layers',
    'class_token': 'with_cls_token',
    'pos_drop_rate': 'drop_rate',
}
_IGNORED = ('dynamic_img_size', 'dynamic_img_pad')  # always dynamic


class LookHereTimmViT(LookHereVisionTransformer):
    """:class:`LookHereVisionTransformer` with timm's classifier interface
    (``forward`` -> logits, ``forward_head``, ``reset_classifier``), ``feature_info`` and
    ``forward_intermediates``.

    Args:
        num_classes (int): classifier outputs; 0: no classifier (``forward`` returns the
            pooled features). Default: 1000.
        global_pool (str): ``'token'`` (the CLS token), ``'avg'`` (mean of the patch
            tokens) or ``''`` (all tokens). Default: ``'token'``.
        **kwargs: :class:`LookHereVisionTransformer` arguments (timm names such as
            ``in_chans``, ``embed_dim`` and ``depth`` are accepted too).
    """

    def __init__(self, num_classes: int = 1000, global_pool: str = 'token', **kwargs: Any):
        if global_pool not in ('token', 'avg', ''):
            raise ValueError(f"global_pool must be 'token', 'avg' or '', got {global_pool!r}")
        super().__init__(**_rename(kwargs))
        self.init_weights()  # timm models are initialised when built
        if global_pool == 'token' and not self.with_cls_token:
            raise ValueError("global_pool='token' needs the CLS token (with_cls_token=True)")
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dims
        self.depth = len(self.blocks)
        self.feature_info = [
            dict(module=f'blocks.{i}', num_chs=self.embed_dims, reduction=self.patch_size)
            for i in range(self.depth)
        ]
        self.head: nn.Module = nn.Identity()
        self.reset_classifier(num_classes)

    def get_classifier(self) -> nn.Module:
        """The classifier (timm API)."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new, initialised classifier for ``num_classes`` (0: none) (timm API)."""
        if global_pool is not None:
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes) if num_classes else nn.Identity()
        if num_classes:
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Pool the tokens of :meth:`forward_features` and apply the classifier."""
        if self.global_pool == 'token':
            x = x[:, 0]
        elif self.global_pool == 'avg':
            x = x[:, self.num_prefix_tokens :].mean(dim=1)
        return x if pre_logits else self.head(x)

    def forward(self, inputs: Tensor) -> Tensor:  # type: ignore[override]
        """Images ``(B, C, H, W)`` of any size -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(inputs))

    def forward_intermediates(
        self,
        x: Tensor,
        indices: Optional[Union[int, Sequence[int]]] = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = 'NCHW',
        intermediates_only: bool = False,
    ) -> Union[List[Any], Tuple[Tensor, List[Any]]]:
        """Block outputs, as timm's ViTs return them.

        Args:
            indices: an int n: the last n blocks; a list: those blocks; None: all.
                Default: None.
            return_prefix_tokens: pair each output with its prefix (CLS / Jumbo) tokens.
                Default: False.
            norm: apply the final norm to every output (the last block's always has
                it). Default: False.
            stop_early: stop after the last block asked for (always, with
                ``intermediates_only``). Default: False.
            output_fmt: ``'NCHW'`` maps or ``'NLC'`` tokens. Default: ``'NCHW'``.
            intermediates_only: return only the outputs. Default: False.

        Returns:
            The outputs, or ``(final tokens, outputs)``.
        """
        if output_fmt not in ('NCHW', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, last = feature_take_indices(self.depth, indices)
        tokens, grid = self._embed(x)
        outs: List[Any] = []
        prefix = self.num_prefix_tokens
        stop = intermediates_only or stop_early
        for i, blk in enumerate(self.blocks):
            if stop and i > last:
                break
            q_scale = self.attention_scale(grid, blk.window_size)
            tokens = blk(tokens, self.pos_enc, i, grid, prefix, q_scale, self.jumbo_mlp)
            if i == self.depth - 1 and self.norm is not None:
                tokens = self.norm(tokens)
            if i in take:
                y = self.norm(tokens) if norm and i != self.depth - 1 and self.norm else tokens
                outs.append(self._format(y, grid, output_fmt, return_prefix_tokens))
        return outs if intermediates_only else (tokens, outs)

    def _format(self, y: Tensor, grid: Tuple[int, int], fmt: str, with_prefix: bool) -> Any:
        prefix = self.num_prefix_tokens
        patches = y[:, prefix:]
        if fmt == 'NCHW':
            b, _, c = patches.shape
            patches = patches.reshape(b, grid[0], grid[1], c).permute(0, 3, 1, 2).contiguous()
        return (patches, y[:, :prefix]) if with_prefix else patches

    def prune_intermediate_layers(
        self,
        indices: Union[int, Sequence[int]] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> List[int]:
        """Drop the blocks after the last of ``indices`` and the classifier (timm API);
        returns the block indices. The final norm stays while the last block does (its
        output includes it), whatever ``prune_norm`` says."""
        take, last = feature_take_indices(self.depth, indices)
        self.blocks = self.blocks[: last + 1]
        if prune_norm and last != self.depth - 1:
            self.norm = None
        self.depth = len(self.blocks)
        self.feature_info = self.feature_info[: self.depth]
        if prune_head:
            self.reset_classifier(0, '')
        return take

    def load_pretrained(
        self,
        path: Union[str, Mapping[str, Any]],
        strict: bool = True,
        checkpoint_num_heads: Optional[int] = None,
        source: Optional[str] = None,
    ) -> Dict[str, List[str]]:
        """:meth:`LookHereVisionTransformer.load_pretrained` for the trunk, then the
        file's classifier (``head.*``) when it has one of this model's shape (official
        LookHere and timm ImageNet files); otherwise the classifier stays as it is."""
        head, self.head = self.head, nn.Identity()  # the trunk's strict key check
        self._loading = True  # the loader's own load_state_dict calls are plain ones
        try:
            report = super().load_pretrained(path, strict, checkpoint_num_heads, source)
        finally:
            self.head, self._loading = head, False
        self._load_head(path)
        return report

    def _load_head(self, path: Union[str, Mapping[str, Any]]) -> None:
        if not isinstance(self.head, nn.Linear):
            return
        from .checkpoint import load_checkpoint_file

        ckpt = load_checkpoint_file(path) if isinstance(path, str) else path
        sd = ckpt.get('weights') or ckpt.get('state_dict') or ckpt.get('model') or ckpt
        weight, bias = sd.get('head.weight'), sd.get('head.bias')
        if weight is not None and bias is not None and weight.shape == self.head.weight.shape:
            with torch.no_grad():
                self.head.weight.copy_(weight)
                self.head.bias.copy_(bias)
        else:
            self._log('LookHereTimmViT: the file has no classifier of this shape; kept as is')

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign=False):
        """This model's own ``state_dict`` loads as in PyTorch; any other checkpoint
        (official LookHere ``{'weights', 'config'}``, timm / DeiT-III weights, a
        lookhere-dense backbone ``state_dict``), e.g. from timm's ``checkpoint_path=``,
        goes through :meth:`load_pretrained` (its missing and unexpected keys are returned as
        PyTorch returns them). Messages name timm's ``checkpoint_path`` when it is that
        file's dict (the first call after ``timm.create_model``), else 'the checkpoint'."""
        source = self.__dict__.pop('_checkpoint_path', None) or 'the checkpoint'
        if getattr(self, '_loading', False) or set(state_dict) == set(self.state_dict()):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        report = self.load_pretrained(dict(state_dict), strict=strict, source=source)
        return _IncompatibleKeys(report['missing'], report['unexpected'])


class LookHereFeatures(FeatureGetterNet):
    """timm's ``features_only`` wrapper (``forward_intermediates`` getter) whose
    ``load_state_dict`` takes the checkpoints the model takes (timm's
    ``checkpoint_path=`` loads after the wrapping)."""

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign=False):
        """Checkpoints with this wrapper's keys (``model.*``) load as in PyTorch; others
        go to the model's :meth:`LookHereTimmViT.load_state_dict`."""
        if set(state_dict) == set(self.state_dict()):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        return self.model.load_state_dict(state_dict, strict=strict)


def _cfg(tag: str) -> Dict[str, Any]:
    return dict(
        url='',
        custom_load=True,  # a file given with pretrained_cfg_overlay=dict(file=...)
        num_classes=1000,
        input_size=(3, 224, 224),
        pool_size=None,
        crop_pct=1.0,
        interpolation='bicubic',
        fixed_input_size=False,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        first_conv='patch_embed.proj',
        classifier='head',
        paper_ids='arXiv:2405.13985',
        license='apache-2.0',
        notes=(
            f'position encoding: {TAGS[tag]}; no download: load weights with checkpoint_path=',
        ),
    )


default_cfgs = generate_default_cfgs(
    {
        f'{name}.{tag}' + ('*' if tag == 'lh180' else ''): _cfg(tag)
        for name, tags in _FITS.items()
        for tag in tags
    }
)


def _rename(kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """timm's keyword arguments -> LookHereVisionTransformer's (renamed; the always-on
    ``dynamic_img_size`` / ``dynamic_img_pad`` dropped).

    Raises:
        ValueError: a timm name and its LookHereVisionTransformer name (``in_chans`` and
            ``in_channels``, ...) both given, with different values.
    """
    for theirs, ours in _RENAMES.items():
        if theirs in kwargs and ours in kwargs and kwargs[theirs] != kwargs[ours]:
            raise ValueError(
                f'{theirs}={kwargs[theirs]!r} and {ours}={kwargs[ours]!r} are the same '
                "argument (timm's name and LookHereVisionTransformer's) with different "
                'values: give one of them'
            )
    return {_RENAMES.get(k, k): v for k, v in kwargs.items() if k not in _IGNORED}


def _encoding_kwargs(variant: str, pretrained_cfg: Any, kwargs: Dict[str, Any]) -> None:
    """Set the position encoding of an explicit tag (``name.lh90``); a conflicting
    ``preset`` / ``pos_encoding`` argument is an error."""
    tag = pretrained_cfg if isinstance(pretrained_cfg, str) else None
    if isinstance(pretrained_cfg, PretrainedCfg):
        tag = pretrained_cfg.tag
    if not tag:
        return
    if tag not in _FITS[variant]:
        raise ValueError(
            f'{variant}.{tag}: unknown tag for this model; its tags are '
            f'{", ".join(_FITS[variant])} (lh45 and alibi2d need a multiple of 4 heads)'
        )
    for key, value in TAGS[tag].items():
        if kwargs.get(key, value) != value:
            raise ValueError(
                f'{variant}.{tag} sets {key}={value!r}; the argument {key}={kwargs[key]!r} '
                'contradicts it (drop the tag or the argument)'
            )
        kwargs[key] = value


def _timm_checkpoint_path(variant: str) -> Optional[str]:
    """The ``checkpoint_path`` of the ``timm.create_model`` call that is building this
    model (``variant``); None when it has none, when the model function was called
    otherwise, or when the nearest ``create_model`` builds another model (a model of
    another name that builds ours inside: its file is not ours).

    timm keeps ``checkpoint_path`` from the model function and reads the file itself once
    the function has returned; the entry looks it up in the caller's frame to accept
    ``pretrained=True`` with a file and to check the file before timm reads it. A timm
    whose ``create_model`` names these locals otherwise gives None: the old behaviour.
    """
    code = inspect.unwrap(create_model).__code__
    frame = sys._getframe(1)
    try:
        while frame is not None:
            if frame.f_code is code:
                if frame.f_locals.get('model_name') != variant:  # timm strips the tag
                    return None
                path = frame.f_locals.get('checkpoint_path')
                return os.fspath(path) if path else None
            frame = frame.f_back
        return None
    finally:
        del frame


def _check_checkpoint(path: str) -> None:
    """Refuse a ``checkpoint_path`` that timm cannot read, naming the file and the problem
    (timm's own reader says ``weights_only=True blocked ...``, a bare ``KeyError`` or an
    empty ``FileNotFoundError``), before the model is built.

    An mmengine Runner checkpoint (``tools/train.py``'s ``iter_N.pth``) holds the message
    hub's ``HistoryBuffer`` and numpy objects besides tensors: where the file is refused
    for such an ``mmengine`` class, exactly those classes are allowed for
    ``torch.load(..., weights_only=True)`` from then on in the process, as
    :func:`lookhere_dense.register_all_modules` does (:mod:`lookhere_dense.compat`; nothing
    without mmengine), and the file is read again. Every other Python object stays
    refused; other files change nothing.

    Raises:
        FileNotFoundError: the file does not exist.
        UnreadableCheckpointError: it is no checkpoint (a folder; an empty, damaged or
            text file; a pickle of other Python objects).
    """
    from . import compat
    from .checkpoint import checkpoint_problem

    if not os.path.exists(path):
        raise FileNotFoundError(
            f'checkpoint file not found: {path!r} (timm.create_model checkpoint_path=, '
            'a local file)'
        )
    if path.endswith('.safetensors') and os.path.isfile(path):
        return  # no pickle; timm reads it with safetensors
    problem = checkpoint_problem(path)
    if problem is not None and 'mmengine.' in problem:  # a Runner checkpoint
        compat.apply()
        problem = checkpoint_problem(path)
    if problem is not None:
        raise UnreadableCheckpointError(
            path,
            problem,
            'timm.create_model(checkpoint_path=) takes a file written by torch.save '
            '(official LookHere, timm / DeiT-III, lookhere-dense or mmengine checkpoints) '
            'or a .safetensors file',
        )


def _create(variant: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build one registered model through timm's ``build_model_with_cfg``.

    ``pretrained=True`` needs a file: timm's ``checkpoint_path=`` (loaded by timm after
    this function returns) or ``pretrained_cfg_overlay=dict(file=...)``. A
    ``checkpoint_path`` is checked before the model is built (:func:`_check_checkpoint`).

    Raises:
        RuntimeError: ``pretrained=True`` without a file.
        FileNotFoundError, UnreadableCheckpointError: the ``checkpoint_path`` is missing
            or no checkpoint.
    """
    pretrained_cfg = kwargs.pop('pretrained_cfg', None)
    overlay = kwargs.pop('pretrained_cfg_overlay', None) or {}
    _encoding_kwargs(variant, pretrained_cfg, kwargs)
    checkpoint = _timm_checkpoint_path(variant)
    if checkpoint is not None:
        _check_checkpoint(checkpoint)
    if pretrained and not overlay.get('file') and not overlay.get('state_dict'):
        if checkpoint is None:
            raise RuntimeError(
                f'{variant}: no weights to download; pass the file, e.g. '
                "timm.create_model(NAME, checkpoint_path='LH_180_weights_and_config.pth') or "
                "pretrained=True, pretrained_cfg_overlay=dict(file='...')"
            )
        pretrained = False  # the weights are the checkpoint_path's, which timm loads next
    args = {**ARCHS[variant], **_rename(kwargs)}
    # timm's name: build_model_with_cfg sets in_chans from pretrained_cfg (3) unless given
    if 'in_channels' in args:
        args['in_chans'] = args.pop('in_channels')
    feature_cfg = dict(feature_cls=LookHereFeatures, prune=False, out_indices=3)
    model = build_model_with_cfg(
        LookHereTimmViT,
        variant,
        pretrained,
        pretrained_cfg=pretrained_cfg,
        pretrained_cfg_overlay=overlay,
        feature_cfg=feature_cfg,
        **args,
    )
    if checkpoint is not None:  # timm hands the file's dict over: name the file in messages
        trunk = model.model if isinstance(model, LookHereFeatures) else model
        trunk._checkpoint_path = checkpoint
    return model


@register_model
def lookhere_vit_tiny_patch16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """LookHere ViT-T/16 (192 dims, 12 blocks, 12 heads of 16)."""
    return _create('lookhere_vit_tiny_patch16_224', pretrained, **kwargs)


@register_model
def lookhere_vit_small_patch16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """LookHere ViT-S/16 (384 dims, 12 blocks, 6 heads; lh180 / lh90)."""
    return _create('lookhere_vit_small_patch16_224', pretrained, **kwargs)


@register_model
def lookhere_vit_base_patch16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """LookHere ViT-B/16 (768 dims, 12 blocks, 12 heads), the official LookHere size."""
    return _create('lookhere_vit_base_patch16_224', pretrained, **kwargs)


@register_model
def lookhere_vit_large_patch16_224(pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """LookHere ViT-L/16 (1024 dims, 24 blocks, 16 heads)."""
    return _create('lookhere_vit_large_patch16_224', pretrained, **kwargs)
