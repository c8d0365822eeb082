"""``LookHereViT``: the OpenMMLab backbone, a thin wrapper of the torch-only trunk.

:class:`~lookhere_dense.lookhere.vit.LookHereVisionTransformer` is the model (torch alone);
this class adds what an mmseg / mmdet config expects of a drop-in for mmseg's
``VisionTransformer``: ``init_cfg`` / ``pretrained`` (weights loaded in ``init_weights``),
``norm_cfg`` / ``act_cfg`` built by mmcv, ``num_fcs``, messages through mmengine's logger,
and the registration in mmseg's and mmdet's ``MODELS``. Same ``state_dict`` keys, same
outputs (NCHW maps per ``out_indices``; ``[map, cls]`` pairs with ``output_cls_token``).
"""

from __future__ import annotations

import warnings
from typing import Any, List, Optional, Union

from mmcv.cnn import build_activation_layer, build_norm_layer
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from mmengine.runner.checkpoint import CheckpointLoader
from torch import nn

from lookhere_dense.errors import ConfigError
from lookhere_dense.lookhere.vit import LookHereVisionTransformer
from lookhere_dense.lookhere.weights import HEADS_KEY

from ..registry import register_model

__all__ = ['LookHereViT']

#: the keys ``init_cfg=dict(type='Pretrained', ...)`` takes (mmengine's and ours)
_PRETRAINED_KEYS = ('type', 'checkpoint', 'strict', 'prefix', 'map_location', HEADS_KEY)
#: checkpoint schemes the torch-only reader does not fetch (mmengine's loader does)
_MMENGINE_SCHEMES = (
    'open-mmlab://',
    'openmmlab://',
    'mmcls://',
    'pavi://',
    's3://',
    'torchvision://',
    'modelzoo://',
)


def _check_norm_cfg(norm_cfg: Any) -> None:
    """Refuse a ``norm_cfg`` whose layer does not normalise token sequences: every norm
    of the backbone sees ``(B, N, C)`` tokens, which ``nn.LayerNorm`` (mmcv's ``'LN'``,
    or a subclass) normalises over ``C``; mmcv's ``BN`` / ``SyncBN`` / ``GN`` / ``IN``
    take ``(B, C, ...)`` maps and would fail (or normalise the wrong axis) at forward.

    Raises:
        lookhere_dense.errors.ConfigError: naming ``norm_cfg``, its value and what it
            takes.
    """
    accepted = "accepted: dict(type='LN', ...) (nn.LayerNorm or a subclass of it)"
    kind = norm_cfg.get('type') if isinstance(norm_cfg, dict) else None
    cls = kind
    if isinstance(kind, str):
        with MODELS.switch_scope_and_registry(None) as registry:
            cls = registry.get(kind)
    if isinstance(cls, type) and issubclass(cls, nn.LayerNorm):
        return
    name = getattr(kind, '__name__', kind)
    why = (
        'not a dict with a type'
        if kind is None
        else f'{name!r} is not a layer type mmcv knows'
        if cls is None
        else f'{name!r} builds {getattr(cls, "__name__", cls)}, which does not normalise the '
        '(B, N, C) token sequences every norm of this backbone runs on'
    )
    raise ConfigError(f'LookHereViT norm_cfg={norm_cfg!r}: {why}; {accepted}')


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
        norm_cfg (dict): every norm, built by mmcv's ``build_norm_layer``; its layer must
            be ``nn.LayerNorm`` (``'LN'``) or a subclass, as the norms run on ``(B, N, C)``
            tokens (``BN`` / ``GN`` / ``IN`` are refused when built).
            Default: ``dict(type='LN')`` (eps 1e-5, as the official model).
        act_cfg (dict): the MLP activation, built by mmcv's ``build_activation_layer``.
            Default: ``dict(type='GELU')``.
        num_fcs (int): MLP layers; only 2 is supported. Default: 2.
        pretrained (str, optional): deprecated, use ``init_cfg``. Default: None.
        init_cfg (dict, optional): ``dict(type='Pretrained', checkpoint=PATH)`` loads
            official LookHere, timm / DeiT-III or lookhere-dense weights in
            :meth:`init_weights` (keys ``checkpoint``, ``strict``, and
            ``checkpoint_num_heads`` for files that do not record their head count; see
            :func:`lookhere_dense.lookhere.weights.load_backbone_weights`); other
            ``init_cfg`` types are mmengine's. Default: None (the official random
            initialisation).
        **kwargs: the trunk's arguments.
    """

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
            raise ValueError('init_cfg and pretrained cannot be set at the same time')
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
        _check_norm_cfg(norm_cfg)
        super().__init__(
            norm_layer=lambda dim: build_norm_layer(norm_cfg, dim)[1],
            act_layer=lambda: build_activation_layer(act_cfg),
            **kwargs,
        )
        self.init_cfg = init_cfg  # BaseModule's (its __init__ ran with None in the MRO)

    def _log(self, msg: str) -> None:
        print_log(msg, logger='current')

    def init_weights(self) -> None:
        """Load the ``Pretrained`` checkpoint of ``init_cfg``, else mmengine's init of
        another ``init_cfg``, else the trunk's official initialisation."""
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            unknown = sorted(set(cfg) - set(_PRETRAINED_KEYS))
            if unknown or not cfg.get('checkpoint'):
                raise ValueError(
                    f'LookHereViT init_cfg {dict(cfg)}: '
                    + (
                        f'unknown keys {unknown}; allowed: {list(_PRETRAINED_KEYS)}'
                        if unknown
                        else 'needs checkpoint=PATH'
                    )
                )
            path = cfg['checkpoint']
            checkpoint: Any = path
            if isinstance(path, str) and path.startswith(_MMENGINE_SCHEMES):
                checkpoint = CheckpointLoader.load_checkpoint(
                    path, map_location='cpu', logger='silent'
                )
            self.load_pretrained(
                checkpoint,
                strict=cfg.get('strict', True),
                checkpoint_num_heads=cfg.get(HEADS_KEY),
                source=path,
            )
            self._is_init = True
            return
        if cfg is not None:
            BaseModule.init_weights(self)
            return
        LookHereVisionTransformer.init_weights(self)
