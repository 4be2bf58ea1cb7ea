"""A small ResNet on sklearn's 8x8 digits (1x8x8 images), trained through the torch front end.

    vtrain train --out runs/resnet --model examples/resnet_digits.py:task --steps 8 --batch-size 8

``task()`` returns a :class:`vtrain.frontend.TorchTask`: the module, the loss, torch.optim-style
optimizer settings and the data (see docs/frontend.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    """Two 3x3 convs with batch norm and a residual add; a strided 1x1 conv when the shape changes."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + self.shortcut(x))


class ResNet(nn.Module):
    """Stem conv, max pool, two residual stages (the second strided), average pool, linear head."""

    def __init__(self, width: int = 8, n_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.pool = nn.MaxPool2d(2, stride=1)  # 8x8 -> 7x7
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)  # 7x7 -> 4x4
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pool(F.relu(self.bn(self.stem(x))))
        h = self.layer2(self.layer1(h))
        return self.fc(torch.flatten(self.avg(h), 1))


def task(width: int = 8, optimizer: str = "SGD", lr: float | None = None, clip: float | None = None,
         warmup: int = 0, total_steps: int = 0):
    """The ResNet on sklearn's digits (1x8x8 images, 10 classes), cross-entropy, SGD or AdamW."""
    from vtrain.frontend import Schedule, TorchTask
    from vtrain.frontend.data import digits_images

    x, y = digits_images()
    if optimizer == "SGD":
        opt = {"name": "SGD", "lr": lr or 0.05, "momentum": 0.9, "weight_decay": 5e-4}
    else:
        opt = {"name": "AdamW", "lr": lr or 3e-3, "betas": (0.9, 0.99), "weight_decay": 0.01}
    schedule = Schedule(warmup, total_steps, 0.1) if total_steps else None
    return TorchTask(ResNet(width), F.cross_entropy, opt, [x], y, clip_grad_norm=clip, schedule=schedule)
