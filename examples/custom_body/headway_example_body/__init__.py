"""An example body brought by a user: ``body=headway_example_body:small_cnn``.

A body factory takes (input_shape, feature_dim) and returns an nn.Module mapping a batch of
inputs to a (batch, width) feature tensor. feature_dim 0 means "your own width"; when it is
> 0 the factory must output exactly that many features (headway refuses it otherwise).
An ``out_dim`` attribute is optional: headway measures the width on a dummy batch.
"""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Two 3x3 convolutions with max pooling, then a linear layer with ReLU."""

    nonnegative_features = True  # the features leave a ReLU (lets FedLog bound its statistics from below)

    def __init__(self, input_shape: tuple[int, ...], width: int):
        super().__init__()
        channels, height, wide = input_shape
        self.conv1 = nn.Conv2d(channels, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * (height // 4) * (wide // 4), width)
        self.out_dim = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return torch.relu(self.fc(x.flatten(1)))


def small_cnn(input_shape: tuple[int, ...], feature_dim: int) -> nn.Module:
    """Images (channels, height, width) -> feature_dim features (64 when feature_dim is 0)."""
    if len(input_shape) != 3:
        raise ValueError(f"small_cnn takes images (channels, height, width), not inputs of shape {tuple(input_shape)}")
    return SmallCNN(tuple(input_shape), feature_dim or 64)
