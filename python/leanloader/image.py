"""Images decoded and augmented by the engine's native threads.

``Images`` (any list of files) and ``ImageFolder`` (torchvision's class
folders) are leanloader Sources: JPEG, PNG and WebP are decoded in C++
(libjpeg-turbo, libspng, libwebp; format by magic bytes), and the transforms,
named and parameterized as torchvision's, run fused into the write of each
sample's row of the batch::

    ds = ll.ImageFolder("train/", transform=[ll.RandomResizedCrop(224),
                        ll.RandomHorizontalFlip(), ll.Normalize(MEAN, STD)])
    loader = ll.Loader(ds, batch_size=256, shuffle=True, num_threads=8)
    for batch in loader:
        batch["image"], batch["label"]      # (B, 3, 224, 224) float32, (B,) int64

Random transforms draw from a counter-based generator keyed by the loader's
``seed``, the epoch and the sample index: a sample gets the same crop and flip
at any thread count, and different ones each epoch.
"""

from __future__ import annotations

import glob as _glob
import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from leanloader import _core
from leanloader.arguments import integer

# Pillow's Image.MAX_IMAGE_PIXELS: as Pillow, larger images are decoded with a
# warning, and images over twice it refused from the header (a decompression
# bomb guard), before anything is allocated.
MAX_IMAGE_PIXELS = 89_478_485

# torchvision.datasets.folder.IMG_EXTENSIONS, every one decoded. A file whose
# bytes are no image format leanloader knows is refused up front (see
# _refuse_undecodable).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
DECODED_EXTENSIONS = IMG_EXTENSIONS


def _refuse_undecodable(root: str, paths: list[str]) -> None:
    """Raises ValueError when files of an ImageFolder are in a format leanloader
    does not decode (listed with extensions= or is_valid_file=), found before the first epoch
    rather than as decode errors in the middle of one. Only files whose
    extension is not a decoded format's are read (their first 12 bytes)."""
    undecodable = [
        path
        for path in paths
        if not path.lower().endswith(DECODED_EXTENSIONS)
        and _core.image_file_format(path) == "unknown"
    ]
    if not undecodable:
        return
    shown = "\n  ".join(undecodable[:5])
    more = f"\n  ... and {len(undecodable) - 5} more" if len(undecodable) > 5 else ""
    raise ValueError(
        f"ImageFolder({root!r}): {len(undecodable)} of {len(paths)} files are not JPEG, PNG, "
        f"WebP, PPM/PGM/PBM, TIFF, BMP or GIF, the formats leanloader decodes:\n  {shown}{more}\n"
        "Convert them (for example with Pillow: Image.open(p).save(q.with_suffix('.png'))), "
        "leave them out with is_valid_file= or extensions=, or load them with ll.DataLoader "
        "over a PIL dataset."
    )


_DTYPES = {"uint8": "U8", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def _size_pair(size: Any, name: str) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    if isinstance(size, Sequence) and len(size) == 1:
        return int(size[0]), int(size[0])
    if isinstance(size, Sequence) and len(size) == 2:
        return int(size[0]), int(size[1])
    raise ValueError(f"{name}: size must be an int or a sequence of 1 or 2 ints, got {size!r}")


def _dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    return name


class Transform:
    """A native image transform; instances only describe the step."""

    def _step(self) -> tuple:  # (kind, h, w, max_size, scale.., ratio.., p)
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class Resize(Transform):
    """torchvision's ``Resize``: ``size`` an int (the shorter side; the longer
    scales, truncated) or ``(h, w)``; ``max_size`` caps the longer side.
    Resampled as torchvision resizes a PIL image, by Pillow's
    ``Image.resize(..., BILINEAR)`` (antialiased: the triangle filter widened
    by the shrink factor), bit for bit on a full-size decode."""

    def __init__(self, size: int | Sequence[int], max_size: int | None = None, antialias=True):
        if isinstance(size, int) or (isinstance(size, Sequence) and len(size) == 1):
            self.size = int(size if isinstance(size, int) else size[0])
            self._hw = (self.size, 0)
        else:
            self.size = _size_pair(size, "Resize")
            self._hw = self.size
            if max_size is not None:
                raise ValueError("Resize: max_size applies only when size is a single int")
        if antialias is not True:
            raise ValueError("Resize: only antialias=True is supported")
        if max_size is not None and (
            isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= self.size
        ):
            # torchvision's check; max_size=0 had meant no cap at all
            raise ValueError(
                f"Resize: max_size = {max_size!r} must be strictly greater than the requested "
                f"size for the smaller edge size = {self.size}"
            )
        self.max_size = max_size

    def _step(self) -> tuple:
        return ("resize", self._hw[0], self._hw[1], self.max_size or 0, 0.0, 0.0, 0.0, 0.0, 0.0)


class CenterCrop(Transform):
    """torchvision's ``CenterCrop``: an image smaller than the crop is padded
    with zeros first, as torchvision does."""

    def __init__(self, size: int | Sequence[int]):
        self.size = _size_pair(size, "CenterCrop")

    def _step(self) -> tuple:
        return ("center_crop", *self.size, 0, 0.0, 0.0, 0.0, 0.0, 0.0)


class RandomResizedCrop(Transform):
    """torchvision's ``RandomResizedCrop``, its algorithm exactly (10 attempts
    with area in ``scale`` and log-uniform aspect ratio in ``ratio``, then the
    central fallback), resized antialiased to ``size``."""

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        antialias=True,
    ):
        self.size = _size_pair(size, "RandomResizedCrop")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        if antialias is not True:
            raise ValueError("RandomResizedCrop: only antialias=True is supported")

    def _step(self) -> tuple:
        return ("random_resized_crop", *self.size, 0, *self.scale, *self.ratio, 0.0)


