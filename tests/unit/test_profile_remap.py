"""The online profiler's means and drift, and re-mapping: new trajectories follow the new mapping while
in-flight ones stay on their worker; the twin proposes and applies a re-mapping after a workload shift."""

from rollart.config import CountConfig, DomainProfileConfig
from rollart.inference.router import Router
from rollart.observability.profile import DomainProfiler
from rollart.sim import presets
from rollart.sim.run import simulate


def test_profiler_means_and_drift() -> None:
    prof = DomainProfiler(window=4)
    for turns in (2, 4):
        prof.observe_turn("d", 100, 50, 100, 40, 1.0, first=True)
        prof.observe_turn("d", 30, 50, 180, 30, 1.0, first=False)
        prof.observe_episode("d", turns, 2.0)
    m = prof.metrics()
    assert m["profile/d/turns"] == 3 and m["profile/d/prompt_tokens"] == 100 and m["profile/d/obs_tokens"] == 30
    assert m["profile/d/prefix_hit"] == (0.6 + 1 - 30 / 180) / 2 and m["profile/d/reward_s"] == 2.0
    declared = DomainProfileConfig(turns=CountConfig(mean=3), prompt_tokens=CountConfig(mean=100),
                                   obs_tokens=CountConfig(mean=30), response_tokens=CountConfig(mean=25))
    assert prof.drift("d", declared) == 1.0  # response tokens 50 against 25 declared
    assert prof.measured("d", declared).response_tokens.mean == 50
    for _ in range(4):  # the window forgets old turns
        prof.observe_turn("d", 100, 25, 100, 0, 1.0, first=True)
    assert prof.mean("d", "response_tokens") == 25


def test_router_remap_moves_new_trajectories_only() -> None:
    r = Router({"a": 2, "b": 2}, {"d": "a"})
    old = r.route("d", "t1")
    r.remap({"d": "b"})
    assert r.route("d", "t1") == old  # in flight: stays where its KV is
    assert r.route("d", "t2")[0] == "b"


def test_the_twin_remaps_a_domain_whose_profile_drifted() -> None:
    """`game` is declared decode-heavy and mapped to H20; from version 2 on its episodes are prefill-heavy
    multi-turn: the profiler sees the drift, the re-mapper's estimate prefers another mapping for the
    measured profiles, and applies it (auto) or only says so (propose)."""
    shifted = DomainProfileConfig.model_validate({"turns": {"mean": 6}, "prompt_tokens": {"mean": 6000},
                                                  "obs_tokens": {"mean": 4000}, "response_tokens": {"mean": 30}})
    hw = presets.hardware({"h800": ("H800", 8, 1), "h20": ("H20", 24, 1)}, train=("H800", 8))
    for mode in ("propose", "auto"):
        cfg = presets.run_config(presets.mapped({"game": "h20", "math": "h20", "frozenlake": "h800"}), batch=48,
                                 steps=6, extra=[f"rollout.remap={mode}", "rollout.remap_drift=0.5"])
        report = simulate(cfg, hw, shifts={"game": (2, shifted)})
        remaps = report.extra["remaps"]
        assert remaps and all("game" in r["drift"] for r in remaps)
        moved = {d: p for r in remaps for d, p in r["moved"].items()}
        assert moved, remaps  # the estimate prefers another mapping for the measured profiles
        assert all(r["applied"] == (mode == "auto") for r in remaps)
        final = report.extra["domain_pools"]
        if mode == "auto":
            assert all(final[d] == p for d, p in moved.items())
        else:
            assert final == {"game": "h20", "math": "h20", "frozenlake": "h800"}
        assert report.ledger_violations == [] and report.staleness_violations == []
