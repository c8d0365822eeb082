"""Pictures of the library: :mod:`.legend`, the class legend of a segmentation overlay
(``tools/infer.py``). Report pictures (head fields of view, study plots) are research
tooling: :mod:`research`. Import the submodules directly."""
