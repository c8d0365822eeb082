"""Pictures: :mod:`.heads` draws each LookHere head's field of view, :mod:`.legend` the
class legend of a segmentation overlay. Import the submodules directly."""
