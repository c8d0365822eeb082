"""Fault battery for the tools: bad arguments, bad files, bad checkpoints, interruption.
Every case ends in a clear message (exit status 2, exactly one ``error:`` line, no
traceback) or in a correct result. The command lines run as ``python tools/<tool>.py``
would, all in one interpreter (:func:`tiny_seg.run_tools`); the cases that need a
training run go through the training API in this process."""

from __future__ import annotations

import os
import os.path as osp
import shutil

import cv2
import numpy as np
import pytest
import torch
from tiny_seg import ADE_CFG, SHRINK, make_ade, options, roots, run_tools, write_checkpoint

from lookhere_dense.apis.cli import run_main
from lookhere_dense.apis.train import train_model

pytestmark = pytest.mark.usefixtures('one_torch_thread')

#: A mismatched model: other widths (12 heads of 4 dims) in the backbone and the head.
OTHER_DIMS = [
    'model.backbone.embed_dims=48',
    'model.decode_head.in_channels=48',
    'model.decode_head.channels=48',
    'model.decode_head.embed_dims=48',
]


def _cases(tmp) -> dict:
    """``name -> (tool, args, expected)``; ``expected`` is the text the one ``error:``
    line must contain, or ``None`` for a run that must succeed."""
    data = make_ade(tmp / 'data', num_train=2, num_val=2)
    val = osp.join(data, 'images', 'validation')
    good = write_checkpoint(str(tmp / 'ckpt' / 'good.pth'))
    other = write_checkpoint(str(tmp / 'ckpt' / 'other.pth'), OTHER_DIMS)
    truncated = str(tmp / 'ckpt' / 'truncated.pth')
    with open(good, 'rb') as f, open(truncated, 'wb') as g:
        g.write(f.read()[:3000])
    weights_only = str(tmp / 'ckpt' / 'weights_only.pth')
    torch.save({'state_dict': torch.load(good, weights_only=True)['state_dict']}, weights_only)
    text = tmp / 'ckpt' / 'notes.pth'
    text.write_text('these are my notes')
    broken_work = tmp / 'broken_work'
    broken_work.mkdir()
    (broken_work / 'iter_4.pth').write_bytes(b'\0' * 64)
    (broken_work / 'last_checkpoint').write_text(str(broken_work / 'iter_4.pth'))

    fake = tmp / 'fake_images'
    fake.mkdir()
    shutil.copy(osp.join(val, 'ADE_val_00000001.jpg'), fake)
    (fake / 'readme.jpg').write_text('not a picture')
    corrupt = tmp / 'corrupt_images'
    corrupt.mkdir()
    with open(osp.join(val, 'ADE_val_00000001.jpg'), 'rb') as f:
        (corrupt / 'cut.jpg').write_bytes(f.read()[:200])  # a JPEG header, then nothing
    blocked = tmp / 'blocked_out'
    (blocked / 'ADE_val_00000001.png').mkdir(parents=True)  # the overlay's name, a folder
    twins = tmp / 'twins'
    twins.mkdir()
    img = cv2.imread(osp.join(val, 'ADE_val_00000001.jpg'))
    cv2.imwrite(str(twins / 'a.jpg'), img)
    cv2.imwrite(str(twins / 'a.png'), img[::-1])
    (twins / 'notes.txt').write_text('not an image')  # skipped, and said so
    (twins / '.DS_Store').write_bytes(b'')  # hidden: not counted
    png_in = tmp / 'png_in'
    png_in.mkdir()
    cv2.imwrite(str(png_in / 'b.png'), img[::-1])
    a_file = tmp / 'a_file'
    a_file.write_text('x')

    shrink = ['--cfg-options', *SHRINK]
    data_opts = ['--cfg-options', *roots(data), *SHRINK]
    return {
        # arguments
        'cfg-options without =': (
            'train',
            [ADE_CFG, '--cfg-options', 'foo'],
            "argument --cfg-options: 'foo' is not KEY=VALUE",
        ),
        'cfg-options word for a number': (
            'train',
            [ADE_CFG, '--cfg-options', 'train_cfg.max_iters=abc'],
            "--cfg-options train_cfg.max_iters='abc': expected a number; the config has "
            'train_cfg.max_iters=300',
        ),
        'cfg-options typo': (
            'train',
            [ADE_CFG, '--cfg-options', 'train_cfg.max_iter=4'],
            "the config has no 'max_iter' in train_cfg; did you mean max_iters?",
        ),
        'cfg-options value for a section': (
            'train',
            [ADE_CFG, '--cfg-options', 'model.backbone=lh90'],
            "--cfg-options model.backbone='lh90': expected the section model.backbone",
        ),
        'cfg-options word for a bool': (
            'train',
            [ADE_CFG, '--cfg-options', 'model.backbone.with_cls_token=yes'],
            'expected True or False',
        ),
        'launcher outside torchrun': (
            'train',
            [ADE_CFG, '--launcher', 'pytorch'],
            '--launcher pytorch must run under torchrun',
        ),
        'test launcher outside torchrun': (
            'test',
            [ADE_CFG, good, '--launcher', 'pytorch'],
            '--launcher pytorch must run under torchrun',
        ),
        'threads 0': (
            'train',
            [ADE_CFG, '--threads', '0'],
            'argument --threads: must be >= 1, got 0',
        ),
        'max-images 0': (
            'extrapolate',
            [ADE_CFG, good, '--max-images', '0'],
            'argument --max-images: must be >= 1, got 0',
        ),
        'max-images word': (
            'extrapolate',
            [ADE_CFG, good, '--max-images', 'all'],
            "argument --max-images: expected a whole number, got 'all'",
        ),
        'opacity': (
            'infer',
            [ADE_CFG, good, val, '--opacity', '2'],
            '--opacity must be in 0..1, got 2.0',
        ),
        'show-interval 0': (
            'test',
            [ADE_CFG, good, '--show-interval', '0'],
            '--show-interval must be >= 1, got 0',
        ),
        'unknown preset': (
            'plot_heads',
            ['--preset', 'lh30'],
            "argument --preset: invalid choice: 'lh30'",
        ),
        'heads without a layout': (
            'plot_heads',
            ['--num-heads', '5', '--out', str(tmp / 'h.png')],
            'num_heads=5',
        ),
        'work dir is a file': (
            'train',
            [ADE_CFG, '--work-dir', str(a_file), *data_opts],
            f'the work dir {str(a_file)!r} is a file',
        ),
        'missing pretrained': (
            'train',
            [ADE_CFG, *data_opts, 'model.pretrained=nope.pth'],
            "model.pretrained='nope.pth': pretrained weights not found",
        ),
        # checkpoints
        'test: not a checkpoint': (
            'test',
            [ADE_CFG, str(text), *shrink],
            f'checkpoint {str(text)!r} cannot be read: not a PyTorch checkpoint',
        ),
        'test: truncated': (
            'test',
            [ADE_CFG, truncated, *shrink],
            f'checkpoint {truncated!r} cannot be read: damaged',
        ),
        'test: other widths': (
            'test',
            [ADE_CFG, other, '--work-dir', str(tmp / 'tw'), *data_opts],
            f'checkpoint {other!r} does not fit the model',
        ),
        'infer: other widths': (
            'infer',
            [ADE_CFG, other, val, '--out-dir', str(tmp / 'o1'), *shrink],
            'backbone.patch_embed.proj.weight: checkpoint (48, 3, 16, '
            '16) vs model (96, 3, 16, 16)',
        ),
        'convert: not a checkpoint': (
            'convert_checkpoint',
            [str(text), str(tmp / 'c.pth')],
            'cannot be read: not a PyTorch checkpoint',
        ),
        'resume: unreadable file': (
            'train',
            [ADE_CFG, '--resume', truncated, *data_opts],
            f'--resume checkpoint {truncated!r} cannot be read',
        ),
        'test: arguments swapped': (
            'test',
            [good, ADE_CFG, *data_opts],
            f'config {good!r} is a checkpoint: a config is a .py (or .json / .yaml) file; '
            'the tools take the config first, then the checkpoint',
        ),
        'test: the config twice': (
            'test',
            [ADE_CFG, ADE_CFG, *data_opts],
            f'checkpoint {ADE_CFG!r} cannot be read: it is a config file, not a checkpoint',
        ),
        'resume: weights only': (
            'train',
            [ADE_CFG, '--resume', weights_only, *data_opts],
            f'--resume checkpoint {weights_only!r} holds weights only (no iteration, optimizer '
            "or schedule: not a training run's iter_N.pth): to train from these weights, start "
            f'a new run with --cfg-options load_from={weights_only}',
        ),
        'resume: nothing readable': (
            'train',
            [ADE_CFG, '--resume', '--work-dir', str(broken_work), *data_opts],
            '--resume: no readable checkpoint in',
        ),
        # images and outputs
        'infer: not an image in the folder': (
            'infer',
            [ADE_CFG, good, str(fake), *shrink],
            f'{str(fake / "readme.jpg")!r} in the input '
            'folder is named like an image but is not one',
        ),
        'infer: corrupt image': (
            'infer',
            [ADE_CFG, good, str(corrupt), '--out-dir', str(tmp / 'o2'), *shrink],
            f'cannot decode the image {str(corrupt / "cut.jpg")!r}',
        ),
        'infer: output folder under a file': (
            'infer',
            [ADE_CFG, good, val, '--out-dir', str(a_file / 'sub'), *shrink],
            'cannot create the output folder',
        ),
        'infer: output name taken': (
            'infer',
            [ADE_CFG, good, val, '--out-dir', str(blocked), *shrink],
            f'could not write {str(blocked / "ADE_val_00000001.png")!r}',
        ),
        'infer: output folder is the input folder': (
            'infer',
            [ADE_CFG, good, str(png_in), '--out-dir', str(png_in), *shrink],
            f"the output 'b.png' would overwrite the input image {str(png_in / 'b.png')!r}",
        ),
        'test: --out the annotation folder': (
            'test',
            [ADE_CFG, good, '--out', osp.join(data, 'annotations', 'validation'), *data_opts],
            'is a folder of the dataset (test_dataloader.dataset.data_prefix.seg_map_path',
        ),
        'test: --out under a file': (
            'test',
            [ADE_CFG, good, '--out', str(a_file / 'preds'), *data_opts],
            f'--out {str(a_file / "preds")!r}: could not write the predictions: ',
        ),
        # an output folder under a regular file: named before the work (a traceback from
        # mmengine, or from the report writer after every test had run, before)
        'test: --show-dir under a file': (
            'test',
            [ADE_CFG, good, '--show-dir', str(a_file / 'show'), *data_opts],
            f'--show-dir {str(a_file / "show")!r} cannot be written: a part of the path is '
            'not a folder',
        ),
        'extrapolate: --out-dir under a file': (
            'extrapolate',
            [ADE_CFG, good, '--tests', 'whole@x1', '--out-dir', str(a_file / 'x'), *data_opts],
            f'--out-dir {str(a_file / "x")!r} cannot be written: a part of the path is not',
        ),
        'robustness: --out-dir under a file': (
            'robustness',
            [ADE_CFG, good, '--attack', 'fgsm', '--out-dir', str(a_file / 'x'), *data_opts],
            f'--out-dir {str(a_file / "x")!r} cannot be written: a part of the path is not',
        ),
        'plot_heads: --out under a file': (
            'plot_heads',
            ['--layers', '0', '--out', str(a_file / 'h.png')],
            f'--out {str(a_file)!r} cannot be written: a part of the path is not a folder',
        ),
        'infer: two images, one stem': (
            'infer',
            [ADE_CFG, good, str(twins), '--out-dir', str(tmp / 'o3'), *shrink],
            None,
        ),
    }


