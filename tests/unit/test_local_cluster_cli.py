"""`rollart local-cluster` refuses a node description that is not a JSON object of resource amounts (exit 2),
before anything starts; the recipe in docs/cluster.md runs end to end in tests/e2e/test_local_cluster_e2e.py."""

from __future__ import annotations

import pytest

from rollart.cli.commands.local_cluster import node_resources
from rollart.cli.main import main
from rollart.config.loader import ConfigError


def test_node_resources_are_a_json_object_of_amounts() -> None:
    assert node_resources('{"pool_train": 1, "pool_env": 4}') == {"pool_train": 1.0, "pool_env": 4.0}
    for bad in ("pool_train=1", "[1]", '{"pool_train": -1}', '{"pool_train": true}', '{"": 1}'):
        with pytest.raises(ConfigError, match="--node"):
            node_resources(bad)


def test_a_bad_node_exits_2_before_anything_starts(capsys) -> None:
    assert main(["local-cluster", "--node", "pool_train=1"]) == 2
    err = capsys.readouterr().err
    assert "--node 'pool_train=1': not JSON" in err
