"""`rollart bench`'s options: one that belongs to another benchmark, a bad count or a study without its file
exits 2 with a message naming it, before any benchmark runs."""

import pytest

from rollart.cli import main


@pytest.mark.parametrize("argv, says", [
    (["bench", "weights", "--nodes", "2"], "--nodes applies to 'rollart bench chaos' only, not 'weights'"),
    (["bench", "rollout", "--piece", "next"], "--piece applies to 'rollart bench staleness' only"),
    (["bench", "reward", "--jobs", "0"], "--jobs takes a count ≥ 1, not 0"),
    (["bench", "staleness", "--piece", "next"], "needs --json PATH"),
    (["bench", "nosuch"], "unknown benchmark 'nosuch'"),
])
def test_a_misplaced_option_is_refused_naming_it(argv, says, capsys):
    assert main(argv) == 2
    assert says in capsys.readouterr().err