@pytest.fixture(scope='module')
def faults(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('faults')
    cases = _cases(tmp)
    results = run_tools([(tool, args) for tool, args, _ in cases.values()])
    return {
        name: (expected, res) for (name, (_, _, expected)), res in zip(cases.items(), results)
    }, tmp


FAULTS = [
    'cfg-options without =',
    'cfg-options word for a number',
    'cfg-options typo',
    'cfg-options value for a section',
    'cfg-options word for a bool',
    'launcher outside torchrun',
    'test launcher outside torchrun',
    'threads 0',
    'max-images 0',
    'max-images word',
    'opacity',
    'show-interval 0',
    'unknown preset',
    'heads without a layout',
    'work dir is a file',
    'missing pretrained',
    'test: not a checkpoint',
    'test: truncated',
    'test: other widths',
    'infer: other widths',
    'convert: not a checkpoint',
    'resume: unreadable file',
    'resume: weights only',
    'test: arguments swapped',
    'test: the config twice',
    'resume: nothing readable',
    'infer: not an image in the folder',
    'infer: corrupt image',
    'infer: output folder under a file',
    'infer: output name taken',
    'infer: output folder is the input folder',
    'test: --out the annotation folder',
    'test: --out under a file',
    'test: --show-dir under a file',
    'extrapolate: --out-dir under a file',
    'robustness: --out-dir under a file',
    'plot_heads: --out under a file',
]


@pytest.mark.parametrize('name', FAULTS)
def test_a_fault_ends_in_one_clear_error_line(faults, name):
    expected, res = faults[0][name]
    assert 'Traceback' not in res['stderr'], res['stderr'][-3000:]
    assert res['rc'] == 2, res
    lines = [ln for ln in res['stderr'].splitlines() if ln.startswith('error: ')]
    assert len(lines) == 1, res['stderr']
    assert expected in lines[0], lines[0]


def test_every_listed_fault_is_run(faults):
    assert sorted(n for n, (exp, _) in faults[0].items() if exp is not None) == sorted(FAULTS)


def test_refused_outputs_leave_the_inputs_and_the_ground_truth_as_they_were(faults):
    """The two refusals above are made before anything is written: the annotation maps
    and the PNG input keep their bytes (both were overwritten without a word), and a
    refused write leaves no temporary file."""
    tmp = faults[1]
    root = tmp / 'data' / 'ade' / 'ADEChallengeData2016'
    ann = sorted((root / 'annotations' / 'validation').iterdir())
    assert [p.name for p in ann] == ['ADE_val_00000001.png', 'ADE_val_00000002.png']
    fresh = make_ade(tmp / 'data_again', num_train=2, num_val=2)  # seeded: the same files
    for p in ann:
        again = osp.join(fresh, 'annotations', 'validation', p.name)
        assert np.array_equal(cv2.imread(str(p), 0), cv2.imread(again, 0)), p.name
    png_in = tmp / 'png_in'
    assert [p.name for p in png_in.iterdir()] == ['b.png']
    image = cv2.imread(str(root / 'images' / 'validation' / 'ADE_val_00000001.jpg'))
    assert np.array_equal(cv2.imread(str(png_in / 'b.png')), image[::-1])
    assert not list((tmp / 'blocked_out').glob('.*partial*'))


def test_images_that_share_a_stem_get_one_overlay_each(faults):
    (_, res), tmp = faults[0]['infer: two images, one stem'], faults[1]
    assert res['rc'] == 0, res['stderr'][-3000:]
    assert 'wrote 2 overlay(s)' in res['stdout']
    assert (
        '; 1 other file(s) in the folder skipped (not jpg/jpeg/png/bmp/tif/tiff/webp: '
        'notes.txt)' in res['stdout']
    )
    assert sorted(os.listdir(tmp / 'o3')) == ['a.jpg.png', 'a.png.png']


def _error_of(call, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        run_main(lambda argv: call(), None)
    err = capsys.readouterr().err
    assert 'Traceback' not in err
    lines = [ln for ln in err.splitlines() if ln.startswith('error: ')]
    assert exc.value.code == 2 and len(lines) == 1, err
    return lines[0]


def test_training_that_goes_nan_stops_naming_the_iteration_and_the_loss(tmp_path, capsys):
    root = make_ade(tmp_path / 'data', num_train=2, num_val=1)
    work = tmp_path / 'w'
    err = _error_of(
        lambda: train_model(
            ADE_CFG,
            work_dir=str(work),
            cfg_options=options(
                *roots(root),
                *SHRINK,
                'train_cfg.max_iters=5',
                'optim_wrapper.optimizer.lr=1e30',
                'param_scheduler=None',
                'default_hooks.checkpoint.interval=1',
            ),
        ),
        capsys,
    )
    assert "error: training stopped at iteration 2/5: loss 'decode.loss_ce' is nan" in err
    # the cause, found by the backbone in the forward (before the step made the weights NaN)
    assert "The backbone's features were already not finite" in err
    assert 'the weights reach |w| = 1' in err and 'lower the learning rate' in err
    # iter_1.pth holds the weights that gave the NaN features: it is not offered as usable
    assert (
        f'the last checkpoint, {work / "iter_1.pth"}, holds the weights of after iteration 1, '
        'which gave these non-finite features: no older checkpoint is kept, start again'
    ) in err
    assert sorted(p for p in os.listdir(work) if p.endswith('.pth')) == ['iter_1.pth']


def test_a_diverged_run_offers_the_newest_checkpoint_before_the_bad_weights(tmp_path):
    """The checkpoint saved one iteration before the loss went NaN holds the weights that
    made the features non-finite (the backbone found them so): the message offers the
    newest older one instead; a checkpoint further back, or a cause outside the backbone,
    is named as the last checkpoint."""
    import torch

    from lookhere_dense.engine.hooks import _checkpoints_note

    for n in (2, 4, 6):
        torch.save(dict(meta=dict(iter=n), state_dict={}), tmp_path / f'iter_{n}.pth')
    last = str(tmp_path / 'iter_6.pth')
    assert _checkpoints_note(last, 7, True) == (
        f'; the last checkpoint, {last}, holds the weights of after iteration 6, which gave '
        f'these non-finite features: resume from an older one (--resume {tmp_path / "iter_4.pth"}) '
        'or start again'
    )
    assert _checkpoints_note(last, 8, True) == f'; the last checkpoint is {last}'
    assert _checkpoints_note(last, 7, False) == f'; the last checkpoint is {last}'
    assert _checkpoints_note(None, 7, True) == ''
    # an epoch-based run's files, ranked by the iteration their meta records
    (tmp_path / 'iter_4.pth').unlink()
    torch.save(dict(meta=dict(iter=5, epoch=1), state_dict={}), tmp_path / 'epoch_1.pth')
    assert f'(--resume {tmp_path / "epoch_1.pth"})' in _checkpoints_note(last, 7, True)
    # only a cause in the weights makes the checkpoint suspect (not the inputs or the dtype)
    from lookhere_dense.lookhere.layers import weights_caused

    assert weights_caused('3 of 9 feature values are NaN ...: the weights reach |w| = 1e+30')
    assert weights_caused('...: parameters of the model hold NaN / infinite values (2: a, b)')
    assert not weights_caused('...: the input values reach |x| = 3e+06 (normalised images')
    assert not weights_caused('...: the activations overflow inside the backbone') and not (
        weights_caused(None)
    )


def test_an_image_that_cannot_be_decoded_mid_run_is_one_line(tmp_path, capsys):
    """A training image the data check did not decode (it decodes a sample; here the check
    is off) and mmcv cannot: one line naming the file and --resume (mmcv's 'failed to load
    image' assertion under a 65-line traceback before)."""
    root = make_ade(tmp_path / 'data', num_train=2, num_val=1)
    bad = osp.join(root, 'images', 'training', 'ADE_train_00000002.jpg')
    with open(bad, 'rb') as f:
        head = f.read()[:200]  # a JPEG header, then nothing
    with open(bad, 'wb') as f:
        f.write(head)
    err = _error_of(
        lambda: train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'w'),
            cfg_options=options(*roots(root), *SHRINK, 'train_cfg.max_iters=3'),
            check_data=False,
        ),
        capsys,
    )
    assert err.startswith(f'error: the image {bad!r} could not be decoded (corrupt, truncated')
    assert err.endswith('continues from its last checkpoint with --resume.')


