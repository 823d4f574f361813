"""ResNet-18, ResNet-50 and MobileNetV2 (the standard torchvision architectures), written once over
a module namespace so the same code builds a PyTorch model (for ONNX export) and an express.nn
model with identical parameter names: `build(name, nn)` with `nn` = torch.nn or express.nn."""
from __future__ import annotations


def _classes(nn):
    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, inp, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(y)) + idt)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inp, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inp, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU()
            self.downsample = downsample

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + idt)

    class ResNet(nn.Module):
        def __init__(self, block, layers, num_classes=1000):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU()
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.layer1 = self._layer(block, 64, layers[0])
            self.layer2 = self._layer(block, 128, layers[1], 2)
            self.layer3 = self._layer(block, 256, layers[2], 2)
            self.layer4 = self._layer(block, 512, layers[3], 2)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512 * block.expansion, num_classes)

        def _layer(self, block, planes, n, stride=1):
            down = None
            if stride != 1 or self.inplanes != planes * block.expansion:
                down = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                     nn.BatchNorm2d(planes * block.expansion))
            blocks = [block(self.inplanes, planes, stride, down)]
            self.inplanes = planes * block.expansion
            blocks += [block(self.inplanes, planes) for _ in range(1, n)]
            return nn.Sequential(*blocks)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            x = self.avgpool(x)
            return self.fc(x.reshape(x.shape[0], -1))

    def conv_bn(inp, out, k=3, stride=1, groups=1):
        return nn.Sequential(nn.Conv2d(inp, out, k, stride, (k - 1) // 2, groups=groups, bias=False),
                             nn.BatchNorm2d(out), nn.ReLU6())

    class InvertedResidual(nn.Module):
        def __init__(self, inp, out, stride, expand):
            super().__init__()
            hidden = int(round(inp * expand))
            self.use_res = stride == 1 and inp == out
            layers = [conv_bn(inp, hidden, 1)] if expand != 1 else []
            layers += [conv_bn(hidden, hidden, 3, stride, hidden), nn.Conv2d(hidden, out, 1, bias=False),
                       nn.BatchNorm2d(out)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res else self.conv(x)

    class MobileNetV2(nn.Module):
        def __init__(self, num_classes=1000):
            super().__init__()
            cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                   (6, 320, 1, 1)]
            feats = [conv_bn(3, 32, 3, 2)]
            inp = 32
            for t, c, n, s in cfg:
                for i in range(n):
                    feats.append(InvertedResidual(inp, c, s if i == 0 else 1, t))
                    inp = c
            feats.append(conv_bn(inp, 1280, 1))
            self.features = nn.Sequential(*feats)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

        def forward(self, x):
            x = self.pool(self.features(x))
            return self.classifier(x.reshape(x.shape[0], -1))

    return {"resnet18": lambda: ResNet(BasicBlock, [2, 2, 2, 2]),
            "resnet50": lambda: ResNet(Bottleneck, [3, 4, 6, 3]),
            "mobilenet_v2": MobileNetV2}


def build(name: str, nn):
    return _classes(nn)[name]()
