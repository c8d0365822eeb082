"""Mixed precision through the OpenMMLab tools on CPU (issue 31 item 4), with the real
mmengine Runner on the tiny ADE20K-layout set-up: ``train_model(amp=True)`` (``--amp``)
and the config form ``optim_wrapper=dict(type='AmpOptimWrapper', dtype='bfloat16')`` train
in bfloat16 autocast, ``evaluate_checkpoint(amp=True)`` (``tools/test.py --amp``) predicts
in bfloat16 and scores / writes float32, the ViTDet config's ``AmpOptimWrapper`` trains on
CPU, and float16 on CPU is refused with a message naming the setting. A Mask R-CNN under
``AmpTestLoop`` and ``MixedPrecisionOptimWrapper`` computes its features in bfloat16 and
its boxes, scores and losses in float32 (``docs/mixed_precision.md``, "Detectors")."""

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
    (log,) = glob.glob(str(tmp_path / 'w' / '*' / '*.log'))
    with open(log) as f:  # the run says it was bf16 (a new-user trial found no trace)
        assert (
            'testing in bfloat16 autocast on cpu (the predictions; scored in float32)' in f.read()
        )


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
    with pytest.raises(
        ConfigError,
        match=r'--amp-dtype=float16 on CPU: the tools run float16 inference on CUDA only; '
        'on CPU use bfloat16',  # inference: no loss scaling to name
    ):
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
    with pytest.raises(
        ConfigError,
        match=r'--amp works with optim_wrapper type OptimWrapper \(made mixed precision\) or '
        r'AmpOptimWrapper / MixedPrecisionOptimWrapper \(its dtype set\), the config has '
        r"'DeepSpeedOptimWrapper'",
    ):
        apply_amp(cfg, amp=True)
    with pytest.raises(ConfigError, match='--amp needs an optim_wrapper section'):
        apply_amp(Config(dict(model=dict())), amp=True)
    # an AMP config switched to float32 on the command line (optim_wrapper.type=OptimWrapper
    # cannot remove its dtype, which OptimWrapper does not take)
    cfg = Config(
        dict(optim_wrapper=dict(type='AmpOptimWrapper', dtype='bfloat16', optimizer=dict()))
    )
    cfg.merge_from_dict({'optim_wrapper.type': 'OptimWrapper'})
    assert apply_amp(cfg) == [
        "optim_wrapper.type=OptimWrapper trains in float32: dtype='bfloat16' dropped"
    ]
    assert 'dtype' not in cfg.optim_wrapper and cfg.optim_wrapper.type == 'OptimWrapper'


