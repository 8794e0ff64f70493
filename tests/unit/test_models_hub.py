"""`model.path` as a hub id, resolved through a locally populated Hugging Face cache (offline); an uncached id
fails naming the id, the cache and HF_HUB_OFFLINE; pickled weights and checkpoints that need their own code
are refused, the latter naming model.trust_remote_code; importing rollart leaves HF_HUB_OFFLINE alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rollart.config import ModelConfig
from rollart.models import load_model, load_tokenizer, resolve_model_path
from rollart.models.loading import CheckpointError, ModelNotFound

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def populate_cache(cache: Path, repo_id: str, checkpoint: Path) -> Path:
    """A cache laid out as huggingface_hub writes it: blobs, a snapshot of symlinks, refs/main."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(p for p in checkpoint.iterdir() if p.is_file())):
        blob = repo / "blobs" / f"{i:040x}"
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_a_hub_id_resolves_through_the_cache_and_loads(tmp_path: Path, tiny_model_path: Path, offline) -> None:
    snapshot = populate_cache(tmp_path / "hub", "test-org/tiny-qwen", tiny_model_path)
    path = resolve_model_path(ModelConfig(path="test-org/tiny-qwen"), hub_cache=tmp_path / "hub")
    assert path == snapshot
    assert resolve_model_path(ModelConfig(path="test-org/tiny-qwen", revision=COMMIT), hub_cache=tmp_path / "hub") == snapshot
    model, tok = load_model(path), load_tokenizer(path)
    assert model.config.model_type == "qwen3" and tok.chat_template


def test_an_uncached_id_offline_names_the_id_the_cache_and_hf_hub_offline(tmp_path: Path, offline) -> None:
    with pytest.raises(ModelNotFound) as err:
        resolve_model_path(ModelConfig(path="Qwen/Qwen3-8B"), hub_cache=tmp_path / "empty-cache")
    message = str(err.value)
    assert "'Qwen/Qwen3-8B'" in message and str(tmp_path / "empty-cache") in message and "HF_HUB_OFFLINE" in message
    with pytest.raises(ModelNotFound, match="no such directory, and not a hub id"):
        resolve_model_path(ModelConfig(path="./no/such/dir"))


def test_preflight_names_an_uncached_hub_id_before_anything_starts(tmp_path: Path, offline, monkeypatch) -> None:
    from rollart.config import RunConfig
    from rollart.config.loader import ConfigError
    from rollart.job.preflight import check_config

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    cfg = RunConfig(run_dir=str(tmp_path / "run"), model=ModelConfig(path="Qwen/Qwen3-8B"))
    with pytest.raises(ConfigError, match="model.path='Qwen/Qwen3-8B' is not in the Hugging Face cache"):
        check_config(cfg)
    check_config(cfg, local=False)  # rollart sim: no checkpoint needed


def test_pickled_weights_are_refused(tmp_path: Path, tiny_model_path: Path) -> None:
    ckpt = tmp_path / "bin-only"
    shutil.copytree(tiny_model_path, ckpt)
    (ckpt / "model.safetensors").rename(ckpt / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="no \\*.safetensors weights there \\(pytorch_model.bin is a pickle"):
        resolve_model_path(ModelConfig(path=str(ckpt)))


def test_a_checkpoint_that_needs_its_own_code_is_refused_naming_the_key(tmp_path: Path, tiny_model_path: Path) -> None:
    ckpt = tmp_path / "custom"
    shutil.copytree(tiny_model_path, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"auto_map: AutoModelForCausalLM: modeling_custom.CustomForCausalLM\); "
                                              r"rollart does not run it unless you set model.trust_remote_code=true"):
        resolve_model_path(ModelConfig(path=str(ckpt)))
    assert resolve_model_path(ModelConfig(path=str(ckpt), trust_remote_code=True)) == ckpt


def test_importing_rollart_leaves_hf_hub_offline_to_the_caller(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    code = "import os, rollart.models.loading, rollart.job.system; print(os.environ.get('HF_HUB_OFFLINE'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "None"
