"""Write a copy of an mmseg config whose plain-ViT backbone is LookHereViT
(``tools/swap_backbone.py``; the rules are :func:`lookhere_dense.swap.swap_backbone`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ['swap_config_file']


def swap_config_file(
    config: str,
    out: str,
    preset: Optional[str] = None,
    num_heads: Optional[int] = None,
    checkpoint: Optional[str] = None,
    keep_pretrained: bool = False,
    cfg_options: Optional[dict] = None,
    report: Optional[Callable[[str], None]] = None,
    **overrides: Any,
):
    """Load ``config`` (``mmseg::`` paths allowed; ``cfg_options`` merged in), swap its
    backbone for LookHereViT and write the result to ``out`` (a flat ``.py`` config that
    ``tools/train.py`` runs as it is).

    Args:
        config: source config.
        out: the new config file; must end in ``.py``.
        preset: LookHere preset. Default: None (lh180, or the config in ``checkpoint``).
        num_heads: head count override. Default: None.
        checkpoint: backbone weights for ``init_cfg=Pretrained``. Default: None.
        keep_pretrained: keep the source's ``model.pretrained``. Default: False.
        cfg_options: overrides of the source config. Default: None.
        report: called with one line per change beyond the backbone (an mmseg layer-decay
            optimizer constructor rewritten for LookHereViT, ...). Default: None.
        **overrides: other ``LookHereViT`` arguments (``init_values=None``, ...).

    Returns:
        The new config.

    Raises:
        ValueError: ``out`` does not end in ``.py``;
        lookhere_dense.errors.ConfigError: a backbone that cannot be swapped.
    """
    import lookhere_dense

    lookhere_dense.register_all_modules()
    from ..swap import swap_backbone
    from .cli import load_config

    if not out.endswith('.py'):
        raise ValueError(f'the output config must end in .py, got {out!r}')
    cfg = load_config(config, cfg_options)
    new = swap_backbone(
        cfg,
        preset=preset,
        num_heads=num_heads,
        checkpoint=checkpoint,
        keep_pretrained=keep_pretrained,
        report=report,
        **overrides,
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    new.dump(out)
    return new
