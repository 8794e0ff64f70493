"""The README's promise: whatever a config names that can be checked is checked before the cluster starts.
Each check below stops `rollart train` with exit 2 and a message naming the key and what would be valid —
and the test measures that no Ray process was started (`ray.init` never called, no new child process)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Iterator

import psutil
import pytest
import ray

from rollart.cli import main
from rollart.config.loader import ConfigError, load_config
from rollart.job.preflight import check_config


@pytest.fixture
def no_ray_started(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fails the test if Ray is initialised or any process is started while it runs."""
    calls: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: calls.append((a, k)) or pytest.fail("ray.init was called"))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    was_up = ray.is_initialized()
    yield
    assert not calls and ray.is_initialized() == was_up
    started = [p.pid for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert started == [], f"processes started during preflight: {started}"


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *overrides: str) -> str:
    """`rollart train` on the default run with `overrides`: its exit code must be 2; its message."""
    code = main(["train", f"run_dir={tmp_path / 'run'}", *overrides])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not (tmp_path / "run").exists()  # nothing was written either
    return err


def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> None:
    """`name.py` in a fresh current directory (user specs import from there)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.parametrize("key,module", [("observability.wandb_project=demo", "wandb"),
                                        ("observability.mlflow_uri=file:/tmp/mlruns", "mlflow")])
def test_an_integration_that_is_not_installed(tmp_path, capsys, monkeypatch, no_ray_started, key, module) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # not importable, whatever this machine has
    err = refused(tmp_path, capsys, key)
    assert f"{key.split('=')[0]}: needs the {module} package, which is not installed here: " \
           f"pip install 'rollart[{module}]'" in err


def test_a_model_path_that_is_not_a_checkpoint(tmp_path, capsys, no_ray_started) -> None:
    err = refused(tmp_path, capsys, f"model.path={tmp_path / 'nowhere'}")
    assert "model.path=" in err and "no such directory, and not a hub id (org/name); give a local Hugging Face checkpoint" in err
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text('{"model_type": "qwen3"}')
    (tmp_path / "half" / "pytorch_model.bin").write_bytes(b"\x80\x04")  # a pickle
    err = refused(tmp_path, capsys, f"model.path={tmp_path / 'half'}")
    assert "no *.safetensors weights there (pytorch_model.bin is a pickle" in err


def test_an_env_without_step(tmp_path, capsys, monkeypatch, no_ray_started) -> None:
    user_module(tmp_path, monkeypatch, "half_env", """
        class HalfEnv:
            def reset(self, seed=None):
                return "obs", {}
        """)
    err = refused(tmp_path, capsys, "domains.mine.env=half_env:HalfEnv")
    assert "domains.mine.env: half_env:HalfEnv has no step() method; an env needs reset(seed)" in err


def test_an_env_without_expert_action_under_a_warm_start_names_both_ways_out(tmp_path, capsys, monkeypatch,
                                                                            no_ray_started) -> None:
    user_module(tmp_path, monkeypatch, "plain_env", """
        class PlainEnv:
            def reset(self, seed=None):
                return "obs", {}
            def step(self, action):
                return "obs", 1.0, True, False, {}
        """)
    err = refused(tmp_path, capsys, "domains.mine.env=plain_env:PlainEnv")
    assert "domains.mine.env: plain_env:PlainEnv has no expert_action() method, which the warm start " \
           "(train.warm_start.steps=100) needs" in err
    assert "Either add expert_action() -> str" in err and "or set train.warm_start.steps=0" in err
    # either way out passes: no warm start, or the domain only evaluated
    check_config(load_config(None, ["domains.mine.env=plain_env:PlainEnv", "train.warm_start.steps=0",
                                    f"run_dir={tmp_path / 'run'}"]))
    check_config(load_config(None, ["domains.mine.env=plain_env:PlainEnv", "domains.mine.weight=0",
                                    f"run_dir={tmp_path / 'run'}"]))
    with pytest.raises(ConfigError, match=r"no expert_action\(\) and random_action\(\) method"):
        check_config(load_config(None, ["domains.mine.env=plain_env:PlainEnv", "train.warm_start.expert_prob=0.5",
                                        f"run_dir={tmp_path / 'run'}"]))


def test_an_agent_that_does_not_import(tmp_path, capsys, monkeypatch, no_ray_started) -> None:
    monkeypatch.chdir(tmp_path)
    err = refused(tmp_path, capsys, "domains.puzzle.agent=no_such_agents:run")
    assert "domains.puzzle.agent:" in err and "cannot import module 'no_such_agents'" in err


def test_an_agent_domain_without_demonstrations_under_a_warm_start_says_so(caplog) -> None:
    from rollart.job.warm_start import run_warm_start

    cfg = load_config(None, ["domains.frozenlake=null", "domains.math=null", "domains.puzzle.agent=agents:run"])

    class NoTrainer:
        def sft_step(self, samples):  # noqa: ANN001
            raise AssertionError("nothing to demonstrate: no supervised step may run")

    with caplog.at_level("INFO", logger="rollart"):
        run_warm_start(cfg, NoTrainer(), "unused")
    lines = [r.getMessage() for r in caplog.records]
    assert "warm start: agent domain puzzle names no demonstrations (domains.puzzle.demonstrations): it starts RL " \
           "from the model as it is" in lines
    assert "warm start skipped: no trained domain has demonstrations (train.warm_start.steps=100)" in lines


def test_elastic_generation_beside_another_engine_is_refused(tmp_path, capsys, no_ray_started) -> None:
    """The trainer's ranks generate with the built-in engine: beside vLLM pools one run would sample with two."""
    err = refused(tmp_path, capsys, "train.elastic_generation=true", "inference.engine=vllm")
    assert "train.elastic_generation" in err and "inference.engine='vllm'" in err and "inference.engine=builtin" in err
