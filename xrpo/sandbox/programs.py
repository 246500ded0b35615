"""Run untrusted Python programs against test inputs in a sandbox: one sandbox per program, one process per test.

How a run proceeds, what each isolation layer guarantees and needs, and what is not guaranteed: docs/code.md,
section "How a program runs, and each layer of the sandbox (`xrpo.sandbox`)".
"""

from __future__ import annotations

import functools
import itertools
import marshal
import os
import selectors
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from xrpo.sandbox.cleanup import remove_tree
from xrpo.sandbox.stream import Frames, SandboxResult, TestOutcome

__all__ = ["Limits", "SandboxResult", "TestOutcome", "probe", "run_program"]

MODES = ("stdin", "call", "check")
ISOLATION = ("auto", "strict", "minimal")
_HERE = os.path.dirname(os.path.abspath(__file__))
BOOT_PARTS = ("_boot_isolation.py", "_boot_check.py", "_boot_program.py", "_boot_harness.py", "_boot.py")
"""The boot's files, run in this order in one namespace inside the sandbox (`xrpo.sandbox._boot`)."""
PACKAGES = ("numpy",)
"""Third-party packages a program may import by default (`run_program`'s ``packages``), where installed."""
MAX_STRETCH = 3
"""Time a test or a program waited for a CPU (a loaded machine) extends its wall-clock limit, up to this many times
the limit (`xrpo.sandbox._boot_harness`); the caller's hard limit allows for it."""
# The boot's code travels compiled, ahead of the job in the job file: compiling its source in every run cost about
# ten milliseconds, a sixth of a small program's run. The loader needs nothing but builtins.
_BOOT_LOADER = (
    "import marshal, os, sys\np = sys.argv[1]\nwith open(p, 'rb') as f:\n    codes = marshal.load(f)\n"
    "    job = marshal.load(f)\nos.unlink(p)\n"
    "g = {'__name__': '_boot', '__file__': codes[-1].co_filename}\nfor code in codes:\n    exec(code, g)\n"
    "g['_boot'](job)\n"
)


