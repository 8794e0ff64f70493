"""The README's "Train your own environment" recipe runs as written: its `my_envs.py`, then each of its
commands (play an episode with the expert, a short training run, the samples it wrote), from a fresh
directory — so the newcomer's first page cannot drift from what works."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]
README = Path(__file__).parents[2] / "README.md"


def recipe() -> tuple[str, list[str]]:
    """The recipe's Python file and its shell commands (comments dropped), from the README."""
    text = README.read_text()
    section = text[text.index("## Train your own environment"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)
    source = next(code for lang, code in blocks if lang == "python" and code.startswith("# my_envs.py"))
    shell = next(code for lang, code in blocks if lang == "bash")
    commands = [line.split("  #")[0].strip() for line in shell.splitlines() if line.strip()]
    return source, commands


def test_the_readme_recipe_for_an_own_env_runs_as_written(tmp_path):
    source, commands = recipe()
    assert len(source.splitlines()) <= 32 and len(commands) == 3  # a short recipe, as the README promises
    (tmp_path / "my_envs.py").write_text(source)
    outputs = []
    for command in commands:
        argv = shlex.split(command)
        assert argv[0] == "rollart", command
        proc = subprocess.run([sys.executable, "-m", "rollart.cli", *argv[1:]], cwd=tmp_path, capture_output=True,
                              text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout)
    played, trained, samples = outputs
    assert "== end: completed (env terminated); return 1" in played  # the expert finds the number
    assert '"steps": 20' in trained and (tmp_path / "runs" / "guess" / "report" / "index.html").is_file()
    assert "=== step 19 · guess · worst" in samples and "Guess my number, 1 to 10." in samples
