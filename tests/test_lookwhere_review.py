"""LookWhere review fixes (lookhere_dense/lookwhere, the mmseg wrappers, the study CLI):
arguments that were silently ignored or crashed deep are refused by name, and the
documented ``forward_tokens(selection=selector(images, grid))`` works."""

from __future__ import annotations

import re
import runpy

import pytest
import torch

from lookhere_dense.lookhere import create_model
from lookhere_dense.lookwhere import (
    LookWhere,
    PropagateFill,
    idw_fill,
    lattice_patches,
    nearest_fill,
    top_k_patches,
    top_k_with_coverage,
)

TINY_SEL = dict(input_size=(32, 32), embed_dims=48, num_layers=1, num_heads=12)
TINY_EXT = dict(embed_dims=48, num_layers=2, num_heads=12, img_size=64)
TINY_TRUNK = dict(img_size=64, patch_size=16, embed_dims=48, num_layers=2, num_heads=12)


def _model(**kwargs) -> LookWhere:
    torch.manual_seed(0)
    return LookWhere(TINY_SEL, TINY_EXT, **kwargs).eval()


def test_forward_tokens_refuses_k_with_a_selection_that_has_its_keep():
    """``k`` / ``k_ratio`` next to :meth:`select`'s output were ignored (its 4 patches
    kept, not 8), while the same with ``keep`` was refused: now refused alike."""
    model = _model(k_ratio=0.5)
    images = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        sel = model.select(images, k=4)
        for extra in (dict(k=8), dict(k_ratio=0.75)):
            with pytest.raises(ValueError, match=r"selection\['keep'\] gives the kept patches"):
                model.forward_tokens(images, selection=sel, **extra)
        assert model.forward_tokens(images, selection=sel)['keep'].shape == (1, 4)


def test_forward_tokens_takes_the_selectors_own_output():
    """The docstring's ``selection=self.selector(images, grid)`` (no 'keep': a KeyError)
    keeps the top-k of its scores as :meth:`select` does: the model's k, coverage, or this
    call's k."""
    model = _model(k_ratio=0.5, coverage=0.5)
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        raw = model.selector(images, (4, 4))
        got = model.forward_tokens(images, selection=raw)
        ref = model.forward_tokens(images)
        assert torch.equal(got['keep'], ref['keep']) and got['keep'].shape == (2, 8)
        torch.testing.assert_close(got['tokens'][-1], ref['tokens'][-1], rtol=0, atol=0)
        three = model.forward_tokens(images, selection=raw, k=3)
        assert torch.equal(three['keep'], model.select(images, k=3)['keep'])
        with pytest.raises(ValueError, match=r"selection has neither 'keep' nor 'scores'"):
            model.forward_tokens(images, selection={'prefix_tokens': raw['prefix_tokens']})
        own_cls = _model(k_ratio=0.5, use_selector_prefix=False)  # the trunk's CLS
        got = own_cls.forward_tokens(images, selection=own_cls.selector(images, (4, 4)))
        ref = own_cls.forward_tokens(images)
        assert torch.equal(got['keep'], ref['keep']) and got['num_prefix'] == 1
        torch.testing.assert_close(got['tokens'][-1], ref['tokens'][-1], rtol=0, atol=0)


@pytest.mark.parametrize('coverage', [0.0, 0.5])
@pytest.mark.parametrize('k', [0, 20])
def test_top_k_with_coverage_refuses_k_outside_one_to_n(k, coverage):
    """k > N gave duplicated patches, k = 0 an empty row (coverage > 0) or torch's
    'selected index k out of range' (coverage 0)."""
    scores = torch.rand(1, 16)
    with pytest.raises(ValueError, match=re.escape(f'k={k} is outside [1, N=16]')):
        top_k_with_coverage(scores, k, (4, 4), coverage)
    with pytest.raises(ValueError, match=re.escape(f'k={k} is outside [1, N=16]')):
        top_k_patches(scores, k)


def test_top_k_with_coverage_is_distinct_with_minus_inf_scores():
    """-inf scores tied with the lattice's exclusion: a lattice patch was kept twice."""
    scores = torch.full((2, 16), float('-inf'))
    scores[:, :3] = 1.0
    keep = top_k_with_coverage(scores, 8, (4, 4), 0.5)
    lattice = set(lattice_patches((4, 4), 4).tolist())
    for row in keep.tolist():
        assert len(set(row)) == 8 and row == sorted(row)
        assert {0, 1, 2} | lattice <= set(row)


