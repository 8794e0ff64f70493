"""`benchmarks.process_cpu`: the role a process's CPU is charged to, from the titles Ray gives it over its life."""

from benchmarks.process_cpu import RAY, role_of, settled_role

WORKER_CMDLINE = ["/venv/bin/python", "/venv/lib/python3.11/site-packages/ray/_private/workers/default_worker.py",
                  "--runtime-env-hash=1", "--gcs-address=127.0.0.1:1"]


def roles_over(titles: list[list[str]]) -> str:
    role = ""
    for title in titles:
        role = settled_role(role, role_of(title))
    return role


def test_an_actor_keeps_its_role_when_a_later_title_is_ray_s_generic_one() -> None:
    # the same worker process: its command line, then the actor's titles, then Ray's again (at its exit)
    titles = [WORKER_CMDLINE, ["ray::InferenceWorker"], ["ray::InferenceWorker.take"], WORKER_CMDLINE, ["ray::IDLE"]]
    assert roles_over(titles) == "engine"


def test_a_worker_becomes_the_actor_it_is_made_into_and_a_daemon_stays_ray() -> None:
    assert roles_over([WORKER_CMDLINE, ["ray::IDLE"], ["ray::TrainerWorker.train_step"]]) == "trainer"
    assert roles_over([["/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=x"]]) == RAY
    assert roles_over([WORKER_CMDLINE, ["ray::IDLE"]]) == "ray_other_actors"


def test_an_untitled_process_keeps_what_it_had() -> None:
    assert settled_role("env_worker", None) == "env_worker"
    assert settled_role("", None) == ""
