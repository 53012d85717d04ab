"""Tests that kill surviving mutants of the engine and of GL006, GL010, GL013 and GL015 (see benchmarks/mutation.md)."""

from __future__ import annotations

import textwrap

from gradlint import lint_source

Finding = tuple[int, int, str, list[tuple[int, str]]]

NEW_LEAF = (
    "`{leaf}` makes the loss a new leaf that requires grad: "
    "backward() no longer fails, but no parameter gets a gradient"
)


def torch_code(source: str) -> bytes:
    """`source` dedented, as a module torch reaches: the import goes last, so that its lines stay as written."""
    return (textwrap.dedent(source) + "\nimport torch\n").encode()


def lint(source: str) -> list[tuple[str, int, int]]:
    """(code, line, column) of every finding in `source` (dedented), all rules on; a crashed rule fails the test."""
    found = lint_source(torch_code(source), "x.py")
    assert [d.message for d in found if d.code == "GL999"] == []
    return [(d.code, d.line, d.column) for d in found]


def findings(source: str, code: str) -> list[Finding]:
    """(line, column, message, [(related line, note)]) of each `code` finding in `source` (dedented)."""
    found = lint_source(torch_code(source), "x.py")
    assert [d.message for d in found if d.code == "GL999"] == []
    return [(d.line, d.column, d.message, [(r.line, r.note) for r in d.related]) for d in found if d.code == code]


def integral(name: str) -> str:
    """The message GL010 gives for the integer tensor `name`."""
    return f"`{name}` is an integer or bool tensor, which cannot require gradients; this raises"


# --- the engine: noqa comments --------------------------------------------------------------------


def test_noqa_codes_in_a_multi_line_string_are_read_across_its_line_break_as_flake8_reads_them() -> None:
    # flake8 searches the lines of a multi-line string joined as they are: a noqa comment that ends
    # one line with its colon takes the code that starts the next.
    source = '''\
        import torch

        ids = torch.tensor([3, 1, 2], requires_grad=True); usage = """silence with # noqa:
        GL010 when the ids are cast later"""
        mask = torch.tensor([0, 1, 1], requires_grad=True)
        '''
    assert lint(source) == [("GL010", 5, 8)]


def test_a_noqa_for_another_code_does_not_hide_a_finding_in_a_file_with_carriage_return_line_ends() -> None:
    # Classic Mac OS line ends: LibCST counts five lines where `io.StringIO(text).readlines()` sees one,
    # so the finding's line has no entry among the lines searched for a noqa comment.
    lines = [
        "import torch",
        "",
        "ids = torch.tensor([3, 1, 2], requires_grad=True)  # noqa: GL006",
        "scale = torch.tensor([0.5, 2.0], requires_grad=True)",
        "",
    ]
    found = lint_source("\r".join(lines).encode(), "x.py")
    named = integral("torch.tensor([3, 1, 2], requires_grad=T…")
    assert [(d.code, d.line, d.column, d.message) for d in found] == [("GL010", 3, 7, named)]


# --- the engine: the bracket-depth guard ----------------------------------------------------------


def test_brackets_nested_past_the_limit_are_refused_even_behind_a_closing_bracket_in_a_string() -> None:
    # 101 levels: `log(...)` and 100 more inside it. The `")"` before them must not count: a plain
    # count of the bytes would go back to 0 there, find 100 and hand the file to LibCST.
    source = (
        "import torch\n"
        "features = model(batch)\n"
        'loss = log(")", ' + "(" * 100 + "features" + ")" * 100 + ")\n"
        "loss.backward()\n"
    )
    found = lint_source(source.encode(), "x.py")
    assert [(d.code, d.line, d.message) for d in found] == [
        ("GL000", 1, "cannot parse: brackets are nested more than 100 deep")
    ]


# --- GL013 --------------------------------------------------------------------------------------


def test_a_backward_that_takes_its_loss_by_keyword_inside_no_grad_is_not_reported() -> None:
    # The loss was computed with autograd on; only the backward call sits in the no_grad block.
    source = """\
        import torch
        import torch.nn.functional as F


        def train_step(model, ema, optimizer, images, labels):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            with torch.no_grad():
                torch.autograd.backward(tensors=loss)
                ema.update(model)
            optimizer.step()
        """
    assert lint(source) == []


def test_a_backward_whose_loss_cannot_be_read_inside_no_grad_is_not_judged() -> None:
    # `**outputs` hides which tensor is backpropagated: GL013 cannot tell where it was computed.
    source = """\
        import torch


        def train_step(model, ema, optimizer, images):
            optimizer.zero_grad()
            outputs = {"tensors": model(images).sum()}
            with torch.no_grad():
                torch.autograd.backward(**outputs)
                ema.update(model)
            optimizer.step()
        """
    assert lint(source) == []


