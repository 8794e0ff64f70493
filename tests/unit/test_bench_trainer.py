"""`rollart bench trainer`'s assembly: rows, ratios and notes from the ranks' measurements (the ranks faked —
what they measure is the bench's own run; this checks the arithmetic and that every figure reaches the result)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import trainer as bench


def _rank(rank: int, train: dict[str, Any], name: str = "") -> dict[str, Any]:
    fsdp = train.get("strategy", "fsdp2") == "fsdp2"
    rise = 100.0 if train.get("activation_checkpointing") else 400.0
    padded = train.get("packing", True) is False
    return {"rank": rank, "rss_imported_mb": 300.0, "rss_built_mb": 320.0, "rss_before_mb": 400.0,
            "rss_peak_mb": 400.0 + rise, "step_s": 2.0 if padded else 1.0, "losses": [0.5, 0.25, 0.125],
            "state_mb": 7.0 if fsdp else 14.0, "params": 1_000_000, "tokens": 4096,
            "padding": 0.3 if padded else 0.0, "wall_s": 5.0, "name": name}


def test_ratios_and_notes_come_from_the_rows(monkeypatch, tmp_path: Path) -> None:
    jobs: list[dict[str, Any]] = []

    def spawn(job: dict[str, Any], work: Path, label: str) -> list[dict[str, Any]]:
        jobs.append(job)
        names = job.get("strategies") or [""]
        return [_rank(r, {**job["train"], **({"strategy": n} if n else {})}, n) for n in names for r in (0, 1)]

    monkeypatch.setattr(bench, "_spawn", spawn)
    monkeypatch.setattr(bench, "build_model", lambda directory, shape, seed=0: directory)
    monkeypatch.setattr(bench, "_demo_samples", lambda: [])
    monkeypatch.setattr(bench, "_logprob_peaks", lambda shape, tokens, work: {0: 400.0, 512: 50.0})
    result = bench.run(quick=True)
    r = result.ratios
    assert r["fsdp2_vs_ddp_max_abs_loss_diff"] == 0.0
    assert r["fsdp2_state_bytes_vs_ddp"] == 0.5
    assert r["ac_activation_peak_reduction"] == 4.0
    assert r["chunked_logprob_peak_reduction"] == 8.0
    assert r["packing_padding_reduction"] is None and r["packing_tokens_per_s_gain"] == 2.0
    assert r["max_params_fsdp2_bf16_ac_vs_ddp_fp32"] > 1
    assert [row["setting"] for row in result.rows] == [n for n, _ in bench.SETTINGS] + ["packing-on", "packing-off"]
    bf16_jobs = [j for j in jobs if j["train"].get("precision") == "bf16"]
    assert bf16_jobs and all("bf16_via_float32" in j for j in bf16_jobs)
    assert all(j["warmup"] == bench.WARMUP[True] for j in jobs if j.get("lengths") == bench.LENGTHS[True])
    assert any(n.startswith("wall time: rows ddp-fp32 5 s") for n in result.notes)


def test_rows_runs_only_the_named_parts_and_their_ratios(monkeypatch, tmp_path: Path) -> None:
    labels: list[str] = []

    def spawn(job: dict[str, Any], work: Path, label: str) -> list[dict[str, Any]]:
        labels.append(label)
        return [_rank(r, job["train"]) for r in (0, 1)]

    monkeypatch.setattr(bench, "_spawn", spawn)
    monkeypatch.setattr(bench, "build_model", lambda directory, shape, seed=0: directory)
    monkeypatch.setattr(bench, "_logprob_peaks", lambda shape, tokens, work: {0: 400.0, 512: 50.0})
    result = bench.run(quick=True, rows="fsdp2-bf16-ac,fsdp2-bf16")
    assert labels == ["fsdp2-bf16", "fsdp2-bf16-ac"]
    assert result.ratios == {"ac_activation_peak_reduction": 4.0}
    assert any("--rows: only fsdp2-bf16, fsdp2-bf16-ac ran" in n for n in result.notes)
    for bad in ("fsdp2-bf16,nope", "confirmation", ""):
        with pytest.raises(ValueError, match="--rows"):
            bench.parse_rows(bad)
