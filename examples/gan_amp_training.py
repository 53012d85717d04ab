"""Mixed-precision GAN training on MNIST-sized images.

Two bugs: the generator's output reaches the discriminator step without `.detach()`,
so the generator step backpropagates through a graph the discriminator step already
freed (GL008, a RuntimeError on the first batch); and the discriminator's optimizer is
stepped by its GradScaler and then once more by hand (GL011, every update applied twice).
"""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

LATENT = 64
device = "cuda" if torch.cuda.is_available() else "cpu"

generator = nn.Sequential(nn.Linear(LATENT, 256), nn.ReLU(), nn.Linear(256, 784), nn.Tanh()).to(device)
discriminator = nn.Sequential(nn.Linear(784, 256), nn.LeakyReLU(0.2), nn.Linear(256, 1)).to(device)
adversarial_loss = nn.BCEWithLogitsLoss()
opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))
scaler_g = torch.amp.GradScaler(device)
scaler_d = torch.amp.GradScaler(device)
loader = DataLoader(TensorDataset(torch.rand(1024, 784) * 2 - 1), batch_size=64, shuffle=True)


def train(epochs: int) -> None:
    for epoch in range(epochs):
        for (real,) in loader:
            real = real.to(device)
            valid = torch.ones(real.size(0), 1, device=device)
            fake_label = torch.zeros(real.size(0), 1, device=device)
            fake = generator(torch.randn(real.size(0), LATENT, device=device))

            opt_d.zero_grad()
            with torch.autocast(device):
                d_loss = adversarial_loss(discriminator(real), valid) + adversarial_loss(
                    discriminator(fake), fake_label  # should be discriminator(fake.detach())
                )
            scaler_d.scale(d_loss).backward()
            scaler_d.step(opt_d)
            opt_d.step()  # scaler_d.step(opt_d) has already stepped
            scaler_d.update()

            opt_g.zero_grad()
            with torch.autocast(device):
                g_loss = adversarial_loss(discriminator(fake), valid)
            scaler_g.scale(g_loss).backward()
            scaler_g.step(opt_g)
            scaler_g.update()
        print(f"epoch {epoch}: d_loss {d_loss.item():.3f} g_loss {g_loss.item():.3f}")


if __name__ == "__main__":
    train(epochs=5)
