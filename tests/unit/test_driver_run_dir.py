"""The driver refuses to train over an existing run unless it resumes it (nothing done is lost)."""

import pytest

from rollart.config_loader import ConfigError, load_config
from rollart.driver import check_run_dir


def test_an_existing_run_is_continued_or_refused(tmp_path):
    run = tmp_path / "run"
    check_run_dir(load_config(None, [f"run_dir={run}"]))  # nothing there yet: fine
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"already holds a run \(metrics.jsonl\); add resume=true"):
        check_run_dir(load_config(None, [f"run_dir={run}"]))
    check_run_dir(load_config(None, [f"run_dir={run}", "resume=true"]))
