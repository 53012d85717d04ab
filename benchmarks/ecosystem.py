"""Run gradlint over pinned releases of real PyTorch projects and tabulate every finding.

Like Ruff's ecosystem checks: the wheels or source archives (which hold the projects'
Python sources) are downloaded from the package index with pip, and the GitHub
repositories are cloned at a pinned commit; each is unpacked, linted, and every finding
is written to a Markdown table with its source line, ready for a verdict in ecosystem.md.

Three sets: `training` (15 training libraries, the original check), `large` (the
largest codebases a user might lint: torch's own sources with its test harness,
transformers, diffusers, torchvision, torch-geometric and other libraries) and
`repositories` (examples, tutorials, GAN and RL collections from GitHub; needs git and
network access, or `--sources DIR` holding checkouts named as in REPOSITORIES).

    python benchmarks/ecosystem.py [--set training --set large ...] [--out benchmarks/ecosystem-findings.md]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from gradlint import Config, Diagnostic, lint_paths

PROJECTS = {
    "pytorch-ignite": "0.5.5",
    "skorch": "1.4.0",
    "pytorch-lightning": "2.6.6",
    "timm": "1.0.31",
    "accelerate": "1.15.0",
    "d2l": "1.0.3",
    "stable-baselines3": "2.9.2",
    "pytorch-tabnet": "4.1.0",
    "fastai": "2.8.12",
    "pytorch-metric-learning": "2.9.0",
    "poutyne": "1.19.0",
    "tianshou": "2.0.1",
    "avalanche-lib": "0.6.0",
    "pyro-ppl": "1.9.2",
    "gpytorch": "1.15.2",
}
LARGE = {
    "torch": "2.13.0",
    "transformers": "5.24.0",
    "flair": "0.15.1",
    "opacus": "1.6.0",
    "learn2learn": "0.2.0",  # a source archive only
    "diffusers": "0.42.1",
    "peft": "0.21.2",
    "torchvision": "0.29.1",
    "torchmetrics": "1.9.0",
    "kornia": "0.9.0",
    "torch-geometric": "2.8.1",
}
REPOSITORIES = {
    "pytorch-examples": ("https://github.com/pytorch/examples", "77f55b912142e11fcfdf5b530231fb9c52f181e8"),
    "PyTorch-GAN": ("https://github.com/eriklindernoren/PyTorch-GAN", "36d3c77e5ff20ebe0aeefd322326a134a279b93e"),
    "cleanrl": ("https://github.com/vwxyzjn/cleanrl", "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"),
    "minimalRL": ("https://github.com/seungeunrho/minimalRL", "c8efed8481e3cd40e9739cfde220a55522555b57"),
    "Deep-RL-Algorithms": (
        "https://github.com/p-christ/Deep-Reinforcement-Learning-Algorithms-with-PyTorch",
        "4835bac8557fdacff1735eca004e35ea5a4b7443",
    ),
    "pytorch-tutorial": ("https://github.com/yunjey/pytorch-tutorial", "0500d3df5a2a8080ccfccbc00aca0eacc21818db"),
    "tutorials-kr": ("https://github.com/PyTorchKorea/tutorials-kr", "84b7db6e020c098cf38a0dfaf036007c24057bb1"),
}
# The libraries of every judged first-look draw (benchmarks/fresh/): a regression check once judged.
FRESH_LISTINGS = sorted(
    listing
    for listing in (Path(__file__).parent / "fresh").glob("draw*-libraries.txt")
    if listing.with_name(listing.name.replace("-libraries.txt", ".json")).is_file()  # judged: not a first look to come
)
SETS = ("training", "large", "repositories", "fresh")
# Outside the repository, so that its .gitignore does not apply to the projects.
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gradlint-ecosystem"


@dataclass(frozen=True)
class ProjectResult:
    """The findings of one project and the size of its source."""

    name: str
    version: str
    root: Path
    files: int
    lines: int
    diagnostics: list[Diagnostic]

    @property
    def per_10k_lines(self) -> float:
        """Findings per 10,000 lines of Python."""
        return 10_000 * len(self.diagnostics) / max(self.lines, 1)


class FetchError(Exception):
    """A pinned project the package registry does not serve (yanked, or built only for other platforms)."""


def libraries(listing: Path) -> list[tuple[str, str]]:
    """The pinned (name, version) pairs of a fresh draw's listing: one `name==version` a line, `#` comments."""
    pairs = []
    for line in listing.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.strip().partition("==")
            pairs.append((name, version))
    return pairs


