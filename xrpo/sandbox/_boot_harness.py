"""The test harness inside the sandbox (part of the boot, `xrpo.sandbox._boot`): `harness` runs each test in a
process of its own under the resource limits, watches its pipes and its time, kills what it leaves behind, and reports
each test as one frame of the stream (`frame`; the format is in `xrpo.sandbox._boot`).

Timeouts are judged on what the test itself used, not on what else the machine runs (``cpu_time``): a test is out of
time when its processes together have used its CPU seconds, or when its wall-clock time less the time they spent
waiting for a CPU (the kernel's ``run_delay``, /proc/PID/task/TID/schedstat) passes its limit, the waiting credited
up to ``max_stretch`` times the limit, and never more than the time they did not have one CPU. Each test's processes
are one scheduling group (the test's session: the kernel's autogroup) that they cannot leave (under ``seccomp``,
setsid succeeds without leaving it), so a neighbour's many processes weigh as one.

Runs inside the sandbox's interpreter in one namespace with the boot's other parts (`xrpo.sandbox.programs.BOOT_PARTS`):
standard library only, nothing from xrpo.
"""

import os
import select
import signal
import time

if __name__ != "_boot":  # imported (tests, tools); the sandbox runs every part in one namespace instead
    from xrpo.sandbox._boot_isolation import PR_SET_DUMPABLE, Libc
    from xrpo.sandbox._boot_program import prepare_interpreter, run_program_process, write_all

_STDERR_TAIL = 2000
_MAX_PENDING_SIGNALS = 256


def frame(fd: int, kind: str, payload=b"", fields: tuple = ()) -> None:
    """One frame of the stream; `payload` may be a tuple of parts, written one after the other (a test's output is
    never copied into one buffer)."""
    parts = payload if isinstance(payload, tuple) else (payload,)
    head = " ".join([kind, str(sum(map(len, parts)))] + ["-" if f is None else str(f) for f in fields])
    write_all(fd, head.encode() + b"\n")
    for part in parts:
        write_all(fd, part)


def _set_limits(lim: dict, cpu: float | None, processes: int | None, memory_mb: int | None = None) -> None:
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
    setl(resource.RLIMIT_AS, (memory_mb or lim["memory_mb"]) * mb)
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