def test_a_misspelt_optim_wrapper_key_and_other_wrappers_are_named_before_the_run(tmp_path):
    """``optim_wrapper.dtpye=bfloat16`` was a ``TypeError`` traceback from the wrapper's
    ``__init__`` after the model was built (a new-user trial); ``ApexOptimWrapper`` without
    apex mmengine's bare ``AssertionError``; a CPU run's ``loss_scale`` was ignored without
    a word."""
    from mmengine.config import Config

    def build(*options):
        opts = dict(o.split('=', 1) for o in options)
        return build_train_config(
            ADE_CFG, work_dir=str(tmp_path), cfg_options=opts, check_data=False
        )

    with pytest.raises(
        ConfigError,
        match=r"^optim_wrapper\.dtpye: AmpOptimWrapper has no argument 'dtpye'; did you mean "
        r"'dtype'\? \(AmpOptimWrapper takes accumulative_counts, clip_grad, constructor, dtype, ",
    ):
        build('optim_wrapper.type=AmpOptimWrapper', 'optim_wrapper.dtpye=bfloat16')
    with pytest.raises(
        ConfigError,
        match=r"optim_wrapper\.dtpye: OptimWrapper has no argument 'dtpye' \(.*\); 'dtype' is a "
        r'mixed-precision setting: optim_wrapper\.type=AmpOptimWrapper \(or tools/train\.py '
        r'--amp\)$',
    ):
        build('optim_wrapper.dtpye=bfloat16')
    cfg, _ = build('optim_wrapper.type=AmpOptimWrapper', 'optim_wrapper.accumulative_counts=2')
    assert cfg.optim_wrapper.type == 'MixedPrecisionOptimWrapper'
    # a constructor of its own reads keys of its own (a review: a multi-optimizer section
    # was refused): left alone, as a section without optimizer
    from lookhere_dense.config_checks import check_optim_wrapper_keys

    check_optim_wrapper_keys(
        Config(
            dict(
                optim_wrapper=dict(
                    constructor='MultiOptimWrapperConstructor',
                    generator=dict(optimizer=dict(type='SGD')),
                    discriminator=dict(optimizer=dict(type='SGD')),
                )
            )
        )
    )
    check_optim_wrapper_keys(
        Config(dict(optim_wrapper=dict(optimizer=dict(type='SGD'), constructor='Mine', extra=1)))
    )
    with pytest.raises(ConfigError, match=r'optim_wrapper\.dtpye: OptimWrapper has no'):
        check_optim_wrapper_keys(  # our layer-decay constructor is a default one
            Config(
                dict(
                    optim_wrapper=dict(
                        optimizer=dict(type='SGD'),
                        constructor='LookHereLayerDecayOptimizerConstructor',
                        dtpye='bfloat16',
                    )
                )
            )
        )
    # the optimizer's own keys (a new user's learning_rate: torch's TypeError after the
    # model was built)
    with pytest.raises(
        ConfigError,
        match=r'^optim_wrapper\.optimizer\.learning_rate: AdamW has no argument '
        r"'learning_rate'; did you mean 'lr'\? \(AdamW takes amsgrad, betas, ",
    ):
        build('optim_wrapper.optimizer.learning_rate=1e-4')
    with pytest.raises(ConfigError, match=r"optimizer\.amsgrd: .* did you mean 'amsgrad'\?"):
        build('optim_wrapper.optimizer.amsgrd=True')
    # mmengine drops _scope_ before it builds (a review: refused as an argument)
    cfg, _ = build('optim_wrapper.optimizer._scope_=mmengine')
    assert cfg.optim_wrapper.optimizer._scope_ == 'mmengine'
    cfg = Config(dict(optim_wrapper=dict(type='ApexOptimWrapper', optimizer=dict())))
    with pytest.raises(ConfigError, match=r'needs NVIDIA apex, which is not installed: use '):
        apply_amp(cfg)
    cfg = Config(
        dict(optim_wrapper=dict(type='AmpOptimWrapper', loss_scale='dynamic', optimizer=dict()))
    )
    assert apply_amp(cfg)[0] == (
        "optim_wrapper.loss_scale='dynamic' is not used on CPU: bfloat16 has float32's "
        'exponent range and trains without loss scaling'
    )


def test_a_configs_amp_optim_wrapper_gets_float32_detection_heads_on_a_gpu_too(monkeypatch):
    """A config's ``AmpOptimWrapper`` (the ViTDet / Mask R-CNN configs, float16) becomes
    ``MixedPrecisionOptimWrapper`` where mmengine's wrapper runs as well (a GPU: simulated),
    so a detector's heads, boxes and losses stay float32 there too; dtype kept, one note."""
    from mmengine.config import Config

    from lookhere_dense.engine import amp

    monkeypatch.setattr(amp, 'accelerator_available', lambda: True)
    wrapper = dict(type='AmpOptimWrapper', dtype='float16', optimizer=dict(type='SGD'))
    cfg = Config(dict(optim_wrapper=wrapper))
    notes = apply_amp(cfg)
    assert cfg.optim_wrapper.type == 'MixedPrecisionOptimWrapper'
    assert cfg.optim_wrapper.dtype == 'float16'
    assert notes == [
        'optim_wrapper: AmpOptimWrapper -> MixedPrecisionOptimWrapper '
        "(mmengine's, with a detector's heads, boxes and losses in float32)"
    ]


def test_inference_context_and_float32_outputs(tmp_path):
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
    # the reports (extrapolate / robustness) record it: a bf16 report replaced the
    # float32 one in the same folder with no trace of its precision
    from research.reporting import checkpoint_report, precision_label

    assert precision_label('cpu') == 'float32'
    with amp_context(Namespace(amp=True, amp_dtype=None), 'cpu'):
        assert precision_label('cpu') == 'bfloat16 autocast'
        _, report = checkpoint_report('a.py', 'b.pth', 'val', 'cpu', '', str(tmp_path), 'x')
    assert report['precision'] == 'bfloat16 autocast'
    # and the CPU's capability (bfloat16 is emulated, slow, on AVX2)
    assert report['cpu_capability'] == torch.backends.cpu.get_cpu_capability()
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


