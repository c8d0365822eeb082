"""Generated datasets: tiny ADE20K / Cityscapes / COCO-layout sets (:mod:`.synthetic_seg`,
:mod:`.synthetic_coco`) and the procedural tasks of the extrapolation study
(:mod:`.relational`: zoom; :mod:`.fov_scenes`: field of view; both written by
:mod:`.folders`). Import the submodules directly."""
