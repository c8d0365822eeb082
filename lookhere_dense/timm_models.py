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
timm / DeiT-III ViT weights, lookhere-dense backbone files such as
``tools/convert_checkpoint.py`` writes, and the backbone of a training checkpoint:
``tools/train.py``'s ``iter_N.pth`` or a segmentor's / detector's ``state_dict``, through
:func:`lookhere_dense.lookhere.weights.load_backbone_weights`), or ``pretrained=True,
pretrained_cfg_overlay=dict(file=PATH)`` (or a ``pretrained_cfg`` with a ``file``), also
into ``features_only=True`` models, through ``timm.models.load_checkpoint`` and mmseg's
``TIMMBackbone(checkpoint_path=...)``. Every route takes a file as mmseg's ``LookHereViT``
does: a file's LookHere config is adopted and must equal an explicit tag's (or
``preset=`` / ``lh_config=``); its head count must equal ``num_heads`` (recorded in
lookhere-dense files, 12 for official LookHere files, ``channels / 64`` for timm /
DeiT-III files; ``checkpoint_num_heads=N`` states it for a file that records none). timm's
reader keeps only a file's ``state_dict``; the ``meta`` of a converted file (head count,
LookHere config) is read back from the file timm is reading
(:meth:`LookHereTimmViT.load_state_dict`), and a pretrained file is read by
:meth:`LookHereTimmViT.load_pretrained` (``custom_load``). A file that does not fit is
refused with one line naming the file, its value, the model's and the ``create_model``
argument or tag to change. ``pretrained=True`` with ``checkpoint_path=`` loads that file
(mmseg's ``TIMMBackbone`` passes ``pretrained=True`` by default); without a file it is an
error (``pretrained=False``: random weights). The file is checked before the model is
built (missing, not a checkpoint); for a Runner checkpoint, the mmengine classes it holds
are allowed for ``torch.load(weights_only=True)`` exactly as
:func:`lookhere_dense.register_all_modules` allows them (:mod:`lookhere_dense.compat`).
``in_chans`` (or ``in_channels``) sets the input channels. ``init_values=0`` builds the
model without LayerScale, as timm's ``VisionTransformer`` (``timm.create_model`` drops
arguments given as None; the default is LayerScale at 1e-4, as the official LookHere
models): timm / DeiT ViT files have none. A file that does not fit is refused in timm's
words: ``init_values=0`` for such a file, ``model.load_pretrained(FILE, strict=False)`` to
load what fits (:attr:`LookHereTimmViT.loose_loading`). As timm's reader, each of these
routes takes a file's EMA weights (``state_dict_ema``, else ``model_ema``) before its
``state_dict``, and
reads timm ``train.py`` checkpoints (their ``args``, an ``argparse.Namespace``, is the one
Python class allowed besides tensors) and ``state_dict`` files cast to one dtype (timm's
``avg_checkpoints.py``: the record, ``_extra_state``, is read back from its cast bytes).
The classifier: a file's ``head.*`` is loaded where it fits this model; a file without one
(a backbone file) leaves the classifier random with a warning (timm refuses such a file:
``num_classes=0`` builds the model without one); a file in another layout (timm's ViT,
official LookHere, converted) with another class count gets a new classifier, as for
fine-tuning, while this model's own ``state_dict`` with another class count is refused by
PyTorch's size check, as timm refuses it (``pretrained=True`` with
``pretrained_cfg_overlay=dict(file=...)`` gives a new classifier to both).
``model.load_state_dict(state_dict)`` called directly
treats the classifier's keys as PyTorch does (reported as missing / unexpected, refused
with ``strict``). A timm ``global_pool='avg'`` file holds ``fc_norm.*`` (a norm after the
pooling, no final norm): ``fc_norm=True`` loads it; without it the file is refused.
``act_layer`` and ``norm_layer`` take timm's names (``'gelu_tanh'``, ``'rmsnorm'``,
``'layernorm'``: ``timm.layers.get_act_layer`` / ``get_norm_layer``). timm / DeiT-III ViT
files are trained with LayerNorm eps 1e-6 (the official LookHere model, and the default
here, 1e-5): loading one into a model of another eps warns;
``norm_layer=functools.partial(nn.LayerNorm, eps=1e-6)`` (or ``'layernorm'``) matches it.
``device=`` / ``dtype=`` (which timm's ``create_model`` hands to the model, e.g.
``device='meta'``) build the model on that device in that dtype. timm's
data config (``timm.data.resolve_data_config``) is the official LookHere evaluation's:
the short side resized to 256 (bilinear), 224 cropped (``crop_pct=0.875``).

