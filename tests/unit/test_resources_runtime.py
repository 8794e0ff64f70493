"""Joining a cluster fails fast when nothing listens at `cluster.address` (Ray itself retries for minutes),
and a non-loopback address keeps Ray's token auth on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from rollart.config import ClusterConfig
from rollart.resources import runtime
from rollart.resources.errors import ClusterError
from rollart.resources.runtime import _check_reachable, address_host, keep_token_auth


def test_a_closed_port_is_refused_at_once_with_what_to_do():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(ClusterError) as info:
            _check_reachable(f"127.0.0.1:{port}", timeout_s=2)
    msg = str(info.value)
    assert f"nothing answers at 127.0.0.1:{port} (cluster.address)" in msg
    assert f"ray start --head --port={port}" in msg


def test_a_listening_port_passes_and_other_address_forms_are_left_to_ray():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        _check_reachable(f"127.0.0.1:{s.getsockname()[1]}", timeout_s=2)
    _check_reachable("auto")
    _check_reachable("ray://10.0.0.1:10001")


@pytest.mark.parametrize("address, host", [("10.0.0.1:6379", "10.0.0.1"), ("[::1]:6379", "::1"),
                                           ("ray://10.0.0.1:10001", "10.0.0.1"), ("localhost:6379", "localhost")])
def test_address_host(address, host):
    assert address_host(address) == host


def test_an_operators_disabled_token_auth_is_refused_for_a_remote_cluster(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setattr(runtime, "AUTH_MODE_DEFAULTED", False)  # the operator set it, not rollart
    with pytest.raises(ClusterError, match="not a loopback address but RAY_AUTH_MODE=disabled.*allow_unauthenticated"):
        keep_token_auth(ClusterConfig(address="10.255.0.1:6379"))
    keep_token_auth(ClusterConfig(address="127.0.0.1:6379"))  # loopback: left alone
    keep_token_auth(ClusterConfig(address="10.255.0.1:6379", allow_unauthenticated=True))  # told to
    assert os.environ["RAY_AUTH_MODE"] == "disabled"


def test_rollarts_own_loopback_default_turns_back_into_token_auth_for_a_remote_cluster():
    """In a fresh interpreter, as `rollart train cluster.address=10.x` would run: Ray's mode becomes TOKEN."""
    code = (
        "import os\nimport rollart.resources\n"
        "from rollart.config import ClusterConfig\nfrom rollart.resources.runtime import keep_token_auth\n"
        "from ray._raylet import AuthenticationMode, get_authentication_mode\n"
        "before = get_authentication_mode() == AuthenticationMode.DISABLED\n"
        "keep_token_auth(ClusterConfig(address='10.255.0.1:6379'))\n"
        "print('RESULT', before, os.environ['RAY_AUTH_MODE'], get_authentication_mode() == AuthenticationMode.TOKEN)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert "RESULT True token True" in out.stdout, out.stdout + out.stderr


def _start_failure(monkeypatch, tmp_path, error: Exception, overrides: list[str]) -> str:
    """The ClusterError message of an embedded start whose ray.init raises `error`."""
    from rollart.config.loader import load_config

    def init(**kwargs):
        raise error

    monkeypatch.setattr(runtime.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(runtime.ray, "init", init)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    with pytest.raises(ClusterError) as info:
        runtime.Runtime(load_config(None, overrides), handle_signals=False)._connect()
    return str(info.value)


def test_an_embedded_ray_that_does_not_start_says_why_where_its_logs_are_and_what_to_try(monkeypatch, tmp_path):
    """Ray raises a bare Exception when its GCS does not answer in time (seen on a machine at load 13)."""
    no_gcs = Exception("Failed to get node info b'RPC error: Deadline Exceeded'")
    msg = _start_failure(monkeypatch, tmp_path, no_gcs, [])
    assert "the embedded Ray did not start: Failed to get node info" in msg
    assert f"{tmp_path}/ray/session_latest/logs" in msg and "1-minute load average" in msg
    assert "cluster.address" in msg


def test_settings_the_embedded_ray_refuses_are_named_not_blamed_on_a_busy_machine(monkeypatch, tmp_path):
    msg = _start_failure(monkeypatch, tmp_path, ValueError("object_store_memory must be at least 78643200 bytes"),
                         ["cluster.object_store_mb=70"])
    assert "object_store_memory must be at least" in msg and "cluster.object_store_mb=70" in msg
    assert "correct the one Ray's message names" in msg
    assert "load average" not in msg
