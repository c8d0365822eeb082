"""Checkpoint files: reading (:mod:`.reading`), records (:mod:`.records`) and strict loading
(:mod:`.strict`). Torch alone; nothing here imports a model: what a LookHere ViT's weights
mean (official / timm / DeiT-III formats, head counts, LookHere configs) is
:mod:`lookhere_dense.lookhere.weights`.
"""

from ..errors import CheckpointError, UnreadableCheckpointError
from .reading import (
    checkpoint_head,
    checkpoint_problem,
    load_checkpoint_file,
    read_pointer_file,
    training_meta,
)
from .records import (
    EXTRA_STATE_KEY,
    decode_extra_state,
    encode_extra_state,
    is_extra_state_key,
    read_record,
)
from .strict import listed, load_state_dict_strict, match_state_dict, strip_prefix

__all__ = [
    'CheckpointError',
    'UnreadableCheckpointError',
    'load_checkpoint_file',
    'checkpoint_problem',
    'read_pointer_file',
    'training_meta',
    'checkpoint_head',
    'EXTRA_STATE_KEY',
    'encode_extra_state',
    'decode_extra_state',
    'is_extra_state_key',
    'read_record',
    'match_state_dict',
    'load_state_dict_strict',
    'listed',
    'strip_prefix',
]
