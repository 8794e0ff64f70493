"""The lookup tool of vf_lookup: a `vf.Toolset` (an MCP server verifiers launches per rollout as
`python -m vf_lookup.servers.facts`), over the local facts.json."""

import json
from pathlib import Path

import verifiers.v1 as vf

FACTS: dict[str, str] = json.loads(Path(__file__).with_name("facts.json").read_text())


class FactsToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "facts"

    @vf.tool
    def lookup(self, name: str) -> str:
        """Look up what a person or thing is known for."""
        return FACTS.get(name.strip().lower(), "no entry found")


if __name__ == "__main__":
    FactsToolset.run()
