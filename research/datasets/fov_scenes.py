"""A generated segmentation task for the *field-of-view* ladder: wide scenes at one pixel
scale whose labels depend on landmarks that a training crop often does not show.

Every scene is a noisy grey frame with two landmarks that cross it from edge to edge:

* a **horizon**, a thin orange line across the whole width: pixels above it are ``sky``,
  below it ``road``. Sky and road have the *same* colour and noise (drawn from one
  distribution), so a patch far from the horizon can tell them apart only by finding the
  line (or by knowing where in the frame it is);
* a **tower**, a white band over the whole height (class ``tower``);

plus coloured rectangles and discs whose class says on which side of the tower they stand:

=====  ===================  ==========================================================
label  class                pixels of ...
=====  ===================  ==========================================================
0      ``sky``              the background above the horizon
1      ``road``             the background below it
2      ``tower``            the tower
3      ``left-of-tower``    an object whose centre is left of the tower
4      ``right-of-tower``   an object whose centre is right of it
=====  ===================  ==========================================================

Object colours and shapes are drawn from the same sets on both sides (tested), so a
patch's own appearance says nothing about classes 3 / 4, nor about sky vs road.

Everything is defined in **pixels** at one scale: the object sizes, the tower's width and
the line's thickness do not depend on the frame size, and objects are as dense per area
in every frame. A frame ``s`` times the training crop's side therefore shows ``s``² times
as much of the world (more objects, landmarks farther away), not the same content bigger
(that is the *zoom* ladder of :mod:`.relational`). The horizon lies at 20-80 % of the
frame height and the tower at 20-80 % of its width, so in a frame 4 crops wide most
crop-sized windows show neither: a sliding window of the training crop must guess what
a whole-frame pass can see.

Splits (mmseg's layout, :mod:`.folders`)::

    ROOT/img_dir/train/00000.png    training scenes, train_scale x the crop side (the
                                    models train on random crops of them)
    ROOT/img_dir/val_x2/00000.png   validation scenes 2 x the crop side (one folder per
                                    scale of the ladder; other scenes at every scale)
    ROOT/meta.json

No OpenMMLab imports here (numpy + Pillow).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lookhere_dense.validation import settings_from_dict as _from_dict

from .folders import ensure_dataset, write_dataset, write_png

__all__ = [
    'CLASSES',
    'PALETTE',
    'FovSceneSettings',
    'FovScene',
    'sample_scene',
    'render_scene',
    'split_name',
    'write_fov_dataset',
    'ensure_fov_dataset',
    'settings_from_dict',
    'save_examples',
]

CLASSES = ('sky', 'road', 'tower', 'left-of-tower', 'right-of-tower')
PALETTE = [[110, 170, 235], [120, 95, 70], [255, 255, 255], [230, 25, 75], [60, 180, 75]]
#: RGB colours of the objects (no white, orange or grey): the same on both sides.
OBJECT_COLOURS = (
    (220, 40, 40),
    (40, 200, 60),
    (50, 90, 230),
    (240, 220, 40),
    (40, 210, 220),
    (210, 60, 210),
)
TOWER_COLOUR = (250, 250, 250)
HORIZON_COLOUR = (245, 150, 30)
#: rows of the horizon line (the line's rows above the horizon row are sky, the others road)
HORIZON_THICKNESS = 2
FORMAT_VERSION = 1


@dataclass(frozen=True)
class FovSceneSettings:
    """What a field-of-view dataset folder holds (stored as ``meta.json``).

    Args:
        num_train: training scenes. Default: 2000.
        num_val: validation scenes per scale. Default: 50.
        crop: ``(H, W)`` of the training crop in pixels, the ladder's unit. Default:
            ``(64, 64)``.
        train_scale: training scenes are ``train_scale`` times the crop side; the models
            train on random crops of them. Default: 2.
        scales: validation frame sides as multiples of the crop side. Default: 1, 2, 3, 4.
        seed: seed of the scene generator (train and each val split use their own
            streams). Default: 0.
        horizon: ``(min, max)`` horizon row as a fraction of the frame height. Default:
            ``(0.2, 0.8)``.
        tower: ``(min, max)`` tower centre column as a fraction of the frame width.
            Default: ``(0.2, 0.8)``.
        tower_width: ``(min, max)`` tower width in px. Default: ``(4, 6)``.
        objects_per_crop: ``(min, max)`` objects per crop-sized area (a frame of ``s``
            crops² gets ``s``² times as many). Default: ``(1.5, 3.0)``.
        object_half: ``(min, max)`` half extent of an object in px. Default: ``(4, 8)``.
        grey: ``(min, max)`` grey level of sky and road (one per scene). Default:
            ``(60, 160)``.
        noise_std: std of the Gaussian pixel noise (0-255 scale). Default: 8.
    """

    num_train: int = 2000
    num_val: int = 50
    crop: Tuple[int, int] = (64, 64)
    train_scale: float = 2.0
    scales: Tuple[float, ...] = (1.0, 2.0, 3.0, 4.0)
    seed: int = 0
    horizon: Tuple[float, float] = (0.2, 0.8)
    tower: Tuple[float, float] = (0.2, 0.8)
    tower_width: Tuple[int, int] = (4, 6)
    objects_per_crop: Tuple[float, float] = (1.5, 3.0)
    object_half: Tuple[int, int] = (4, 8)
    grey: Tuple[int, int] = (60, 160)
    noise_std: float = 8.0

    def __post_init__(self):
        for name in (
            'crop',
            'scales',
            'horizon',
            'tower',
            'tower_width',
            'objects_per_crop',
            'object_half',
            'grey',
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, 'scales', tuple(float(s) for s in self.scales))
        object.__setattr__(self, 'train_scale', float(self.train_scale))
        if self.num_train < 1 or self.num_val < 1:
            raise ValueError(
                f'num_train and num_val must be >= 1, got {self.num_train}, {self.num_val}'
            )
        if len(self.crop) != 2 or min(self.crop) < 16:
            raise ValueError(f'crop must be (H, W) >= 16 px, got {self.crop}')
        if not self.scales or min(self.scales) < 1:
            raise ValueError(f'scales must be >= 1 (frames at least one crop), got {self.scales}')
        if self.train_scale < 1:
            raise ValueError(
                f'train_scale must be >= 1 (scenes at least one crop), got {self.train_scale}'
            )
        for name in ('horizon', 'tower'):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi < 1:
                raise ValueError(
                    f'{name} must be (min, max) fractions with 0 < min <= max < 1, got {(lo, hi)}'
                )
        if not 1 <= self.object_half[0] <= self.object_half[1]:
            raise ValueError(
                f'object_half must be (min, max) px with 1 <= min <= max, got {self.object_half}'
            )

    def size_at(self, scale: float) -> Tuple[int, int]:
        """Frame ``(H, W)`` at ``scale`` crops per side (rounded to whole pixels)."""
        return (int(round(self.crop[0] * scale)), int(round(self.crop[1] * scale)))

    def to_json(self) -> Dict[str, Any]:
        """A JSON-able dict (tuples as lists) with the format version."""
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        d['format_version'] = FORMAT_VERSION
        return d


@dataclass
class FovScene:
    """One scene, in pixels.

    Attributes:
        size: ``(H, W)``.
        horizon: first ``road`` row (rows above it are ``sky``).
        tower: ``(x0, width)``: the tower covers columns ``x0 .. x0 + width - 1``.
        objects: ``(shape, cy, cx, half_h, half_w, rgb, label)`` with ``shape`` in
            ``('rect', 'disc')``, centres and extents in px.
        grey: grey level of sky and road.
        noise_seed: seed of the pixel noise.
    """

    size: Tuple[int, int]
    horizon: int
    tower: Tuple[int, int]
    objects: List[Tuple[str, float, float, float, float, Tuple[int, int, int], int]] = field(
        default_factory=list
    )
    grey: int = 100
    noise_seed: int = 0

    @property
    def tower_centre(self) -> float:
        """The tower's centre column (px, pixel centres at ``j + 0.5``)."""
        return self.tower[0] + self.tower[1] / 2


