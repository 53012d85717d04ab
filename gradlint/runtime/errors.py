"""Which rule a gradient-related exception message belongs to."""

from __future__ import annotations

# Substrings of the messages autograd raises, with the rules whose bug raises them; the
# first code is the default when no static finding says which one it is.
_AUTOGRAD_ERRORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("a leaf variable that requires grad is being used in an in-place operation", ("GL004", "GL003")),
    ("modified by an inplace operation", ("GL004",)),
    ("backward through the graph a second time", ("GL008", "GL005")),
    ("does not require grad and does not have a grad_fn", ("GL006", "GL013")),
    ("appears to not have been used in the graph", ("GL006",)),
    ("grad can be implicitly created only for scalar outputs", ("GL012",)),
    ("only tensors of floating point and complex dtype can require gradients", ("GL010",)),
    ("only tensors of floating point dtype can require gradients", ("GL010",)),
    ("unscale_() has already been called on this optimizer", ("GL007",)),
)


# Rules whose static findings are confirmed by a line having run in the current backward
# or step (an error raised later, dead gradients), so the tracer keeps watching those lines.
RECENCY_CODES = frozenset({"GL006", *(code for _, codes in _AUTOGRAD_ERRORS for code in codes)})


def candidate_codes(message: str) -> tuple[str, ...]:
    """The rules whose bug raises an exception with this message, most likely first."""
    lowered = message.lower()
    for fragment, codes in _AUTOGRAD_ERRORS:
        if fragment in lowered:
            return codes
    return ()


def default_code(codes: tuple[str, ...], source_line: str, grad_enabled: bool) -> str:
    """The code to report when no static finding decides between `codes`."""
    if "GL003" in codes and ".grad" in source_line:
        return "GL003"  # Ex) `w -= lr * w.grad`: a hand-written update, not any in-place op
    if "GL013" in codes and not grad_enabled:
        return "GL013"
    return codes[0]
