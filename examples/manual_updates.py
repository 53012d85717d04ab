"""Training from scratch: softmax regression with hand-written SGD and a tiny character RNN."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class SoftmaxRegression:
    """No nn.Module: the parameters are plain tensors that require grad."""

    def __init__(self, n_features: int, n_classes: int) -> None:
        self.weight = torch.randn(n_features, n_classes) * 0.01
        self.weight.requires_grad_()
        self.bias = torch.zeros(n_classes, requires_grad=True)

    def parameters(self) -> list[torch.Tensor]:
        return [self.weight, self.bias]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


def train_softmax(model: SoftmaxRegression, batches: list, lr: float = 0.1) -> None:
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        for p in model.parameters():
            # Bug (GL003): an in-place update of a leaf outside torch.no_grad() raises.
            p -= lr * p.grad
            p.grad = None


class CharRNN(nn.Module):
    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.input_to_hidden = nn.Linear(hidden, hidden)
        self.hidden_to_hidden = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor, h: torch.Tensor, done: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = []
        for t in range(tokens.size(1)):
            h = torch.tanh(self.input_to_hidden(self.embed(tokens[:, t])) + self.hidden_to_hidden(h))
            # Bug (GL004): tanh saved `h` for backward; zeroing rows in place breaks it.
            h[done[:, t]] = 0.0
            outputs.append(self.head(h))
        return torch.stack(outputs, 1), h


def train_rnn(model: CharRNN, chunks: list, hidden: int = 64) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    h = torch.zeros(chunks[0][0].size(0), hidden)
    for tokens, targets, done in chunks:
        optimizer.zero_grad()
        logits, h = model(tokens, h, done)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        # Bug (GL005): retain_graph=True hides the undetached hidden state `h`;
        # every chunk's graph stays alive. Use `h = h.detach()` and drop the flag.
        loss.backward(retain_graph=True)
        optimizer.step()


if __name__ == "__main__":
    torch.manual_seed(0)
    data = [(torch.randn(32, 20), torch.randint(0, 5, (32,))) for _ in range(10)]
    train_softmax(SoftmaxRegression(20, 5), data)
    text = [(torch.randint(0, 30, (8, 16)), torch.randint(0, 30, (8, 16)), torch.rand(8, 16) < 0.05) for _ in range(5)]
    train_rnn(CharRNN(30, 64), text)
