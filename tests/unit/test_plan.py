"""The planner: it finds the exhaustive best mapping (within 5%) on 20 random small scenarios; its outputs
load — the run file as a valid config, the manifest as a schema-valid KubeRay RayCluster — and the nodes of
`ray_start.sh` and the manifest add up to exactly the planned run's pools; a run without profiles gets its
kinds' defaults and is told so (or is refused), and the planned run names the hardware's model and budgets."""

import copy
import json
import random
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from rollart.config.loader import load_config
from rollart.plan import candidates, plan, ray_start_lines, raycluster_manifest, run_yaml
from rollart.plan.cluster import for_the_cluster
from rollart.plan.outputs import planned_config
from rollart.sim.profiles import MissingProfiles
from rollart.sim import presets

SCHEMA = Path(__file__).parents[1] / "fixtures" / "kuberay_raycluster_v1_schema.yaml"


def scenario(seed: int) -> tuple:
    """Two domains, each prefill-heavy (multi-turn, long observations) or decode-heavy (one long answer)."""
    rng = random.Random(seed)
    domains = {}
    for i in range(2):
        if rng.random() < 0.5:
            profile = {"turns": {"mean": rng.randint(2, 4)}, "prompt_tokens": {"mean": rng.randint(1000, 6000)},
                       "obs_tokens": {"mean": rng.randint(500, 3000)}, "response_tokens": {"mean": rng.randint(20, 100)}}
        else:
            profile = {"turns": {"mean": 1}, "prompt_tokens": {"mean": rng.randint(100, 500)},
                       "response_tokens": {"dist": "lognormal", "mean": rng.randint(500, 6000), "std": 500}}
        domains[f"d{i}"] = {"env": "frozenlake", "pool": "h800", "max_turns": 8, "max_new_tokens": 16000,
                            "max_total_tokens": 64000, "profile": profile}
    cfg = presets.run_config(domains, batch=16, group=4, steps=3)
    hw = presets.hardware({"h800": ("H800", 8, 1)}, train=("H800", rng.choice([4, 8])))
    return cfg, hw, rng.choice([27.0, 36.0, 45.0])


def test_the_planner_finds_the_exhaustive_best_on_random_scenarios() -> None:
    ratios = []
    for seed in range(20):
        cfg, hw, budget = scenario(seed)
        every = plan(cfg, hw, ["H800", "H20"], budget, node=4, steps=3, exhaustive=True)
        best = max(s.score for s in every.scored)
        # what the planner alone would have run: the analytic top 4 and the best homogeneous of each kind
        picked = sorted(every.scored, key=lambda s: -s.estimate)[:4]
        for kind in ("H800", "H20"):
            homo = [s for s in every.scored if s.candidate.homogeneous and s.candidate.pools[0][1] == kind]
            picked += homo[:1]
        ratios.append(max(s.score for s in picked) / best)
    assert min(ratios) >= 0.95, ratios


def strict(schema: dict) -> dict:
    """The CRD schema with unknown fields refused (the API server would silently drop them: a typo in a
    manifest must fail here instead)."""
    schema = copy.deepcopy(schema)

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def test_plan_outputs_load_as_a_config_and_a_schema_valid_raycluster(tmp_path: Path) -> None:
    cfg, hw, budget = scenario(3)
    result = plan(cfg, hw, ["H800", "H20"], budget, node=4, steps=2, top_k=2)
    cand = result.best.candidate
    run_file = tmp_path / "run.yaml"
    run_file.write_text(run_yaml(cfg, hw, cand, tp=1))
    loaded = load_config(run_file)
    for domain, pool in cand.mapping:
        assert loaded.domains[domain].pool == pool
    assert {name for name, _, _ in cand.pools} <= set(loaded.pools)
    manifest = raycluster_manifest(cfg, hw, cand, tp=1, node=4)
    schema = strict(yaml.safe_load(SCHEMA.read_text()))
    jsonschema.validate(manifest, schema)
    assert {g["groupName"] for g in manifest["spec"]["workerGroupSpecs"]} >= {n for n, _, _ in cand.pools}
    bad = copy.deepcopy(manifest)
    bad["spec"]["workerGroupSpecs"][0]["replica"] = 3  # a typo the schema must catch
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    lines = ray_start_lines(cfg, hw, cand, tp=1, node=4)
    assert lines[0].startswith("ray start --head") and all("--resources=" in line for line in lines)
    assert '"pool_env": 1' in lines[0]  # the run's CPU pool, with its slots
    gpus = sum(n for _, _, n in cand.pools) + hw.pools["train"].count
    assert sum(int(line.split("--num-gpus=")[1].split()[0]) for line in lines) == gpus


