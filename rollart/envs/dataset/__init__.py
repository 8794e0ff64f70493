"""Dataset domains (`env: dataset`): rows of a file or hub dataset, read with the `datasets` library, become
episodes. `open_dataset_domain` reads, filters and orders a domain's rows (`DatasetDomain`); `DatasetEnv` plays
one row per reset; `DataError` names the file, row and column of what is wrong."""

from rollart.envs.dataset.env import DatasetDomain, DatasetEnv, open_dataset_domain, prompt_budget
from rollart.envs.dataset.episodes import EPISODES, SingleTurnEpisode, ToolLookupEpisode
from rollart.envs.dataset.rows import DatasetRows, Row, final_answer, format_prompt
from rollart.envs.dataset.source import DataError, detect_format, load_table

__all__ = [
    "DataError",
    "DatasetDomain",
    "DatasetEnv",
    "DatasetRows",
    "EPISODES",
    "Row",
    "SingleTurnEpisode",
    "ToolLookupEpisode",
    "detect_format",
    "final_answer",
    "format_prompt",
    "load_table",
    "open_dataset_domain",
    "prompt_budget",
]
