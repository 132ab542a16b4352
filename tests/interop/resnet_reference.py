"""PyTorch's ResNet-18 in torchvision's layout, for the parity test of
`train --model resnet18`.

build(stem, num_classes) returns torchvision.models.resnet18 when torchvision
is importable, otherwise the module below, which has torchvision's structure
and state_dict names exactly (conv1, bn1, relu, maxpool, layer1..layer4 of
BasicBlocks with conv1/bn1/conv2/bn2 and downsample.0/.1, avgpool, fc).
The "cifar" stem replaces conv1 by a 3x3/1 convolution with padding 1 and
maxpool by an identity (no parameters: the names do not change).
Initialisation is torchvision's: kaiming_normal_(fan_out, relu) convolutions,
batch norm weight 1 and bias 0, fc as nn.Linear's default.
"""
import torch.nn as nn

try:
    import torchvision
except ImportError:  # neither venv of this project ships it
    torchvision = None


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(64, 1)
        self.layer2 = self._make_layer(128, 2)
        self.layer3 = self._make_layer(256, 2)
        self.layer4 = self._make_layer(512, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers.append(BasicBlock(planes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x).flatten(1)
        return self.fc(x)


def build(stem, num_classes=10):
    """A fresh ResNet-18 drawn from torch's current RNG."""
    if torchvision is not None:
        model = torchvision.models.resnet18(num_classes=num_classes)
    else:
        model = ResNet18(num_classes)
    if stem == "cifar":
        model.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
        model.maxpool = nn.Identity()
    elif stem != "imagenet":
        raise ValueError("unknown stem %r" % stem)
    return model


def implementation():
    return "torchvision %s" % torchvision.__version__ if torchvision else \
        "the test's own module with torchvision's names (torchvision is not installed)"