def test_the_planned_run_file_keeps_the_runs_settings(tmp_path: Path) -> None:
    cfg, hw, budget = scenario(4)
    cand = plan(cfg, hw, ["H800", "H20"], budget, node=4, steps=2, top_k=1).best.candidate
    run_file = tmp_path / "run.yaml"
    run_file.write_text(run_yaml(cfg, hw, cand, tp=1))
    loaded = load_config(run_file)
    assert loaded.rollout == cfg.rollout and set(loaded.domains) == set(cfg.domains)
    assert loaded.domains["d0"].profile == cfg.domains["d0"].profile


# --- the outputs add up to the run, and the run is one for the cluster -------------------------------------
def _ray_start_totals(lines: list[str]) -> tuple[int, dict[str, float]]:
    gpus, resources = 0, {}
    for line in lines:
        match = re.search(r"--num-gpus=(\d+) --resources='([^']*)'", line)
        assert match, line
        gpus += int(match.group(1))
        for key, value in json.loads(match.group(2)).items():
            resources[key] = resources.get(key, 0) + value
    return gpus, resources


def _manifest_totals(manifest: dict) -> tuple[int, dict[str, float]]:
    head = manifest["spec"]["headGroupSpec"]["rayStartParams"]
    gpus, resources = int(head["num-gpus"]), dict(json.loads(json.loads(head["resources"])))
    for group in manifest["spec"]["workerGroupSpecs"]:
        gpus += group["replicas"] * int(group["rayStartParams"]["num-gpus"])
        for key, value in json.loads(json.loads(group["rayStartParams"]["resources"])).items():
            resources[key] = resources.get(key, 0) + group["replicas"] * value
    return gpus, resources


def _check_sums(cfg, hw, cand, tp: int, node: int) -> None:  # noqa: ANN001
    planned = planned_config(cfg, hw, cand, tp)
    pools = {f"pool_{name}": pool.capacity for name, pool in planned.pools.items()}
    gpus = sum(n for _, _, n in cand.pools) + hw.pools[hw.train_pool].count
    for totals in (_ray_start_totals(ray_start_lines(cfg, hw, cand, tp, node)),
                   _manifest_totals(raycluster_manifest(cfg, hw, cand, tp, node))):
        assert totals == (gpus, pools), (cand.describe(), tp, node, totals, pools)
    assert planned.train.workers == hw.pools[hw.train_pool].count
    for name, _, n in cand.pools:  # a slot per engine, each engine's tp GPUs on one node, each slot used
        assert planned.pools[name].capacity == n // tp and planned.pools[name].device == "cuda"
        assert planned.inference.replicas_of(name) == n // tp


@pytest.mark.parametrize("tp,node,train", [(1, 8, 32), (2, 8, 12), (4, 4, 4), (2, 4, 10)])
def test_node_resources_add_up_to_the_pools_of_the_planned_run(tp: int, node: int, train: int) -> None:
    cfg, _ = for_the_cluster(load_config())  # the default run: CPU env and serverless reward pools beside
    hw = presets.hardware({"gen_prefill": ("H800", 8, tp), "gen_decode": ("H20", 8, tp)}, train=("H800", train))
    plans = candidates(sorted(cfg.domains), ["H800", "H20"], hw, 100.0, node, tp)
    assert len(plans) > 4
    for cand in plans[:3] + plans[-3:]:  # homogeneous and mixed clusters, every mapping kind
        _check_sums(cfg, hw, cand, tp, node)


def test_a_plan_without_profiles_says_so_and_uses_the_defaults_of_each_kind() -> None:
    cfg, notes = for_the_cluster(load_config())
    assert any(n.startswith("frozenlake: no profile declared: the default of a frozenlake domain") for n in notes)
    assert any(n.startswith("math: no profile declared: the default of a math domain") for n in notes)
    declared = presets.TASKS["math"]["profile"]["response_tokens"]["mean"]
    assert cfg.domains["math"].profile.response_tokens.mean == declared
    # the demo's 12-token answers would cut the profile's 4,000-token ones: the budgets grow, and it says so
    assert cfg.domains["math"].max_new_tokens == 16384 and any("math: max_new_tokens 12 → 16384" in n for n in notes)
    with pytest.raises(MissingProfiles, match=r"domains\.mine \(env my_envs:Env\).*declare domains\.<name>\.profile"):
        for_the_cluster(load_config(None, ["domains.mine.env=my_envs:Env"]))


def test_the_planned_run_names_the_model_of_the_hardware_file() -> None:
    cfg, _ = for_the_cluster(load_config())
    hw = presets.hardware({"h20": ("H20", 16, 2)}, train=("H800", 8))
    cand = candidates(sorted(cfg.domains), ["H20"], hw, 24.0, 8, 2)[0]
    planned = planned_config(cfg, hw, cand, tp=2)
    assert (planned.model.path, planned.model.dtype) == ("Qwen/Qwen3-8B", "bfloat16")
    assert planned.inference.engine == "vllm" and planned.inference.vllm.tensor_parallel_size == 2
    assert planned.domains["math"].max_new_tokens == 16384  # the profile's budget, not the demo's 12
    assert set(planned.pools) == {"train", "env", "reward", "h20"}
