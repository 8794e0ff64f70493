"""exposed_timer adds the wrapped span to `time/weights.exposed`, also when the swap raises."""

import time

import pytest

from rollart.weights import EXPOSED, exposed_timer


def test_exposed_timer_accumulates_and_survives_errors():
    metrics: dict[str, float] = {}
    with exposed_timer(metrics):
        time.sleep(0.01)
    first = metrics[EXPOSED]
    assert first >= 0.01
    with pytest.raises(RuntimeError):
        with exposed_timer(metrics):
            raise RuntimeError("swap failed")
    assert metrics[EXPOSED] >= first and EXPOSED == "time/weights.exposed"