# ----------------------------------------------------------------------------------------
# Detectors: backbone + neck in bfloat16, the heads (boxes, scores, losses) in float32
# ----------------------------------------------------------------------------------------
DET_H, DET_W = 512, 1024  # coordinates up to 1024: bfloat16 steps of 2 and 4 px there


@pytest.fixture(scope='module')
def det_cfg(tmp_path_factory):
    """The COCO Mask R-CNN config at toy width (``test_det_mask_rcnn.shrink``), its frames
    kept at their size (no fixed-size pad), up to 100 detections per image."""
    from mmengine.config import Config
    from test_det_mask_rcnn import COCO_CFG, shrink

    cfg = shrink(Config.fromfile(str(COCO_CFG)), tmp_path_factory.mktemp('det'), 3, 14)
    cfg.model.data_preprocessor.batch_augments = None
    cfg.model.test_cfg.rcnn.max_per_img = 100
    return cfg


def _tiny_detector(cfg):
    from mmdet.registry import MODELS

    torch.manual_seed(0)
    return MODELS.build(cfg.model)


def _det_batch(train: bool = False) -> dict:
    """One noise frame of ``DET_H x DET_W`` (with three boxes and their masks to train on)."""
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    shape = (DET_H, DET_W)
    image = torch.rand(3, *shape, generator=torch.Generator().manual_seed(0)) * 255
    sample = DetDataSample(metainfo=dict(img_shape=shape, ori_shape=shape, scale_factor=(1, 1)))
    if train:
        boxes = torch.tensor([[300.0, 100, 700, 400], [610, 250, 1000, 500], [40, 40, 200, 300]])
        masks = torch.zeros(3, *shape, dtype=torch.uint8)
        for mask, (x1, y1, x2, y2) in zip(masks, boxes.int().tolist()):
            mask[y1:y2, x1:x2] = 1
        sample.gt_instances = InstanceData(
            bboxes=boxes, labels=torch.tensor([0, 1, 2]), masks=BitmapMasks(masks.numpy(), *shape)
        )
    return dict(inputs=[image], data_samples=[sample])


def _spy(monkeypatch, obj, name: str, record) -> None:
    """``obj.name`` calls ``record`` with its arguments first."""
    method = getattr(obj, name)

    def spy(*args, **kwargs):
        record(*args, **kwargs)
        return method(*args, **kwargs)

    monkeypatch.setattr(obj, name, spy)


