"""Mixed-precision fine-tuning of a review model: a sentiment head, then a star-rating head.

Two bugs hide here. The clip runs on gradients that are still multiplied by the
GradScaler's scale (65536 at first), so every update is shrunk to almost nothing.
And the rating head is trained on rounded stars: `round()` has no gradient, so
backward() leaves the head's parameters without a gradient and it never learns.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.amp import GradScaler, autocast


class ReviewModel(nn.Module):
    def __init__(self, vocab_size=30_000, dim=256):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab_size, dim)
        self.encoder = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.LayerNorm(dim))
        self.sentiment = nn.Linear(dim, 2)
        self.rating = nn.Linear(dim, 1)

    def forward(self, tokens, offsets):
        features = self.encoder(self.embed(tokens, offsets))
        return self.sentiment(features), self.rating(features).squeeze(-1)


def finetune_sentiment(model, loader, optimizer, scaler, max_grad_norm=1.0):
    model.train()
    for tokens, offsets, labels, _stars in loader:
        optimizer.zero_grad(set_to_none=True)
        with autocast("cuda", dtype=torch.float16):
            logits, _ = model(tokens, offsets)
            loss = F.cross_entropy(logits, labels)
        scaler.scale(loss).backward()
        # Bug (GL007): scaler.unscale_(optimizer) must come first.
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()


def finetune_rating(model, loader, optimizer):
    model.train()
    for tokens, offsets, _labels, stars in loader:
        optimizer.zero_grad()
        _, rating = model(tokens, offsets)
        # Bug (GL006): reviews have whole stars, but rounding the prediction cuts the gradient.
        predicted_stars = rating.clamp(1, 5).round()
        loss = F.mse_loss(predicted_stars, stars.float())
        loss.backward()
        optimizer.step()


def main(train_loader, epochs=3):
    model = ReviewModel().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    scaler = GradScaler("cuda")
    for _ in range(epochs):
        finetune_sentiment(model, train_loader, optimizer, scaler)
        finetune_rating(model, train_loader, optimizer)
