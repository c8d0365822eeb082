"""What a tool run prints on the terminal and what only its log file gets
(:mod:`lookhere_dense.engine.terminal`): here, what a metric ``print``s while it evaluates
(pycocotools' tables of every COCO evaluation)."""

from __future__ import annotations

from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.logging import MMLogger

from lookhere_dense.engine.terminal import attach_terminal_filter, evaluate_into_log


class _PrintingMetric(BaseMetric):
    """Prints like pycocotools' COCOeval.summarize, returns one number."""

    def process(self, data_batch, data_samples) -> None:
        self.results.append(1.0)

    def compute_metrics(self, results) -> dict:
        print('Loading and preparing results...')
        print(' Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all ] = 0.500', end='')
        print('\nDONE (t=0.00s)')
        return dict(ap=0.5)


def test_what_a_metric_prints_goes_to_the_log_file_only(tmp_path, capsys):
    log_file = tmp_path / 'run.log'
    logger = MMLogger.get_instance('test_terminal_eval', log_file=str(log_file))
    attach_terminal_filter(logger)  # as the tools' Runner has it
    try:
        evaluator = evaluate_into_log(Evaluator(_PrintingMetric()), logger)
        evaluator.process(data_samples=[{}], data_batch=None)
        metrics = evaluator.evaluate(1)
        for handler in logger.handlers:
            handler.flush()
    finally:
        MMLogger._instance_dict.pop('test_terminal_eval', None)
    assert metrics == {'ap': 0.5}
    out = capsys.readouterr()
    assert 'Average Precision' not in out.out + out.err
    log = log_file.read_text()
    for line in (
        'Loading and preparing results...',
        'Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all ] = 0.500',
        'DONE (t=0.00s)',
    ):
        assert line in log


def test_the_tool_runner_builds_its_evaluators_so(tmp_path):
    from tiny_seg import ADE_CFG, SHRINK, make_ade, options, roots

    from lookhere_dense.apis.train import build_runner, build_train_config

    root = make_ade(tmp_path / 'data', num_train=1, num_val=1)
    cfg, _ = build_train_config(
        ADE_CFG, work_dir=str(tmp_path / 'w'), cfg_options=options(*roots(root), *SHRINK)
    )
    quiet = build_runner(cfg)
    built = quiet.build_evaluator(dict(type='IoUMetric'))
    assert built.evaluate.__name__ == 'evaluate_logged'
    verbose = build_runner(cfg, quiet=False)
    assert verbose.build_evaluator(dict(type='IoUMetric')).evaluate.__name__ == 'evaluate'