def _watch_features(monkeypatch, model, seen: dict) -> list:
    """Records the dtype the backbone's first linear layer computes in (``seen['backbone']``)
    and, in the returned list, what each ``extract_feat`` call returned with the CPU RNG
    state after it (what the heads start from)."""
    linear = next(m for m in model.backbone.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(
        lambda m, a, out: seen.setdefault('backbone', set()).add(out.dtype)
    )
    calls = []
    features = model.extract_feat

    def extract_feat(inputs):
        out = features(inputs)
        calls.append((out, torch.get_rng_state()))
        return out

    monkeypatch.setattr(model, 'extract_feat', extract_feat)
    return calls


def _same_features(monkeypatch, model, call) -> None:
    """``model.extract_feat`` returns ``call``'s features as float32 (and puts the RNG
    state back as it was after them: the same proposals and RoIs are sampled)."""
    features = outputs_to_float32(tuple(call[0]))

    def extract_feat(inputs):
        torch.set_rng_state(call[1])
        return features

    monkeypatch.setattr(model, 'extract_feat', extract_feat)


def _dtypes(*tensors) -> set:
    return {t.dtype for t in tensors}


def test_detector_amp_test_keeps_boxes_and_scores_float32(det_cfg, monkeypatch):
    """``tools/test.py --amp`` (:class:`AmpTestLoop`) on a Mask R-CNN: the backbone computes
    in bfloat16, the RPN proposals, RoIs, box deltas and scores are float32, and the
    detections are exactly what float32 heads make of the backbone's features: not on
    bfloat16's grid (before: every coordinate above 256 px was a bfloat16 number)."""
    from types import SimpleNamespace

    from lookhere_dense.engine.amp import AmpTestLoop

    model = _tiny_detector(det_cfg).eval()
    seen: dict = {}
    calls = _watch_features(monkeypatch, model, seen)
    spy_feat = model.extract_feat
    _spy(
        monkeypatch,
        model.roi_head,
        'predict',
        lambda x, proposals, *a, **k: seen.update(
            features=_dtypes(*x), proposals=_dtypes(*(p.bboxes for p in proposals))
        ),
    )
    _spy(
        monkeypatch,
        model.roi_head.bbox_head,
        'predict_by_feat',
        lambda rois, cls_scores, bbox_preds, *a, **k: seen.update(
            rois=_dtypes(*rois), scores=_dtypes(*cls_scores), deltas=_dtypes(*bbox_preds)
        ),
    )

    class Collect:  # the evaluator: keeps what it is handed
        dataset_meta = None

        def __init__(self):
            self.samples = []

        def process(self, data_samples, data_batch=None):
            self.samples.extend(data_samples)

    runner = SimpleNamespace(model=model, call_hook=lambda *a, **k: None, visualizer=None)
    loop = AmpTestLoop(runner, SimpleNamespace(dataset=SimpleNamespace()), Collect())
    loop.run_iter(0, _det_batch())
    [amp] = loop.evaluator.samples
    float32 = {torch.float32}
    assert seen.pop('backbone') == {torch.bfloat16}  # still mixed precision
    assert seen == dict(
        features=float32, proposals=float32, rois=float32, scores=float32, deltas=float32
    )
    assert model.__dict__['extract_feat'] is spy_feat  # the loop's replacement is gone
    pred = amp.pred_instances
    assert pred.bboxes.dtype == torch.float32 and len(pred) >= 20
    coords = pred.bboxes.flatten()
    inner = coords[(coords > 256) & (coords < DET_W - 1)]  # clipped ones lie on any grid
    on_grid = (inner.bfloat16().float() == inner).float().mean().item()
    assert inner.numel() >= 20 and on_grid < 0.1, (inner.numel(), on_grid)

    [call] = calls
    _same_features(monkeypatch, model, call)
    with torch.no_grad():
        [ref] = model.test_step(_det_batch())
    ref = ref.pred_instances
    torch.testing.assert_close(pred.bboxes, ref.bboxes, rtol=0, atol=1e-3)
    torch.testing.assert_close(pred.scores, ref.scores, rtol=0, atol=1e-6)
    assert torch.equal(pred.labels, ref.labels)
    assert pred.masks.shape == ref.masks.shape and (pred.masks != ref.masks).float().mean() < 1e-3


def test_detector_amp_training_losses_from_float32_boxes(det_cfg, monkeypatch):
    """A Mask R-CNN training step through :class:`MixedPrecisionOptimWrapper` (``--amp``,
    or the config's ``AmpOptimWrapper`` on CPU): the backbone computes in bfloat16; the RPN
    and RoI losses are computed from float32 scores, deltas, proposals and RoIs, and equal
    the float32 heads' losses on the same features (the same samples drawn)."""
    model = _tiny_detector(det_cfg).train()
    seen: dict = {}
    calls = _watch_features(monkeypatch, model, seen)
    _spy(
        monkeypatch,
        model.rpn_head,
        'loss_by_feat',
        lambda cls_scores, bbox_preds, *a, **k: seen.update(
            rpn_scores=_dtypes(*cls_scores), rpn_deltas=_dtypes(*bbox_preds)
        ),
    )
    _spy(
        monkeypatch,
        model.roi_head,
        'loss',
        lambda x, proposals, *a, **k: seen.update(
            proposals=_dtypes(*(p.bboxes for p in proposals))
        ),
    )
    _spy(
        monkeypatch,
        model.roi_head.bbox_head,
        'loss_and_target',
        lambda cls_score, bbox_pred, rois, *a, **k: seen.update(
            scores=_dtypes(cls_score), deltas=_dtypes(bbox_pred), rois=_dtypes(rois)
        ),
    )
    _spy(
        monkeypatch,
        model.roi_head.mask_head,
        'loss_and_target',
        lambda mask_preds, *a, **k: seen.update(masks=_dtypes(mask_preds)),
    )
    wrapper = MixedPrecisionOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.0))
    log_vars = model.train_step(_det_batch(train=True), wrapper)
    float32 = {torch.float32}
    assert seen.pop('backbone') == {torch.bfloat16}
    assert seen == dict.fromkeys(
        ('rpn_scores', 'rpn_deltas', 'proposals', 'scores', 'deltas', 'rois', 'masks'), float32
    )

    [call] = calls
    _same_features(monkeypatch, model, call)
    data = model.data_preprocessor(_det_batch(train=True), True)
    with torch.no_grad():
        _, ref = model.parse_losses(model.loss(data['inputs'], data['data_samples']))
    for key in ('loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_bbox', 'loss_mask'):
        assert log_vars[key].item() == pytest.approx(ref[key].item(), rel=1e-5, abs=1e-7), key


