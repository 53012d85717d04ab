"""The runtime companion: `gradlint trace` runs a script under PyTorch instrumentation.

Only the modules of this package that run inside the traced child process
(`tracer.py`, `child.py`) import torch; the parent side (`runner.py`, `report.py`,
`html.py`) does not, so `import gradlint.runtime` works without torch.
"""

from __future__ import annotations
