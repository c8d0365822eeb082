"""Names that moved to a module of their own still import from where users imported them.

The generic ViT layers left ``lookhere_dense.lookhere.vit`` for ``.layers``, the prefix-token
helpers left ``.bias`` for ``.prefix_tokens``, the config checks left ``lookhere_dense.swap``
for ``lookhere_dense.config_checks``: the old paths are the same objects, not copies.
"""

from __future__ import annotations

import importlib

import pytest

MOVED = [
    (
        'lookhere_dense.lookhere.layers',
        'lookhere_dense.lookhere.vit',
        [
            'LookHerePatchEmbed',
            'LookHereBlock',
            'LookHereSelfAttention',
            'LayerScale',
            'Mlp',
            'DropPath',
            'trunc_normal_',
            'check_finite_images',
        ],
    ),
    (
        'lookhere_dense.lookhere.prefix_tokens',
        'lookhere_dense.lookhere.bias',
        ['num_prefix_tokens', 'prefix_phrase'],
    ),
    (
        'lookhere_dense.config_checks',
        'lookhere_dense.swap',
        [
            'check_model_cfg',
            'check_pretrained_files',
            'clear_inherited_pretrained',
            'drop_missing_pretrained',
            'model_registry',
        ],
    ),
]


@pytest.mark.parametrize('home, old, names', MOVED, ids=[m[0].rsplit('.', 1)[1] for m in MOVED])
def test_moved_names_are_the_same_objects_at_the_old_path(home: str, old: str, names: list):
    new_mod, old_mod = importlib.import_module(home), importlib.import_module(old)
    for name in names:
        assert name in new_mod.__all__ and name in old_mod.__all__, name
        assert getattr(old_mod, name) is getattr(new_mod, name), name
        assert getattr(new_mod, name).__module__ == home, name  # defined there, not copied


def test_the_public_model_names_still_import_from_the_package():
    from lookhere_dense.lookhere import LookHereVisionTransformer, create_model
    from lookhere_dense.lookhere.vit import LookHereVisionTransformer as Trunk

    assert Trunk is LookHereVisionTransformer
    assert create_model.__module__ == 'lookhere_dense.lookhere.vit'


def test_build_model_from_checkpoint_is_an_inference_api():
    from lookhere_dense import apis
    from lookhere_dense.apis import inference

    assert apis.build_model_from_checkpoint is inference.build_model_from_checkpoint
    assert 'build_model_from_checkpoint' in inference.__all__
