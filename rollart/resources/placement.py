"""Placing workers: `Resources` is the driver's handle on the resource plane.

In: a connected Ray (see runtime.py), the run's pools and roles, and a worker class (plain Python class,
usually decorated with `@affinity`). Out: a `WorkerSet` of N actors of that class, each on the first pool
of its chain with room; snapshots and flat metrics of every pool.

How a worker is placed, and what is guaranteed:
1. The ResourceManager reserves a slot on the first pool of the chain with room (atomic, no waiting). A
   pool other than the preferred one is a fallback: logged at WARNING and counted. No pool with room →
   `PlacementError` at once, naming the worker, every pool tried and its free capacity.
2. Ray reserves the same slot as a one-bundle placement group `{pool_<name>: slots [, CPU] [, GPU]}`. If
   Ray cannot within `cluster.placement_timeout_s` (the pool's resource is held outside rollart, or the
   node holding it left), the group is removed and `PlacementError` says what Ray has of that resource.
   A placement group is used (not a bare actor) so that "waiting for resources" is told apart from "the
   constructor is slow", and no actor is ever left pending.
3. The actor starts inside that bundle; it must finish its constructor within `cluster.start_timeout_s`.
A multi-replica placement is all or nothing: on any failure every actor, group and slot made so far is
released before the error is raised.

Keeping worker sets whole (see worker_set.py): while any placed worker set is alive, a health check runs every
`cluster.health_interval_s` on a daemon thread. It reads Ray's actor table (deaths are reported to their
worker set, which replaces the worker if it was placed with `replace_dead`) and the alive nodes' resources: a
pool's capacity follows them, so a replacement for a worker whose node left falls back to the next pool
of its chain; when a pool marked `pools.<name>.elastic` gains capacity (a node joined), its `elastic`
worker sets place workers there.

CPU requests: workers ask Ray for `num_cpus=0` by default. This machine has 2 cores and hosts about ten
actors (trainer, inference workers, env workers, reward replicas); asking for a core each would leave
most of them unschedulable, while the pool slot is the constraint the user declared. Workers set their
own torch thread counts (`inference.num_threads`). Pass `num_cpus` to reserve cores where that matters.
GPU requests: on a `gpu` pool whose device is `cuda…`, each worker asks for one GPU (so Ray sets
CUDA_VISIBLE_DEVICES); pass `num_gpus` to change it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rollart.config import PoolConfig, RoleConfig, RunConfig
from rollart.resources.affinity import resolve_request
from rollart.resources.affinity import PlacementRequest
from rollart.resources.worker_set import WorkerSet, Member
from rollart.resources.errors import PlacementError
from rollart.resources.health import Ticker, actor_states
from rollart.resources.accounts import NoRoom, Placement, PoolSpec, PoolStatus, pool_metrics
from rollart.resources.manager import MANAGER_NAME, connect_manager, on_driver_node
from rollart.resources.names import pool_resource
from rollart.resources.nodes import cluster_capacity, declare_hint, pool_nodes

log = logging.getLogger("rollart.resources")

_MANAGER_TIMEOUT_S = 30.0  # a ResourceManager call is a dict update; this only guards a dead actor
# Ray options that must match the worker's placement-group bundle, so only place() sets them
_PLACEMENT_OPTIONS = frozenset({"num_cpus", "num_gpus", "resources", "scheduling_strategy", "placement_group"})


def ray_request(pool: PoolConfig, pool_name: str, slots: float, num_cpus: float,
                num_gpus: float | None) -> dict[str, float]:
    """The Ray resources one worker asks for on `pool` (also its placement-group bundle)."""
    gpus = num_gpus if num_gpus is not None else (
        1.0 if pool.kind == "gpu" and pool.device.startswith("cuda") else 0.0
    )
    request = {pool_resource(pool_name): float(slots)}
    if num_cpus > 0:
        request["CPU"] = float(num_cpus)
    if gpus > 0:
        request["GPU"] = float(gpus)
    return request


class Resources:
    """Places workers on pools and reports the pools. Make one with `Resources.connect(cfg)` (Runtime
    does) once Ray is initialised."""

    def __init__(
        self,
        manager: ray.actor.ActorHandle,
        pools: Mapping[str, PoolConfig],
        roles: Mapping[str, RoleConfig],
        placement_timeout_s: float,
        start_timeout_s: float,
        health_interval_s: float = 2.0,
        capacity: Mapping[str, float] | None = None,
    ) -> None:
        self.manager = manager
        self.owns_manager = False  # set by `connect` when it created the manager
        self.pools = dict(pools)
        self.roles = dict(roles)
        self.placement_timeout_s = placement_timeout_s
        self.start_timeout_s = start_timeout_s
        self.health_interval_s = health_interval_s
        self._capacity = dict(capacity or {})  # what the alive nodes held of each pool at the last look
        self._worker_sets: list[WorkerSet] = []
        self._lock = threading.Lock()
        self._health: Ticker | None = None

    @classmethod
    def connect(cls, cfg: RunConfig, *, name: str = MANAGER_NAME) -> Resources:
        """Join the ResourceManager named `name` of the current Ray namespace, or create it (then this
        Resources owns it: `end_manager`), and register the run's pools with the capacity Ray holds of each
        (on a joined cluster that can differ from `pools.<name>.capacity`; Ray is what enforces it, so the
        accounts follow Ray)."""
        if not ray.is_initialized():
            raise RuntimeError("Resources.connect needs a running Ray; start one with rollart.resources.Runtime")
        totals = ray.cluster_resources()
        specs = []
        for pool_name, pool in cfg.pools.items():
            capacity = cluster_capacity(pool_name, totals)
            if capacity != pool.capacity:
                log.info("pool %s: the cluster holds %g of %s (config says %g); using %g",
                         pool_name, capacity, pool_resource(pool_name), pool.capacity, capacity)
            specs.append(PoolSpec(pool_name, pool.kind, pool.device, capacity, tuple(pool.fallback)))
        manager, created = connect_manager(name)
        _call(manager.add_pools.remote(specs), "add_pools")
        resources = cls(manager, cfg.pools, cfg.roles, cfg.cluster.placement_timeout_s, cfg.cluster.start_timeout_s,
                        cfg.cluster.health_interval_s, {s.name: s.capacity for s in specs})
        resources.owns_manager = created
        return resources

    def end_manager(self) -> None:
        """End the manager if this Resources created it (one that joined another run's leaves it): at once,
        so that its name is free for the next run in this process, rather than when Python collects the last
        of its handles — which may sit in garbage past the next run's start and end that run's manager."""
        if not self.owns_manager:
            return
        self.owns_manager = False
        try:
            ray.kill(self.manager)
        except Exception as exc:  # already gone (Ray stopped, or the actor died): nothing to end
            log.debug("the ResourceManager was already gone: %s", exc)

    # --- placing ---------------------------------------------------------------------------------
    def place(
        self,
        cls: type,
        *,
        role: str | None = None,
        pool: str | None = None,
        fallback: Sequence[str] | None = None,
        replicas: int | None = None,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        worker_kwargs: Callable[[Placement], Mapping[str, Any]] | None = None,
        slots: float = 1.0,
        num_cpus: float = 0.0,
        num_gpus: float | None = None,
        actor_options: Mapping[str, Any] | None = None,
        call_timeout_s: float = 300.0,
        replace_dead: bool = True,
        elastic: bool = True,
    ) -> WorkerSet:
        """Place `replicas` actors of `cls` (see the module doc for precedence and guarantees).

        `args`/`kwargs` go to every constructor; `worker_kwargs(placement)` adds per-worker keyword
        arguments (e.g. `lambda p: {"name": p.worker, "device": p.device}`). `actor_options` are passed to
        Ray's `.options()` (e.g. `max_concurrency`, `runtime_env`). `replace_dead`: a worker that dies is
        replaced (same arguments, same pool chain); `elastic`: the worker set grows when its preferred pool
        is `elastic` and gains capacity. A group that must be rebuilt as a whole (DDP ranks) passes False
        to both and handles deaths itself.
        """
        if isinstance(cls, ray.actor.ActorClass):
            raise TypeError("pass the plain class to place(), not a @ray.remote class; rollart makes the actor")
        clash = sorted(_PLACEMENT_OPTIONS & set(actor_options or {}))
        if clash:
            raise ValueError(f"actor_options may not set {clash}: placement decides them (use slots=, "
                             f"num_cpus=, num_gpus=)")
        req = resolve_request(cls, self.pools, self.roles, role=role, pool=pool, fallback=fallback,
                              replicas=replicas)
        factory = _WorkerFactory(self, ray.remote(cls), req, args, kwargs or {}, worker_kwargs, slots, num_cpus,
                                 num_gpus, actor_options or {})
        members = factory.spawn_all(req.replicas)
        worker_set = WorkerSet(req.role, members, factory, call_timeout_s, chain=req.chain, slots=slots,
                          replace_dead=replace_dead, elastic=elastic and self.pools[req.chain[0]].elastic)
        self._watch(worker_set)
        return worker_set

    def spawn(self, cls: type, *args: Any, name: str, **kwargs: Any) -> ray.actor.ActorHandle:
        """A control-plane actor (LLM proxy, turn barrier) that holds no pool slot and no CPU: it only
        routes and waits, on the driver's node. Started and checked ready within `cluster.start_timeout_s`."""
        actor = ray.remote(cls).options(num_cpus=0, max_restarts=0, scheduling_strategy=on_driver_node()).remote(
            *args, **kwargs)
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=self.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor)
            raise PlacementError(
                f"control actor {name} did not start within {self.start_timeout_s:g} s (cluster.start_timeout_s)"
            ) from None
        return actor

    def _reserve_on_ray(self, placed: Placement, request: dict[str, float]) -> tuple[Any, str]:
        group = placement_group([request], strategy="STRICT_PACK", name=f"rollart:{placed.worker}")
        if not group.wait(timeout_seconds=self.placement_timeout_s):
            remove_placement_group(group)
            raise PlacementError(self._unschedulable(placed, request))
        node_id = placement_group_table(group)["bundles_to_node_id"][0]
        return group, node_id

    def _unschedulable(self, placed: Placement, request: dict[str, float]) -> str:
        totals, free = ray.cluster_resources(), ray.available_resources()
        have = ", ".join(f"{k}: {free.get(k, 0.0):g} free of {totals.get(k, 0.0):g}" for k in request)
        hint = ""
        if totals.get(pool_resource(placed.pool), 0.0) <= 0:
            hint = f" No Ray node declares {pool_resource(placed.pool)}: " + declare_hint(
                self.pools, [placed.pool], ray.get_runtime_context().gcs_address)
        return (
            f"cannot place worker {placed.worker} (role '{placed.role}'): the ResourceManager counted room on "
            f"pool '{placed.pool}', but Ray could not reserve {request} within {self.placement_timeout_s:g} s "
            f"(cluster.placement_timeout_s); Ray has {have}. Something outside rollart holds this pool, or "
            f"a node holding it has left.{hint}"
        )

    def _wait_started(self, members: Sequence[Member]) -> None:
        refs = [m.actor.__ray_ready__.remote() for m in members]
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout_s)
        if pending:
            late = [m.worker for m, r in zip(members, refs) if r in pending]
            raise PlacementError(
                f"workers {', '.join(late)} were placed but did not finish starting within "
                f"{self.start_timeout_s:g} s (cluster.start_timeout_s): a slow or hung constructor"
            )
        for member, ref in zip(members, refs):
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise PlacementError(f"worker {member.worker} failed to start: {exc}") from exc

    # --- keeping worker sets whole ------------------------------------------------------------------
    def _watch(self, worker_set: WorkerSet) -> None:
        with self._lock:
            self._worker_sets.append(worker_set)
            if self._health is None:
                self._health = Ticker(self.check_health, self.health_interval_s)

    def _unwatch(self, worker_set: WorkerSet) -> None:
        with self._lock:
            if worker_set in self._worker_sets:
                self._worker_sets.remove(worker_set)
            health = self._health if not self._worker_sets else None
            if health is not None:
                self._health = None
        if health is not None:
            health.stop()

    def check_health(self) -> None:
        """One health check (the background thread runs it every `cluster.health_interval_s`): report
        dead workers to their worker sets, follow pool capacity to the alive nodes, grow elastic worker sets."""
        with self._lock:
            worker_sets = list(self._worker_sets)
        if not worker_sets:
            return
        grown = self._follow_nodes()  # first: a replacement for a worker whose node left must not aim there
        states = actor_states({m.actor_id for c in worker_sets for m in c.watched()})
        for worker_set in worker_sets:
            worker_set.check(states)
            if worker_set.elastic and worker_set.chain[0] in grown:
                worker_set.grow()

    def _follow_nodes(self) -> set[str]:
        """Set each pool's capacity in the pool accounts to what the alive nodes hold; the pools that grew."""
        totals = ray.cluster_resources()
        capacity = {name: cluster_capacity(name, totals) for name in self.pools}
        if capacity == self._capacity:
            return set()
        for p in sorted(p for p in capacity if capacity[p] != self._capacity.get(p)):
            log.warning("pool %s: the alive Ray nodes now hold %g of %s (was %g)", p, capacity[p],
                        pool_resource(p), self._capacity.get(p, 0.0))
        _call(self.manager.set_capacity.remote(capacity), "set_capacity")
        grown = {p for p, c in capacity.items() if c > self._capacity.get(p, 0.0)}
        self._capacity = capacity
        return grown

    # --- reporting -------------------------------------------------------------------------------
    def snapshot(self) -> tuple[PoolStatus, ...]:
        """Every pool: kind, device, capacity, free, fallback, holders, fallback counts, Ray nodes."""
        statuses = _call(self.manager.snapshot.remote(), "snapshot")
        nodes = pool_nodes([s.name for s in statuses], ray.nodes())
        return tuple(replace(s, nodes=nodes[s.name]) for s in statuses)

    def metrics(self) -> dict[str, float]:
        """`pools/<pool>/{capacity,free,held,workers,fallbacks_in,fallbacks_out,worker_deaths,
        replacements}` and `pools/fallbacks`."""
        return pool_metrics(_call(self.manager.snapshot.remote(), "snapshot"))