def test_a_worker_failing_on_an_image_names_the_image_not_mmcvs_source_line():
    """A dataloader worker re-raises mmcv's assertion as text whose traceback quotes mmcv's
    source line (``f'failed to load image: {filename}'``) before the message: the file of
    the message is named (the source line's ``{filename}'`` was)."""
    from lookhere_dense.apis.cli import _library_data_failure

    text = (
        'Caught AssertionError in DataLoader worker process 0.\n'
        'Original Traceback (most recent call last):\n'
        '  File "/x/mmcv/transforms/loading.py", line 110, in transform\n'
        "    assert img is not None, f'failed to load image: {filename}'\n"
        'AssertionError: failed to load image: /data/a.jpg\n'
    )
    assert _library_data_failure(AssertionError(text)).startswith(
        "the image '/data/a.jpg' could not be decoded"
    )


def test_a_truncated_annotation_mid_run_is_one_line_and_check_all_data_names_it(tmp_path, capsys):
    """An annotation the data check did not decode (it decodes 64 files per split, spread
    over the 70 here) and Pillow cannot (truncated), read in a dataloader worker: a
    100-line traceback ending in ``OSError: image file is truncated`` and no file name
    before; now one line pointing to ``--check-all-data``, which decodes every file before
    training and names it."""
    from PIL import Image

    from lookhere_dense.data.checks import _spread

    root = make_ade(tmp_path / 'data', num_train=70, num_val=1)
    skipped = sorted(set(range(70)) - set(_spread(70, 64)))[0]  # not in the sample
    bad = osp.join(root, 'annotations', 'training', f'ADE_train_{skipped + 1:08d}.png')
    labels = np.asarray(Image.open(bad))
    noise = np.random.RandomState(0).randint(0, 9, labels.shape, np.uint8)
    Image.fromarray(noise).save(bad)  # noise: image data long enough to cut
    with open(bad, 'rb') as f:
        data = f.read()
    with open(bad, 'wb') as f:
        f.write(data[: len(data) // 2])  # a PNG cut in the middle of its image data
    opts = options(
        *roots(root),
        *SHRINK,
        f'train_cfg.max_iters={skipped // 2 + 1}',  # batch 2: the bad file's iteration
        'train_dataloader.num_workers=1',
        'train_dataloader.sampler.shuffle=False',
    )
    err = _error_of(
        lambda: train_model(ADE_CFG, work_dir=str(tmp_path / 'w'), cfg_options=opts), capsys
    )
    assert err.startswith(
        'error: a data file could not be decoded (OSError: image file is truncated'
    ), err
    assert 'Rerun with --check-all-data to decode every file first and name it' in err
    err = _error_of(
        lambda: train_model(
            ADE_CFG, work_dir=str(tmp_path / 'w2'), cfg_options=opts, check_data='all'
        ),
        capsys,
    )
    assert bad in err and 'annotation' in err, err


def test_ctrl_c_is_one_line_and_status_130(capsys):
    def interrupted(argv):
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as exc:
        run_main(interrupted)
    assert exc.value.code == 130
    err = capsys.readouterr().err
    assert 'Traceback' not in err and 'continues from its last checkpoint with --resume' in err


def test_a_second_ctrl_c_inside_mmengines_config_formatting_is_one_line(capsys):
    """A second Ctrl-C while a checkpoint is saved lands in mmengine's ``Config.pretty_text``
    (yapf's ``FormatCode``), whose bare ``except:`` raises ``SyntaxError: Failed to format
    the config file`` with the whole config: 650 lines and status 1 in a new-user trial.
    The Ctrl-C is raised where it landed there (a trace function on yapf's call)."""
    import sys

    from mmengine.config import Config

    def saving(argv):
        cfg = Config(dict(model=dict(type='EncoderDecoder')))

        def tracer(frame, event, arg):
            if event == 'call' and frame.f_code.co_name == 'FormatCode':
                sys.settrace(None)
                raise KeyboardInterrupt
            return None

        sys.settrace(tracer)
        try:
            return cfg.pretty_text
        finally:
            sys.settrace(None)

    with pytest.raises(SystemExit) as exc:
        run_main(saving)
    assert exc.value.code == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        'interrupted (Ctrl-C). A training run continues from its last checkpoint with --resume.'
    ]


def test_an_error_raised_while_stopping_after_ctrl_c_is_not_hidden(capsys):
    """An error raised while a Ctrl-C is handled was reported as the interrupt alone: the
    project's own errors (a checkpoint that could not be saved) are reported as
    themselves, with their exit status; another library's error adds its first line to
    the interrupt's."""
    from lookhere_dense.errors import CheckpointSaveError

    def save_fails(argv):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise CheckpointSaveError('could not save iter_3.pth: the disk is full')  # noqa: B904

    with pytest.raises(SystemExit) as exc:
        run_main(save_fails)
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == (
        'error: could not save iter_3.pth: the disk is full'
    )

    def cleanup_fails(argv):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError(28, 'No space left on device')  # noqa: B904

    with pytest.raises(SystemExit) as exc:
        run_main(cleanup_fails)
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip() == (
        'interrupted (Ctrl-C). A training run continues from its last checkpoint with '
        '--resume. While stopping: OSError: [Errno 28] No space left on device.'
    )


def test_the_legend_lists_the_classes_present(tmp_path):
    from lookhere_dense.visualization.legend import draw_legend, present_classes

    rgb = np.full((96, 128, 3), 200, np.uint8)
    labels = np.full((96, 128), 3, np.uint8)
    labels[:, 100:] = 1
    labels[0, 0] = 255
    palette = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0], [0, 255, 255]]
    assert present_classes(labels, len(palette)) == [(3, 96 * 100 - 1), (1, 96 * 28)]
    out = draw_legend(rgb, labels, palette, ['a', 'b', 'c', 'yellow', 'e'])
    assert out.shape == rgb.shape and np.array_equal(out[60:, 100:], rgb[60:, 100:])
    panel = out[:40, :60].reshape(-1, 3).tolist()
    assert [255, 255, 0] in panel and [0, 255, 0] in panel  # the two classes present
    assert [255, 0, 0] not in panel and [0, 0, 255] not in panel  # absent ones are not
    assert np.array_equal(draw_legend(rgb, np.full((96, 128), 255, np.uint8), palette), rgb)

    # on a 1024x2048 overlay the rows grow with the image (22 px rows were ~1 % of its
    # height, hard to read once the image is shown on a screen); up to ~700 px they stay
    def panel_height(h, w):
        big = draw_legend(np.full((h, w, 3), 200, np.uint8), np.full((h, w), 3, np.uint8), palette)
        return int((big != 200).any(axis=(1, 2)).nonzero()[0].max()) + 1

    assert panel_height(512, 512) == panel_height(600, 1024)
    assert panel_height(1024, 2048) >= 1.4 * panel_height(512, 512)


