"""Mixed precision through the OpenMMLab tools on CPU (issue 31 item 4), with the real
mmengine Runner on the tiny ADE20K-layout set-up: ``train_model(amp=True)`` (``--amp``)
and the config form ``optim_wrapper=dict(type='AmpOptimWrapper', dtype='bfloat16')`` train
in bfloat16 autocast, ``evaluate_checkpoint(amp=True)`` (``tools/test.py --amp``) predicts
in bfloat16 and scores / writes float32, the ViTDet config's ``AmpOptimWrapper`` trains on
CPU, and float16 on CPU is refused with a message naming the setting."""

from __future__ import annotations

import glob
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from tiny_seg import ADE_CFG, SHRINK, make_ade
from tiny_seg import options as _opts
from tiny_seg import roots as _roots

from lookhere_dense.apis.cli import amp_context
from lookhere_dense.apis.test import evaluate_checkpoint
from lookhere_dense.apis.train import apply_amp, build_train_config, train_model
from lookhere_dense.engine.amp import MixedPrecisionOptimWrapper, outputs_to_float32
from lookhere_dense.errors import ConfigError

pytestmark = pytest.mark.usefixtures('one_torch_thread')

ITERS = 2


@HOOKS.register_module(force=True)
class _PrecisionProbeHook(Hook):
    """Records the dtype the backbone's first linear layer computes in, in each training,
    validation and test forward (autocast: bfloat16; its LayerNorms stay float32 as autocast wants), and
    the dtype of the predicted logits the evaluator receives."""

    seen: dict = {}

    def _watch(self, runner, stage: str) -> None:
        model = getattr(runner.model, 'module', runner.model)

        def record(module, args, out):
            key = 'train' if module.training else stage.replace('train', 'val')
            _PrecisionProbeHook.seen.setdefault(key, set()).add(out.dtype)

        linear = next(m for m in model.backbone.modules() if isinstance(m, torch.nn.Linear))
        self._handle = linear.register_forward_hook(record)

    def before_train(self, runner) -> None:
        self._watch(runner, 'train')

    def after_train(self, runner) -> None:
        self._handle.remove()

    def before_test(self, runner) -> None:
        self._watch(runner, 'test')

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        _PrecisionProbeHook.seen.setdefault('logits', set()).add(outputs[0].seg_logits.data.dtype)

    def after_test(self, runner) -> None:
        self._handle.remove()


PROBE = [dict(type='_PrecisionProbeHook')]


def _options(root, *pairs: str, **extra) -> dict:
    opts = _opts(*_roots(root), *SHRINK, f'train_cfg.max_iters={ITERS}', *pairs)
    opts.update(extra)
    return opts


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    return make_ade(tmp_path_factory.mktemp('amp_data'), num_train=2, num_val=1)


@pytest.fixture(scope='module')
def amp_run(data, tmp_path_factory):
    """``--amp`` (bfloat16) on the tiny Segmenter: 2 iterations, no validation."""
    _PrecisionProbeHook.seen.clear()
    work = tmp_path_factory.mktemp('amp_train')
    runner = train_model(
        ADE_CFG,
        work_dir=str(work),
        amp=True,
        allow_random_init=True,
        cfg_options=_options(data, 'train_cfg.val_interval=1000', custom_hooks=PROBE),
    )
    return runner, dict(_PrecisionProbeHook.seen), str(work / f'iter_{ITERS}.pth')


