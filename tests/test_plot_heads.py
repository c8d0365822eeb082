"""tools/plot_heads.py: the plotted fields of view are LookHere's masks and penalties."""
from __future__ import annotations

import math

import pytest
import torch

from lookhere_dense.cli import load_tool


@pytest.fixture(scope='module')
def plot_heads():
    return load_tool('plot_heads')


def test_lh180_fields_are_half_planes_with_a_linear_penalty(plot_heads):
    from lookhere_dense.lookhere import resolve_lh_config
    cfg = resolve_lh_config(preset='lh180')
    fields = plot_heads.head_fields(cfg, (7, 9), (3, 2), depth=4, num_heads=12, layers=[0, 3])
    assert fields.shape == (2, 12, 7, 9)
    up, down, left, right = fields[0, :4]
    assert torch.isinf(up[4:]).all() and torch.isfinite(up[:4]).all()    # rows below blocked
    assert torch.isinf(down[:3]).all() and torch.isfinite(down[3:]).all()
    assert torch.isinf(left[:, 3:]).all() and torch.isfinite(left[:, :3]).all()
    assert torch.isinf(right[:, :2]).all() and torch.isfinite(right[:, 2:]).all()
    assert torch.isfinite(fields[:, 8:]).all()  # the 'none' heads see everything
    assert (fields[:, :, 3, 2] == 0).all()  # the query itself: no penalty
    # layer 0, head 0: slope 1.5 (layer) * 0.5 (head); key (0, 0) is sqrt(9 + 4) away
    assert fields[0, 0, 0, 0].item() == pytest.approx(-0.75 * math.sqrt(13), rel=1e-2)
    # the last layer's slope is 0.5: a third of the first layer's penalty
    assert fields[1, 0, 0, 0].item() == pytest.approx(fields[0, 0, 0, 0].item() / 3, rel=1e-2)


def test_cli_writes_a_png_and_checks_its_arguments(plot_heads, tmp_path):
    out = tmp_path / 'heads.png'
    fields = plot_heads.main(['--preset', 'lh90', '--grid', '6', '8', '--query', '1', '6',
                              '--depth', '3', '--layers', '1', '--out', str(out)])
    assert fields.shape == (1, 12, 6, 8)
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and out.stat().st_size > 20_000
    with pytest.raises(ValueError, match='outside the 6x8 grid'):
        plot_heads.main(['--grid', '6', '8', '--query', '6', '0', '--out', str(out)])
    with pytest.raises(ValueError, match=r'layers \[5\] out of range'):
        plot_heads.main(['--depth', '3', '--layers', '5', '--out', str(out)])
    fields = plot_heads.main(['--lh-config', '{"head_directions": "none"}', '--grid', '4', '4',
                              '--depth', '2', '--out', str(out)])
    assert torch.isfinite(fields).all()  # 2D-ALiBi-like: no masks
