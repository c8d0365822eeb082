"""The demo numbers in README.md and docs/segmentation.md are the ones the demo wrote.

``tools/demo.py`` writes ``work_dirs/demo/demo_summary.json`` and per dataset
``extrapolation.json`` (and the Cityscapes layout's ``fov_view.json``); they are committed as
``docs/seg_demo_summary.json``, ``docs/seg_demo_{ade20k,cityscapes}.json`` and
``docs/seg_demo_cityscapes_fov.json``. These checks read the prose and tables and compare
every number with those files, so a re-run of the demo (e.g. after a kernel change) whose
JSONs are committed without updating the text fails here, and so does a text edit that
the JSONs do not back. Cheap: no model runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / 'docs'


def _json(name: str) -> dict:
    return json.loads((DOCS / name).read_text())


def _summary() -> dict:
    return _json('seg_demo_summary.json')


def _table_rows(text: str, header: str) -> List[List[str]]:
    """Cells of the markdown table that starts with ``header`` (the first such table)."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == header)
    rows = []
    for ln in lines[start + 2 :]:
        if not ln.startswith('|'):
            break
        rows.append([c.strip() for c in ln.strip().strip('|').split('|')])
    return rows


def _all_tables(text: str, header: str) -> List[List[List[str]]]:
    """Every markdown table of ``text`` whose header line is ``header``."""
    parts = text.split(header)
    return [_table_rows(header + part, header) for part in parts[1:]]


def _grid(row: dict) -> str:
    return f'{row["grid_h"]}x{row["grid_w"]}'


def _commit(summary: dict) -> str:
    return summary['environment']['commit'].replace('-dirty', '')


@pytest.fixture(scope='module')
def readme() -> str:
    return (REPO / 'README.md').read_text()


def test_readme_names_the_commit_and_the_validation_miou(readme: str):
    summary = _summary()
    m = re.search(r'Measured at commit\s+`([0-9a-f]+)`', readme)
    assert m, 'README: "Measured at commit `...`" is missing'
    assert m.group(1) == _commit(summary), (m.group(1), summary['environment']['commit'])
    m = re.search(
        r'validation mIoU\s+\*\*([\d.]+)\*\* \(ADE20K layout\) and \*\*([\d.]+)\*\* '
        r'\(Cityscapes layout\)',
        readme,
    )
    assert m, 'README: the validation mIoU sentence is missing'
    data = summary['datasets']
    assert m.group(1) == f'{data["ade20k"]["val_mIoU"]:.2f}'
    assert m.group(2) == f'{data["cityscapes"]["val_mIoU"]:.2f}'
    for name in ('ade20k', 'cityscapes'):  # "against chance levels below 5"
        assert data[name]['chance']['uniform'] < 5 and data[name]['chance']['majority'] < 5


def test_readme_demo_table_is_the_ade20k_report(readme: str):
    rows = _table_rows(readme, '| test | patch grid | mIoU | s / img |')
    report = _json('seg_demo_ade20k.json')['rows']
    assert len(rows) == len(report)
    for cells, row in zip(rows, report):
        assert cells[0].split()[0] == row['test']
        assert cells[1].replace('×', 'x') == _grid(row), (cells, row['test'])
        assert cells[2] == f'{row["mIoU"]:.2f}', (cells, row['test'])
        assert cells[3] == f'{row["sec_per_img"]:.3f}', (cells, row['test'])
    summary_rows = _summary()['datasets']['ade20k']['rows']
    assert summary_rows == report  # the two files come from the same run


def test_readme_cityscapes_sentence_is_the_field_of_view_report(readme: str):
    fov: Dict[str, dict] = {r['test']: r for r in _json('seg_demo_cityscapes_fov.json')['rows']}
    slide, whole = fov['slide@x1'], fov['whole@x1']
    m = re.search(r'\(([\d.]+) vs ([\d.]+) mIoU\) in (\d+) % of the time', readme)
    assert m, 'README: the Cityscapes whole-vs-slide sentence is missing'
    assert m.group(1) == f'{whole["mIoU"]:.2f}' and m.group(2) == f'{slide["mIoU"]:.2f}'
    assert int(m.group(3)) == round(100 * whole['sec_per_img'] / slide['sec_per_img'])


def test_segmentation_doc_tables_are_the_reports():
    text = (DOCS / 'segmentation.md').read_text()
    header = '| test | input (median HxW) | patch grid | mIoU | aAcc | s / img | peak RSS MiB |'
    tables = _all_tables(text, header)
    reports = [
        _json('seg_demo_ade20k.json')['rows'],
        _json('seg_demo_cityscapes.json')['rows'],
        _json('seg_demo_cityscapes_fov.json')['rows'],
    ]
    assert len(tables) >= len(reports)
    for cells_rows, report in zip(tables, reports):
        assert len(cells_rows) == len(report)
        for cells, row in zip(cells_rows, report):
            expected = [
                row['test'],
                f'{row["input_h"]}x{row["input_w"]}',
                _grid(row),
                f'{row["mIoU"]:.2f}',
                f'{row["aAcc"]:.2f}',
                f'{row["sec_per_img"]:.3f}',
                f'{row["peak_mem_mb"]:.0f}',
            ]
            cells = [cells[0], cells[1], cells[2].split()[0], *cells[3:]]
            assert cells == expected
    summary = _summary()
    m = re.search(r'### Results\s+Commit `([0-9a-f]+)`', text)
    assert m and m.group(1) == _commit(summary)
    data = summary['datasets']
    assert (
        f'**{data["ade20k"]["val_mIoU"]:.2f} on the\nADE20K-layout data and '
        f'{data["cityscapes"]["val_mIoU"]:.2f} on the Cityscapes-layout data**'
    ) in text
