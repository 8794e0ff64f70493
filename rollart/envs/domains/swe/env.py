"""SweEnv: the SWE-style repair domain (`env: swe`) — fix a generated package's seeded bug with tools.

In: options `difficulty` (0–3), `families` (mutation families), `command_timeout_s` (per bash/run_tests
call), `max_output_chars` (per tool result), `workspace` (the workspace's limits and backend: `WorkspaceConfig`
fields, rollart/sandbox/workspace.py; a run's `envs.workspace` keys come in under them), `owner` (names the
workspaces' directory, or labels their containers).
`prepare()` opens the trajectory's workspace and `preload(seed)` writes that seed's package into it (the warm
pool calls them ahead of time, the latter for a group it was told is coming); `reset(seed)` writes the
task's package (with its bug and visible tests) into the workspace — unless `preload(seed)` already did and
nothing touched it since — and answers the issue, the tools and the call format. The workspace a submit is
scored in is opened at the submit, with the files to score: one container per env until then (a reset on a
container backend is then one container start, not two — the capacity a warm pool of them needs halves — and
an episode that ends without a submit never starts a second one; the submit pays that start instead).
`step(action)`: one tool call (tools.py) per turn; its result is the next observation.

Reward: `submit` ends the episode with reward 1.0 when every hidden case passes, else 0.0. The hidden
cases never enter the policy's workspace: after its last command (none of its processes outlives a
command), the package's `.py` files are copied out of it (`Workspace.snapshot`: regular text files only,
a symlink is never followed) into a fresh workspace (opened for this submit, with those files) with the
scoring harness, which gets the cases' inputs on stdin; the verdicts are computed here (scoring.py). An episode that runs out of
turns without `submit` scores 0.

Malformed actions (no tool call, bad JSON, an unknown tool, missing arguments, several calls) are a
`format_error` turn (the domain's `format_penalty`); a path the workspace refuses, a patch that does not
apply or a command that fails is an ordinary result the policy reads. Nothing here raises for what the
policy typed.

Expert (warm start): `apply_patch` with the fix (expert.py), then `submit`.
"""

from __future__ import annotations

import functools
import random
from typing import Any, Mapping

from rollart.config import WorkspaceConfig
from rollart.envs.domains.swe import scoring
from rollart.envs.domains.swe.expert import expert_patch
from rollart.envs.domains.swe.generator import MAX_DIFFICULTY, RepairTask, generate
from rollart.envs.domains.swe.mutations import FAMILIES
from rollart.envs.domains.swe.tools import INSTRUCTIONS, Call, ToolCallError, call_text, check_call, parse_call, run_tool

WORKSPACE_DEFAULTS = {"cpu_time_s": 10.0, "wall_timeout_s": 20.0, "memory_mb": 512, "max_processes": 32,
                      "disk_mb": 64, "max_output_kb": 64}
SNAPSHOT_MAX_BYTES = 8 * 2**20  # the policy's text files copied out for scoring; past it, the submit scores 0


@functools.lru_cache(maxsize=256)
def _task(seed: int, difficulty: int, families: tuple[str, ...]) -> RepairTask:
    """A group's members share a seed: the task is generated once per process."""
    return generate(seed, difficulty, families)


