"""A variational autoencoder for 28x28 images, with the KL weight warmed up over the first epochs.

One bug hides here. The KL divergence is turned into a Python number with `.item()`
so that it can be logged, and that number is what goes into the loss. The loss value
(and the logged curve) looks right, but the KL term has no gradient any more: the
encoder is never pulled towards the prior, and sampling from N(0, I) gives garbage.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class VAE(nn.Module):
    def __init__(self, latent_dim=16):
        super().__init__()
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(784, 400), nn.ReLU())
        self.mu = nn.Linear(400, latent_dim)
        self.logvar = nn.Linear(400, latent_dim)
        self.decoder = nn.Sequential(nn.Linear(latent_dim, 400), nn.ReLU(), nn.Linear(400, 784))

    def forward(self, x):
        hidden = self.encoder(x)
        mu, logvar = self.mu(hidden), self.logvar(hidden)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.decoder(z).view_as(x), mu, logvar


def train(model, loader, optimizer, epochs=20, warmup_epochs=5):
    history = []
    for epoch in range(epochs):
        beta = min(1.0, (epoch + 1) / warmup_epochs)
        model.train()
        for images, _ in loader:
            optimizer.zero_grad()
            logits, mu, logvar = model(images)
            recon = F.binary_cross_entropy_with_logits(logits, images, reduction="sum") / images.size(0)
            # Bug: .item() turns the KL term into a float; keep the tensor and log kl.item() instead.
            kl = (-0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp()) / images.size(0)).item()
            loss = recon + beta * kl
            loss.backward()
            optimizer.step()
            history.append((recon.item(), kl))
    return history


if __name__ == "__main__":
    vae = VAE()
    data = [(torch.rand(32, 1, 28, 28), torch.zeros(32)) for _ in range(4)]
    train(vae, data, torch.optim.Adam(vae.parameters(), lr=1e-3), epochs=2)
