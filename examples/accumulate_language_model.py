"""Train a tiny character language model with gradient accumulation over micro-batches."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class CharModel(nn.Module):
    def __init__(self, vocab: int = 64, width: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.rnn = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


def get_batch(batch_size: int = 8, length: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(0, 64, (batch_size, length + 1))
    return data[:, :-1], data[:, 1:]


def train(iterations: int = 100, accumulation_steps: int = 4) -> None:
    model = CharModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for _ in range(iterations):
        for micro_step in range(accumulation_steps):
            inputs, targets = get_batch()
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            # Bug (GL018): the loss is not divided by accumulation_steps, so each step
            # applies the sum of four micro-batches' gradients, four times too large.
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print(f"loss {loss.item():.4f}")


if __name__ == "__main__":
    train()
