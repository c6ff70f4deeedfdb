"""A train_one_epoch laid out as timm's train.py (AverageMeter, a prefetcher that normalizes on
the device with float32 mean and std made once, the loss read at log_interval and at the last
batch).
# corpus: correct
"""
import torch
from torch import nn

IMAGENET_DEFAULT_MEAN = (0.485, 0.456, 0.406)
IMAGENET_DEFAULT_STD = (0.229, 0.224, 0.225)


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n


class PrefetchLoader:
    def __init__(self, loader, device):
        self.loader = loader
        self.mean = torch.tensor([x for x in IMAGENET_DEFAULT_MEAN], device=device).view(1, 3, 1, 1)
        self.std = torch.tensor([x for x in IMAGENET_DEFAULT_STD], device=device).view(1, 3, 1, 1)
        self.device = device

    def __iter__(self):
        for x, y in self.loader:
            x = x.to(self.device, non_blocking=True)
            yield (x - self.mean) / self.std, y.to(self.device, non_blocking=True)


def train_one_epoch(model, loader, optimizer, loss_fn, losses_m, log_interval=4):
    model.train()
    last_idx = len(loader.loader) - 1
    for batch_idx, (input, target) in enumerate(loader):
        loss = loss_fn(model(input), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if batch_idx == last_idx or batch_idx % log_interval == 0:
            losses_m.update(loss.item(), input.size(0))


torch.manual_seed(0)
device = torch.device("tpu")
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(8, 5)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
loader = PrefetchLoader([(torch.rand(8, 3, 16, 16), torch.randint(0, 5, (8,))) for _ in range(8)], device)
losses_m = AverageMeter()
train_one_epoch(model, loader, optimizer, nn.CrossEntropyLoss(), losses_m)
print("loss", losses_m.sum / losses_m.count)
