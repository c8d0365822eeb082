"""``LookHereViT``: the OpenMMLab backbone, a thin wrapper of the torch-only trunk.

:class:`~lookhere_dense.lookhere.vit.LookHereVisionTransformer` is the model (torch alone);
this class adds what an mmseg / mmdet config expects of a drop-in for mmseg's
``VisionTransformer``: ``init_cfg`` / ``pretrained`` (weights loaded in ``init_weights``),
``norm_cfg`` / ``act_cfg`` built by mmcv, ``num_fcs``, messages through mmengine's logger,
and the registration in mmseg's and mmdet's ``MODELS``. Same ``state_dict`` keys, same
outputs (NCHW maps per ``out_indices``; ``[map, cls]`` pairs with ``output_cls_token``).

It also takes the argument names of mmdet's ViTDet ``ViT`` (``projects/ViTDet``), so that
project's config builds with only ``type`` changed: :data:`MMDET_VIT_NAMES` are renamed,
:data:`MMDET_VIT_POS_ARGS` (the position embeddings LookHere replaces) are dropped with a
logged note. An argument neither class has is a :class:`~lookhere_dense.errors.ConfigError`
naming the close ones (as ``--cfg-options`` does), not a ``TypeError``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import warnings
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

from mmcv.cnn import build_activation_layer, build_norm_layer
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import PretrainedInit
from mmengine.runner.checkpoint import CheckpointLoader
from torch import nn

from lookhere_dense.errors import USER_ERRORS, ConfigError
from lookhere_dense.lookhere.vit import LookHereVisionTransformer
from lookhere_dense.lookhere.weights import HEADS_KEY
from lookhere_dense.validation import close_names

from ..registry import register_model

__all__ = ['LookHereViT', 'MMDET_VIT_NAMES', 'MMDET_VIT_POS_ARGS', 'mmdet_vit_arguments']

#: the keys of mmengine's ``Pretrained`` initialiser that the backbones' strict loading takes
PRETRAINED_KEYS = ('type', 'checkpoint', 'strict', 'prefix', 'map_location')
_PRETRAINED_KEYS = PRETRAINED_KEYS + (HEADS_KEY,)  # LookHereViT's: and the file's head count
#: checkpoint schemes the torch-only reader does not fetch (mmengine's loader does)
MMENGINE_SCHEMES = (
    'open-mmlab://',
    'openmmlab://',
    'mmcls://',
    'pavi://',
    's3://',
    'torchvision://',
    'modelzoo://',
)


#: norm layers that take ``(B, C, ...)`` maps: refused by class (``BN`` / ``SyncBN`` /
#: ``GN`` / ``IN`` might accept a token sequence whose length happens to be ``C``)
_CHANNEL_FIRST_NORMS = (
    nn.modules.batchnorm._BatchNorm,
    nn.GroupNorm,
    nn.modules.instancenorm._InstanceNorm,
)


#: the trunk's default width (what ``norm_cfg`` is probed at when ``embed_dims`` is not given)
_TRUNK_EMBED_DIMS = inspect.signature(LookHereVisionTransformer).parameters['embed_dims'].default


#: mmdet ViTDet ``ViT`` argument -> the ``LookHereViT`` argument of the same meaning (its
#: other arguments, ``img_size``, ``patch_size``, ``num_heads``, ``mlp_ratio``, ``qkv_bias``,
#: ``drop_path_rate``, ``norm_cfg``, ``act_cfg``, ``window_size``, ``window_block_indexes``
#: and ``init_cfg``, already have ``LookHereViT``'s names)
MMDET_VIT_NAMES: Dict[str, str] = {
    'embed_dim': 'embed_dims',
    'depth': 'num_layers',
    'in_chans': 'in_channels',
}

#: mmdet ViTDet ``ViT``'s position-embedding arguments (absolute embedding, decomposed
#: relative bias, the pretraining grid): LookHere's attention biases replace what they
#: configure, so they are dropped with a logged note
MMDET_VIT_POS_ARGS = (
    'use_abs_pos',
    'use_rel_pos',
    'rel_pos_zero_init',
    'pretrain_img_size',
    'pretrain_use_cls_token',
)

#: trunk arguments that the wrapper builds from an mmcv config
_BUILT_FROM_CFG = {'norm_layer': 'norm_cfg', 'act_layer': 'act_cfg'}


@functools.lru_cache(maxsize=None)
def _argument_names() -> FrozenSet[str]:
    """Every keyword ``LookHereViT`` takes under its own names."""
    names = set(inspect.signature(LookHereVisionTransformer).parameters)
    names |= set(inspect.signature(LookHereViT.__init__).parameters)
    return frozenset(names - set(_BUILT_FROM_CFG) - {'self', 'kwargs'})


def mmdet_vit_arguments(kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """``kwargs`` in ``LookHereViT``'s names: mmdet ViTDet ``ViT``'s names renamed
    (:data:`MMDET_VIT_NAMES`), its position-embedding arguments dropped
    (:data:`MMDET_VIT_POS_ARGS`, one logged warning naming them), everything else checked.

    Raises:
        lookhere_dense.errors.ConfigError: an mmdet name given with ``LookHereViT``'s
            (``embed_dim`` and ``embed_dims``), naming both; an argument neither class
            takes, naming the close ones (``did you mean embed_dims?``).
    """
    out = dict(kwargs)
    for mmdet_name, name in MMDET_VIT_NAMES.items():
        if mmdet_name not in out:
            continue
        if name in out:
            raise ConfigError(
                f"LookHereViT: {mmdet_name}={out[mmdet_name]!r} (mmdet ViT's name) and "
                f'{name}={out[name]!r} are the same argument; keep one of them'
            )
        out[name] = out.pop(mmdet_name)
    dropped = {key: out.pop(key) for key in MMDET_VIT_POS_ARGS if key in out}
    accepted = _argument_names()
    problems = []
    for key in [k for k in out if k not in accepted]:
        if key in _BUILT_FROM_CFG:
            problems.append(
                f'has no argument {key!r}; set {_BUILT_FROM_CFG[key]} (an mmcv config) instead'
            )
            continue
        # LookHereViT's names first, mmdet's where none of those is close
        close = close_names(key, sorted(accepted)) or close_names(key, MMDET_VIT_NAMES)
        problems.append(
            f'has no argument {key!r}'
            + (
                f'; did you mean {" or ".join(close)}?'
                if close
                else " (nor has mmdet's ViTDet ViT); the LookHereViT and "
                'LookHereVisionTransformer docstrings list the arguments'
            )
        )
    if problems:
        raise ConfigError('LookHereViT ' + '; it '.join(problems))
    if dropped:
        shown = ', '.join(f'{k}={v!r}' for k, v in dropped.items())
        print_log(
            f"LookHereViT ignores mmdet ViT's {shown}: LookHere's attention biases are the "
            "position encoding (pos_encoding='lookhere'; pos_encoding='abs' is a learned "
            'absolute embedding)',
            logger='current',
            level=logging.WARNING,
        )
    return out


def _check_norm_cfg(norm_cfg: Any, embed_dims: int) -> None:
    """Refuse a ``norm_cfg`` whose layer does not normalise token sequences: every norm
    of the backbone sees ``(B, N, C)`` tokens. mmcv's ``BN`` / ``SyncBN`` / ``GN`` /
    ``IN`` take ``(B, C, ...)`` maps (refused by class); any other layer is built once for
    ``C = embed_dims`` and run on a ``(1, C + 1, C)`` sequence, which it must take and
    return in the same shape (``LN``, ``nn.RMSNorm`` and other token norms pass; ``LN2d``,
    which wants maps, does not).

    Raises:
        lookhere_dense.errors.ConfigError: naming ``norm_cfg``, its value and why.
    """
    import torch

    accepted = "a norm over the channels of (B, N, C) tokens, e.g. dict(type='LN')"
    if not isinstance(embed_dims, int) or isinstance(embed_dims, bool) or embed_dims < 1:
        return  # the trunk refuses embed_dims itself, naming it
    problem = None
    if not isinstance(norm_cfg, dict) or norm_cfg.get('type') is None:
        problem = 'not a dict with a type'
    else:
        try:
            layer = build_norm_layer(norm_cfg, embed_dims)[1]
        except KeyError:
            problem = f'{getattr(norm_cfg["type"], "__name__", norm_cfg["type"])!r} is not a layer type mmcv knows'
        except Exception as err:  # mmcv's own argument errors
            problem = (
                f'mmcv cannot build it for {embed_dims} channels ({type(err).__name__}: {err})'
            )
        else:
            name = type(layer).__name__
            if isinstance(layer, _CHANNEL_FIRST_NORMS):
                problem = f'it builds {name}, which normalises (B, C, ...) maps, not the (B, N, C) token sequences every norm of this backbone runs on'
            else:
                probe = torch.zeros(1, embed_dims + 1, embed_dims)
                try:
                    with torch.no_grad():
                        out = layer(probe)
                    if not isinstance(out, torch.Tensor) or out.shape != probe.shape:
                        problem = f'{name} turns (B, N, C) tokens into {getattr(out, "shape", type(out))}'
                except Exception as err:
                    problem = (
                        f'{name} does not take (B, N, C) tokens ({type(err).__name__}: {err})'
                    )
    if problem is not None:
        raise ConfigError(f'LookHereViT norm_cfg={norm_cfg!r}: {problem}; accepted: {accepted}')


def split_init_cfg(
    init_cfg: Union[None, Mapping[str, Any], Sequence[Mapping[str, Any]]], owner: str
) -> Tuple[Optional[Mapping[str, Any]], List[Mapping[str, Any]]]:
    """``(pretrained, others)`` of an ``init_cfg`` (a dict, a list of dicts, or None): its
    ``Pretrained`` entry, which the backbone loads strictly itself, and mmengine's other
    initialisers (``Constant``, ``TruncNormal``, ...), which run first, as
    ``BaseModule.init_weights`` orders them.

    Raises:
        ConfigError: more than one ``Pretrained`` entry, naming ``owner``.
    """
    cfgs = [init_cfg] if isinstance(init_cfg, Mapping) else list(init_cfg or ())
    pretrained = [
        c
        for c in cfgs
        if isinstance(c, Mapping) and c.get('type') in ('Pretrained', PretrainedInit)
    ]
    if len(pretrained) > 1:
        raise ConfigError(
            f'{owner} init_cfg has {len(pretrained)} Pretrained entries '
            f'({[p.get("checkpoint") for p in pretrained]}); give one'
        )
    others = [c for c in cfgs if not any(c is p for p in pretrained)]
    return (pretrained[0] if pretrained else None), others


def run_mmengine_inits(module: BaseModule, others: List[Mapping[str, Any]]) -> None:
    """``BaseModule.init_weights`` of ``module`` with only ``others`` as its ``init_cfg``
    (none of them ``Pretrained``: mmengine's loader would load what fits and warn)."""
    init_cfg = module.init_cfg
    module.init_cfg = others
    try:
        BaseModule.init_weights(module)
    finally:
        module.init_cfg = init_cfg


def pretrained_checkpoint(
    cfg: Mapping[str, Any], owner: str, allowed: Sequence[str]
) -> Tuple[Any, Any]:
    """``(path, checkpoint)`` of a ``Pretrained`` ``init_cfg``: the checkpoint is the path,
    or the loaded dict where mmengine fetches the file (its URL schemes) or ``prefix``
    picks a part of it (:func:`weights_with_prefix`).

    Raises:
        ConfigError: keys not in ``allowed``, or no ``checkpoint``; naming ``owner``.
    """
    unknown = sorted(set(cfg) - set(allowed))
    if unknown or not cfg.get('checkpoint'):
        raise ConfigError(
            f'{owner} init_cfg {dict(cfg)}: '
            + (
                f'unknown keys {unknown}; allowed: {list(allowed)}'
                if unknown
                else 'needs checkpoint=PATH'
            )
        )
    path = cfg['checkpoint']
    checkpoint: Any = path
    if isinstance(path, str) and path.startswith(MMENGINE_SCHEMES):
        checkpoint = CheckpointLoader.load_checkpoint(path, map_location='cpu', logger='silent')
    if cfg.get('prefix'):
        checkpoint = weights_with_prefix(checkpoint, cfg['prefix'], path, owner)
    return path, checkpoint


def weights_with_prefix(
    checkpoint: Any, prefix: str, path: Any, owner: str = 'LookHereViT'
) -> Dict[str, Any]:
    """``init_cfg``'s ``prefix`` (as mmengine's ``Pretrained``): the checkpoint's tensors
    whose keys start with ``prefix``, the prefix removed (``student.backbone.`` of a
    distillation run, ``backbone.`` of a segmentor).

    Raises:
        CheckpointError: no key starts with ``prefix`` (naming some keys of the file).
    """
    from lookhere_dense.checkpoint import listed, load_checkpoint_file
    from lookhere_dense.errors import CheckpointError

    if not prefix.endswith('.'):
        prefix += '.'  # as mmengine's Pretrained: 'backbone' is 'backbone.'
    ckpt = checkpoint if isinstance(checkpoint, Mapping) else load_checkpoint_file(path)
    weights = next((ckpt[k] for k in ('state_dict', 'weights', 'model') if k in ckpt), ckpt)
    picked = {
        k[len(prefix) :]: v
        for k, v in (weights.items() if isinstance(weights, Mapping) else ())
        if isinstance(k, str) and k.startswith(prefix)
    }
    if not picked:
        keys = (
            sorted(k for k in weights if isinstance(k, str))
            if isinstance(weights, Mapping)
            else []
        )
        raise CheckpointError(
            f'{owner} init_cfg prefix={prefix!r}: no tensor of {str(path)!r} has a key '
            f'starting with it (its keys: {listed(keys, 6)})'
        )
    return {'state_dict': picked}


@register_model()
class LookHereViT(LookHereVisionTransformer, BaseModule):
    """Plain ViT backbone with LookHere directed-attention position encoding (OpenMMLab).

    Takes every argument of :class:`~lookhere_dense.lookhere.vit.LookHereVisionTransformer`
    (mmseg ``VisionTransformer``'s names where the meaning is the same: ``img_size``,
    ``patch_size``, ``embed_dims``, ``num_layers``, ``num_heads``, ``out_indices``,
    ``with_cls_token``, ``output_cls_token``, ``final_norm``, ``drop_path_rate``, ...;
    LookHere's: ``preset``, ``lh_config``, ``pos_encoding``, ``attn_backend``,
    ``window_size``, ...), with mmcv configs instead of the trunk's layer factories:

    Args:
        norm_cfg (dict): every norm, built by mmcv's ``build_norm_layer``; the norms run on
            ``(B, N, C)`` tokens, so its layer must normalise those (``'LN'``, an RMSNorm;
            ``BN`` / ``GN`` / ``IN`` / ``LN2d`` are refused when built).
            Default: ``dict(type='LN')`` (eps 1e-5, as the official model).
        act_cfg (dict): the MLP activation, built by mmcv's ``build_activation_layer``.
            Default: ``dict(type='GELU')``.
        num_fcs (int): MLP layers; only 2 is supported. Default: 2.
        pretrained (str, optional): deprecated, use ``init_cfg``. Default: None.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads
            official LookHere, timm / DeiT-III or lookhere-dense weights in
            :meth:`init_weights` (keys ``checkpoint``, ``strict``, ``prefix`` -- only the
            tensors whose keys start with it, the prefix removed, as mmengine's
            ``Pretrained`` -- ``map_location`` (accepted; the weights are read on the CPU
            and moved with the model), and ``checkpoint_num_heads`` for files that do not
            record their head count; see
            :func:`lookhere_dense.lookhere.weights.load_backbone_weights`); other
            ``init_cfg`` types are mmengine's. Default: None (the official random
            initialisation).
        **kwargs: the trunk's arguments.
    """

    #: the advice of a strict refusal, in a config's words
    loose_loading = "init_cfg=dict(type='Pretrained', ..., strict=False) loads what fits"

    def __init__(
        self,
        norm_cfg: dict = dict(type='LN'),
        act_cfg: dict = dict(type='GELU'),
        num_fcs: int = 2,
        pretrained: Optional[str] = None,
        init_cfg: Optional[Union[dict, List[dict]]] = None,
        **kwargs: Any,
    ):
        if init_cfg is not None and pretrained is not None:
            raise ConfigError(
                f'LookHereViT got pretrained={pretrained!r} and init_cfg={init_cfg!r}; give '
                "one: mmseg's segmentors hand model.pretrained to the backbone (mmseg's "
                'ViT / Segmenter configs set it to weights of their own backbone), so under '
                'such a base config set pretrained=None in model (--cfg-options '
                'model.pretrained=None; tools/train.py and tools/test.py clear it themselves)'
            )
        if isinstance(pretrained, str):
            warnings.warn(
                'pretrained is deprecated, use init_cfg=dict(type="Pretrained", checkpoint=...)',
                DeprecationWarning,
                stacklevel=2,
            )
            init_cfg = dict(type='Pretrained', checkpoint=pretrained)
        elif pretrained is not None:
            raise TypeError('pretrained must be a str or None')
        if num_fcs != 2:
            raise ValueError(f'LookHereViT supports num_fcs=2 only (got {num_fcs})')
        kwargs = mmdet_vit_arguments(kwargs)
        _check_norm_cfg(norm_cfg, kwargs.get('embed_dims', _TRUNK_EMBED_DIMS))
        try:
            super().__init__(
                norm_layer=lambda dim: build_norm_layer(norm_cfg, dim)[1],
                act_layer=lambda: build_activation_layer(act_cfg),
                **kwargs,
            )
        except ValueError as err:
            # the trunk's argument checks raise ValueError naming the argument and value
            # (torch-only code); in a config that is a ConfigError: the tools print it as
            # one ``error:`` line instead of a traceback through the registry
            if isinstance(err, USER_ERRORS):
                raise
            msg = str(err)
            raise ConfigError(
                msg if msg.startswith('LookHereViT') else f'LookHereViT: {msg}'
            ) from err
        self.init_cfg = init_cfg  # BaseModule's (its __init__ ran with None in the MRO)

    def _log(self, msg: str) -> None:
        print_log(msg, logger='current')

    def init_weights(self) -> None:
        """mmengine's initialisers of ``init_cfg``, then its ``Pretrained`` checkpoint
        loaded strictly (a list's entry too); no ``init_cfg``: the trunk's official
        initialisation."""
        cfg, others = split_init_cfg(self.init_cfg, 'LookHereViT')
        if others:
            run_mmengine_inits(self, others)
        elif cfg is None:
            LookHereVisionTransformer.init_weights(self)
            return
        if cfg is not None:  # after the others, as mmengine orders them: strictly
            path, checkpoint = pretrained_checkpoint(cfg, 'LookHereViT', _PRETRAINED_KEYS)
            self.load_pretrained(
                checkpoint,
                strict=cfg.get('strict', True),
                checkpoint_num_heads=cfg.get(HEADS_KEY),
                source=path,
            )
            self._is_init = True
