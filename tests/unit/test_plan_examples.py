"""`rollart plan` with every hardware file the repository ships writes a run that `rollart config show --cluster`
accepts (the batch raised to what the cluster's training GPUs need, and said), or refuses before simulating."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.cli.main import main

EXAMPLES = Path(__file__).parents[2] / "examples"
HARDWARE = sorted(p for p in EXAMPLES.rglob("*.yaml") if "hardware" in p.name)


def test_the_examples_ship_hardware_files() -> None:
    assert {p.name for p in HARDWARE} >= {"hardware.yaml", "hardware-qwen3-8b.yaml", "hardware-qwen3-32b.yaml"}


@pytest.mark.parametrize("hardware", HARDWARE, ids=lambda p: p.name)
def test_every_shipped_hardware_file_plans_a_valid_run(hardware: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan"
    assert main(["plan", "--hardware", str(hardware), "--budget", "300", "--steps", "2", "--top-k", "1",
                 "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert (out / "run.yaml").is_file() and "rollart config show" in said
    assert main(["config", "show", str(out / "run.yaml"), "--cluster"]) == 0
    shown = capsys.readouterr().out
    if "hardware-qwen3-32b" in hardware.name:  # 64 training GPUs: the default batch of 36 could not feed them
        assert "note: rollout.batch_size 36 → 64 (the hardware's 64 training GPUs" in said
        assert "batch_size: 64" in shown and "workers: 64" in shown


def test_a_hardware_file_whose_training_pool_has_no_gpu_is_refused_before_simulating(tmp_path: Path, capsys) -> None:
    hw = tmp_path / "hw.yaml"
    hw.write_text((EXAMPLES / "cluster" / "hardware.yaml").read_text().replace("train: {gpu: H800, count: 32}",
                                                                               "train: {gpu: H800, count: 0}"))
    assert main(["plan", "--hardware", str(hw), "--budget", "300", "--out", str(tmp_path / "plan")]) == 2
    captured = capsys.readouterr()
    assert "the training pool has no GPUs" in captured.err and "twin" not in captured.out
