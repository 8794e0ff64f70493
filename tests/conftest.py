"""Shared test fixtures. Ray is started once per session, bound to loopback, and shut down at the end.

The suite is hermetic: whatever the shell exports, the tests see the environment below — set or removed here,
before anything imports Ray, datasets or transformers (which read some of these at import). A test that
depends on another value sets it itself (monkeypatch)."""

from __future__ import annotations

import os

HERMETIC_ENV = {
    # Ray: loopback only (otherwise it binds every interface), no token auth (an explicit 127.0.0.1:PORT address
    # fails with it), no usage stats; never a cluster the shell points at
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ADDRESS": None,
    # the hub: offline (nothing can be downloaded here), and no second offline switch that changes what the
    # datasets library says (HF_DATASETS_OFFLINE=1 beside HF_HUB_OFFLINE=1 is a common setup)
    "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": None, "TRANSFORMERS_OFFLINE": None,
    "TOKENIZERS_PARALLELISM": "false",
    # rollart's own: a worker's log level, an env server's token
    "ROLLART_LOG_LEVEL": None, "ROLLART_ENV_TOKEN": None,
}
for _name, _value in HERMETIC_ENV.items():
    if _value is None:
        os.environ.pop(_name, None)
    else:
        os.environ[_name] = _value

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
