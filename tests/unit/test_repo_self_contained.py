"""The repository is self-contained: no file in it refers to a document outside it.

Someone who clones the repository must be able to follow every reference in it. The design doc is
docs/architecture.md, so nothing may cite the team's working notes that live beside the checkout, and a
relative link in a Markdown file must land on a file inside the repository.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Built from parts, so that this file does not match itself.
OUTSIDE_REFERENCES = [
    ".." + "/shared",
    "/work" + "/",  # the machine this was built on: the team's notes, worktrees, libraries
    "DESIGN" + ".md",
    "NOTES" + ".md",
    "REFERENCES" + ".md",
]
# not the repository's own files: environments, caches, run outputs
SKIP_DIRS = {".git", ".venv", ".venv-vllm", ".pytest_cache", ".hypothesis", "__pycache__", "runs", "build", "dist"}
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")


def repo_files() -> list[Path]:
    """Tracked files plus untracked ones git does not ignore (a walk when this is not a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True, timeout=30,
        ).stdout
        files = [ROOT / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.SubprocessError):
        files = [p for p in ROOT.rglob("*") if p.is_file()]
    return [
        p for p in files
        if p.is_file() and not (set(p.relative_to(ROOT).parts[:-1]) & SKIP_DIRS)
        and not any(part.endswith(".egg-info") for part in p.relative_to(ROOT).parts)
    ]


def text_of(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def outside_references(paths: list[Path], root: Path = ROOT) -> list[str]:
    """'file:line: reference — text' for every line of `paths` that cites a file outside the repository."""
    found = []
    for path in paths:
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for ref in OUTSIDE_REFERENCES:
                if ref in line:
                    found.append(f"{path.relative_to(root)}:{number}: '{ref}' — {line.strip()[:120]}")
    return found


def test_no_file_refers_to_a_document_outside_the_repository():
    found = outside_references(repo_files())
    assert not found, (
        "these lines cite files outside the repository; cite docs/architecture.md (or state the fact) "
        "instead:\n" + "\n".join(found)
    )


def test_relative_markdown_links_stay_inside_the_repository_and_exist():
    broken = []
    for path in repo_files():
        if path.suffix != ".md":
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for target in MARKDOWN_LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                    continue  # a URL (https:, mailto:) or an anchor in the same file
                resolved = (path.parent / target.split("#", 1)[0]).resolve()
                if not resolved.is_relative_to(ROOT) or not resolved.exists():
                    broken.append(f"{path.relative_to(ROOT)}:{number}: ({target})")
    assert not broken, "Markdown links that leave the repository or point at nothing:\n" + "\n".join(broken)


def test_the_check_catches_an_outside_reference(tmp_path):
    module = tmp_path / "module.py"
    module.write_text('"""Docstring."""\n\n# the layout of ' + "DESIGN" + '.md §4\nx = 1\n')
    assert outside_references([module], tmp_path) == [
        "module.py:3: '" + "DESIGN" + ".md' — # the layout of " + "DESIGN" + ".md §4"
    ]
