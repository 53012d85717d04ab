"""Fine-tune a new classification head on a pretrained feature extractor kept frozen."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class FeatureExtractor(nn.Module):
    """Stands in for a pretrained backbone loaded from a checkpoint."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Classifier(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.backbone = FeatureExtractor()
        self.head = nn.Linear(128, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def make_loader(n: int = 512) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,))), batch_size=64, shuffle=True)


def finetune(model: Classifier, loader: DataLoader, epochs: int = 3) -> None:
    # Bug (GL022): this sets a plain attribute on the module; every parameter of the
    # backbone still requires grad and keeps training. Use requires_grad_(False).
    model.backbone.requires_grad = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    finetune(Classifier(), make_loader())
