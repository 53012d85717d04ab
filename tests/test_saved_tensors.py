"""The saved-for-backward tables of analysis/facts/graphs.py, checked against torch itself."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest

from gradlint import Config, lint_source
from gradlint.analysis.facts.graphs import (
    OUTPUT_SAVING_IN_PLACE,
    OUTPUT_SAVING_MODULES,
    SAVES_INPUT,
    SAVES_OUTPUT,
    WEIGHT_INPUT_LAYERS,
)

torch = pytest.importorskip("torch")
functional = torch.nn.functional

# Arguments beyond the tensor for the functions that need them.
EXTRA: dict[str, Callable[[Any], tuple[Any, ...]]] = {
    "softmax": lambda x: (-1,),
    "log_softmax": lambda x: (-1,),
    "pow": lambda x: (3,),
    "clamp": lambda x: (0.5, 2.5),
    "clip": lambda x: (0.5, 2.5),
    "layer_norm": lambda x: ((4,),),
    "group_norm": lambda x: (2,),
    "batch_norm": lambda x: (None, None, None, None, True),
    "add": lambda x: (1,),
    "mul": lambda x: (2,),
    "linear": lambda x: (torch.randn(2, 4, requires_grad=True),),
    "conv1d": lambda x: (torch.randn(2, 3, 2, requires_grad=True),),
    "conv2d": lambda x: (torch.randn(2, 3, 2, 2, requires_grad=True),),
    "conv3d": lambda x: (torch.randn(2, 3, 2, 2, 2, requires_grad=True),),
    "cumprod": lambda x: (-1,),
    "gather": lambda x: (1, torch.zeros(x.shape[0], 1, dtype=torch.long)),
    "cdist": lambda x: (torch.rand(5, 4, requires_grad=True),),
    "logsumexp": lambda x: (-1,),
    "softmin": lambda x: (-1,),
}
SHAPES = {"conv1d": (2, 3, 4), "conv2d": (2, 3, 4, 4), "conv3d": (2, 3, 4, 4, 4), "group_norm": (2, 4, 3)}


def _function(name: str) -> Callable[..., Any]:
    for namespace in (functional, torch):
        if hasattr(namespace, name):
            return getattr(namespace, name)  # type: ignore[no-any-return]  # torch functions are untyped here
    raise AssertionError(f"torch has no function {name}")


def _modify_then_backward(name: str, modify_output: bool) -> bool:
    """Whether changing the output (or input) of `name` in place makes backward raise."""
    leaf = torch.rand(*SHAPES.get(name, (3, 4)), requires_grad=True)
    value = leaf * 1.0 + 1.5  # positive, away from clamp bounds and kinks; not a leaf
    result = _function(name)(value, *EXTRA.get(name, lambda x: ())(value))
    if isinstance(result, tuple):
        result = result[0]
    (result if modify_output else value).add_(1)
    try:
        result.sum().backward()
    except RuntimeError as error:
        return "inplace operation" in str(error)
    return False


@pytest.mark.parametrize("name", sorted(name for name in SAVES_OUTPUT if not name.endswith("_")))
def test_changing_the_output_breaks_backward(name: str) -> None:
    assert _modify_then_backward(name, modify_output=True)


@pytest.mark.parametrize("name", sorted(SAVES_INPUT))
def test_changing_the_input_breaks_backward(name: str) -> None:
    assert _modify_then_backward(name, modify_output=False)


@pytest.mark.parametrize("name", ["add", "mul", "sum", "neg", "flatten"])
def test_ops_left_out_save_nothing(name: str) -> None:
    assert name not in SAVES_OUTPUT | SAVES_INPUT
    assert not _modify_then_backward(name, modify_output=True)
    assert not _modify_then_backward(name, modify_output=False)


EXTREMES_WRITTEN: list[tuple[str, Callable[[Any, Any], Any], bool]] = [
    ("torch.max(value)", lambda value, other: torch.max(value), True),
    ("value.min()", lambda value, other: value.min(), True),
    ("torch.max(value, dim=-1)[0]", lambda value, other: torch.max(value, dim=-1)[0], False),
    ("torch.min(value, 1)[0]", lambda value, other: torch.min(value, 1)[0], False),
    ("value.max(1)[0]", lambda value, other: value.max(1)[0], False),
    ("value.max(dim=0).values", lambda value, other: value.max(dim=0).values, False),
    ("torch.max(value, other)", lambda value, other: torch.max(value, other), True),
]


@pytest.mark.parametrize(("written", "compute", "saves"), EXTREMES_WRITTEN, ids=[row[0] for row in EXTREMES_WRITTEN])
def test_extremes_save_their_input_only_without_a_dimension(
    written: str, compute: Callable[[Any, Any], Any], saves: bool
) -> None:
    """What `graphs.EXTREMES` encodes, by torch and by GL004: along a dimension max/min keep only the indices."""
    leaf = torch.rand(3, 4, requires_grad=True)
    value = leaf * 1.0
    result = compute(value, leaf * 0.5)
    value.add_(1)
    with pytest.raises(RuntimeError) if saves else nullcontext():
        result.sum().backward()
    source = (
        "import torch\n\n\ndef step(opt):\n    leaf = torch.rand(3, 4, requires_grad=True)\n"
        "    value = leaf * 1.0\n    other = leaf * 0.5\n"
        f"    result = {written}\n    value += 1\n    result.sum().backward()\n    opt.step()\n"
    )
    found = {d.code for d in lint_source(source, "extremes.py", Config(select=("GL004",)))}
    assert ("GL004" in found) is saves


def _sequential_raises(*layers: Any) -> bool:
    """Whether backward through `nn.Sequential(nn.Linear(4, 4), *layers)` raises for an in-place change."""
    block = torch.nn.Sequential(torch.nn.Linear(4, 4), *layers)
    try:
        block(torch.randn(3, 4)).sum().backward()
    except RuntimeError as error:
        return "inplace operation" in str(error)
    return False


IN_PLACE_ARGUMENTS = {"LeakyReLU": (0.2, True), "ELU": (1.0, True), "SELU": (True,), "CELU": (1.0, True)}


@pytest.mark.parametrize("name", sorted(OUTPUT_SAVING_MODULES | OUTPUT_SAVING_IN_PLACE))
def test_an_in_place_layer_after_an_output_saving_layer_breaks_backward(name: str) -> None:
    """What `graphs.OUTPUT_SAVING_MODULES` and `OUTPUT_SAVING_IN_PLACE` encode, by torch."""
    arguments = IN_PLACE_ARGUMENTS.get(name, (0.1, 0.3, True)) if name in OUTPUT_SAVING_IN_PLACE else ()
    if name in ("Softmax", "LogSoftmax"):
        arguments = (-1,)
    layer = getattr(torch.nn, name)(*arguments)
    assert _sequential_raises(layer, torch.nn.Dropout(inplace=True))


@pytest.mark.parametrize("name", ["GELU", "LeakyReLU", "ELU", "Hardtanh", "Dropout"])
def test_layers_built_out_of_place_keep_nothing_an_in_place_layer_overwrites(name: str) -> None:
    """Built out of place, these keep their input (or a mask): the in-place layer after them breaks nothing."""
    assert name not in OUTPUT_SAVING_MODULES
    assert not _sequential_raises(getattr(torch.nn, name)(), torch.nn.Dropout(inplace=True))


LAYER_ARGUMENTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "Linear": ((3, 4), (4, 4)),
    "Bilinear": ((3, 4), (4, 4, 4)),
    "Conv1d": ((2, 4, 5), (4, 4, 3)),
    "Conv2d": ((2, 4, 5, 5), (4, 4, 3)),
    "Conv3d": ((2, 4, 5, 5, 5), (4, 4, 3)),
    "ConvTranspose1d": ((2, 4, 5), (4, 4, 3)),
    "ConvTranspose2d": ((2, 4, 5, 5), (4, 4, 3)),
    "ConvTranspose3d": ((2, 4, 5, 5, 5), (4, 4, 3)),
}


@pytest.mark.parametrize("name", sorted(WEIGHT_INPUT_LAYERS))
def test_a_layer_with_weights_keeps_an_input_that_requires_no_grad(name: str) -> None:
    shape, arguments = LAYER_ARGUMENTS[name]
    layer = getattr(torch.nn, name)(*arguments)
    batch = torch.rand(*shape)  # requires no grad: only the layer's weight does
    out = layer(batch, batch) if name == "Bilinear" else layer(batch)
    batch.add_(1)
    with pytest.raises(RuntimeError, match="inplace operation"):
        out.sum().backward()


def test_changing_a_layers_input_after_it_ran_is_reported_without_knowing_the_input() -> None:
    source = (
        "import torch.nn as nn\n"
        "\n"
        "class Encoder(nn.Module):\n"
        "    def __init__(self, dim):\n"
        "        super().__init__()\n"
        "        self.pos_conv = nn.Conv1d(dim, dim, 3, padding=1)\n"
        "        self.pos_conv = nn.Sequential(nn.utils.weight_norm(self.pos_conv, dim=2), nn.GELU())\n"
        "\n"
        "    def forward(self, x):\n"
        "        x_conv = self.pos_conv(x)\n"
        "        x += x_conv\n"
        "        return x\n"
    )
    found = [(d.line, d.code) for d in lint_source(source, "encoder.py", Config(preview=True))]
    assert (11, "GL004") in found
    dropout = source.replace("nn.Conv1d(dim, dim, 3, padding=1)", "nn.Dropout(0.1)").replace(
        "nn.Sequential(nn.utils.weight_norm(self.pos_conv, dim=2), nn.GELU())", "nn.Dropout(0.1)"
    )
    assert not [d for d in lint_source(dropout, "encoder.py", Config(preview=True)) if d.code == "GL004"]


def test_a_split_on_one_path_is_enough_to_raise() -> None:
    """`q` bound by a split in one arm and by a projection in the other: the split's arm raises when `q` (a view
    of a view of the split) is scaled in place, so the finding holds on that path; with no split on any path the
    same change is fine."""
    source = (
        "import torch.nn as nn\n"
        "\n"
        "class Attention(nn.Module):\n"
        "    def __init__(self, dim, self_attn):\n"
        "        super().__init__()\n"
        "        self.self_attn = self_attn\n"
        "        self.in_proj = nn.Linear(dim, 3 * dim)\n"
        "        self.q_proj = nn.Linear(dim, dim)\n"
        "        self.dim = dim\n"
        "\n"
        "    def forward(self, x):\n"
        "        if self.self_attn:\n"
        "            q, k, v = self.in_proj(x).split(self.dim, dim=-1)\n"
        "        else:\n"
        "            q = k = v = self.q_proj(x)\n"
        "        q = q.transpose(1, 2)\n"
        "        q.mul_(0.5)\n"
        "        return q.sum() + k.sum() + v.sum()\n"
    )
    found = [(d.line, d.code) for d in lint_source(source, "attention.py", Config(select=("GL004",)))]
    assert found == [(17, "GL004")]
    namespace: dict[str, Any] = {}
    exec(compile(source, "attention.py", "exec"), namespace)
    x = torch.randn(2, 3, 8)
    with pytest.raises(RuntimeError, match="returns multiple views"):
        namespace["Attention"](8, self_attn=True)(x).backward()
    namespace["Attention"](8, self_attn=False)(x).backward()
    projected = source.replace("q, k, v = self.in_proj(x).split(self.dim, dim=-1)", "q = k = v = self.in_proj(x)")
    assert not lint_source(projected, "attention.py", Config(select=("GL004",)))
