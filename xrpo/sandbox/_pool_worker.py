"""Processes behind `xrpo.sandbox.pool.WorkerPool`: one template ("zygote") per pool, and the workers it forks.

The zygote is a fresh interpreter that imports and warms up once (`initializer`), then waits on its control socket.
For each request it receives a socket (SCM_RIGHTS) and forks a worker that serves tasks on it, so a replacement for a
killed worker is ready in milliseconds instead of the 1-2 s of a cold interpreter with sympy. The zygote has no threads,
which keeps fork() safe.

Control protocol (raw socket): the zygote sends b"ready\\n" or b"failed <message>\\n" once warmed up; then for each
request (one byte plus one file descriptor) it answers with the worker's pid as b"<pid>\\n".
Task protocol (multiprocessing Connection): for each `(fn_spec, args)` received, the worker runs `fn(*args)` (fn_spec
is "module:function") and sends `(True, result)` or `(False, "ExcType: message")`.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import sys
import threading
import time
from typing import Any


def _resolve(spec: str, cache: dict) -> Any:
    fn = cache.get(spec)
    if fn is None:
        module_name, _, attr = spec.partition(":")
        fn = getattr(importlib.import_module(module_name), attr)
        cache[spec] = fn
    return fn


def _error_text(e: BaseException) -> str:
    try:
        return f"{type(e).__name__}: {e}"[:500]
    except Exception:  # str() of an exotic exception argument can itself fail
        return type(e).__name__


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel SIGKILL this process when the thread that started it exits (even when the parent is
    SIGKILLed). The zygote's parent thread is the pool's long-lived spawner thread; a worker's is the zygote."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            PR_SET_PDEATHSIG = 1
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except Exception:
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _watch_process(pid: int) -> None:
    # Portable fallback to PR_SET_PDEATHSIG; it cannot run while a C call holds the GIL, the kernel signal can.
    def loop() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:
                pass

    threading.Thread(target=loop, name="xrpo-worker-watchdog", daemon=True).start()


def _limit_memory(max_memory_mb: int) -> None:
    if max_memory_mb <= 0:
        return
    try:
        import resource

        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = current + max_memory_mb * 2**20
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, OSError, ValueError):
        pass  # no /proc or no RLIMIT_AS: run without the cap


def _serve(fd: int, cache: dict, main_pid: int, zygote_pid: int, max_memory_mb: int) -> None:
    from multiprocessing.connection import Connection

    _die_with_parent(zygote_pid)
    _watch_process(main_pid)
    _limit_memory(max_memory_mb)
    conn = Connection(fd)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        spec, args = msg
        try:
            out = (True, _resolve(spec, cache)(*args))
        except BaseException as e:  # report everything, MemoryError and RecursionError included
            out = (False, _error_text(e))
        try:
            conn.send(out)
        except Exception as e:
            conn.send((False, f"result could not be sent: {_error_text(e)}"))


def zygote_main(argv: list[str]) -> None:
    ctrl_fd, main_pid, initializer, max_memory_mb = int(argv[0]), int(argv[1]), argv[2], int(argv[3])
    # Ctrl-C reaches the whole process group; the pool decides what happens to its processes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(main_pid)
    ctrl = socket.socket(fileno=ctrl_fd)
    cache: dict = {}
    try:
        if initializer != "-":
            _resolve(initializer, cache)()
    except BaseException as e:
        ctrl.sendall(b"failed " + _error_text(e).replace("\n", " ").encode() + b"\n")
        return
    # Workers are not waited for by the pool (they are not its children): let the kernel reap them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    ctrl.sendall(b"ready\n")
    zygote_pid = os.getpid()
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(ctrl, 1, 1)
        except OSError:
            return
        if not fds:  # EOF: the pool closed or its process died
            return
        pid = os.fork()
        if pid == 0:
            try:
                ctrl.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _serve(fds[0], cache, main_pid, zygote_pid, max_memory_mb)
            finally:
                os._exit(0)
        os.close(fds[0])
        ctrl.sendall(f"{pid}\n".encode())
