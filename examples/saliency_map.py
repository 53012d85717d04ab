"""Saliency maps for a small classifier: which inputs and hidden units drive a prediction."""

import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))


def input_saliency(x: torch.Tensor, label: int) -> torch.Tensor:
    x = x.clone().requires_grad_(True)
    score = model(x)[:, label].sum()
    score.backward()
    return x.grad.abs()


def hidden_saliency(x: torch.Tensor, label: int) -> torch.Tensor:
    model.zero_grad()
    hidden = model[0](x)
    logits = model[2](model[1](hidden))
    logits[:, label].sum().backward()
    # Bug (GL015): retain_grad() after backward() does nothing: `hidden.grad` is None
    # below. It must come right after `hidden` is computed.
    hidden.retain_grad()
    return hidden.grad.abs().mean(0)


if __name__ == "__main__":
    batch = torch.randn(8, 20)
    print(input_saliency(batch, 0).mean(0))
    print(hidden_saliency(batch, 0))
