"""Pictures: :mod:`.heads` draws each LookHere head's field of view. Import the
submodules directly."""