# --- GL006 --------------------------------------------------------------------------------------


def test_requires_grad_call_on_an_autocast_loss_that_keeps_its_gradient_is_not_a_new_leaf() -> None:
    source = """\
        import torch
        import torch.nn.functional as F


        def train_epoch(model, loader, optimizer, scaler):
            for images, labels in loader:
                optimizer.zero_grad()
                with torch.autocast("cuda"):
                    loss = F.cross_entropy(model(images), labels)
                loss.requires_grad_()  # left over from debugging a frozen backbone
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        """
    assert lint(source) == []


def test_a_loss_rebuilt_from_an_accuracy_with_requires_grad_names_its_constructor_and_backward() -> None:
    source = """\
        import torch


        def train_step(model, optimizer, images, labels):
            optimizer.zero_grad()
            accuracy = (model(images).argmax(1) == labels).float().mean()
            loss = torch.tensor(1.0 - accuracy.item(), requires_grad=True)
            loss.backward()
            optimizer.step()
        """
    leaf = "torch.tensor(1.0 - accuracy.item(), req…"
    assert findings(source, "GL006") == [(7, 12, NEW_LEAF.format(leaf=leaf), [(8, "`loss` is backpropagated here")])]


def test_a_snippet_that_opens_by_forcing_requires_grad_on_a_loss_from_elsewhere_is_a_new_leaf() -> None:
    # A pasted snippet: no import, and `loss` comes from code not shown. Its first statement counts.
    source = """\
        loss.requires_grad = True  # the usual "fix" for: element 0 of tensors does not require grad
        loss.backward()
        optimizer.step()
        """
    leaf = "loss.requires_grad = True"
    assert findings(source, "GL006") == [(1, 1, NEW_LEAF.format(leaf=leaf), [(2, "`loss` is backpropagated here")])]


# --- GL015 --------------------------------------------------------------------------------------


def test_a_method_named_retain_grad_that_runs_the_backward_itself_is_not_late() -> None:
    source = """\
        class SaliencyProbe:
            def __init__(self, model, images):
                self.model, self.images = model, images

            def retain_grad(self):
                self.images.requires_grad_()
                self.model(self.images).max(1).values.sum().backward()

            def saliency(self):
                self.retain_grad()
                return self.images.grad.abs()
        """
    assert findings(source, "GL015") == []


def test_a_tensor_made_before_the_loop_is_filled_by_the_next_pass_of_the_loop() -> None:
    source = """\
        def probe_embeddings(model, tokens, steps):
            embedded = model.embed(tokens)
            for _ in range(steps):
                loss = model.head(embedded).logsumexp(-1).mean()
                loss.backward(retain_graph=True)
                embedded.retain_grad()
            return embedded.grad
        """
    assert findings(source, "GL015") == []


def test_a_tensor_of_the_next_batch_made_after_the_backward_is_not_late() -> None:
    source = """\
        def train_step(model, optimizer, batch, next_batch, probes):
            optimizer.zero_grad()
            model(batch).mean().backward()
            optimizer.step()
            hidden = model.encoder(next_batch)  # kept to inspect during the next step
            hidden.retain_grad()
            probes.append(hidden)
        """
    assert findings(source, "GL015") == []


# --- GL010 --------------------------------------------------------------------------------------


def test_requires_grad_call_on_sampled_token_ids_names_them_and_where_they_were_sampled() -> None:
    source = """\
        import torch

        token_ids = torch.randint(0, 1000, (8, 16))
        token_ids.requires_grad_()
        """
    made = [(3, "`token_ids` is made with an integer dtype here")]
    assert findings(source, "GL010") == [(4, 1, integral("token_ids"), made)]


def test_an_integer_parameter_built_from_a_name_is_reported_with_where_the_name_was_made() -> None:
    source = """\
        import torch
        from torch import nn


        class PositionBias(nn.Module):
            def __init__(self, length):
                super().__init__()
                positions = torch.arange(length, dtype=torch.long)
                self.positions = nn.Parameter(positions)
        """
    made = [(8, "`positions` is made with an integer dtype here")]
    assert findings(source, "GL010") == [(9, 26, integral("positions"), made)]


def test_an_integer_parameter_whose_data_comes_after_requires_grad_by_keyword_is_reported() -> None:
    source = """\
        import torch
        from torch import nn

        bins = nn.Parameter(requires_grad=True, data=torch.arange(10))
        """
    assert findings(source, "GL010") == [(4, 8, integral("torch.arange(10)"), [])]