def test_amp_flag_trains_in_bf16_on_cpu(amp_run):
    runner, seen, ckpt = amp_run
    wrapper = runner.optim_wrapper
    assert type(wrapper) is MixedPrecisionOptimWrapper
    assert wrapper.cast_dtype == torch.bfloat16 and not wrapper.loss_scaler.is_enabled()
    assert seen['train'] == {torch.bfloat16}  # the forward ran in autocast
    assert seen['val'] == {torch.float32}  # validation as mmengine's ValLoop: float32
    assert runner.iter == ITERS and osp.isfile(ckpt)
    with open(osp.join(runner.log_dir, f'{runner.timestamp}.log')) as f:
        backends = [line for line in f if 'LookHere attention at' in line]
    assert len(backends) == 1 and 'bfloat16, cpu, training' in backends[0], backends
    assert runner.cfg.train_dataloader.batch_size == 2  # SHRINK's, not the line's old 1
    assert 'tokens, batch 2, bfloat16' in backends[0], backends
    params = [p for p in runner.model.parameters()]
    assert all(p.dtype == torch.float32 for p in params)  # master weights stay float32
    assert all(torch.isfinite(p).all() for p in params)


def test_test_amp_predicts_bf16_and_scores_float32(amp_run, data, tmp_path):
    _, _, ckpt = amp_run
    _PrecisionProbeHook.seen.clear()
    out = tmp_path / 'preds'
    metrics = evaluate_checkpoint(
        ADE_CFG,
        ckpt,
        out=str(out),
        amp=True,
        work_dir=str(tmp_path / 'w'),
        cfg_options=_options(data, custom_hooks=PROBE),
    )
    assert 0.0 <= metrics['mIoU'] <= 100.0
    assert _PrecisionProbeHook.seen['test'] == {torch.bfloat16}
    assert _PrecisionProbeHook.seen['logits'] == {torch.float32}
    assert len(glob.glob(str(out / '*.png'))) == 1


def test_config_form_amp_optim_wrapper_trains_on_cpu(data, tmp_path):
    """``optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16')`` in a config (and
    the same as ``--cfg-options``): mmengine's wrapper asserts a GPU; the tools train with
    ours instead, in bfloat16."""
    config = tmp_path / 'amp_bf16.py'
    config.write_text(
        f"_base_ = [{ADE_CFG!r}]\noptim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16')\n"
    )
    _PrecisionProbeHook.seen.clear()
    runner = train_model(
        str(config),
        work_dir=str(tmp_path / 'w'),
        allow_random_init=True,
        cfg_options=_options(data, 'train_cfg.val_interval=1000', custom_hooks=PROBE),
    )
    assert type(runner.optim_wrapper) is MixedPrecisionOptimWrapper
    assert runner.optim_wrapper.clip_grad_kwargs  # the inherited settings are kept
    assert _PrecisionProbeHook.seen['train'] == {torch.bfloat16}
    cfg, notes = build_train_config(
        ADE_CFG,
        work_dir=str(tmp_path / 'c'),
        check_data=False,
        cfg_options=_opts('optim_wrapper.type=AmpOptimWrapper', 'optim_wrapper.dtype=bfloat16'),
    )
    assert cfg.optim_wrapper.type == 'MixedPrecisionOptimWrapper'
    assert cfg.optim_wrapper.dtype == 'bfloat16'
    assert any('AmpOptimWrapper needs a GPU' in n for n in notes)


def test_float16_on_cpu_is_refused_with_the_setting_named(amp_run, data, tmp_path):
    with pytest.raises(ConfigError, match=r'--amp-dtype=float16 on CPU.*use bfloat16'):
        train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'a'),
            amp=True,
            amp_dtype='float16',
            cfg_options=_options(data),
        )
    with pytest.raises(ConfigError, match=r'optim_wrapper.dtype=float16 on CPU'):
        train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'b'),
            cfg_options=_options(
                data, 'optim_wrapper.type=AmpOptimWrapper', 'optim_wrapper.dtype=float16'
            ),
        )
    with pytest.raises(ConfigError, match=r'--amp-dtype=float16 on CPU'):
        evaluate_checkpoint(ADE_CFG, amp_run[2], amp=True, amp_dtype='float16')
    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ConfigError, match=r'optim_wrapper.dtype=float16'):
        MixedPrecisionOptimWrapper(optimizer=torch.optim.SGD(params, lr=0.1), dtype='float16')
    with pytest.raises(ConfigError, match=r"'float8'"):
        MixedPrecisionOptimWrapper(optimizer=torch.optim.SGD(params, lr=0.1), dtype='float8')