def test_checkpoint_tools_refuse_a_bad_split_a_missing_checkpoint_and_a_detection_config(
    tmp_path, repo_root
):
    from lookhere_dense.apis.cli import load_segmentation_job
    from lookhere_dense.errors import ConfigError

    ckpt = tmp_path / 'model.pth'
    ckpt.write_bytes(b'only its existence is checked here')
    seg = osp.join(repo_root, ADE_CFG)
    with pytest.raises(ConfigError, match="split must be 'test' or 'val', got 'train'"):
        load_segmentation_job(seg, str(ckpt), 'train', None, 'extrapolate.py')
    with pytest.raises(FileNotFoundError, match=r"checkpoint '.*nope\.pth' not found"):
        load_segmentation_job(seg, str(tmp_path / 'nope.pth'), 'val', None, 'extrapolate.py')
    det = osp.join(repo_root, 'configs/mask_rcnn_lookhere-b16_sfpn_lsj-1024-24k_cityscapes.py')
    with pytest.raises(
        ConfigError,
        match=r'robustness\.py works on segmentation \(mmseg\) '
        r"configs; this one has default_scope='mmdet'",
    ):
        load_segmentation_job(det, str(ckpt), 'val', None, 'robustness.py')
    assert load_segmentation_job(seg, str(ckpt), 'val', None, 'robustness.py').model


