"""A two-layer regression written with raw tensors and hand-written gradient descent."""

import torch

torch.manual_seed(0)
inputs = torch.randn(128, 16)
targets = torch.randn(128, 1)

w_hidden = torch.randn(16, 32, requires_grad=True)
w_out = torch.randn(32, 1, requires_grad=True)
learning_rate = 1e-3

for iteration in range(200):
    prediction = inputs.mm(w_hidden).clamp(min=0).mm(w_out)
    loss = (prediction - targets).pow(2).mean()

    # Bug (GL021): on the first iteration nothing has been backpropagated yet, so
    # `weight.grad` is None and this raises AttributeError. Zero the gradients
    # after the update instead (or set them to None).
    for weight in (w_hidden, w_out):
        weight.grad.zero_()

    loss.backward()
    with torch.no_grad():
        w_hidden -= learning_rate * w_hidden.grad
        w_out -= learning_rate * w_out.grad

    if iteration % 50 == 0:
        print(iteration, loss.item())
