"""Datasets written in the real mmseg / mmdet folder layouts (no OpenMMLab imports)."""
