"""Every repository path the docs name in backticks exists, so the docs cannot drift from the code silently.

Docs: `docs/*.md`, the README, the examples' READMEs and `benchmarks/RESULTS.md` (the CHANGELOG is history: it
names files as they were). A backticked token is a repository path when it starts with a top-level folder of
the repository (`rollart/…`, `tests/…`, `benchmarks/…`, `docs/…`, `examples/…`, `.ci/…`) or names a root file
(`Makefile`, `pyproject.toml`, …); and, as the architecture doc writes them, relative to the package when it
starts with one of rollart's packages and ends in `.py` or `/` (`envs/manager.py`, `trainer/`). Tokens with
placeholders, spaces or globs (`runs/<name>/`, `key=value`) are not paths; metric names (`reward/…/restarts`)
have no extension and are left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_FOLDERS = ("rollart/", "tests/", "benchmarks/", "docs/", "examples/", ".ci/")
ROOT_FILES = {"Makefile", "pyproject.toml", "README.md", "CHANGELOG.md", ".importlinter", ".gitignore"}
NOT_A_PATH = re.compile(r"[\s<>*{}$=|,()'\"]")
TICKED = re.compile(r"`([^`\n]+)`")


def documents() -> list[Path]:
    return sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md", *ROOT.glob("examples/**/*.md"),
                   ROOT / "benchmarks" / "RESULTS.md"])


def packages() -> set[str]:
    return {p.name for p in (ROOT / "rollart").iterdir() if (p / "__init__.py").is_file()}


def named_path(token: str, package_names: set[str]) -> Path | None:
    """The repository path a backticked token names, or None when it is not a repository path."""
    if NOT_A_PATH.search(token) or token.startswith(("http", "/", "~")):
        return None
    if token.startswith(TOP_FOLDERS) or token in ROOT_FILES:
        return ROOT / token
    if token.split("/", 1)[0] in package_names and "/" in token and token.endswith((".py", "/")):
        return ROOT / "rollart" / token
    return None


def missing_paths(document: Path) -> list[str]:
    package_names = packages()
    missing = []
    for token in TICKED.findall(document.read_text()):
        path = named_path(token.strip(), package_names)
        if path is not None and not path.exists():
            missing.append(token)
    return sorted(set(missing))


def test_every_path_the_docs_name_exists() -> None:
    stale = {str(doc.relative_to(ROOT)): gone for doc in documents() if (gone := missing_paths(doc))}
    assert stale == {}, f"docs name paths that do not exist: {stale}"


def test_the_check_sees_a_stale_path(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("See `rollart/no_such_module.py`, `envs/gone.py`, `rollart/types.py` and `envs/manager.py`; "
                   "not `runs/<name>/`, `reward/serverless/restarts` or `a=b`.")
    assert missing_paths(doc) == ["envs/gone.py", "rollart/no_such_module.py"]
