"""THE strict loader: a ``state_dict`` goes into a module only if it fits; a file that does
not fit is refused with a message that names what differs, never used anyway. Torch alone;
nothing here knows which model it loads: what is model-specific in a message (the likely
causes of a key mismatch, a shape summary, what to do instead of ``strict=False``) comes in
as callables (:data:`KeyHints`, :data:`ShapeSummary`, :data:`LooseAdvice`; a ViT's are in
:mod:`lookhere_dense.lookhere.weights`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from ..errors import CheckpointError
from .records import is_extra_state_key

__all__ = [
    'match_state_dict',
    'load_state_dict_strict',
    'listed',
    'strip_prefix',
    'KeyHints',
    'ShapeSummary',
    'LooseAdvice',
]

#: ``hints(missing, unexpected, model_keys, file_keys) -> [reason, ...]``: the likely causes
#: of a key mismatch, for the error message.
KeyHints = Callable[[List[str], List[str], Sequence[str], Sequence[str]], List[str]]
#: ``summary(model_sd, file_sd) -> str``: the two architectures at a glance when tensor
#: shapes differ (e.g. a ViT's width and patches), ``''`` when it has nothing to say.
ShapeSummary = Callable[[Mapping[str, Tensor], Mapping[str, Tensor]], str]
#: ``advice(missing, file_keys) -> str or None``: why loading what fits (``strict=False``)
#: would be wrong for this file, for the refusal of a backbone; None: it is the usual advice.
LooseAdvice = Callable[[List[str], Sequence[str]], Optional[str]]


def match_state_dict(
    model_sd: Mapping[str, Tensor],
    weights: Mapping[str, Tensor],
    source: Optional[str] = None,
    summary: Optional[ShapeSummary] = None,
) -> Tuple[Dict[str, Tensor], List[str], List[str]]:
    """Compare checkpoint weights with a model's state_dict.

    Args:
        model_sd: the model's tensors.
        weights: the file's tensors (non-tensor entries are ignored here).
        source: the file, for the message. Default: None.
        summary: the architectures at a glance for the message (:data:`ShapeSummary`; e.g.
            :func:`lookhere_dense.lookhere.weights.vit_shape_summary`). Default: None.

    Returns:
        ``(loadable, missing, unexpected)``.

    Raises:
        CheckpointError: listing every key whose shape differs (checkpoint vs model).
    """
    weights = {k: v for k, v in weights.items() if isinstance(v, Tensor)}
    mismatched = [
        f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(model_sd[k].shape)}'
        for k, v in weights.items()
        if k in model_sd and v.shape != model_sd[k].shape
    ]
    loadable = {k: v for k, v in weights.items() if k in model_sd}
    missing = sorted(k for k in model_sd if k not in weights)
    unexpected = sorted(k for k in weights if k not in model_sd)
    if mismatched:
        more = f'; ... and {len(mismatched) - 10} more' if len(mismatched) > 10 else ''
        where = f'{source!r} ' if source else ''
        keys = ''  # a file of another architecture: its keys differ too (the heads' layers)
        lacks = [k for k in missing if not is_extra_state_key(k)]
        extra = [k for k in unexpected if not is_extra_state_key(k)]
        if lacks:
            keys += f'; the model has {len(lacks)} tensors the file lacks: {listed(lacks, 5)}'
        if extra:
            keys += f'; the file has {len(extra)} the model lacks: {listed(extra, 5)}'
        glance = summary(model_sd, weights) if summary else ''
        glance = f'{glance}; ' if glance else ''
        raise CheckpointError(  # one line: the tools print it as one ``error:`` line
            f'checkpoint {where}does not fit the model ({glance}{len(mismatched)} tensors of '
            'the wrong shape: ' + '; '.join(mismatched[:10]) + more + keys + '). Build the '
            'model as the file was trained: check embed_dims, patch_size, mlp_ratio, '
            "in_channels, num_classes and the heads' types and sizes (e.g. fc_out_channels, "
            'num_convs) against the config the checkpoint was trained with'
        )
    return loadable, missing, unexpected


def listed(keys: List[str], n: int = 12) -> str:
    """``keys`` as a list for a message, the first ``n`` and how many more."""
    return str(keys[:n])[:-1] + (f', ... ({len(keys) - n} more)]' if len(keys) > n else ']')


def strip_prefix(sd: Mapping[str, Any], prefix: str) -> Dict[str, Any]:
    """The entries of ``sd`` under ``prefix``, with the prefix removed."""
    return {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}


def _restartable_groups(module: nn.Module) -> List[Tuple[nn.Module, List[str]]]:
    """The submodules that declare ``restart_when_missing = True`` (e.g. learnable LookHere
    slopes), with the full keys of their parameters."""
    return [
        (m, [f'{name}.{p}' if name else p for p, _ in m.named_parameters()])
        for name, m in module.named_modules()
        if getattr(m, 'restart_when_missing', False)
    ]


def _restarted(module: nn.Module, missing: List[str]) -> Tuple[List[str], List[nn.Module]]:
    """The missing keys that are whole groups of restartable modules (they start afresh
    from ``reset_parameters()``), and those modules; a group missing only in part stays
    missing."""
    absent = set(missing)
    keys: List[str] = []
    modules = []
    for m, names in _restartable_groups(module):
        if names and absent.issuperset(names):
            keys += names
            modules.append(m)
    return sorted(keys), modules


def load_state_dict_strict(
    module: nn.Module,
    state_dict: Mapping[str, Any],
    source: str,
    strict: bool = True,
    dropped: Optional[Mapping[str, str]] = None,
    what: str = 'model',
    verify: Optional[Callable[[], None]] = None,
    require_extra_state: bool = False,
    hints: Optional[KeyHints] = None,
    loose: Optional[str] = None,
    summary: Optional[ShapeSummary] = None,
    advice: Optional[LooseAdvice] = None,
) -> Dict[str, List[str]]:
    """THE strict loader: load ``state_dict`` into ``module`` only if it fits.

    Shapes must agree always. With ``strict`` every tensor of ``module`` must be in the
    file and every tensor of the file in ``module``, except the keys of ``dropped``
    (dropped on purpose, with the reason) and the parameters of submodules that declare
    ``restart_when_missing = True`` when the file has none of them (each such module all or
    nothing; it restarts with its ``reset_parameters()``: learnable LookHere slopes start
    from the LookHere config, the file's when it records one). Records (``*._extra_state``, the uint8 tensor or the
    dict of older files) are not weights: they are never compared by shape, and are
    handed to the modules that have one (the LookHere ViT's ``set_extra_state`` checks the
    position encoding, the LookHere config and the head count they record).

    Args:
        module: the model or backbone.
        state_dict: the file's entries in ``module``'s key names.
        source: the file (for messages).
        strict: refuse missing and unexpected keys. Default: True.
        dropped: ``{key: reason}`` of file keys to leave out on purpose. Default: none.
        what: what ``module`` is, for messages (``'model'``, ``'backbone'``).
            Default: ``'model'``.
        verify: called after the key checks, before anything is loaded (further checks,
            e.g. of the head count). Default: None.
        require_extra_state: with ``strict``, the records of ``module`` must be in the
            file too (a whole model's checkpoint; backbone weights from elsewhere have
            none). Default: False.
        hints: the likely causes of missing / unexpected keys, for the message
            (:data:`KeyHints`; e.g. :func:`lookhere_dense.lookhere.weights.vit_key_hints`).
            Default: None.
        loose: how the caller's API loads what fits of a file meant for another
            architecture, for the message of a ``what='backbone'`` refusal. Default: None
            (mmseg's ``init_cfg=dict(type='Pretrained', ..., strict=False)``).

    Returns:
        ``{'missing': [...], 'unexpected': [...], 'dropped': [...], 'from_config': [...]}``
        (the first two are empty with ``strict``; ``from_config``: the keys of restarted
        modules, e.g. learnable slopes, the file lacks).

    Raises:
        CheckpointError: a shape mismatch, or (``strict``) missing / unexpected keys, named
            with the likely cause.
    """
    dropped = dict(dropped or {})
    entries = {k: v for k, v in state_dict.items() if k not in dropped}
    everything = module.state_dict()
    own = {
        k: v for k, v in everything.items() if isinstance(v, Tensor) and not is_extra_state_key(k)
    }
    records = {k: v for k, v in entries.items() if is_extra_state_key(k) and k in everything}
    loadable, missing, unexpected = match_state_dict(
        own, {k: v for k, v in entries.items() if not is_extra_state_key(k)}, source, summary
    )
    from_config, restarted = _restarted(module, missing)
    missing = [k for k in missing if k not in set(from_config)]
    if require_extra_state:
        missing += sorted(k for k in everything if is_extra_state_key(k) and k not in records)
    params = {name for name, _ in module.named_parameters()}
    broken = [
        k
        for k, v in loadable.items()
        if k in params and v.is_floating_point() and not bool(torch.isfinite(v).all())
    ]
    if broken:
        raise CheckpointError(
            f'checkpoint {source!r} holds NaN / inf values in '
            f'{len(broken)} parameters: {listed(broken)}; it was saved '
            'after training diverged or is corrupt: use an earlier one'
        )
    if strict and (missing or unexpected):
        reasons = hints(missing, unexpected, list(own), list(entries)) if hints else []
        because = f' ({"; ".join(reasons)})' if reasons else ''
        if missing:
            msg = f'checkpoint {source!r} lacks {what} parameters{because}: {listed(missing)}'
            if unexpected:
                msg += f'; and it has tensors the {what} lacks: {listed(unexpected)}'
        else:
            msg = (
                f'checkpoint {source!r} has tensors the {what} lacks{because}: '
                f'{listed(unexpected)}'
            )
        if what == 'model':
            todo = 'its config, or the same options with --cfg-options'
        else:
            todo = (advice(missing, list(entries)) if advice else None) or (
                'pretrained weights meant for another architecture: '
                + (loose or "init_cfg=dict(type='Pretrained', ..., strict=False) loads what fits")
            )
        raise CheckpointError(msg + f'. Build the {what} the file was trained with ({todo})')
    if verify is not None:
        verify()
    try:
        module.load_state_dict({**loadable, **records}, strict=False)
    except (ValueError, RuntimeError) as err:  # a set_extra_state refused the file's record
        raise CheckpointError(f'checkpoint {source!r}: {err}') from None
    for m in restarted:  # nothing of theirs in the file: they start afresh
        m.reset_parameters()
    return dict(
        missing=missing, unexpected=unexpected, dropped=sorted(dropped), from_config=from_config
    )
