"""Evaluating a text classifier and probing which token positions matter.

Two bugs: the validation loop runs the model with autograd on (GL009: every batch
records a graph that is never used, so evaluation needs far more memory than it
should), and the probe asks for gradients on integer token positions (GL010:
`torch.arange` of ints is int64, which raises "Only Tensors of floating point and
complex dtype can require gradients").
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, DIM, CLASSES = 1000, 64, 4
LENGTH = 32


class BagOfEmbeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.position = nn.Embedding(LENGTH, DIM)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, tokens, positions):
        return self.head((self.embed(tokens) + self.position(positions)).mean(dim=1))


model = BagOfEmbeddings()
val_loader = DataLoader(
    TensorDataset(torch.randint(0, VOCAB, (256, LENGTH)), torch.randint(0, CLASSES, (256,))), batch_size=32
)


def validate() -> float:
    model.eval()
    positions = torch.arange(LENGTH)
    correct = 0
    for tokens, labels in val_loader:
        logits = model(tokens, positions.expand_as(tokens))  # needs torch.no_grad()
        correct += (logits.argmax(dim=1) == labels).sum().item()
    return correct / len(val_loader.dataset)


def position_importance(tokens, label: int):
    positions = torch.arange(LENGTH, requires_grad=True)  # int64: cannot require grad
    score = model(tokens.unsqueeze(0), positions.unsqueeze(0))[0, label]
    score.backward()
    return positions.grad


if __name__ == "__main__":
    print(f"validation accuracy: {validate():.3f}")
    print(position_importance(torch.randint(0, VOCAB, (LENGTH,)), label=0))
