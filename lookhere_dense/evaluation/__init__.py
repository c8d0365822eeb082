"""Evaluation helpers shared by the tools and the study: the peak-memory meter
(:mod:`.memory`, torch only), test-time resize rewriting, ladders and metrics.

Import the submodules directly; this package imports nothing on its own, so the
torch-only ones stay usable without OpenMMLab.
"""
