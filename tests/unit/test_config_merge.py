"""Sparse run files and `key.path=value` overrides merge over the defaults as the loader promises."""

from __future__ import annotations

import textwrap

from rollart.config import RunConfig
from rollart.config.loader import dump_config, load_config, write_resolved


def test_a_sparse_file_changes_only_what_it_lists(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(textwrap.dedent("""\
        rollout: {alpha: 2}
        pools:
          env: {capacity: 8}
        """))
    cfg = load_config(path)
    default = RunConfig()
    assert cfg.rollout.alpha == 2
    assert cfg.rollout.batch_size == default.rollout.batch_size
    assert cfg.pools["env"].capacity == 8
    assert cfg.pools["env"].kind == default.pools["env"].kind  # merged into the default entry
    assert set(cfg.pools) == set(default.pools)


def test_overrides_apply_after_the_file_and_parse_yaml_values(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("train: {steps: 5}\n")
    cfg = load_config(path, ["train.steps=7", "pools.gen_prefill.fallback=[gen_decode, env]", "train.lr=3e-4"])
    assert cfg.train.steps == 7
    assert cfg.pools["gen_prefill"].fallback == ["gen_decode", "env"]
    assert cfg.train.lr == 3e-4


def test_new_named_entries_and_null_removal():
    cfg = load_config(None, [
        "pools.h800.kind=gpu", "pools.h800.device=cuda", "pools.h800.capacity=8",
        "domains.math=null", "roles.inference.replicas=3",
    ])
    assert cfg.pools["h800"].kind == "gpu" and cfg.pools["h800"].capacity == 8
    assert "math" not in cfg.domains
    assert cfg.roles["inference"].replicas == 3 and cfg.roles["inference"].pool is None


def test_resolved_config_round_trips_through_the_run_dir(tmp_path):
    cfg = load_config(None, ["rollout.alpha=3", "cluster.placement_timeout_s=2.5"])
    out = write_resolved(cfg, tmp_path / "run")
    assert out == tmp_path / "run" / "config.yaml"
    again = load_config(out)
    assert again == cfg
    assert dump_config(again) == dump_config(cfg)


def test_a_removed_default_domain_stays_removed_through_the_run_dir(tmp_path):
    """`rollart eval RUN_DIR` reloads the resolved config: a default entry the run removed must not return."""
    cfg = load_config(None, ["domains.math=null", "domains.pick.env=pick_env:PickEnv"])
    path = write_resolved(cfg, tmp_path / "run")
    again = load_config(path, ["eval.episodes_per_domain=3"], resolved=True)
    assert sorted(again.domains) == ["frozenlake", "pick"] and again.eval.episodes_per_domain == 3
    assert sorted(load_config(path).domains) == ["frozenlake", "math", "pick"]  # a run file adds to the defaults
