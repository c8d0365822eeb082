"""The LookHere bias: official reference outputs, an independent slow definition, properties
and validation errors."""

from __future__ import annotations

import ast
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from lookhere_dense.lookhere import bias as B
from lookhere_dense.lookhere import config as C
from lookhere_dense.lookhere.bias import build_grid_bias, lookhere_bias
from lookhere_dense.lookhere.config import (
    PRESETS,
    LookHereConfig,
    head_layout,
    layer_slopes,
    resolve_lh_config,
)
from lookhere_dense.lookhere.directions import DIRECTION_TYPES

BF16_MAX = torch.finfo(torch.bfloat16).max
REFERENCE_CONFIGS = {  # ../shared/reference/README.md
    'halves_none': LookHereConfig('halves-none', 1.0, (1.5, 0.5)),
    'corners_none': LookHereConfig('corners-none', 1.0, (1.5, 0.5)),
    'eighths_none': LookHereConfig('eighths1-eighths2-none', 1.0, (2.0, 0.5)),
}


def as_official(bias: torch.Tensor) -> torch.Tensor:
    """Our ``-inf`` for blocked keys is the official ``-bfloat16.max``."""
    return torch.where(torch.isneginf(bias), torch.tensor(-BF16_MAX), bias)


# ----------------------------------------------------------------------------------------
# Official reference outputs
# ----------------------------------------------------------------------------------------
def test_matches_official_reference(reference_dir: Path):
    ref = np.load(reference_dir / 'lookhere_bias_reference.npz')
    assert len(ref.files) == 6
    for key in ref.files:
        _, preset, grid = key.split('__')
        h, w = map(int, grid.split('x'))
        expected = torch.from_numpy(ref[key])
        ours = as_official(lookhere_bias(REFERENCE_CONFIGS[preset], (h, w), depth=3, num_heads=12))
        assert ours.shape == expected.shape == (3, 12, h * w, h * w), key
        torch.testing.assert_close(ours, expected, rtol=1e-6, atol=0, msg=key)


def test_presets_are_the_reference_configs():
    assert PRESETS['lh180'] == REFERENCE_CONFIGS['halves_none']
    assert PRESETS['lh90'] == REFERENCE_CONFIGS['corners_none']
    assert PRESETS['lh45'] == REFERENCE_CONFIGS['eighths_none']
    for name, cfg in PRESETS.items():  # 8 directed + 4 unrestricted heads for 12 heads
        _, _, types = head_layout(cfg.head_directions, 12)
        assert types.count('none') == 4 and len(types) == 12, name


# ----------------------------------------------------------------------------------------
# An independent, slow definition (angles, one (query, key) pair at a time)
# ----------------------------------------------------------------------------------------
# Visible angular sectors (degrees, math convention: 0 = right, 90 = up) of each primitive.
SECTORS = {
    'up': [(0, 180)],
    'down': [(-180, 0)],
    'right': [(-90, 90)],
    'left': [(90, 180), (-180, -90)],
    'tri_up': [(45, 135)],
    'tri_down': [(-135, -45)],
    'tri_right': [(-45, 45)],
    'tri_left': [(135, 180), (-180, -135)],
    'diag_up_right': [(-45, 135)],
    'diag_up_left': [(45, 180), (-180, -135)],
    'diag_down_right': [(-135, 45)],
    'diag_down_left': [(135, 180), (-180, -45)],
}


def sees(spec, dy: int, dx: int) -> bool:
    if dy == 0 and dx == 0:
        return True
    angle = math.degrees(math.atan2(-dy, dx))  # image y grows downwards; in (-180, 180]
    angles = (angle, angle - 360)  # 180 deg is also -180 deg
    for prim in spec:
        if prim in ('zero', 'center'):
            continue
        if not any(lo - 1e-9 <= a <= hi + 1e-9 for lo, hi in SECTORS[prim] for a in angles):
            return False
    return True


