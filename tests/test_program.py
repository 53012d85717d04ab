"""The whole-program model: summaries, classes as units, imports across files, ordering across calls.

Each test writes a small project of several modules and asks what gradlint sees: the
events of a training step (`analysis_of`) or the findings of `lint_paths`, which lints
every file with the model of the project.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from gradlint import Config, lint_paths
from gradlint.analysis import ModuleAnalysis, Role, analyze
from gradlint.analysis.project.summaries import from_data, to_data
from gradlint.checking import module_program, parse, summarize_module
from gradlint.engine import whole_program
from gradlint.index import Ref, outline

ENGINE = """\
    import torch.nn.functional as F


    def train_step(model, optimizer, batch):
        inputs, targets = batch
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()
"""
LOOP = """\
    import torch
    from engine import train_step


    def fit(model, loader):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for batch in loader:
            train_step(model, optimizer, batch)
"""


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def analysis_of(root: Path, name: str) -> ModuleAnalysis:
    """The analysis of one module of the project under `root`, with the whole-program model."""
    path = root / name
    program = whole_program([path])
    return analyze(parse(path.read_text()), frozenset(), module_program(program, str(path)))


def step_events(analysis: ModuleAnalysis, index: int = 0) -> list[tuple[str, str | None, str | None]]:
    """(kind, target, via) of every event of the module's first (or `index`th) training step."""
    step = analysis.training_steps[index]
    return [(event.kind.value, event.target, event.via) for event in step.events]


def codes(root: Path) -> set[tuple[str, int, str]]:
    return {(Path(d.path).relative_to(root).as_posix(), d.line, d.code) for d in lint_paths([root], Config(), jobs=1)}


# 1. Function summaries


def test_a_summary_names_its_effects_by_port_and_survives_serialization() -> None:
    summary = summarize_module(
        textwrap.dedent("""\
            import torch

            def update(model, optimizer, loss, scaler=None):
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if scaler is not None:
                    scaler.step(optimizer)
                else:
                    optimizer.step()
                return loss.detach()
        """)
    )
    assert summary is not None
    function = summary.functions["update"]
    assert function.params == ("model", "optimizer", "loss", "scaler")
    assert function.defaults_off == (("scaler", True),)
    assert [(effect.kind, effect.port, effect.needs) for effect in function.effects] == [
        ("clear", "optimizer", ()),
        ("backward", "loss", ()),
        ("clip", None, ()),
        ("step", "optimizer", ("scaler",)),
        ("step", "optimizer", ()),
    ]
    assert not function.returns_grad
    assert from_data(to_data(summary)) == summary


def test_a_call_binds_arguments_by_position_and_keyword(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "engine.py": ENGINE,
            "train.py": LOOP.replace(
                "train_step(model, optimizer, batch)", "train_step(model, batch=batch, optimizer=optimizer)"
            ),
        },
    )
    assert step_events(analysis_of(tmp_path, "train.py")) == [
        ("backward", None, "engine.train_step"),
        ("step", "optimizer", "engine.train_step"),
    ]


def test_one_optimizer_given_as_two_parameters_steps_twice(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "gan.py": """\
                def update(g_opt, d_opt):
                    g_opt.step()
                    d_opt.step()
            """,
            "train.py": """\
                import torch
                from gan import update

                def fit(model, loader):
                    opt = torch.optim.Adam(model.parameters())
                    for batch in loader:
                        opt.zero_grad()
                        model(batch).sum().backward()
                        update(opt, opt)
            """,
        },
    )
    events = step_events(analysis_of(tmp_path, "train.py"))
    assert [event for event in events if event[0] == "step"] == [("step", "opt", "gan.update")] * 2


def test_a_step_on_a_parameter_counts_only_when_the_caller_gives_an_optimizer(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "helpers.py": """\
                def advance(thing):
                    thing.step()
            """,
            "train.py": """\
                import torch
                from helpers import advance

                def fit(model, loader):
                    optimizer = torch.optim.Adam(model.parameters())
                    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 10)
                    for batch in loader:
                        optimizer.zero_grad()
                        model(batch).sum().backward()
                        advance(optimizer)
                        advance(scheduler)
            """,
        },
    )
    events = step_events(analysis_of(tmp_path, "train.py"))
    assert [event for event in events if event[0] == "step"] == [("step", "optimizer", "helpers.advance")]


def test_an_optional_argument_left_out_switches_its_effects_off(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "steps.py": """\
                def run_batch(model, batch, optimizer=None, backward=True):
                    loss = model(batch).sum()
                    if optimizer is None:
                        return loss.item()
                    if backward:
                        loss.backward()
                    optimizer.step()
                    return loss.item()
            """,
            "evaluate.py": """\
                import torch
                from steps import run_batch

                def evaluate(model, loader, optimizer):
                    with torch.no_grad():
                        for batch in loader:
                            run_batch(model, batch)
                            run_batch(model, batch, optimizer, backward=False)
                            run_batch(model, batch, None)
            """,
        },
    )
    analysis = analysis_of(tmp_path, "evaluate.py")
    kinds = [e.kind.value for f in analysis.collected.functions for e in analysis.events.scope_events(f)]
    assert kinds == ["step"]  # only the second call steps, and it does not backpropagate
    assert codes(tmp_path) == set()


def test_recursive_calls_reach_a_fixed_point(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "walk.py": """\
                def visit(node, optimizer):
                    for child in node.children:
                        descend(child, optimizer)
                    node.loss.backward()

                def descend(node, optimizer):
                    visit(node, optimizer)
                    optimizer.step()
            """,
            "train.py": """\
                import torch
                from walk import descend

                def fit(tree, model, trees):
                    optimizer = torch.optim.Adam(model.parameters())
                    for tree in trees:
                        descend(tree, optimizer)
            """,
        },
    )
    events = step_events(analysis_of(tmp_path, "train.py"))
    assert {kind for kind, _, _ in events} == {"backward", "step"}
    assert ("step", "optimizer", "walk.descend") in events


# 2. Classes as units


