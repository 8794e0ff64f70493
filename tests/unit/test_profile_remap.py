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


def _episode(domain: str, turns: int, obs: int = 30) -> "Trajectory":
    from rollart.types import Status, Task, Trajectory, Turn

    task = Task(f"{domain}/{turns}/{obs}", domain, "x", seed=0, group_id="g")
    shape = tuple(Turn((1,) * (100 if k == 0 else obs), (2,) * 8, (0.0,) * 8, (0,) * 8) for k in range(turns))
    return Trajectory(task.trajectory_id, task, 0, shape, Status.COMPLETED,
                      metrics={"context_tokens": 200.0, "prefill_tokens": 50.0})


def test_drift_watch_takes_the_first_episodes_as_the_baseline_and_confirms_a_drift_on_fresh_ones() -> None:
    from rollart.observability.profile import DriftWatch

    prof = DomainProfiler()
    watch = DriftWatch({"d": None}, threshold=0.5, min_episodes=2)
    prof.observe_trajectory(_episode("d", 1))
    assert watch.confirmed(prof) == {} and watch.planned["d"] is None  # one episode: no baseline yet
    prof.observe_trajectory(_episode("d", 1))
    assert watch.confirmed(prof) == {} and watch.planned["d"].turns.mean == 1.0
    assert prof.metrics()["profile/d/prefix_hit"] == 0.75  # from the env runner's prefix-cache counts
    for _ in range(2):
        prof.observe_trajectory(_episode("d", 4))
    assert watch.confirmed(prof) == {} and prof.count("d") == 0  # seen first: forgotten, to be confirmed
    prof.observe_trajectory(_episode("d", 4))
    assert watch.confirmed(prof) == {}  # still fewer fresh episodes than min_episodes
    prof.observe_trajectory(_episode("d", 4))
    assert watch.confirmed(prof) == {"d": 3.0}


def test_a_real_run_moves_a_drifted_domain_to_the_pool_of_the_workload_it_now_resembles() -> None:
    """The real `System`'s re-mapping at a weight sync (a stand-in proxy records what it is told): `a`
    turns from one turn into `b`'s four-turn shape, and is routed to `b`'s pool once the drift is confirmed;
    with `propose` it is only recorded."""
    import asyncio
    from types import SimpleNamespace

    from rollart.config.loader import load_config
    from rollart.inference.proxy_shards import ProxyShards
    from rollart.job.system import System

    class Proxy:
        def __init__(self) -> None:
            self.told: list[dict] = []
            self.remap = SimpleNamespace(remote=self._remap)

        async def _remap(self, moved):
            self.told.append(dict(moved))

    for mode in ("auto", "propose"):
        cfg = load_config(None, ["domains.frozenlake=null", "domains.math=null", "domains.a.env=frozenlake",
                                 "domains.a.pool=gen_decode", "domains.b.env=frozenlake", "domains.b.pool=gen_prefill",
                                 f"rollout.remap={mode}", "rollout.remap_min_episodes=2"])
        proxy = Proxy()
        system = System(cfg, None, None, None, SimpleNamespace(version=0), {}, ProxyShards([proxy]), None, None,  # type: ignore[arg-type]
                        None)

        async def syncs(system=system):
            for version, turns in enumerate((1, 1, 4, 4), start=1):
                for _ in range(2):
                    system.profiler.observe_trajectory(_episode("a", turns))
                    system.profiler.observe_trajectory(_episode("b", 4))
                await system.now_serving(version)

        asyncio.run(syncs())
        remaps = system.remapper.remaps
        assert len(remaps) == 1 and remaps[0]["version"] == 4 and remaps[0]["moved"] == {"a": "gen_prefill"}
        assert proxy.told == ([{"a": "gen_prefill"}] if mode == "auto" else [])
        assert [m.name for m in system.incidents] == ["remap" if mode == "auto" else "remap proposed"]
        assert system.inference_version == 4