def test_convert_refuses_a_head_count_or_destination_no_model_could_use(reference_dir, tmp_path):
    """``--num-heads`` that does not split the width, or that the file's LookHere layout
    does not fit, wrote a file no model could load; a folder as the destination was
    torch's 'invalid file name' traceback."""
    src = str(reference_dir / 'official_tiny_halves_none.pth')
    res = run_tools(
        [
            ('convert_checkpoint', [src, str(tmp_path / 'a.pth'), '--num-heads', '5']),
            ('convert_checkpoint', [src, str(tmp_path / 'b.pth'), '--num-heads', '8']),
            ('convert_checkpoint', [src, str(tmp_path) + os.sep]),
            ('convert_checkpoint', [src, str(tmp_path / 'ok.pth'), '--num-heads', '12']),
        ]
    )
    for r in res[:3]:
        assert r['rc'] == 2 and 'Traceback' not in r['stderr'], r['stderr'][-2000:]
    assert 'is 96 channels wide, which does not split into 5 heads' in res[0]['stderr']
    assert "--num-heads 8 does not fit '" in res[1]['stderr'] and 'halves-none' in res[1]['stderr']
    assert 'is a folder: give the file to write' in res[2]['stderr']
    assert res[3]['rc'] == 0 and sorted(os.listdir(tmp_path)) == ['ok.pth']


