"""Latent inversion: find the code a small generator maps to a given image."""

import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
generator = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 784)).to(device)
generator.requires_grad_(False)


def invert(target: torch.Tensor, steps: int = 200) -> torch.Tensor:
    # Bug (GL020): `.to(device)` copies the leaf on a GPU, and Adam then raises "can't
    # optimize a non-leaf Tensor" (on a CPU-only machine it runs). Make the code on the
    # device: torch.randn(..., device=device, requires_grad=True).
    code = torch.randn(target.shape[0], 16, requires_grad=True).to(device)
    optimizer = torch.optim.Adam([code], lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(generator(code), target)
        loss.backward()
        optimizer.step()
    return code.detach()


if __name__ == "__main__":
    images = torch.rand(4, 784, device=device)
    print(invert(images).norm(dim=1))