@functools.lru_cache(maxsize=1)
def _boot_code() -> bytes:
    import importlib.machinery

    codes = []
    for name in BOOT_PARTS:
        path = os.path.join(_HERE, name)
        # read as the import system reads a module's source, so that a tool that serves another source for a path
        # (tests/mutants/run_mutants.py) reaches the boot too
        source = importlib.machinery.SourceFileLoader(f"xrpo.sandbox.{name[:-3]}", path).get_data(path)
        codes.append(compile(source, path, "exec"))
    return marshal.dumps(codes)


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed program.

    Attributes:
        timeout: wall-clock seconds per test.
        cpu_seconds: CPU seconds per test (RLIMIT_CPU); None: `timeout` rounded up.
        sample_timeout: wall-clock seconds for the whole program (all its tests); tests not started by then are
            "not_run". The caller kills everything a few seconds after this if the harness has not returned.
        memory_mb: address space per process (RLIMIT_AS); with the ``cgroup`` layer also the memory of the whole run
            (every process, shared and file memory, kernel buffers), plus 64 MiB for the harness.
        max_output_bytes: bytes read per test from stdout (and from stderr, and of a returned value); past it the
            test is killed with status "output_limit".
        max_processes: processes and threads the program may have at once (RLIMIT_NPROC; binds only under a
            dedicated uid, see the module docstring).
        max_file_mb: largest file the program may write (RLIMIT_FSIZE).
        max_disk_mb: size of the work directory's tmpfs (mount namespace only).
        max_files: files, directories and links the work directory's tmpfs may hold (its ``nr_inodes``; mount
            namespace only): each is kernel memory that `max_disk_mb` does not count.
        max_open_files: RLIMIT_NOFILE.
    """

    timeout: float = 4.0
    cpu_seconds: float | None = None
    sample_timeout: float = 30.0
    memory_mb: int = 1024
    max_output_bytes: int = 16 * 2**20
    max_processes: int = 16
    max_file_mb: int = 64
    max_disk_mb: int = 128
    max_files: int = 4096
    max_open_files: int = 256

    def __post_init__(self):
        for name in ("timeout", "sample_timeout"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{name}: expected a positive number of seconds, got {v!r}")
        if self.cpu_seconds is not None and (isinstance(self.cpu_seconds, bool) or not self.cpu_seconds > 0):
            raise ValueError(f"cpu_seconds: expected None or a positive number, got {self.cpu_seconds!r}")
        for name in (
            "memory_mb",
            "max_output_bytes",
            "max_processes",
            "max_file_mb",
            "max_disk_mb",
            "max_files",
            "max_open_files",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
        if self.max_open_files < 16:
            raise ValueError(
                f"max_open_files: expected at least 16 (the interpreter needs some), got {self.max_open_files}"
            )


# ---------------------------------------------------------------------------------------------------------------
# Caller side
# ---------------------------------------------------------------------------------------------------------------

_STARTUP_GRACE_S = 10.0  # the caller's hard limit is sample_timeout plus this (interpreter start, namespace set-up)
_UID_BASE = int(os.environ.get("XRPO_SANDBOX_UID_BASE", "2000000000"))
_UID_SLOTS = 4096


class _UidSlot:
    """A dedicated uid for one run, reserved by an flock so that concurrent runs (threads or processes) never share
    one: killing "every process of this uid" after a run then touches nothing else."""

    def __init__(self) -> None:
        import fcntl

        lock_dir = os.path.join(tempfile.gettempdir(), "xrpo-sandbox-uids")
        os.makedirs(lock_dir, mode=0o700, exist_ok=True)
        start = (os.getpid() * 131 + threading.get_ident()) % _UID_SLOTS
        for k in range(_UID_SLOTS):
            slot = (start + k) % _UID_SLOTS
            fd = os.open(os.path.join(lock_dir, f"{slot}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            self.fd, self.uid = fd, _UID_BASE + slot
            return
        raise RuntimeError(f"sandbox: all {_UID_SLOTS} dedicated uids are in use")

    def release(self) -> None:
        os.close(self.fd)


def _kill_uid(uid: int) -> None:
    """Kill every process of `uid` (a dedicated sandbox uid) from a helper that takes that uid: kill(-1) then
    reaches exactly that uid's processes."""
    import subprocess

    script = (
        f"import os\nos.setgroups([]); os.setresgid({uid},{uid},{uid}); os.setresuid({uid},{uid},{uid})\n"
        "for _ in range(100):\n    try: os.kill(-1, 9)\n    except ProcessLookupError: break\n"
    )
    try:
        subprocess.run(
            [sys.executable, "-I", "-S", "-c", script],
            timeout=30,
            env={},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        pass


@functools.lru_cache(maxsize=1)
def _python_dirs() -> tuple[str, ...]:
    """Directories the program's interpreter reads after the privilege drop (the standard library)."""
    import sysconfig

    dirs = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    for key in ("stdlib", "platstdlib"):
        try:
            dirs.add(os.path.realpath(sysconfig.get_path(key)))
        except (KeyError, TypeError):
            pass
    return tuple(sorted(dirs))


@functools.lru_cache(maxsize=1)
def _site_dirs() -> tuple[str, ...]:
    """Every site-packages of this interpreter (a virtual environment's and its base's): hidden in the program's
    root file system (``rootfs``), so that installed packages and their data (a benchmark's solutions) are out of
    reach; the program runs with ``-S`` and never imports from them."""
    import site
    import sysconfig

    dirs = set()
    for vars_ in (None, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
        paths = sysconfig.get_paths(vars=vars_) if vars_ else sysconfig.get_paths()
        dirs.update(paths[k] for k in ("purelib", "platlib") if k in paths)
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:
        pass
    return tuple(sorted({os.path.realpath(d) for d in dirs}))


def _count_processes(uid: int) -> int | None:
    """Processes (threads included, as RLIMIT_NPROC counts them) of `uid`; None without /proc."""
    total = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{name}")
            if st.st_uid == uid:
                total += max(1, len(os.listdir(f"/proc/{name}/task")))
        except OSError:
            continue
    return total


# cgroup v2: each run in a cgroup of its own. With the memory controller, memory.max counts what the address-space
# limit cannot (memfd and shared memory pages, files in its tmpfs, pipe and socket buffers, every process together);
# the harness and its interpreter get this much on top of `memory_mb`. With the cpu controller, cpu.max holds the run
# to one CPU, whatever number of processes it starts, and runs share the machine by equal weights.
_CGROUP_ENV = "XRPO_SANDBOX_CGROUP"
_CGROUP_HARNESS_MB = 64
_CGROUP_CONTROLLERS = ("memory", "cpu")
_CPU_PERIOD_US = 100_000
_cgroup_seq = itertools.count()


@functools.lru_cache(maxsize=1)
def _cgroup_parent() -> tuple[str, tuple[str, ...]] | None:
    """A cgroup v2 directory under which each run can get a child cgroup, and which of `_CGROUP_CONTROLLERS` its
    children get: the one named by $XRPO_SANDBOX_CGROUP (a cgroup delegated to this user), else the root of the
    cgroup v2 hierarchy when the caller itself sits in it (a VM or a privileged container whose processes all live
    in the root). None where neither controller is available: hybrid hosts whose controllers are cgroup v1, an
    unprivileged container, a systemd session."""
    path = os.environ.get(_CGROUP_ENV)
    try:
        if not path:
            with open("/proc/self/cgroup") as f:
                if "0::/\n" not in f.read().splitlines(keepends=True):
                    return None
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    head, _, tail = line.partition(" - ")
                    fields = head.split()
                    if tail.split()[:1] == ["cgroup2"] and fields[3] == "/":
                        path = fields[4]
                        break
            if not path:
                return None
        with open(os.path.join(path, "cgroup.controllers")) as f:
            available = [c for c in _CGROUP_CONTROLLERS if c in f.read().split()]
        with open(os.path.join(path, "cgroup.subtree_control")) as f:
            enabled = f.read().split()
        controllers = []
        for c in available:
            if c not in enabled:  # allowed only where no process lives in `path` itself (or it is the root)
                try:
                    with open(os.path.join(path, "cgroup.subtree_control"), "w") as f:
                        f.write("+" + c)
                except OSError:
                    continue
            controllers.append(c)
    except (OSError, IndexError):
        return None
    return (path, tuple(controllers)) if controllers else None


def _make_cgroup(limits: Limits) -> tuple[str, tuple[str, ...]] | None:
    """A fresh cgroup for one run with its memory and CPU limits set, and the controllers it has; None where cgroup
    v2 is not available here (the boot joins it, and lists ``cgroup`` / ``cpu_max`` among the layers only if that
    worked)."""
    parent = _cgroup_parent()
    if parent is None:
        return None
    parent_path, controllers = parent
    path = os.path.join(parent_path, f"xrpo-sandbox-{os.getpid()}-{next(_cgroup_seq)}")
    try:
        os.mkdir(path)
        if "memory" in controllers:
            with open(os.path.join(path, "memory.max"), "w") as f:
                f.write(str((limits.memory_mb + _CGROUP_HARNESS_MB) * 2**20))
            try:
                with open(os.path.join(path, "memory.swap.max"), "w") as f:
                    f.write("0")
            except OSError:  # no swap accounting on this kernel: nothing to turn off
                pass
        if "cpu" in controllers:
            with open(os.path.join(path, "cpu.max"), "w") as f:
                f.write(f"{_CPU_PERIOD_US} {_CPU_PERIOD_US}")  # one CPU's time per period
    except OSError:
        _remove_cgroup(path)
        return None
    return path, controllers


def _remove_cgroup(path: str) -> None:
    try:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:  # Linux >= 5.14: every process left in it
            f.write("1")
    except OSError:
        pass
    for _ in range(200):  # processes killed a moment ago may still be exiting
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.005)


def _write_inputs(path: str, mode: str, inputs: list) -> tuple[list[tuple[int, int]], int]:
    """Every test's input in one file, which the harness reads one test at a time: stdin text as UTF-8 (lone
    surrogates kept), call arguments marshalled. Returns the (offset, size) of each and the largest size."""
    spans, offset, largest = [], 0, 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "wb") as f:
        for i, x in enumerate(inputs):
            if mode == "stdin":
                data = x.encode("utf-8", "surrogatepass") if isinstance(x, str) else b""
            elif mode == "call":
                try:
                    data = marshal.dumps(x)
                except ValueError as e:  # an input that is not plain data
                    raise ValueError(
                        f"inputs[{i}]: expected JSON-like data (str, numbers, lists, dicts), got: {e}"
                    ) from None
            else:
                data = b""
            f.write(data)
            spans.append((offset, len(data)))
            offset += len(data)
            largest = max(largest, len(data))
    return spans, largest