def side_label(cx: float, tower_centre: float) -> int:
    """The class of an object centred at column ``cx``: 3 (left of the tower) or 4."""
    return 3 if cx < tower_centre else 4


def sample_scene(
    rng: np.random.Generator,
    size: Tuple[int, int],
    settings: FovSceneSettings = FovSceneSettings(),
    max_tries: int = 50,
) -> FovScene:
    """Draw one ``(H, W)`` scene: horizon, tower, then objects that keep a 2 px gap to the
    tower (rejection sampling; an object that does not fit in ``max_tries`` is skipped).
    The number of objects is ``objects_per_crop`` times the frame's area in crops."""
    h, w = int(size[0]), int(size[1])
    horizon = int(round(rng.uniform(*settings.horizon) * h))
    tw = int(rng.integers(settings.tower_width[0], settings.tower_width[1] + 1))
    x0 = int(round(rng.uniform(*settings.tower) * w - tw / 2))
    scene = FovScene(
        (h, w),
        horizon,
        (x0, tw),
        [],
        int(rng.integers(settings.grey[0], settings.grey[1] + 1)),
        int(rng.integers(0, 2**31 - 1)),
    )
    crops = h * w / (settings.crop[0] * settings.crop[1])
    n = int(round(rng.uniform(*settings.objects_per_crop) * crops))
    lo, hi = settings.object_half
    for _ in range(n):
        shape = 'rect' if rng.random() < 0.5 else 'disc'
        colour = OBJECT_COLOURS[int(rng.integers(0, len(OBJECT_COLOURS)))]
        for _ in range(max_tries):
            hh = float(rng.uniform(lo, hi))
            hw = hh if shape == 'disc' else float(rng.uniform(lo, hi))
            if 2 * hh >= h or 2 * hw >= w:
                continue
            cy, cx = float(rng.uniform(hh, h - hh)), float(rng.uniform(hw, w - hw))
            if abs(cx - scene.tower_centre) < hw + tw / 2 + 2:
                continue  # touches the tower
            scene.objects.append(
                (shape, cy, cx, hh, hw, colour, side_label(cx, scene.tower_centre))
            )
            break
    return scene


