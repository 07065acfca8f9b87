"""``data: DIR``: images in class folders, ``DIR/train/<class>/*`` and ``DIR/val/<class>/*``.

The layout torchvision's ``ImageFolder`` reads (and Kaggle's image sets ship in): one
subfolder per class, class indices in sorted folder-name order, the same classes in both
splits. Images are decoded in the loader's workers, as they are fetched. Training images get
a random-resized crop and a horizontal flip, drawn from torch's RNG inside ``__getitem__``:
refddp's loader seeds that RNG per (seed, epoch, sample) (``data.SeededFetch``), so the
augmentation is the same at any world size, worker count or resume. Validation images are
resized and centre-cropped. Both are normalised with ImageNet's channel statistics.

Needs torchvision (``pip install torchvision`` of the release that matches your torch).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import Dataset

from refddp.config.schema import ConfigError, TrainConfig

SPLITS = ("train", "val")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, per RGB channel


def is_image_folder(data: str) -> bool:
    """``data`` names a directory (the CLI then expects ``train/`` and ``val/`` in it)."""
    return os.path.isdir(data)


def import_torchvision() -> Any:
    """torchvision and its transforms.v2; one line where it does not import."""
    try:
        import torchvision
        from torchvision.transforms import v2
    except Exception as exc:  # noqa: BLE001 - ImportError, or a build for another torch
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"data: an image folder needs torchvision built for this torch ({torch.__version__})"
            f", which does not import here ({reason})"
        ) from None
    return torchvision, v2


def _transforms(v2: Any, size: int, train: bool) -> Any:
    resize = (
        [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
        if train
        else [v2.Resize(size * 8 // 7, antialias=True), v2.CenterCrop(size)]  # 256 -> 224
    )
    return v2.Compose(
        [v2.ToImage(), *resize, v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    )


class ImageFolderSplit(Dataset):
    """One split: ``(image, class)`` pairs, the image a float tensor ``(3, size, size)``."""

    def __init__(self, folder: Any, dtype: torch.dtype):
        self.folder, self.dtype = folder, dtype
        self.classes: list[str] = folder.classes
        # Every sample has one target: the loss counts them on the host (Objective.count).
        self.every_target_scored = True

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, label = self.folder[index]
        return image.to(self.dtype), label


def image_folders(c: TrainConfig) -> tuple[ImageFolderSplit, ImageFolderSplit]:
    """``(train, val)`` from ``c.data``; every problem with the folder is one line naming it."""
    torchvision, v2 = import_torchvision()
    splits = []
    for split in SPLITS:
        path = os.path.join(c.data, split)
        if not os.path.isdir(path):
            raise ConfigError(
                f"data: {path} not found: an image folder holds train/ and val/, each with one "
                "subfolder of images per class"
            )
        try:
            folder = torchvision.datasets.ImageFolder(
                path, transform=_transforms(v2, c.image_size, split == "train")
            )
        except (FileNotFoundError, OSError) as exc:  # no class folder, or no image in one
            raise ConfigError(f"data: {path}: {str(exc).splitlines()[0]}") from None
        splits.append(ImageFolderSplit(folder, getattr(torch, c.dtype)))
    train, val = splits
    if train.classes != val.classes:
        only = sorted(set(train.classes) ^ set(val.classes))
        raise ConfigError(
            f"data: {c.data}: train/ and val/ must have the same class folders; "
            f"in one only: {', '.join(only) or '(the same names, another order)'}"
        )
    if len(train.classes) != c.num_classes:
        raise ConfigError(
            f"num_classes: {c.num_classes}, but {c.data}/train has {len(train.classes)} class "
            f"folders; set num_classes: {len(train.classes)}"
        )
    return train, val
