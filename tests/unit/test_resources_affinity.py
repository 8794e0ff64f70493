"""`@affinity` is metadata only; config and explicit arguments override it with a fixed precedence."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rollart.config.loader import load_config
from rollart.resources.affinity import affinity, affinity_of, resolve_request, role_of
from rollart.resources.errors import PlacementError
from rollart.types import Affinity


@affinity("gen_decode", fallback=["gen_prefill"], role="inference")
class Worker:
    pass


class Plain:
    pass


def _resolve(cls, overrides=(), **kw):
    cfg = load_config(None, list(overrides))
    return resolve_request(cls, cfg.pools, cfg.roles, **kw)


def test_decorator_attaches_affinity_and_role_and_returns_the_class():
    assert affinity_of(Worker) == Affinity("gen_decode", ("gen_prefill",))
    assert role_of(Worker) == "inference"
    assert Worker().__class__ is Worker
    assert affinity_of(Plain) is None
    assert role_of(Plain) == "plain"


def test_default_role_is_the_snake_case_class_name():
    @affinity("env")
    class EnvWorkerPool:
        pass

    assert role_of(EnvWorkerPool) == "env_worker_pool"


def test_decorator_rejects_a_string_fallback_and_a_non_class():
    with pytest.raises(TypeError, match="list of pool names"):
        affinity("env", fallback="train")
    with pytest.raises(TypeError, match="decorates a worker class"):
        affinity("env")(lambda: None)


def test_importing_affinity_imports_no_ray():
    code = "import sys; import rollart.resources.affinity; print('ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_decorator_values_are_used_without_config():
    req = _resolve(Worker)
    assert (req.role, req.chain, req.replicas) == ("inference", ("gen_decode", "gen_prefill"), 1)


def test_role_config_overrides_the_decorator():
    req = _resolve(Worker, ["roles.inference.pool=train", "roles.inference.fallback=[env]",
                            "roles.inference.replicas=3"])
    assert req.chain == ("train", "env") and req.replicas == 3


def test_explicit_arguments_override_role_config():
    req = _resolve(Worker, ["roles.inference.pool=train", "roles.inference.replicas=3"],
                   pool="gen_prefill", replicas=2)
    assert req.chain[0] == "gen_prefill" and req.replicas == 2


def test_decorator_fallback_applies_only_to_its_own_pool():
    # placed explicitly on gen_prefill: the decorator's fallback (relative to gen_decode) does not apply,
    # the pool's configured fallback does
    req = _resolve(Worker, pool="gen_prefill")
    assert req.chain == ("gen_prefill", "gen_decode")
    req = _resolve(Worker, pool="env")
    assert req.chain == ("env",)


def test_pool_fallback_is_used_when_nobody_states_one():
    @affinity("gen_prefill", role="gen")
    class Gen:
        pass

    assert _resolve(Gen).chain == ("gen_prefill", "gen_decode")
    assert _resolve(Gen, fallback=[]).chain == ("gen_prefill",)


def test_chain_holds_each_pool_once():
    assert _resolve(Worker, fallback=["gen_decode", "env", "env"]).chain == ("gen_decode", "env")


def test_undeclared_pool_names_the_pool_its_source_and_the_declared_pools():
    @affinity("h800", role="trainer")
    class Trainer:
        pass

    with pytest.raises(PlacementError) as info:
        _resolve(Trainer)
    msg = str(info.value)
    assert "pool 'h800' (from @affinity on Trainer) is not declared" in msg
    assert "gen_decode" in msg and "roles.trainer.pool" in msg
    with pytest.raises(PlacementError, match=r"pool 'h20' \(from the placement call\)"):
        _resolve(Worker, fallback=["h20"])


def test_undecorated_class_without_pool_says_how_to_give_one():
    with pytest.raises(PlacementError, match=r"no @affinity.*roles\.plain\.pool"):
        _resolve(Plain)
    assert _resolve(Plain, ["roles.plain.pool=env"]).chain == ("env",)