def test_duplicate_keep_is_refused_naming_the_row():
    """A repeated patch in ``keep`` entered every kept token's softmax twice (the output
    changed by 5e-6, silently)."""
    model = _model()
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r'keep row 1 holds patch 3 more than once'):
            model(images, keep=torch.tensor([[3, 5, 6, 7], [3, 3, 3, 5]]))
        model(images, keep=torch.tensor([[7, 5, 6, 3], [3, 4, 9, 5]]))  # any order is fine


def test_an_empty_keep_is_refused_by_name():
    """``keep`` of shape (B, 0) crashed in the fill's argmin (torch's IndexError)."""
    model = _model()
    empty = torch.zeros(1, 0, dtype=torch.long)
    with torch.no_grad(), pytest.raises(ValueError, match=r'keep is \(1, 0\), no kept patch'):
        model(torch.randn(1, 3, 64, 64), keep=empty)
    values = torch.zeros(1, 0, 4)
    for fill in (nearest_fill, idw_fill, PropagateFill(4)):
        with pytest.raises(ValueError, match=r'keep must be \(B, K\) with K >= 1'):
            fill(values, empty, (3, 3))


def test_distiller_checks_the_teacher_and_student_widths_when_built():
    """Teacher 96 wide, student 48: a raw reshape RuntimeError in the loss (without the
    copy from the teacher) or a CheckpointError naming model.backbone.embed_dims (with
    it); now both refused when built, naming model.teacher.* and model.student.extractor.*.
    """
    from lookhere_dense.models.backbones.lookwhere import LookWhereDistiller

    student = dict(selector=TINY_SEL, extractor=TINY_TRUNK, k_ratio=0.5)
    for init in (False, True):
        with pytest.raises(
            ValueError,
            match=r'model\.teacher\.embed_dims=96 but model\.student\.extractor\.embed_dims=48',
        ):
            LookWhereDistiller(
                teacher=dict(TINY_TRUNK, embed_dims=96),
                student=student,
                init_extractor_from_teacher=init,
            )
    with pytest.raises(ValueError, match=r'model\.teacher\.patch_size=8 but model\.student'):
        LookWhereDistiller(
            teacher=dict(TINY_TRUNK, patch_size=8),
            student=student,
            init_extractor_from_teacher=False,
        )
    # depth is free (only the last block's output is distilled) unless copied
    deeper = LookWhereDistiller(
        teacher=dict(TINY_TRUNK, num_layers=3), student=student, init_extractor_from_teacher=False
    )
    losses = deeper.loss(torch.randn(2, 3, 64, 64))
    assert all(bool(torch.isfinite(v)) for v in losses.values())


def test_distiller_copy_from_the_teacher_names_the_student_extractor_keys():
    """init_extractor_from_teacher with another depth said 'set model.backbone.num_layers'
    (no such key in a distillation config)."""
    from lookhere_dense.errors import CheckpointError
    from lookhere_dense.models.backbones.lookwhere import LookWhereDistiller

    with pytest.raises(CheckpointError) as err:
        LookWhereDistiller(
            teacher=dict(TINY_TRUNK, num_layers=4),
            student=dict(selector=TINY_SEL, extractor=TINY_TRUNK),
        )
    msg = str(err.value)
    assert msg.startswith('model.student.extractor: ') and 'model.backbone.' not in msg
    assert 'set model.student.extractor.num_layers=4' in msg


def test_distillation_losses_refuse_another_width_by_name():
    """The torch-only loss (the study's distillation) reshaped the teacher's 96-wide
    features into the student's 48-wide map: a raw RuntimeError."""
    from lookhere_dense.lookwhere.distill import distillation_losses, teacher_targets

    torch.manual_seed(0)
    teacher = create_model(**dict(TINY_TRUNK, embed_dims=96)).eval()
    student = LookWhere(TINY_SEL, TINY_EXT, k_ratio=0.5)
    images = torch.randn(2, 3, 64, 64)
    with pytest.raises(ValueError, match=r"teacher's features are 96 wide, the student's"):
        distillation_losses(student, images, teacher_targets(teacher, images))