def test_a_method_is_found_through_a_base_class_in_another_module(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "base.py": """\
                import torch

                class BaseTrainer:
                    def __init__(self, model):
                        self.model = model
                        self.optimizer = torch.optim.Adam(model.parameters())

                    def update(self, loss):
                        loss.backward()
                        self.optimizer.step()
            """,
            "trainer.py": """\
                from base import BaseTrainer

                class Trainer(BaseTrainer):
                    def fit(self, loader):
                        for batch in loader:
                            self.update(self.model(batch).sum())

                class Subclassed(Trainer):
                    def training_step(self, batch):
                        return super().update(self.model(batch).sum())
            """,
        },
    )
    analysis = analysis_of(tmp_path, "trainer.py")
    expected = [("backward", None, "base.BaseTrainer.update"), ("step", "self.optimizer", "base.BaseTrainer.update")]
    # `self.update(...)` in the loop; `super().update(...)` runs once per call, in a scope with no event of its own.
    assert len(analysis.training_steps) == 1
    assert step_events(analysis) == expected
    assert codes(tmp_path) == {("trainer.py", 6, "GL002"), ("base.py", 9, "GL002")}


def test_a_method_only_base_classes_call_runs_in_the_grad_mode_they_call_it_in(tmp_path: Path) -> None:
    """hanlp's shape (draw 11): `predict` run only by a base class's `@torch.no_grad()` `__call__`, through `super()`
    from another module; a pipeline base that runs `self.forward` inside `with torch.no_grad():`."""
    write(
        tmp_path,
        {
            "components.py": """\
                import torch


                class Component:
                    def __call__(self, *args, **kwargs):
                        return self.predict(*args, **kwargs)

                    def predict(self, data):
                        raise NotImplementedError


                class TorchComponent(Component):
                    @torch.no_grad()
                    def __call__(self, *args, **kwargs):
                        return super().__call__(*args, **kwargs)


                class Pipeline:
                    def __call__(self, inputs):
                        with torch.no_grad():
                            return self.forward(inputs)

                    def forward(self, inputs):
                        raise NotImplementedError
            """,
            "tasks.py": """\
                from components import Component, Pipeline, TorchComponent


                class Classifier(TorchComponent):
                    def __init__(self, model, loader):
                        self.model = model
                        self.loader = loader

                    def predict(self, data):
                        self.model.eval()
                        labels = []
                        for batch in self.loader(data):
                            labels.append(self.model(batch).argmax(-1))
                        return labels


                class Tagger(Component):
                    def __init__(self, model, loader):
                        self.model = model
                        self.loader = loader

                    def predict(self, data):
                        self.model.eval()
                        tags = []
                        for batch in self.loader(data):
                            tags.append(self.model(batch).argmax(-1))
                        return tags


                class DepthPipeline(Pipeline):
                    def __init__(self, model, loader):
                        self.model = model
                        self.loader = loader

                    def forward(self, inputs):
                        self.model.eval()
                        depths = []
                        for batch in self.loader(inputs):
                            depths.append(self.model(batch))
                        return depths
            """,
        },
    )
    preview = Config(preview=True)
    alone = {d.line for d in lint_paths([tmp_path / "tasks.py"], preview, jobs=1) if d.code == "GL009"}
    whole = {d.line for d in lint_paths([tmp_path], preview, jobs=1) if d.code == "GL009"}
    assert whole == {26}  # Tagger: Component.__call__ runs `self.predict` with autograd on
    assert alone == whole  # linted alone, the file's own project is still read
    outlined = whole_program([tmp_path / "tasks.py"]).outlines
    assert outlined.hierarchy_without_grad("tasks", "Classifier", "predict") is True
    assert outlined.hierarchy_without_grad("tasks", "Tagger", "predict") is False
    assert outlined.hierarchy_without_grad("tasks", "DepthPipeline", "forward") is True
    assert outlined.hierarchy_without_grad("tasks", "Classifier", "fit") is None  # nobody calls it


def test_an_instance_of_a_project_class_runs_its_methods(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "weighting.py": """\
                import torch

                class Weighting:
                    def __init__(self, params):
                        self.params = list(params)

                    def backward(self, loss):
                        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                        loss.backward()
            """,
            "train.py": """\
                import torch
                from weighting import Weighting

                def fit(model, loader):
                    optimizer = torch.optim.Adam(model.parameters())
                    weighting = Weighting(model.parameters())
                    for batch in loader:
                        optimizer.zero_grad()
                        weighting.backward(model(batch).sum())
                        optimizer.step()
            """,
        },
    )
    # Ordering across calls: the clip and the backward happen at the call, in the helper's order.
    assert step_events(analysis_of(tmp_path, "train.py")) == [
        ("clear", "optimizer", None),
        ("clip", None, "weighting.Weighting.backward"),
        ("backward", None, "weighting.Weighting.backward"),
        ("step", "optimizer", None),
    ]
    # The helper clips before its own backward: reported there too, and at the call of the step.
    assert codes(tmp_path) == {("train.py", 9, "GL007"), ("weighting.py", 8, "GL007")}


# 3. Across files


@pytest.mark.parametrize(
    ("files", "script"),
    [
        ({"pkg/__init__.py": "", "pkg/engine.py": ENGINE}, "from pkg.engine import train_step"),
        ({"pkg/__init__.py": "", "pkg/engine.py": ENGINE}, "import pkg.engine as engine"),
        (
            {"pkg/__init__.py": "from .engine import train_step\n", "pkg/engine.py": ENGINE},
            "from pkg import train_step",
        ),
        ({"pkg/__init__.py": "from .core import *\n", "pkg/core.py": ENGINE}, "from pkg import train_step"),
        (
            {
                "pkg/__init__.py": "from pkg.inner import *\n",
                "pkg/inner/__init__.py": "from .core import train_step\n",
                "pkg/inner/core.py": ENGINE,
            },
            "from pkg import train_step",
        ),
        ({"src/pkg/__init__.py": "", "src/pkg/engine.py": ENGINE}, "from pkg.engine import train_step"),
    ],
    ids=["absolute", "module alias", "re-export", "star", "re-export chain", "src layout"],
)
def test_imports_resolve_to_the_function_across_files(tmp_path: Path, files: dict[str, str], script: str) -> None:
    call = (
        "engine.train_step(model, optimizer, batch)" if "as engine" in script else "train_step(model, optimizer, batch)"
    )
    write(
        tmp_path,
        {
            **files,
            "train.py": LOOP.replace("from engine import train_step", script).replace(
                "train_step(model, optimizer, batch)", call
            ),
        },
    )
    assert {(path, code) for path, _, code in codes(tmp_path)} == {("train.py", "GL002")}


