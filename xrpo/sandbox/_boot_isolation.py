"""The sandbox's isolation layers (part of the boot, `xrpo.sandbox._boot`): the raw Linux calls (`Libc`: mount,
prctl, the seccomp filter, the session keyring, capabilities) and the program's file system (`setup_mounts`: a fresh
root of read-only binds, or the host's tree read-only where the kernel refuses that).

Runs inside the sandbox's interpreter (``python -I -S -B``) in one namespace with the boot's other parts
(`xrpo.sandbox.programs.BOOT_PARTS`): standard library only, nothing from xrpo.
"""

import os

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
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
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2
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
    # host-wide kernel tables (docs/code.md, "Kernel tables shared by the whole host"): Linux AIO contexts count
    # against fs.aio-max-nr, one number for the whole machine; joining another namespace
    "io_setup": 0,
    "setns": 268,
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
    "io_setup": 206,
    "setns": 308,
}
# Syscalls refused by one of their arguments, by machine (generic = aarch64 and riscv64): (name, number, index of the
# argument, the bits of its low 32 bits that refuse it). New namespaces (unshare, clone: each is kernel memory,
# counted per user by user.max_*_namespaces and by no memory limit, and a user namespace's mounts would escape every
# size limit); huge pages from the host's reserved pool (mmap's MAP_HUGETLB: vm.nr_hugepages, shared by the machine).
_CLONE_NEW_ALL = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_CLONE_NEWTIME = 0x80  # unshare only: in clone() the low byte is the exit signal
_MAP_HUGETLB = 0x40000
_ARG_RULES = {
    "x86_64": (
        ("unshare", 272, 0, _CLONE_NEW_ALL | _CLONE_NEWTIME),
        ("clone", 56, 0, _CLONE_NEW_ALL),
        ("mmap", 9, 3, _MAP_HUGETLB),
    ),
    "generic": (
        ("unshare", 97, 0, _CLONE_NEW_ALL | _CLONE_NEWTIME),
        ("clone", 220, 0, _CLONE_NEW_ALL),
        ("mmap", 222, 3, _MAP_HUGETLB),
    ),
}
# clone3 passes its flags in memory a filter cannot read: it is refused with ENOSYS, on which glibc's threads and
# posix_spawn fall back to clone (EPERM would make every thread creation fail).
_ENOSYS_SYSCALLS = {"x86_64": {"clone3": 435}, "generic": {"clone3": 435}}
# the test's processes stay in its session: setsid returns 0 without leaving it (a filter each test process adds after
# its own setsid). The kernel's autogroup shares the CPU between sessions, so a test that put each of many busy
# processes in a session of its own would take that many shares of the machine from its neighbours.
_SETSID = {"x86_64": 112, "generic": 157}
# POSIX record locks (fcntl F_SETLK / F_SETLKW, their 64-bit twins, and the open-file-description F_OFD_SETLK /
# F_OFD_SETLKW): each disjoint locked byte range is a ~200-byte `struct file_lock` of kernel memory, and no limit counts
# them (Linux ignores RLIMIT_LOCKS, and since 6.8 no memory cgroup charges the file lock cache): 8 processes held
# 94 MB of it in 2 s. Refused by the command argument of fcntl (its low 32 bits: the kernel reads an unsigned int);
# flock(2) and leases stay (one lock per open file, bounded by the descriptors).
_FCNTL_LOCK_COMMANDS = (6, 7, 13, 14, 37, 38)
# machine -> (AUDIT_ARCH_* of its native ABI, first syscall number of a second ABI on the same arch, table, fcntl's
# number)
_SECCOMP_ARCHES = {
    "x86_64": (0xC000003E, 0x40000000, _X86_64_SYSCALLS, 72, "x86_64"),  # from 0x40000000 up: the x32 ABI
    "aarch64": (0xC00000B7, None, _GENERIC_SYSCALLS, 25, "generic"),
    "riscv64": (0xC00000F3, None, _GENERIC_SYSCALLS, 25, "generic"),
}
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_SECCOMP_RET_ALLOW, _SECCOMP_RET_EPERM, _SECCOMP_RET_ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
_SECCOMP_RET_SKIP = 0x00050000  # SECCOMP_RET_ERRNO with errno 0: the call is not made and returns 0