def test_an_output_folder_behind_a_dangling_link_is_named_as_such(tmp_path):
    """``--out-dir results`` where ``results`` links to a missing target: said so (it was
    called a file), and nothing is left behind for a folder that can be made."""
    from lookhere_dense.checkpoint.atomic import check_output_folder
    from lookhere_dense.errors import ToolError

    (tmp_path / 'results').symlink_to(tmp_path / 'gone')
    with pytest.raises(ToolError) as err:
        check_output_folder(str(tmp_path / 'results' / 'x'), '--out-dir')
    assert 'is a symbolic link to a missing target' in str(err.value)
    check_output_folder(str(tmp_path / 'new' / 'deeper'), '--out-dir')
    assert sorted(os.listdir(tmp_path)) == ['results']


def test_the_export_names_the_callers_flag_for_its_folder(tmp_path):
    """The benchmark's deploy section exports into ``--deploy-dir``: a folder that cannot
    be written is named by that flag, not by the export tool's ``--out``."""
    from lookhere_dense.apis.export import export_model
    from lookhere_dense.errors import ToolError

    a_file = tmp_path / 'a_file'
    a_file.write_text('x')
    out = str(a_file / 'seg_32x32.onnx')
    with pytest.raises(ToolError, match=r"^--deploy-dir '.*a_file' cannot be written"):
        export_model(ADE_CFG, None, (32, 32), out, check=False, out_flag='--deploy-dir')
    with pytest.raises(ToolError, match=r"^--out '.*a_file' cannot be written"):
        export_model(ADE_CFG, None, (32, 32), out, check=False)