Fine-tuning with timm's tools: ``set_grad_checkpointing()`` (activation checkpointing per
block; also on the ``features_only`` wrapper), ``group_matcher()`` (so
``timm.optim.create_optimizer_v2(model, 'adamw', layer_decay=0.65)`` decays per block as
for timm's ViT; learnable LookHere slopes go with their block, the global one with the
final norm) and ``no_weight_decay()`` (CLS / Jumbo tokens, position parameters, learnable
LookHere slopes). The dropout rates mean what they mean for timm's ``VisionTransformer``
(timm's ``train.py --drop`` etc.): ``drop_rate`` before the classifier (``head_drop``),
``pos_drop_rate`` after the position embedding, ``proj_drop_rate`` after each attention
projection and in each MLP, ``attn_drop_rate`` on the attention weights (the trunk's
own ``drop_rate``, mmseg's ``LookHereViT``'s, is one rate after the position embedding
and in every block's projection and MLP together).

What differs from timm's ``VisionTransformer``:

* ``global_pool='avg'`` pools after the final norm; timm's default ``fc_norm`` for it
  (a norm after the pooling instead) is ``fc_norm=True`` here; ``global_pool`` is
  ``'token'``, ``'avg'`` or ``''`` (also in ``reset_classifier``);
* ``checkpoint_path=`` takes a file without a classifier (a warning), or one in another
  layout (timm's ViT, official, converted) with another class count (a new classifier),
  which timm refuses;
* every model takes any image size (``dynamic_img_size`` is always on; the LookHere bias
  needs no interpolation); ``img_size`` is the nominal training size (timm's data config,
  ``log_n_scaling``'s reference, the ``abs`` table's grid), and ``set_input_size`` changes
  it but never the patch size;
* the last block's output is after the final norm (``forward_intermediates``,
  ``features_only``), as in mmseg's ViT and :class:`LookHereVisionTransformer`'s
  ``forward``, so the features equal :func:`lookhere_dense.lookhere.create_model`'s maps
  bit for bit; ``norm=True`` also normalises the other blocks' outputs.
  ``prune_intermediate_layers`` leaves the kept blocks' outputs as they were (as timm's
  ViT: the new last block's gets no norm; the final tokens have it after the kept blocks);
  with ``prune_norm=True`` the norm goes unless the model's last block stays;
* ``features_only=True`` keeps every block (no pruning; the forward stops after the last
  block asked for), so the same files load into it; its ``out_indices`` are reported as
  timm's ViT reports them (block indices from the first: ``(9, 10, 11)`` for the default
  ``3`` of a 12-block model). ``feature_cls='getter'`` (timm's default for ViTs) is this
  wrapper; ``'hook'`` / ``'fx'`` (and ``'list'`` / ``'dict'``) are refused: the blocks take
  position arguments in every forward, which only ``forward_intermediates`` passes.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

import torch
from timm.layers import Mlp, get_act_layer, get_norm_layer
from timm.models import (
    adapt_input_conv,
    build_model_with_cfg,
    create_model,
    generate_default_cfgs,
    register_model,
)
from timm.models._features import FeatureGetterNet, feature_take_indices

try:  # timm >= 1.0.30 records a model's input size; older timm has no such record
    from timm.models._input import update_model_input_size
except ImportError:  # pragma: no cover - depends on the installed timm
    update_model_input_size = None
from timm.models._pretrained import PretrainedCfg
from torch import Tensor, nn
from torch.nn.modules.module import _IncompatibleKeys

from .checkpoint import load_checkpoint_file, strip_prefix
from .errors import CheckpointError, UnreadableCheckpointError
from .lookhere.config import (
    OFFICIAL_KEYS,
    LookHereConfig,
    preset_name,
    resolve_lh_config,
)
from .lookhere.vit import TIMM_ARGUMENT_NAMES, LookHereVisionTransformer
from .lookhere.weights import (
    BackboneWeights,
    backbone_weights,
    check_weights_argument,
    ema_preferred,
    file_num_heads,
)
from .validation import check_rate

__all__ = ['LookHereTimmViT', 'LookHereFeatures', 'ClassifierKeysError', 'ARCHS', 'TAGS']

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
#: timm argument names -> LookHereVisionTransformer's. Not the dropout rates: timm's four
#: (``drop_rate``, ``pos_drop_rate``, ``proj_drop_rate``, ``attn_drop_rate``) are
#: :class:`LookHereTimmViT`'s own, with timm's meanings (the trunk's ``drop_rate`` is
#: another thing: after the position embedding *and* in every block)
_RENAMES = {k: v for k, v in TIMM_ARGUMENT_NAMES.items() if k != 'pos_drop_rate'}
_IGNORED = ('dynamic_img_size', 'dynamic_img_pad')  # always dynamic


#: ``LookHereTimmViT(head_type=...)``: timm's linear classifier, or the official LookHere one
HEAD_TYPES = ('linear', 'mlp')
_HEAD_WORDS = {
    'linear': 'linear classifier (head.weight)',
    'mlp': 'LookHere MLP classifier (head.fc1 -> tanh -> head.fc2)',
}


def _check_global_pool(global_pool: Any) -> None:
    if global_pool not in ('token', 'avg', ''):
        raise ValueError(f"global_pool must be 'token', 'avg' or '', got {global_pool!r}")


def _timm_layers(name: str, kwargs: Dict[str, Any]) -> None:
    """``norm_layer`` / ``act_layer`` given by timm's names (``'rmsnorm'``,
    ``'gelu_tanh'``, ...) replaced by their layers (:func:`timm.layers.get_norm_layer`,
    :func:`timm.layers.get_act_layer`), as timm's ViT takes them; callables stay.

    Raises:
        ValueError: a name timm does not know, naming the argument and the value.
    """
    for key, getter in (('norm_layer', get_norm_layer), ('act_layer', get_act_layer)):
        value = kwargs.get(key)
        if not isinstance(value, str):
            continue
        try:
            layer = getter(value)
        except KeyError:
            layer = None
        if layer is None:
            raise ValueError(
                f'{name}: {key}={value!r} is no layer name timm knows '
                f'(timm.layers.{getter.__name__}); pass a timm name such as '
                + ("'layernorm' or 'rmsnorm'" if key == 'norm_layer' else "'gelu' or 'gelu_tanh'")
                + ', or a callable'
            )
        kwargs[key] = layer


def _check_dtype(dtype: Any) -> None:
    """Refuse a ``dtype`` that is not a floating-point ``torch.dtype``, by name."""
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(
            f'LookHereViT: dtype must be a floating-point torch.dtype (e.g. torch.bfloat16) '
            'or None, '
            f'got {dtype!r}'
        )


def _classifier(head_type: str, width: int, num_classes: int) -> nn.Module:
    """A new, initialised classifier (truncated normal 0.02 weights, zero biases);
    ``nn.Identity()`` for ``num_classes=0``. ``'mlp'``: the official LookHere classifier
    (``fc1`` to 4x ``width``, tanh, ``fc2``), timm's ``Mlp`` with its key names."""
    if not num_classes:
        return nn.Identity()
    if head_type == 'mlp':
        head: nn.Module = Mlp(width, 4 * width, num_classes, act_layer=nn.Tanh)
    else:
        head = nn.Linear(width, num_classes)
    for m in head.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)
    return head


class LookHereTimmViT(LookHereVisionTransformer):
    """:class:`LookHereVisionTransformer` with timm's classifier interface
    (``forward`` -> logits, ``forward_head``, ``reset_classifier``), ``feature_info`` and
    ``forward_intermediates``.

    Args:
        num_classes (int): classifier outputs; 0: no classifier (``forward`` returns the
            pooled features). Default: 1000.
        global_pool (str): ``'token'`` (the CLS token), ``'avg'`` (mean of the patch
            tokens) or ``''`` (all tokens). Default: ``'token'``.
        fc_norm (bool): a norm after the pooling (``fc_norm``) in place of the final norm
            (``final_norm=False``), as timm's ViT with ``global_pool='avg'`` (whose files
            hold ``fc_norm.*`` and no ``norm.*``). Unlike timm, ``None`` means False for
            every ``global_pool``: ``'avg'`` pools after the final norm. Default: None.
        head_type (str): ``'linear'`` (timm's ViT classifier, ``head.weight``) or
            ``'mlp'``: the official LookHere classifier (``head.fc1`` -> tanh ->
            ``head.fc2``, hidden width 4x the embedding), which the released ImageNet
            files (``LH_180_weights_and_config.pth``, ...) hold. Default: ``'linear'``.
        drop_rate (float): dropout before the classifier (``head_drop``, in
            :meth:`forward_head`), as timm's ViT's ``drop_rate`` (``--drop`` of timm's
            ``train.py``); not the trunk's ``drop_rate``. Default: 0.
        pos_drop_rate (float): dropout after the position embedding (the trunk's
            ``drop_after_pos``) only, as timm's. Default: 0.
        proj_drop_rate (float): dropout after each attention projection and in each MLP
            (after the activation and the output), as timm's. Default: 0.
        device (str | torch.device): build every tensor on this device (timm's
            ``create_model(..., device=)``; ``'meta'``: no memory). Default: None (the
            default device).
        dtype (torch.dtype): a floating-point dtype for the parameters (timm's
            ``create_model(..., dtype=)``). Default: None (float32).
        **kwargs: :class:`LookHereVisionTransformer` arguments (timm names such as
            ``in_chans``, ``embed_dim`` and ``depth`` are accepted too;
            ``attn_drop_rate`` means the same in both; ``norm_layer`` / ``act_layer``
            also by timm's names, ``'rmsnorm'``, ``'gelu_tanh'``, ...).
    """

    #: the timm name (``name.tag``) and the ``create_model`` arguments that chose the
    #: position encoding explicitly, for messages (set by the registered model functions)
    _timm_name: Optional[str] = None
    _explicit_args: Tuple[str, ...] = ()
    #: ``create_model(..., checkpoint_num_heads=N)``: the head count of files that do not
    #: record one (:meth:`load_pretrained`)
    _checkpoint_num_heads: Optional[int] = None
    #: the classifier is dropped (``features_only``: by the wrapper, or about to be while
    #: timm reads a pretrained file): a file's ``head.*`` / ``fc_norm.*`` are left out
    _classifier_dropped: bool = False

    def __init__(
        self,
        num_classes: int = 1000,
        global_pool: str = 'token',
        head_type: str = 'linear',
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        fc_norm: Optional[bool] = None,
        device: Union[None, str, torch.device] = None,
        dtype: Optional[torch.dtype] = None,
        **kwargs: Any,
    ):
        _check_dtype(dtype)
        _timm_layers('LookHereViT', kwargs)  # the model function names it (_create)
        # timm's device / dtype (timm.create_model(..., device=, dtype=), e.g. 'meta'): every
        # tensor is made on that device; the float ones are then cast to dtype
        place = torch.device(device) if device is not None else contextlib.nullcontext()
        with place:
            self._build(
                num_classes,
                global_pool,
                head_type,
                drop_rate,
                pos_drop_rate,
                proj_drop_rate,
                fc_norm,
                kwargs,
            )
        if dtype is not None:
            self.to(dtype=dtype)

    def _build(
        self,
        num_classes: int,
        global_pool: str,
        head_type: str,
        drop_rate: float,
        pos_drop_rate: float,
        proj_drop_rate: float,
        fc_norm: Optional[bool],
        kwargs: Dict[str, Any],
    ) -> None:
        """The constructor's work (on the device :meth:`__init__` chose)."""
        for key, rate in (
            ('drop_rate', drop_rate),
            ('pos_drop_rate', pos_drop_rate),
            ('proj_drop_rate', proj_drop_rate),
        ):
            check_rate(f'LookHereViT: {key}', rate)
        _check_global_pool(global_pool)
        if fc_norm:
            if kwargs.get('final_norm', False):
                raise ValueError(
                    "fc_norm=True replaces the final norm, as in timm's ViT: drop final_norm=True"
                )
            kwargs['final_norm'] = False
        if head_type not in HEAD_TYPES:
            raise ValueError(
                f'head_type must be one of {HEAD_TYPES}, got {head_type!r} '
                "('mlp': the official LookHere classifier, head.fc1 -> tanh -> head.fc2)"
            )
        # the trunk's drop_rate is dropout after the position embedding and in every block:
        # timm's proj_drop_rate there, and pos_drop_rate after the position embedding alone
        super().__init__(**_rename(kwargs), drop_rate=proj_drop_rate)
        self.drop_after_pos = nn.Dropout(pos_drop_rate)  # no parameters: the same keys
        norm_layer = kwargs.get('norm_layer') or nn.LayerNorm
        self.fc_norm: nn.Module = norm_layer(self.embed_dims) if fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head_type = head_type
        self.init_weights()  # timm models are initialised when built
        self._check_token_pool(global_pool)
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dims
        self.depth = len(self.blocks)
        self.feature_info = [
            dict(module=f'blocks.{i}', num_chs=self.embed_dims, reduction=self.patch_size)
            for i in range(self.depth)
        ]
        self.head: nn.Module = nn.Identity()
        self.reset_classifier(num_classes)

    @property
    def loose_loading(self) -> str:  # type: ignore[override]
        """The advice of a strict refusal, in ``create_model`` terms."""
        return (
            f'model = timm.create_model({self._name()!r}, ...); '
            'model.load_pretrained(FILE, strict=False) loads what fits'
        )

    def get_classifier(self) -> nn.Module:
        """The classifier (timm API)."""
        return self.head

    def _check_token_pool(self, global_pool: str) -> None:
        if global_pool == 'token' and not self.with_cls_token:
            raise ValueError(
                "global_pool='token' needs the CLS token (class_token=True; or global_pool='avg')"
            )

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        """A new, initialised classifier for ``num_classes`` (0: none) (timm API);
        ``global_pool`` (None: unchanged) is checked as the constructor checks it.

        Raises:
            ValueError: a ``global_pool`` this model does not have.
        """
        if global_pool is not None:
            _check_global_pool(global_pool)
            self._check_token_pool(global_pool)
            self.global_pool = global_pool
        self.num_classes = num_classes
        # on the model's device, in its dtype (a model built with timm's device= / dtype=)
        like = self.patch_embed.proj.weight
        self.head = _classifier(self.head_type, self.num_features, num_classes).to(
            device=like.device, dtype=like.dtype
        )

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Pool the tokens of :meth:`forward_features`, then ``fc_norm``, ``head_drop``
        (``drop_rate``) and the classifier, in timm's ViT's order (``pre_logits``: the
        pooled features after ``head_drop``, as timm's)."""
        if self.global_pool == 'token':
            x = x[:, 0]
        elif self.global_pool == 'avg':
            x = x[:, self.num_prefix_tokens :].mean(dim=1)
        x = self.fc_norm(x)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward_features(self, inputs: Tensor) -> Tensor:
        """All tokens after the last block and the final norm, ``(B, T, D)``
        (:meth:`LookHereVisionTransformer.forward_features`; after
        :meth:`prune_intermediate_layers` the norm follows the kept blocks, as timm's)."""
        x = super().forward_features(inputs)
        if not self._norm_in_last_block and self.norm is not None:
            x = self.norm(x)
        return x

    def forward(self, inputs: Tensor) -> Tensor:  # type: ignore[override]
        """Images ``(B, C, H, W)`` of any size -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(inputs))

    # -- timm's training API (as timm's VisionTransformer) ---------------------------------
    def set_input_size(
        self,
        img_size: Union[None, int, Tuple[int, int]] = None,
        patch_size: Optional[int] = None,
    ) -> None:
        """:meth:`LookHereVisionTransformer.set_input_size` (the nominal training size:
        ``log_n_scaling``'s reference, an ``abs`` table resampled; the patch size is kept),
        and timm's record of it (``timm.models.get_model_input_config(model)``), as timm's
        ``VisionTransformer.set_input_size`` (timm API)."""
        super().set_input_size(img_size, patch_size)
        if img_size is not None and update_model_input_size is not None:
            update_model_input_size(self, self.img_size)

    @property
    def grad_checkpointing(self) -> bool:
        """Activation checkpointing per block (timm's name for ``with_cp``)."""
        return self.with_cp

    @grad_checkpointing.setter
    def grad_checkpointing(self, enable: bool) -> None:
        self.with_cp = bool(enable)

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them
        (timm API; ``with_cp``): :meth:`forward`, :meth:`forward_features` and
        :meth:`forward_intermediates` (``features_only``) while gradients are needed."""
        self.with_cp = bool(enable)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        """Parameter groups for timm's layer-wise lr decay (timm API), as timm's
        ``VisionTransformer.group_matcher`` (``coarse`` changes nothing there either):

        * ``stem`` (group 0): ``cls_token``, ``jumbo_token``, ``patch_embed``, ``pre_ln``
          (timm's ``norm_pre``) and the position encoding's parameters (``pos_enc.*``:
          ``pos_embed``, RoPE-Mixed ``freqs``, ...) except learnable LookHere slopes;
        * block ``i``: ``blocks.i.*`` and layer ``i``'s learnable LookHere slopes
          (``pos_enc.slopes.{layer,head}_log_ratio.i``, as BEiT gives each block's relative
          position bias its block's group);
        * after the blocks: the final ``norm`` and the learnable global slope (shared by
          every layer); what no pattern matches (``head``, the Jumbo trunk's shared
          ``jumbo_mlp``) comes last, as timm does with the classifier.

        The assignments of :class:`lookhere_dense.engine.LookHereLayerDecayOptimizerConstructor`
        in timm's convention (the unmatched parameters one group after the final norm).
        """
        return dict(
            stem=r'^cls_token|^jumbo_token|^patch_embed|^pre_ln|^pos_enc\.(?!slopes\.)',
            blocks=[
                (r'^blocks\.(\d+)', None),
                (r'^pos_enc\.slopes\.(?:layer|head)_log_ratio\.(\d+)', None),
                (r'^norm|^pos_enc\.slopes\.global_log_ratio', (99999,)),
            ],
        )

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """Parameters timm's optimizer factory keeps free of weight decay (timm API;
        ``fnmatch`` patterns): the CLS / Jumbo tokens and position parameters, as timm's
        ``VisionTransformer`` excludes ``cls_token`` and ``pos_embed`` -- here
        ``pos_enc.pos_embed`` (``pos_encoding='abs'``) and ``pos_enc.freqs`` (RoPE-Mixed) --
        and the learnable LookHere slopes (``pos_enc.slopes.*``): log-ratios to the
        config's slopes, which decay would pull back to the config, like the relative
        position bias tables timm's BEiT exempts. The same exemptions as
        :class:`lookhere_dense.engine.LookHereLayerDecayOptimizerConstructor`; norms,
        LayerScale and biases are 1-D, which timm exempts anyway."""
        return {
            'cls_token',
            'jumbo_token',
            'pos_enc.pos_embed',
            'pos_enc.freqs',
            'pos_enc.slopes.*',
        }

    def forward_intermediates(
        self,
        x: Tensor,
        indices: Optional[Union[int, Sequence[int]]] = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = 'NCHW',
        intermediates_only: bool = False,
        output_dict: bool = False,
    ) -> Union[List[Any], Tuple[Tensor, List[Any]], Dict[str, Any]]:
        """Block outputs, as timm's ViTs return them.

        Args:
            indices: an int n: the last n blocks; a list: those blocks; None: all.
                Default: None.
            return_prefix_tokens: pair each output with its prefix (CLS / Jumbo) tokens
                (a model without any, ``class_token=False``: the outputs alone, as
                timm's). Default: False.
            norm: apply the final norm to every output (the last block's always has
                it, unless :meth:`prune_intermediate_layers` cut blocks off). Default:
                False.
            stop_early: stop after the last block asked for (always, with
                ``intermediates_only``). Default: False.
            output_fmt: ``'NCHW'`` maps or ``'NLC'`` tokens. Default: ``'NCHW'``.
            intermediates_only: return only the outputs. Default: False.
            output_dict: return a dict, as timm's ViT: ``'image_intermediates'`` (the
                outputs, without prefix tokens), ``'image_intermediates_prefix'`` (their
                prefix tokens, with ``return_prefix_tokens`` where the model has any) and,
                unless ``intermediates_only``, ``'image_features'`` (the final tokens).
                Default: False.

        Returns:
            The outputs, ``(final tokens, outputs)``, or the dict of ``output_dict``.
        """
        if output_fmt not in ('NCHW', 'NLC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, last = feature_take_indices(self.depth, indices)
        tokens, grid = self._embed(x)
        outs: List[Any] = []
        stop = intermediates_only or stop_early
        # the block whose output has the final norm (none once blocks were pruned)
        normed = self.depth - 1 if self._norm_in_last_block else -1
        # the trunk's block loop: the final norm after the last block, and with_cp
        # (set_grad_checkpointing) while gradients are needed
        ran = -1
        for i, out in self._run_blocks(tokens, grid):
            tokens, ran = out, i
            if i in take:
                y = self.norm(tokens) if norm and i != normed and self.norm else tokens
                outs.append(self._format(y, grid, output_fmt, return_prefix_tokens))
            if stop and i >= last:
                break
        if output_dict:
            return self._output_dict(
                tokens, ran, normed, outs, intermediates_only, return_prefix_tokens
            )
        if intermediates_only:
            return outs
        return self._final_tokens(tokens, ran, normed), outs

    def _final_tokens(self, tokens: Tensor, ran: int, normed: int) -> Tensor:
        """The final tokens of :meth:`forward_intermediates`: with the final norm after the
        last block run (pruned, or stopped early before the block that holds it), as
        timm's ViT."""
        if ran != normed and self.norm is not None:
            tokens = self.norm(tokens)
        return tokens

    def _output_dict(
        self,
        tokens: Tensor,
        ran: int,
        normed: int,
        outs: List[Any],
        intermediates_only: bool,
        with_prefix: bool,
    ) -> Dict[str, Any]:
        """:meth:`forward_intermediates`'s ``output_dict=True`` result, in timm's keys."""
        result: Dict[str, Any] = {}
        if with_prefix and self.num_prefix_tokens:  # outs are (map, prefix) pairs
            result['image_intermediates'] = [patches for patches, _ in outs]
            result['image_intermediates_prefix'] = [prefix for _, prefix in outs]
        else:
            result['image_intermediates'] = outs
        if not intermediates_only:
            result['image_features'] = self._final_tokens(tokens, ran, normed)
        return result

    def _format(self, y: Tensor, grid: Tuple[int, int], fmt: str, with_prefix: bool) -> Any:
        prefix = self.num_prefix_tokens
        patches = y[:, prefix:]
        if fmt == 'NCHW':
            b, _, c = patches.shape
            patches = patches.reshape(b, grid[0], grid[1], c).permute(0, 3, 1, 2).contiguous()
        # without prefix tokens (class_token=False, no Jumbo tokens) the map alone, as timm's
        return (patches, y[:, :prefix]) if with_prefix and prefix else patches

    def prune_intermediate_layers(
        self,
        indices: Union[int, Sequence[int]] = 1,
        prune_norm: bool = False,
        prune_head: bool = True,
    ) -> List[int]:
        """Drop the blocks after the last of ``indices`` and the classifier (timm API);
        returns the block indices.

        The kept blocks' outputs (:meth:`forward_intermediates`) stay what they were, as
        timm's ViT keeps them: once blocks are cut off, the new last block's output does
        not get the final norm (it had none before); :meth:`forward_features` and the
        final tokens of :meth:`forward_intermediates` have it after the kept blocks, as
        timm's. ``prune_norm=True`` drops the final norm (``norm=True`` and the final
        tokens go without it, as timm's), except while the model's last block stays: its
        output includes the norm, which would change it."""
        take, last = feature_take_indices(self.depth, indices)
        if last != self.depth - 1:
            self._norm_in_last_block = False  # the norm was the cut-off last block's
        self.blocks = self.blocks[: last + 1]
        if prune_norm and not self._norm_in_last_block:
            self.norm = None
        self.depth = len(self.blocks)
        self.feature_info = self.feature_info[: self.depth]
        if prune_head:
            self.fc_norm = nn.Identity()  # as timm's ViT
            self.reset_classifier(0, '')
        return take

    def load_pretrained(
        self,
        path: Union[str, 'os.PathLike[str]', Mapping[str, Any]],
        strict: bool = True,
        checkpoint_num_heads: Optional[int] = None,
        source: Optional[str] = None,
    ) -> Dict[str, List[str]]:
        """:meth:`LookHereVisionTransformer.load_pretrained` for the trunk, then the
        file's classifier (``head.*``) when it has one of this model's shape (official
        LookHere and timm ImageNet files); otherwise the classifier stays as it is: a
        file without one (a backbone file) with a warning, another class count (as for
        fine-tuning) with a log line. The keys of this model's classifier that were not
        loaded are in the report's ``missing``, the file's that were not in ``unexpected``.

        As timm's reader, a file's EMA weights (``state_dict_ema``, else ``model_ema``)
        are taken before its ``state_dict`` (timm's ``train.py`` saves both). The file is
        read once. Before anything is loaded, its head count and LookHere config are
        checked against this model with timm's words (:meth:`_check_file`: ``create_model``
        arguments and tags), and ``fc_norm.*`` (timm's ``global_pool='avg'`` files) against
        ``fc_norm=True``. ``checkpoint_num_heads`` defaults to the one given to
        ``timm.create_model``."""
        return self._load_file(path, strict, checkpoint_num_heads, source, direct=False)

    def _load_file(
        self,
        path: Union[str, 'os.PathLike[str]', Mapping[str, Any]],
        strict: bool,
        checkpoint_num_heads: Optional[int],
        source: Optional[str],
        direct: bool,
    ) -> Dict[str, List[str]]:
        """:meth:`load_pretrained`; ``direct``: for :meth:`load_state_dict` called by the
        user (not by timm's reader): the classifier's keys (``head.*``, ``fc_norm.*``)
        follow PyTorch's rules (missing / unexpected reported, refused with ``strict``,
        another shape refused), checked before anything is loaded."""
        if checkpoint_num_heads is None:
            checkpoint_num_heads = self._checkpoint_num_heads
        check_weights_argument('load_pretrained: path', path)
        if isinstance(path, (str, os.PathLike)):
            source = os.fspath(path)
            ckpt: Mapping[str, Any] = load_checkpoint_file(source)
        else:
            ckpt = path
        ckpt = ema_preferred(ckpt)
        where = source or 'the checkpoint'
        ckpt = self._adapt_input_conv(ckpt, where)
        self._check_file(ckpt, where, checkpoint_num_heads)
        classifier = _ClassifierKeys(self, ckpt)
        if strict:
            self._check_fc_norm(classifier, where)
        if direct:
            classifier.check_pytorch(self, strict)
        # the trunk's strict key check: without the classifier
        head, fc_norm = self.head, self.fc_norm
        self.head, self.fc_norm = nn.Identity(), nn.Identity()
        self._loading = True  # the loader's own load_state_dict calls are plain ones
        try:
            report = super().load_pretrained(ckpt, strict, checkpoint_num_heads, source)
        except CheckpointError as err:
            if type(err) is CheckpointError:  # its message is its one argument
                err.args = (_in_timm_words(str(err), self._name()),)
            raise
        finally:
            self.head, self.fc_norm, self._loading = head, fc_norm, False
        if direct:
            classifier.copy_pytorch()
        else:
            self._load_fc_norm(classifier, where)
            self._load_head(classifier, where)
        report['missing'] = sorted(report['missing'] + classifier.missing)
        report['unexpected'] = sorted(report['unexpected'] + classifier.unexpected)
        return report

    def _adapt_input_conv(self, ckpt: Mapping[str, Any], source: str) -> Mapping[str, Any]:
        """A 3-channel file's patch embedding adapted to this model's ``in_chans`` as timm
        adapts a pretrained first conv (:func:`timm.models.adapt_input_conv`: summed for one
        channel, repeated and scaled for more), with a log line; the file unchanged where
        the channels agree. Only this timm route does it, as timm's own models (files of
        every format, this model's own ``state_dict`` saved included; a ``state_dict``
        given to ``load_state_dict`` directly stays PyTorch's strict copy)."""
        mine = self.patch_embed.proj.weight
        container = next(
            (k for k in ('weights', 'state_dict', 'model') if isinstance(ckpt.get(k), Mapping)),
            None,
        )
        sd = ckpt[container] if container else ckpt
        keys = [
            k
            for k, v in sd.items()
            if str(k).endswith('patch_embed.proj.weight')
            and torch.is_tensor(v)
            and v.dim() == 4
            and v.shape[1] == 3 != mine.shape[1]
            and (v.shape[0], *v.shape[2:]) == (mine.shape[0], *mine.shape[2:])
        ]
        if not keys:
            return ckpt
        sd = dict(sd)
        for key in keys:
            sd[key] = adapt_input_conv(mine.shape[1], sd[key])
            self._log(
                f'{self._name()}: {source!r} {key} adapted from 3 to {mine.shape[1]} input '
                "channels (timm's adapt_input_conv)"
            )
        return {**ckpt, container: sd} if container else sd

    def _check_fc_norm(self, classifier: '_ClassifierKeys', source: str) -> None:
        """Refuse a file whose norm after the pooling (``fc_norm.*``, timm's
        ``global_pool='avg'`` ViTs) this model lacks, or a file with a final norm and no
        ``fc_norm.*`` for ``fc_norm=True``: either norm left out silently changes every
        output. The ``features_only`` wrapper, which drops the classifier, takes both."""
        if self._classifier_dropped:
            return
        theirs = classifier.theirs('fc_norm.')
        mine = classifier.mine('fc_norm.')
        if theirs and not mine:
            raise CheckpointError(
                f'{source!r} holds fc_norm.* ({", ".join(sorted(theirs))}): the norm after '
                "the pooling of timm's ViT with global_pool='avg' (in place of the final "
                f'norm), which {self._name()} lacks; build it as the file was: '
                "timm.create_model(..., global_pool='avg', fc_norm=True) (final_norm=False "
                f'alone would leave that norm out). {self.loose_loading} (the trunk alone)'
            )
        if mine and not theirs and any(str(k).startswith('norm.') for k in classifier.file_sd):
            raise CheckpointError(
                f'{source!r} has a final norm (norm.*) and no fc_norm.*, but {self._name()} '
                'has fc_norm=True (a norm after the pooling in place of the final norm): '
                'drop fc_norm=True'
            )

    def _load_fc_norm(self, classifier: '_ClassifierKeys', source: str) -> None:
        """Copy the file's ``fc_norm.*`` where this model has the same (strict loading
        refused the other cases before: :meth:`_check_fc_norm`)."""
        if classifier.fits('fc_norm.'):
            classifier.copy('fc_norm.')

    def _load_head(self, classifier: '_ClassifierKeys', source: str) -> None:
        """Copy the file's classifier (``head.*``) where it has this model's: the same
        structure (``head_type``) and shapes. A file whose classifier has this model's
        class count in the other structure gets a warning (the model keeps its random
        classifier: its logits would be noise), so does a file without a classifier
        (timm refuses it with ``Missing key(s)``; a backbone file is taken, its
        classifier random); another class count a log line (a new classifier, as for
        fine-tuning)."""
        theirs, mine = classifier.theirs('head.'), classifier.mine('head.')
        if not mine:
            return
        if not theirs:
            warnings.warn(
                f'{source!r} has no classifier (head.*): {self._name()} keeps its randomly '
                f'initialised {self.num_classes}-class classifier (its logits mean nothing '
                'until it is trained; timm refuses such a file with "Missing key(s) in '
                'state_dict: head.weight"). For the features alone: '
                'timm.create_model(..., num_classes=0); for the classifier the file was '
                'meant to have: load the file that holds it',
                stacklevel=3,
            )
            return
        if classifier.fits('head.'):
            classifier.copy('head.')
            self._log(  # the trunk's line lists head.* among what the backbone left out
                f'{self._name()}: classifier loaded from {source!r} '
                f'(head_type={self.head_type!r}: {", ".join(sorted(mine))})'
            )
            return
        file_type = 'mlp' if 'head.fc2.weight' in theirs else 'linear'
        out = theirs.get('head.fc2.weight' if file_type == 'mlp' else 'head.weight')
        classes = int(out.shape[0]) if out is not None and out.dim() == 2 else None
        if file_type != self.head_type and classes == self.num_classes:
            warnings.warn(
                f'{source!r} holds a {classes}-class {_HEAD_WORDS[file_type]}, but '
                f'{self._name()} has a {_HEAD_WORDS[self.head_type]} (head_type='
                f"{self.head_type!r}): the file's classifier is not loaded and this one stays "
                f"randomly initialised (its logits mean nothing). To use the file's "
                f'classifier: timm.create_model(..., head_type={file_type!r})',
                stacklevel=3,
            )
            return
        self._log(
            f'{self._name()}: {source!r} has a {classes}-class classifier, this model '
            f'num_classes={self.num_classes}: a new classifier (as for fine-tuning)'
        )

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign=False):
        """This model's own ``state_dict`` loads as in PyTorch; any other checkpoint
        (official LookHere ``{'weights', 'config'}``, timm / DeiT-III weights, a
        lookhere-dense backbone ``state_dict``) goes through :meth:`load_pretrained`'s
        conversions and checks. Called directly, the classifier's keys (``head.*``,
        ``fc_norm.*``) follow PyTorch's rules: the ones not loaded are returned as
        ``missing_keys`` / ``unexpected_keys``, ``strict`` refuses them, another shape is
        refused (before anything is loaded).

        When timm is reading a file into this model (``create_model(checkpoint_path=)``,
        ``timm.models.load_checkpoint``, mmseg's ``TIMMBackbone``, a pretrained file),
        the file is taken as :meth:`load_pretrained` takes it (a backbone file without a
        classifier with a warning), messages name that file, and the ``meta`` of a
        ``tools/convert_checkpoint.py`` file (head count, LookHere config), which timm's
        reader drops with everything beside ``state_dict``, is read back from it
        (:func:`_converted_meta`), so the file is taken and checked as mmseg's
        ``LookHereViT`` takes it. Else 'the checkpoint'. ``assign=True`` (PyTorch's:
        the tensors become the parameters) takes the model's own ``state_dict`` only;
        other formats are refused with it (their tensors are converted and copied: on a
        ``'meta'`` model nothing would be loaded)."""
        if getattr(self, '_loading', False):
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        path = _timm_file(self)
        source = path or 'the checkpoint'
        meta = _converted_meta(path) if path else None
        if meta is None and set(state_dict) == set(self.state_dict()):
            if path:  # a file timm reads: adapted to in_chans as load_pretrained adapts others
                state_dict = self._adapt_input_conv(state_dict, source)
            self._check_file(state_dict, source, record_only=True)
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        if assign:
            raise ValueError(
                f"{self._name()}: load_state_dict(..., assign=True) takes this model's own "
                f'state_dict only; {source} is another format (official LookHere, timm / '
                'DeiT-III, a converted file), whose tensors are converted and copied in: load '
                "it without assign (a model built on 'meta' first gets memory: "
                "model.to_empty(device='cpu'))"
            )
        ckpt = {'state_dict': dict(state_dict), 'meta': meta} if meta else dict(state_dict)
        report = self._load_file(ckpt, strict, None, source, direct=path is None)
        return _IncompatibleKeys(report['missing'], report['unexpected'])

    # -- the checks of a file, in timm's words ---------------------------------------------
    def _name(self) -> str:
        return self._timm_name or 'this LookHereTimmViT'

    def _check_file(
        self,
        ckpt: Mapping[str, Any],
        source: str,
        declared: Optional[int] = None,
        record_only: bool = False,
    ) -> None:
        """Refuse a file whose head count, position encoding or LookHere config does not
        fit this model, in one line naming the file, its value, the model's and the
        ``timm.create_model`` argument or tag to change (the trunk's loader checks the same
        things, in the words of mmseg's config: ``model.backbone.num_heads``, ...). Files
        that are no ViT checkpoint pass: the loader reports them.

        Args:
            declared: ``checkpoint_num_heads``: the file's head count, where it records none.
            record_only: check only what the file records (this model's own ``state_dict``,
                whose ``_extra_state`` the trunk checks as it loads), not the conventions
                for files without a head count.
        """
        try:
            weights = backbone_weights(ckpt)
        except CheckpointError:
            return
        if weights.pos_encoding == 'alibi2d' and self.pos_encoding != 'alibi2d':
            weights.lh_config = None  # as the loader: 2D-ALiBi slopes mean nothing here
        if not record_only or weights.num_heads is not None:
            self._check_heads(weights, source, declared)
        if weights.lh_config is not None:
            self._check_lh_config(weights, source)

    def _check_heads(self, weights: BackboneWeights, source: str, declared: Optional[int]) -> None:
        heads, how = file_num_heads(weights)
        name, mine = self._name(), self.num_heads
        if declared is not None:
            if not isinstance(declared, int) or isinstance(declared, bool) or declared < 1:
                raise CheckpointError(
                    'checkpoint_num_heads must be a positive int (the head count the file '
                    f'was trained with), got {declared!r}'
                )
            if weights.num_heads is not None and weights.num_heads != declared:
                raise CheckpointError(
                    f'checkpoint_num_heads={declared}, but {source!r} records '
                    f'{weights.num_heads} heads: drop checkpoint_num_heads'
                )
            heads, how = declared, 'stated by checkpoint_num_heads'
        if heads is None:
            raise CheckpointError(
                f'cannot verify that {source!r} was trained with num_heads={mine} (head count '
                f'{how}); the weights have the same shapes for any head count, but split into '
                'other heads they give wrong features: state the head count the file was '
                'trained with: timm.create_model(..., checkpoint_num_heads=N), or for a '
                'state_dict in hand model.load_pretrained(STATE_DICT, checkpoint_num_heads=N) '
                '(official LookHere files: 12; load the file itself, whose config records it)'
            )
        if heads == mine:
            return
        layout = ''
        if heads not in (6, 12, 16) and self.lh_config is not None:
            layout = (
                f' and another pos_encoding (LookHere head layouts need 6, 12 or 16 heads; '
                f"a {heads}-head model fits e.g. pos_encoding='rope2d', without a tag)"
            )
        really = ''
        if weights.num_heads is None and declared is None:
            really = f'; if the file has {mine} heads, pass checkpoint_num_heads={mine}'
        raise CheckpointError(
            f'{source!r} has {heads} attention heads per block ({how}), but {name} has '
            f'num_heads={mine}; the qkv weights have the same shapes for any head count, '
            'but split into other heads they give wrong features: pass '
            f'num_heads={heads}{layout} to timm.create_model{really}'
        )

    def _check_lh_config(self, weights: BackboneWeights, source: str) -> None:
        stored = dict(weights.lh_config or {})
        file_encoding = weights.pos_encoding or 'lookhere'
        name, variant = self._name(), (self._timm_name or '').split('.')[0]
        if self.pos_encoding != file_encoding:
            tags = [t for t in _FITS.get(variant, TAGS) if _tag_encoding(t) == file_encoding]
            how = ' / '.join(f'.{t}' for t in tags)
            if file_encoding == 'lookhere':
                how += ', or no tag and no pos_encoding='
            raise CheckpointError(
                f'{source!r} holds a {file_encoding!r} model, but {name} has '
                f'pos_encoding={self.pos_encoding!r}: build it with '
                f'pos_encoding={file_encoding!r} (the tag {how})'
            )
        mine = self.lh_config
        if mine is None:
            return
        if stored.get('learnable_slopes') is True and not mine.learnable_slopes:
            raise CheckpointError(
                f'{source!r} holds learned LookHere slopes (pos_enc.slopes.*), but {name} '
                'has fixed slopes: pass lh_config=dict(learnable_slopes=True) to '
                'timm.create_model'
            )
        if not self.lh_explicit:
            return  # the file's config is adopted
        stored.setdefault('bias_rounding', mine.bias_rounding)
        stored['learnable_slopes'] = mine.learnable_slopes
        try:
            theirs = resolve_lh_config(stored)
        except ValueError:
            return  # the loader says what is wrong with it
        keys = [k for k in OFFICIAL_KEYS if getattr(mine, k) != getattr(theirs, k)]
        if not keys:
            return
        given = ' and '.join(self._explicit_args) or 'preset= / lh_config='
        file_name = _config_name(theirs)
        advice = f"drop {given} to take the file's config"
        if file_name in _FITS.get(variant, ()):
            advice += f', or use {variant}.{file_name}'
        raise CheckpointError(
            f'{source!r} holds a model trained with the LookHere config {file_name} '
            f'({_config_values(theirs, keys)}), but {name} has {_config_name(mine)} '
            f'({_config_values(mine, keys)}), asked for by {given}: {advice}'
        )


class ClassifierKeysError(CheckpointError, RuntimeError):
    """A ``state_dict`` given to :meth:`LookHereTimmViT.load_state_dict` whose classifier
    keys (``head.*``, ``fc_norm.*``) do not fit, in PyTorch's words (a ``RuntimeError``,
    as PyTorch raises, and a :class:`~lookhere_dense.errors.CheckpointError`)."""


def _file_state_dict(ckpt: Mapping[str, Any]) -> Mapping[str, Any]:
    """The weights of a loaded checkpoint (official ``weights``, ``state_dict``, DeiT's
    ``model``, or the flat dict), without DDP's ``module.`` prefix where it has one (as
    the trunk's reader, :func:`~lookhere_dense.lookhere.weights.backbone_weights`)."""
    sd = ckpt
    for key in ('weights', 'state_dict', 'model'):
        if isinstance(ckpt.get(key), Mapping) and ckpt[key]:
            sd = ckpt[key]
            break
    if any(isinstance(k, str) and k.startswith('module.') for k in sd):
        sd = strip_prefix(sd, 'module.')
    return sd


class _ClassifierKeys:
    """The classifier tensors (``head.*``, ``fc_norm.*``) of a model and of a file, and
    which of them were loaded. The model's ``features_only`` wrapper drops the
    classifier: then a file's are left out on purpose (neither loaded nor unexpected)."""

    PARTS = ('head.', 'fc_norm.')

    def __init__(self, model: 'LookHereTimmViT', ckpt: Mapping[str, Any]):
        self.name = model._name()
        self.cls_name = type(model).__name__
        self.file_sd = _file_state_dict(ckpt)
        self._mine: Dict[str, Tensor] = {}
        self._theirs: Dict[str, Tensor] = {}
        if not model._classifier_dropped:
            self._mine = {
                f'{part}{k}': v
                for part in self.PARTS
                for k, v in getattr(model, part[:-1]).state_dict().items()
            }
            self._theirs = {
                k: v
                for k, v in self.file_sd.items()
                if isinstance(k, str) and k.startswith(self.PARTS) and torch.is_tensor(v)
            }
        self.loaded: Set[str] = set()

    def mine(self, part: str) -> Dict[str, Tensor]:
        return {k: v for k, v in self._mine.items() if k.startswith(part)}

    def theirs(self, part: str) -> Dict[str, Tensor]:
        return {k: v for k, v in self._theirs.items() if k.startswith(part)}

    def fits(self, part: str) -> bool:
        """The file has this part with the model's keys and shapes."""
        mine, theirs = self.mine(part), self.theirs(part)
        return (
            bool(mine)
            and set(mine) == set(theirs)
            and all(theirs[k].shape == v.shape for k, v in mine.items())
        )

    def copy(self, part: str) -> None:
        with torch.no_grad():
            for k, v in self.mine(part).items():
                v.copy_(self._theirs[k])
                self.loaded.add(k)

    @property
    def missing(self) -> List[str]:
        """The model's classifier keys that were not loaded."""
        return [k for k in self._mine if k not in self.loaded]

    @property
    def unexpected(self) -> List[str]:
        """The file's classifier keys that were not loaded."""
        return [k for k in self._theirs if k not in self.loaded]

    def check_pytorch(self, model: 'LookHereTimmViT', strict: bool) -> None:
        """Refuse as PyTorch's ``load_state_dict`` would: another shape always, keys
        missing or unexpected with ``strict`` (before anything is loaded).

        Raises:
            ClassifierKeysError: in PyTorch's words, with what to call instead.
        """
        mine, theirs = self._mine, self._theirs
        missing = [k for k in mine if k not in theirs]
        unexpected = [k for k in theirs if k not in mine]
        mismatched = [k for k in mine if k in theirs and theirs[k].shape != mine[k].shape]
        if not mismatched and not (strict and (missing or unexpected)):
            return
        errors = []
        if strict and missing:
            errors.append('Missing key(s) in state_dict: ' + ', '.join(f'"{k}"' for k in missing))
        if strict and unexpected:
            errors.append(
                'Unexpected key(s) in state_dict: ' + ', '.join(f'"{k}"' for k in unexpected)
            )
        errors += [
            f'size mismatch for {k}: copying a param with shape {tuple(theirs[k].shape)} from '
            f'checkpoint, the shape in current model is {tuple(mine[k].shape)}'
            for k in mismatched
        ]
        raise ClassifierKeysError(
            f'Error(s) in loading state_dict for {self.cls_name} ({self.name}): '
            + '; '.join(errors)
            + '. The classifier (head.*, fc_norm.*) does not fit: '
            + (
                'build the model with the num_classes / head_type the weights have, or '
                if mismatched
                else 'load_state_dict(state_dict, strict=False) loads the rest and returns '
                'these keys, or '
            )
            + 'model.load_pretrained(STATE_DICT) takes weights without a classifier or '
            'with another (a new classifier, as for fine-tuning; a warning without one)'
        )

    def copy_pytorch(self) -> None:
        """Copy the file's classifier tensors the model has, of its shapes (PyTorch's
        ``strict=False``; :meth:`check_pytorch` refused the rest)."""
        with torch.no_grad():
            for k, v in self._mine.items():
                if k in self._theirs and self._theirs[k].shape == v.shape:
                    v.copy_(self._theirs[k])
                    self.loaded.add(k)


class LookHereFeatures(FeatureGetterNet):
    """timm's ``features_only`` wrapper (``forward_intermediates`` getter) whose
    ``load_state_dict`` takes the checkpoints the model takes (timm's
    ``checkpoint_path=`` loads after the wrapping; a file's classifier is left out: the
    wrapper drops the model's, as timm's pruning does). ``out_indices`` are block indices
    counted from the first block, as timm's ViT reports them (``3``: the last three, e.g.
    ``(9, 10, 11)``); ``set_grad_checkpointing``, ``group_matcher`` and
    ``no_weight_decay`` are the model's (names under ``model.``)."""

    def __init__(self, model: nn.Module, out_indices: Any = 4, **kwargs: Any):
        # timm's ViT normalises them when it prunes; this wrapper keeps every block
        out_indices, _ = feature_take_indices(model.depth, out_indices)
        super().__init__(model, out_indices=out_indices, **kwargs)
        # the classifier goes, as timm's pruning drops it: never used here, it would hold
        # parameters without gradients (DDP's unused parameters, an optimizer group)
        model.reset_classifier(0, '')
        model.fc_norm = nn.Identity()  # a norm of the classifier's input, as timm's pruning
        model._classifier_dropped = True  # a file's classifier is left out on purpose

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> _IncompatibleKeys:
        """A ``state_dict`` in this wrapper's names (keys under ``model.``: its own, one
        with keys missing or extra, one of another wrapper) loads as in PyTorch, as timm's
        ``FeatureGetterNet`` loads it: ``strict=False`` loads the rest and returns the
        missing / unexpected keys (in this wrapper's names), ``strict=True`` refuses them
        by name; ``assign`` as PyTorch's. What its record (``model._extra_state``) says
        about the head count and LookHere config is checked first, in timm's words. Any
        other checkpoint (official LookHere, timm / DeiT-III, a model's own
        ``state_dict``, ...) goes to the model's :meth:`LookHereTimmViT.load_state_dict`
        (its conversions and checks; with ``strict`` and ``assign``)."""
        if any(isinstance(k, str) and k.startswith('model.') for k in state_dict):
            own = {
                k[len('model.') :]: v
                for k, v in state_dict.items()
                if isinstance(k, str) and k.startswith('model.')
            }
            self.model._check_file(own, _timm_file(self) or 'the checkpoint', record_only=True)
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """The model's :meth:`LookHereTimmViT.set_grad_checkpointing`."""
        self.model.set_grad_checkpointing(enable)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        """The model's :meth:`LookHereTimmViT.group_matcher`, for names under ``model.``."""
        groups = self.model.group_matcher(coarse)
        return dict(
            stem=_under_model(groups['stem']),
            blocks=[(_under_model(rx), suffix) for rx, suffix in groups['blocks']],
        )

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """The model's :meth:`LookHereTimmViT.no_weight_decay`, under ``model.``."""
        return {f'model.{name}' for name in self.model.no_weight_decay()}


def _under_model(pattern: str) -> str:
    """A ``group_matcher`` pattern of the model (``^a|^b``, matched at the start of a
    name) for the wrapper's names (``model.a``, ``model.b``)."""
    return r'^model\.(?:' + pattern.replace('^', '') + ')'


def _tag_encoding(tag: str) -> str:
    return TAGS[tag].get('pos_encoding', 'lookhere')


def _config_name(cfg: LookHereConfig) -> str:
    """The preset whose official keys ``cfg`` has, else 'of its own'."""
    return preset_name(cfg) or 'of its own'


def _config_values(cfg: LookHereConfig, keys: Sequence[str]) -> str:
    def show(value: Any) -> str:
        return repr(list(value) if isinstance(value, tuple) else value)

    return ', '.join(f'{k}={show(getattr(cfg, k))}' for k in keys)


def _cfg(tag: str) -> Dict[str, Any]:
    return dict(
        url='',
        custom_load=True,  # a file given with pretrained_cfg_overlay=dict(file=...)
        num_classes=1000,
        input_size=(3, 224, 224),
        pool_size=None,
        # the official LookHere evaluation (GreenCUBIC/lookhere data_prep.py): the short
        # side resized to 256 (torchvision's Resize: bilinear, antialiased), 224 cropped
        crop_pct=0.875,
        interpolation='bilinear',
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


#: The trunk loader's advice in mmseg's words -> in timm's.
_TIMM_WORDS = (
    ('set init_values=None', "pass init_values=0 (no LayerScale, as timm's ViT)"),
    ('set init_values to a number', 'pass init_values=1e-4 (LayerScale)'),
)


def _in_timm_words(msg: str, name: str) -> str:
    """A checkpoint message of the trunk's loader with its advice in ``create_model``
    terms: timm's argument names (``set num_layers=3`` -> ``pass depth=3``,
    :data:`~lookhere_dense.lookhere.vit.TIMM_ARGUMENT_NAMES` but the dropout rates, which
    :class:`LookHereTimmViT` takes itself); timm drops arguments given as None; there is no
    ``init_cfg``."""
    for theirs, ours in _TIMM_WORDS:
        msg = msg.replace(theirs, ours.replace('NAME', repr(name)))
    for timm_name, our_name in _RENAMES.items():
        msg = re.sub(rf'\bset {our_name}=', f'pass {timm_name}=', msg)
        msg = re.sub(rf'\b{our_name}=', f'{timm_name}=', msg)
    return msg.replace('Build the backbone the file', f'Build {name} like the model the file')


def _unknown_argument(name: str, key: str) -> str:
    """The message for an argument ``timm.create_model(name, key=...)`` no one takes: the
    close names among timm's and the model's own."""
    import difflib
    import inspect

    ours = [
        p
        for cls in (LookHereTimmViT, LookHereVisionTransformer)
        for p, arg in inspect.signature(cls.__init__).parameters.items()
        if p != 'self' and arg.kind not in (arg.VAR_KEYWORD, arg.VAR_POSITIONAL)
    ]
    timm_names = [k for k in _RENAMES] + [k for k in ours if k not in _RENAMES.values()]
    close = difflib.get_close_matches(key, sorted(set(timm_names)), n=2, cutoff=0.6)
    return (
        f'{name}: unexpected argument {key!r}'
        + (f'; did you mean {" or ".join(map(repr, close))}?' if close else '')
        + " (it takes timm's ViT names: embed_dim, depth, num_heads, in_chans, img_size, "
        'num_classes, ...)'
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


def _tag(pretrained_cfg: Any) -> Optional[str]:
    """The tag of the ``create_model`` call (``name.lh90``: timm passes ``'lh90'``)."""
    if isinstance(pretrained_cfg, PretrainedCfg):
        return pretrained_cfg.tag or None
    return pretrained_cfg if isinstance(pretrained_cfg, str) and pretrained_cfg else None


def _encoding_kwargs(variant: str, pretrained_cfg: Any, kwargs: Dict[str, Any]) -> None:
    """Set the position encoding of an explicit tag (``name.lh90``); a conflicting
    ``preset`` / ``pos_encoding`` argument is an error."""
    tag = _tag(pretrained_cfg)
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


def _timm_readers() -> Dict[Any, str]:
    """``{code of a timm function that reads a file into a model: its path argument}``."""
    from timm.models import _builder, _helpers

    return {
        inspect.unwrap(_helpers.load_checkpoint).__code__: 'checkpoint_path',
        inspect.unwrap(_builder.load_pretrained).__code__: 'pretrained_loc',
    }


def _timm_file(module: nn.Module) -> Optional[str]:
    """The file timm is reading into ``module`` (this model, or the ``features_only``
    wrapper around it) while it calls ``module.load_state_dict``: the ``checkpoint_path``
    of ``timm.models.load_checkpoint`` (which ``create_model(checkpoint_path=)`` and mmseg's
    ``TIMMBackbone`` call) or the file of timm's ``load_pretrained``; None otherwise
    (another caller, a model timm reads the file into that does not hold this one).

    timm hands the model the file's ``state_dict`` alone; the path is a local of its
    reader's frame. A timm that names these locals otherwise gives None: the old behaviour
    (messages say 'the checkpoint', a converted file's ``meta`` is not seen).
    """
    readers = _timm_readers()
    frame = sys._getframe(1)
    try:
        while frame is not None:
            key = readers.get(frame.f_code)
            if key is not None:
                owner = frame.f_locals.get('model')
                if owner is not module and getattr(owner, 'model', None) is not module:
                    return None
                if key == 'pretrained_loc' and frame.f_locals.get('load_from') != 'file':
                    return None
                path = frame.f_locals.get(key)
                return os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
            frame = frame.f_back
        return None
    finally:
        del frame


def _converted_meta(path: str) -> Optional[Dict[str, Any]]:
    """The ``meta`` of a backbone file written by ``tools/convert_checkpoint.py``
    (:func:`lookhere_dense.lookhere.weights.save_backbone_checkpoint`: ``{'state_dict',
    'meta': {'num_heads', 'lookhere_config', ...}}``), which timm's reader drops; None for
    any other file, or one that cannot be read here (timm's reader has read it: its own
    messages stand). A ``torch.save`` zip file is memory-mapped: its tensors are not read
    again (:func:`~lookhere_dense.checkpoint.checkpoint_head`)."""
    from .checkpoint import checkpoint_head

    ckpt = checkpoint_head(path)
    meta = ckpt.get('meta') if isinstance(ckpt, Mapping) and 'state_dict' in ckpt else None
    if not isinstance(meta, Mapping):
        return None
    if meta.get('num_heads') is None and meta.get('lookhere_config') is None:
        return None  # a Runner checkpoint's meta (epoch, iter, seed, ...)
    return dict(meta)


def _check_checkpoint(path: str, argument: str = 'checkpoint_path=') -> None:
    """Refuse a file timm is to read (``checkpoint_path=``, or the file of
    ``pretrained=True``) that it cannot read, naming the file and the problem (timm's own
    reader says ``weights_only=True blocked ...``, a bare ``KeyError`` or an empty
    ``FileNotFoundError``), before the model is built.

    An mmengine Runner checkpoint (``tools/train.py``'s ``iter_N.pth``) holds the message
    hub's ``HistoryBuffer`` and numpy objects besides tensors: where the file is refused
    for such an ``mmengine`` class, exactly those classes are allowed for
    ``torch.load(..., weights_only=True)`` from then on in the process, as
    :func:`lookhere_dense.register_all_modules` does (:mod:`lookhere_dense.compat`; nothing
    without mmengine), and the file is read again. Every other Python object stays
    refused; other files change nothing.

    Args:
        argument: the ``timm.create_model`` argument that gave the file (for messages).

    Raises:
        FileNotFoundError: the file does not exist.
        UnreadableCheckpointError: it is no checkpoint (a folder; an empty, damaged or
            text file; a pickle of other Python objects).
    """
    from . import compat
    from .checkpoint import checkpoint_problem

    if not os.path.exists(path):
        raise FileNotFoundError(
            f'checkpoint file not found: {path!r} (timm.create_model {argument}, a local file)'
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
            f'timm.create_model({argument}) takes a file written by torch.save '
            '(official LookHere, timm / DeiT-III, lookhere-dense or mmengine checkpoints) '
            'or a .safetensors file',
        )


#: why timm's other ``features_only`` wrappers do not fit a LookHere model
_OTHER_WRAPPERS = {
    'hook': (
        "timm's FeatureHookNet runs the whole model (its classifier kept) and hooks raw "
        '(B, 1 + N, C) block tokens (the last without the final norm), and its body.* keys '
        'take no LookHere / timm file'
    ),
    'fx': (
        "timm's FeatureGraphNet traces the forward with torch.fx, which the model refuses "
        '(the input checks and the attention built per input grid need real tensors)'
    ),
    'list': "timm's FeatureListNet runs the model's modules in sequence",
    'dict': "timm's FeatureDictNet runs the model's modules in sequence",
}


def _feature_cls(name: str, feature_cls: Any) -> type:
    """The ``features_only`` wrapper for ``create_model(..., feature_cls=...)``:
    ``'getter'`` (timm's default for ViTs) or timm's ``FeatureGetterNet`` mean this
    project's :class:`LookHereFeatures` (a ``forward_intermediates`` getter that drops the
    classifier and takes the files the model takes); a subclass of it is taken as given.

    The others are refused: each LookHere block is called with position arguments in
    every forward (the position encoding, the block index, the patch grid, the prefix
    tokens) and the last block's output includes the final norm, which only
    ``forward_intermediates`` does; timm's hook / fx / list / dict wrappers call or trace
    the modules themselves.

    Raises:
        ValueError: any other wrapper (``'hook'``, ``'fx'``, ``'list'``, ``'dict'``, their
            classes, another class), in one line saying why and what to use.
    """
    if isinstance(feature_cls, str) and feature_cls.lower() == 'getter':
        return LookHereFeatures
    if feature_cls is FeatureGetterNet:
        return LookHereFeatures
    if isinstance(feature_cls, type) and issubclass(feature_cls, LookHereFeatures):
        return feature_cls
    label = feature_cls.lower() if isinstance(feature_cls, str) else ''
    if isinstance(feature_cls, type):
        label = {
            'FeatureHookNet': 'hook',
            'FeatureGraphNet': 'fx',
            'FeatureListNet': 'list',
            'FeatureDictNet': 'dict',
        }.get(feature_cls.__name__, '')
    if 'hook' in label:  # timm's own test ('hook' anywhere in the name)
        label = 'hook'
    shown = (
        feature_cls
        if isinstance(feature_cls, str)
        else getattr(feature_cls, '__name__', feature_cls)
    )
    why = _OTHER_WRAPPERS.get(label, 'it is no forward_intermediates getter')
    raise ValueError(
        f'{name}: features_only=True with feature_cls={shown!r} is not supported: the '
        'LookHere blocks take position arguments in every forward (position encoding, '
        'block index, patch grid), which only forward_intermediates passes, and '
        f"{why}; leave feature_cls out (or pass feature_cls='getter': LookHereFeatures, "
        'the forward_intermediates wrapper), or call model.forward_intermediates(x, '
        "indices=..., output_fmt='NLC') for block tokens"
    )


def _pretrained_file(pretrained_cfg: Any, overlay: Mapping[str, Any]) -> Tuple[Optional[str], str]:
    """The local file of ``pretrained=True``, and the argument that gave it:
    ``pretrained_cfg_overlay=dict(file=...)``, else a ``pretrained_cfg`` (dict or
    ``PretrainedCfg``) with a ``file``."""
    if overlay.get('file'):
        return os.fspath(overlay['file']), 'pretrained_cfg_overlay=dict(file=)'
    cfg_file = (
        pretrained_cfg.get('file')
        if isinstance(pretrained_cfg, Mapping)
        else getattr(pretrained_cfg, 'file', None)
    )
    if cfg_file:
        return os.fspath(cfg_file), 'pretrained_cfg=dict(file=)'
    return None, ''


def _explicit_encoding_args(pretrained_cfg: Any, kwargs: Mapping[str, Any]) -> Tuple[str, ...]:
    """How the ``create_model`` call chose the LookHere config, for messages: the tag
    and / or ``preset=`` / ``lh_config=``."""
    tag = _tag(pretrained_cfg)
    out = [f'the tag .{tag}'] if tag else []
    out += [f'{key}=' for key in ('preset', 'lh_config') if kwargs.get(key) is not None]
    return tuple(out)


def _create(variant: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
    """Build one registered model through timm's ``build_model_with_cfg``.

    ``pretrained=True`` needs a file: timm's ``checkpoint_path=`` (loaded by timm after
    this function returns) or ``pretrained_cfg_overlay=dict(file=...)`` (also a
    ``pretrained_cfg`` with a ``file``), which :meth:`LookHereTimmViT.load_pretrained`
    reads (``custom_load``; timm's generic reader would drop the file's ``meta`` and load
    non-strictly for another ``num_classes``). Either file is checked before the model is
    built (:func:`_check_checkpoint`). ``checkpoint_num_heads=N`` states the head count of
    a file that records none.

    Raises:
        RuntimeError: ``pretrained=True`` without a file.
        FileNotFoundError, UnreadableCheckpointError: the file is missing or no checkpoint.
    """
    pretrained_cfg = kwargs.pop('pretrained_cfg', None)
    overlay = dict(kwargs.pop('pretrained_cfg_overlay', None) or {})
    if kwargs.get('init_values') == 0 and not isinstance(kwargs['init_values'], bool):
        # timm's ViT: init_values=0 (or None, which timm.create_model drops) is no LayerScale
        kwargs['init_values'] = None
    checkpoint_num_heads = kwargs.pop('checkpoint_num_heads', None)
    explicit = _explicit_encoding_args(pretrained_cfg, kwargs)
    _encoding_kwargs(variant, pretrained_cfg, kwargs)
    checkpoint = _timm_checkpoint_path(variant)
    if checkpoint is not None:
        _check_checkpoint(checkpoint)
    file, argument = _pretrained_file(pretrained_cfg, overlay)
    if pretrained and file is not None:
        _check_checkpoint(file, argument)
        # timm resets custom_load for a file given this way unless it is set: our reader
        overlay.setdefault('custom_load', True)
    if pretrained and file is None and not overlay.get('state_dict'):
        if checkpoint is None:
            raise RuntimeError(
                f'{variant}: no weights to download; pass the file, e.g. '
                "timm.create_model(NAME, checkpoint_path='LH_180_weights_and_config.pth') or "
                "pretrained=True, pretrained_cfg_overlay=dict(file='...'), or pretrained=False "
                "for random weights (mmseg's TIMMBackbone passes pretrained=True unless its "
                'config says pretrained=False)'
            )
        pretrained = False  # the weights are the checkpoint_path's, which timm loads next
    args = {**ARCHS[variant], **_rename(kwargs)}
    # timm's name: build_model_with_cfg sets in_chans from pretrained_cfg (3) unless given
    if 'in_channels' in args:
        args['in_chans'] = args.pop('in_channels')
    feature_cfg = dict(feature_cls=LookHereFeatures, prune=False, out_indices=3)
    features_only = args.get('features_only', False)
    tag = _tag(pretrained_cfg)

    name = f'{variant}.{tag}' if tag else variant
    if features_only and 'feature_cls' in args:
        feature_cfg['feature_cls'] = _feature_cls(name, args.pop('feature_cls'))

    def model_cls(**model_args: Any) -> LookHereTimmViT:
        # named before timm loads a pretrained file into it (inside build_model_with_cfg)
        try:
            model = LookHereTimmViT(**model_args)
        except ValueError as err:  # the trunk's argument checks, in timm's words and name
            if err.args and isinstance(err.args[0], str):
                err.args = (_in_timm_words(err.args[0].replace('LookHereViT', name), name),)
            raise
        except TypeError as err:  # an argument no one takes: the close names, in timm's
            unknown = re.search(r"unexpected keyword argument '(\w+)'", str(err))
            if unknown is None:
                raise
            raise TypeError(_unknown_argument(name, unknown.group(1))) from None
        model._timm_name = name
        model.patch_embed.owner = name  # its input errors name the timm model
        model._explicit_args = explicit
        model._checkpoint_num_heads = checkpoint_num_heads
        # timm reads a pretrained file before it wraps the model: its classifier goes then
        model._classifier_dropped = bool(features_only)
        return model

    return build_model_with_cfg(
        model_cls,
        variant,
        pretrained,
        pretrained_cfg=pretrained_cfg,
        pretrained_cfg_overlay=overlay,
        feature_cfg=feature_cfg,
        **args,
    )


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
