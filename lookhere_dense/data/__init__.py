"""Data components of the OpenMMLab layer: the data checks (:mod:`.checks`: dataset layout,
label values, crop sizes, run before training; :mod:`.transforms`: the pipeline transform
that checks every loaded annotation; :mod:`.labels`: their label scans and messages) and
training on mixed crop sizes (:mod:`.mixed_crops`). The generated datasets are research
tooling: :mod:`research.datasets`. Import the submodules directly."""
