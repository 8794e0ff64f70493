"""Unified diffs: make one (the expert's fix) and apply one strictly (the `apply_patch` tool).

In: `make_patch(path, old, new)` → the unified diff of one file (`--- a/path`, `+++ b/path`).
`apply_patch(patch, read)` → {path: new text} for every file the patch touches, given `read(path)` (the
current text, or None when the file does not exist); `--- /dev/null` creates a file, `+++ /dev/null`
deletes it (its new text is None).
Guarantees: every hunk's context and removed lines must match the file exactly — at the line the header
names, or else at one unique place; otherwise `PatchError` names the file and the hunk. Bounded work for any
input within the caps (`MAX_PATCH_CHARS`, `MAX_HUNKS`, 9-digit line numbers): parsing is one pass, and a hunk
whose header line is wrong costs one linear search of its file (`_place`), never a scan per line — so a
patch runs in well under a second in the env worker's thread, where no timeout could stop it
(`rollart bench envs`: `apply_patch_worst_cpu_s`). Nothing is
written here: the caller writes the result (through the workspace, which refuses paths that leave it).
Written here, not taken from a library: the well-kept Python diff libraries parse diffs but do not apply
them, and `patch(1)` would run inside the policy's sandbox, where its output and exit code are the
policy's to fake.
"""

from __future__ import annotations

import difflib
import re
from typing import Callable

MAX_PATCH_CHARS = 256 * 1024
_HUNK = re.compile(r"^@@ -(\d{1,9})(?:,(\d{1,9}))? \+(\d{1,9})(?:,(\d{1,9}))? @@")
MAX_HUNKS = 512  # over all files of one patch: each may need a search of its file
NULL = "/dev/null"


class PatchError(ValueError):
    """A patch that does not parse or does not apply; the message says where."""


def make_patch(path: str, old: str, new: str) -> str:
    diff = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                f"a/{path}", f"b/{path}", n=2)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff)


def _strip_prefix(name: str) -> str:
    name = name.split("\t")[0].strip()
    if name != NULL and name[:2] in ("a/", "b/"):
        name = name[2:]
    return name


def _sections(patch: str) -> list[tuple[str, str, list[list[str]]]]:
    """(old path, new path, hunks as lists of lines with their ' '/'-'/'+' prefix) per file."""
    lines = patch.splitlines()
    out: list[tuple[str, str, list[list[str]]]] = []
    i = counted = 0
    while i < len(lines):
        if not lines[i].startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchError(f"line {i + 1}: '---' is not followed by a '+++' line")
        old, new = _strip_prefix(lines[i][4:]), _strip_prefix(lines[i + 1][4:])
        i += 2
        hunks: list[list[str]] = []
        while i < len(lines) and not lines[i].startswith("--- "):
            match = _HUNK.match(lines[i])
            if not match:
                i += 1
                continue
            old_len = int(match.group(2) or 1)
            new_len = int(match.group(4) or 1)
            body: list[str] = [lines[i]]
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len):
                line = lines[i]
                if line.startswith("\\"):
                    i += 1
                    continue
                tag = line[:1] or " "  # an empty line is blank context (editors strip the space)
                if tag not in " -+":
                    raise PatchError(f"{new}: hunk {len(hunks) + 1} ends early: line {i + 1} starts with {tag!r}")
                seen_old += tag in " -"
                seen_new += tag in " +"
                body.append(tag + line[1:])
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise PatchError(f"{new}: hunk {len(hunks) + 1} has fewer lines than its header says")
            hunks.append(body)
            counted += 1
            if counted > MAX_HUNKS:
                raise PatchError(f"the patch has more than {MAX_HUNKS} hunks; split it into several patches")
        if not hunks:
            raise PatchError(f"{new}: no hunks ('@@ -l,s +l,s @@') for this file")
        out.append((old, new, hunks))
    if not out:
        raise PatchError("not a unified diff: no '--- a/PATH' / '+++ b/PATH' lines")
    return out


def _place(path: str, number: int, start: int, lines: list[str], old: list[str]) -> int:
    """The one line where `old` (a hunk's context and removed lines) stands in `lines`, when its header's line
    is wrong: a substring search of the joined lines (a line never holds a newline, so a hit of
    "\\n" + old + "\\n" in "\\n" + file + "\\n" is line-aligned), linear in the file and the hunk. Searching
    line by line is O(file × hunk) per hunk: what a policy's patch of many wrong headers burned the host with."""
    haystack = "\n" + "\n".join(lines) + "\n"
    needle = "\n" + "\n".join(old) + "\n"
    first = haystack.find(needle)
    if first < 0 or haystack.find(needle, first + 1) >= 0:
        where = "nowhere" if first < 0 else "at more than one place"
        raise PatchError(f"{path}: hunk {number} (line {start}) does not apply: its context matches {where}")
    return haystack.count("\n", 0, first)


def _apply_hunks(path: str, text: str, hunks: list[list[str]]) -> str:
    lines = text.splitlines()
    trailing_newline = text.endswith("\n") or not text
    offset = 0
    for number, hunk in enumerate(hunks, 1):
        start = int(_HUNK.match(hunk[0]).group(1))  # type: ignore[union-attr]
        old = [line[1:] for line in hunk[1:] if line[0] in " -"]
        new = [line[1:] for line in hunk[1:] if line[0] in " +"]
        at = max(start - 1, 0) + offset if old else start + offset
        if lines[at : at + len(old)] != old:
            at = _place(path, number, start, lines, old)
        lines[at : at + len(old)] = new
        offset = at + len(new) - (start - 1 if old else start)
    return "\n".join(lines) + ("\n" if trailing_newline and lines else "")


def apply_patch(patch: str, read: Callable[[str], str | None]) -> dict[str, str | None]:
    """{path: new text (None: deleted)} for each file `patch` touches; `PatchError` if any hunk fails."""
    if len(patch) > MAX_PATCH_CHARS:
        raise PatchError(f"patch is {len(patch)} characters; at most {MAX_PATCH_CHARS} are accepted")
    changes: dict[str, str | None] = {}
    for old_path, new_path, hunks in _sections(patch):
        if old_path == NULL:
            if read(new_path) is not None:
                raise PatchError(f"{new_path}: the patch creates it, but it exists")
            changes[new_path] = _apply_hunks(new_path, "", hunks)
            continue
        current = changes[old_path] if old_path in changes else read(old_path)
        if current is None:
            raise PatchError(f"{old_path}: no such file")
        patched = _apply_hunks(old_path, current, hunks)
        if new_path == NULL:
            changes[old_path] = None
        else:
            changes[new_path] = patched
            if new_path != old_path:
                changes[old_path] = None
    return changes
