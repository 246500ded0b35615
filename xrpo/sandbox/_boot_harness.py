"""The test harness inside the sandbox (part of the boot, `xrpo.sandbox._boot`): `harness` runs each test in a
process of its own under the resource limits, watches its pipes and time, kills what it leaves behind, and reports
each test as one frame of the stream (`frame`; the format is in `xrpo.sandbox._boot`).

Runs inside the sandbox's interpreter in one namespace with the boot's other parts (`xrpo.sandbox.programs.BOOT_PARTS`):
standard library only, nothing from xrpo.
"""

import os
import select
import signal
import sys
import time

if __name__ != "_boot":  # imported (tests, tools); the sandbox runs every part in one namespace instead
    from xrpo.sandbox._boot_check import print_exception, run_check
    from xrpo.sandbox._boot_isolation import PR_SET_DUMPABLE, Libc

_STDERR_TAIL = 2000
_MAX_PENDING_SIGNALS = 256


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def frame(fd: int, kind: str, payload: bytes = b"", fields: tuple = ()) -> None:
    head = " ".join([kind, str(len(payload))] + ["-" if f is None else str(f) for f in fields])
    write_all(fd, head.encode() + b"\n" + payload)


def _set_limits(lim: dict, cpu: float | None, processes: int | None) -> None:
    import resource

    def setl(res, soft, hard=None):
        hard = soft if hard is None else hard
        try:
            cur_soft, cur_hard = resource.getrlimit(res)
            if cur_hard != resource.RLIM_INFINITY:
                hard = min(hard, cur_hard)
                soft = min(soft, hard)
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError):
            pass

    mb = 2**20
    setl(resource.RLIMIT_AS, lim["memory_mb"] * mb)
    setl(resource.RLIMIT_FSIZE, lim["max_file_mb"] * mb)
    setl(resource.RLIMIT_NOFILE, lim["max_open_files"])
    setl(resource.RLIMIT_CORE, 0)
    # queued signals are kernel memory (~80 bytes each; the default allows ~96,000 per uid)
    setl(resource.RLIMIT_SIGPENDING, _MAX_PENDING_SIGNALS)
    # no real-time scheduling and no raised priority, whatever the caller's limits allow (a container started with
    # --ulimit rtprio=99): SCHED_FIFO busy loops would starve the harness and the caller past every wall-clock limit
    setl(resource.RLIMIT_RTPRIO, 0)
    setl(resource.RLIMIT_NICE, 0)
    if cpu is not None:
        secs = max(1, int(-(-cpu // 1)))
        setl(resource.RLIMIT_CPU, secs, secs + 1)  # SIGXCPU at the soft limit, SIGKILL a second later
    if processes is not None:
        setl(resource.RLIMIT_NPROC, processes)


def _kill_leftovers(may_kill_all: bool, child: int) -> None:
    """Kill every process a test left behind (children that outlived it, daemons) and reap them."""
    if may_kill_all:
        # PID 1 of a PID namespace, or a dedicated uid: kill(-1) reaches exactly the sandbox's other processes.
        for _ in range(1000):  # zombies count for kill(-1) until reaped, and they all reparent to the harness
            try:
                os.kill(-1, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                break
            _reap()
            time.sleep(0.0005)
    else:
        try:
            os.killpg(child, signal.SIGKILL)
        except OSError:
            pass
        me = os.getpid()
        for _ in range(50):  # descendants found through /proc (the harness is their subreaper)
            found = _descendants(me)
            if not found:
                break
            for p in found:
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            _reap()
    _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _descendants(root: int) -> list[int]:
    parent: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2 :].split()
        if rest and rest[0] != b"Z":
            parent[int(name)] = int(rest[1])
    out, frontier = [], {root}
    while frontier:
        nxt = {p for p, pp in parent.items() if pp in frontier and p != root}
        nxt -= set(out)
        out.extend(nxt)
        frontier = nxt
    return out


def harness(job: dict, layers: list, pidns: bool, own_uid: bool, stdin_fd: int) -> None:
    res_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    frame(res_fd, "H", ",".join(layers).encode())
    lim = job["limits"]
    # The harness itself stays within the memory limit (compiling a hostile program cannot exhaust the machine).
    # RLIMIT_NPROC counts every process of the real uid: exact under a dedicated uid; under the caller's own uid
    # it is offset by the caller's process count (taken just before the start; approximate).
    if own_uid:
        nproc = lim["max_processes"]
    elif job.get("nproc_base") is not None:
        nproc = job["nproc_base"] + lim["max_processes"]
    else:
        nproc = None
    _set_limits(lim, None, nproc)
    deadline = time.monotonic() + lim["sample_timeout"]
    code = job["code"]
    try:
        with open("solution.py", "w", encoding="utf-8", errors="surrogatepass") as f:  # tracebacks show its lines
            f.write(code)
    except OSError:
        pass
    try:
        code_obj = compile(code, "solution.py", "exec")
    except BaseException as e:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError
        text = f"{type(e).__name__}: {e}"[-_STDERR_TAIL:]
        frame(res_fd, "C", text.encode("utf-8", "replace"))
        frame(res_fd, "D")
        return
    if job["mode"] == "call":
        import json  # noqa: F401 - once here rather than in every forked test
    may_kill_all = pidns or own_uid
    for i, test_input in enumerate(job["inputs"]):
        if time.monotonic() >= deadline:
            break
        status, exit_code, sig, wall, cpu, out, val, err = _run_test(
            job, i, test_input, code_obj, deadline, may_kill_all, nproc, stdin_fd
        )
        frame(
            res_fd,
            "T",
            out + (val or b"") + err,
            (
                i,
                status,
                exit_code,
                sig,
                f"{wall:.4f}",
                f"{cpu:.4f}",
                len(out),
                None if val is None else len(val),
                len(err),
            ),
        )
        if job["stop_on_failure"] and status != "ok":
            break
    frame(res_fd, "D")


def _high_dup(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD, 10)


def _oom_kills(events_fd) -> int:
    """The cgroup's count of processes killed for memory (memory.events: ``oom_kill N``); 0 without one."""
    if events_fd is None:
        return 0
    try:
        for line in os.pread(events_fd, 4096, 0).decode("ascii", "replace").splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _oom_first() -> None:
    """Make this test's processes the cgroup OOM killer's first choice, before the harness. A non-dumpable process's
    /proc files belong to root, so it is dumpable for the moment of the write (nothing else of its uid runs then)."""
    try:
        libc = Libc()
        libc.prctl(PR_SET_DUMPABLE, 1)
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        finally:
            libc.prctl(PR_SET_DUMPABLE, 0)
    except OSError:
        pass


def _memory_failure(stderr: str) -> bool:
    """An allocation failure as a failed test's stderr shows it (the interpreter's MemoryError, or an OSError of
    ENOMEM). Only asked about a test that failed: the text alone never fails one."""
    return "MemoryError" in stderr or "Cannot allocate memory" in stderr


def _run_test(job, i, test_input, code_obj, deadline, may_kill_all, nproc, in_fd):
    lim = job["limits"]
    mode = job["mode"]
    timeout = lim["timeout"]
    cpu = lim["cpu_seconds"] if lim["cpu_seconds"] is not None else timeout
    data = test_input.encode("utf-8", "surrogatepass") if mode == "stdin" and isinstance(test_input, str) else b""
    # the test before may have written to or resized its stdin: start from an empty file
    os.ftruncate(in_fd, 0)
    os.lseek(in_fd, 0, os.SEEK_SET)
    write_all(in_fd, data)
    os.lseek(in_fd, 0, os.SEEK_SET)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    val_r, val_w = os.pipe()
    events_fd = job["events_fd"]
    oom_before = _oom_kills(events_fd)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the test process
        try:
            os.setsid()
            keep = (in_fd, out_w, err_w, val_w) + ((job["check_fd"],) if mode == "check" else ())
            fds = [_high_dup(fd) for fd in keep]
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.closerange(len(fds), 1 << 16)
            if events_fd is not None:
                _oom_first()
            _set_limits(lim, cpu, nproc)
            _child(mode, code_obj, job, test_input)
        finally:
            os._exit(70)
    for fd in (out_w, err_w, val_w):
        os.close(fd)
    status, exit_code, sig, rusage, out, err, val = _watch(
        pid, out_r, err_r, val_r, min(start + timeout, deadline), lim["max_output_bytes"], may_kill_all
    )
    wall = time.monotonic() - start
    cpu_used = (rusage.ru_utime + rusage.ru_stime) if rusage is not None else 0.0
    err = err[-_STDERR_TAIL:]
    stderr = err.decode("utf-8", "replace")
    if status is None:
        if _oom_kills(events_fd) > oom_before:
            status = "memory"
        elif sig in (signal.SIGXCPU,) or (sig == signal.SIGKILL and cpu_used >= max(1, -(-cpu // 1)) - 0.05):
            status = "timeout"
        elif exit_code == 0 and sig is None:
            # a clean exit is judged on its output alone, whatever its stderr says
            status = "ok" if mode == "stdin" or val else "runtime_error"
        elif _memory_failure(stderr):
            status = "memory"
        else:
            status = "runtime_error"
    return status, exit_code, sig, wall, cpu_used, out, (val if mode != "stdin" and val else None), err


def _watch(pid, out_r, err_r, val_r, deadline, cap, may_kill_all):
    """Read the test's pipes until it exits (or overruns the deadline / the output cap); kill what it left."""
    poll = select.poll()
    bufs = {out_r: bytearray(), err_r: bytearray(), val_r: bytearray()}
    live = set(bufs)
    for fd in bufs:
        os.set_blocking(fd, False)
        poll.register(fd, select.POLLIN)
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
            poll.register(pidfd, select.POLLIN)
        except OSError:
            pidfd = None
    err_total = 0

    def pump(fd: int) -> bool:
        """Read one chunk from `fd`; False when the output cap is passed."""
        nonlocal err_total
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            poll.unregister(fd)
            live.discard(fd)
            return True
        buf = bufs[fd]
        buf += chunk
        if fd == err_r:  # only the tail of stderr is kept, but all of it counts against the cap
            err_total += len(chunk)
            del buf[: -_STDERR_TAIL * 2]
            return err_total <= cap
        if len(buf) > cap:
            del buf[cap:]
            return False
        return True

    status = raw = rusage = None
    while True:
        now = time.monotonic()
        if now >= deadline:
            status = "timeout"
            break
        # Without a pidfd, poll the child's state every 5 ms.
        wait = deadline - now if pidfd is not None else min(deadline - now, 0.005)
        exited = pidfd is None
        for fd, _ in poll.poll(max(1, int(wait * 1000))):
            if fd == pidfd:
                exited = True
            elif not pump(fd):
                status = "output_limit"
                break
        if status is not None:
            break
        if exited:
            got, st, ru = os.wait4(pid, os.WNOHANG)
            if got == pid:
                raw, rusage = st, ru
                break
    if raw is None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, raw, rusage = os.wait4(pid, 0)
    if pidfd is not None:
        os.close(pidfd)
    _kill_leftovers(may_kill_all, pid)
    # Everything that could hold a pipe open is dead now: drain what is left.
    end = time.monotonic() + 1.0
    while status is None and live and time.monotonic() < end:
        for fd, _ in poll.poll(50):
            if fd in live and not pump(fd):
                status = "output_limit"
                break
    for fd in (out_r, err_r, val_r):
        os.close(fd)
    exit_code = os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else None
    sig = os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else None
    return status, exit_code, sig, rusage, bytes(bufs[out_r]), bytes(bufs[err_r]), bytes(bufs[val_r])


def _jsonable(x, depth=0):
    """The returned value as JSON data: tuples become lists (LiveCodeBench does the same), sets sorted lists."""
    if depth > 100:
        raise ValueError("returned value nested too deeply")
    if isinstance(x, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in x]
    if isinstance(x, (set, frozenset)):
        items = [_jsonable(v, depth + 1) for v in x]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(x, dict):
        return {(k if isinstance(k, str) else repr(k)): _jsonable(v, depth + 1) for k, v in x.items()}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return {"__unserializable__": type(x).__name__}


def _child(mode, code_obj, job, test_input) -> None:
    """Runs inside the test process; never returns."""
    import builtins
    import io

    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8", errors="surrogateescape"
    )
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", errors="surrogateescape"
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
        encoding="utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.argv = ["solution.py"]
    code = 0
    try:
        if mode == "check":
            run_check(code_obj, job)
            sys.stdout.flush()
            write_all(3, b"pass")
            os._exit(0)
        g = {
            "__name__": "__main__" if mode == "stdin" else "solution",
            "__builtins__": builtins,
            "__file__": "solution.py",
        }
        exec(code_obj, g)
        if mode == "call":
            name = job["fn_name"]
            sol = g.get("Solution")
            if isinstance(sol, type) and hasattr(sol, name):
                fn = getattr(sol(), name)  # LeetCode style (LiveCodeBench "functional")
            elif callable(g.get(name)):
                fn = g[name]
            else:
                raise NameError(f"the program defines no function {name!r} (nor a class Solution with that method)")
            value = fn(*test_input)
            import json

            payload = json.dumps(_jsonable(value), allow_nan=True).encode()
            sys.stdout.flush()
            write_all(3, payload)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code & 0xFF
        else:
            try:
                sys.stderr.write(f"{e.code}\n")
            except Exception:
                pass
            code = 1
    except BaseException:
        print_exception()
        code = 1
    try:
        sys.stdout.flush()
    except BaseException:
        code = code or 1
    try:
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(code)