def fetch(name: str, version: str, *, source_first: bool = False) -> Path:
    """Download and unpack a project's wheel (or, lacking one, its source archive) once; return the folder.

    `source_first`: the source archive first (it usually holds the tests too), the wheel lacking one.
    """
    target = CACHE / f"{name}-{version}"
    if target.is_dir():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    archives = _archives(name, version)
    if not archives:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"{name}=={version}", "-d", str(CACHE)]
        # `--no-binary NAME`, not `:all:`: the archive's build requirements still come as wheels (with `:all:`, pip
        # compiled Cython and numpy from source just to read an archive's metadata).
        first, then = (name, ":none:") if source_first else (":none:", name)
        if subprocess.run([*command, "--no-binary", first], check=False).returncode != 0:
            subprocess.run([*command, "--no-binary", then], check=False)  # learn2learn has no wheel, torchrl no sdist
        archives = _archives(name, version)
    if not archives:
        raise FetchError(f"{name}=={version}: the registry gave neither a wheel nor a source archive")
    archive = next((path for path in archives if path.suffix != ".whl"), archives[0]) if source_first else archives[0]
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            wheel.extractall(target)
    else:
        with tarfile.open(archive) as sdist:
            sdist.extractall(target, filter="data")
    return target


def _archives(name: str, version: str) -> list[Path]:
    """The wheels, then the source archives, of a project's version in the cache (names compared case-blind)."""
    stems = {name.lower(), re.sub(r"[-.]", "_", name).lower()}  # normalized names: autogluon_multimodal
    wheels, sources = [], []
    for path in sorted(CACHE.iterdir()):
        lowered = path.name.lower()  # MONAILabel-0.8.5.tar.gz
        if lowered.endswith(".whl") and any(lowered.startswith((f"{s}-{version}-", f"{s}-{version}+")) for s in stems):
            wheels.append(path)
        elif any(lowered == f"{stem}-{version}.tar.gz" for stem in stems):
            sources.append(path)
    return [*wheels, *sources]


def checkout(name: str, url: str, commit: str, sources: Path | None) -> Path:
    """A repository at its pinned commit: from `sources/name` if given, else cloned once into the cache."""
    if sources is not None:
        return sources / name
    target = CACHE / f"{name}-{commit[:12]}"
    if not target.is_dir():
        subprocess.run(["git", "clone", "-q", url, str(target)], check=True)
        subprocess.run(["git", "-C", str(target), "checkout", "-q", commit], check=True)
    return target


def lint_tree(name: str, version: str, root: Path) -> ProjectResult:
    """Lint one project's source with the default configuration."""
    files = sorted(path for path in root.rglob("*.py") if path.is_file())
    lines = sum(len(path.read_bytes().splitlines()) for path in files)
    diagnostics = sorted(lint_paths([root], Config(root=root)))
    return ProjectResult(name, version, root, len(files), lines, diagnostics)


def render(results: list[ProjectResult]) -> str:
    """The Markdown report: a summary table, then every finding with its source line."""
    out = ["# Ecosystem findings", "", "Generated by `python benchmarks/ecosystem.py`.", ""]
    out += ["| Project | Version | Files | Lines | Findings | Per 10k lines |", "| --- | --- | --- | --- | --- | --- |"]
    for result in results:
        out.append(
            f"| {result.name} | {result.version} | {result.files} | {result.lines} | "
            f"{len(result.diagnostics)} | {result.per_10k_lines:.2f} |"
        )
    for result in results:
        root = result.root
        out += ["", f"## {result.name} {result.version}", ""]
        if not result.diagnostics:
            out.append("No findings.")
        for d in result.diagnostics:
            relative = Path(d.path).relative_to(root)
            if d.path.endswith(".ipynb"):
                source = "(a notebook cell)"  # the line is the cell's, not the JSON file's
            else:
                source = Path(d.path).read_text(errors="replace").splitlines()[d.line - 1].strip()
            out.append(f"- `{relative}:{d.line}:{d.column}` {d.code} {d.name}: `{source}`")
    return "\n".join(out) + "\n"


def main() -> None:
    """Lint every pinned project of the chosen sets and write the report."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "ecosystem-findings.md")
    parser.add_argument("--set", dest="sets", action="append", choices=SETS, help="default: all of them")
    parser.add_argument("--sources", type=Path, help="checkouts of the repositories, one folder per name")
    args = parser.parse_args()
    sets = args.sets or list(SETS)
    results = []
    for chosen in sets:
        if chosen == "repositories":
            for name, (url, commit) in REPOSITORIES.items():
                results.append(lint_tree(name, commit[:12], checkout(name, url, commit, args.sources)))
        elif chosen == "fresh":
            for listing in FRESH_LISTINGS:
                for name, version in libraries(listing):
                    results.append(lint_tree(name, version, fetch(name, version, source_first=True)))
        else:
            for name, version in (PROJECTS if chosen == "training" else LARGE).items():
                results.append(lint_tree(name, version, fetch(name, version)))
    args.out.write_text(render(results))
    for result in results:
        print(f"{result.name} {result.version}: {len(result.diagnostics)} findings in {result.lines} lines")


if __name__ == "__main__":
    main()
