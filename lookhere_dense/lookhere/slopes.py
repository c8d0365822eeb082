"""Learnable LookHere slopes (``lh_config=dict(..., learnable_slopes=True)``).

The bias of layer ``l``, head ``h`` is ``-(global * layer[l]) * (head[l, h] * d)``
(:func:`~.bias.bias_from_distances`). With learnable slopes the three factors are
parameters, each stored as the log of its ratio to the configured value::

    global   = global_slope          * exp(global_log_ratio)         # ()
    layer[l] = layer_slopes(...)[l]   * exp(layer_log_ratio[l])       # () per layer
    head[l]  = head_layout(...)[l]    * exp(head_log_ratio[l])        # (heads,) per layer

* positive by construction (a slope never changes sign or reaches 0: the configured
  slopes must be > 0, :class:`~.bias.LookHereConfig` checks it);
* initialised to the config's values *exactly*: every ratio starts at 0 and
  ``value * exp(0) == value``, so at step 0 the bias (computed in float64 with the same
  operations as the fixed-slope tables) equals the fixed model's bit for bit;
* scale-free steps: a log-ratio step changes a slope by the same factor whether the slope
  is 1.5 or 1/256 (the head slopes of a model span 2^-8 .. 2^1);
* one tensor per layer (``layer_log_ratio.{l}``, ``head_log_ratio.{l}``), so layer-wise
  learning-rate decay can give layer ``l``'s slopes block ``l``'s rate
  (:mod:`lookhere_dense.engine.layer_decay`).

Only the product ``global * layer[l] * head[l, h]`` reaches the attention; the three
factors are kept because they are what the config (and the paper) name, and so the log
shows which one moved. What each head type learns:

* distance-penalised heads (directed, ``none``): the slope of their penalty;
* ``center`` heads: the slope of the key's distance from the grid centre;
* ``zero`` heads (and the ``zero`` part of the combined types): nothing -- they have no
  distance penalty, their head ratio gets a zero gradient;
* blocked keys: with ``fill_with='inf'`` they stay blocked (the fields of view are not
  learned); ``'zero'``: their bias stays 0; ``'max'``: their bias is ``-slope * max
  distance``, learned with the slope.

This module needs torch alone.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor

from .cache import BoundedCache
from .config import LookHereConfig, head_layout, layer_slopes

__all__ = ['LookHereSlopes', 'SLOPE_PARAMETERS', 'configured_slopes', 'slopes_from_state_dict']

#: the parameter names of :class:`LookHereSlopes` (``layer_log_ratio.{l}`` and
#: ``head_log_ratio.{l}`` are per layer)
SLOPE_PARAMETERS = ('global_log_ratio', 'layer_log_ratio', 'head_log_ratio')


class LookHereSlopes(nn.Module):
    """The learnable global, layer and head slopes of a LookHere bias.

    Args:
        config: the LookHere config whose slopes are the initial values (global and layer
            slopes > 0).
        depth: layers.
        num_heads: heads per layer.

    Parameters:
        global_log_ratio: ``()``, log of the global slope over ``config.global_slope``.
        layer_log_ratio: ``depth`` tensors ``()``, log of layer ``l``'s slope over the
            configured one.
        head_log_ratio: ``depth`` tensors ``(heads,)``, log of layer ``l``'s head slopes
            over the configured ones.

    All are 0 after construction and :meth:`reset_parameters`.
    """

    #: a checkpoint without these parameters still loads strictly: they restart from the
    #: config (:func:`lookhere_dense.checkpoint.load_state_dict_strict`)
    restart_when_missing = True

    def __init__(self, config: LookHereConfig, depth: int, num_heads: int):
        super().__init__()
        self.depth = depth
        self.num_heads = num_heads
        self.global_log_ratio = nn.Parameter(torch.zeros(()))
        self.layer_log_ratio = nn.ParameterList(
            [nn.Parameter(torch.zeros(())) for _ in range(depth)]
        )
        self.head_log_ratio = nn.ParameterList(
            [nn.Parameter(torch.zeros(num_heads)) for _ in range(depth)]
        )
        #: the initial values in float64, per device (a plain cache: never saved, never
        #: cast by ``module.half()`` / ``.to(dtype)``)
        self._initial = BoundedCache(4)
        self.set_config(config)

    def set_config(self, config: LookHereConfig) -> None:
        """Take the initial values from ``config`` and reset every ratio to 0 (the slopes
        become ``config``'s).

        Raises:
            ValueError: ``config`` does not fit ``depth`` / ``num_heads``, or has a slope
                of 0.
        """
        config.validate(self.num_heads, self.depth)
        if config.global_slope == 0 or 0 in config.layer_slopes:
            raise ValueError(
                'learnable LookHere slopes need global_slope and layer_slopes '
                f'> 0, got global_slope={config.global_slope}, layer_slopes='
                f'{list(config.layer_slopes)}'
            )
        self.config = config
        self._initial.clear()
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """All log-ratios to 0: the slopes of the config."""
        for p in self.parameters():
            p.zero_()

    def initial(
        self, device: Union[torch.device, str, None] = None
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """The configured slopes, float64 on ``device``: global ``()``, layer ``(depth,)``,
        head ``(depth, heads)``."""
        device = torch.device(device) if device is not None else self.global_log_ratio.device

        def make() -> Tuple[Tensor, Tensor, Tensor]:
            cfg = configured_slopes(self.config, self.depth, self.num_heads)
            return tuple(cfg[k].to(device) for k in ('global', 'layer', 'head'))

        return self._initial.get_or_create(str(device), make)

    def layer(self, layer: int) -> Tuple[Tensor, Tensor]:
        """The current slopes of ``layer`` (differentiable, float64, on the parameters'
        device): ``scale = global * layer_slope`` ``()`` and the head slopes ``(heads,)``,
        as :func:`~.bias.bias_from_distances` takes them."""
        glob, layers, heads = self.initial()
        scale = (glob * self.global_log_ratio.double().exp()) * (
            layers[layer] * self.layer_log_ratio[layer].double().exp()
        )
        return scale, heads[layer] * self.head_log_ratio[layer].double().exp()

    @torch.no_grad()
    def values(self) -> Dict[str, Tensor]:
        """The current slopes (float64, CPU, detached): ``'global'`` ``()``, ``'layer'``
        ``(depth,)``, ``'head'`` ``(depth, heads)`` and ``'effective'`` ``(depth, heads)`` =
        ``global * layer * head``, what each head's distance is multiplied by."""
        glob, layers, heads = (t.cpu() for t in self.initial())
        g = glob * self.global_log_ratio.double().exp().cpu()
        lay = layers * torch.stack(list(self.layer_log_ratio)).double().exp().cpu()
        head = heads * torch.stack(list(self.head_log_ratio)).double().exp().cpu()
        return {'global': g, 'layer': lay, 'head': head, 'effective': g * lay[:, None] * head}

    def configured(self) -> Dict[str, Tensor]:
        """:meth:`values` of the config (the initial slopes)."""
        return configured_slopes(self.config, self.depth, self.num_heads)

    def extra_repr(self) -> str:
        return f'depth={self.depth}, num_heads={self.num_heads}'


def configured_slopes(config: LookHereConfig, depth: int, num_heads: int) -> Dict[str, Tensor]:
    """The slopes of ``config`` as :meth:`LookHereSlopes.values` lays them out (float64)."""
    glob = torch.tensor(config.global_slope, dtype=torch.float64)
    lay = torch.tensor(layer_slopes(config, depth), dtype=torch.float64)
    head = torch.stack(
        [head_layout(config.layer_direction(l), num_heads)[1] for l in range(depth)]
    )
    return {'global': glob, 'layer': lay, 'head': head, 'effective': glob * lay[:, None] * head}


def slopes_from_state_dict(
    config: LookHereConfig,
    depth: int,
    num_heads: int,
    state_dict: Dict[str, Tensor],
    prefix: str = '',
) -> Optional[Dict[str, Tensor]]:
    """The learned slopes stored under ``prefix`` (e.g. ``'pos_enc.slopes.'``) of a
    ``state_dict``, laid out as :meth:`LookHereSlopes.values`; None when it holds none.

    Raises:
        ValueError: some but not all slope tensors are there, or of the wrong shape.
    """
    names = [prefix + 'global_log_ratio'] + [
        f'{prefix}{n}.{l}' for n in SLOPE_PARAMETERS[1:] for l in range(depth)
    ]
    present = [n for n in names if n in state_dict]
    if not present:
        return None
    if len(present) != len(names):
        missing = sorted(set(names) - set(present))
        raise ValueError(
            f'the learned LookHere slopes are incomplete: missing {missing[:6]}'
            f'{" ..." if len(missing) > 6 else ""}'
        )
    module = LookHereSlopes(config, depth, num_heads)
    own = {prefix + k: v for k, v in module.state_dict().items()}
    bad = [
        f'{k}: {tuple(state_dict[k].shape)} vs {tuple(v.shape)}'
        for k, v in own.items()
        if tuple(state_dict[k].shape) != tuple(v.shape)
    ]
    if bad:
        raise ValueError(
            f'learned LookHere slopes of the wrong shape (file vs {depth} '
            f'layers x {num_heads} heads): {bad[:4]}'
        )
    module.load_state_dict({k[len(prefix) :]: state_dict[k].float() for k in own})
    return module.values()


def format_slope_table(
    learned: Dict[str, Tensor], configured: Optional[Dict[str, Tensor]] = None
) -> str:
    """A text table of slopes (:meth:`LookHereSlopes.values` layout): the global slope,
    then one row per layer with its layer slope and each head's effective slope
    (``global * layer * head``), and with ``configured`` each value's ratio to it.

    Example::

        global 1.02 (x1.02)
        layer  slope         h0            h1           ...
        0      1.5 (x1)      0.75 (x0.98)  0.75 (x1.1)  ...
    """

    def cell(value: float, ref: Optional[float]) -> str:
        return f'{value:.4g}' + ('' if ref is None else f' (x{value / ref:.3g})')

    def ref(name: str, *index: int) -> Optional[float]:
        return None if configured is None else float(configured[name][index])

    eff, lay = learned['effective'], learned['layer']
    rows = [['layer', 'slope'] + [f'h{h}' for h in range(eff.shape[1])]]
    for l in range(eff.shape[0]):
        rows.append(
            [str(l), cell(float(lay[l]), ref('layer', l))]
            + [cell(float(eff[l, h]), ref('effective', l, h)) for h in range(eff.shape[1])]
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ['  '.join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    head = 'global ' + cell(float(learned['global']), ref('global'))
    return '\n'.join([head, 'effective slope per head (global x layer x head):'] + lines)
