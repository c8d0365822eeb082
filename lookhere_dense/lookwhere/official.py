"""The official LookWhere checkpoint layout (antofuller/lookwhere, ``lookwhere_dinov2.pt``)
and the equivalent architecture built from our modules.

Layout of the file (a dict)::

    {'selector': {'backbone': <timm vit_base_patch14_reg4_dinov2 state_dict, depth 3,
                               img_size 154>,
                  'head': {'w1.weight', 'w1.bias', 'w2.weight', 'w2.bias'}},
     'extractor': <timm vit_base_patch14_reg4_dinov2 state_dict, depth 12, img_size 518>}

Both timm state dicts hold ``cls_token``, ``reg_token`` (4 registers), ``pos_embed``
``(1, h*w, 768)`` (no entry for the prefix tokens), ``patch_embed.proj.*``, ``blocks.N.*``
(``norm1``, ``attn.qkv``, ``attn.proj``, ``ls1.gamma``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``,
``ls2.gamma``) and ``norm.*``: our trunk's names, except the position table.

How it maps (:func:`official_state_dict`):

* ``pos_embed`` -> ``pos_enc.pos_embed`` of a trunk with ``pos_encoding='abs'``: the
  official extractor uses **absolute positions**, added to every patch before the gather,
  and so does ours with ``'abs'`` (:class:`~.extractor.LookWhereExtractor`); at another
  resolution the table is resampled bicubically by our ``abs`` encoding (the official code
  uses its own ``interpolate_pos_encoding``, not available here: results at other sizes
  may differ slightly). A LookHere extractor has no position table and its blocks were not
  trained with the LookHere bias: loading into it is refused unless ``drop_pos_embed=True``
  (then the blocks are only an initialisation, to be distilled / fine-tuned);
* the selector's ``reg_token`` -> :attr:`LookWhereSelector.reg_token`, its ``head`` ->
  :class:`~.selector.SelectorHead` (``w2`` rows = ``r * r``; the official ``r`` is
  ``ceil(37 / 11) = 4``);
* the extractor's own ``cls_token`` is loaded (unused with the selector's prefix tokens,
  as in the official forward); its ``reg_token`` is unused by the official forward too and
  is dropped (reported).

Not checked here: the real file (no weights download on the development machines); the
tests synthesise a state dict in this layout with timm's own ``vit_base_patch14_reg4_dinov2``
modules and check our forward against the official procedure run on those modules.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch.nn as nn
from torch import Tensor

from ..checkpoint import load_checkpoint_file
from .extractor import LookWhereExtractor
from .model import LookWhere
from .selector import LookWhereSelector, official_multiplier

__all__ = ['official_lookwhere', 'official_state_dict', 'load_official_lookwhere']


def official_lookwhere(
    high_res: int = 518,
    embed_dims: int = 768,
    num_heads: int = 12,
    selector_layers: int = 3,
    extractor_layers: int = 12,
    selector_size: int = 154,
    patch_size: int = 14,
    num_registers: int = 4,
    k_ratio: float = 0.1,
) -> LookWhere:
    """The architecture of ``lookwhere_dinov2.pt`` in our modules (defaults: the official
    DINOv2 ViT-B/14 with 4 registers, LayerNorm eps 1e-6, LayerScale 1e-5; a 3-block
    selector at 154x154 with ``r = ceil(37 / 11) = 4``; a 12-block extractor at
    ``high_res``, ``pos_encoding='abs'``)."""
    norm = functools.partial(nn.LayerNorm, eps=1e-6)
    common = dict(
        patch_size=patch_size,
        embed_dims=embed_dims,
        num_heads=num_heads,
        pos_encoding='abs',
        init_values=1e-5,
        norm_layer=norm,
    )
    selector = LookWhereSelector(
        input_size=selector_size,
        num_layers=selector_layers,
        num_registers=num_registers,
        score_multiplier=official_multiplier(selector_size // patch_size),
        **common,
    )
    extractor = LookWhereExtractor(img_size=high_res, num_layers=extractor_layers, **common)
    return LookWhere(selector, extractor, k_ratio=k_ratio, fill='idw')  # the official fill


def _check_layout(ckpt: Any, source: str) -> None:
    if not isinstance(ckpt, Mapping) or not {'selector', 'extractor'} <= set(ckpt):
        keys = sorted(ckpt)[:8] if isinstance(ckpt, Mapping) else type(ckpt).__name__
        raise ValueError(
            f'{source}: not the official LookWhere layout: expected top-level keys '
            f"'selector' and 'extractor', got {keys}"
        )
    sel = ckpt['selector']
    if not isinstance(sel, Mapping) or not {'backbone', 'head'} <= set(sel):
        keys = sorted(sel)[:8] if isinstance(sel, Mapping) else type(sel).__name__
        raise ValueError(
            f"{source}: 'selector' must hold 'backbone' and 'head' state dicts, got {keys}"
        )


def official_state_dict(
    ckpt: Mapping[str, Any],
    model: LookWhere,
    drop_pos_embed: bool = False,
    source: str = 'checkpoint',
) -> Tuple[Dict[str, Tensor], List[str]]:
    """Our ``state_dict`` keys for an official LookWhere checkpoint.

    Returns:
        ``(state, dropped)``: the mapped tensors and the official keys not used.

    Raises:
        ValueError: not the layout, or an absolute-position checkpoint for a LookHere
            extractor without ``drop_pos_embed``.
    """
    _check_layout(ckpt, source)
    state: Dict[str, Tensor] = {}
    dropped: List[str] = []
    parts = (
        (
            'selector.backbone',
            ckpt['selector']['backbone'],
            'selector.backbone.',
            model.selector.backbone,
        ),
        ('extractor', ckpt['extractor'], 'extractor.trunk.', model.extractor.trunk),
    )
    for name, sd, prefix, trunk in parts:
        for key, value in sd.items():
            if key == 'pos_embed':
                if trunk.pos_encoding != 'abs':
                    if drop_pos_embed:
                        dropped.append(f'{name}.{key}')
                        continue
                    raise ValueError(
                        f'{source}: {name}.pos_embed holds absolute positions (the official '
                        f'LookWhere is a DINOv2 ViT with a learned table); this {name} uses '
                        f"pos_encoding={trunk.pos_encoding!r}. Build it with pos_encoding='abs' "
                        '(official_lookwhere()), or pass drop_pos_embed=True to use the blocks '
                        'as an initialisation only'
                    )
                own = trunk.pos_enc.pos_embed
                if isinstance(value, Tensor) and value.shape != own.shape and value.dim() == 3:
                    # another resolution (high_res): resampled to the trunk's grid, as the
                    # official forward resamples the table to its input's grid
                    resampled, cls_entry, _ = trunk.pos_enc.adapt_checkpoint_embedding(value)
                    if cls_entry is None:
                        value = resampled
                state[prefix + 'pos_enc.pos_embed'] = value
            elif key == 'reg_token':
                if name == 'selector.backbone':
                    state['selector.reg_token'] = value
                else:
                    dropped.append(f'{name}.{key}')  # unused by the official forward too
            else:
                state[prefix + key] = value
    for key, value in ckpt['selector']['head'].items():
        state['selector.head.' + key] = value
    return state, dropped


def load_official_lookwhere(
    path: Union[str, Mapping[str, Any]],
    model: Optional[LookWhere] = None,
    drop_pos_embed: bool = False,
    **arch: Any,
) -> Tuple[LookWhere, Dict[str, List[str]]]:
    """Load ``lookwhere_dinov2.pt`` (a path or the loaded dict) into ``model`` (default:
    :func:`official_lookwhere` ``(**arch)``).

    Returns:
        ``(model, report)`` with ``report['dropped']`` (official keys not used).

    Raises:
        ValueError: naming every missing key, unexpected key and wrongly shaped tensor
            (with both shapes; e.g. a ``head.w2`` of ``r * r`` rows for another ``r``).
    """
    source = path if isinstance(path, str) else 'checkpoint'
    ckpt = load_checkpoint_file(path) if isinstance(path, str) else path
    if model is None:
        model = official_lookwhere(**arch)
    state, dropped = official_state_dict(ckpt, model, drop_pos_embed, source)
    own = {k: v for k, v in model.state_dict().items() if not k.endswith('_extra_state')}
    if isinstance(model.prefix_proj, nn.Linear):
        raise ValueError(
            f'{source}: the official selector and extractor share one width; this model '
            'projects the selector prefix (different embed_dims)'
        )
    problems = []
    missing = sorted(k for k in own if k not in state)
    unexpected = sorted(k for k in state if k not in own)
    if missing:
        problems.append(
            f'missing in the file: {missing[:10]}' + (' ...' if len(missing) > 10 else '')
        )
    if unexpected:
        problems.append(
            f'not in the model: {unexpected[:10]}' + (' ...' if len(unexpected) > 10 else '')
        )
    shapes = [
        f'{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}'
        for k in sorted(set(state) & set(own))
        if tuple(state[k].shape) != tuple(own[k].shape)
    ]
    if shapes:
        problems.append('wrong shapes: ' + '; '.join(shapes[:6]))
    if problems:
        raise ValueError(f'{source} does not fit this LookWhere model: ' + ' | '.join(problems))
    model.load_state_dict(state, strict=False)
    return model, {'dropped': dropped}
