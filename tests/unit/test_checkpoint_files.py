"""Checkpoints are data only (JSON + safetensors): a real trainer's state round-trips exactly, no file of a
checkpoint is a pickle, and a planted pickle — in a checkpoint or as an old-format one — is refused, by
`Trainer.load` and by `rollart train resume=true`, before anything would unpickle it."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rollart.algo import PolicyObjective
from rollart.config import RunConfig
from rollart.trainer import Trainer
from rollart.trainer.checkpoint import UnsafeCheckpointError, check_checkpoint_files
from rollart.trainer.state_files import load_state, save_state


class Payload:
    """Unpickling this runs code: it touches a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def trainer(tiny_model_path) -> Trainer:
    cfg = RunConfig(model={"path": str(tiny_model_path)}, train={"schedule": "cosine", "warmup_steps": 1})
    return Trainer(cfg, PolicyObjective.of(cfg))


def test_state_files_round_trip_types_exactly(tmp_path):
    state = {
        "ints": {0: {"step": torch.tensor(3.0), "m": torch.randn(2, 3)}, 7: None},
        "tuple": (1, 2.5, "x", (True, None)), "nan": float("nan"), "big": 2**62,
        "python_rng": (3, tuple(range(5)), None), "numpy": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "tag_like": {"__tuple__": [1]}, "tuple_keys": {(1, 2): "a"},
    }
    save_state(tmp_path / "s", state)
    back = load_state(tmp_path / "s")
    assert set(back["ints"]) == {0, 7} and torch.equal(back["ints"][0]["m"], state["ints"][0]["m"])
    assert back["tuple"] == (1, 2.5, "x", (True, None)) and back["big"] == 2**62 and back["nan"] != back["nan"]
    assert back["python_rng"] == state["python_rng"] and back["tag_like"] == {"__tuple__": [1]}
    assert np.array_equal(back["numpy"], state["numpy"]) and back["numpy"].dtype == np.uint32
    assert back["tuple_keys"] == {(1, 2): "a"}
    with pytest.raises(TypeError, match=r"bad\['obj'\]: a Payload cannot go into a checkpoint"):
        save_state(tmp_path / "bad", {"obj": Payload(tmp_path / "m")})


def test_a_trainer_checkpoint_is_data_only_and_resumes_exactly(tiny_model_path, tmp_path):
    first = trainer(tiny_model_path)
    first.sft_step([[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "\\boxed{4}"}]] * 2)
    extra = {"step": 1, "run_id": "ab" * 16, "attempt": 2, "scheduler": {"rng": (3, (1, 2), None)}}
    first.save(tmp_path / "ckpt", extra)
    files = [p for p in (tmp_path / "ckpt").rglob("*") if p.is_file()]
    assert {str(p.relative_to(tmp_path / "ckpt")) for p in files} >= {
        "trainer_state.json", "extra_state.json", "rng/rank0.json", "rng/rank0.safetensors", "model.safetensors",
        "config.json", "sft_optimizer/rank0.json", "sft_optimizer/rank0.safetensors"}
    check_checkpoint_files(tmp_path / "ckpt")  # nothing in it would need unpickling
    assert not any(p.suffix in (".pt", ".bin", ".pkl") for p in files)

    second = trainer(tiny_model_path)
    assert second.load(tmp_path / "ckpt") == extra
    assert second.version == first.version == 1
    a, b = first.sft_optimizer.state_dict(), second.sft_optimizer.state_dict()
    assert a["param_groups"] == b["param_groups"] and a["state"].keys() == b["state"].keys()
    assert all(torch.equal(a["state"][k]["exp_avg"], b["state"][k]["exp_avg"]) for k in a["state"])
    assert first.scheduler.state_dict() == second.scheduler.state_dict()
    assert all(torch.equal(x, y) for x, y in zip(first.model.parameters(), second.model.parameters()))


@pytest.mark.parametrize("name", ["evil.pt", "rng/rank1.pkl", "notes"])  # the last: a pickle by its bytes
def test_a_planted_pickle_is_refused_and_never_loaded(tiny_model_path, tmp_path, name):
    marker = tmp_path / "code-ran"
    t = trainer(tiny_model_path)
    t.save(tmp_path / "ckpt", {"step": 1})
    planted = tmp_path / "ckpt" / name
    planted.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpointError, match=f"{planted}.*pickle"):
        trainer(tiny_model_path).load(tmp_path / "ckpt")
    assert not marker.exists()


def test_resume_true_refuses_a_planted_pickle_before_anything_starts(tmp_path):
    marker = tmp_path / "code-ran"
    run_dir = tmp_path / "run"
    planted = run_dir / "checkpoints" / "step_00000010" / "trainer_state.pt"  # an old-format checkpoint
    planted.parent.mkdir(parents=True)
    torch.save({"version": 10, "evil": Payload(marker)}, planted)
    proc = subprocess.run([sys.executable, "-m", "rollart.cli", "train", f"run_dir={run_dir}", "resume=true"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert str(planted) in proc.stderr and "pickle" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()
    assert not (run_dir / "metrics.jsonl").exists()  # nothing started


def test_a_resume_keeps_the_run_id_and_counts_the_attempt():
    """What the driver checkpoints (RunState) gives a resumed run the same run id, one attempt later."""
    from rollart.types import RunState

    assert RunState().restart_identity("fresh-id") == ("fresh-id", 0)  # a fresh run
    saved = RunState(step=10, run_id="ab" * 16, attempt=0).to_checkpoint()
    assert saved["run_id"] == "ab" * 16
    resumed = RunState.from_checkpoint(saved)
    assert resumed.restart_identity("unused") == ("ab" * 16, 1)
    assert RunState.from_checkpoint({**saved, "attempt": 1}).restart_identity("unused") == ("ab" * 16, 2)
    assert RunState.from_checkpoint({"step": 3}).restart_identity("new") == ("new", 0)  # an older checkpoint


def test_a_checkpoint_of_another_model_shape_is_refused_naming_the_tensor_and_both_shapes(tiny_model_path, tmp_path):
    from rollart.config import ModelConfig
    from rollart.models import resolve_model_path

    trainer(tiny_model_path).save(tmp_path / "ckpt", {})
    wider = resolve_model_path(ModelConfig(tiny={"intermediate_size": 256}), cache_dir=tmp_path / "cache")
    with pytest.raises(ValueError, match=r"ckpt: tensor 'model\.layers\.0\.mlp\.gate_proj\.weight' has shape "
                                         r"\[384, 128\] there but \[256, 128\] in this model"):
        trainer(wider).load(tmp_path / "ckpt")


def test_a_corrupt_optimizer_shard_is_named_before_anything_loads(tiny_model_path, tmp_path):
    from rollart.trainer.checkpoint import check_state_files
    from rollart.trainer.state_files import StateFileError

    t = trainer(tiny_model_path)
    t.sft_step([[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "\\boxed{4}"}]] * 2)
    t.save(tmp_path / "ckpt", {"step": 1})
    check_state_files(tmp_path / "ckpt")  # as written: sound
    index = tmp_path / "ckpt" / "sft_optimizer" / "rank0.json"
    index.write_text(index.read_text()[:40])  # cut short, as by a full disk
    with pytest.raises(StateFileError, match=r"sft_optimizer/rank0\.json: not an optimizer shard index"):
        check_state_files(tmp_path / "ckpt")
