"""``SimpleFPN``: ViTDet's simple feature pyramid (Li et al., ECCV 2022).

A plain ViT has one map at stride ``p`` (the patch size). The simple pyramid resamples
that single map by powers of two -- transposed convolutions up, max-pooling down -- and
gives every level a 1x1 + 3x3 conv pair; no top-down or lateral fusion. With ``p = 16`` and
the default ``scale_factors=(4, 2, 1, 0.5)`` the levels have strides 4, 8, 16, 32, the
inputs of mmdet's RPN / RoI heads and mmseg's UPerNet. Extra levels (P6 for the RPN) are
max-pooled from the last one, as detectron2's ``LastLevelMaxPool``.

The neck knows nothing of LookHere: it takes any backbone output tuple and reads one map.

It also takes the arguments of mmdet's ``projects/ViTDet`` ``SimpleFPN``
(``backbone_channel=768, in_channels=[192, 384, 768, 768], out_channels=256, num_outs=5,
norm_cfg=dict(type='LN2d')``), so that config's neck builds unchanged. It is registered in
mmengine's root ``MODELS`` (found from the mmseg and mmdet scopes alike), so importing
mmdet's ViTDet project, which registers its own ``SimpleFPN`` in mmdet's registry, does
not clash; in the mmdet scope the project's class then wins.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule, build_activation_layer, build_norm_layer
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch import Tensor

from ...errors import ConfigError
from ...validation import check_int, is_int
from .layer_norm_2d import LayerNorm2d

__all__ = ['SimpleFPN', 'scale_steps', 'resample_stage', 'level_channels']


def scale_steps(scale: float) -> int:
    """Number of x2 steps of a power-of-two ``scale``: ``4 -> 2``, ``1 -> 0``, ``0.5 -> -1``.

    Raises:
        ConfigError (a ValueError): ``scale`` is not a positive power of two.
    """
    if not isinstance(scale, (int, float)) or scale <= 0:
        raise ConfigError(f'SimpleFPN scale factors must be positive powers of two, got {scale!r}')
    steps = math.log2(scale)
    if steps != round(steps):
        raise ConfigError(
            f'SimpleFPN scale factors must be powers of two (4, 2, 1, 0.5, ...), got {scale!r}'
        )
    return int(round(steps))


def level_channels(channels: int, steps: int) -> int:
    """Channels of a pyramid level ``steps`` x2 steps from a ``channels`` map: halved per
    upsampling step (ViTDet), unchanged otherwise."""
    return channels // (2**steps) if steps > 0 else channels


def resample_stage(
    channels: int, steps: int, norm_cfg: Optional[dict], act_cfg: dict
) -> Tuple[nn.Module, int]:
    """The resampling that takes the backbone map to one pyramid level.

    * ``steps > 0``: ``steps`` stride-2 transposed convs, each halving the channels, with
      norm + activation between them (not after the last), as ViTDet;
    * ``steps == 0``: identity;
    * ``steps < 0``: ``|steps|`` 2x2 max-pools.

    Args:
        channels: input channels ``C``.
        steps: signed number of x2 steps.
        norm_cfg, act_cfg: mmcv configs of the layers between transposed convs.

    Returns:
        ``(module, out_channels)``; ``module`` maps ``(B, C, H, W)`` to
        ``(B, C / 2**steps, H * 2**steps, W * 2**steps)`` for ``steps > 0``, and to
        ``(B, C, floor(H / 2**|steps|), floor(W / 2**|steps|))`` otherwise.
    """
    if steps == 0:
        return nn.Identity(), channels
    if steps < 0:
        return nn.Sequential(*[nn.MaxPool2d(2, 2) for _ in range(-steps)]), channels
    if channels % (2**steps):
        raise ConfigError(
            f'SimpleFPN: upsampling x{2**steps} halves the channels {steps} '
            f'times, so in_channels={channels} must be divisible by {2**steps}'
        )
    layers: List[nn.Module] = []
    for i in range(steps):
        layers.append(nn.ConvTranspose2d(channels, channels // 2, kernel_size=2, stride=2))
        channels //= 2
        if i < steps - 1:
            if norm_cfg is not None:
                layers.append(build_norm_layer(norm_cfg, channels)[1])
            layers.append(build_activation_layer(act_cfg))
    return nn.Sequential(*layers), channels


@MODELS.register_module(force=True)
class SimpleFPN(BaseModule):
    """ViTDet's simple feature pyramid from the last map of a plain backbone.

    Registered in mmengine's root ``MODELS``: found in the mmseg and mmdet scopes (see the
    module docstring).

    Args:
        in_channels (int | list[int]): channels of the backbone map (``embed_dims``); or,
            with ``backbone_channel`` (mmdet's ViTDet form), the channels of each resampled
            level (``[C/4, C/2, C, C]`` for the default scale factors), checked.
        out_channels (int): channels of every output level. Default: 256.
        scale_factors (Sequence[float]): resampling factor of each level relative to the
            backbone map; powers of two in decreasing order. Default: ``(4.0, 2.0, 1.0, 0.5)``.
        num_outs (int, optional): number of outputs; levels beyond ``len(scale_factors)``
            are max-pooled (kernel 1, stride 2) from the previous output. None: one per
            scale factor. Default: None.
        in_index (int): which element of the backbone output tuple to use. Default: -1.
        norm_cfg (dict, optional): norm of the 1x1 / 3x3 output convs and between
            transposed convs, one for NCHW maps (a token LayerNorm, ``'LN'``, is refused);
            None: no norm. Default: ``dict(type='LN2d')``.
        act_cfg (dict): activation between transposed convs. Default: ``dict(type='GELU')``.
        init_cfg (dict | list[dict], optional): Default: None (mmcv ``ConvModule``'s Kaiming
            init, PyTorch's default for the transposed convs).
        backbone_channel (int, optional): mmdet ViTDet's name for the channels of the
            backbone map; then ``in_channels`` lists the levels' channels. Default: None.
        conv_cfg (dict, optional): conv config of the 1x1 / 3x3 convs (mmcv
            ``ConvModule``). Default: None.

    Shapes:
        ``forward(inputs)``: ``inputs[in_index]`` is ``(B, in_channels, h, w)``; returns a
        tuple of ``num_outs`` maps ``(B, out_channels, h * s, w * s)`` for the scale
        factors ``s`` (floored for ``s < 1``; ``h`` and ``w`` must be at least ``1 / s``),
        then the extra levels.
    """

    def __init__(
        self,
        in_channels: Union[int, Sequence[int]],
        out_channels: int = 256,
        scale_factors: Sequence[float] = (4.0, 2.0, 1.0, 0.5),
        num_outs: Optional[int] = None,
        in_index: int = -1,
        norm_cfg: Optional[dict] = dict(type='LN2d'),
        act_cfg: dict = dict(type='GELU'),
        init_cfg: Optional[Union[dict, List[dict]]] = None,
        backbone_channel: Optional[int] = None,
        conv_cfg: Optional[dict] = None,
    ):
        super().__init__(init_cfg=init_cfg)
        scale_factors = tuple(scale_factors)
        if not scale_factors:
            raise ConfigError('SimpleFPN needs at least one scale factor')
        steps = [scale_steps(s) for s in scale_factors]
        if any(a <= b for a, b in zip(steps, steps[1:])):
            raise ConfigError(
                'SimpleFPN scale_factors must be strictly decreasing (finest '
                f'level first, like the strides of the heads), got {scale_factors}'
            )
        in_channels = self._backbone_channels(in_channels, backbone_channel, steps)
        for name, value in (('out_channels', out_channels), ('num_outs', num_outs)):
            if value is not None:
                check_int(f'SimpleFPN {name}', value)
        num_outs = len(scale_factors) if num_outs is None else num_outs
        if num_outs < len(scale_factors):
            raise ConfigError(
                f'num_outs={num_outs} is smaller than the number of scale factors '
                f'({len(scale_factors)})'
            )
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.scale_factors = scale_factors
        self.num_outs = num_outs
        self.in_index = in_index

        self.resamplers = nn.ModuleList()
        self.lateral_convs = nn.ModuleList()
        self.output_convs = nn.ModuleList()
        for s in steps:
            resample, channels = resample_stage(in_channels, s, norm_cfg, act_cfg)
            self.resamplers.append(resample)
            self.lateral_convs.append(
                ConvModule(
                    channels, out_channels, 1, conv_cfg=conv_cfg, norm_cfg=norm_cfg, act_cfg=None
                )
            )
            self.output_convs.append(
                ConvModule(
                    out_channels,
                    out_channels,
                    3,
                    padding=1,
                    conv_cfg=conv_cfg,
                    norm_cfg=norm_cfg,
                    act_cfg=None,
                )
            )
        self._check_map_norms(norm_cfg)
        self._min_side = 2 ** max(0, -min(steps))

    def _check_map_norms(self, norm_cfg: Optional[dict]) -> None:
        """Refuse a token LayerNorm (``dict(type='LN')``, as in ViTDet's backbone config):
        on an NCHW map it normalises the width, not the channels -- a crash deep in torch,
        or, where the width equals the channels, features silently wrong."""
        for name, module in self.named_modules():
            if isinstance(module, nn.LayerNorm) and not isinstance(module, LayerNorm2d):
                raise ConfigError(
                    f'SimpleFPN norm_cfg={norm_cfg!r} builds nn.LayerNorm ({name}), which '
                    'normalises the last dimension: the width of an NCHW map, not its '
                    "channels. Use norm_cfg=dict(type='LN2d') (LayerNorm over the channels, "
                    "ViTDet's neck norm)"
                )

    @staticmethod
    def _backbone_channels(in_channels: Any, backbone_channel: Any, steps: List[int]) -> int:
        """The backbone map's channels from either form of the arguments (ours:
        ``in_channels=C``; mmdet ViTDet's: ``backbone_channel=C`` and the levels' channels
        as ``in_channels``, which must be what the resampling gives)."""

        def positive_int(x: Any) -> bool:
            return is_int(x) and x >= 1

        if backbone_channel is None:
            if not positive_int(in_channels):
                hint = (
                    " (or, as in mmdet's ViTDet config, backbone_channel=C with the "
                    'per-level channels in_channels=[C/4, C/2, C, C])'
                    if isinstance(in_channels, (list, tuple))
                    else ''
                )
                raise ConfigError(
                    'SimpleFPN reads one backbone map: in_channels must be a '
                    'positive int (the backbone embed_dims), got '
                    f'{in_channels!r}{hint}'
                )
            return in_channels
        if not positive_int(backbone_channel):
            raise ConfigError(
                'SimpleFPN backbone_channel must be a positive int (the backbone '
                f'embed_dims), got {backbone_channel!r}'
            )
        if not isinstance(in_channels, (list, tuple)):
            raise ConfigError(
                f'SimpleFPN got backbone_channel={backbone_channel} and '
                f'in_channels={in_channels!r}: with backbone_channel, in_channels '
                'lists the channels of each level (mmdet ViTDet); or give only '
                'in_channels=<backbone channels>'
            )
        expected = [level_channels(backbone_channel, s) for s in steps]
        if list(in_channels) != expected:
            raise ConfigError(
                f'SimpleFPN in_channels={list(in_channels)} (per level) does not '
                f'match its levels: backbone_channel={backbone_channel} resampled '
                f'by the scale factors {tuple(2.0**s for s in steps)} gives '
                f'{expected} channels (halved per upsampling step, as ViTDet)'
            )
        return backbone_channel

    def _select(self, inputs: Union[Tensor, Sequence[Tensor]]) -> Tensor:
        if isinstance(inputs, Tensor):
            x = inputs
        else:
            if not isinstance(inputs, (list, tuple)):
                raise ConfigError(
                    'SimpleFPN expects a tensor or a tuple of backbone outputs, '
                    f'got {type(inputs).__name__}'
                )
            try:
                x = inputs[self.in_index]
            except IndexError:
                raise ConfigError(
                    f'SimpleFPN in_index={self.in_index} but the backbone gave '
                    f'{len(inputs)} output(s)'
                ) from None
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise ConfigError(
                'SimpleFPN expects a (B, C, H, W) map from the backbone (with '
                'LookHereViT keep output_cls_token=False), got '
                f'{type(x).__name__ if not isinstance(x, Tensor) else tuple(x.shape)}'
            )
        if x.shape[1] != self.in_channels:
            raise ConfigError(
                f'SimpleFPN was built for in_channels={self.in_channels}, the '
                f'backbone map has {x.shape[1]} channels'
            )
        if min(x.shape[-2:]) < self._min_side:
            raise ValueError(
                f'SimpleFPN: the backbone map is {x.shape[-2]}x{x.shape[-1]}; its coarsest '
                f'scale factor {min(self.scale_factors)} max-pools it by '
                f'{self._min_side}, which needs at least {self._min_side} on each side: '
                f'give images of at least {self._min_side} patches per side'
            )
        return x

    def forward(self, inputs: Union[Tensor, Sequence[Tensor]]) -> Tuple[Tensor, ...]:
        """Backbone outputs -> ``num_outs`` maps of ``out_channels`` (finest first)."""
        x = self._select(inputs)
        outs = [
            out_conv(lateral(resample(x)))
            for resample, lateral, out_conv in zip(
                self.resamplers, self.lateral_convs, self.output_convs
            )
        ]
        while len(outs) < self.num_outs:
            outs.append(F.max_pool2d(outs[-1], kernel_size=1, stride=2))
        return tuple(outs)