def test_inference_autocast_with_a_detector(det_cfg):
    """``inference_autocast(..., model=)``: for a detector, autocast is off in the region but
    in ``extract_feat`` (which returns float32 features), replaced for the region only;
    for any other model, plain autocast."""
    from lookhere_dense.engine.amp import inference_autocast

    model = _tiny_detector(det_cfg).eval()
    seen: dict = {}
    linear = next(m for m in model.backbone.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(
        lambda m, a, out: seen.setdefault('backbone', set()).add(out.dtype)
    )
    with torch.no_grad(), inference_autocast('bfloat16', 'cpu', model=model):
        assert not torch.is_autocast_enabled('cpu')
        feats = model.extract_feat(torch.rand(1, 3, 64, 128))
    assert 'extract_feat' not in model.__dict__
    assert seen == {'backbone': {torch.bfloat16}}
    assert {f.dtype for f in feats} == {torch.float32}
    with inference_autocast('bfloat16', 'cpu', model=torch.nn.Linear(4, 4)):
        assert torch.get_autocast_dtype('cpu') == torch.bfloat16
        assert torch.is_autocast_enabled('cpu')


def test_bf16_on_a_cpu_without_bf16_products_is_said_once(monkeypatch):
    """On a CPU without AVX512-BF16 / AMX PyTorch emulates bfloat16 products: --amp ran
    several times slower than float32 without a word (a new user's trial on an AVX2 EPYC).
    The CPU routes (inference, the optimizer wrapper) ask for the warning, which is
    logged once per process, and only there."""
    import mmengine.logging

    from lookhere_dense.engine import amp

    logged = []
    monkeypatch.setattr(mmengine.logging, 'print_log', lambda msg, **kw: logged.append(msg))
    monkeypatch.setattr(amp, 'accelerator_available', lambda: False)  # the CPU route
    for has in (False, True):
        monkeypatch.setattr(amp, 'cpu_bf16_products', lambda has=has: has)
        amp.note_slow_cpu_bf16.cache_clear()
        logged.clear()
        for _ in range(2):
            with amp.inference_autocast('bfloat16', 'cpu'):
                pass
            MixedPrecisionOptimWrapper(optimizer=torch.optim.SGD([torch.zeros(1)], lr=0.1))
        calls = amp.note_slow_cpu_bf16.cache_info()
        assert (calls.misses, calls.hits) == (1, 3)  # asked by each, computed once
        said = [m for m in logged if m.startswith('bfloat16 on a CPU without AVX512-BF16')]
        assert len(said) == int(not has), logged
    amp.note_slow_cpu_bf16.cache_clear()


def test_the_cpus_bf16_products_are_read_from_its_flags():
    from lookhere_dense.engine import amp

    try:
        with open('/proc/cpuinfo') as f:
            flags = next((line.split() for line in f if line.startswith('flags')), None)
    except OSError:
        flags = None
    if flags is None:
        assert amp.cpu_bf16_products() is None  # not Linux on x86: no flags to read
        return
    assert amp.cpu_bf16_products() == ('avx512_bf16' in flags or 'amx_bf16' in flags)