class _WorkerFactory:
    """Places workers of one worker set, now and later (the `worker_set.Placer` of the WorkerSet it made)."""

    def __init__(self, resources: Resources, remote_cls: Any, req: PlacementRequest, args: Sequence[Any],
                 kwargs: Mapping[str, Any], worker_kwargs: Callable[[Placement], Mapping[str, Any]] | None,
                 slots: float, num_cpus: float, num_gpus: float | None, actor_options: Mapping[str, Any]) -> None:
        self.resources = resources
        self.remote_cls = remote_cls
        self.req = req
        self.args, self.kwargs, self.worker_kwargs = tuple(args), dict(kwargs), worker_kwargs
        self.slots, self.num_cpus, self.num_gpus = slots, num_cpus, num_gpus
        self.actor_options = dict(actor_options)

    def spawn_all(self, replicas: int) -> list[Member]:
        """The first `replicas` workers, all or nothing (constructors run in parallel)."""
        members: list[Member] = []
        try:
            for slot in range(replicas):
                members.append(self._create(slot, self.req.chain))
            self.resources._wait_started(members)
        except BaseException:
            self.release(members)
            raise
        return members

    def spawn(self, slot: int, growing: bool = False) -> Member:
        """One started worker for `slot`: on the chain's first pool with room (`growing`: its first only)."""
        member = self._create(slot, self.req.chain[:1] if growing else self.req.chain)
        try:
            self.resources._wait_started([member])
        except BaseException:
            self.release([member])
            raise
        return member

    def _create(self, slot: int, chain: Sequence[str]) -> Member:
        res = self.resources
        got = _call(res.manager.reserve.remote(self.req.role, list(chain), self.slots), "reserve")
        if isinstance(got, NoRoom):
            raise PlacementError(got.message())
        if got.fell_back:
            log.warning(
                "fallback: worker %s (role '%s') preferred pool '%s', which is full; placed on '%s' "
                "(counted in pools/%s/fallbacks_in)",
                got.worker, got.role, got.preferred, got.pool, got.pool,
            )
        member = Member(slot, got, actor=None)
        try:
            request = ray_request(res.pools[got.pool], got.pool, self.slots, self.num_cpus, self.num_gpus)
            member.group, node_id = res._reserve_on_ray(got, request)
            member.placement = replace(got, node_id=node_id)
            _call(res.manager.confirm.remote(got.worker, node_id), "confirm")
            options: dict[str, Any] = {
                "num_cpus": request.get("CPU", 0.0),
                "num_gpus": request.get("GPU", 0.0),
                "resources": {pool_resource(got.pool): self.slots},
                "scheduling_strategy": PlacementGroupSchedulingStrategy(member.group, placement_group_bundle_index=0),
                "max_restarts": 0,  # a dead worker is replaced by the resource plane, with fresh state
                **self.actor_options,
            }
            extra = dict(self.worker_kwargs(member.placement)) if self.worker_kwargs else {}
            member.actor = self.remote_cls.options(**options).remote(*self.args, **{**self.kwargs, **extra})
        except BaseException:
            self.release([member])
            raise
        return member

    def release(self, members: Sequence[Member]) -> None:
        """Kill the actors, remove their placement groups, give the slots back; each once, each step
        tolerating a dead peer."""
        fresh = [m for m in members if not m.released]
        for m in fresh:
            m.released = True
        _release(self.resources.manager, [m.placement for m in fresh], [m.group for m in fresh if m.group],
                 [m.actor for m in fresh if m.actor is not None])

    def record_death(self, member: Member) -> None:
        _call(self.resources.manager.record_death.remote(member.worker), "record_death")

    def record_replacement(self, pool: str) -> None:
        _call(self.resources.manager.record_replacement.remote(pool), "record_replacement")

    def room(self, pool: str) -> float:
        return float(_call(self.resources.manager.free.remote(pool), "free"))

    def submit(self, fn: Callable[[], None]) -> None:
        # a daemon thread per job: a replacement's constructor may take seconds and must not hold up
        # the health check; a run that ends does not wait for it
        threading.Thread(target=fn, name="rollart-replace", daemon=True).start()

    def forget(self, worker_set: WorkerSet) -> None:
        self.resources._unwatch(worker_set)


def _call(ref: ray.ObjectRef, what: str) -> Any:
    try:
        return ray.get(ref, timeout=_MANAGER_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        raise PlacementError(f"the ResourceManager did not answer {what} within {_MANAGER_TIMEOUT_S:g} s") from None


def _release(manager: ray.actor.ActorHandle, placements: list[Placement], groups: list[Any],
             actors: list[ray.actor.ActorHandle]) -> None:
    """Kill actors, remove their placement groups, give the slots back; each step tolerates a dead peer."""
    if not ray.is_initialized():
        return  # Ray is already shut down: the actors, groups and pool accounts went with it
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead: nothing to free
            pass
    for group in groups:
        try:
            remove_placement_group(group)
        except Exception:  # already removed
            pass
    if placements:
        try:
            ray.get(manager.release.remote([p.worker for p in placements]), timeout=_MANAGER_TIMEOUT_S)
        except Exception as exc:  # the manager is gone with the worker set: its pool accounts are gone too
            log.warning("could not release %s: %s", [p.worker for p in placements], exc)
