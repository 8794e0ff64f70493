"""Shared test fixtures. Ray is started once per session, bound to loopback, and shut down at the end."""

from __future__ import annotations

import os

# Set before anything imports Ray: loopback only (otherwise Ray binds every interface), no token auth (an
# explicit 127.0.0.1:PORT address fails with it), no usage stats.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

# Custom resources of the shared test Ray: the default config's pools plus two test pools.
TEST_RESOURCES = {
    "pool_train": 1,
    "pool_gen_prefill": 1,
    "pool_gen_decode": 1,
    "pool_env": 4,
    "pool_reward": 2,
    "pool_test_a": 2,
    "pool_test_b": 1,
}


@pytest.fixture(scope="session")
def ray_local():
    """One embedded Ray for the whole test session (ray.init costs 2.5–4 s and ~0.5 GB)."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=4,
            resources=TEST_RESOURCES,
            include_dashboard=False,
            object_store_memory=256 * 1024 * 1024,
            namespace="rollart-tests",
            log_to_driver=False,
        )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """The built-in tiny checkpoint (config defaults, seed 0), built once per test session."""
    from rollart.config import ModelConfig
    from rollart.models import resolve_model_path

    return resolve_model_path(ModelConfig(), seed=0, cache_dir=tmp_path_factory.mktemp("model-cache"))


@pytest.fixture(scope="session")
def tiny_tool_model_path(tmp_path_factory):
    """The built-in tiny checkpoint whose tokenizer holds the tool-call tokens (`model.tiny.tool_calls`)."""
    from rollart.config import ModelConfig
    from rollart.models import resolve_model_path

    return resolve_model_path(ModelConfig(tiny={"tool_calls": True}), seed=0,
                              cache_dir=tmp_path_factory.mktemp("tool-model-cache"))