class SweEnv:
    """Fix the seeded bug of a generated Python package with bash, read_file, write_file, apply_patch,
    run_tests and submit; hidden tests decide the reward (options: difficulty, families)."""

    def __init__(self, difficulty: int = 1, families: list[str] | tuple[str, ...] = FAMILIES,
                 command_timeout_s: float = 10.0, max_output_chars: int = 4000,
                 workspace: Mapping[str, Any] | None = None, owner: str = "swe") -> None:
        if not 0 <= difficulty <= MAX_DIFFICULTY:
            raise ValueError(f"swe: difficulty must be in 0..{MAX_DIFFICULTY}, got {difficulty}")
        if not families or set(families) - set(FAMILIES):
            raise ValueError(f"swe: families must be a non-empty subset of {list(FAMILIES)}, got {list(families)}")
        self.difficulty, self.families = difficulty, tuple(families)
        self.command_timeout_s, self.max_output_chars = command_timeout_s, max_output_chars
        self.limits = WorkspaceConfig(**{**WORKSPACE_DEFAULTS, **dict(workspace or {})})
        self.owner = owner  # names the workspaces' directory (reap_leftovers, leftover counts)
        self.task: RepairTask | None = None
        self.score: scoring.Score | None = None
        self._workspace: Any = None
        self._preloaded: int | None = None  # the seed whose package the workspace holds, untouched since
        self._rng = random.Random(0)

    # --- lifecycle -------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Open the trajectory's (empty) workspace: the seed-free, slow part of a reset (a container start, with a
        container backend)."""
        if self._workspace is None:
            self._workspace = self.open_workspace({})

    def preload(self, seed: int) -> None:
        """Write the task of `seed` into a fresh workspace ahead of its reset (the seed's part of a reset)."""
        self._load(int(seed))
        self._preloaded = int(seed)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        seed = int(seed or 0)
        if self._preloaded != seed:
            self._load(seed)
        self._preloaded = None  # from here on the policy may change the files: a later reset starts afresh
        self.score = None
        self._rng = random.Random(seed)
        assert self.task is not None
        listing = ", ".join(sorted(self.task.files))
        obs = f"{self.task.prompt}\nFiles: {listing}\n{INSTRUCTIONS}"
        return obs, {"reference": {"package": self.task.package, "difficulty": self.difficulty}}

    def _load(self, seed: int) -> None:
        """A workspace holding the package of `seed` (a fresh one: never an earlier episode's files)."""
        if self.task is not None:
            self.close()
        self.prepare()
        self.task = _task(seed, self.difficulty, self.families)
        self._workspace.write_files(self.task.files)  # one round trip in a container workspace

    def close(self) -> None:
        if self._workspace is not None:
            self._workspace.close()
        self._workspace = None
        self.task, self._preloaded = None, None

    def open_workspace(self, files: Mapping[str, str]) -> Any:
        """A fresh workspace sandbox holding `files` (the policy's, or a scoring one)."""
        from rollart.sandbox.workspace import open_workspace

        return open_workspace(self.limits, files, owner=self.owner)

    # --- turns ------------------------------------------------------------------------------------------
    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        try:
            call = parse_call(action)
        except ToolCallError as exc:
            return self._format_error(str(exc))
        return self.call(call)

    def call_tool(self, name: str, arguments: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One tool call given by name and arguments (an agent's OpenAI tool call)."""
        try:
            call = check_call(name, arguments)
        except ToolCallError as exc:
            return self._format_error(str(exc))
        return self.call(call)

    def _format_error(self, problem: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return f"Invalid tool call: {problem}. {INSTRUCTIONS}", 0.0, False, False, {"format_error": problem}

    def call(self, call: Call) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.task is None or self._workspace is None:
            raise RuntimeError("swe: step() before reset()")
        if call.name != "submit":
            text = run_tool(call, self._workspace, timeout_s=self.command_timeout_s, max_chars=self.max_output_chars)
            return text, 0.0, False, False, {}
        self.score = scoring.score(self.package_files(), self.task.package, self.task.hidden, self._fresh_run)
        verdict = f"Submitted: {self.score.passed} of {self.score.total} hidden tests pass."
        info = {"hidden_passed": self.score.passed, "hidden_total": self.score.total}
        return verdict, self.score.reward, True, False, info

    def package_files(self) -> dict[str, str]:
        """The package's `.py` files as the policy left them (`Workspace.snapshot`: regular text files, no
        symlink followed), bounded by `scoring.package_files`; none when the tree is over `SNAPSHOT_MAX_BYTES`."""
        assert self.task is not None and self._workspace is not None
        try:
            snapshot = self._workspace.snapshot(SNAPSHOT_MAX_BYTES)
        except ValueError:
            return {}  # a tree flooded with text scores 0 (the package cannot be imported from nothing)
        return scoring.package_files(snapshot, self.task.package)

    def _fresh_run(self, files: Mapping[str, str], command: str, stdin: str) -> tuple[int | None, str]:
        """The scoring run: a fresh workspace holding `files`, opened for it and closed after it (no command of
        the policy ever ran in it; the policy's processes cannot reach it)."""
        workspace = self.open_workspace(files)
        try:
            result = workspace.run(command, timeout_s=self.limits.wall_timeout_s, stdin=stdin)
            return result.exit_code, result.stdout
        finally:
            workspace.close()

    # --- oracle policies -----------------------------------------------------------------------------
    def expert_action(self) -> str:
        assert self.task is not None, "swe: expert_action() before reset()"
        path = self.task.bug.path
        if self._workspace.read_file(path, scoring.MAX_FILE_BYTES) != self.task.fix[path]:
            return call_text("apply_patch", patch=expert_patch(self.task))
        return call_text("submit")

    def random_action(self) -> str:
        assert self.task is not None, "swe: random_action() before reset()"
        choice = self._rng.randrange(3)
        if choice == 0:
            return call_text("read_file", path=self._rng.choice(sorted(self.task.files)))
        if choice == 1:
            return call_text("run_tests")
        return call_text("bash", command="ls -R")