def test_relative_imports_resolve_inside_a_package(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "app/__init__.py": "",
            "app/training/__init__.py": "",
            "app/training/engine.py": ENGINE,
            "app/training/loop.py": LOOP.replace("from engine import", "from .engine import"),
            "app/cli.py": LOOP.replace("from engine import", "from .training.engine import"),
            "app/training/deep.py": LOOP.replace("from engine import", "from ..training.engine import"),
        },
    )
    assert {path for path, _, _ in codes(tmp_path)} == {"app/training/loop.py", "app/cli.py", "app/training/deep.py"}


@pytest.mark.parametrize("marker", ["setup.py", ".git", None])
def test_a_checkout_that_is_a_package_imports_from_its_top(tmp_path: Path, marker: str | None) -> None:
    # The checkout's top has an `__init__.py`; its scripts run from there and import `common.engine`.
    files = {
        "repo/__init__.py": "",
        "repo/common/__init__.py": "",
        "repo/common/engine.py": ENGINE,
        "repo/common/trainers/__init__.py": "",
        "repo/common/trainers/loop.py": LOOP.replace("from engine import", "from common.engine import"),
    }
    if marker is not None:
        files[f"repo/{marker}"] = ""
    write(tmp_path, files)
    found = {path for path, _, _ in codes(tmp_path / "repo" / "common")}
    assert found == ({"trainers/loop.py"} if marker else set())


def test_code_outside_the_project_keeps_its_assumptions(tmp_path: Path) -> None:
    # `engine` is not a module of the project: the call is unknown, as it was before.
    write(tmp_path, {"train.py": LOOP})
    assert codes(tmp_path) == set()


def test_an_outline_reads_definitions_imports_and_calls() -> None:
    found = outline(
        textwrap.dedent("""\
            from . import engine
            from .core import *
            import torch.nn.functional as F

            class Trainer(engine.Base):
                def fit(self, batch):
                    '''Calls in docs do not count: loss.backward()'''
                    self.update(batch)
                    return super().fit(F.relu(batch))
        """).encode()
    )
    assert found is not None
    assert found.classes["Trainer"].bases == (Ref("relative", "engine.Base", 1),)
    assert found.stars == (Ref("relative", "core", 1),)
    fit = found.function("Trainer.fit")
    assert fit is not None and not fit.maybe_effects and fit.method
    assert set(fit.calls) == {
        Ref("class", "Trainer", method="update"),
        Ref("super", "Trainer", method="fit"),
        Ref("absolute", "torch.nn.functional.relu"),
    }


# The cache: a result is reused only while the modules it used are unchanged


def test_a_cached_result_is_invalidated_when_only_an_imported_module_changes(tmp_path: Path) -> None:
    write(tmp_path, {"engine.py": ENGINE, "train.py": LOOP})
    cache = tmp_path / ".gradlint_cache"

    def run() -> set[tuple[str, int, str]]:
        return {(Path(d.path).name, d.line, d.code) for d in lint_paths([tmp_path], Config(), jobs=1, cache=cache)}

    assert run() == {("train.py", 8, "GL002")}
    assert run() == {("train.py", 8, "GL002")}  # warm
    engine = tmp_path / "engine.py"
    engine.write_text(
        engine.read_text().replace("    loss.backward()", "    optimizer.zero_grad()\n    loss.backward()")
    )
    assert run() == set()  # train.py itself did not change: its entry named engine.py's content


