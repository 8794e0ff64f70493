"""The planner: it finds the exhaustive best mapping (within 5%) on 20 random small scenarios, and its
outputs load — the run file as a valid config, the manifest as a schema-valid KubeRay RayCluster."""

import copy
import random
from pathlib import Path

import jsonschema
import pytest
import yaml

from rollart.config_loader import load_config
from rollart.plan import plan, ray_start_lines, raycluster_manifest, run_yaml
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
