"""Distil a large teacher into a small student, then fine-tune it with per-sample weights."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def mlp(width: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))


def make_loader(n: int = 512) -> DataLoader:
    inputs = torch.randn(n, 64)
    labels = torch.randint(0, 10, (n,))
    weights = torch.rand(n)
    return DataLoader(TensorDataset(inputs, labels, weights), batch_size=64, shuffle=True)


def warmup_lr(step: int, base: float = 1e-3, warmup: int = 100) -> float:
    return base * min(1.0, (step + 1) / warmup)


def distill(teacher: nn.Module, student: nn.Module, loader: DataLoader, temperature: float = 4.0) -> None:
    teacher.eval()
    for step, (x, _, _) in enumerate(loader):
        # Bug (GL014): a new AdamW on every step to apply the warmup learning rate; its
        # moment estimates start from zero each time. Set param_groups' "lr" instead.
        optimizer = torch.optim.AdamW(student.parameters(), lr=warmup_lr(step))
        optimizer.zero_grad()
        with torch.no_grad():
            soft_targets = F.softmax(teacher(x) / temperature, dim=-1)
            # Bug (GL013): the student's forward pass slipped into the teacher's no_grad
            # block, so the loss below has no grad_fn and backward() raises.
            student_logits = student(x)
        log_probs = F.log_softmax(student_logits / temperature, dim=-1)
        loss = F.kl_div(log_probs, soft_targets, reduction="batchmean")
        loss.backward()
        optimizer.step()


def finetune_weighted(student: nn.Module, loader: DataLoader) -> None:
    # reduction="none" keeps one loss per sample, so each can be weighted.
    criterion = nn.CrossEntropyLoss(reduction="none")
    optimizer = torch.optim.SGD(student.parameters(), lr=0.01, momentum=0.9)
    for x, y, weight in loader:
        optimizer.zero_grad()
        loss = criterion(student(x), y) * weight
        # Bug (GL012): still one loss per sample; backward() needs a scalar (loss.mean()).
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    teacher, student = mlp(512), mlp(32)
    distill(teacher, student, make_loader())
    finetune_weighted(student, make_loader())
