"""Cost models of the twin against hand computation, the catalogue's sources, and O(1) token runs."""

import pytest

from rollart.sim.costs import EngineCost, TrainerCost, WeightSyncCost
from rollart.sim.hardware import MODEL_SHAPES, EngineEfficiency, SimHardware, TrainerSpec, WeightSyncSpec, load_catalogue
from rollart.sim.tokens import Runs


def test_every_catalogue_figure_has_a_source() -> None:
    cat = load_catalogue()
    for name in ("H800", "H20", "H100", "A100", "L40S"):
        kind = cat.gpu(name)
        assert kind.sources and all(kind.sources.values()), name
    assert cat.cpus["CPU"].sources and cat.network.sources
    with pytest.raises(ValueError, match="unknown GPU kind 'B300'.*'H20'"):
        cat.gpu("B300")


def test_engine_formulas() -> None:
    m, h800 = MODEL_SHAPES["qwen3-8b"], load_catalogue().gpu("H800")
    eff = EngineEfficiency(mfu_prefill=0.5, mfu_decode=0.5, bandwidth=0.8, step_overhead_s=0.003)
    cost = EngineCost(m, h800, 2, eff)
    flops = 2 * 989e12
    attn = 4 * 36 * 32 * 128
    assert cost.prefill_s(1000, 500) == pytest.approx((2 * 8.2e9 * 1000 + attn * 1000 * 1000) / (flops * 0.5))
    kv = 2 * 36 * 8 * 128 * 2
    memory = (8.2e9 * 2 + 10_000 * kv) / (2 * 3350e9 * 0.8)
    compute = (2 * 8.2e9 * 64 + attn * 10_000) / (flops * 0.5)
    assert cost.decode_step_s(64, 10_000) == pytest.approx(max(memory, compute) + 0.003)
    assert cost.kv_capacity_tokens() == int((2 * 80e9 * 0.9 - 8.2e9 * 2) / kv)


def test_h20_decodes_cheaper_and_h800_prefills_cheaper_per_dollar() -> None:
    """The paper's observation 1 follows from the catalogue: bandwidth per dollar vs FLOP/s per dollar."""
    cat, m, eff = load_catalogue(), MODEL_SHAPES["qwen3-8b"], EngineEfficiency()
    h800, h20 = (EngineCost(m, cat.gpu(k), 1, eff) for k in ("H800", "H20"))
    p800, p20 = h800.gpu.price_per_hour, h20.gpu.price_per_hour
    assert h800.prefill_s(4096) * p800 < h20.prefill_s(4096) * p20
    assert h20.decode_step_s(32, 32 * 4096) * p20 < h800.decode_step_s(32, 32 * 4096) * p800


def test_a_model_that_does_not_fit_says_so() -> None:
    cost = EngineCost(MODEL_SHAPES["qwen3-32b"], load_catalogue().gpu("L40S"), 1, EngineEfficiency())
    with pytest.raises(ValueError, match="does not fit on 1 GPU.*raise the pool's tp"):
        cost.kv_capacity_tokens()


def test_trainer_and_weight_sync() -> None:
    m, h800 = MODEL_SHAPES["qwen3-32b"], load_catalogue().gpu("H800")
    trainer = TrainerCost(m, h800, 32, TrainerSpec(mfu=0.4, flops_per_token_factor=8, fixed_s=1))
    assert trainer.step_s(1_000_000) == pytest.approx(8 * 32.8e9 * 1e6 / (32 * 989e12 * 0.4) + 1)
    sync = WeightSyncCost(m, 6.46, WeightSyncSpec(naive_streams=2, bucket_gb=1, swap_s=0.5), engines=10)
    transfer = 32.8e9 * 2 / 6.46e9
    assert sync.naive_exposed_s() == pytest.approx(transfer + 5 * transfer + 0.5)
    assert sync.overlapped_exposed_s(background_s=1e6) == pytest.approx(0.5)
    assert sync.overlapped_exposed_s(background_s=0) == pytest.approx(transfer + 1 / 6.46 + 0.5)


def test_hardware_file_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match="pools.h.gpu: unknown GPU kind 'X'"):
        SimHardware.model_validate({"model": "qwen3-8b", "pools": {"h": {"gpu": "X", "count": 8}, "train": {"gpu": "H800", "count": 8}}})
    with pytest.raises(ValueError, match="unknown shape 'gpt-9'"):
        SimHardware.model_validate({"model": "gpt-9", "pools": {}})
    with pytest.raises(ValueError, match="count 6 is not a multiple of tp 4"):
        SimHardware.model_validate({"model": "qwen3-8b", "pools": {"train": {"gpu": "H800", "count": 6, "tp": 4}}})


def test_runs_behave_like_the_tuple_they_stand_for() -> None:
    r = Runs.of(3, 2) + Runs.of(4, 3)
    assert len(r) == 5 and list(r) == [3, 3, 4, 4, 4] and r[1] == 3 and r[-1] == 4 and min(r) == 3
    assert r == (3, 3, 4, 4, 4) and r[1:3] == (3, 4) and r.values() == (3, 4)
    assert len(Runs.of(0, 10**9)) == 10**9  # O(1) memory
    with pytest.raises(IndexError):
        r[5]


def test_shared_runs_are_one_object_per_value_type_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollart.sim import tokens

    monkeypatch.setattr(tokens, "_shared", {})
    a = Runs.shared(0, 7)
    assert a is Runs.shared(0, 7) and a == Runs.of(0, 7) and list(a) == [0] * 7
    logprobs = Runs.shared(0.0, 7)  # 0 == 0.0, but a logprob stays a float
    assert logprobs is not a and all(type(x) is float for x in logprobs)
    assert Runs.shared(0, 8) is not a and Runs.shared(1, 7) is not a and len(Runs.shared(0, 0)) == 0
    monkeypatch.setattr(tokens, "SHARED_MAX", 3)
    b = Runs.shared(2, 2)  # the table is full: it starts afresh, values unchanged
    assert len(tokens._shared) == 1 and b == (2, 2) and Runs.shared(0, 7) == a


def test_a_reports_step_figures_can_be_taken_over_its_first_steps_only():
    """`bench sim` compares a 50-step run with 8-step ones over the same steps."""
    from rollart.sim.run import SimReport

    steps = [{"step_s": s, "trajectories": 10.0} for s in (30.0, 10.0, 10.0, 40.0, 40.0)]
    report = SimReport(steps, 130.0, 0.0, 1.0, {}, {}, {}, [], [], [], 0.0)
    assert report.mean_step_s() == 25.0 and report.mean_step_s(upto=3) == 10.0
    assert report.steady_trajectories_per_s(upto=3) == 1.0 and report.steady_trajectories_per_s() == 0.4
    assert report.mean_step_s(upto=1) == 30.0  # nothing left after the skip: the steps there are
