"""Layer-wise learning-rate decay for models with a :class:`LookHereViT` backbone.

As in BEiT / MAE / ViTDet fine-tuning, a parameter at depth ``i`` of an ``L``-block ViT
gets ``lr * decay_rate ** (L + 1 - i)`` where

* ``0`` -- everything of the backbone before the blocks: patch embedding, CLS token,
  pre-norm (and any position embedding a variant may add);
* ``i + 1`` -- backbone block ``i``, and the learnable LookHere slopes of layer ``i``
  (``pos_enc.slopes.layer_log_ratio.i`` / ``head_log_ratio.i``, as BEiT gives each block's
  relative position bias its block's id);
* ``L + 1`` -- everything else: the backbone's final norm, the learnable global LookHere
  slope (shared by all layers, as BEiT's shared relative position bias), the neck and the
  heads (learning-rate scale 1).

The Jumbo trunk's wide MLP (``jumbo_mlp.*``, one module shared by all blocks) gets groups
of its own, ``jumbo_mlp_decay`` / ``jumbo_mlp_no_decay``, with learning-rate scale
``paramwise_cfg.jumbo_mlp_lr_scale`` (default 1: like the other parameters every layer
shares); the Jumbo tokens themselves (``jumbo_token``) are at depth 0 without weight decay,
like the CLS token, and each block's ``jumbo_norm`` / ``jumbo_ls`` in its block.

Weight decay is 0 for norm layers (weight and bias), LayerScale ``gamma``, the CLS token
(and position parameters: ``pos_embed``, RoPE-Mixed ``freqs``, learnable LookHere
slopes), and -- unless ``bias_decay=True`` -- for every bias; all other parameters get
the optimizer's ``weight_decay``.

Use::

    optim_wrapper = dict(
        type='AmpOptimWrapper',
        constructor='LookHereLayerDecayOptimizerConstructor',
        optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
        paramwise_cfg=dict(num_layers=12, decay_rate=0.7))

The constructor is registered in mmengine's ``OPTIM_WRAPPER_CONSTRUCTORS``; mmseg's and
mmdet's registries are its children, so the name resolves in either scope.

mmdet's ``projects/ViTDet`` configs name ``constructor='LayerDecayOptimizerConstructor'``
(with ``paramwise_cfg=dict(decay_rate=..., decay_type='layer_wise', num_layers=...)``),
a class that exists only once that project is imported. The same name is registered here
in mmengine's root registry (:class:`ViTDetLayerDecayOptimizerConstructor`), so in the
mmdet scope it resolves to this constructor when the project is not imported, and to the
project's own when it is (a child registry wins over its parent; no name clash). The mmseg
scope keeps mmseg's own ``LayerDecayOptimizerConstructor`` (BEiT / ConvNeXt).
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

import torch.nn as nn
from mmengine.logging import MMLogger, print_log
from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.utils.dl_utils.parrots_wrapper import _BatchNorm, _InstanceNorm

from ..errors import ConfigError
from ..lookhere.slopes import LookHereSlopes
from ..lookhere.vit import LayerScale, LookHereVisionTransformer

__all__ = [
    'LookHereLayerDecayOptimizerConstructor',
    'ViTDetLayerDecayOptimizerConstructor',
    'find_lookhere_backbone',
    'backbone_layer_id',
    'is_no_decay',
    'is_slope_parameter',
]

_BLOCK = re.compile(r'^blocks\.(\d+)\.')
#: per-layer learnable LookHere slopes: ``pos_enc.slopes.{layer,head}_log_ratio.{i}``
_LAYER_SLOPES = re.compile(r'^pos_enc\.slopes\.(layer|head)_log_ratio\.(\d+)$')
_GLOBAL_SLOPE = 'pos_enc.slopes.global_log_ratio'
#: Backbone parameters (names relative to the backbone) that never get weight decay.
_NO_DECAY_TOKENS = ('cls_token', 'jumbo_token', 'pos_embed', 'mask_token', 'freqs')
#: the Jumbo trunk's shared wide MLP (its own layer-decay groups)
_JUMBO_MLP = 'jumbo_mlp.'

#: norm layers, whose weights and biases never get weight decay (``nn.RMSNorm``: a
#: ``norm_cfg`` LookHereViT takes)
_NORMS = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm, _BatchNorm, _InstanceNorm)


def find_lookhere_backbone(model: nn.Module) -> Tuple[str, LookHereVisionTransformer]:
    """The one :class:`LookHereViT` in ``model`` and its name prefix (``'backbone.'``,
    or ``''`` when ``model`` is the backbone).

    Raises:
        ConfigError (a ValueError): no LookHereViT, or more than one.
    """
    found = [
        (name, m) for name, m in model.named_modules() if isinstance(m, LookHereVisionTransformer)
    ]
    if not found:
        raise ConfigError(
            'LookHereLayerDecayOptimizerConstructor: the model has no '
            f"LookHereViT backbone ({type(model).__name__}); use mmengine's "
            'DefaultOptimWrapperConstructor for other models'
        )
    if len(found) > 1:
        raise ConfigError(
            'LookHereLayerDecayOptimizerConstructor: the model has '
            f'{len(found)} LookHereViT modules ({[n for n, _ in found]}); layer '
            'decay is defined for one backbone'
        )
    name, module = found[0]
    return (name + '.' if name else ''), module


def backbone_layer_id(name: Optional[str], num_layers: int) -> int:
    """Layer id of a parameter for layer-wise decay.

    Args:
        name: the parameter's name relative to the backbone (``'blocks.3.attn.qkv.weight'``),
            or None for a parameter outside the backbone.
        num_layers: blocks in the backbone ``L``.

    Returns:
        ``0`` before the blocks, ``i + 1`` in block ``i`` (and for layer ``i``'s learnable
        LookHere slopes), ``L + 1`` for the final norm, the learnable global slope, the
        Jumbo trunk's shared ``jumbo_mlp`` and everything outside the backbone.
    """
    if name is None or name.startswith(('norm.', _JUMBO_MLP)) or name == _GLOBAL_SLOPE:
        return num_layers + 1
    match = _BLOCK.match(name) or _LAYER_SLOPES.match(name)
    if match:
        return int(match.group(match.lastindex)) + 1
    return 0


def is_slope_parameter(name: str) -> bool:
    """Whether ``name`` (relative to the backbone) is a learnable LookHere slope."""
    return name == _GLOBAL_SLOPE or _LAYER_SLOPES.match(name) is not None


def is_no_decay(param_name: str, param, module: nn.Module, bias_decay: bool = False) -> bool:
    """Whether a parameter is exempt from weight decay.

    Args:
        param_name: the parameter's own name in ``module`` (``'weight'``, ``'gamma'``, ...).
        param: the parameter.
        module: the module that owns it directly.
        bias_decay: decay biases of non-norm layers. Default: False.
    """
    if isinstance(module, (*_NORMS, LayerScale, LookHereSlopes)):
        return True
    if param_name in _NO_DECAY_TOKENS:
        return True
    if param_name.endswith('bias'):
        return not bias_decay
    return False


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class LookHereLayerDecayOptimizerConstructor(DefaultOptimWrapperConstructor):
    """Optimizer wrapper constructor with layer-wise lr decay for a LookHereViT model.

    ``paramwise_cfg`` keys:

    * ``decay_rate`` (float, required): per-layer lr factor in ``(0, 1]``.
    * ``num_layers`` (int, optional): the backbone's number of blocks; checked against the
      model when given. Default: the backbone's ``num_layers``.
    * ``bias_decay`` (bool): apply weight decay to biases of non-norm layers.
      Default: False.
    * ``decay_type`` (str): only ``'layer_wise'``; accepted so mmseg/mmdet-style configs
      read the same. Default: ``'layer_wise'``.
    * ``jumbo_mlp_lr_scale`` (float): learning-rate scale of a Jumbo trunk's shared wide
      MLP (groups ``jumbo_mlp_decay`` / ``jumbo_mlp_no_decay``). Default: 1.

    Parameters with ``requires_grad=False`` are left out. Groups are ordered from the
    heads (lr scale 1) down to the patch embedding, so the first group -- the ``lr`` that
    mmengine logs -- carries the base learning rate.
    """

    _KEYS = ('decay_rate', 'num_layers', 'bias_decay', 'decay_type', 'jumbo_mlp_lr_scale')

    def _validate_cfg(self) -> None:
        cfg = self.paramwise_cfg
        if not isinstance(cfg, dict):
            raise TypeError(f'paramwise_cfg must be a dict, got {type(cfg).__name__}')
        unknown = sorted(set(cfg) - set(self._KEYS))
        if unknown:
            raise ConfigError(
                f'LookHereLayerDecayOptimizerConstructor: unknown paramwise_cfg '
                f'keys {unknown}; allowed: {list(self._KEYS)}'
            )
        if 'decay_rate' not in cfg:
            raise ConfigError(
                'LookHereLayerDecayOptimizerConstructor needs '
                'paramwise_cfg=dict(decay_rate=...) (num_layers: optional, checked)'
            )
        rate = cfg['decay_rate']
        if not isinstance(rate, (int, float)) or not 0 < rate <= 1:
            raise ConfigError(f'paramwise_cfg.decay_rate must be in (0, 1], got {rate!r}')
        if cfg.get('decay_type', 'layer_wise') != 'layer_wise':
            raise ConfigError(
                "paramwise_cfg.decay_type: only 'layer_wise' is supported, got "
                f'{cfg["decay_type"]!r}'
            )
        layers = cfg.get('num_layers')
        if layers is not None and (not isinstance(layers, int) or layers < 1):
            raise ConfigError(f'paramwise_cfg.num_layers must be a positive int, got {layers!r}')
        jumbo = cfg.get('jumbo_mlp_lr_scale', 1.0)
        if isinstance(jumbo, bool) or not isinstance(jumbo, (int, float)) or not jumbo > 0:
            raise ConfigError(
                f'paramwise_cfg.jumbo_mlp_lr_scale must be a number > 0, got {jumbo!r}'
            )
        if self.base_lr is None:
            raise ConfigError('LookHereLayerDecayOptimizerConstructor needs optimizer.lr')

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        """Fill ``params`` with one group per (layer, decay / no decay)."""
        prefix, backbone = find_lookhere_backbone(module)
        num_layers = self.paramwise_cfg.get('num_layers')
        if num_layers is None:
            num_layers = backbone.num_layers
        elif num_layers != backbone.num_layers:
            raise ConfigError(
                f'paramwise_cfg.num_layers={num_layers} but the LookHereViT '
                f'backbone has {backbone.num_layers} blocks: set it to '
                f'{backbone.num_layers}, or leave it out (it is taken from the backbone)'
            )
        rate = float(self.paramwise_cfg['decay_rate'])
        bias_decay = bool(self.paramwise_cfg.get('bias_decay', False))

        jumbo_scale = float(self.paramwise_cfg.get('jumbo_mlp_lr_scale', 1.0))
        groups: Dict[Tuple[int, bool, bool], dict] = {}
        seen = set()
        for mod_name, mod in module.named_modules():
            for p_name, param in mod.named_parameters(recurse=False):
                if not param.requires_grad or id(param) in seen:
                    continue
                seen.add(id(param))
                full = f'{mod_name}.{p_name}' if mod_name else p_name
                rel = full[len(prefix) :] if full.startswith(prefix) else None
                layer = backbone_layer_id(rel, num_layers)
                no_decay = is_no_decay(p_name, param, mod, bias_decay) or (
                    rel is not None and is_slope_parameter(rel)
                )
                jumbo = rel is not None and rel.startswith(_JUMBO_MLP)
                key = (layer, no_decay, jumbo)
                if key not in groups:
                    scale = jumbo_scale if jumbo else rate ** (num_layers + 1 - layer)
                    kind = 'no_decay' if no_decay else 'decay'
                    group = dict(
                        params=[],
                        param_names=[],
                        lr=self.base_lr * scale,
                        lr_scale=scale,
                        layer_id=layer,
                        group_name=f'jumbo_mlp_{kind}' if jumbo else f'layer_{layer}_{kind}',
                    )
                    if no_decay:
                        group['weight_decay'] = 0.0
                    elif self.base_wd is not None:
                        group['weight_decay'] = self.base_wd
                    groups[key] = group
                groups[key]['params'].append(param)
                groups[key]['param_names'].append(full)

        ordered = [groups[k] for k in sorted(groups, key=lambda k: (k[2], -k[0], k[1]))]
        params.extend(ordered)
        lines = [
            f'{g["group_name"]}: {len(g["params"])} tensors, lr_scale='
            f'{g["lr_scale"]:.4g}, weight_decay={g.get("weight_decay", "default")}'
            for g in ordered
        ]
        scales = [g['lr_scale'] for g in ordered] or [1.0]
        print_log(  # one line on the terminal; the groups go to the log file only
            f'LookHere layer decay (rate {rate}, {num_layers} blocks): {len(ordered)} parameter '
            f'groups, lr_scale {min(scales):.4g}..{max(scales):.4g} (the groups: in the log file)',
            logger='current',
        )
        MMLogger.get_current_instance().info(
            'LookHere layer decay groups:\n  ' + '\n  '.join(lines), extra=dict(file_only=True)
        )


@OPTIM_WRAPPER_CONSTRUCTORS.register_module(name='LayerDecayOptimizerConstructor', force=True)
class ViTDetLayerDecayOptimizerConstructor(LookHereLayerDecayOptimizerConstructor):
    """``constructor='LayerDecayOptimizerConstructor'`` of mmdet's ViTDet configs, for a
    LookHereViT model: :class:`LookHereLayerDecayOptimizerConstructor` (same ``paramwise_cfg``
    keys: ``decay_rate``, ``decay_type='layer_wise'``, ``num_layers``).

    Registered under that name in mmengine's root registry only (see the module docstring):
    importing mmdet's ``projects.ViTDet.vitdet`` puts its own class first in the mmdet scope.
    """

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        """As :meth:`LookHereLayerDecayOptimizerConstructor.add_params`; a model without a
        LookHereViT is told where the name came from."""
        try:
            find_lookhere_backbone(module)
        except ValueError as err:
            raise ConfigError(
                f"{err}. constructor='LayerDecayOptimizerConstructor' resolved "
                "to lookhere-dense's layer decay for LookHereViT because mmdet's "
                'projects/ViTDet is not imported; for its ViT add '
                "custom_imports=dict(imports=['projects.ViTDet.vitdet'])"
            ) from None
        print_log(
            "constructor='LayerDecayOptimizerConstructor': lookhere-dense's "
            'LookHereLayerDecayOptimizerConstructor (mmdet projects/ViTDet not imported)',
            logger='current',
        )
        super().add_params(params, module, **kwargs)
