"""A simulated fleet for the backtest's dispatcher: the real loop and bookkeeping, a fake cluster on a fake clock.

:class:`SimCluster` is a :class:`~distributed_onnx.runtime.dispatch_runtime.DispatchRuntime` and the
:class:`~distributed_onnx.runtime.dispatch.Replacements` of a cluster that does not exist: actors on nodes,
each running its calls one after the other at its own speed, a node that is lost at a given time (its actors'
calls fail with Ray's ``RayActorError``, as Ray's do) and comes back later, calls that hang until their
deadline. The dispatcher (:class:`~distributed_onnx.runtime.dispatch.Dispatcher`), its bookkeeping, the
driver's ledger of receipts (:class:`~distributed_onnx.evaluation.driver._part_ledger.PartLedger`, which sets each
part's deadline) and the progress counter are the run's own code, unchanged.

The fake clock moves at the cluster's events, and also by the CPU the driver's code spends between two of its
waits (measured with ``time.process_time``, the simulator's own share taken out): a driver that cannot keep up
delays its actors in the simulation as it would on a cluster. ``ray_cost_s_per_part`` adds what Ray's client
costs the driver per part (submit, wait, get: measured end to end, ``driver_share.py``), on the clock and in
the driver's CPU.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ray.exceptions import RayActorError

from distributed_onnx.evaluation.data.windows import PartSpec
from distributed_onnx.evaluation.driver._part_ledger import PartLedger
from distributed_onnx.evaluation.driver._progress import Progress
from distributed_onnx.evaluation.part_messages import PartReceipt
from distributed_onnx.evaluation.planning import dispatch_order
from distributed_onnx.runtime.dispatch import DispatchCallbacks, DispatchConfig, Dispatcher


@dataclass(frozen=True)
class Fleet:
    """The simulated cluster and its troubles."""

    actors: int = 1000
    nodes: int = 64
    windows_per_s: float = 100.0  # the median actor's speed (a Chronos-2-sized model on one CPU core: ~85)
    speed_sigma: float = 0.3  # log-normal spread of the actors' speeds
    stragglers: float = 0.02  # the share of actors that run at ``straggler_speed`` of their speed
    straggler_speed: float = 0.2
    call_overhead_s: float = 0.003  # each call's fixed cost on its actor (Ray's, the part's file)
    lose_node_at: float | None = 0.5  # when a node is lost, as a share of the ideal time; None: never
    node_back_after_s: float = 10.0  # a new node joins this long after the loss (an autoscaler)
    warm_up_s: float = 5.0  # a replacement actor's start (session, job)
    hang_probability: float = 0.0  # the chance that a call hangs until its deadline
    ray_cost_s_per_part: float = 0.0  # Ray's client cost per part on the driver (submit and get)
    ray_cost_s_per_wait: float = 0.0  # and per wait on Ray
    seed: int = 0


class _Ref:
    __slots__ = ("actor", "n")

    def __init__(self, actor: SimActor | None, n: int) -> None:
        self.actor, self.n = actor, n


class _Method:
    def __init__(self, call: Any) -> None:
        self.remote = call


@dataclass(eq=False)
class SimActor:
    key: int
    node: int
    speed: float
    cluster: SimCluster
    alive: bool = True
    free_at: float = 0.0
    busy_s: float = 0.0
    born_s: float = 0.0
    died_s: float | None = None
    pending: list[_Ref] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.run = _Method(lambda part: self.cluster.submit(self, part))
        self.ready = _Method(lambda: self.cluster.ready_ref(self))


class SimCluster:
    """The fake cluster: a DispatchRuntime and Replacements over simulated actors and a fake clock."""

    def __init__(self, fleet: Fleet, ideal_s: float) -> None:
        self.fleet = fleet
        self.t = 0.0
        self._rng = np.random.default_rng(fleet.seed)
        self._events: list[tuple[float, int, _Ref]] = []
        self._done: dict[_Ref, Any] = {}  # ref -> its value or the exception it raises
        self._counter = itertools.count()
        self._slots = [0] * fleet.nodes  # actors per node
        # Each node holds the actors it starts with (no spare room): a lost actor is replaced once its node's
        # replacement joins.
        self._capacity = [len(range(node, fleet.actors, fleet.nodes)) for node in range(fleet.nodes)]
        self._lost_node: int | None = None
        self._lose_at = None if fleet.lose_node_at is None else fleet.lose_node_at * ideal_s
        self._back_at: float | None = None
        self.actors: list[SimActor] = []
        self.sim_cpu_s = 0.0  # the simulator's own CPU (taken out of the driver's)
        self.driver_cpu_s = 0.0
        self._last_return = time.process_time()
        self.hangs = 0
        self.waits = 0
        for index in range(fleet.actors):
            self.actors.append(self._new_actor(index % fleet.nodes))

    # -- the cluster ------------------------------------------------------------------------------------------
    def _new_actor(self, node: int) -> SimActor:
        speed = self.fleet.windows_per_s * float(self._rng.lognormal(0.0, self.fleet.speed_sigma))
        if self._rng.random() < self.fleet.stragglers:
            speed *= self.fleet.straggler_speed
        self._slots[node] += 1
        return SimActor(len(self.actors), node, speed, self, born_s=self.t)

    def submit(self, actor: SimActor, part: PartSpec) -> _Ref:
        started = time.process_time()
        ref = _Ref(actor, next(self._counter))
        if actor.alive:
            begin = max(self.t, actor.free_at)
            seconds = self.fleet.call_overhead_s + part.n_windows / actor.speed
            if self.fleet.hang_probability and self._rng.random() < self.fleet.hang_probability:
                self.hangs += 1
                seconds = math.inf  # runs until the dispatcher kills its actor at the deadline
            actor.free_at = begin + seconds
            actor.pending.append(ref)
            if math.isfinite(seconds):
                receipt = PartReceipt(
                    part=part.index,
                    windows=part.n_windows,
                    rows=part.n_windows,
                    part_bytes=0,
                    sums_bytes=0,
                    write_attempts=1,
                    seconds={"model": seconds},
                )
                heapq.heappush(self._events, (actor.free_at, ref.n, ref))
                self._done[ref] = receipt  # not ready before its event
                actor.busy_s += seconds
        else:
            self._fail(ref)
        self.sim_cpu_s += time.process_time() - started
        return ref

    def ready_ref(self, actor: SimActor) -> _Ref:
        ref = _Ref(None, next(self._counter))
        self._done[ref] = True
        heapq.heappush(self._events, (self.t + self.fleet.warm_up_s, ref.n, ref))
        return ref

    def _fail(self, ref: _Ref) -> None:
        self._done[ref] = RayActorError()
        heapq.heappush(self._events, (self.t, ref.n, ref))

    def _kill_actor(self, actor: SimActor) -> None:
        if not actor.alive:
            return
        actor.alive = False
        actor.died_s = self.t
        if math.isfinite(actor.free_at) and actor.free_at > self.t:
            actor.busy_s -= actor.free_at - self.t  # the work it will not do
        for ref in actor.pending:
            self._fail(ref)  # an earlier event of this ref is now stale (its value is the error)
        actor.pending.clear()
        self._slots[actor.node] -= 1

    def _cluster_events(self) -> None:
        if self._lose_at is not None and self.t >= self._lose_at:
            self._lose_at = None
            self._lost_node = 0
            for actor in self.actors:
                if actor.node == 0:
                    self._kill_actor(actor)
            self._slots[0] = self._capacity[0]  # the node is gone: no room on it
            self._back_at = self.t + self.fleet.node_back_after_s
        if self._back_at is not None and self.t >= self._back_at:
            self._back_at = None
            self._slots[0] = 0  # a new node takes its place

    # -- DispatchRuntime --------------------------------------------------------------------------------------
    def wait(self, refs: Sequence[Any], timeout_s: float, linger_s: float = 0.0) -> list[Any]:
        started = time.process_time()
        driver = started - self._last_return + self.fleet.ray_cost_s_per_wait
        self.driver_cpu_s += driver
        self.waits += 1
        self.t += driver  # the driver's own time passes on the cluster's clock too
        wanted = set(refs)
        until = self.t + timeout_s
        ready: list[Any] = []
        lingered = False
        while self._events:
            when, _, ref = self._events[0]
            if ready and when > self.t:
                if linger_s <= 0 or lingered:
                    break
                lingered = True  # one result found: collect what else is ready within the linger
                self.t += linger_s
                self.driver_cpu_s += self.fleet.ray_cost_s_per_wait
                continue
            if when > until:
                break
            heapq.heappop(self._events)
            if ref not in wanted:
                continue  # not waited on (a ref dropped by the dispatcher, or a failed call's first event)
            self.t = max(self.t, when)
            self._cluster_events()
            if isinstance(ref.actor, SimActor) and ref in ref.actor.pending:
                ref.actor.pending.remove(ref)
            ready.append(ref)
            wanted.discard(ref)
        if not ready:
            self.t = max(self.t, until)
            self._cluster_events()
        self.sim_cpu_s += time.process_time() - started
        self._last_return = time.process_time()
        return ready

    def get(self, ref: Any) -> Any:
        value = self._done.pop(ref)
        if isinstance(value, BaseException):
            raise value
        return value

    def kill(self, actor: Any) -> None:
        self._kill_actor(actor)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    # -- Replacements -----------------------------------------------------------------------------------------
    def has_room(self) -> bool:
        return any(used < room for used, room in zip(self._slots, self._capacity, strict=True))

    def start(self) -> tuple[Any, Any]:
        node = next(index for index, used in enumerate(self._slots) if used < self._capacity[index])
        actor = self._new_actor(node)
        self.actors.append(actor)
        return actor, actor.ready.remote()


def ideal_s(fleet: Fleet, windows: int, speeds: Sequence[float], lost_speed: float) -> float:
    """The time the fleet's capacity needs for every window, spread perfectly (no part, no call, no tail).

    The lost node's actors count until the loss and its replacements from the node's return plus their
    warm-up (at the lost actors' speed): what a perfect scheduler of divisible work would get."""
    total = sum(speeds)
    if fleet.lose_node_at is None:
        return windows / total
    guess = windows / total
    for _ in range(50):  # the loss happens at a share of the ideal time itself: iterate to the fixed point
        lose = fleet.lose_node_at * guess
        back = lose + fleet.node_back_after_s + fleet.warm_up_s
        done_by_loss = total * lose
        down = total - lost_speed
        if done_by_loss + down * (back - lose) >= windows:
            t = lose + (windows - done_by_loss) / down
        else:
            t = back + (windows - done_by_loss - down * (back - lose)) / total
        if abs(t - guess) < 1e-9:
            break
        guess = t
    return guess


def simulate(
    fleet: Fleet,
    parts: list[PartSpec],
    windows: int,
    max_in_flight_per_actor: int = 2,
    first_wave: int = 0,
    hold_the_tail: bool = True,
) -> dict[str, Any]:
    """Run the dispatcher over ``parts`` on the simulated fleet; what a driver and its actors would see."""
    probe = SimCluster(fleet, 1.0)  # the same seed draws the same speeds
    speeds = [actor.speed for actor in probe.actors]
    lost = sum(actor.speed for actor in probe.actors if actor.node == 0)
    ideal = ideal_s(fleet, windows, speeds, lost)
    cluster = SimCluster(fleet, ideal)
    ledger = PartLedger()
    progress = Progress(windows, enabled=False, interval_s=1e9)
    failed: list[int] = []
    ray_cost = fleet.ray_cost_s_per_part

    def on_result(part: PartSpec, receipt: PartReceipt) -> None:
        ledger.add_receipt(receipt, cluster.t)
        progress.advance(receipt.windows)

    def submit(actor: SimActor, part: PartSpec) -> _Ref:
        cluster.t += ray_cost  # Ray's client, per part, measured end to end
        cluster.driver_cpu_s += ray_cost
        return actor.run.remote(part)

    callbacks = DispatchCallbacks[PartSpec](
        submit=submit,
        on_result=on_result,
        on_failure=lambda part, error: failed.append(part.index),
        key=lambda part: part.index,
        size=lambda part: part.n_windows,
        attempt_timeout_s=lambda part: ledger.deadline_s(part, None),
    )
    dispatcher = Dispatcher(
        list(cluster.actors),
        callbacks,
        DispatchConfig(
            max_in_flight_per_actor=max_in_flight_per_actor, ready_timeout_s=600.0, hold_the_tail=hold_the_tail
        ),
        replacements=cluster,
        runtime=cluster,
    )
    started = time.process_time()
    cluster._last_return = started
    stats = dispatcher.run(dispatch_order(parts, first_wave))
    whole_cpu = time.process_time() - started
    finished = cluster.t
    alive_s = sum((actor.died_s if actor.died_s is not None else finished) - actor.born_s for actor in cluster.actors)
    busy_s = sum(actor.busy_s for actor in cluster.actors)
    driver_cpu = cluster.driver_cpu_s
    return {
        "actors": fleet.actors,
        "windows_per_s_per_actor": fleet.windows_per_s,
        "parts": len(parts),
        "parts_per_actor": round(len(parts) / fleet.actors, 2),
        "windows_per_part": max(part.n_windows for part in parts),
        "ideal_s": round(ideal, 3),
        "finished_s": round(finished, 3),
        "over_ideal": round(finished / ideal - 1.0, 4),
        "idle_actor_share": round(1.0 - busy_s / alive_s, 4),
        "idle_actor_s": round(alive_s - busy_s, 1),
        "parts_retried": stats.retried,
        "actors_lost": stats.actors_lost,
        "deadlines_missed": stats.deadlines_missed,
        "replacements_ready": stats.replacements_ready,
        "hangs": cluster.hangs,
        "failed": len(failed),
        "completed": stats.completed,
        "driver_cpu_s": round(driver_cpu, 4),
        "driver_cpu_share_of_wall": round(driver_cpu / finished, 4),
        "waits": cluster.waits,
        "driver_code_us_per_part": round(
            1e6
            * (driver_cpu - ray_cost * stats.submitted - fleet.ray_cost_s_per_wait * cluster.waits)
            / stats.submitted,
            1,
        ),
        "driver_us_per_part": round(1e6 * driver_cpu / stats.submitted, 1),
        "simulator_cpu_s": round(cluster.sim_cpu_s, 3),
        "whole_cpu_s": round(whole_cpu, 3),
    }