def slow_bias(cfg: LookHereConfig, grid, depth: int, num_heads: int) -> torch.Tensor:
    h_, w_ = grid
    n = h_ * w_
    dist_fn = {'linear': lambda r: r, 'sqrt': math.sqrt, 'square': lambda r: r * r}[cfg.distance]
    coords = [(i // w_, i % w_) for i in range(n)]
    out = torch.zeros(depth, num_heads, n, n, dtype=torch.float64)
    slopes_l = layer_slopes(cfg, depth)
    for layer in range(depth):
        specs, head_slopes, _ = head_layout(cfg.layer_direction(layer), num_heads)
        scale = cfg.global_slope * slopes_l[layer]
        for h, spec in enumerate(specs):
            d = torch.zeros(n, n, dtype=torch.float64)
            blocked = torch.zeros(n, n, dtype=torch.bool)
            for q, (qy, qx) in enumerate(coords):
                for k, (ky, kx) in enumerate(coords):
                    r = math.hypot(ky - qy, kx - qx)
                    if 'center' in spec:
                        d[q, k] = math.hypot(kx - (w_ - 1) / 2, ky - (h_ - 1) / 2)
                    elif 'zero' in spec:
                        d[q, k] = 0.0
                    else:
                        d[q, k] = dist_fn(r)
                    blocked[q, k] = not sees(spec, ky - qy, kx - qx)
            fill = {'inf': math.inf, 'zero': 0.0, 'max': float(d.max())}[cfg.fill_with]
            d[blocked] = fill
            val = scale * (float(head_slopes[h]) * d)
            if cfg.bias_rounding == 'bfloat16':
                val = val.to(torch.bfloat16).double()
            out[layer, h] = -val
    return out


@pytest.mark.parametrize('grid', [(3, 5), (4, 2)])
@pytest.mark.parametrize('direction', sorted(DIRECTION_TYPES))
def test_every_direction_type_matches_slow_definition(direction, grid):
    cfg = LookHereConfig(direction, 0.7, (2.0, 0.3))
    torch.testing.assert_close(
        lookhere_bias(cfg, grid, 2, 8, dtype=torch.float64),
        slow_bias(cfg, grid, 2, 8),
        rtol=1e-12,
        atol=0,
    )


@pytest.mark.parametrize('distance,fill', list(itertools.product(C.DISTANCES, C.FILLS)))
def test_distance_and_fill_options_match_slow_definition(distance, fill):
    cfg = LookHereConfig(
        'corners-triangles-center',
        1.3,
        (1.0, 0.25),
        distance=distance,
        fill_with=fill,
        bias_rounding='none',
    )
    torch.testing.assert_close(
        lookhere_bias(cfg, (4, 3), 3, 12, dtype=torch.float64),
        slow_bias(cfg, (4, 3), 3, 12),
        rtol=1e-12,
        atol=0,
    )


def test_per_layer_head_strings_match_slow_definition():
    cfg = LookHereConfig(
        ['halves-none', 'eighths1-eighths2-none', 'diagonals-zerohalves'], 1.0, (1.5, 0.5)
    )
    torch.testing.assert_close(
        lookhere_bias(cfg, (3, 4), 3, 12, dtype=torch.float64),
        slow_bias(cfg, (3, 4), 3, 12),
        rtol=1e-12,
        atol=0,
    )


# ----------------------------------------------------------------------------------------
# Head layouts and slopes (official rules, written out by hand)
# ----------------------------------------------------------------------------------------
NONE4 = [1 / 4, 1 / 16, 1 / 64, 1 / 256]


@pytest.mark.parametrize(
    'direction,heads,expected',
    [
        ('halves-none', 12, [0.5] * 4 + [0.25] * 4 + NONE4),
        ('eighths1-eighths2-none', 12, [0.5] * 8 + NONE4),
        ('halves-none', 16, [0.5] * 4 + [0.25] * 4 + [s for s in NONE4 for _ in range(2)]),
        ('corners-none', 6, [0.5] * 4 + NONE4[:2]),
        ('halves', 12, [0.5] * 4 + [0.25] * 4 + [0.125] * 4),
        ('none', 8, [s for s in NONE4 for _ in range(2)]),
        ('halves-corners-triangles-none', 16, [0.5] * 12 + NONE4),
        ('triangles-halves-none', 16, [0.5] * 4 + [0.25] * 4 + [0.5] * 4 + NONE4),
    ],
)
def test_head_slopes(direction, heads, expected):
    specs, slopes, types = head_layout(direction, heads)
    assert len(specs) == len(types) == heads
    assert slopes.tolist() == expected


def test_head_directions_follow_official_order():
    specs, _, _ = head_layout('halves-none', 12)
    assert specs == [('up',), ('down',), ('left',), ('right',)] * 2 + [()] * 4
    specs, _, _ = head_layout('eighths1-eighths2-none', 12)
    assert specs[:2] == [('tri_up', 'left'), ('tri_down', 'left')]
    assert specs[4:6] == [('tri_up', 'right'), ('tri_down', 'right')]


def test_layer_slopes_match_numpy_linspace_bitwise():
    for first, last, depth in [(1.5, 0.5, 12), (2.0, 0.5, 24), (0.3, 0.7, 7), (1.0, 1.0, 1)]:
        cfg = LookHereConfig('halves-none', 1.0, (first, last))
        assert layer_slopes(cfg, depth) == np.linspace(first, last, depth).tolist()


# ----------------------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------------------
def grid_bias(cfg, grid, heads=12, depth=2):
    return build_grid_bias(cfg, grid, depth, heads, dtype=torch.float64)


@pytest.mark.parametrize('preset', sorted(PRESETS))
def test_translation_equivariance_on_rectangular_grid(preset):
    h, w = 5, 9
    dense = grid_bias(PRESETS[preset], (h, w)).dense(1)
    idx = lambda y, x: y * w + x  # noqa: E731  row-major token order
    for qy, qx, ky, kx in [(0, 0, 2, 3), (1, 4, 0, 8), (4, 8, 0, 0), (2, 2, 2, 6)]:
        ref = dense[:, idx(qy, qx), idx(ky, kx)]
        for ty in range(-h, h):
            for tx in range(-w, w):
                if all(0 <= a < h for a in (qy + ty, ky + ty)) and all(
                    0 <= a < w for a in (qx + tx, kx + tx)
                ):
                    torch.testing.assert_close(
                        dense[:, idx(qy + ty, qx + tx), idx(ky + ty, kx + tx)], ref
                    )


@pytest.mark.parametrize(
    'direction,pairs',
    [
        ('halves', [(0, 1), (2, 3)]),  # up <-> down, left <-> right
        ('corners', [(0, 3), (1, 2)]),  # up-left <-> down-right, up-right <-> down-left
        ('triangles', [(0, 1), (2, 3)]),
        ('diagonals', [(0, 3), (1, 2)]),  # up-right <-> down-left, up-left <-> down-right
    ],
)
def test_opposite_heads_are_transposes(direction, pairs):
    dense = grid_bias(LookHereConfig(direction), (4, 6), heads=4, depth=1).dense(0)
    for a, b in pairs:
        torch.testing.assert_close(dense[a], dense[b].T)


@pytest.mark.parametrize(
    'direction,fraction',
    [
        ('halves', 1 / 2),
        ('corners', 1 / 4),
        ('triangles', 1 / 4),
        ('eighths1', 1 / 8),
        ('diagonals', 1 / 2),
        ('none', 1.0),
    ],
)
def test_field_of_view_sizes(direction, fraction):
    """From the centre of a large grid a head sees about its share of the plane."""
    size = 41
    dense = grid_bias(LookHereConfig(direction), (size, size), heads=4, depth=1).dense(0)
    centre = (size // 2) * size + size // 2
    seen = (~torch.isneginf(dense[:, centre])).double().mean(dim=-1)
    assert torch.allclose(seen, torch.full_like(seen, fraction), atol=0.03), seen


def test_right_head_on_rectangular_grid_by_hand():
    h, w = 2, 3  # token (y, x) -> y * 3 + x
    dense = grid_bias(
        LookHereConfig('halves', bias_rounding='none'), (h, w), heads=4, depth=1
    ).dense(0)
    up, down, left, right = dense
    scale = 1.5 * 0.5  # layer slope (depth 1 -> first) x head slope 1/2
    assert right[0, 1] == -scale * 1.0  # (0,0) -> (0,1): one step right
    assert torch.isneginf(right[1, 0])  # (0,1) -> (0,0) is to the left
    assert left[1, 0] == -scale * 1.0
    assert torch.isclose(down[0, 5], torch.tensor(-scale * math.sqrt(5), dtype=torch.float64))
    assert torch.isneginf(up[0, 5]) and torch.isneginf(up[0, 3]) and up[3, 0] == -scale


def test_self_is_visible_with_zero_bias_and_cls_row_column_is_zero():
    gb = grid_bias(PRESETS['lh45'], (3, 4))
    dense = gb.dense(0, cls_token=True)
    assert dense.shape == (12, 13, 13)
    assert torch.all(dense[:, 0, :] == 0) and torch.all(dense[:, :, 0] == 0)
    assert torch.all(torch.diagonal(dense, dim1=-2, dim2=-1) == 0)


@pytest.mark.parametrize('cls_token', [False, True])
def test_row_blocks_are_slices_of_the_dense_bias(cls_token):
    gb = grid_bias(LookHereConfig('corners-center'), (3, 5))
    dense = gb.dense(1, cls_token)
    total = dense.shape[-1]
    for start, stop in [(0, 1), (0, 7), (3, 11), (total - 2, total), (5, 5)]:
        torch.testing.assert_close(gb.rows(1, start, stop, cls_token), dense[:, start:stop])


def test_center_heads_depend_on_the_key_only():
    gb = grid_bias(LookHereConfig('center'), (3, 5), heads=4, depth=1)
    dense = gb.dense(0)
    assert gb.key_term is not None
    assert torch.all(dense == dense[:, :1, :])  # the same for every query row
    assert dense[0, 0].argmax() == 7  # (1, 2) is the centre of a 3x5 grid


def test_zero_slope_keeps_blocked_keys_blocked():
    cfg = LookHereConfig('halves', global_slope=0.0)
    dense = grid_bias(cfg, (3, 3), heads=4, depth=1).dense(0)
    assert torch.isneginf(dense[0, 0, 8])  # 'up' head, key below
    assert dense[0, 8, 0] == 0  # visible: no penalty with slope 0


def test_window_bias_is_the_bias_of_a_window_sized_grid():
    """Offsets inside a window are a subset of the full grid's: same values."""
    full = grid_bias(PRESETS['lh90'], (8, 8)).dense(1)
    win = grid_bias(PRESETS['lh90'], (4, 4)).dense(1)
    idx = torch.tensor([y * 8 + x for y in range(2, 6) for x in range(3, 7)])
    torch.testing.assert_close(full[:, idx][:, :, idx], win)


# ----------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    'kwargs,match',
    [
        (dict(head_directions='halves-nine'), r"unknown LookHere direction type 'nine'.*allowed"),
        (dict(distance='cubic'), r"unknown LookHere distance 'cubic'; allowed"),
        (dict(fill_with='nan'), r"unknown LookHere fill_with 'nan'; allowed"),
        (dict(layer_slopes=(1.0,)), r'layer_slopes must be a pair'),
        (dict(bias_rounding='fp8'), r'unknown LookHere bias_rounding'),
        (dict(head_directions=[]), r'head_directions must be'),
    ],
)
def test_bad_config_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LookHereConfig(**kwargs)


def test_bad_presets_keys_and_head_counts():
    with pytest.raises(ValueError, match=r"unknown LookHere preset 'lh30'.*lh180"):
        resolve_lh_config(preset='lh30')
    with pytest.raises(ValueError, match=r'unknown LookHere config keys \[.slope.\]'):
        LookHereConfig.from_dict(dict(head_directions='halves-none', slope=1.0))
    with pytest.raises(ValueError, match=r"'halves-none'.*does not fit num_heads=8"):
        head_layout('halves-none', 8)
    with pytest.raises(ValueError, match=r'does not fit num_heads=6'):
        head_layout('halves', 6)
    with pytest.raises(ValueError, match=r'give 8 head slopes for 6 heads'):
        head_layout('none-halves', 6)
    with pytest.raises(ValueError, match=r'lists 2 strings but the model has 3 layers'):
        LookHereConfig(['halves-none', 'corners-none']).validate(12, 3)
    with pytest.raises(ValueError, match=r'grid_size must be'):
        lookhere_bias(PRESETS['lh180'], (0, 4), 1, 12)


def test_resolve_lh_config_merges_preset_and_overrides():
    cfg = resolve_lh_config(dict(global_slope=2.0), preset='lh90')
    assert cfg.head_directions == 'corners-none' and cfg.global_slope == 2.0
    assert resolve_lh_config() == PRESETS['lh180']
    assert resolve_lh_config('lh45') == PRESETS['lh45']
    official = dict(head_directions='halves-none', global_slope=1.0, layer_slopes=[1.5, 0.5])
    assert resolve_lh_config(official) == PRESETS['lh180']
    assert LookHereConfig.from_dict(PRESETS['lh45'].to_dict()) == PRESETS['lh45']


def test_math_module_has_no_openmmlab_imports():
    root = Path(B.__file__).parent
    for path in root.glob('*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or '']
            for name in names:
                assert not name.split('.')[0].startswith('mm'), f'{path.name} imports {name}'


@pytest.mark.parametrize('grid', [(1, 1), (3, 5), (6, 2)])
def test_pair_index_points_at_the_offset_from_query_to_key(grid):
    """The one token-pair -> table-entry map: the entry it names holds (dy, dx) = k - q in
    the table layout of :func:`relative_offsets`; it broadcasts, and ``offset_index`` is
    its outer product."""
    from lookhere_dense.lookhere.directions import relative_offsets

    height, width = grid
    dy, dx = (t.flatten() for t in relative_offsets(height, width))
    patches = torch.arange(height * width)
    q, k = patches[:, None], patches[None, :]
    idx = B.pair_index(grid, q, k)
    assert idx.shape == (height * width,) * 2 and idx.dtype == torch.int64
    assert torch.equal(dy[idx], k // width - q // width)
    assert torch.equal(dx[idx], k % width - q % width)
    assert torch.equal(B.offset_index(grid, patches, patches), idx)
    assert B.pair_index(grid, torch.tensor(0), torch.tensor(height * width - 1)).item() == (
        (2 * height - 1) * (2 * width - 1) - 1
    )  # bottom-right key from the top-left query
