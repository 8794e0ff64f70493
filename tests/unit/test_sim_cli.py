"""`rollart sim`: a run file and a hardware file in; what it simulates, a step breakdown that adds up, and the
invariants out; bad input exits 2 naming the file or the pool. `rollart plan` on the default run says what it
filled in and why its cost differs from the budget."""

import re
from pathlib import Path

import yaml

from rollart.cli import main


def test_rollart_sim_prints_the_breakdown(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    hw = tmp_path / "hw.yaml"
    hw.write_text("model: qwen3-8b\npools:\n  gen_prefill: {gpu: H800, count: 2}\n  gen_decode: {gpu: H20, count: 2}\n"
                  "  train: {gpu: H800, count: 8}\n")
    out_json = tmp_path / "sim.json"
    assert main(["sim", "--hardware", str(hw), "train.steps=3", "rollout.batch_size=16", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "gen_decode: 2 engines" in out and "invariants: 0 ledger and 0 staleness" in out
    assert out_json.exists()
    # what it simulates, before it does
    assert "simulating 3 RL steps of batches of 16 trajectories" in out
    assert "gen_decode: 2 H20, tp 1 = 2 engines, generating for math" in out
    assert "math: no profile declared: the default of a math domain" in out
    assert "math: its responses are cut at max_new_tokens=12" in out
    assert [f"  step {i}/3: " in out for i in (1, 2, 3)] == [True] * 3  # progress, step by step
    # the step time's parts add up to it
    step, wait, rest = map(float, re.search(
        r"step time ([\d.]+) s \(steady state\) = waiting for the batch ([\d.]+) s \+ waiting for the train "
        r"step in flight to land, or an evaluation ([\d.]+) s", out).groups())
    assert abs(step - wait - rest) <= 0.011, out


def test_rollart_plan_says_what_it_filled_in_and_what_the_cost_is(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    hw = Path(__file__).parents[2] / "examples" / "cluster" / "hardware.yaml"  # the README's hardware file
    out_dir = tmp_path / "plan"
    assert main(["plan", "--hardware", str(hw), "--budget", "300", "--top-k", "1", "--steps", "2",
                 "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "note: frozenlake: no profile declared" in out and "note: math: max_new_tokens 12 → 16384" in out
    cost = re.search(r"cost \$([\d,.]+)/h = \$([\d,.]+)/h generation GPUs \(the budget: \$300\.00/h.*\+ \$([\d,.]+)/h "
                     r"training \(32 H800 of the hardware file's pool train\)", out)
    assert cost, out
    total, generation, training = (float(x.replace(",", "")) for x in cost.groups())
    assert generation <= 300 and abs(total - generation - training) < 0.01
    run = yaml.safe_load((out_dir / "run.yaml").read_text())
    assert run["model"]["path"] == "Qwen/Qwen3-8B" and run["domains"]["math"]["max_new_tokens"] == 16384
    assert "# math: no profile declared" in (out_dir / "run.yaml").read_text()


def test_rollart_sim_bad_input(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["sim", "--hardware", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read it" in capsys.readouterr().err
    hw = tmp_path / "hw.yaml"
    hw.write_text("model: qwen3-8b\npools:\n  train: {gpu: H800, count: 8}\n")
    assert main(["sim", "--hardware", str(hw)]) == 2
    assert "pool 'gen_decode' (used by the run config) has no GPUs" in capsys.readouterr().err
