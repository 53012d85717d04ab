"""Deep Q-learning on a toy environment, with a target network synced every few hundred steps."""

import copy
import random

import torch
import torch.nn as nn
import torch.nn.functional as F


class QNetwork(nn.Module):
    def __init__(self, obs_dim: int = 4, n_actions: int = 2) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, n_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.layers(obs)


def sample_batch(buffer: list[tuple[torch.Tensor, ...]], size: int = 32) -> list[torch.Tensor]:
    return [torch.stack(column) for column in zip(*random.sample(buffer, size))]


def train(buffer: list[tuple[torch.Tensor, ...]], steps: int = 1000, gamma: float = 0.99) -> None:
    q_net = QNetwork()
    target_net = copy.deepcopy(q_net)
    optimizer = torch.optim.Adam(q_net.parameters(), lr=1e-3)
    for step in range(steps):
        states, actions, rewards, next_states, dones = sample_batch(buffer)
        q_values = q_net(states).gather(1, actions.unsqueeze(1)).squeeze(1)
        next_q = target_net(next_states).max(dim=1).values
        # Bug (GL017): the target keeps target_net's graph, so backward also runs into
        # the target network instead of holding the target fixed. Compute next_q under
        # torch.no_grad() (or call .detach() on it).
        targets = rewards + gamma * next_q * (1.0 - dones)
        loss = F.smooth_l1_loss(q_values, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 250 == 0:
            target_net.load_state_dict(q_net.state_dict())


if __name__ == "__main__":
    transitions = [
        (torch.randn(4), torch.randint(0, 2, ()), torch.randn(()), torch.randn(4), torch.zeros(()))
        for _ in range(256)
    ]
    train(transitions, steps=10)
