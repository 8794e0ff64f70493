"""`rollart sim`: a run file and a hardware file in, the step breakdown and the invariants out; bad input
exits 2 naming the file or the pool."""

from pathlib import Path

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


def test_rollart_sim_bad_input(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    assert main(["sim", "--hardware", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read it" in capsys.readouterr().err
    hw = tmp_path / "hw.yaml"
    hw.write_text("model: qwen3-8b\npools:\n  train: {gpu: H800, count: 8}\n")
    assert main(["sim", "--hardware", str(hw)]) == 2
    assert "pool 'gen_decode' (used by the run config) has no GPUs" in capsys.readouterr().err
