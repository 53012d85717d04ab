"""Train a small text classifier with dropout, validating every few hundred steps."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class BagOfWords(nn.Module):
    def __init__(self, vocab: int = 5000, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, 128)
        self.dropout = nn.Dropout(0.5)
        self.out = nn.Linear(128, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(self.embed(tokens)))


def make_loader(n: int = 512) -> DataLoader:
    tokens = torch.randint(0, 5000, (n, 40))
    labels = torch.randint(0, 4, (n,))
    return DataLoader(TensorDataset(tokens, labels), batch_size=32, shuffle=True)


@torch.no_grad()
def validate(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    correct = sum((model(tokens).argmax(1) == labels).sum().item() for tokens, labels in loader)
    return correct / len(loader.dataset)


def train(epochs: int = 3, validate_every: int = 200) -> None:
    model = BagOfWords()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_loader, val_loader = make_loader(), make_loader(128)
    step = 0
    for epoch in range(epochs):
        model.train()
        for tokens, labels in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(model(tokens), labels).backward()
            optimizer.step()
            step += 1
            if step % validate_every == 0:
                # Bug (GL016): validate() leaves the model in eval mode; the rest of the
                # epoch trains without dropout, until model.train() at the next epoch.
                print(f"step {step}: accuracy {validate(model, val_loader):.3f}")


if __name__ == "__main__":
    train()
