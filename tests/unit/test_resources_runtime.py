"""Joining a cluster fails fast when nothing listens at `cluster.address` (Ray itself retries for minutes)."""

from __future__ import annotations

import socket

import pytest

from rollart.resources.errors import ClusterError
from rollart.resources.runtime import _check_reachable


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
