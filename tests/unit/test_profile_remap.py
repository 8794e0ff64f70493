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
    """`game` is declared decode-heavy on H20; from version 2 on its episodes are prefill-heavy multi-turn:
    the profiler sees the drift, confirms it on fresh turns, asks the re-mapper (here one that always moves
    `game` to H800; the choice itself is `rollart bench sim`'s remap experiment), and the proxy routes new
    `game` trajectories to H800 (auto) — or the proposal is only recorded (propose)."""
    shifted = DomainProfileConfig.model_validate({"turns": {"mean": 6}, "prompt_tokens": {"mean": 6000},
                                                  "obs_tokens": {"mean": 4000}, "response_tokens": {"mean": 30}})
    hw = presets.hardware({"h800": ("H800", 8, 1), "h20": ("H20", 24, 1)}, train=("H800", 8))
    calls = []

    def remapper(cfg, hardware, pools, tp):  # noqa: ANN001, ANN202
        calls.append(cfg.domains["game"].profile.obs_tokens.mean)
        return (("frozenlake", "h800"), ("game", "h800"), ("math", "h20"))

    for mode in ("propose", "auto"):
        cfg = presets.run_config(presets.mapped({"game": "h20", "math": "h20", "frozenlake": "h800"}), batch=48,
                                 steps=7, extra=[f"rollout.remap={mode}", "rollout.remap_drift=0.5"])
        report = simulate(cfg, hw, shifts={"game": (2, shifted)}, remapper=remapper)
        remaps = report.extra["remaps"]
        assert len(remaps) == 1 and "game" in remaps[0]["drift"] and remaps[0]["moved"] == {"game": "h800"}
        assert remaps[0]["applied"] == (mode == "auto")
        assert calls[-1] == 4000  # the re-mapper saw the new workload alone, not a blend with the old one
        final = report.extra["domain_pools"]["game"]
        assert final == ("h800" if mode == "auto" else "h20")
        assert report.ledger_violations == [] and report.staleness_violations == []