def _filter(arch: int, second_abi, deny, enosys, rules, skip=()) -> list:
    """Classic BPF over struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}: any other ABI is refused whole
    (i386's multiplexed ipc() and socketcall() would pass a list of native numbers); then one test per refused
    number (EPERM), per `enosys` number (ENOSYS), per `skip` number (not run, returns 0: success without effect),
    and per rule ``(name, nr, arg, refused)``: `refused` is a tuple of
    values of the argument's low 32 bits (the kernel reads fcntl's command as an unsigned int) or an int of bits
    (any of them set refuses). Arguments sit at offset 16 + 8 * index, low word first on these little-endian
    machines. Jumps are forward offsets; "A", "D", "N" and "S" stand for the final allow, deny, ENOSYS and skip."""
    ALLOW, DENY, NOSYS, SKIP = "A", "D", "N", "S"
    prog = [
        (_BPF_LD_W_ABS, 0, 0, 4),
        (_BPF_JEQ_K, 1, 0, arch),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_EPERM),
        (_BPF_LD_W_ABS, 0, 0, 0),
    ]
    if second_abi is not None:
        prog.append((_BPF_JGE_K, DENY, 0, second_abi))
    prog += [(_BPF_JEQ_K, DENY, 0, nr) for nr in deny]
    prog += [(_BPF_JEQ_K, NOSYS, 0, nr) for nr in enosys]
    prog += [(_BPF_JEQ_K, SKIP, 0, nr) for nr in skip]
    for _name, nr, arg, refused in rules:
        if isinstance(refused, tuple):
            tests = [(_BPF_JEQ_K, DENY, 0, v) for v in refused]
        else:
            tests = [(_BPF_JSET_K, DENY, 0, refused)]
        # not this syscall: skip the argument's load, its tests and the allow after them
        prog.append((_BPF_JEQ_K, 0, len(tests) + 2, nr))
        prog.append((_BPF_LD_W_ABS, 0, 0, 16 + 8 * arg))
        prog += tests
        prog.append((_BPF_JEQ_K, ALLOW, ALLOW, 0))  # this syscall, no refused value: allow
        # the next rule compares the syscall number again
        prog.append((_BPF_LD_W_ABS, 0, 0, 0))
    prog += [
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_EPERM),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_ENOSYS),
        (_BPF_RET_K, 0, 0, _SECCOMP_RET_SKIP),
    ]
    where = {ALLOW: len(prog) - 4, DENY: len(prog) - 3, NOSYS: len(prog) - 2, SKIP: len(prog) - 1}
    return [
        (code, where[jt] - i - 1 if jt in where else jt, where[jf] - i - 1 if jf in where else jf, k)
        for i, (code, jt, jf, k) in enumerate(prog)
    ]