def _proc_stats() -> dict[int, list[bytes]]:
    """Every process visible in /proc: pid -> the fields of /proc/PID/stat after the command name (state first)."""
    out: dict[int, list[bytes]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        out[int(name)] = stat[stat.rfind(b")") + 2 :].split()
    return out


def _descendants(root: int, stats: dict | None = None, zombies: bool = False) -> list[int]:
    stats = _proc_stats() if stats is None else stats
    parent = {p: int(r[1]) for p, r in stats.items() if len(r) > 1 and (zombies or r[0] != b"Z")}
    out, frontier = [], {root}
    while frontier:
        nxt = {p for p, pp in parent.items() if pp in frontier and p != root}
        nxt -= set(out)
        out.extend(nxt)
        frontier = nxt
    return out


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _usage(root: int) -> tuple[float, float]:
    """(CPU seconds, seconds waited for a CPU) of the processes below `root`: the CPU time of every one, zombies and
    the children each reaped included, and the longest time one of their threads has waited on a run queue (0 where
    the kernel keeps no schedstat)."""
    stats = _proc_stats()
    ticks = waited = 0
    for pid in _descendants(root, stats, zombies=True):
        fields = stats[pid]
        try:  # utime, stime, cutime, cstime: fields 14-17 of /proc/PID/stat
            ticks += int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
        except (IndexError, ValueError):
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    waited = max(waited, int(f.read().split()[1]))
            except (OSError, IndexError, ValueError):
                pass
    return ticks / _CLOCK_TICKS, waited / 1e9


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def harness(job: dict, layers: list, pidns: bool, own_uid: bool, stdin_fd: int, session_lock=None) -> None:
    """Run every test and stream the frames; an error of the harness itself (a MemoryError under its own limit, a
    broken inputs file) reaches the caller as an ``E`` frame with its reason."""
    res_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    try:
        _harness(job, layers, pidns, own_uid, stdin_fd, session_lock, res_fd)
    except BaseException as e:  # noqa: BLE001 - reported, never lost
        try:
            frame(res_fd, "E", f"the harness failed: {type(e).__name__}: {e}"[:_STDERR_TAIL].encode("utf-8", "replace"))
        except BaseException:  # noqa: BLE001
            pass


def _harness(job, layers, pidns, own_uid, stdin_fd, session_lock, res_fd) -> None:
    if os.path.exists("/proc/self/stat"):
        layers.append("cpu_time")
    frame(res_fd, "H", ",".join(layers).encode())
    lim = job["limits"]
    # RLIMIT_NPROC counts every process of the real uid: exact under a dedicated uid; under the caller's own uid
    # it is offset by the caller's process count (taken just before the start; approximate).
    if own_uid:
        nproc = lim["max_processes"]
    elif job.get("nproc_base") is not None:
        nproc = job["nproc_base"] + lim["max_processes"]
    else:
        nproc = None
    # The harness stays within a memory limit of its own (compiling a hostile program cannot exhaust the machine):
    # the program's, plus what the harness holds beside it (one test's input and output; `harness_mb`). The program
    # gets its own `memory_mb` in every test, whatever the harness holds.
    _set_limits(lim, None, nproc, memory_mb=lim["memory_mb"] + job["harness_mb"])
    started = time.monotonic()
    deadline = started + lim["sample_timeout"]
    credit_left = (job["max_stretch"] - 1) * lim["sample_timeout"]
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
    del code
    if job["mode"] == "call":
        import json  # noqa: F401 - once here rather than in every forked test
    prepare_interpreter(job)
    may_kill_all = pidns or own_uid
    for i in range(len(job["spans"])):
        if time.monotonic() >= deadline:
            break
        max_credit = min(credit_left, (job["max_stretch"] - 1) * lim["timeout"])
        status, credit = _run_test(
            job, i, code_obj, deadline, max_credit, may_kill_all, nproc, stdin_fd, session_lock, res_fd
        )
        # time this test waited for a CPU (a loaded machine) is not the program's: the program's limit moves on by it
        deadline += credit
        credit_left -= credit
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


def _read_input(job: dict, i: int, in_fd: int):
    """Test `i`'s input from the inputs file (the harness holds one test's input at a time, never all of them):
    stdin mode copies it into the test's stdin file in 1 MiB pieces; call mode returns the arguments."""
    offset, size = job["spans"][i]
    # the test before may have written to or resized its stdin: start from an empty file
    os.ftruncate(in_fd, 0)
    os.lseek(in_fd, 0, os.SEEK_SET)
    if job["mode"] == "call":
        import marshal

        return marshal.loads(os.pread(job["inputs_fd"], size, offset))
    while size > 0:
        chunk = os.pread(job["inputs_fd"], min(size, 1 << 20), offset)
        if not chunk:
            raise OSError(f"the inputs file ended before test {i}'s input")
        write_all(in_fd, chunk)
        offset += len(chunk)
        size -= len(chunk)
    os.lseek(in_fd, 0, os.SEEK_SET)
    return None


def _run_test(job, i, code_obj, deadline, max_credit, may_kill_all, nproc, in_fd, session_lock, res_fd):
    """Run test `i` and write its frame; returns (status, seconds of waiting for a CPU credited to it)."""
    lim = job["limits"]
    mode = job["mode"]
    timeout = lim["timeout"]
    cpu = lim["cpu_seconds"] if lim["cpu_seconds"] is not None else timeout
    args = _read_input(job, i, in_fd)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    val_r, val_w = os.pipe()
    events_fd = job["events_fd"]
    oom_before = _oom_kills(events_fd)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the test process
        try:
            os.setsid()  # its own session: a process group killed as one, and one scheduling group (autogroup)
            keep = (in_fd, out_w, err_w, val_w) + ((job["check_fd"],) if mode == "check" else ())
            fds = [_high_dup(fd) for fd in keep]
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            os.closerange(len(fds), 1 << 16)
            if events_fd is not None:
                _oom_first()
            if session_lock is not None:
                session_lock()  # its processes stay in its session (many busy processes weigh as one)
            _set_limits(lim, cpu, nproc)
            run_program_process(mode, code_obj, job, args)
        finally:
            os._exit(70)
    del args
    for fd in (out_w, err_w, val_w):
        os.close(fd)
    status, raw, rusage, out, err, val, credit = _watch(
        pid, out_r, err_r, val_r, start, timeout, cpu, deadline, max_credit, lim["max_output_bytes"], may_kill_all
    )
    wall = time.monotonic() - start
    exit_code = os.WEXITSTATUS(raw) if os.WIFEXITED(raw) else None
    sig = os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else None
    cpu_used = (rusage.ru_utime + rusage.ru_stime) if rusage is not None else 0.0
    del err[:-_STDERR_TAIL]
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
    if mode == "stdin" or not val:
        val = None
    frame(
        res_fd,
        "T",
        (out, val or b"", err),
        (
            i,
            status,
            exit_code,
            sig,
            f"{wall:.4f}",
            f"{cpu_used:.4f}",
            len(out),
            None if val is None else len(val),
            len(err),
        ),
    )
    return status, credit


def _watch(pid, out_r, err_r, val_r, start, timeout, cpu_limit, deadline, max_credit, cap, may_kill_all):
    """Read the test's pipes until it exits, runs out of time (module docstring) or passes the output cap; kill what
    it left. Returns (status or None, wait status, rusage, stdout, stderr, value, seconds of waiting credited)."""
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

    me = os.getpid()
    ncpu = _cpus()
    credit = 0.0
    # Nothing is measured before the first check: a test that ends sooner costs no look at /proc. At each check, the
    # CPU time of all the test's processes, and the longest wait for a CPU of any of their threads, which moves the
    # wall-clock limit (a starved test is not out of time; a sleeping one is).
    check_at = start + min(timeout, cpu_limit / ncpu)
    status = raw = rusage = None
    while True:
        now = time.monotonic()
        if now >= check_at:
            used, waited = _usage(me)
            # never more than the time the test did not have one CPU: many busy processes of its own wait on each
            # other, not on the machine
            credit = max(0.0, min(waited, now - start - used, max_credit))
            end = min(start + timeout, deadline) + credit
            if used >= cpu_limit or now >= end:
                status = "timeout"
                break
            check_at = min(end, now + max(0.05, (cpu_limit - used) / ncpu))
        # Without a pidfd, poll the child's state every 5 ms.
        wait = check_at - now if pidfd is not None else min(check_at - now, 0.005)
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
    return status, raw, rusage, bufs[out_r], bufs[err_r], bufs[val_r], credit
