"""The configuration users see does not change when the schema's code moves: the defaults, `config explain`
of every key and the Markdown reference equal what was recorded in `tests/fixtures/config_golden/`."""

from __future__ import annotations

import json
from pathlib import Path

from rollart.config import RunConfig
from rollart.config.explain import configuration_markdown, explain, schema_keys
from rollart.config.loader import dump_config

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "config_golden"


def test_the_default_config_is_unchanged() -> None:
    assert dump_config(RunConfig()) == (GOLDEN / "default.yaml").read_text()


def test_explain_of_every_key_is_unchanged() -> None:
    recorded = json.loads((GOLDEN / "explain.json").read_text())
    keys = [doc.key for doc in schema_keys()]
    assert sorted(keys) == sorted(k for k in recorded if k), "a key was added, removed or renamed"
    assert explain(None) == recorded[""]
    changed = [key for key in keys if explain(key) != recorded[key]]
    assert changed == [], f"`rollart config explain` changed for {changed}"


def test_the_markdown_reference_is_unchanged() -> None:
    assert configuration_markdown() == (GOLDEN / "reference.md").read_text()
