"""The head pictures of ``tools/plot_heads.py`` (:mod:`research.head_plots`):
the plotted fields of view are LookHere's masks and penalties."""

from __future__ import annotations

import math

import pytest
import torch

from research.head_plots import draw_head_fields, head_fields, load_lh_config


def test_lh180_fields_are_half_planes_with_a_linear_penalty():
    from lookhere_dense.lookhere import resolve_lh_config

    cfg = resolve_lh_config(preset='lh180')
    fields = head_fields(cfg, (7, 9), (3, 2), depth=4, num_heads=12, layers=[0, 3])
    assert fields.shape == (2, 12, 7, 9)
    up, down, left, right = fields[0, :4]
    assert torch.isinf(up[4:]).all() and torch.isfinite(up[:4]).all()  # rows below blocked
    assert torch.isinf(down[:3]).all() and torch.isfinite(down[3:]).all()
    assert torch.isinf(left[:, 3:]).all() and torch.isfinite(left[:, :3]).all()
    assert torch.isinf(right[:, :2]).all() and torch.isfinite(right[:, 2:]).all()
    assert torch.isfinite(fields[:, 8:]).all()  # the 'none' heads see everything
    assert (fields[:, :, 3, 2] == 0).all()  # the query itself: no penalty
    # layer 0, head 0: slope 1.5 (layer) * 0.5 (head); key (0, 0) is sqrt(9 + 4) away
    assert fields[0, 0, 0, 0].item() == pytest.approx(-0.75 * math.sqrt(13), rel=1e-2)
    # the last layer's slope is 0.5: a third of the first layer's penalty
    assert fields[1, 0, 0, 0].item() == pytest.approx(fields[0, 0, 0, 0].item() / 3, rel=1e-2)


def test_drawing_writes_a_png_and_checks_its_arguments(tmp_path):
    out = tmp_path / 'heads.png'
    fields = draw_head_fields(
        load_lh_config(preset='lh90'),
        (6, 8),
        str(out),
        query=(1, 6),
        depth=3,
        layers=[1],
        name='lh90',
    )
    assert fields.shape == (1, 12, 6, 8)
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and out.stat().st_size > 20_000
    lh180 = load_lh_config()
    with pytest.raises(ValueError, match='outside the 6x8 grid'):
        draw_head_fields(lh180, (6, 8), str(out), query=(6, 0))
    with pytest.raises(ValueError, match=r'layers \[5\] out of range'):
        draw_head_fields(lh180, (14, 14), str(out), depth=3, layers=[5])
    fields = draw_head_fields(
        load_lh_config('{"head_directions": "none"}'), (4, 4), str(out), depth=2
    )
    assert torch.isfinite(fields).all()  # 2D-ALiBi-like: no masks
    assert fields.shape == (2, 12, 4, 4)  # default layers: the first and the last


def test_lh_config_from_a_json_file(tmp_path):
    path = tmp_path / 'lh.json'
    path.write_text('{"head_directions": "none", "global_slope": 2.0}')
    cfg = load_lh_config(str(path), preset='lh45')
    assert cfg.global_slope == 2.0 and cfg == load_lh_config(path.read_text())
