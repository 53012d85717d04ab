"""Train a small image classifier with a validation pass after each epoch."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class ConvNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 7 * 7, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def make_loader(n: int = 256) -> DataLoader:
    images = torch.randn(n, 1, 28, 28)
    labels = torch.randint(0, 10, (n,))
    return DataLoader(TensorDataset(images, labels), batch_size=32, shuffle=True)


def train(epochs: int = 2) -> None:
    model = ConvNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = make_loader()
    for epoch in range(epochs):
        model.train()
        epoch_loss = 0.0
        for images, labels in loader:
            optimizer.zero_grad()
            logits = model(images)
            loss = criterion(logits, labels)
            loss.backward()
            optimizer.step()
            # Bug (GL001): `loss` carries its graph; every step's graph stays alive.
            epoch_loss += loss
        print(f"epoch {epoch}: loss {epoch_loss / len(loader):.4f}")


def finetune_head(model: ConvNet, loader: DataLoader) -> None:
    optimizer = torch.optim.Adam(model.fc.parameters(), lr=1e-3)
    # Bug (GL002): cleared once before the loop, so gradients pile up step after step.
    optimizer.zero_grad()
    for images, labels in loader:
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    train()