def count_lints(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files linted from now on (cache misses), in order."""
    import gradlint.engine

    linted: list[str] = []
    real = gradlint.engine._lint_bytes

    def counting(path, data, config, program):  # type: ignore[no-untyped-def]
        linted.append(path.name)
        return real(path, data, config, program)

    monkeypatch.setattr(gradlint.engine, "_lint_bytes", counting)
    return linted


def test_a_warm_run_reuses_a_result_whose_imports_did_not_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, {"engine.py": ENGINE, "train.py": LOOP, "other.py": "import torch\n\ndef f(x):\n    return x\n"})
    cache = tmp_path / ".gradlint_cache"
    list(lint_paths([tmp_path], Config(), jobs=1, cache=cache))
    linted = count_lints(monkeypatch)
    (tmp_path / "other.py").write_text("import torch\n\ndef f(x):\n    return x + 1\n")
    list(lint_paths([tmp_path], Config(), jobs=1, cache=cache))
    assert "train.py" not in linted and "engine.py" not in linted


def test_a_warm_run_rejudges_only_the_files_whose_used_summaries_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripts = {f"train_{n}.py": LOOP for n in range(3)}
    write(tmp_path, {"engine.py": ENGINE, **scripts})
    cache = tmp_path / ".gradlint_cache"
    list(lint_paths([tmp_path], Config(), jobs=1, cache=cache))
    linted = count_lints(monkeypatch)
    engine = tmp_path / "engine.py"
    # An edit inside the helper's body that leaves what it does to gradients as it was.
    engine.write_text("# Shared training code.\n" + engine.read_text().replace("loss.item()", "float(loss.item())"))
    found = {(Path(d.path).name, d.code) for d in lint_paths([tmp_path], Config(), jobs=1, cache=cache)}
    assert linted == ["engine.py"]
    assert found == {(name, "GL002") for name in scripts}
    # An edit that changes the summary: every script that used it is judged again.
    linted.clear()
    engine.write_text(
        engine.read_text().replace("    loss.backward()", "    optimizer.zero_grad()\n    loss.backward()")
    )
    found = {(Path(d.path).name, d.code) for d in lint_paths([tmp_path], Config(), jobs=1, cache=cache)}
    assert sorted(linted) == ["engine.py", *sorted(scripts)]
    assert found == set()


# 4. Ordering across calls, and helpers of the same module in the caller's terms


def test_a_same_module_helper_acts_on_the_argument_it_is_given(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "train.py": """\
                import torch

                def update(optimizer):
                    optimizer.step()

                def fit(model, loader):
                    opt = torch.optim.Adam(model.parameters())
                    for batch in loader:
                        opt.zero_grad()
                        model(batch).sum().backward()
                        update(opt)
            """
        },
    )
    assert step_events(analysis_of(tmp_path, "train.py")) == [
        ("clear", "opt", None),
        ("backward", None, None),
        ("step", "opt", None),
    ]
    assert codes(tmp_path) == set()  # `optimizer` is `opt`, which the loop clears


def test_an_optimizer_step_between_a_forward_and_its_backward_changes_saved_weights(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "updates.py": """\
                def step_discriminator(d_loss, opt_d):
                    opt_d.zero_grad()
                    d_loss.backward()
                    opt_d.step()
            """,
            "gan.py": """\
                import torch
                from updates import step_discriminator

                def fit(generator, discriminator, loader, noise):
                    opt_g = torch.optim.Adam(generator.parameters())
                    opt_d = torch.optim.Adam(discriminator.parameters())
                    for real in loader:
                        fake = generator(noise())
                        fake_score = discriminator(fake.detach())
                        d_loss = -torch.log(discriminator(real)).mean() - torch.log(1 - fake_score).mean()
                        g_loss = torch.log(1 - discriminator(fake)).mean()
                        step_discriminator(d_loss, opt_d)
                        opt_g.zero_grad()
                        g_loss.backward()
                        opt_g.step()
            """,
        },
    )
    assert codes(tmp_path) == {("gan.py", 14, "GL004")}


def test_a_project_class_is_a_model_when_its_bases_say_so(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "nets/__init__.py": "from .layers import Tower\n",
            "nets/layers.py": """\
                import torch.nn as nn

                class Base(nn.Module):
                    pass

                class Tower(Base):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(2, 2)
            """,
            "train.py": """\
                import torch
                from nets import Tower

                def fit(loader):
                    tower = Tower()
                    tower.fc.bias.zero_()
                    opt = torch.optim.SGD(tower.parameters(), lr=0.1)
                    for x in loader:
                        opt.zero_grad()
                        tower(x).sum().backward()
                        opt.step()
            """,
        },
    )
    assert codes(tmp_path) == {("train.py", 6, "GL004")}


def test_known_calls_keep_their_meaning_in_the_project_that_defines_them(tmp_path: Path) -> None:
    # Linting PyTorch itself: `torch.optim.SGD(...).step()` and `torch.autograd.grad` are the project's code.
    write(
        tmp_path,
        {
            "torch/__init__.py": "from . import autograd, optim\n",
            "torch/optim/__init__.py": """\
                class SGD:
                    def __init__(self, params, lr):
                        self.params = list(params)

                    def step(self):
                        for p in self.params:
                            p.data.add_(p.grad)
            """,
            "torch/autograd/__init__.py": """\
                def grad(outputs, inputs, retain_graph=None):
                    outputs.backward(retain_graph=retain_graph)
                    return [x.grad for x in inputs]
            """,
            "torch/testing/__init__.py": "",
            "torch/testing/helpers.py": """\
                import torch

                def fit(model, loader):
                    opt = torch.optim.SGD(model.parameters(), lr=0.1)
                    for batch in loader:
                        opt.zero_grad()
                        model(batch).sum().backward()
                        opt.step()

                def warm_up(f, x):
                    results = []
                    for _ in range(3):
                        results.append(torch.autograd.grad(f(x), [x], retain_graph=True))
                    return results

                def check_once(model, loader):
                    fit(model, loader)
            """,
        },
    )
    assert codes(tmp_path) == set()
    assert step_events(analysis_of(tmp_path, "torch/testing/helpers.py")) == [
        ("clear", "opt", None),
        ("backward", None, None),
        ("step", "opt", None),
    ]


def test_a_function_that_runs_a_training_loop_once_is_not_itself_a_step(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "engine.py": """\
                import torch

                def run(model, loader):
                    opt = torch.optim.SGD(model.parameters(), lr=0.1)
                    for batch in loader:
                        model(batch).sum().backward()
                        opt.step()
            """,
            "app.py": """\
                from engine import run

                def main(model, loader):
                    run(model, loader)
            """,
        },
    )
    # The loop that never clears is reported where it is, not again at each caller.
    assert codes(tmp_path) == {("engine.py", 6, "GL002")}


# Arguments passed on: *args/**kwargs, functools.partial, bound methods


@pytest.mark.parametrize(
    "wrapper",
    [
        "def run(*args, **kwargs):\n    return train_step(*args, **kwargs)\n",
        "def run(model, *args):\n    return train_step(model, *args)\n",
        "def run(**kwargs):\n    return train_step(**kwargs)\n",
    ],
    ids=["args-and-kwargs", "args", "kwargs"],
)
@pytest.mark.parametrize("where", ["same module", "other module"])
def test_a_wrapper_passes_its_star_arguments_on(tmp_path: Path, wrapper: str, where: str) -> None:
    call = "run(model=model, optimizer=opt_g, batch=batch)" if "(**" in wrapper else "run(model, opt_g, batch)"
    loop = textwrap.dedent(f"""\
        import torch

        def fit(model, loader):
            opt_g = torch.optim.SGD(model.parameters(), lr=0.1)
            for batch in loader:
                {call}
    """)
    if where == "same module":
        write(tmp_path, {"train.py": textwrap.dedent(ENGINE) + "\n\n" + wrapper + "\n\n" + loop})
    else:
        write(
            tmp_path,
            {"engine.py": textwrap.dedent(ENGINE) + "\n\n" + wrapper, "train.py": "from engine import run\n" + loop},
        )
    steps = [event for event in step_events(analysis_of(tmp_path, "train.py")) if event[0] == "step"]
    assert [target for _, target, _ in steps] == ["opt_g"]
    line = (tmp_path / "train.py").read_text().splitlines().index(f"        {call}") + 1
    assert ("train.py", line, "GL002") in codes(tmp_path)  # stepped every batch, never cleared


def test_an_argument_passed_on_by_keyword_or_position_binds_either_way(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "engine.py": textwrap.dedent(ENGINE)
            + "\n\ndef run(*args, **kwargs):\n    return train_step(*args, **kwargs)\n",
            "train.py": """\
                import torch
                from engine import run

                def fit(model, loader):
                    opt = torch.optim.SGD(model.parameters(), lr=0.1)
                    for batch in loader:
                        opt.zero_grad()
                        run(model, optimizer=opt, batch=batch)
                        run(model, opt, batch)
            """,
        },
    )
    events = step_events(analysis_of(tmp_path, "train.py"))
    assert [event for event in events if event[0] == "step"] == [("step", "opt", "engine.run")] * 2


@pytest.mark.parametrize(
    "bound",
    [
        "step = functools.partial(train_step, model, opt)\n    for batch in loader:\n        step(batch)",
        "step = partial(train_step, optimizer=opt)\n    for batch in loader:\n        step(model, batch=batch)",
        "step = trainer.train_step\n    for batch in loader:\n        step(model, opt, batch)",
    ],
    ids=["partial", "partial-keyword", "bound-method"],
)
@pytest.mark.parametrize("where", ["same module", "other module"])
def test_a_partial_or_a_bound_method_runs_what_it_wraps(tmp_path: Path, bound: str, where: str) -> None:
    engine = textwrap.dedent(ENGINE) + "\n\nclass Trainer:\n    def train_step(self, model, optimizer, batch):\n"
    engine += "        return train_step(model, optimizer, batch)\n"
    loop = textwrap.dedent("""\
        import functools
        from functools import partial

        import torch

        def fit(model, loader):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            trainer = Trainer()
            {bound}
    """).format(bound=bound)
    if where == "same module":
        write(tmp_path, {"train.py": engine + "\n\n" + loop})
    else:
        write(tmp_path, {"engine.py": engine, "train.py": "from engine import Trainer, train_step\n" + loop})
    events = step_events(analysis_of(tmp_path, "train.py"), -1)  # fit's: train_step is a step of its own
    assert [(kind, target) for kind, target, _ in events if kind == "step"] == [("step", "opt")]


def test_a_summary_records_updates_from_gradients_and_reads_of_grad_by_port() -> None:
    summary = summarize_module(
        textwrap.dedent("""\
            import torch

            def sgd(params, lr):
                for p in params:
                    p.grad.data.clamp_(-1, 1)
                    p -= lr * p.grad

            def tidy(model):
                for name, p in model.named_parameters():
                    if p.grad is not None:
                        p.grad.zero_()

            @torch.no_grad()
            def decay(weight, rate):
                weight.mul_(1 - rate)
                weight.add_(weight.grad, alpha=-rate)
        """)
    )
    effects = {
        name: [(e.kind, e.port, e.no_grad) for e in f.effects if e.kind != "call"]
        for name, f in summary.functions.items()
    }
    # An update by hand is a step too, reached through the same port (`for p in params`).
    assert effects["sgd"] == [("grad_read", "params", False), ("update", "params", False), ("step", "params", False)]
    assert effects["tidy"] == [("clear", None, False)]  # a clear, guarded by a test of `.grad`: no read
    assert effects["decay"] == [("update", "weight", True), ("step", "weight", True)]
    assert from_data(to_data(summary)) == summary


def test_a_partial_with_spread_arguments_is_read_in_python_s_order(tmp_path: Path) -> None:
    # `partial(f, **options)` called as `f(*batch)`: the view keeps keyword spreads after the positional ones.
    write(
        tmp_path,
        {
            "train.py": """\
                import functools

                import torch

                def train_step(model, optimizer, batch, clip=None):
                    model(batch).sum().backward()
                    optimizer.step()

                def fit(model, loader, options):
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                    step = functools.partial(train_step, **options)
                    other = functools.partial(train_step, model, clip=1.0, **options)
                    for batch in loader:
                        step(*batch, optimizer=optimizer)
                        other(optimizer, *batch)
            """,
        },
    )
    assert {code for _, _, code in codes(tmp_path)} <= {"GL002"}


def test_a_helper_first_reached_at_the_depth_limit_keeps_its_events_nearer(tmp_path: Path) -> None:
    # main -> run -> fit -> step -> helper: inlined from `main`, the helper's backward lies past the limit;
    # `fit`, analysed on its own, must still see it.
    write(
        tmp_path,
        {
            "train.py": """\
                import torch


                def helper(model, batch):
                    model(batch).sum().backward()


                def step(model, opt, batch):
                    helper(model, batch)
                    opt.step()
                    opt.zero_grad()


                def fit(model, opt, loader):
                    for batch in loader:
                        step(model, opt, batch)


                def run(model, loader):
                    fit(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)


                def outer(model, loader):
                    run(model, loader)


                def main(model, loader):
                    outer(model, loader)


                main(None, [])
            """
        },
    )
    analysis = analysis_of(tmp_path, "train.py")
    analysis.training_steps  # noqa: B018 (the module's events first, as the rules ask for them)
    fit = next(function for function in analysis.collected.functions if function.name.value == "fit")
    kinds = [event.kind.value for event in analysis.events.scope_events(fit)]
    assert kinds == ["backward", "step", "clear"]


def test_a_method_a_base_class_defines_elsewhere_is_no_forward_whatever_its_name(tmp_path: Path) -> None:
    # `self._save_model_if_better(...)` is named like a model; the base class in base.py defines it: a method.
    write(
        tmp_path,
        {
            "base.py": """\
                import torch

                class BaseRunner:
                    def _save_model_if_better(self, score):
                        torch.save(self.model.state_dict(), f"best-{score:.3f}.pt")
            """,
            "runner.py": """\
                import torch
                from base import BaseRunner

                class Runner(BaseRunner):
                    def fit(self, train_loader, val_loader, epochs):
                        for _ in range(epochs):
                            self.model.train()
                            for x, y in train_loader:
                                self.optimizer.zero_grad()
                                torch.nn.functional.mse_loss(self.model(x), y).backward()
                                self.optimizer.step()
                            self.model.eval()
                            with torch.no_grad():
                                score = sum(self.model(x).sum().item() for x, y in val_loader)
                            self._save_model_if_better(score)
            """,
        },
    )
    assert codes(tmp_path) == set()


@pytest.mark.parametrize(
    ("helper", "expected"),
    [
        # The scaler's step and the plain step are the two arms of one `if`: one of them runs.
        ("if self.scaler is not None:\n    self.scaler.step(self.optimizer)\nelse:\n    self.optimizer.step()", set()),
        # Both in the body: the optimizer steps twice whenever there is a scaler.
        (
            "if self.scaler is not None:\n    self.scaler.step(self.optimizer)\n    self.optimizer.step()",
            {("base.py", 10, "GL011"), ("runner.py", 9, "GL011")},
        ),
    ],
)
def test_steps_in_the_arms_of_one_if_in_another_module_exclude_each_other(
    tmp_path: Path, helper: str, expected: set[tuple[str, int, str]]
) -> None:
    body = textwrap.indent(helper, " " * 8)
    write(
        tmp_path,
        {
            "base.py": f"""\
import torch

class BaseTrainer:
    def train_step(self, batch):
        self.optimizer.zero_grad()
        loss = self.model(batch).sum()
        self.scaler.scale(loss).backward()
{body}
        if self.scaler is not None:
            self.scaler.update()
""",
            "runner.py": """\
                import torch
                from base import BaseTrainer

                class Benchmark(BaseTrainer):
                    def run(self, batch, epochs):
                        outputs = []
                        for _ in range(epochs):
                            for _ in range(10):
                                outputs.append(self.train_step(batch))
                        return outputs
            """,
        },
    )
    assert {row for row in codes(tmp_path) if row[2] == "GL011"} == expected


METERS = """\
    class AverageMeter:
        def __init__(self):
            self.sum = 0
            self.count = 0

        def update(self, val, n=1):
            self.sum += val * n
            self.count += n


    class PerHead:
        def __init__(self, heads):
            self._sum = [0] * heads

        def update(self, values):
            for index, value in enumerate(values):
                self._sum[index] += value


    class Collector:
        def __init__(self):
            self.statistics = {}

        def __setitem__(self, key, value):
            self.statistics.setdefault(key, []).append(value)


    class PlainMeter:
        def __init__(self):
            self.total = 0

        def update(self, val):
            self.total = self.total + val


    class FloatMeter:
        def __init__(self):
            self.sum = 0.0

        def update(self, val):
            self.sum += float(val)

        def __setitem__(self, key, value):
            self.last = value
"""


def test_a_method_of_another_module_that_keeps_its_argument_keeps_the_graph(tmp_path: Path) -> None:
    # Each object keeps what it is given in an attribute of its own, defined in another module (a namespace
    # package: `utils/` has no __init__.py): every step's graph stays referenced. A meter that keeps a float, or
    # a `__setitem__` that overwrites, keeps nothing.
    write(
        tmp_path,
        {
            "setup.py": "",
            "utils/meters.py": METERS,
            "train/loop.py": """\
                import torch
                import torch.nn.functional as F
                from utils.meters import AverageMeter, Collector, FloatMeter, PerHead, PlainMeter


                def fit(model, loader):
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                    meter, heads, stats, floats = AverageMeter(), PerHead(2), Collector(), FloatMeter()
                    plain = PlainMeter()
                    for inputs, targets in loader:
                        optimizer.zero_grad()
                        out = model(inputs)
                        loss = F.cross_entropy(out, targets)
                        aux = out.pow(2).mean()
                        (loss + aux).backward()
                        optimizer.step()
                        meter.update(loss, inputs.size(0))
                        heads.update([loss, aux])
                        stats["loss"] = loss
                        floats.update(loss)
                        floats["loss"] = loss
                        meter.update(loss.item(), inputs.size(0))
                        plain.update(aux)
            """,
        },
    )
    found = lint_paths([tmp_path / "train"], Config(root=tmp_path, select=frozenset({"GL001"}), preview=True))
    assert [(d.line, d.message.split(" keeps ")[0]) for d in found] == [
        (17, "`meter`"),
        (18, "`heads`"),
        (19, "`stats`"),
        (23, "`plain`"),
    ]
    summary = summarize_module(textwrap.dedent(METERS))
    assert summary is not None
    assert summary.functions["AverageMeter.update"].keeps == (("n", "sum"), ("val", "sum"))
    assert summary.functions["PerHead.update"].keeps == (("values", "_sum"),)
    assert summary.functions["Collector.__setitem__"].keeps == (("value", "statistics"),)
    assert summary.functions["FloatMeter.update"].keeps == ()
    assert summary.functions["PlainMeter.update"].keeps == (("val", "total"),)
    assert from_data(to_data(summary)) == summary


def test_a_module_class_of_another_module_without_parameters_builds_no_graph(tmp_path: Path) -> None:
    # The converter (re-exported by its package) holds a buffer and a plain tensor: its output carries no graph
    # of its own, so two backward passes that both read it share nothing freed. The embedder holds weights: the
    # second backward raises. What `make()` builds is unknown: nothing is said.
    write(
        tmp_path,
        {
            "chem/__init__.py": "from .layers import Converter, Embedder\n",
            "chem/layers.py": """\
                import torch
                from torch import nn


                class Converter(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.register_buffer("table", torch.zeros(120, dtype=torch.long))
                        self.numbers = torch.tensor([1, 6, 7, 8])

                    def forward(self, numbers):
                        return self.table[numbers]


                class Embedder(Converter):
                    def __init__(self):
                        super().__init__()
                        self.embed = nn.Embedding(120, 8)
            """,
            "test_forces.py": """\
                from torch import nn
                from chem import Converter, Embedder


                def check(potential: nn.Module, numbers, coordinates, make):
                    species = make()(numbers)
                    potential(species, coordinates).backward()
                    potential(species, coordinates.detach()).backward()


                def compare(potential: nn.Module, numbers, coordinates):
                    species = Converter()(numbers)
                    potential(species, coordinates).backward()
                    potential(species, coordinates.detach()).backward()


                def shared(potential: nn.Module, numbers, coordinates):
                    species = Embedder()(numbers)
                    potential(species, coordinates).backward()
                    potential(species, coordinates.detach()).backward()
            """,
        },
    )
    found = lint_paths([tmp_path / "test_forces.py"], Config(root=tmp_path, select=frozenset({"GL008"}), preview=True))
    assert [d.line for d in found] == [20]
    summary = summarize_module((tmp_path / "chem/layers.py").read_text())
    assert summary is not None and summary.parameterless == ("Converter",)


def test_a_factory_proves_what_it_builds_by_what_it_returns(tmp_path: Path) -> None:
    # Neither `self.thing` nor `self.vf` is named for what it holds: the factories of another module (and of the
    # module itself) prove them an optimizer and a model. A factory that may return either proves nothing.
    write(
        tmp_path,
        {
            "builders.py": """\
                import torch
                from torch import nn


                class ValueNet(nn.Module):
                    def __init__(self):
                        super().__init__()
                        self.fc = nn.Linear(4, 1)


                def create_value_function():
                    value = ValueNet()
                    return value


                def create_optim(module, lr):
                    return torch.optim.Adam(module.parameters(), lr=lr)


                def create_either(module, plain):
                    if plain:
                        return module
                    return torch.optim.SGD(module.parameters(), lr=0.1)
            """,
            "agent.py": """\
                import torch
                from builders import create_either, create_optim, create_value_function


                def make_scaler():
                    return torch.cuda.amp.GradScaler()


                class Agent:
                    def __init__(self):
                        self.vf = create_value_function()
                        self.thing = create_optim(self.vf, 1e-3)
                        self.other = create_either(self.vf, False)
                        self.amp = make_scaler()
            """,
        },
    )
    analysis = analysis_of(tmp_path, "agent.py")
    roles = {key: analysis.roles.role(cst.parse_expression(key)) for key in ("self.vf", "self.thing", "self.other")}
    assert roles == {"self.vf": Role.MODEL, "self.thing": Role.OPTIMIZER, "self.other": None}
    assert analysis.roles.role(cst.parse_expression("self.amp")) is Role.SCALER
    summary = summarize_module(textwrap.dedent(Path(tmp_path / "builders.py").read_text()))
    assert summary is not None
    assert [summary.functions[name].returns_role for name in ("create_value_function", "create_optim")] == [
        "model",
        "optimizer",
    ]
    assert summary.functions["create_either"].returns_role is None


def test_every_effect_the_analysis_knows_marks_a_helper_of_another_module_as_affecting_gradients(
    tmp_path: Path,
) -> None:
    # `model.train(training)` with a flag and `opt.clear_grads()` are effects the summaries record: a helper whose
    # only effect is one of them is read, so the epoch's switch back to training mode is seen.
    write(
        tmp_path,
        {
            "modes.py": """\
                def set_mode(model, training):
                    model.train(training)


                def reset(opt):
                    opt.clear_grads()
            """,
            "train.py": """\
                import torch
                from modes import reset, set_mode


                def fit(model, loader, epochs):
                    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                    for epoch in range(epochs):
                        set_mode(model, True)
                        for x, y in loader:
                            optimizer.zero_grad()
                            model(x).sum().backward()
                            optimizer.step()
                        model.eval()
                        with torch.no_grad():
                            for x, y in loader:
                                model(x)
            """,
        },
    )
    found = lint_paths([tmp_path / "train.py"], Config(root=tmp_path, select=frozenset({"GL016"}), preview=True))
    assert list(found) == []
    outlined = outline((tmp_path / "modes.py").read_bytes())
    assert outlined is not None
    assert [outlined.function(name).maybe_effects for name in ("set_mode", "reset")] == [True, True]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("overflow", "expected"),
    [
        # The clear runs only where the manager skips the update and returns: the step never applies nothing.
        ("if overflow:\n    self.zero_grad()\n    return", set()),
        ("if overflow:\n    self.zero_grad()\n    raise RuntimeError('overflow')", set()),
        # A clear that does not leave is followed by the step.
        ("if overflow:\n    self.zero_grad()", {("train.py", 10, "GL002")}),
        ("self.zero_grad()", {("train.py", 10, "GL002")}),
    ],
)
def test_a_clear_in_a_branch_that_returns_never_precedes_what_follows_it(
    tmp_path: Path, overflow: str, expected: set[tuple[str, int, str]]
) -> None:
    body = textwrap.indent(overflow, " " * 8)
    write(
        tmp_path,
        {
            "manager.py": f"""\
import torch

class Manager:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def zero_grad(self):
        self.optimizer.zero_grad()

    def step(self):
        overflow = not all(torch.isfinite(p.grad).all() for g in self.optimizer.param_groups for p in g["params"])
{body}
        self.optimizer.step()
""",
            "train.py": """\
                import torch
                from manager import Manager

                def train(model, data):
                    manager = Manager(torch.optim.SGD(model.parameters(), lr=0.1))
                    for x in data:
                        manager.zero_grad()
                        loss = model(x).sum()
                        loss.backward()
                        manager.step()
            """,
        },
    )
    assert {row for row in codes(tmp_path) if row[2] == "GL002"} == expected


@pytest.mark.parametrize(
    ("methods", "expected"),
    [
        # forward itself turns autograd off: evaluating the model records nothing.
        ("@torch.inference_mode()\ndef forward(self, x):\n    return self.proj(x)", set()),
        ("@torch.no_grad()\ndef forward(self, x):\n    return self.proj(x)", set()),
        # forward hands all its work to a method of its own that does.
        (
            "@torch.inference_mode()\ndef quantize(self, x):\n    return self.proj(x).argmax(-1)\n\n"
            "def forward(self, x):\n    return self.quantize(x)",
            set(),
        ),
        # forward runs its own layer before handing over: that layer records.
        (
            "@torch.inference_mode()\ndef quantize(self, x):\n    return x.argmax(-1)\n\n"
            "def forward(self, x):\n    x = self.proj(x)\n    return self.quantize(x)",
            {("cli.py", 11, "GL009")},
        ),
        # the method it hands over to records.
        (
            "def quantize(self, x):\n    return self.proj(x).argmax(-1)\n\n"
            "def forward(self, x):\n    return self.quantize(x)",
            {("cli.py", 11, "GL009")},
        ),
    ],
)
def test_a_model_whose_forward_turns_autograd_off_records_nothing(
    tmp_path: Path, methods: str, expected: set[tuple[str, int, str]]
) -> None:
    body = textwrap.indent(methods, " " * 4)
    write(
        tmp_path,
        {
            "tokenizer.py": f"""\
import torch
from torch import nn

class Tokenizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

{body}
""",
            "cli.py": """\
                import torch
                from torch.utils.data import DataLoader
                from tokenizer import Tokenizer

                def tokenize(data):
                    model = Tokenizer()
                    model.eval()
                    loader = DataLoader(data, batch_size=2)
                    codes = []
                    for x in loader:
                        codes.append(model(x).tolist())
                    return codes
            """,
        },
    )
    assert {row for row in codes(tmp_path) if row[2] == "GL009"} == expected


CUTTING_MODULE = """\
import torch

def detached_gap(model, x):
    return model(x).pow(2).mean().detach()

@torch.no_grad()
def teacher_gap(teacher, x, out):
    return (teacher(x) - out).pow(2).mean()

def either(value, keep):
    if keep:
        return value
    return value.detach()
"""

CUT_TRAINING = """\
import torch
from torch import nn
from cutting import detached_gap, either, teacher_gap

def step(model, aux, teacher, x, y):
    out = model(x)
    loss = nn.functional.mse_loss(out, y) + detached_gap(aux, x)
    loss = loss + teacher_gap(teacher, x, aux(x))
    loss = loss + either(aux(x).mean(), keep=True)
    loss.backward()
"""


def test_a_term_another_module_cuts_at_every_return_trains_nothing(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path, {"cutting.py": CUTTING_MODULE, "train.py": CUT_TRAINING})
    assert {row for row in codes(tmp_path) if row[2] == "GL019"} == {("train.py", 7, "GL019"), ("train.py", 8, "GL019")}
    # torch agrees: only the term cut on some paths trains `aux`; the other two give it nothing.
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    torch = pytest.importorskip("torch")
    cutting = importlib.import_module("cutting")
    model, aux, teacher = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
    x = torch.randn(4, 3)
    for term in (cutting.detached_gap(aux, x), cutting.teacher_gap(teacher, x, aux(x))):
        assert not term.requires_grad
    (model(x).mean() + cutting.either(aux(x).mean(), keep=True)).backward()
    assert aux.weight.grad is not None


# 5. Callers in the other files of the run decide a function's grad mode

EVALUATE = """\
    import torch

    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
        return correct
"""
CALLER = """\
    import torch
    from evaluation import evaluate

    def report(model, loader):
        with torch.no_grad():
            return evaluate(model, loader)
"""


@pytest.mark.parametrize("jobs", [1, 2])  # worker processes learn the run's files once, when they start
def test_a_helper_every_caller_runs_under_no_grad_elsewhere_records_nothing(tmp_path: Path, jobs: int) -> None:
    write(tmp_path, {"evaluation.py": EVALUATE, "report.py": CALLER})
    assert not [d for d in lint_paths([tmp_path], Config(), jobs=jobs) if d.code == "GL009"]
    # Linted alone, its callers are not in the run: it is reported, as it always was.
    alone = list(lint_paths([tmp_path / "evaluation.py"], Config(), jobs=1))
    assert [(d.line, d.code) for d in alone] == [(7, "GL009")]


def test_one_caller_with_grad_or_one_reference_leaves_the_helper_reported(tmp_path: Path) -> None:
    unwrapped = CALLER.replace("        with torch.no_grad():\n            return", "        return")
    passed = CALLER + "\nHOOKS = [evaluate]\n"
    for caller in (unwrapped, passed):
        write(tmp_path, {"evaluation.py": EVALUATE, "report.py": caller})
        found = [(Path(d.path).name, d.line) for d in lint_paths([tmp_path], Config(), jobs=1) if d.code == "GL009"]
        assert found == [("evaluation.py", 7)], caller


def test_a_cached_result_follows_its_callers_in_other_files(tmp_path: Path) -> None:
    write(tmp_path, {"evaluation.py": EVALUATE, "report.py": CALLER})
    cache = tmp_path / ".gradlint_cache"

    def run() -> set[tuple[str, int]]:
        found = lint_paths([tmp_path], Config(), jobs=1, cache=cache)
        return {(Path(d.path).name, d.line) for d in found if d.code == "GL009"}

    assert run() == set()
    assert run() == set()  # warm
    # A new file that calls it with autograd on: evaluation.py did not change, its entry named its callers.
    (tmp_path / "script.py").write_text("from evaluation import evaluate\n\nevaluate(None, [])\n")
    assert run() == {("evaluation.py", 7)}
    (tmp_path / "script.py").unlink()
    assert run() == set()
    # An edit inside the caller's body that takes the call out of the no_grad block.
    report = tmp_path / "report.py"
    report.write_text(report.read_text().replace("    with torch.no_grad():\n        return", "    return"))
    assert run() == {("evaluation.py", 7)}


def test_mentions_tell_calls_by_grad_mode_from_references() -> None:
    import ast

    from gradlint.index import TOP_LEVEL, Mention, mentions

    code = textwrap.dedent(
        """\
        import torch
        from utils import evaluate
        from utils import evaluate as ev

        class Loop:
            @torch.no_grad()
            def check(self):
                evaluate(1)

            def run(self):
                with torch.no_grad():
                    self.evaluate(2)
                evaluate(3)
                hooks = [evaluate]
                return lambda: evaluate(4)
        """
    )
    found = set(mentions(ast.parse(code), "evaluate"))
    assert found == {
        Mention(TOP_LEVEL, None, passed=True),  # imported as `ev`
        Mention("Loop.check", "Loop", "evaluate", off=True),
        Mention("Loop.run", "Loop", "self.evaluate", off=True),
        Mention("Loop.run", "Loop", "evaluate"),
        Mention("Loop.run", "Loop", passed=True),  # handed on in a list
        Mention("Loop.run", "Loop", "evaluate", passed=True),  # in a lambda: run when it is called
    }


def test_a_function_named_like_a_common_method_is_looked_for_where_it_can_be_called(tmp_path: Path) -> None:
    # A benchmark's `eval` function, run by its sibling module under no_grad; fifty other files call `model.eval()`
    # (a method, not this function), and two call the builtin `eval`, one beside a star import that does not bind
    # it: none of them can run it.
    bench = {
        "bench/__init__.py": "",
        "bench/config.py": EVALUATE.replace("def evaluate(", "def eval("),
        "bench/core.py": """\
            import torch
            from .config import eval

            class Calculator:
                @torch.no_grad()
                def test(self, model, loader):
                    return eval(model, loader)
        """,
        "tools.py": "def parse(text):\n    return eval(text)\n",
        "helpers.py": "def shift(x):\n    return x + 1\n",
        "starred.py": "from helpers import *\n\n\ndef parse(text):\n    return shift(eval(text))\n",
    }
    others = {f"scripts/run_{n}.py": "def run(model):\n    model.eval()\n    return model\n" for n in range(50)}
    write(tmp_path, {**bench, **others})
    assert not [d for d in lint_paths([tmp_path], Config(), jobs=1) if d.code == "GL009"]
    # A call through an object of the benchmark's module itself still counts: run with grad, it is reported.
    (tmp_path / "bench" / "report.py").write_text("from bench import config\n\nconfig.eval(None, [])\n")
    found = [(Path(d.path).name, d.line) for d in lint_paths([tmp_path], Config(), jobs=1) if d.code == "GL009"]
    assert found == [("config.py", 7)]
