"""Planted: a classification loop laid out as torchvision's reference train.py (train_one_epoch,
a MetricLogger of SmoothedValues, non_blocking copies) that updates its logger with
loss.item() and acc.item() at every iteration: each read waits for the device.
Fix: keep the sums on the device and read them every print_freq iterations.
"""
import collections

import torch
from torch import nn


class SmoothedValue:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def update(self, value, n=1):
        self.total += value * n
        self.count += n

    @property
    def global_avg(self):
        return self.total / max(self.count, 1)


class MetricLogger:
    def __init__(self):
        self.meters = collections.defaultdict(SmoothedValue)

    def update(self, n=1, **kwargs):
        for k, v in kwargs.items():
            self.meters[k].update(v, n)


def accuracy(output, target):
    with torch.inference_mode():
        return (output.argmax(1) == target).float().mean() * 100


def train_one_epoch(model, criterion, optimizer, data, device, metric_logger):
    model.train()
    for image, target in data:
        image, target = image.to(device, non_blocking=True), target.to(device, non_blocking=True)
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        acc1 = accuracy(output, target)
        metric_logger.update(loss=loss.item(), acc1=acc1.item(), n=image.shape[0])  # EXPECT: implicit_sync


torch.manual_seed(0)
device = torch.device("tpu")
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(8, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
data = [(torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))) for _ in range(8)]
metric_logger = MetricLogger()
train_one_epoch(model, criterion, optimizer, data, device, metric_logger)
print("loss", metric_logger.meters["loss"].global_avg)
