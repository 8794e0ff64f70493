"""RewardService.stop is bounded: a Serve delete that never returns (its controller gone or stuck, as under a
SIGTERM mid-run) no longer holds the job's teardown; stop logs it and goes on."""

from __future__ import annotations

import logging
import threading
import time

from rollart.config import RunConfig
from rollart.reward import service as service_module
from rollart.reward.service import RewardService


def test_a_serve_delete_that_never_returns_does_not_hold_stop(monkeypatch, caplog):
    never = threading.Event()
    calls = []

    def stuck_delete(name, *args, **kwargs):
        calls.append(name)
        never.wait(60)  # Serve's controller does not answer

    monkeypatch.setattr(service_module.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(service_module.serve, "delete", stuck_delete)
    monkeypatch.setattr(service_module, "_STOP_TIMEOUT_S", 0.5)
    svc = RewardService(RunConfig(), token="t", app_name="rollart-reward-stuck")
    svc.url = "http://127.0.0.1:1/reward"  # as if started
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rollart"):
        svc.stop()
    never.set()
    assert time.monotonic() - began < 5 and calls == ["rollart-reward-stuck"]
    assert svc.url == "" and "did not finish within 0.5 s" in caplog.text


def test_an_error_of_the_delete_is_logged_and_stop_goes_on(monkeypatch, caplog):
    def failing_delete(name, *args, **kwargs):
        raise RuntimeError("controller gone")

    monkeypatch.setattr(service_module.ray, "is_initialized", lambda: True)
    monkeypatch.setattr(service_module.serve, "delete", failing_delete)
    svc = RewardService(RunConfig(), token="t", app_name="rollart-reward-err")
    svc.url = "http://127.0.0.1:1/reward"
    with caplog.at_level(logging.WARNING, logger="rollart"):
        svc.stop()
    assert svc.url == "" and "controller gone" in caplog.text
