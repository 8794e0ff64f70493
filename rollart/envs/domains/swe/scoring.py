"""Scoring a repair: the hidden cases run against the package's code in a fresh sandbox; the verdicts
are computed here.

In: the files of the policy's workspace, the task's hidden cases, and a `Runner` — a callable that runs a
command over a set of files in a fresh sandbox and returns (exit code, stdout): the workspace sandbox in
the env, a plain subprocess in tests of the generator. Out: `Score(passed, total, reason)`; the reward is
1.0 only when every hidden case passes.

What reaches the scoring sandbox: the package's `.py` files from the workspace (at most `MAX_FILES`, each
at most `MAX_FILE_BYTES`) and the harness (`hidden_harness.py`) — never the policy's tests, never
anything outside the package's directory, never the expected results (the harness gets the inputs on
stdin). So neither a forged test, a `conftest`/`sitecustomize` trick, nor output that imitates the
harness (a second result line scores 0) can score a case: a case passes only when the package itself computes its expected result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Mapping, Sequence

from rollart.base.untrusted import loads_json
from rollart.envs.domains.swe.generator import HiddenCase

HARNESS_NAME = "_rollart_hidden.py"
HARNESS_SOURCE = Path(__file__).with_name("hidden_harness.py").read_text()
HARNESS_COMMAND = f"python3 -I {HARNESS_NAME}"
MARK = "@@rollart-hidden-results@@"  # as in hidden_harness.py (checked by a test)
MAX_FILES = 64
MAX_FILE_BYTES = 256 * 1024

Runner = Callable[[Mapping[str, str], str, str], tuple["int | None", str]]  # (files, command, stdin)


@dataclass(frozen=True)
class Score:
    passed: int
    total: int
    reason: str = ""  # why not every case passed, when one did not

    @property
    def reward(self) -> float:
        return 1.0 if self.total and self.passed == self.total else 0.0


def package_files(files: Mapping[str, str], package: str) -> dict[str, str]:
    """The `.py` files under `package/` (what is scored), bounded; larger or extra files are left out."""
    chosen: dict[str, str] = {}
    for path in sorted(files):
        parts = PurePosixPath(path).parts
        if len(parts) >= 2 and parts[0] == package and path.endswith(".py") and ".." not in parts:
            if len(files[path].encode()) <= MAX_FILE_BYTES and len(chosen) < MAX_FILES:
                chosen[path] = files[path]
    return chosen


def scoring_input(hidden: Sequence[HiddenCase]) -> str:
    return json.dumps([[c.module, c.function, c.args] for c in hidden]) + "\n"


def judge(stdout: str, hidden: Sequence[HiddenCase]) -> Score:
    """Compare the harness's result line with the expected results (a second one is a forgery: 0)."""
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        return Score(0, len(hidden), "the hidden tests produced no results (the package crashed the run)")
    if len(lines) > 1:
        return Score(0, len(hidden), "the package printed result lines of its own")
    try:
        results = loads_json(lines[-1][len(MARK):])
    except ValueError:  # not JSON, or nested past loads_json's depth (the package printed it): unreadable
        return Score(0, len(hidden), "the hidden tests' results are unreadable")
    if not isinstance(results, list) or len(results) != len(hidden):
        return Score(0, len(hidden), "the hidden tests' results do not match the cases")
    failed = [c for c, got in zip(hidden, results) if got != c.expected]
    reason = ""
    if failed:
        first = failed[0]
        reason = f"{len(failed)} of {len(hidden)} hidden cases failed, e.g. {first.function}{first.args}"
    return Score(len(hidden) - len(failed), len(hidden), reason)


def score(files: Mapping[str, str], package: str, hidden: Sequence[HiddenCase], run: Runner) -> Score:
    """Run the hidden cases over the package's files in a fresh sandbox (`run`) and judge them here."""
    sandbox_files = {**package_files(files, package), HARNESS_NAME: HARNESS_SOURCE}
    _, stdout = run(sandbox_files, HARNESS_COMMAND, scoring_input(hidden))
    return judge(stdout, hidden)