class RandomHorizontalFlip(Transform):
    """torchvision's ``RandomHorizontalFlip(p)``."""

    def __init__(self, p: float = 0.5):
        self.p = float(p)

    def _step(self) -> tuple:
        return ("horizontal_flip", 0, 0, 0, 0.0, 0.0, 0.0, 0.0, self.p)


class Normalize(Transform):
    """torchvision's ``ToTensor`` + ``Normalize``: ``(x / 255 - mean) / std`` in
    float32, stored as ``dtype`` (float32, float16 or bfloat16). Must be last."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace=False, dtype="float32"):
        self.mean = [float(v) for v in mean]
        self.std = [float(v) for v in std]
        self.dtype = _dtype_name(dtype)
        if self.dtype == "uint8":
            raise ValueError("Normalize gives floats: dtype must be float32, float16 or bfloat16")


def _expand(paths_or_glob: Any) -> list[str]:
    if isinstance(paths_or_glob, (str, os.PathLike)):
        pattern = os.fspath(paths_or_glob)
        if os.path.isfile(pattern):
            return [pattern]
        matches = sorted(p for p in _glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not matches:
            raise FileNotFoundError(f"no files match {pattern!r}")
        return matches
    if isinstance(paths_or_glob, Iterable):
        return [os.fspath(p) for p in paths_or_glob]
    raise TypeError(f"expected a path, a glob or a list of paths, got {paths_or_glob!r}")


def _labels(labels: Any) -> list[int]:
    # Integers only: int() made a label of 1.7 a silent 1.
    if isinstance(labels, np.ndarray) and labels.dtype.kind in "iu":
        return labels.astype(np.int64).tolist()
    return [integer(f"labels[{position}]", value) for position, value in enumerate(labels)]


def _check_utf8(path: str) -> None:
    # A name that is not UTF-8 reaches Python with surrogate escapes, which
    # the engine's paths (and its error messages) cannot carry.
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{path!r}: file names that are not UTF-8 are not supported; rename the file "
            "(for example with convmv)"
        ) from None


class _ImageSource(_core.ImageSource):
    def __init__(
        self,
        paths: list[str],
        labels: Sequence[int] | None,
        transform: Sequence[Transform] | None,
        *,
        mode: str = "RGB",
        layout: str = "CHW",
        dtype: Any = None,
        max_pixels: int | None = MAX_IMAGE_PIXELS,
        accept_corrupt_jpeg: bool = True,
        exif_orientation: bool = False,
        dct_scaling: bool = True,
    ):
        transform = list(transform or [])
        normalize = None
        steps = []
        for position, t in enumerate(transform):
            if not isinstance(t, Transform):
                raise TypeError(
                    f"transform[{position}] is {type(t).__name__}; use leanloader's transforms "
                    "(ll.Resize, ll.CenterCrop, ll.RandomResizedCrop, ll.RandomHorizontalFlip, "
                    "ll.Normalize)"
                )
            if isinstance(t, Normalize):
                if position != len(transform) - 1:
                    raise ValueError("Normalize must be the last transform")
                normalize = t
            else:
                steps.append(t._step())
        if dtype is None:
            dtype = normalize.dtype if normalize else "uint8"
        dtype = _dtype_name(dtype)
        if normalize and dtype != normalize.dtype:
            raise ValueError(f"dtype={dtype!r} differs from Normalize's {normalize.dtype!r}")
        labels = [] if labels is None else _labels(labels)
        for path in paths:
            _check_utf8(path)
        self.transform = transform
        super().__init__(
            paths, labels, steps, _DTYPES[dtype], layout,
            normalize.mean if normalize else [], normalize.std if normalize else [],
            mode, max_pixels or 0, accept_corrupt_jpeg, exif_orientation, dct_scaling,
        )  # fmt: skip

    def transform_params(self, index: int, epoch: int = 0, seed: int = 0) -> dict:
        """The parameters sample ``index`` gets in ``epoch`` of a loader with
        ``seed``: ``crops`` as torchvision's ``(i, j, h, w)``, ``resizes`` as
        ``(h, w)``, ``flipped``, ``output_size``."""
        return self.sample_params(index, seed, epoch)


class Images(_ImageSource):
    """Image files as samples: field ``image`` and, with ``labels``, ``label``
    (int64).

    ``paths_or_glob``: a glob (``"data/*.png"``, ``**`` recurses; sorted) or a
    list of paths in sample order. ``transform``: a list of leanloader
    transforms. Output: uint8 (pixels as decoded), or the ``Normalize``'s float
    dtype (or ``dtype=`` for x / 255 without normalizing); layout ``"CHW"``
    (torch's) or ``"HWC"``; ``mode`` ``"RGB"``, ``"L"`` or ``"RGBA"`` (Pillow's
    ``convert``). Without a fixed-size transform (``RandomResizedCrop``,
    ``CenterCrop``, ``Resize((h, w))``) sizes vary: use ``collate="list"``.

    Bad files raise errors naming the file, the sample and the stage
    (``decode``); ``max_pixels`` (default Pillow's ``MAX_IMAGE_PIXELS``;
    ``None``: no limit) guards against decompression bombs as Pillow does:
    an image above it is decoded with a ``leanloader.DecompressionBombWarning``
    (a ``RuntimeWarning``; while Pillow is imported, an instance of Pillow's
    ``Image.DecompressionBombWarning`` too, so Pillow's filters apply) naming
    the file, one above twice it refused from the header;
    JPEGs with corrupt data that libjpeg works around are decoded, as Pillow
    decodes them, with a ``RuntimeWarning`` naming the file (once per file) and
    counted in ``Loader.stats()["samples_warned"]``;
    ``accept_corrupt_jpeg=False`` refuses them instead. A truncated file is
    refused either way, as Pillow refuses it, and whatever region a random
    crop decodes (the whole file is read). ``exif_orientation=True`` applies
    the EXIF orientation (a TIFF's Orientation tag is always applied, as
    Pillow applies it whenever it loads a TIFF).
    ``dct_scaling=False`` decodes JPEGs at full size even when a resize
    follows (slower, pixels as a full decode).
    """

    def __init__(
        self,
        paths_or_glob: str | os.PathLike | Iterable[str | os.PathLike],
        labels: Sequence[int] | None = None,
        transform: Sequence[Transform] | None = None,
        **options: Any,
    ):
        super().__init__(_expand(paths_or_glob), labels, transform, **options)


def find_classes(directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
    """torchvision's ``find_classes``: the sorted sub-folders of ``directory``."""
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {os.fspath(directory)}.")
    return classes, {name: index for index, name in enumerate(classes)}


def has_file_allowed_extension(filename: str, extensions: str | tuple[str, ...]) -> bool:
    """torchvision's: the file name, lower-cased, ends with one of ``extensions``
    (as given: list them in lower case)."""
    return filename.lower().endswith(
        extensions if isinstance(extensions, str) else tuple(extensions)
    )


def make_dataset(
    directory: str | os.PathLike,
    class_to_idx: dict[str, int] | None = None,
    extensions: str | tuple[str, ...] | None = None,
    is_valid_file: Any = None,
    allow_empty: bool = False,
) -> list[tuple[str, int]]:
    """torchvision's ``make_dataset``: ``(path, class index)`` of every file
    under ``directory/<class>/`` (sub-folders walked, links followed, sorted)
    that has one of ``extensions`` or that ``is_valid_file(path)`` keeps."""
    directory = os.path.expanduser(directory)
    if class_to_idx is None:
        _, class_to_idx = find_classes(directory)
    elif not class_to_idx:
        raise ValueError("'class_to_index' must have at least one entry to collect any samples.")
    if (extensions is None) == (is_valid_file is None):
        raise ValueError(
            "Both extensions and is_valid_file cannot be None or not None at the same time"
        )
    if extensions is not None:

        def is_valid_file(path: str) -> bool:
            return has_file_allowed_extension(path, extensions)

    samples: list[tuple[str, int]] = []
    available = set()
    for target_class in sorted(class_to_idx):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for folder, _, files in sorted(os.walk(target_dir, followlinks=True)):
            for file in sorted(files):
                path = os.path.join(folder, file)
                if is_valid_file(path):
                    samples.append((path, class_index))
                    available.add(target_class)
    empty = set(class_to_idx) - available
    if empty and not allow_empty:
        message = f"Found no valid file for the classes {', '.join(sorted(empty))}. "
        if extensions is not None:
            listed = extensions if isinstance(extensions, str) else ", ".join(extensions)
            message += f"Supported extensions are: {listed}"
        raise FileNotFoundError(message)
    return samples


class ImageFolder(_ImageSource):
    """torchvision's ``ImageFolder``: ``root/<class>/**/<image>``, classes are
    the sorted sub-folders, labels their indices; files are kept when their
    lower-cased name ends with one of ``extensions`` (torchvision's
    IMG_EXTENSIONS; as ``DatasetFolder``'s argument) or ``is_valid_file(path)``
    says so. Attributes as torchvision's: ``root``, ``classes``,
    ``class_to_idx``, ``samples`` (= ``imgs``), ``targets``, ``extensions``;
    a subclass may override ``find_classes`` and ``make_dataset`` as
    torchvision's documentation shows. Other options as ``Images``."""

    def __init__(
        self,
        root: str | os.PathLike,
        transform: Sequence[Transform] | None = None,
        is_valid_file: Any = None,
        allow_empty: bool = False,
        extensions: str | tuple[str, ...] | None = None,
        **options: Any,
    ):
        if isinstance(root, str):
            root = os.path.expanduser(root)
        self.root = root
        if extensions is None and is_valid_file is None:
            extensions = IMG_EXTENSIONS
        classes, class_to_idx = self.find_classes(self.root)
        samples = self.make_dataset(
            self.root,
            class_to_idx=class_to_idx,
            extensions=extensions,
            is_valid_file=is_valid_file,
            allow_empty=allow_empty,
        )
        if not samples:
            # (torchvision's would be an empty dataset)
            raise FileNotFoundError(
                f"no image files under {os.fspath(self.root)}: every class folder is empty, "
                "and a leanloader source needs at least one sample"
            )
        _refuse_undecodable(os.fspath(self.root), [p for p, _ in samples])
        self.extensions = extensions
        self.classes = classes
        self.class_to_idx = class_to_idx
        self.samples = samples
        self.imgs = samples
        self.targets = [target for _, target in samples]
        super().__init__([p for p, _ in samples], self.targets, transform, **options)

    @staticmethod
    def make_dataset(
        directory: str | os.PathLike,
        class_to_idx: dict[str, int],
        extensions: str | tuple[str, ...] | None = None,
        is_valid_file: Any = None,
        allow_empty: bool = False,
    ) -> list[tuple[str, int]]:
        """torchvision's ``DatasetFolder.make_dataset`` (override to list
        samples otherwise)."""
        if class_to_idx is None:
            # torchvision: find_classes alone would not see a subclass's override
            raise ValueError("The class_to_idx parameter cannot be None.")
        return make_dataset(
            directory,
            class_to_idx,
            extensions=extensions,
            is_valid_file=is_valid_file,
            allow_empty=allow_empty,
        )

    def find_classes(self, directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
        """torchvision's ``DatasetFolder.find_classes`` (override to choose the
        classes)."""
        return find_classes(directory)


def __getattr__(name: str):
    # How pickle finds the pixel-limit warning's class that derives from
    # Pillow's too (made in the extension module; it imports Pillow).
    if name == "_DecompressionBombWarningWithPillows":
        return _core.decompression_bomb_warning_with_pillows()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def decode_image(
    data: bytes | str | os.PathLike,
    mode: str = "RGB",
    max_pixels: int | None = MAX_IMAGE_PIXELS,
    accept_corrupt_jpeg: bool = True,
    exif_orientation: bool = False,
):
    """Decodes a JPEG, PNG, WebP, PPM/PGM/PBM, TIFF, BMP or GIF (bytes or a path)
    to an (H, W, C) uint8 NumPy array, as ``Images`` does (a JPEG with
    corrupt data libjpeg works around
    is decoded with a ``RuntimeWarning``, as Pillow decodes it;
    ``accept_corrupt_jpeg=False`` refuses it; an image above ``max_pixels``
    is decoded with a ``DecompressionBombWarning``, as in ``Images``)."""
    path = None
    if not isinstance(data, (bytes, bytearray, memoryview)):
        path = os.fspath(data)
        with open(path, "rb") as file:
            data = file.read()
    try:
        pixels, messages = _core.decode_image(
            bytes(data), mode, max_pixels or 0, accept_corrupt_jpeg, exif_orientation,
            "image bytes" if path is None else f"'{path}'",
        )  # fmt: skip
    except ValueError as error:  # FormatError, InvalidArgument: the message names the file
        if path is None:
            raise
        raise type(error)(f"'{path}': {error}") from None
    for category, message in messages:
        warnings.warn(message, category, stacklevel=2)
    return pixels
