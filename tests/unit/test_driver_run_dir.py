"""The driver refuses to train over an existing run unless it resumes it (nothing done is lost)."""

import pytest

from rollart.config.loader import ConfigError, load_config
from rollart.job.preflight import check_run_dir


def test_an_existing_run_is_continued_or_refused(tmp_path):
    run = tmp_path / "run"
    check_run_dir(load_config(None, [f"run_dir={run}"]))  # nothing there yet: fine
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"already holds a run \(metrics.jsonl\); add resume=true"):
        check_run_dir(load_config(None, [f"run_dir={run}"]))
    check_run_dir(load_config(None, [f"run_dir={run}", "resume=true"]))


def test_a_stopped_run_names_the_exact_command_that_continues_it(tmp_path):
    from rollart.cli.commands.train import resume_command, resume_hint
    from rollart.trainer.checkpoint import STATE

    items = ["my run.yaml", "train.steps=5", "resume=false", "run_dir=elsewhere"]
    assert resume_command(items, "runs/a b") == (
        "rollart train 'my run.yaml' train.steps=5 'run_dir=runs/a b' resume=true")
    cfg = load_config(None, [f"run_dir={tmp_path}"])
    assert "from the start (no checkpoint was written yet)" in resume_hint([], cfg)
    (tmp_path / "checkpoints" / "step_00000007").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_00000007" / f"{STATE}.json").write_text("{}")
    assert resume_hint([], cfg).startswith("To continue from its last checkpoint (step_00000007):")
