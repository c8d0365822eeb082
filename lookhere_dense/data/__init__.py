"""Tiny generated datasets in the real ADE20K / Cityscapes / COCO layouts, the procedural
tasks of the extrapolation study (:mod:`.relational`: zoom; :mod:`.fov_scenes`: field of
view; both written by :mod:`.folders`), the data checks, and training on mixed crop sizes
(:mod:`.mixed_crops`). Import the submodules directly."""
