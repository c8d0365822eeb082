"""What the data checks say about label maps: the values a map holds, the ones the model
cannot take, and the messages (numpy alone; used by :mod:`.transforms` and :mod:`.checks`).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import UnreadableFileError

__all__ = [
    'label_values',
    'bad_label_values',
    'label_message',
    'size_message',
    'channels_message',
    'all_ignored_message',
    'unreadable_file',
    'wide_labels_message',
    'reduce_zero_label_verdict',
]


def label_values(seg: np.ndarray) -> np.ndarray:
    """The distinct values of a label map, sorted."""
    seg = np.asarray(seg)
    if seg.dtype == np.uint8:
        return np.flatnonzero(np.bincount(seg.ravel(), minlength=256))
    return np.unique(seg)


def bad_label_values(seg: np.ndarray, num_classes: int, ignore_index: int = 255) -> List[int]:
    """Values of ``seg`` that are neither a class id (``0..num_classes-1``) nor
    ``ignore_index``."""
    values = label_values(seg)
    return [int(v) for v in values if not (0 <= v < num_classes or v == ignore_index)]


def label_message(
    path: str,
    bad: Sequence[int],
    num_classes: int,
    ignore_index: int,
    reduce_zero_label: Optional[bool],
    ignore_key: str = '',
) -> str:
    """The message for an annotation holding label values ``bad``, which are neither a
    class id (``0..num_classes-1``) nor ``ignore_index``; ``ignore_key``: where the
    ignore value comes from (``'model.decode_head.ignore_index'``), named after it.
    Default: ''."""
    shown = list(bad[:10]) + (['...'] if len(bad) > 10 else [])
    source = f', {ignore_key}' if ignore_key else ''
    msg = (
        f'annotation {path!r} has label values {shown} outside the classes 0..'
        f'{num_classes - 1} (ignore index {ignore_index}{source})'
    )
    if reduce_zero_label:
        msg += (
            ' after reduce_zero_label (file value k becomes class k-1, 0 becomes '
            f'ignored): the file holds values up to {max(bad) + 1}, the model has '
            f'{num_classes} classes'
        )
    msg += (
        '. Fix the annotation, or make the class count match the data: set '
        'model.decode_head.num_classes (and the dataset metainfo classes)'
    )
    if reduce_zero_label is False and num_classes in bad:
        msg += ', or reduce_zero_label=True if 0 means "other" in these files'
    return msg + '.'


def size_message(
    where: str,
    img_path: str,
    img_hw: Tuple[int, int],
    seg_path: str,
    seg_hw: Tuple[int, int],
    more: int = 0,
) -> str:
    extra = f' ({more} more pairs differ)' if more else ''
    return (
        f'{where}: image {img_path!r} is {img_hw[0]}x{img_hw[1]} px (H x W) but its '
        f'annotation {seg_path!r} is {seg_hw[0]}x{seg_hw[1]} px{extra}: resizing and '
        'cropping would pair pixels with the wrong labels. Every annotation must have '
        'the size of its image: regenerate the annotations, or check that the image and '
        'annotation folders (data_prefix) belong together.'
    )


def channels_message(where: str, path: str, shape: Tuple[int, ...]) -> str:
    return (
        f'{where}: annotation {path!r} has shape {tuple(shape)}, not (H, W): a colour '
        'image, not a map of class indices. mmseg needs single-channel PNGs of class ids '
        '(Cityscapes: *_gtFine_labelTrainIds.png, not *_color.png); check '
        'data_prefix.seg_map_path and seg_map_suffix'
    )


def all_ignored_message(paths: Sequence[str], ignore_index: int, total: int = 0) -> str:
    shown = ', '.join(repr(p) for p in paths[:5]) + (' ...' if len(paths) > 5 else '')
    of = f' of {total} checked' if total else ''
    return (
        f'{len(paths)}{of} annotation(s) hold only the ignore index {ignore_index} '
        f"({shown}): they contribute nothing to the loss, and mmseg's acc_seg reports "
        '100 for batches of them. Check reduce_zero_label (it turns 0 into the ignore '
        'index) and the label conversion.'
    )


def unreadable_file(where: str, kind: str, path: str, err: BaseException) -> 'UnreadableFileError':
    reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
    return UnreadableFileError(
        f'{where}: cannot read {kind} file {path!r} ({type(err).__name__}: '
        f'{reason}); it is corrupt, truncated or not an image: '
        'replace or remove it (and its image / annotation)'
    )


def wide_labels_message(where: str, path: str, dtype: np.dtype, top: int) -> str:
    """An annotation of more than 8 bits holding values above 255: mmseg's
    ``LoadAnnotations`` casts label maps to uint8, so value ``k`` trains as ``k % 256``."""
    return (
        f'{where}: annotation {path!r} is a {np.dtype(dtype).name} map holding label values '
        f'up to {top}: mmseg reads label maps as 8 bits (uint8), so {top} would become '
        f'{top % 256}. Save class ids 0..254 (255: ignore) as 8-bit PNGs.'
    )


def reduce_zero_label_verdict(
    key: str,
    reduce: bool,
    class_default: Optional[bool],
    dataset: str,
    with_zero: int,
    with_255: int,
    checked: int,
    raw_top: int,
    num_classes: int,
    own_classes: bool,
    type_classes: bool = False,
) -> Tuple[Optional[str], bool]:
    """``(message, is_error)`` for a ``reduce_zero_label`` the raw label files contradict,
    or ``(None, False)``. Of ``checked`` files, ``with_zero`` / ``with_255`` hold the raw
    value 0 / 255; ``raw_top``: their largest raw value other than 255 (-1: none);
    ``class_default``: the dataset class's own ``reduce_zero_label``; ``own_classes``: the
    dataset names the classes (``METAINFO``) of the class that sets that default, and the
    model has as many; ``type_classes``: the dataset names the classes of a class that
    states that default for them -- the class that names the classes in its own
    ``METAINFO`` sets the default in its constructor (or a subclass of it does), or is
    one of mmseg's own dataset classes (CityscapesDataset: files of a documented layout).
    Not a user's ``BaseSegDataset`` subclass with a ``METAINFO`` of its own that inherits
    ``BaseSegDataset``'s ``False``: that default says nothing about its files.

    * ``True``, files that hold 255 already, and every other value a class *without*
      reducing (``raw_top < num_classes``): files with an ignore value of their own whose
      0 is a class (Cityscapes trainIds: 0 = road). Reducing makes 0 ignored and names
      every class after the next one; all values stay in range, so nothing else notices.
      An error for a dataset class that states the default ``False`` for its own classes
      (``type_classes``: Cityscapes), a warning else that gives both readings: files whose
      0 is an ignored background and 255 a void border are right reduced (mmseg keeps 255
      ignored), and pass when a checked file holds ``num_classes``, but their top class
      may be missing from the sample.
    * ``False`` on the class's own classes where its default is ``True`` (ADE20K), 0 in
      the files and no 255: the class's own files, where 0 is "other" (files reduced
      already mark those pixels 255): class ``k`` would train as class ``k``'s neighbour.
      An error.
    """
    fix = '; if the files are meant so, --skip-data-check skips the data checks'
    if reduce and with_255 and raw_top < num_classes:
        error = class_default is False and type_classes
        msg = (
            f'{key}.reduce_zero_label=True, but {with_255} of {checked} checked label files '
            f'already hold 255 (an ignore value) and their other values are classes as they '
            f'are (0..{raw_top} of {num_classes}), as in files whose 0 is a class '
            '(Cityscapes trainIds: 0 = road): reducing makes 0 ignored and shifts every '
            'class down by one, silently (all values stay in range). '
        )
        if error:
            msg += f'Set {key}.reduce_zero_label=False (and drop it from LoadAnnotations)' + fix
        else:
            msg += (
                f'If 0 is a class in these files, set {key}.reduce_zero_label=False (and drop '
                'it from LoadAnnotations). If 0 marks unlabelled pixels and the classes are '
                f'stored as 1..{num_classes} (255 a void border, which mmseg keeps ignored), '
                'reduce_zero_label=True is right and no checked file holds the top class '
                f'(stored as {num_classes}): keep it (--check-all-data checks every file)'
            )
        return msg, error
    if not reduce and class_default and own_classes and not with_255 and with_zero:
        msg = (
            f'{key}.reduce_zero_label=False on {dataset} (whose default is True), but '
            f'{with_zero} of {checked} checked label files hold 0 and none holds 255: '
            f'{dataset}\'s own files, where 0 is "other" and class k is stored as k+1. '
            'Class k would train as class k+1, silently. Set '
            f"{key}.reduce_zero_label=True (as mmseg's configs do); files already "
            'reduced mark ignored pixels with 255'
        )
        return msg + fix, True
    return None, False