@pytest.fixture
def study_main(monkeypatch):
    """tools/lookwhere_study.py's ``main`` with the long runs replaced: each records its
    call (a refusal must come before it)."""
    import research.lookwhere.diagnose as diagnose
    import research.lookwhere.study as study

    calls = []
    for module, name in (
        (study, 'run_study'),
        (study, 'run_timing'),
        (study, 'run_extractor_memory'),
        (diagnose, 'run_diagnosis'),
    ):
        monkeypatch.setattr(module, name, lambda *a, _n=name, **k: calls.append(_n) or [])
    return runpy.run_path('tools/lookwhere_study.py')['main'], calls


@pytest.mark.parametrize(
    'argv, said',
    [
        (['study', '--sizes', '64x128'], '--sizes: 64x128 is smaller than the 128 px training'),
        (['study', '--coverage', '1.5'], 'argument --coverage: 1.5 is outside [0, 1]'),
        (['diagnose', '--k-ratios', '2'], 'argument --k-ratios: 2 is outside (0, 1]'),
        (['timing', '--k-ratios', '0'], 'argument --k-ratios: 0 is outside (0, 1]'),
        (['extractor-memory', '--k-ratio', '1.5'], 'argument --k-ratio: 1.5 is outside (0, 1]'),
        (['timing', '--k-ratios', 'nan'], 'argument --k-ratios: nan is outside (0, 1]'),
    ],
)
def test_study_cli_refuses_bad_values_before_running(study_main, capsys, argv, said):
    """Each was met after the teacher's training (study --coverage, diagnose --k-ratios),
    deep in the crop sampling (study --sizes below the crop) or as a traceback (timing,
    extractor-memory)."""
    main, calls = study_main
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and said in capsys.readouterr().err
    assert calls == []


def test_study_cli_sizes_follow_the_tasks_crop(study_main, capsys):
    """The smallest size is the --task's training crop: 64 px for fov (its 64x64 frames
    run), 128 px for the Cityscapes tasks (any size below it is refused)."""
    main, calls = study_main
    argv = ['study', '--task', 'cityscapes-small', '--sizes', '128x128', '128x96']
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and calls == []
    assert '128x96 is smaller than the 128 px training crop of --task cityscapes-small' in err
    assert main(['study', '--task', 'fov', '--sizes', '64x64', '--coverage', '1']) == 0
    assert calls == ['run_study']


def test_a_lookhere_segmentor_file_gets_the_extractor_advice_first(tmp_path):
    """A LookHereViT segmentor's checkpoint (backbone.blocks.*) for a LookWhereViT said
    "add prefix='backbone.'", which only led to a second refusal; the right advice (the
    extractor's ``pretrained``) comes first, and it loads. A LookWhere segmentor's file
    still gets the prefix."""
    from lookhere_dense.errors import CheckpointError
    from lookhere_dense.models.backbones.lookwhere import LookWhereViT

    trunk = create_model(**TINY_TRUNK)
    plain = str(tmp_path / 'lookhere_segmentor.pth')
    torch.save({'state_dict': {'backbone.' + k: v for k, v in trunk.state_dict().items()}}, plain)
    model = LookWhereViT(TINY_SEL, TINY_EXT, init_cfg=dict(type='Pretrained', checkpoint=plain))
    with pytest.raises(CheckpointError) as err:
        model.init_weights()
    assert 'extractor=dict(pretrained=FILE)' in str(err.value)
    assert "prefix='backbone.'" not in str(err.value)
    loaded = LookWhereViT(TINY_SEL, dict(TINY_EXT, pretrained=plain))
    assert torch.equal(loaded.extractor.trunk.cls_token, trunk.cls_token)

    own = str(tmp_path / 'lookwhere_segmentor.pth')
    state = LookWhereViT(TINY_SEL, TINY_EXT).state_dict()
    torch.save({'state_dict': {'backbone.' + k: v for k, v in state.items()}}, own)
    model = LookWhereViT(TINY_SEL, TINY_EXT, init_cfg=dict(type='Pretrained', checkpoint=own))
    with pytest.raises(CheckpointError, match=re.escape("add prefix='backbone.' to init_cfg")):
        model.init_weights()