class Libc:
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
        """Install the filter refusing `_SECCOMP_ARCHES[machine]`'s syscalls, fcntl's POSIX record locks
        (`_FCNTL_LOCK_COMMANDS`), `_ARG_RULES` and `_ENOSYS_SYSCALLS` on this process and all it starts; False where
        this machine has no table or the kernel no seccomp filters. Needs no_new_privs."""
        if machine not in _SECCOMP_ARCHES:
            return False
        arch, second_abi, table, fcntl_nr, family = _SECCOMP_ARCHES[machine]
        rules = _ARG_RULES[family] + (("fcntl", fcntl_nr, 1, _FCNTL_LOCK_COMMANDS),)
        prog = _filter(arch, second_abi, sorted(set(table.values())), _ENOSYS_SYSCALLS[family].values(), rules)
        return self._install(prog)

    def session_lock(self, machine: str):
        """A function that keeps the calling process and all it starts in its session (setsid returns 0 and does
        nothing), or None where this machine has no seccomp table. Built once (the harness: the filter's structures
        are made here), called in each test process."""
        if machine not in _SECCOMP_ARCHES:
            return None
        arch, _, _, _, family = _SECCOMP_ARCHES[machine]
        install = self._installer(_filter(arch, None, (), (), (), skip=[_SETSID[family]]))
        return install

    def _install(self, prog: list) -> bool:
        return self._installer(prog)()

    def _installer(self, prog: list):
        """A function that installs the classic BPF program `prog` as a seccomp filter (True) or returns False."""
        ct = self.ctypes

        class Insn(ct.Structure):
            _fields_ = [("code", ct.c_uint16), ("jt", ct.c_uint8), ("jf", ct.c_uint8), ("k", ct.c_uint32)]

        class Prog(ct.Structure):
            _fields_ = [("len", ct.c_uint16), ("filter", ct.POINTER(Insn))]

        insns = (Insn * len(prog))(*(Insn(*i) for i in prog))
        fprog = Prog(len(prog), insns)
        args = (_PR_SET_SECCOMP, ct.c_ulong(_SECCOMP_MODE_FILTER), ct.byref(fprog), ct.c_ulong(0), ct.c_ulong(0))

        def install() -> bool:
            try:
                self.call("prctl", *args)
            except OSError:
                return False
            return insns is not None  # (the structures live as long as this function)

        return install

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
# as on the host (udev, systemd): the standard streams and descriptors by name, links into the program's /proc
_DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)


def setup_mounts(libc: Libc, job: dict, uid: int | None) -> bool:
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


def _work_tmpfs(libc: Libc, job: dict, uid: int | None, target: str) -> None:
    # nr_inodes: each file, directory or link is ~0.8 KiB of unreclaimable kernel memory that `size` does not count
    # (60,000 empty files held 49 MB of slab in 0 blocks); since Linux 6.6 it also bounds the user xattrs of the
    # tmpfs (1 KiB of it per inode), which matters where seccomp does not refuse setxattr
    lim = job["limits"]
    opts = f"size={lim['max_disk_mb']}m,nr_inodes={lim['max_files']},mode=0700"
    if uid is not None:
        opts += f",uid={uid},gid={uid}"
    libc.mount("tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, opts)


def _remount_readonly(libc: Libc, under: str, skip: tuple, strict: bool) -> None:
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


def _setup_rootfs(libc: Libc, job: dict, uid: int | None) -> None:
    """A fresh root (a tmpfs over the caller's empty work dir) holding read-only binds of `_ROOT_DIRS`, the
    interpreter's directories (their site-packages hidden but for the allowed packages), `_ROOT_FILES`,
    `_ROOT_DEVICES` and `_DEV_LINKS`; the work dir at its own path; /proc. Then chroot into it: no other file of the
    machine exists for the program."""
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
    os.makedirs(new + "/dev", exist_ok=True)
    for name, target in _DEV_LINKS:
        os.symlink(target, new + "/dev/" + name)
    for d in job.get("hidden_dirs", ()):  # the interpreter's site-packages: installed data stays out of reach
        if os.path.isdir(new + d):  # (read-only with the rest, below)
            libc.mount("tmpfs", new + d, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0555,size=4k")
    for d in job.get("package_dirs", ()):  # ... but for the packages the caller allows, back at their own paths
        if os.path.isdir(d) and not os.path.exists(new + d):
            bind(d)
    os.makedirs(new + workdir, exist_ok=True)
    _work_tmpfs(libc, job, uid, new + workdir)
    os.makedirs(new + "/proc", exist_ok=True)
    libc.mount("proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _remount_readonly(libc, new, (new + workdir, new + "/proc"), strict=False)
    # chroot, not pivot_root: once the capabilities are gone (dedicated uid, or capset in a user namespace) it
    # cannot be left, and a chrooted process may not create a user namespace to regain them
    libc.call("chroot", new.encode())
    os.chdir(workdir)


def _setup_host_readonly(libc: Libc, job: dict, uid: int | None) -> None:
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
