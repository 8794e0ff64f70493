"""Every config error names the key, where it came from and what is valid; exit code 2;
nothing is started (not even Ray imported)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rollart.cli import main
from rollart.config.loader import ConfigError, load_config


def _error(path: Path | None = None, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides or [])
    return str(info.value)


def _write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- unknown keys --------------------------------------------------------------------------------


def test_unknown_key_from_file_names_file_line_and_closest_keys(tmp_path):
    path = _write(tmp_path, """\
        seed: 3
        rollout:
          alpah: 2
        """)
    msg = _error(path)
    assert "unknown key 'rollout.alpah'" in msg
    assert f"{path} line 3" in msg
    assert "did you mean alpha?" in msg
    assert "batch_size" in msg  # the valid keys at that level are listed


def test_unknown_key_from_command_line_names_the_override_and_closest_keys():
    msg = _error(overrides=["rollout.alpah=2"])
    assert "unknown key 'rollout.alpah'" in msg
    assert "the command line (rollout.alpah=2)" in msg
    assert "did you mean alpha?" in msg


def test_unknown_top_level_key_from_command_line_is_attributed_to_it():
    msg = _error(overrides=["trian.steps=3"])
    assert "unknown key 'trian'" in msg
    assert "the command line (trian.steps=3)" in msg
    assert "did you mean train?" in msg


def test_unknown_key_inside_a_named_entry_lists_that_entry_schema():
    msg = _error(overrides=["pools.gen_prefill.capacty=2"])
    assert "unknown key 'pools.gen_prefill.capacty'" in msg
    assert "did you mean capacity?" in msg
    assert "fallback" in msg and "kind" in msg


# --- wrong types and values ----------------------------------------------------------------------


def test_wrong_type_names_field_value_and_expected_type(tmp_path):
    path = _write(tmp_path, """\
        train:
          steps: abc
        """)
    msg = _error(path)
    assert "'train.steps' = 'abc'" in msg
    assert f"{path} line 2" in msg
    assert "valid integer" in msg


@pytest.mark.parametrize(
    "override, allowed",
    [
        ("rollout.staleness=sometimes", ["'trajectory'", "'token'"]),
        ("rollout.barrier=wall", ["'none'", "'turn'", "'batch'"]),
        ("pools.env.kind=tpu", ["'gpu'", "'cpu'", "'serverless'"]),
    ],
)
def test_wrong_value_lists_the_allowed_values(override, allowed):
    key, value = override.split("=")
    msg = _error(overrides=[override])
    assert f"'{key}' = '{value}'" in msg
    assert f"the command line ({override})" in msg
    for choice in allowed:
        assert choice in msg


def test_out_of_range_value_states_the_bound():
    msg = _error(overrides=["rollout.alpha=-1"])
    assert "'rollout.alpha' = -1" in msg
    assert "greater than or equal to 0" in msg


def test_a_list_field_given_a_scalar_says_a_list_is_expected():
    msg = _error(overrides=["pools.env.fallback=gen_decode"])
    assert "'pools.env.fallback' = 'gen_decode'" in msg
    assert "valid list" in msg


def test_new_pool_without_kind_names_the_missing_field(tmp_path):
    path = _write(tmp_path, """\
        pools:
          h800: {capacity: 8}
        """)
    msg = _error(path)
    assert "'pools.h800.kind' is required but missing" in msg
    assert f"{path} line 2" in msg


# --- malformed files and overrides ---------------------------------------------------------------


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = _write(tmp_path, """\
        rollout:
          alpha: 2
           batch_size: 3
        """)
    msg = _error(path)
    assert f"{path}:3:" in msg
    assert "malformed YAML" in msg


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path):
    path = _write(tmp_path, "- rollout\n- alpha\n")
    assert "must be a mapping" in _error(path)


def test_missing_file_is_named(tmp_path):
    assert f"{tmp_path / 'nope.yaml'} does not exist" in _error(tmp_path / "nope.yaml")


@pytest.mark.parametrize("item", ["rollout.alpha", "=3", "rollout..alpha=1"])
def test_override_without_key_path_equals_value_is_refused(item):
    assert "is not of the form key.path=value" in _error(overrides=[item])


# --- cross-references ----------------------------------------------------------------------------


def test_domain_on_an_undeclared_pool_lists_the_declared_pools(tmp_path):
    path = _write(tmp_path, """\
        domains:
          math: {pool: h100}
        """)
    msg = _error(path)
    assert "domains.math.pool: 'h100' is not a declared pool" in msg
    assert "gen_decode" in msg and "gen_prefill" in msg
    assert f"{path} line" in msg


def test_fallback_to_an_undeclared_pool_and_to_itself():
    assert "pools.env.fallback: 'gpu9' is not a declared pool" in _error(overrides=["pools.env.fallback=[gpu9]"])
    assert "pools.env.fallback: a pool cannot fall back to itself" in _error(overrides=["pools.env.fallback=[env]"])


def test_domain_on_a_serverless_pool_is_refused():
    msg = _error(overrides=["domains.math.pool=reward"])
    assert "'reward' is a serverless pool" in msg


def test_role_on_an_undeclared_pool_names_role_and_source():
    msg = _error(overrides=["roles.inference.pool=zz"])
    assert "roles.inference: pool 'zz' is not a declared pool" in msg
    assert "the command line (roles.inference.pool=zz)" in msg


def test_removing_a_pool_that_others_reference_names_each_reference():
    msg = _error(overrides=["pools.gen_decode=null"])
    assert "pools.gen_prefill.fallback: 'gen_decode' is not a declared pool" in msg
    assert "domains.math.pool: 'gen_decode' is not a declared pool" in msg


def test_batch_must_hold_whole_groups():
    assert "6 is not a multiple of rollout.group_size (4)" in _error(overrides=["rollout.batch_size=6"])


def test_every_mini_batch_needs_a_sample_per_trainer_rank():
    msg = _error(overrides=["rollout.batch_size=8", "train.mini_batches=4", "train.workers=3"])
    assert "train.mini_batches" in msg and "rollout.batch_size ≥ train.mini_batches × train.workers" in msg


def test_trainer_settings_that_cannot_work_together_are_refused_naming_the_keys():
    msg = _error(overrides=["train.strategy=ddp", "train.offload=true"])
    assert "train.offload: host offload is FSDP2's" in msg and "train.strategy=fsdp2" in msg
    msg = _error(overrides=["train.precision=bf16", "model.dtype=bfloat16"])
    assert "train.precision: bf16 computes over float32 master weights" in msg and "model.dtype=float32" in msg
    msg = _error(overrides=["train.workers=2"])  # the default train pool has one slot
    assert "train.workers: 2 ranks cannot be placed" in msg and "raise pools.train.capacity to at least 2" in msg
    msg = _error(overrides=["train.strategy=fsdp3", "train.precision=fp16"])
    assert "train.strategy" in msg and "'ddp' or 'fsdp2'" in msg and "train.precision" in msg and "'bf16'" in msg
    load_config(None, ["train.workers=2", "pools.train.capacity=2", "train.offload=true", "train.precision=bf16"])


def test_bf16_on_a_device_that_lacks_it_is_refused_when_the_config_loads(monkeypatch):
    import torch

    gpu = ["train.precision=bf16", "pools.train.kind=gpu", "pools.train.device=cuda:0"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    msg = _error(overrides=gpu)
    assert "train.precision=bf16 on pools.train.device='cuda:0': this machine has no CUDA device" in msg
    assert "train.precision=fp32" in msg
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (7, 0))
    msg = _error(overrides=gpu)
    assert "cuda:0 (Tesla V100-SXM2-16GB, compute capability 7.0) has no bfloat16 arithmetic" in msg
    assert "no cuda:1" in _error(overrides=gpu[:2] + ["pools.train.device=cuda:1"])
    load_config(None, gpu[:2] + ["pools.train.device=cuda:0", "train.precision=fp32"])  # fp32 needs nothing
    load_config(None, gpu + ["cluster.address=10.0.0.5:6379"])  # a remote cluster's GPUs: the rank checks its own
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 0))
    load_config(None, gpu)
    load_config(None, ["train.precision=bf16"])  # a CPU computes bf16 (emulated where it has no bf16 instructions)


def test_lora_with_an_engine_that_cannot_serve_it_is_refused():
    assert "served by the builtin engine only" in _error(overrides=["train.lora.rank=8", "inference.engine=vllm"])


def test_every_error_is_reported_at_once(tmp_path):
    path = _write(tmp_path, "rollout: {alpah: 2}\ntrain: {steps: x}\n")
    msg = _error(path, ["eval.evry=3"])
    assert msg.count("\n  - ") == 3


# --- the CLI: exit code 2, one message, nothing started --------------------------------------------


@pytest.mark.parametrize("argv", [["config", "show", "rollout.alpah=2"], ["pools", "train.steps=abc"]])
def test_cli_exits_2_with_the_message_on_stderr(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rollart: invalid config:")
    assert "Traceback" not in err


def test_cli_starts_nothing_on_a_bad_config(tmp_path):
    """`rollart pools` with a bad run file exits 2 before Ray is even imported (a fresh interpreter)."""
    path = _write(tmp_path, "cluster: {adress: 127.0.0.1:6379}\n")
    code = (
        "import sys\nfrom rollart.cli import main\n"
        f"rc = main(['pools', {str(path)!r}])\n"
        "print('RESULT', rc, 'ray' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "RESULT 2 False" in out.stdout, out.stdout + out.stderr
    assert "did you mean address?" in out.stderr


def test_console_script_exit_code_is_2(tmp_path):
    script = Path(sys.executable).parent / "rollart"
    path = _write(tmp_path, "rollout:\n  alpha: [\n")
    out = subprocess.run([str(script), "pools", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert f"{path}:" in out.stderr and "malformed YAML" in out.stderr


# --- what the config names is resolved when it loads ------------------------------------------


def test_duplicate_yaml_keys_are_refused_naming_both_lines(tmp_path):
    path = _write(tmp_path, """\
        rollout:
          alpha: 1
          batch_size: 8
          alpha: 2
        """)
    msg = _error(path)
    assert f"{path} line 4: duplicate key 'rollout.alpha' (first at line 2)" in msg


@pytest.mark.parametrize("override, key", [
    ("rollout.alpha=true", "rollout.alpha"), ("domains.math.weight=false", "domains.math.weight"),
    ("cluster.num_cpus=true", "cluster.num_cpus"), ("reward.sandbox.cpu_time_s=true", "reward.sandbox.cpu_time_s"),
])
def test_a_boolean_is_never_taken_for_a_number(override, key):
    msg = _error(overrides=[override])
    assert f"'{key}'" in msg and "expected a number, got the boolean" in msg


@pytest.mark.parametrize("value", ["inf", "-inf", ".nan", ".inf"])
def test_non_finite_numbers_are_refused(value):
    msg = _error(overrides=[f"reward.sandbox.cpu_time_s={value}"])
    assert "'reward.sandbox.cpu_time_s'" in msg and "finite number" in msg


def _cli_error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rollart: invalid config:") and "Traceback" not in err
    return err


@pytest.mark.parametrize("override, expected", [
    ("domains.math.env=does_not_exist", "domains.math.env: unknown env spec 'does_not_exist'. Accepted:"),
    ("domains.math.env=nomod:Cls", "domains.math.env: env spec 'nomod:Cls': cannot import module 'nomod'"),
    ("domains.math.env=gym:FrozenLak-v1", "gymnasium has no env 'FrozenLak-v1'"),
    ("domains.math.reward.fn=nomod:score", "domains.math.reward.fn: reward fn 'nomod:score' cannot be loaded"),
    ("domains.math.reward.fn=rollart.config:NoSuchFn", "has no attribute 'NoSuchFn'"),
])
def test_env_specs_and_reward_fns_are_resolved_at_config_time(override, expected, capsys):
    assert expected in _cli_error(["config", "show", override], capsys)


def test_agent_domains_are_checked_for_their_agent_not_an_env(capsys):
    """An agent domain has no env spec; its agent and demonstrations functions are resolved instead."""
    agent = ["domains.math.env=", "domains.math.agent=examples.agents.plan_agent:run"]
    assert main(["config", "show", *agent]) == 0
    capsys.readouterr()
    err = _cli_error(["config", "show", "domains.math.env=", "domains.math.agent=nomod:run",
                      "domains.math.demonstrations=examples.agents.plan_agent:nothing_here"], capsys)
    assert "domains.math.agent: agent 'nomod:run'" in err and "domains.math.demonstrations:" in err


def test_a_remote_reward_fn_is_not_imported_here(capsys):
    """With the http backend the service resolves the fn: it need not import on this machine."""
    argv = ["config", "show", "domains.math.reward.fn=only_on_the_service:score", "domains.math.reward.backend=http",
            "reward.http.url=https://reward.example/reward"]
    assert main(argv) == 0 and "only_on_the_service:score" in capsys.readouterr().out


def test_run_dir_that_is_a_file_is_refused(tmp_path, capsys):
    existing = tmp_path / "a-file"
    existing.write_text("x")
    err = _cli_error(["config", "show", f"run_dir={existing}"], capsys)
    assert f"run_dir: {existing} exists and is not a directory" in err


def test_every_problem_the_config_names_is_reported_at_once(tmp_path, capsys):
    existing = tmp_path / "f"
    existing.write_text("x")
    err = _cli_error(["config", "show", "domains.math.env=nope", "domains.frozenlake.reward.fn=nomod:f",
                      f"run_dir={existing}"], capsys)
    assert err.count("\n  - ") == 3


@pytest.mark.parametrize("overrides, key", [
    (["domains.math.reward.backend=serverless", "reward.serverless.host=0.0.0.0"], "reward.serverless.host"),
    (["domains.math.reward.backend=http", "reward.http.url=http://10.1.2.3:8123/reward"], "reward.http.url"),
])
def test_bearer_tokens_never_cross_the_network_in_clear_unless_allowed(overrides, key):
    msg = _error(overrides=overrides)
    assert f"{key}:" in msg and "reward.allow_plain_http=true" in msg
    load_config(None, [*overrides, "reward.allow_plain_http=true"])  # told to: accepted
    load_config(None, ["domains.math.reward.backend=http", "reward.http.url=https://10.1.2.3/reward"])


def test_serve_reward_refuses_a_public_plain_http_host_before_ray_starts(capsys):
    err = _cli_error(["serve-reward", "domains.math.reward.backend=local", "reward.serverless.host=0.0.0.0"], capsys)
    assert "reward.serverless.host: '0.0.0.0' is not a loopback address" in err


def test_a_sticky_map_smaller_than_the_trajectories_in_flight_is_refused():
    # (α + 1) × groups per batch × trajectories per group = 2 × 64 × 8 = 1,024 in flight
    msg = _error(overrides=["rollout.batch_size=512", "rollout.group_size=8", "rollout.alpha=1",
                            "inference.sticky_trajectories=1000"])
    assert "inference.sticky_trajectories: 1000 is below the 1024 trajectories that may be in flight" in msg
    from rollart.config.loader import load_config

    cfg = load_config(None, ["rollout.batch_size=512", "rollout.group_size=8", "inference.sticky_trajectories=1024"])
    assert cfg.inference.sticky_trajectories == 1024