def test_amp_refuses_another_wrapper_and_leaves_fp32_configs_alone():
    from mmengine.config import Config

    cfg = Config(dict(optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD'))))
    assert apply_amp(cfg) == [] and cfg.optim_wrapper.type == 'OptimWrapper'
    cfg.optim_wrapper.type = 'DeepSpeedOptimWrapper'
    with pytest.raises(ConfigError, match=r"--amp works with .* 'DeepSpeedOptimWrapper'"):
        apply_amp(cfg, amp=True)
    with pytest.raises(ConfigError, match='--amp needs an optim_wrapper section'):
        apply_amp(Config(dict(model=dict())), amp=True)


def test_inference_context_and_float32_outputs():
    """``--amp`` of infer / extrapolate / robustness: bfloat16 autocast on the device;
    predictions made float32 before they are written, label maps untouched."""
    from argparse import Namespace

    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample

    with amp_context(Namespace(amp=True, amp_dtype=None), 'cpu'):
        assert torch.is_autocast_enabled('cpu')
        assert torch.get_autocast_dtype('cpu') == torch.bfloat16
        y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16
    with amp_context(Namespace(amp=False, amp_dtype=None), 'cpu'):
        assert not torch.is_autocast_enabled('cpu')
    sample = SegDataSample()
    sample.seg_logits = PixelData(data=torch.randn(3, 4, 4, dtype=torch.bfloat16))
    sample.pred_sem_seg = PixelData(data=torch.zeros(1, 4, 4, dtype=torch.int64))
    [out] = outputs_to_float32([sample])
    assert out.seg_logits.data.dtype == torch.float32
    assert out.pred_sem_seg.data.dtype == torch.int64


def test_vitdet_config_amp_optim_wrapper_trains_on_cpu(tmp_path):
    """The ViTDet Mask R-CNN config names mmengine's ``AmpOptimWrapper`` (float16 on a
    GPU): through :func:`apply_amp` (what ``tools/train.py`` does) it trains on this CPU
    in bfloat16 autocast, with the real Runner, shrunk as ``test_det_mask_rcnn``."""
    from mmengine.config import Config
    from mmengine.runner import Runner
    from test_det_mask_rcnn import COCO_CFG, pipeline_step, point_data, shrink

    from research.datasets.synthetic_coco import SHAPE_CLASSES, make_coco_instances

    anns = make_coco_instances(
        tmp_path, splits={'train2017': 2, 'val2017': 1}, image_size=(96, 96), seed=0
    )
    cfg = Config.fromfile(str(COCO_CFG))
    wrapper = cfg.optim_wrapper.type
    assert wrapper == 'AmpOptimWrapper'
    cfg = shrink(cfg, tmp_path / 'work', len(SHAPE_CLASSES), window_size=3)
    cfg.optim_wrapper.type = wrapper  # shrink() makes it OptimWrapper
    size = (64, 64)
    train = cfg.train_dataloader.dataset.pipeline
    pipeline_step(train, 'RandomResize').scale = size
    pipeline_step(train, 'RandomCrop').crop_size = size
    cfg.model.data_preprocessor.batch_augments[0].size = size
    cfg.train_dataloader.batch_size = 1
    point_data(cfg, tmp_path, SHAPE_CLASSES, anns['train2017'], anns['val2017'])
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=ITERS, val_interval=1000)
    cfg.param_scheduler = []
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    notes = apply_amp(cfg)
    assert cfg.optim_wrapper.type == 'MixedPrecisionOptimWrapper' and notes
    cfg.custom_hooks = PROBE
    _PrecisionProbeHook.seen.clear()
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.iter == ITERS
    assert runner.optim_wrapper.cast_dtype == torch.bfloat16
    assert _PrecisionProbeHook.seen['train'] == {torch.bfloat16}
    loss = runner.message_hub.get_scalar('train/loss').current()
    assert loss > 0 and torch.isfinite(torch.tensor(loss))
