"""Tiny generated datasets in the real ADE20K / Cityscapes / COCO layouts (and the
procedural task of the extrapolation study). Import the submodules directly."""
