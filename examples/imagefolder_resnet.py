"""torchvision's ResNet-18 (random init: nothing is downloaded) on a folder of images.

    python examples/make_image_folder.py runs/shapes        # a small folder of PNGs to try
    python -m refddp.train --config examples/imagefolder_resnet.yaml --nproc 2 --out runs/resnet

``data`` is a directory with ``train/`` and ``val/``, one subfolder per class (refddp's image
folder data path, ``refddp/workload/image_folder.py``: images decoded and augmented in the loader's
workers); ``num_classes`` must equal the number of class folders. The checkpoint's
``model_state_dict`` loads into a bare ``torchvision.models.resnet18(num_classes=...)``.

Config fields it reads: ``num_classes``.
"""

from __future__ import annotations


def model(config):
    from refddp.workload.image_folder import import_torchvision

    torchvision, _ = import_torchvision()  # where it will not import: one line, no traceback
    return torchvision.models.resnet18(weights=None, num_classes=config.num_classes)
