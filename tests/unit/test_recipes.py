"""The cluster recipes of examples/recipes (the paper's setups: Qwen3-8B and Qwen3-32B, FrozenLake, math and code
on H800/H20 pools, batch 512 × group 8) load, and run briefly through `rollart sim` with their hardware files
with every invariant held; on this machine (offline, no vLLM) `rollart train` refuses them before anything
starts, naming each hub id, the cache and HF_HUB_OFFLINE."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.cli import main
from rollart.config.loader import load_config

RECIPES = Path(__file__).parents[2] / "examples" / "recipes"
PAIRS = [("qwen3-8b.yaml", "hardware-qwen3-8b.yaml"), ("qwen3-32b.yaml", "hardware-qwen3-32b.yaml")]


@pytest.mark.parametrize("recipe, hardware", PAIRS)
def test_a_cluster_recipe_runs_through_the_twin(recipe: str, hardware: str, tmp_path: Path, capsys) -> None:
    cfg = load_config(RECIPES / recipe)
    assert (cfg.rollout.batch_size, cfg.rollout.group_size) == (512, 8) and cfg.model.path.startswith("Qwen/Qwen3-")
    assert {d: c.pool for d, c in cfg.domains.items()} == {"frozenlake": "h800", "math": "h20", "code": "h20"}
    assert cfg.domains["math"].data.train == "openai/gsm8k" and cfg.domains["code"].reward.fn == "code"
    assert main(["sim", str(RECIPES / recipe), "train.steps=2", f"run_dir={tmp_path / 'run'}",
                 "--hardware", str(RECIPES / hardware)]) == 0
    out = capsys.readouterr().out
    assert "batches of 512 trajectories (groups of 8" in out and "invariants: 0 ledger and 0 staleness violations" in out
    for domain in ("frozenlake", "math", "code"):
        assert f"{domain}: declared profile" in out


def test_offline_a_cluster_recipe_is_refused_before_anything_starts(tmp_path: Path, capsys,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["train", str(RECIPES / "qwen3-8b.yaml"), f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "model.path='Qwen/Qwen3-8B' is not in the Hugging Face cache" in err and "HF_HUB_OFFLINE" in err
    assert "domains.math.data.train: hub dataset 'openai/gsm8k' subset 'main' split 'train' cannot be loaded" in err
    assert not (tmp_path / "run").exists()
