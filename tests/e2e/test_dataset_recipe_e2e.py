"""The runnable dataset recipe (examples/gsm_tiny) end to end, briefly, as a user runs it: make_data.py writes
GSM8K-format rows, `rollart data preview` shows them, `rollart train run.yaml` trains the tiny model on them
(warm start from rows, RL scored by math-verify against the answer column, validation on the test file), and its
checkpoint holds the rows drawn so far (that a resume goes on at the next row is tests/unit/test_run_state.py's).
One short run: what the recipe learns in full is `rollart train` by hand, reported in examples/gsm_tiny/README.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollart.base.run_dir import RunPaths

from test_train_e2e import console_problems, metrics_by_step

pytestmark = [pytest.mark.slow]
RECIPE = Path(__file__).parents[2] / "examples" / "gsm_tiny"
SHORT = ["train.steps=2", "train.warm_start.steps=2", "eval.every=2", "eval.episodes_per_domain=4",
         "rollout.batch_size=8", "rollout.group_size=4", "train.checkpoint_every=1"]


def train(run: Path, *overrides: str, cwd: Path) -> dict:
    """`rollart train examples/gsm_tiny/run.yaml run_dir=RUN …` in `cwd`, its console clean; the summary."""
    out = subprocess.run([sys.executable, "-m", "rollart.cli", "train", str(RECIPE / "run.yaml"), f"run_dir={run}",
                          "observability.progress=plain", "observability.tensorboard=false", *overrides],
                         cwd=cwd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"rollart train failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    noise = console_problems(out.stdout + out.stderr)
    assert not noise, "the console shows:\n" + "\n".join(noise)
    return json.loads(RunPaths.of(run).summary.read_text())


def ordinals(run: Path) -> int:
    newest = sorted(RunPaths.of(run).checkpoints.glob("step_*"))[-1]
    return json.loads((newest / "extra_state.json").read_text())["scheduler"]["ordinals"]["gsm"]


def test_the_gsm_recipe_trains_on_its_rows_and_checkpoints_where_it_is(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(RECIPE / "make_data.py"), "--out", "data", "--train", "300", "--test", "40"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=60)
    shown = subprocess.run([sys.executable, "-m", "rollart.cli", "data", "preview", "gsm", str(RECIPE / "run.yaml"),
                            "--show", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert "300 training rows from data/train.jsonl (none dropped)" in shown.stdout
    # the question alone as the user message, the template's generation prompt after it, no system message
    assert "How many now?<|im_end|>\n<|im_start|>assistant\n" in shown.stdout
    assert "<|im_start|>system" not in shown.stdout
    run = tmp_path / "run"
    summary = train(run, *SHORT, cwd=tmp_path)
    assert summary["steps"] == 2 and 0 <= summary["eval_first"] <= 1 and 0 <= summary["eval_last"] <= 1
    m = metrics_by_step(run)
    assert m[1]["env/gsm/data/epoch"] == 0 and 0 <= m[1]["env/gsm/data/row"] < 300  # the last train step
    assert ordinals(run) >= 2 * 2  # two groups of 4 per batch of 8, every step
