"""The staleness study's bookkeeping: arms, the order pieces run in, the summary over seeds, the ratios."""

import json

import pytest

from benchmarks import staleness as st


def record(arm, seed, scores, walls=None, lag=(0.5, 1)):
    walls = walls or [10.0 * i for i in range(len(scores))]
    return {"arm": arm, "seed": seed, "steps": 50, "final": scores[-1],
            "curve": [[25 * i, w, s] for i, (w, s) in enumerate(zip(walls, scores))],
            "staleness_mean": lag[0], "staleness_max": lag[1], "token_lag_mean": lag[0] / 2, "token_lag_max": lag[1]}


def test_the_grid_has_one_sync_arm_and_every_alpha_mode_and_weight_setting():
    assert len(st.ARMS) == 1 + 4 * 2 * 2 + len(st.ADAPTIVE_ALPHAS)
    assert len(st.PRIORITY) == len(st.ARMS) == len(set(st.PRIORITY))
    assert st.ARMS["sync"] == ["rollout.alpha=0", "rollout.barrier=batch"]
    assert st.ARMS["a4-token-noiw"] == ["rollout.alpha=4", "rollout.barrier=none", "rollout.staleness=token",
                                        "train.correction=none"]
    assert st.ARMS["a1-trajectory-iw-adaptive"] == [*st.ARMS["a1-trajectory-iw"], "rollout.min_batch_fraction=0.5"]


def test_pieces_run_arm_by_arm_and_are_never_repeated():
    done = [record("sync", s, [0.3, 0.6]) for s in (0, 1)]
    assert st._choose_piece("next", done) == ("sync", 2)
    done.append(record("sync", 2, [0.3, 0.6]))
    assert st._choose_piece("next", done) == ("a1-trajectory-iw", 0)
    assert st._choose_piece("a8-token-noiw/1", done) == ("a8-token-noiw", 1)
    with pytest.raises(ValueError, match="already in the study"):
        st._choose_piece("sync/0", done)
    with pytest.raises(ValueError, match="ARM/SEED"):
        st._choose_piece("a3-token-iw/0", done)


def test_the_summary_averages_seeds_and_computes_the_ratios(tmp_path):
    runs = [record("sync", 0, [0.3, 0.5, 0.8], [0, 10, 20]), record("sync", 1, [0.3, 0.7, 0.6], [0, 12, 24]),
            record("a1-trajectory-iw", 0, [0.3, 0.7, 0.7], [0, 5, 10], lag=(0.9, 1)),
            record("a4-token-iw", 0, [0.3, 0.4, 0.35], [0, 4, 8], lag=(2.5, 4))]
    result = st.summarize(runs, quick=False)
    rows = {r["arm"]: r for r in result.rows}
    assert [r["arm"] for r in result.rows] == ["sync", "a1-trajectory-iw", "a4-token-iw"]  # priority order
    sync = rows["sync"]
    assert sync["curve_mean"] == [0.3, 0.6, 0.7] and sync["curve_std"] == [0.0, 0.1, 0.1]
    assert sync["final_mean"] == 0.7 and sync["curve_wall_mean"] == [0.0, 11.0, 22.0]
    assert sync["target"] == pytest.approx(0.63)  # 90% of sync's final
    assert (sync["time_to_score_s"], sync["steps_to_score"]) == (22.0, 50)  # 0.6 at step 25 is below 0.63
    assert (rows["a1-trajectory-iw"]["time_to_score_s"], rows["a1-trajectory-iw"]["steps_to_score"]) == (5.0, 25)
    assert rows["a4-token-iw"]["time_to_score_s"] is None and rows["a4-token-iw"]["staleness_max"] == 4
    assert sync["collapsed_seeds"] == [] and rows["a4-token-iw"]["collapsed_seeds"] == []
    assert result.ratios == {"final_score_alpha4_token_is_vs_sync": pytest.approx(0.5),
                             "time_to_score_alpha1_vs_sync": pytest.approx(5 / 22, abs=1e-4)}
    assert "sync/2" in result.data["missing"] and "a1-trajectory-iw/0" not in result.data["missing"]
    # the study file round-trips, and the curves are drawn
    path = tmp_path / "staleness.json"
    path.write_text(json.dumps({"bench": "staleness", **result.data}))
    assert st.load_records(path) == runs
    assert all(p.stat().st_size > 10_000 for p in st.plot(result, path))


def test_a_seed_that_fell_below_half_its_start_score_is_counted_as_collapsed_even_if_it_recovered():
    runs = [record("a2-trajectory-iw", 0, [0.34, 0.4, 0.02, 0.23]), record("a2-trajectory-iw", 1, [0.34, 0.18, 0.7]),
            record("a2-trajectory-iw", 2, [0.34, 0.16, 0.5])]
    (row,) = st.summarize(runs, quick=False).rows
    assert row["collapsed_seeds"] == [0, 2]  # 0.18 is not below half of 0.34; 0.16 and 0.02 are


def test_pieces_lock_a_file_in_the_studys_own_work_directory_by_default(tmp_path, monkeypatch):
    locks = []

    def piece(arm, seed, work, lock, quick, steps=None):
        locks.append(lock)
        return record(arm, seed, [0.3, 0.5])

    monkeypatch.setattr(st, "_run_piece", piece)
    st.run(quick=True, workdir=str(tmp_path / "work"))
    assert locks == [str(tmp_path / "work" / "heavy.lock")] * len(st.QUICK_ARMS)
    st.run(quick=True, workdir=str(tmp_path / "work"), lock="")
    assert locks[-1] == ""


def test_the_lock_is_exclusive_and_a_planted_symlink_or_fifo_is_refused(tmp_path):
    import fcntl
    import os
    import stat

    path = tmp_path / "heavy.lock"
    with st.heavy_lock(str(path)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.is_file()
        with open(path, "rb") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(path, "rb") as other:  # released on exit
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    target = tmp_path / "victim"
    (tmp_path / "link.lock").symlink_to(target)
    with pytest.raises(ValueError, match="link.lock: is a symbolic link"):
        with st.heavy_lock(str(tmp_path / "link.lock")):
            pass
    assert not target.exists()  # the link was not followed
    os.mkfifo(tmp_path / "fifo.lock")
    with pytest.raises(ValueError, match="fifo.lock: not a regular file"):  # and the open did not block on it
        with st.heavy_lock(str(tmp_path / "fifo.lock")):
            pass
