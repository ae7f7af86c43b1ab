"""Two small CNNs trained on the digits data: a ResNet-style and a MobileNet-style network.

Both are exported in eval mode with BatchNormalization kept as its own node (not folded into the
convolutions by the exporter), which is what a graph optimizer meets in models exported for
training frameworks or by older tools. The MobileNet writes its padding as explicit ``Pad`` nodes
and its hard-swish as ``x * clip(x + 3, 0, 6) / 6``, the form older exporters and Keras produce,
so that Pad-into-Conv and hard-swish rewrites have something to work on.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from modelpress.zoo.digits import NUM_CLASSES


class _ResidualBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + self.shortcut(x))


class ResNetDigits(nn.Module):
    """Stem conv (stride 2) and three residual blocks (16, 32, 64 channels) on 1x32x32 images."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.blocks = nn.Sequential(
            _ResidualBlock(16, 16, 1), _ResidualBlock(16, 32, 2), _ResidualBlock(32, 64, 2)
        )
        self.head = nn.Linear(64, NUM_CLASSES)

    def forward(self, x):
        h = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


def _hard_swish(x):
    return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


class _SeparableBlock(nn.Module):
    """Explicit zero padding, 3x3 depthwise conv, BN, hard-swish, 1x1 pointwise conv, BN, hard-swish."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.pad = nn.ZeroPad2d(1)
        self.depthwise = nn.Conv2d(cin, cin, 3, stride=stride, groups=cin, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)
        self.pointwise = nn.Conv2d(cin, cout, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)

    def forward(self, x):
        h = _hard_swish(self.bn1(self.depthwise(self.pad(x))))
        return _hard_swish(self.bn2(self.pointwise(h)))


class MobileNetDigits(nn.Module):
    """Padded stem conv (stride 2) and four depthwise-separable blocks on 1x32x32 images."""

    def __init__(self):
        super().__init__()
        self.stem_pad = nn.ZeroPad2d(1)
        self.stem = nn.Conv2d(1, 16, 3, stride=2, bias=False)
        self.stem_bn = nn.BatchNorm2d(16)
        self.blocks = nn.Sequential(
            _SeparableBlock(16, 32, 1),
            _SeparableBlock(32, 64, 2),
            _SeparableBlock(64, 64, 1),
            _SeparableBlock(64, 128, 2),
        )
        self.head = nn.Linear(128, NUM_CLASSES)

    def forward(self, x):
        h = _hard_swish(self.stem_bn(self.stem(self.stem_pad(x))))
        h = self.blocks(h)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))
