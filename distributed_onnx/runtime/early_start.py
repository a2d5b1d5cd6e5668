"""Ray and the backtest's actor pool, started on a thread while the driver reads, checks and plans the data.

The one path by which a backtest starts its pool and stops Ray: early, for a fresh run (the plan is made
meanwhile), or once the plan shows parts to run (a resumed run; a process that holds Ray already, whose Ray is
then only joined and never stopped).

A run's first forecast waits for two independent things: the driver's plan (imports, reading and checking the
data, counting windows) and a warm pool (Ray's processes, then actor processes that import ONNX Runtime and
build their sessions). Started one after the other they add up; :class:`EarlyStart` runs the second on a
thread, and the driver hands the pool its job once the plan is ready (``WorkerActor.take_job``).

The thread that starts Ray lives as long as Ray does and stops it too: Ray's embedded processes die with the
*thread* that started them (they are started with ``PR_SET_PDEATHSIG``, which Linux fires when the parent
thread exits; measured: the GCS died as soon as a starting thread returned). Stopping Ray on that thread also
lets the driver finish its merge and report while Ray shuts down (:meth:`EarlyStart.stop`).

A run whose data turns out bad does not wait for a pool it will never use (:meth:`EarlyStart.abandon`): the pool
is not started, nor Ray if the thread had not started it yet, and Ray is stopped on the owning thread and waited
for (the Python API: the next call starts clean), or, for a process about to exit (the command, which prints the
data error first), left to the exit once the thread has imported Ray: a Ray still starting dies with the thread
that started it (above), one already up is stopped by ``ray.init``'s own exit handler. The thread then never
stops Ray itself, so two shutdowns never race.

While the run needs Ray, a second thread polls the one watch of the Ray it runs on (:mod:`.ray_watch`): a Ray
that went away (its GCS or raylet killed, the embedded one's or a joined ``ray start`` head's) is recorded as a
:class:`~distributed_onnx.errors.RayLostError` and the main thread is interrupted (SIGINT to it, which Ray's waits
answer as they answer Ctrl-C); the run turns that into the error (one line, exit 3: finished parts are kept), and
what the lost Ray left of this run (the embedded Ray's processes, the run's actors on a joined Ray of this
machine) is stopped by signal, ``ray.shutdown`` taken off the exit handlers: nothing waits on the dead GCS until
Ray's core would abort the process a minute later. A process that held Ray before the run keeps its own.

This module imports Ray on the thread, not at its own import: the command creates an :class:`EarlyStart` before
it imports the rest of the backtest, so Ray's processes start while the driver still imports (what that gains:
``benchmarks/results/mechanisms.md``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from distributed_onnx.errors import DistributedOnnxError, RayLostError, RayStartError, WorkerStartError
from distributed_onnx.interrupts import SigtermInterrupt, is_ours, sigterm_words
from distributed_onnx.model.worker import WorkerInfo
from distributed_onnx.runtime.pool_request import PoolRequest
from distributed_onnx.runtime.pool_room import RAISE_READY_TIMEOUT

if TYPE_CHECKING:
    from distributed_onnx.runtime.actors import JobFactory
    from distributed_onnx.runtime.ray_watch import RayWatch

logger = logging.getLogger(__name__)

#: The longest an abandoned start waits for the thread to finish importing Ray (seconds on a cold, loaded node).
IMPORT_TIMEOUT_S = 60.0
#: Seconds between two looks at the run's Ray (:mod:`.ray_watch`): a lost Ray is noticed within about one.
WATCH_EVERY_S = 0.5
#: The longest the main thread waits, after a lost Ray, for what it left of the run to be stopped.
ABANDON_TIMEOUT_S = 15.0
#: The longest the driver waits for the embedded Ray to start (its import included) on a cold, loaded node; a
#: joined Ray gets twice :data:`~.joining.JOIN_TIMEOUT_S` (its address answering, then Ray's own join).
EMBEDDED_START_TIMEOUT_S = 300.0
#: Beyond the pool's own deadlines (room, then loading), what :meth:`EarlyStart.wait` allows for the rest of the
#: start (the actors' creation, the answers' way back).
POOL_SLACK_S = 60.0


@dataclass
class EarlyStart:
    """Connects (or starts the embedded Ray) and starts the pool on a thread that then waits to stop Ray.

    ``quiet_ray``: when not None, Ray's console logging is set on the thread right after it imports Ray, before
    Ray starts (:func:`~.local_ray.quiet_ray_logging`: Ray's import resets its loggers).
    """

    address: str | None
    pool: PoolRequest | None
    quiet_ray: bool | None = None
    #: A pool kept across runs (the runs of a fev benchmark, :func:`~.evaluation.driver.early.kept_pool`): a
    #: run's stop, abandon and join leave it up, its owner ends it with :meth:`release`.
    kept: bool = False
    started_ray: bool = False
    joined_ray: bool = False  # connected to a running Ray here (the command's --address): disconnected at stop
    actors: list[Any] = field(default_factory=list)
    infos: list[WorkerInfo] = field(default_factory=list)
    _error: BaseException | None = None
    _ready: threading.Event = field(default_factory=threading.Event)
    _connected: threading.Event = field(default_factory=threading.Event)  # Ray up or joined (or that failed)
    _stop: threading.Event = field(default_factory=threading.Event)
    _imported: threading.Event = field(default_factory=threading.Event)  # Ray's modules imported (or failed to)
    _thread: threading.Thread | None = None
    _left_to_exit: bool = False  # the process exits: Ray's exit handler stops Ray, not the thread
    #: The Ray went away while the run needed it (the watch thread says so; :meth:`wait` and the run raise it).
    lost: RayLostError | None = None
    _watching: threading.Lock = field(default_factory=threading.Lock)  # a loss is recorded only before a stop
    _abandoned: threading.Event = field(default_factory=threading.Event)  # what the lost Ray left is stopped

    def __post_init__(self) -> None:
        if not ray_connected():  # a process that holds Ray already keeps its own signal handling
            exit_on_sigterm()  # Ray sets its SIGTERM handler only when started on the main thread
        self._thread = threading.Thread(target=self._own_ray, name="ray-owner", daemon=True)
        self._thread.start()

    def _own_ray(self) -> None:
        try:
            try:
                import ray

                from distributed_onnx.runtime.actors import start_pool
                from distributed_onnx.runtime.local_ray import connect, quiet_ray_logging
            finally:
                self._imported.set()
            if self._stop.is_set():  # abandoned (bad data) before Ray started: it never starts
                return
            if self.quiet_ray is not None:
                quiet_ray_logging(quiet=self.quiet_ray)
            from distributed_onnx.runtime.ray_private import keep_signal_handlers

            connected_before = ray.is_initialized()
            # No C++ failure-signal handler in the driver: a SIGTERM is the command's exit 130, not a stack dump.
            with keep_signal_handlers():
                self.started_ray = connect(self.address, stand_in_agents=True)  # Ray for this run only
            self.joined_ray = not connected_before and not self.started_ray
            self._connected.set()
            if self._left_to_exit:
                return
            if not connected_before:
                self._start_watch()
            if self._left_to_exit:
                return
            if self.pool is not None and not self._stop.is_set():
                self.actors, self.infos = start_pool(self.pool)
        except BaseException as exc:  # handed to the driver by wait(): the same error it would have got itself
            self._error = exc
        finally:
            self._connected.set()
            self._ready.set()
        self._stop.wait()
        if self._left_to_exit or self.lost is not None:  # a lost Ray is not asked anything (it would not answer)
            return
        try:
            import ray

            from distributed_onnx.runtime.local_ray import disconnect

            for actor in self.actors:
                ray.kill(actor)
            disconnect(self.started_ray, joined=self.joined_ray)
        except Exception as exc:  # stopping is best effort: the run's results are written already
            logger.warning("Stopping Ray: %s", exc)

    def _start_watch(self) -> None:
        """Watch the Ray this run started or joined, on a thread of its own, while the run needs it."""
        from distributed_onnx.runtime.ray_watch import watch_connected_ray

        watch = watch_connected_ray(self.started_ray)
        threading.Thread(target=self._watch_ray, args=(watch,), name="ray-watch", daemon=True).start()

    def _watch_ray(self, watch: RayWatch) -> None:
        """Until the run is done with Ray: on a loss, record it, interrupt the main thread, stop what is left."""
        from distributed_onnx.runtime.ray_watch import abandon_lost_ray, ray_workers

        while not self._stop.wait(WATCH_EVERY_S):
            reason = watch.lost()
            if reason is None:
                continue
            with self._watching:
                if self._stop.is_set():  # the run is done with Ray: it is stopping as it would anyway
                    return
                self.lost = lost_ray_error(reason, self.started_ray)
            self._ready.set()  # a driver still waiting for the pool hears it at once (:meth:`wait`)
            interrupt_main_thread()
            # The run's actors on a joined Ray of this machine: nothing else ends them while its GCS is gone.
            local = bool(watch.processes) and not self.started_ray
            actors = ray_workers(info.pid for info in self.infos) if local else []
            try:
                abandon_lost_ray(self.started_ray, watch, also=actors)
            finally:
                self._abandoned.set()
            return

    @property
    def ready(self) -> bool:
        """True once Ray is up and the pool warm (or starting them failed): :meth:`wait` would return at once."""
        return self._ready.is_set()

    def wait(self) -> None:
        """Block until Ray is up and the pool warm; raise what went wrong there (a typed start-up error), or a
        :class:`RayStartError` naming what did not come within its deadline: Ray's start or join
        (:meth:`connect_timeout_s`), then the pool (its placement and ready deadlines and :data:`POOL_SLACK_S`); or the
        loss of the run's Ray (:class:`RayLostError`, seen by the watch)."""
        connect_s = self.connect_timeout_s()
        if not self._connected.wait(connect_s):
            where = f"the Ray at {self.address}" if self.address else "the embedded local Ray on 127.0.0.1"
            raise RayStartError(
                f"Could not join {where} within {connect_s:g} s: Ray's join did not return (its address accepts "
                "connections, but no Ray answered there). Check --address (a running Ray's head: ray status shows "
                "it), or leave it out for an embedded Ray.",
                address=self.address,
            )
        take_sigterm_back()
        pool_s = POOL_SLACK_S + (self.pool.placement_timeout_s + self.pool.ready_timeout_s if self.pool else 0.0)
        if not self._ready.wait(pool_s):
            raise RayStartError(f"The worker actors' start did not return within {pool_s:g} s.", address=self.address)
        if self.lost is not None:
            raise self.lost
        if self._error is not None:
            raise self._error

    def connect_timeout_s(self) -> float:
        """The deadline of Ray's start (embedded) or join (``address``, which may be ``auto``)."""
        from distributed_onnx.runtime.joining import JOIN_TIMEOUT_S

        return 2 * JOIN_TIMEOUT_S if self.address else EMBEDDED_START_TIMEOUT_S

    def hand_job(self, job_factory: JobFactory, job_input: Any) -> None:
        """Give every actor of the pool its job (``job_input`` may be an ObjectRef, resolved in the actor), within
        the pool's ``ready_timeout_s``: building a job reads the run's input into each actor, loading of a kind."""
        import ray
        from ray.exceptions import GetTimeoutError, RayTaskError

        timeout_s = self.pool.ready_timeout_s if self.pool is not None else None
        refs = [actor.take_job.remote(job_factory, job_input) for actor in self.actors]
        try:
            ray.get(refs, timeout=timeout_s)
        except RayTaskError as exc:
            if isinstance(exc.cause, DistributedOnnxError):
                raise exc.cause from None
            raise
        except GetTimeoutError:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            raise WorkerStartError(
                f"{len(done)} of {len(refs)} worker actors had built their job (read the run's input) after "
                f"{timeout_s:g} s.",
                ready=len(done),
                requested=len(refs),
                suggestions=(RAISE_READY_TIMEOUT,),
            ) from None

    def stop(self) -> None:
        """Kill the pool and stop Ray (if this process started it) on the owning thread; returns at once."""
        if not self.kept:
            with self._watching:
                self._stop.set()

    def abandon(self, *, wait: bool = True) -> None:
        """Stop for a run that will not use the pool (its input was bad): waiting for Ray to stop, or (``wait``
        false, in a process about to exit) leaving Ray to the exit and returning at once (module docstring)."""
        if self.kept:
            return
        if wait:
            self.join()
        else:
            self._left_to_exit = True
            self._stop.set()
            # The thread may still be importing Ray: a caller that goes on in this process (``main()`` called from
            # Python) must not find Ray half-imported in sys.modules.
            self._imported.wait(IMPORT_TIMEOUT_S)

    def join(self, timeout_s: float | None = None) -> None:
        """Wait until Ray has stopped (after :meth:`stop`)."""
        if self.kept:
            return
        with self._watching:
            self._stop.set()
        if self.lost is not None:  # the owning thread may wait on the dead GCS: wait for the watch's stop instead
            self._abandoned.wait(ABANDON_TIMEOUT_S if timeout_s is None else timeout_s)
        elif self._thread is not None:
            self._thread.join(timeout_s)

    def release(self) -> None:
        """End a kept pool: kill its actors and stop Ray (if this process started it), and wait for that."""
        self.kept = False
        self.join()


def lost_ray_error(reason: str, started_ray: bool) -> RayLostError:
    """The one line for a Ray lost under a run: what went, where to look for why, and that a rerun resumes."""
    if started_ray:
        look = "Ray's logs (/tmp/ray/session_latest/logs by default: gcs_server.out, raylet.out) or dmesg"
        again = "rerun the same command to resume"
    else:
        look = "that Ray's logs (gcs_server.out, raylet.out in its session's logs folder)"
        again = "start that Ray again (or leave --address out) and rerun the same command to resume"
    return RayLostError(
        f"Ray went away during the run: {reason}. Finished parts are kept; see {look} for why (memory, a kill), "
        f"then {again}.",
        reason=reason,
    )


def interrupt_main_thread() -> None:
    """Interrupt the main thread as Ctrl-C does: SIGINT to it wakes a wait in Ray or a sleep, and its handler raises
    there. Nothing when the process does not handle SIGINT in Python (ignored, or left to end the process)."""
    main = threading.main_thread().ident
    if callable(signal.getsignal(signal.SIGINT)) and main is not None:
        signal.pthread_kill(main, signal.SIGINT)


def ray_connected() -> bool:
    """Whether this process holds a connected Ray (embedded or a cluster's); never imports Ray to find out."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


#: What a SIGTERM of a backtest (or a fev run) ends it with: the CLI's interrupted exit, 130 (docs/cli.md).
TERMINATED = sigterm_words(resumes=True)
_terminated = SigtermInterrupt(TERMINATED)


def exit_on_sigterm() -> None:
    """SIGTERM ends the run as Ctrl-C does (a KeyboardInterrupt naming SIGTERM: the CLI's exit 130 and one line;
    atexit stops Ray), where Ray's own driver handler exited with the signal's number, 15, outside the exit
    codes. ``ray.init`` would set its handler only on the main thread (and warns, on Ray's logger, that it did not).
    The command's own, set before its imports (:mod:`distributed_onnx.interrupts`), gives way to the run's: the one
    :func:`take_sigterm_back` sets again after Ray's start.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    handler = signal.getsignal(signal.SIGTERM)
    if handler is signal.SIG_DFL or is_ours(handler):
        signal.signal(signal.SIGTERM, _terminated)


def take_sigterm_back() -> None:
    """Our SIGTERM handler in force again once Ray is up, whatever C-level handler Ray's native start left: the
    driver's core worker would install absl's failure-signal handler (also for SIGTERM, on any thread), which prints
    Ray's C++ stack dump (``*** SIGTERM received at time=...``) before chaining to ours. The start is kept from
    installing it (:func:`~.ray_private.keep_signal_handlers`); setting ours again is the second guard, for the
    time after the start only."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is _terminated:
        signal.signal(signal.SIGTERM, _terminated)
