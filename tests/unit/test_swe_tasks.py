"""The SWE repair-task generator: deterministic tasks, the difficulty knob, hidden cases kept out of the
package, and the scripted expert's fix making every hidden case pass on 200 generated tasks.

The generated files really run: one subprocess per batch imports each package from disk and runs its
visible unittest suite and the hidden harness (`hidden_harness.run_cases`, the code the scoring sandbox
runs), so 200 tasks cost one interpreter, not 400. A few tasks also go through the real scoring command
(`python3 -I _rollart_hidden.py` with the cases on stdin) in a subprocess of their own."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping

import pytest

from rollart.envs.domains.swe import hidden_harness, scoring
from rollart.envs.domains.swe.expert import expert_patch
from rollart.envs.domains.swe.generator import MAX_DIFFICULTY, TEST_COMMAND, generate
from rollart.envs.domains.swe.mutations import FAMILIES, mutations
from rollart.envs.domains.swe.patch import PatchError, apply_patch, make_patch

HARNESS_DIR = str(Path(hidden_harness.__file__).parent)
BATCH = r"""
import importlib, io, json, sys, unittest
sys.path.insert(0, sys.argv[1])
import hidden_harness
out = []
for job in json.load(sys.stdin):
    sys.path.insert(0, job["dir"])
    importlib.invalidate_caches()
    hidden = hidden_harness.run_cases(job["cases"])
    suite = unittest.defaultTestLoader.discover(job["dir"] + "/tests", top_level_dir=job["dir"])
    result = unittest.TextTestRunner(stream=io.StringIO()).run(suite)
    out.append({"hidden": hidden, "visible_run": result.testsRun,
                "visible_failed": len(result.failures) + len(result.errors)})
    sys.path.remove(job["dir"])
    for name in list(sys.modules):
        if name.split(".")[0] in (job["package"], "tests"):
            del sys.modules[name]
