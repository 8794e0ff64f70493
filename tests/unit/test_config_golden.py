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


def write_golden() -> None:
    """Record today's schema as the golden files: for a deliberate change of keys, defaults or descriptions
    (`python tests/unit/test_config_golden.py --write`, then read the diff)."""
    keys = {"": explain(None), **{doc.key: explain(doc.key) for doc in schema_keys()}}
    (GOLDEN / "explain.json").write_text(json.dumps(keys, indent=1, ensure_ascii=False) + "\n")
    (GOLDEN / "default.yaml").write_text(dump_config(RunConfig()))
    (GOLDEN / "reference.md").write_text(configuration_markdown())


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/unit/test_config_golden.py --write")
    write_golden()