def render_scene(scene: FovScene, noise_std: float = 8.0) -> Tuple[np.ndarray, np.ndarray]:
    """Render ``scene`` at its size.

    A pixel belongs to a shape when its centre ``(i + .5, j + .5)`` does. Objects are
    drawn over the background and the horizon (they may overlap each other only on one
    side of the tower, so a pixel's label never depends on the order); the tower last.

    Returns:
        ``(image, label)``: ``(H, W, 3)`` uint8 RGB and ``(H, W)`` uint8 class indexes.
    """
    h, w = scene.size
    yy = (np.arange(h) + 0.5)[:, None]
    xx = (np.arange(w) + 0.5)[None, :]
    image = np.empty((h, w, 3), dtype=np.float32)
    image[:] = scene.grey
    label = np.zeros((h, w), dtype=np.uint8)
    label[scene.horizon :] = 1
    line = slice(
        max(0, scene.horizon - HORIZON_THICKNESS // 2),
        max(0, scene.horizon - HORIZON_THICKNESS // 2) + HORIZON_THICKNESS,
    )
    image[line] = HORIZON_COLOUR
    for shape, cy, cx, hh, hw, rgb, cls in scene.objects:
        dy, dx = (yy - cy) / hh, (xx - cx) / hw
        mask = (np.abs(dy) <= 1) & (np.abs(dx) <= 1) if shape == 'rect' else dy * dy + dx * dx <= 1
        image[mask] = rgb
        label[mask] = cls
    x0, tw = scene.tower
    image[:, max(0, x0) : x0 + tw] = TOWER_COLOUR
    label[:, max(0, x0) : x0 + tw] = 2
    if noise_std > 0:
        noise_rng = np.random.default_rng([scene.noise_seed, h, w])
        image += noise_rng.normal(0.0, noise_std, image.shape).astype(np.float32)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), label


def split_name(scale: float) -> str:
    """Validation split folder of a scale: ``2 -> 'val_x2'``, ``1.5 -> 'val_x1.5'``."""
    return f'val_x{float(scale):g}'


def _stream(name: str, settings: FovSceneSettings) -> List[int]:
    """The generator stream of a split: train ``[seed, 0]``, the val split of scale ``s``
    ``[seed, 1, round(1000 s)]``."""
    if name == 'train':
        return [settings.seed, 0]
    scale = float(name[len('val_x') :])
    return [settings.seed, 1, int(round(scale * 1000))]


def write_fov_dataset(
    root: str, settings: FovSceneSettings = FovSceneSettings(), progress: bool = False
) -> Dict[str, Any]:
    """(Re)write the dataset folder ``root`` for ``settings`` (see the module docstring;
    :func:`research.datasets.folders.write_dataset`). Returns the ``meta.json`` content."""
    splits = [('train', settings.size_at(settings.train_scale), settings.num_train)]
    splits += [(split_name(s), settings.size_at(s), settings.num_val) for s in settings.scales]

    def images(name: str, size: Tuple[int, int], number: int):
        rng = np.random.default_rng(_stream(name, settings))
        for _ in range(number):
            yield render_scene(sample_scene(rng, size, settings), settings.noise_std)

    meta = dict(settings=settings.to_json(), classes=list(CLASSES), palette=PALETTE)
    return write_dataset(root, splits, images, meta, len(CLASSES), progress)


def ensure_fov_dataset(
    root: str, settings: FovSceneSettings = FovSceneSettings(), progress: bool = False
) -> Dict[str, Any]:
    """The dataset at ``root``, written only if ``meta.json`` is absent or was made with
    other settings. Returns the ``meta.json`` content."""
    return ensure_dataset(
        root, settings.to_json(), lambda: write_fov_dataset(root, settings, progress)
    )


def settings_from_dict(cfg: Optional[Dict[str, Any]]) -> FovSceneSettings:
    """:class:`FovSceneSettings` from a config dict (unknown keys are an error, by name)."""
    return _from_dict(FovSceneSettings, cfg, 'fov_scenes settings')


def save_examples(
    path: str,
    scales: Sequence[float] = (1.0, 2.0, 4.0),
    settings: FovSceneSettings = FovSceneSettings(),
    seed: int = 0,
) -> None:
    """Write a PNG sheet: one scene per scale at its true size (one pixel scale, so larger
    frames are *wider views*, not enlargements), its labels in :data:`PALETTE` colours
    below it (on a dark background), and a grid of training crops drawn in black on the
    largest frame's label map."""
    rng = np.random.default_rng(seed)
    tiles = []
    for scale in scales:
        image, label = render_scene(
            sample_scene(rng, settings.size_at(scale), settings), settings.noise_std
        )
        tiles.append((image, np.asarray(PALETTE, dtype=np.uint8)[label]))
    ch, cw = settings.crop
    big = tiles[-1][1]
    for y in range(0, big.shape[0], ch):  # the training crop grid, in black
        big[y, :] = 0
    for x in range(0, big.shape[1], cw):
        big[:, x] = 0
    height = max(t[0].shape[0] for t in tiles)
    pad = 4
    cols = []
    for image, colour in tiles:
        col = np.full((2 * height + 3 * pad, image.shape[1] + 2 * pad, 3), 40, np.uint8)
        col[pad : pad + image.shape[0], pad : pad + image.shape[1]] = image
        y = 2 * pad + height
        col[y : y + colour.shape[0], pad : pad + colour.shape[1]] = colour
        cols.append(col)
    write_png(path, np.concatenate(cols, axis=1))