print(json.dumps(out))
"""


def write_tree(root: Path, files: Mapping[str, str | None]) -> None:
    for path, text in files.items():
        if text is not None:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)


def run_batch(trees: list[tuple[Mapping[str, str | None], object]]) -> list[dict]:
    """Each (files, task): its visible suite and hidden cases run from disk, in one subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for index, (files, task) in enumerate(trees):
            root = Path(tmp) / str(index)
            write_tree(root, files)
            jobs.append({"dir": str(root), "package": task.package,
                         "cases": [[c.module, c.function, c.args] for c in task.hidden]})
        out = subprocess.run([sys.executable, "-c", BATCH, HARNESS_DIR], input=json.dumps(jobs),
                             capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


def fixed_files(task) -> dict[str, str | None]:
    return {**task.files, **apply_patch(expert_patch(task), task.files.get)}


TASKS = [generate(seed, seed % (MAX_DIFFICULTY + 1)) for seed in range(200)]


def test_the_expert_solves_every_one_of_200_generated_tasks_and_the_bug_fails_each():
    fixed = run_batch([(fixed_files(t), t) for t in TASKS])
    buggy = run_batch([(dict(t.files), t) for t in TASKS])
    solved = [t.seed for t, run in zip(TASKS, fixed)
              if [r for r in run["hidden"]] == [c.expected for c in t.hidden]]
    assert len(solved) == 200, f"expert_solve_rate {len(solved) / 200}: unsolved seeds {set(range(200)) - set(solved)}"
    assert all(run["visible_failed"] == 0 and run["visible_run"] > 0 for run in fixed)
    for task, run in zip(TASKS, buggy):
        wrong = [c for c, got in zip(task.hidden, run["hidden"]) if got != c.expected]
        assert wrong and any(c.function == task.bug.function for c in wrong), task.seed
        # the knob: the visible tests show the bug up to difficulty 1, never from 2 on
        assert (run["visible_failed"] > 0) == (task.difficulty <= 1), (task.seed, task.difficulty)


def subprocess_runner(files: Mapping[str, str], command: str, stdin: str) -> tuple[int | None, str]:
    with tempfile.TemporaryDirectory() as tmp:
        write_tree(Path(tmp), files)
        out = subprocess.run(["bash", "-c", command], cwd=tmp, input=stdin, capture_output=True, text=True,
                             timeout=60)
    return out.returncode, out.stdout


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_scoring_through_the_real_command_rewards_the_fix_only(seed):
    task = TASKS[seed]
    assert scoring.score(fixed_files(task), task.package, task.hidden, subprocess_runner).reward == 1.0
    buggy = scoring.score(dict(task.files), task.package, task.hidden, subprocess_runner)
    assert buggy.reward == 0.0 and buggy.passed < buggy.total and "hidden cases failed" in buggy.reason


def test_scoring_ignores_files_outside_the_package_and_forged_results():
    task = TASKS[5]
    visible_values = [line.split(", ")[-1].rstrip(")") for line in "".join(task.files.values()).splitlines()
                      if "assertEqual" in line]
    forged_line = scoring.MARK + json.dumps((visible_values * 50)[: len(task.hidden)])
    forged = {
        **task.files,
        "tests/test_all.py": "import unittest\n",  # a suite that always passes: never copied
        "sitecustomize.py": "import sys; sys.exit(0)\n",  # outside the package: never copied
        # the package prints a result line of its own when the harness ends
        f"{task.package}/__init__.py": f"import atexit, sys\natexit.register(sys.__stdout__.write, {forged_line!r})\n",
    }
    result = scoring.score(forged, task.package, task.hidden, subprocess_runner)
    assert result.reward == 0.0 and "result lines of its own" in result.reason
    assert scoring.MARK == hidden_harness.MARK
    assert set(scoring.package_files({**forged, "../x.py": "", "other/y.py": ""}, task.package)) == {
        p for p in forged if p.startswith(task.package + "/")}


def test_tasks_are_deterministic_varied_and_hide_their_tests():
    assert generate(17, 2) == generate(17, 2)
    assert len({generate(s, 1).files[generate(s, 1).bug.path] for s in range(20)}) == 20
    for task in TASKS[:40]:
        text = "\n".join(task.files.values())
        assert not any(p.startswith("hidden") or "hidden" in p for p in task.files)
        assert task.fix[task.bug.path] != task.files[task.bug.path]
        assert task.files[task.bug.path].count("\n") == task.fix[task.bug.path].count("\n")
        assert TEST_COMMAND in task.files["README.md"] and task.issue and task.package in task.prompt
        # the hidden cases are not all visible (the suite has several per function; visible ones at most 2)
        assert len(task.hidden) > text.count("assertEqual")
    modules = {d: {len([p for p in generate(s, d).files if p.count("/") == 1 and not p.startswith("tests/")
                        and not p.endswith("__init__.py")]) for s in range(10)} for d in range(4)}
    assert modules[0] == {1} and min(modules[1]) >= 2 and min(modules[3]) == 4
    assert "`" + TASKS[0].bug.path + "`" in TASKS[0].issue  # difficulty 0 names the file
    assert TASKS[3].bug.path not in TASKS[3].issue and "(" not in TASKS[3].issue.split("report")[1]


def test_each_family_can_be_asked_for_alone_and_bad_knobs_are_refused():
    for family in FAMILIES:
        tasks = [generate(s, 1, (family,)) for s in range(6)]
        assert {t.bug.family for t in tasks} == {family}
    with pytest.raises(ValueError, match="difficulty must be in 0..3"):
        generate(0, 4)
    with pytest.raises(ValueError, match="families must be a non-empty subset"):
        generate(0, 1, ("typo",))
    with pytest.raises(ValueError, match="non-empty subset"):
        mutations("def f(x):\n    return x", ())


def test_apply_patch_is_strict_and_creates_and_deletes():
    old = "a\nb\nc\nd\n"
    patch = make_patch("m.py", old, "a\nB\nc\nd\n")
    assert apply_patch(patch, {"m.py": old}.get) == {"m.py": "a\nB\nc\nd\n"}
    # the hunk moved (lines above were added): found at its one unique place
    assert apply_patch(patch, {"m.py": "z\n" + old}.get) == {"m.py": "z\na\nB\nc\nd\n"}
    with pytest.raises(PatchError, match="does not apply: its context matches nowhere"):
        apply_patch(patch, {"m.py": "x\ny\n"}.get)
    with pytest.raises(PatchError, match="no such file"):
        apply_patch(patch, {}.get)
    with pytest.raises(PatchError, match="not a unified diff"):
        apply_patch("please fix it", {}.get)
    with pytest.raises(PatchError, match="fewer lines than its header"):
        apply_patch("--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n a\n", {"m.py": old}.get)
    created = apply_patch("--- /dev/null\n+++ b/n.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n", {}.get)
    assert created == {"n.py": "x = 1\ny = 2\n"}
    assert apply_patch("--- a/m.py\n+++ /dev/null\n@@ -1,4 +0,0 @@\n-a\n-b\n-c\n-d\n", {"m.py": old}.get) == {"m.py": None}
    with pytest.raises(PatchError, match="at most"):
        apply_patch("x" * (300 * 1024), {}.get)


def test_a_moved_hunk_is_found_at_its_one_place_and_an_ambiguous_one_refused():
    old = "a\nx\nb\nx\nc\n"
    assert apply_patch("--- a/m.py\n+++ b/m.py\n@@ -9,1 +9,1 @@\n-b\n+B\n", {"m.py": old}.get) == {"m.py": "a\nx\nB\nx\nc\n"}
    with pytest.raises(PatchError, match="hunk 1 \\(line 9\\) does not apply: its context matches at more than one place"):
        apply_patch("--- a/m.py\n+++ b/m.py\n@@ -9,1 +9,1 @@\n-x\n+X\n", {"m.py": old}.get)
    # lines are whole lines: "x" does not match inside "xx", nor a line split by another line break
    assert apply_patch("--- a/m.py\n+++ b/m.py\n@@ -9 +9 @@\n-x\n+X\n", {"m.py": "xx\nx\nax\r\n"}.get) == {
        "m.py": "xx\nX\nax\n"}


@pytest.mark.timeout(60)
def test_apply_patch_costs_bounded_work_for_any_patch_within_its_caps():
    """The issue's attack: a 256 KiB patch of one-line hunks whose headers are wrong, against a file of unique
    lines: each hunk scanned the whole file line by line (60 KB, 11,105 hunks: 14.6 s of the env worker's
    CPU, holding the GIL). Now a patch has at most MAX_HUNKS hunks, and a misplaced one costs one linear
    search: 512 hunks of 235 lines against 32,000 near-matching empty lines (minutes before) apply at once."""
    from rollart.envs.domains.swe.patch import MAX_HUNKS, MAX_PATCH_CHARS

    lines = [f"{i:x}" for i in range(13000)]
    text = "\n".join(lines) + "\n"
    hunks = "".join(f"@@ -1 +1 @@\n-{lines[-1 - k]}\n+{lines[-1 - k]}X\n" for k in range(11000))
    with pytest.raises(PatchError, match=f"more than {MAX_HUNKS} hunks"):
        apply_patch("--- a/f.py\n+++ b/f.py\n" + hunks[:MAX_PATCH_CHARS - 100], {"f.py": text}.get)
    blank = "\n" * 32000 + "end\n"
    hunk = "@@ -1,236 +1,236 @@\n" + " \n" * 235 + "-end\n+end\n"
    patched = apply_patch("--- a/f.py\n+++ b/f.py\n" + hunk * MAX_HUNKS, {"f.py": blank}.get)
    assert patched == {"f.py": blank}
