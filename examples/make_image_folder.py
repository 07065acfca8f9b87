"""Write a small image folder to train on: four classes of drawn shapes, as PNG files.

    python examples/make_image_folder.py DIR [--per-class 300] [--size 64] [--seed 0]

``DIR/train/<class>/*.png`` and ``DIR/val/<class>/*.png`` (a sixth of each class), the layout
``data: DIR`` reads. Each image is a shape (circle, square, triangle or cross) of a random
colour, size and place on a random background, so a classifier has something to learn and
crops and flips keep the class. Needs Pillow (installed with torchvision).
"""

from __future__ import annotations

import argparse
import os
import random

CLASSES = ("circle", "cross", "square", "triangle")


def draw(shape: str, size: int, rng: random.Random):
    from PIL import Image, ImageDraw

    def colour() -> tuple[int, int, int]:
        return tuple(rng.randrange(256) for _ in range(3))  # type: ignore[return-value]

    image = Image.new("RGB", (size, size), colour())
    pen = ImageDraw.Draw(image)
    r = rng.uniform(0.2, 0.4) * size
    cx, cy = rng.uniform(r, size - r), rng.uniform(r, size - r)
    fill = colour()
    if shape == "circle":
        pen.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "square":
        pen.rectangle((cx - r, cy - r, cx + r, cy + r), fill=fill)
    elif shape == "triangle":
        pen.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
    else:
        w = r / 3
        pen.rectangle((cx - r, cy - w, cx + r, cy + w), fill=fill)
        pen.rectangle((cx - w, cy - r, cx + w, cy + r), fill=fill)
    return image


def write(root: str, per_class: int = 300, size: int = 64, seed: int = 0) -> None:
    """``per_class`` PNGs of each class under ``root``, a sixth of them in ``val/``."""
    rng = random.Random(seed)
    n_val = max(1, per_class // 6)
    for shape in CLASSES:
        for i in range(per_class):
            split = "val" if i < n_val else "train"
            folder = os.path.join(root, split, shape)
            os.makedirs(folder, exist_ok=True)
            draw(shape, size, rng).save(os.path.join(folder, f"{shape}_{i:04d}.png"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.root, args.per_class, args.size, args.seed)
    print(f"{len(CLASSES)} classes x {args.per_class} PNGs in {args.root}/train and /val")


if __name__ == "__main__":
    main()
