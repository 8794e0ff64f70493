"""The suite passes whatever the shell exports: tests set or clear what they depend on (tests/conftest.py's
HERMETIC_ENV). With HF_DATASETS_OFFLINE=1 exported beside HF_HUB_OFFLINE=1 — a common offline setup — a fresh
clone's suite failed a test that assumed the variable unset."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import HERMETIC_ENV

TESTS = Path(__file__).resolve().parents[1]


def test_this_session_sees_the_hermetic_environment() -> None:
    for name, value in HERMETIC_ENV.items():
        assert os.environ.get(name) == value, name


def test_a_shell_exporting_other_values_changes_nothing() -> None:
    hostile = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1",
               "RAY_ADDRESS": "203.0.113.1:6379", "RAY_AUTH_MODE": "token", "ROLLART_LOG_LEVEL": "DEBUG"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS / "unit" / "test_envs_dataset.py"),
         "-k", "hub_id or every_format or hermetic_environment", str(TESTS / "unit" / "test_hermetic_suite.py") + "::"
         "test_this_session_sees_the_hermetic_environment"],
        cwd=TESTS.parent, env=hostile, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "4 passed" in done.stdout, done.stdout[-500:]
