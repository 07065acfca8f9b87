"""A per-sample dataset with CPU work per item, for data_loading.py."""

import torch

from refddp.workload.data import synthetic


class PerSample(torch.utils.data.Dataset):
    def __init__(self, base):
        self.x, self.y = base.x, base.y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        for _ in range(30):  # stand-in for decoding / augmentation
            x = x + 1e-3 * torch.sin(x)
        return x, self.y[i]


def per_sample_datasets(config):
    train, val = synthetic(config)
    return PerSample(train), val
