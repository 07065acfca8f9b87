"""``data: DIR`` (``refddp/workload/image_folder.py``): a folder of class subfolders of images, read
from real PNG files; every problem with the folder is one line naming it."""

import os

import pytest
import torch

from examples.make_image_folder import CLASSES, write
from refddp.config.schema import ConfigError, TrainConfig
from refddp.workload.data import SeededFetch, build_datasets


def _torchvision_imports() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - a build for another torch fails with RuntimeError
        return False
    return True


needs_torchvision = pytest.mark.skipif(
    not _torchvision_imports(), reason=f"torchvision does not import beside torch {torch.__version__}"
)


@pytest.fixture
def folder(tmp_path):
    pytest.importorskip("PIL")
    write(str(tmp_path / "shapes"), per_class=6, size=20)
    return tmp_path / "shapes"


def _config(folder, **kwargs) -> TrainConfig:
    return TrainConfig(data=str(folder), num_classes=len(CLASSES), image_size=16, **kwargs)


@pytest.mark.skipif(_torchvision_imports(), reason="torchvision imports here")
def test_without_torchvision_an_image_folder_is_one_line_saying_so(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(ConfigError) as info:
        build_datasets(TrainConfig(data=str(tmp_path)))
    message = str(info.value)
    assert message.startswith("data: an image folder needs torchvision built for this torch")
    assert "\n" not in message


@needs_torchvision
def test_both_splits_read_the_pngs_as_normalised_images_of_the_sorted_classes(folder):
    train, val = build_datasets(_config(folder))
    assert (len(train), len(val)) == (4 * 5, 4 * 1)  # a sixth of each class in val/
    image, label = val[0]
    assert image.shape == (3, 16, 16) and image.dtype == torch.float32
    assert label == 0 and train.classes == sorted(CLASSES)
    assert -3 < float(image.mean()) < 3  # ImageNet-normalised, not 0..255


@needs_torchvision
def test_training_augmentation_is_drawn_per_sample_from_the_seed(folder):
    train, val = build_datasets(_config(folder))
    one, again, next_epoch = SeededFetch(train, 0, 0), SeededFetch(train, 0, 0), SeededFetch(train, 0, 1)
    assert torch.equal(one[3][0], again[3][0])  # the same crop and flip, whoever fetches it
    assert not torch.equal(one[3][0], next_epoch[3][0])  # another draw in another epoch
    assert torch.equal(SeededFetch(val, 0, 0)[1][0], SeededFetch(val, 0, 1)[1][0])  # no augmentation


@needs_torchvision
def test_a_bad_image_folder_is_one_line_naming_what_to_fix(folder, tmp_path):
    with pytest.raises(ConfigError, match="num_classes: 3, but .* has 4 class folders; set num_classes: 4"):
        build_datasets(TrainConfig(data=str(folder), num_classes=3))
    os.rename(folder / "val" / "cross", folder / "val" / "plus")
    with pytest.raises(ConfigError, match="same class folders; in one only: cross, plus"):
        build_datasets(_config(folder))
    (tmp_path / "flat").mkdir()
    with pytest.raises(ConfigError, match=r"flat/train not found: an image folder holds train/ and val/"):
        build_datasets(_config(tmp_path / "flat"))
    (tmp_path / "flat" / "train").mkdir()
    (tmp_path / "flat" / "val").mkdir()
    with pytest.raises(ConfigError, match=r"data: .*flat/train: "):
        build_datasets(_config(tmp_path / "flat"))  # no class folder in it