@functools.lru_cache(maxsize=8)
def _package_dirs(names: tuple[str, ...]) -> dict[str, list[str]]:
    """name -> [the directory of the installed package `name`, and the libraries a wheel bundles beside it
    (``numpy.libs``)] for each of `names` this interpreter has; nothing is imported."""
    import importlib.util

    out = {}
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"packages: expected top-level package names, got {name!r}")
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        where = os.path.realpath(list(spec.submodule_search_locations)[0])
        out[name] = [where] + ([where + ".libs"] if os.path.isdir(where + ".libs") else [])
    return out


def _env(workdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def run_program(
    code: str,
    mode: str,
    inputs: list,
    *,
    fn_name: str | None = None,
    check_code: str | None = None,
    entry_point: str | None = None,
    check_prelude: str | None = None,
    limits: Limits | None = None,
    isolation: str = "auto",
    stop_on_failure: bool = False,
    on_test: Callable[[int, TestOutcome], TestOutcome] | None = None,
    packages: tuple[str, ...] = PACKAGES,
) -> SandboxResult:
    """Run `code` once per element of `inputs` in a sandbox (module docstring) and report what each run did.

    Args:
        code: Python source of the program.
        mode: "stdin" (inputs are strings fed to stdin; stdout is returned), "call" (inputs are lists of positional
            arguments for the function `fn_name`, or for the method `fn_name` of a class `Solution` when the program
            defines one; the returned value comes back as JSON), or "check" (HumanEval: `check_code` defines
            `check(candidate)`, called with a proxy of the program's `entry_point`; inputs must be `[None]`). The
            check runs in a process of its own that never shares memory with the program (module docstring);
            `check_prelude` (HumanEval's prompt: helpers such as ``poly`` that the check calls) runs there first.
        limits: resource limits (`Limits()` by default).
        isolation: "auto" (every layer this machine allows), "strict" (raise RuntimeError unless uid/user-namespace
            separation and the network, PID and mount namespaces are available), "minimal" (session, rlimits,
            walltime, output cap, env and work dir only).
        stop_on_failure: skip the tests after the first one that does not exit 0.
        on_test: called as ``on_test(i, outcome)`` in the caller's thread as soon as test `i` has finished, with
            everything it printed and returned; the result keeps the `TestOutcome` it returns instead. A caller that
            compares here and returns a slim outcome holds one test's output at a time (at most about twice
            ``max_output_bytes``); without it the result keeps every test's output.
        packages: third-party packages the program may import, each where this interpreter has it installed (a
            package it does not have is skipped): only these, not the rest of their site-packages.

    Never raises for anything the program does (an exception raised by `on_test` is passed on, after the run is
    killed and cleaned up); raises ValueError for bad arguments.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if isolation not in ISOLATION:
        raise ValueError(f"isolation: expected one of {ISOLATION}, got {isolation!r}")
    if not isinstance(code, str):
        raise ValueError(f"code: expected str, got {type(code).__name__}")
    if mode == "call" and not fn_name:
        raise ValueError("mode 'call' needs fn_name")
    if mode == "check" and (not check_code or not entry_point):
        raise ValueError("mode 'check' needs check_code and entry_point")
    if mode == "check" and list(inputs) != [None]:
        raise ValueError(f"mode 'check' runs one test: inputs must be [None], got {len(inputs)} input(s)")
    limits = limits or Limits()
    t0 = time.monotonic()
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    slot = _UidSlot() if root and isolation != "minimal" else None
    workdir = tempfile.mkdtemp(prefix="xrpo-sandbox-")
    proc = None
    killed = False
    frames = Frames(len(inputs), 2 * limits.max_output_bytes + 65536, on_test)
    err = b""
    cgroup = _make_cgroup(limits) if isolation != "minimal" else None
    try:
        if slot is not None:
            os.chown(workdir, slot.uid, slot.uid)
        inputs_path = os.path.join(workdir, ".inputs")
        spans, largest = _write_inputs(inputs_path, mode, inputs)
        allowed = _package_dirs(tuple(packages))
        job = {
            "code": code,
            "mode": mode,
            "inputs_path": inputs_path,
            "spans": spans,
            # what the harness holds beside the program: one test's input (its arguments as objects in call mode)
            # and output (stdout and a returned value, up to the cap each), and its interpreter
            "harness_mb": 64 + -(-((8 if mode == "call" else 1) * largest + 2 * limits.max_output_bytes) // 2**20),
            "max_stretch": MAX_STRETCH,
            "packages": {name: os.path.dirname(dirs[0]) for name, dirs in allowed.items()},
            "package_dirs": [d for dirs in allowed.values() for d in dirs],
            "fn_name": fn_name,
            "check_path": None,
            "entry_point": entry_point,
            "check_prelude": check_prelude,
            "hidden_dirs": list(_site_dirs()),
            "limits": asdict(limits),
            "stop_on_failure": bool(stop_on_failure),
            "uid": slot.uid if slot else None,
            "namespaces": isolation != "minimal",
            "strict": isolation == "strict",
            "workdir": workdir,
            "python_dirs": list(_python_dirs()),
            "caller_uid": os.getuid(),
            "caller_gid": os.getgid(),
            "nproc_base": None if root else _count_processes(os.getuid()),
            "cgroup": cgroup[0] if cgroup else None,
            "cgroup_controllers": cgroup[1] if cgroup else (),
        }
        if mode == "check":
            job["check_path"] = os.path.join(workdir, ".check")
            fd = os.open(job["check_path"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with open(fd, "w", encoding="utf-8") as f:
                f.write(check_code)
        job_path = os.path.join(workdir, ".job")
        fd = os.open(job_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as f:
            f.write(_boot_code())
            marshal.dump(job, f)
        import subprocess

        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", _BOOT_LOADER, job_path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_env(workdir),
            start_new_session=True,
            close_fds=True,
        )
        err, killed = _collect(proc, t0 + MAX_STRETCH * limits.sample_timeout + _STARTUP_GRACE_S, frames)
    finally:
        if proc is not None:
            _kill_group(proc)
        if cgroup is not None:
            _remove_cgroup(cgroup[0])
        if slot is not None and "pidns" not in (frames.layers or ()):
            # Without a PID namespace, processes of the slot uid may remain (ones that called setsid); with one,
            # they died with the harness, the namespace's init.
            _kill_uid(slot.uid)
        remove_tree(workdir)  # never raises: a tree the program made may be deep, unreadable or immutable
        if slot is not None:
            slot.release()
    wall = time.monotonic() - t0
    layers, tests = frames.layers or (), frames.tests
    closing = None if frames.broken else frames.closing
    boot_err = err.decode("utf-8", "replace").strip()[-2000:]
    if killed and not frames.broken:
        return SandboxResult("timeout", tests, "the run passed its hard wall-clock limit and was killed", layers, wall)
    if closing is None:  # no closing frame: the harness died or its stream is corrupt
        detail = boot_err or f"the harness stopped without finishing (exit code {proc.returncode})"
        return SandboxResult("sandbox_error", tests, detail, layers, wall)
    if closing.startswith("C:"):
        return SandboxResult("compile_error", tests, closing[2:], layers, wall)
    if closing.startswith("E:"):
        return SandboxResult("sandbox_error", tests, closing[2:], layers, wall)
    return SandboxResult("ok", tests, "", layers, wall)


def _collect(proc, deadline: float, frames: Frames) -> tuple[bytes, bool]:
    """Feed the boot's stdout to `frames` until EOF, the end of the stream or `deadline`; keep the tail of its
    stderr. Returns (stderr tail, killed: the deadline passed or the stream broke)."""
    err = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "out")
    sel.register(proc.stderr, selectors.EVENT_READ, "err")
    open_streams = 2
    killed = False
    try:
        while open_streams:
            left = deadline - time.monotonic()
            if left <= 0:
                killed = True
                break
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                elif key.data == "out":
                    # After the closing frame, read on to EOF: the boot exits once it has reaped the harness
                    # (killing it now would leave the harness a zombie for the host's init to reap). A broken stream
                    # means a broken harness (it caps every test): stop.
                    if not frames.done and not frames.feed(chunk) and frames.broken:
                        killed = True
                        open_streams = 0
                        break
                else:
                    err += chunk
                    del err[:-8192]
    finally:
        sel.close()
    return bytes(err), killed


def _kill_group(proc) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except Exception:
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


_PROBE_CACHE: dict[str, tuple[str, ...]] = {}


def probe(isolation: str = "auto") -> tuple[str, ...]:
    """The isolation layers a run gets on this machine (runs one trivial program once; cached)."""
    if isolation not in _PROBE_CACHE:
        res = run_program("print(1)", "stdin", [""], isolation=isolation, limits=Limits(timeout=10, sample_timeout=20))
        if res.status != "ok" or res.tests[0].status != "ok":
            raise RuntimeError(f"sandbox probe failed: {res.status} {res.error} {res.tests[0]}")
        _PROBE_CACHE[isolation] = res.isolation
    return _PROBE_CACHE[isolation]
