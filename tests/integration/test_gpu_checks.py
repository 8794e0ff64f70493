"""The one-GPU check of benchmarks/gpu/ (check_one_gpu.sh), run on a CPU so that it cannot rot between the rare
loans of a GPU: the same four parts — the trainer rank's steps, its rows over the weight group to a receiver bit
for bit, the built-in engine serving them, the rank lending its device to generation — on a tiny model. And what it relies on to run on a machine without Ray:
the trainer rank, the weight group and the engine import without it."""

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu import one_gpu_check

ROOT = Path(__file__).resolve().parents[2]


def test_the_one_gpu_check_runs_its_four_parts_on_a_cpu(tmp_path: Path) -> None:
    assert one_gpu_check.main([str(tmp_path), "--device", "cpu"]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["errors"] == {}
    assert result["train"]["version"] == 2 and result["train"]["tokens_per_s"] > 0
    weights = result["weights"]
    assert weights["receiver"]["version"] == 2
    assert weights["bit_identical"] and weights["tensors_compared"] == weights["tensors_received"] > 0
    serve = result["serve"]
    assert serve["tokens"] == one_gpu_check.NEW_TOKENS
    # fp32 engine on a CPU: the served log-probs are the trained weights' own, and not the initial weights'
    assert serve["mean_abs_logprob_diff_vs_trained"] < 1e-4 < serve["mean_abs_logprob_diff_vs_initial"]
    lend = result["lend"]  # the trainer's own fp32 tensors, served in its process: the trained weights' log-probs
    assert lend["versions_are_the_trainers"] and len(lend["token_ids"]) == one_gpu_check.NEW_TOKENS
    assert lend["mean_abs_logprob_diff_vs_trained"] < 1e-5 and lend["busy_s"] > 0


def test_the_trainer_rank_the_weight_group_and_the_engine_import_without_ray() -> None:
    code = ("import sys; sys.modules['ray'] = None\n"  # any import of ray now raises ImportError
            "import rollart.trainer, rollart.algo, rollart.weights.collective, rollart.inference.builtin_engine\n"
            "from rollart.trainer import Trainer\n"
            "import benchmarks.gpu.one_gpu_check, benchmarks.trainer_ranks\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
