"""A pool of worker processes with a per-task wall-clock limit; an overrunning worker is killed and replaced.

Why not `concurrent.futures` or `multiprocessing.Pool`: neither can stop one running task. A sympy computation such as
`9^(9^(9^9))` sits in C code that neither a signal handler nor a thread can interrupt, so the only reliable limit is
to kill the process. Each worker here serves one task at a time over its own socket; the caller waits on all sockets
with the nearest deadline and kills the workers whose task overran.

- Workers are forked from a per-pool template process (`xrpo.sandbox._pool_worker`, a "zygote" like multiprocessing's
  forkserver) that is a fresh interpreter, already warmed up: the caller's process (which may hold threads or CUDA
  state) is never forked, and a replacement is ready in milliseconds, so a killed worker costs no capacity. Unlike
  multiprocessing's spawn and forkserver, nothing re-imports the caller's `__main__`: a script without an
  `if __name__ == "__main__":` guard works.
- Any thread may call `run`, several at once: workers are checked out from a shared idle list.
- Processes die with the caller: an `atexit` hook kills them; on Linux the kernel kills the template when the caller's
  process dies, even by SIGKILL, and the workers when the template dies (PR_SET_PDEATHSIG; armed against one
  long-lived spawner thread, because the signal follows the thread that started the child); elsewhere the template
  exits when its control socket closes and the workers poll the caller's pid.
- `max_memory_mb` caps each worker's address space above its size at fork (RLIMIT_AS, POSIX), so a runaway
  expression raises MemoryError in the worker instead of exhausting the machine.
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["WorkerPool", "default_workers", "shared_pool", "shutdown_pools"]

# The template must have warmed up within this many seconds.
_STARTUP_TIMEOUT_S = 120.0
# The template gets the caller's sys.path (as multiprocessing's spawn does), so it imports the same code even from a
# source checkout.
_BOOTSTRAP = (
    "import os, sys; sys.path[:] = os.environ.pop('XRPO_WORKER_SYS_PATH').split(os.pathsep); "
    "from xrpo.sandbox._pool_worker import zygote_main; zygote_main(sys.argv[1:])"
)


def default_workers() -> int:
    """Number of CPU cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class _Spawner:
    """One long-lived daemon thread that starts every template process (see PR_SET_PDEATHSIG above)."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self.pid = os.getpid()
        threading.Thread(target=self._loop, name="xrpo-pool-spawner", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, box, done = self._queue.get()
            try:
                box.append(fn())
            except BaseException as e:
                box.append(e)
            done.set()

    def call(self, fn: Callable[[], Any]) -> Any:
        box: list = []
        done = threading.Event()
        self._queue.put((fn, box, done))
        done.wait()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


_SPAWNER: _Spawner | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawner() -> _Spawner:
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None or _SPAWNER.pid != os.getpid():  # a forked child has no spawner thread
            _SPAWNER = _Spawner()
        return _SPAWNER


class _Zygote:
    """The template process of one pool. Used only from the spawner thread."""

    def __init__(self, initializer: str | None, max_memory_mb: int | None):
        parent_sock, child_sock = socket.socketpair()
        try:
            env = dict(os.environ, XRPO_WORKER_SYS_PATH=os.pathsep.join(sys.path))
            args = [
                sys.executable,
                "-c",
                _BOOTSTRAP,
                str(child_sock.fileno()),
                str(os.getpid()),
                initializer or "-",
                str(max_memory_mb or 0),
            ]
            self.proc = subprocess.Popen(args, pass_fds=(child_sock.fileno(),), stdin=subprocess.DEVNULL, env=env)
        finally:
            child_sock.close()
        self.sock = parent_sock
        self.sock.settimeout(_STARTUP_TIMEOUT_S)
        self._buf = b""
        status = self._readline()
        if status != "ready":
            self.close()
            raise RuntimeError(f"verifier worker process failed to start: {status.removeprefix('failed ')}")

    def _readline(self) -> str:
        while b"\n" not in self._buf:
            try:
                chunk = self.sock.recv(4096)
            except TimeoutError:
                chunk = b""
            if not chunk:
                code = self.proc.poll()
                return f"no answer from the template process (exit code {code})"
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode(errors="replace")

    def fork(self) -> tuple[int, Connection]:
        ours, theirs = socket.socketpair()
        try:
            socket.send_fds(self.sock, [b"F"], [theirs.fileno()])
        finally:
            theirs.close()
        reply = self._readline()
        if not reply.isdigit():
            ours.close()
            raise OSError(reply)
        return int(reply), Connection(ours.detach())

    def close(self) -> None:
        self.sock.close()
        self.proc.kill()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass


class _Worker:
    __slots__ = ("pid", "conn")

    def __init__(self, pid: int, conn: Connection):
        self.pid = pid
        self.conn = conn

    def kill(self, *, dead: bool = False) -> None:
        # A dead worker was reaped at once (the template ignores SIGCHLD): its pid may already be someone else's.
        if not dead:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.conn.close()


class WorkerPool:
    """`workers` processes that run "module:function" tasks, each under a wall-clock limit.

    Args:
        workers: number of processes.
        initializer: optional "module:function" run once in the template process before any worker is forked
            (imports, warm-up); workers inherit its state.
        max_memory_mb: address-space headroom per worker above its size at fork; None for no cap.
    """

    def __init__(self, workers: int, *, initializer: str | None = None, max_memory_mb: int | None = None):
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers: expected an integer >= 1, got {workers!r}")
        if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
            raise RuntimeError("worker pools need fork() and socket.send_fds (POSIX); use in-process grading instead")
        self.workers = workers
        self.initializer = initializer
        self.max_memory_mb = max_memory_mb
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._live: set[_Worker] = set()
        self._zygote: _Zygote | None = None
        self._closed = False
        self._owner_pid = os.getpid()
        for _ in range(workers):
            self._spawn()

    def _fork_worker(self) -> _Worker:
        # Runs in the spawner thread; restarts the template once if it has died.
        for attempt in range(2):
            if self._closed:
                raise RuntimeError("the verifier worker pool has been shut down")
            if self._zygote is None:
                self._zygote = _Zygote(self.initializer, self.max_memory_mb)
            try:
                return _Worker(*self._zygote.fork())
            except OSError:
                self._zygote.close()
                self._zygote = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        worker = _spawner().call(self._fork_worker)
        with self._cond:
            if self._closed:
                worker.kill()
                return
            self._live.add(worker)
            self._idle.append(worker)
            self._cond.notify_all()

    def _discard(self, worker: _Worker, *, dead: bool = False) -> None:
        """Kill a worker (past its limit, dead, or interrupted mid-task) and fork a replacement."""
        worker.kill(dead=dead)
        with self._cond:
            self._live.discard(worker)
            replace = not self._closed
        if replace:
            self._spawn()

    def _acquire(self, block: bool) -> _Worker | None:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the verifier worker pool has been shut down")
                if self._idle:
                    return self._idle.pop()
                if not block:
                    return None
                self._cond.wait()

    def _release(self, worker: _Worker) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(worker)
                self._cond.notify_all()

    def pids(self) -> list[int]:
        """Process ids of the live workers, then of the template process."""
        with self._cond:
            pids = sorted(w.pid for w in self._live)
        return pids + ([self._zygote.proc.pid] if self._zygote is not None else [])

    def run(self, fn: str, args_list: Sequence[tuple], timeout: float) -> list[tuple[str, Any]]:
        """Run `fn(*args)` for every tuple in `args_list` across the workers.

        Returns one `(status, value)` per task, in order: ("ok", return value), ("error", "ExcType: message") when it
        raised or its worker died, or ("timeout", None) when it ran longer than `timeout` seconds (its worker is
        killed and replaced). The batch takes at most about `timeout * ceil(len(args_list) / workers)` seconds.
        """
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout: expected a positive number of seconds, got {timeout!r}")
        results: list[tuple[str, Any] | None] = [None] * len(args_list)
        pending = deque(range(len(args_list)))
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        try:
            while pending or busy:
                while pending:
                    worker = self._acquire(block=not busy)
                    if worker is None:
                        break
                    # An idle worker has nothing to say: a readable socket means it died while idle (EOF).
                    if worker.conn.poll():
                        self._discard(worker, dead=True)
                        continue
                    i = pending.popleft()
                    try:
                        worker.conn.send((fn, tuple(args_list[i])))
                    except OSError:
                        self._discard(worker, dead=True)
                        pending.appendleft(i)
                        continue
                    busy[worker.conn] = (worker, i, time.monotonic() + timeout)
                if not busy:
                    continue
                soonest = min(deadline for _, _, deadline in busy.values())
                for conn in wait(list(busy), timeout=max(0.0, soonest - time.monotonic())):
                    worker, i, _ = busy.pop(conn)
                    try:
                        ok, value = conn.recv()
                    except (EOFError, OSError):
                        results[i] = ("error", "worker process died")
                        self._discard(worker, dead=True)
                        continue
                    results[i] = ("ok", value) if ok else ("error", value)
                    self._release(worker)
                now = time.monotonic()
                for conn, (worker, i, deadline) in list(busy.items()):
                    if deadline <= now:
                        del busy[conn]
                        results[i] = ("timeout", None)
                        self._discard(worker)
        finally:
            # Interrupted (KeyboardInterrupt, an error above): the busy workers' state is unknown.
            for worker, _, _ in busy.values():
                self._discard(worker)
        return results  # type: ignore[return-value]

    def close(self) -> None:
        """Kill every worker and the template process. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            workers = list(self._live)
            self._live.clear()
            self._idle.clear()
            self._cond.notify_all()
        if os.getpid() != self._owner_pid:
            return  # a forked copy of the pool: the processes belong to the parent
        for w in workers:
            w.kill()
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            zygote.close()


_POOLS: dict[tuple, WorkerPool] = {}
_POOLS_LOCK = threading.Lock()


def shared_pool(workers: int, *, initializer: str | None = None, max_memory_mb: int | None = None) -> WorkerPool:
    """The process-wide pool for these settings, created on first use and reused by every verifier."""
    key = (workers, initializer, max_memory_mb)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool._closed or pool._owner_pid != os.getpid():
            pool = WorkerPool(workers, initializer=initializer, max_memory_mb=max_memory_mb)
            _POOLS[key] = pool
        return pool


def shutdown_pools() -> None:
    """Kill the processes of every shared pool (they are recreated lazily on the next call). Runs at exit."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()


atexit.register(shutdown_pools)
