"""The inside of the sandbox (`xrpo.sandbox.programs`): the boot, which isolates the process and starts the harness.

The boot is five files, run in one namespace in this order (`xrpo.sandbox.programs.BOOT_PARTS`):
`_boot_isolation.py` (the isolation layers), `_boot_check.py` (check mode), `_boot_program.py` (the program's
process: its interpreter as ``python3 solution.py`` gives it, and its end), `_boot_harness.py` (the test harness)
and this one (the entry point `_boot`). Started by `xrpo.sandbox.programs.run_program` as
``python -I -S -B -c LOADER JOB``: JOB is a file the caller wrote (and LOADER deletes) holding the parts' code
objects, compiled once per caller process, then the job, both marshalled; LOADER runs the parts and calls
`_boot(job)`. (Run as a script, ``_boot.py JOB`` takes a file holding only the job, and needs xrpo importable.) The
parts import only what they need from the standard library (not json, re or selectors, which would double the
start-up time), and nothing from xrpo: their imports of each other run only outside the sandbox (tests, tools).

Stream to the caller (stdout), one frame per event: an ASCII header line ``KIND N FIELDS...`` then N payload bytes.
    ``H N``                 hello; payload: the isolation layers in force, comma-separated
    ``T N i status exit sig wall cpu n_out n_val n_err``   one test; payload: stdout + value + stderr tail
                            (``-`` for a missing exit code, signal or value)
    ``C N``                 compile error; payload: the message
    ``E N``                 the harness could not set up, or failed (after any number of ``T``); payload: why
    ``D 0``                 done
"""

import marshal
import os
import signal
import sys

if __name__ != "_boot":  # imported (tests, tools); the sandbox runs every part in one namespace instead
    from xrpo.sandbox._boot_harness import frame, harness
    from xrpo.sandbox._boot_isolation import (
        CLONE_NEWIPC,
        CLONE_NEWNET,
        CLONE_NEWNS,
        CLONE_NEWPID,
        CLONE_NEWUSER,
        CLONE_NEWUTS,
        PR_SET_CHILD_SUBREAPER,
        PR_SET_DUMPABLE,
        PR_SET_NO_NEW_PRIVS,
        PR_SET_PDEATHSIG,
        Libc,
        setup_mounts,
    )


def _main(job_path: str) -> None:
    """Run as a script on a job file that holds only the job (the caller's file starts with the parts' code)."""
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
    # every test's input, in one file the harness reads one test at a time (`spans`): it never holds them all
    job["inputs_fd"] = os.open(job["inputs_path"], os.O_RDONLY)
    os.unlink(job["inputs_path"])
    layers = ["session", "rlimits", "walltime", "output_cap", "env", "workdir"]
    job["events_fd"] = None
    if job.get("cgroup"):
        # the run's own cgroup (the caller made it and set its memory.max and cpu.max): joined here, while /sys is
        # still visible, so that the harness and every test inherit it; memory.events stays open to tell OOM kills
        try:
            with open(os.path.join(job["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            if "memory" in job["cgroup_controllers"]:
                job["events_fd"] = os.open(os.path.join(job["cgroup"], "memory.events"), os.O_RDONLY)
                layers.append("cgroup")
            if "cpu" in job["cgroup_controllers"]:
                layers.append("cpu_max")
        except OSError:
            pass
    uid = job["uid"]
    libc = None
    ns = 0
    userns = False
    if job["namespaces"] and sys.platform.startswith("linux"):
        libc = Libc()
        base = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
        attempts = [base] if os.geteuid() == 0 else [base | CLONE_NEWUSER]
        for flags in attempts:
            try:
                libc.call("unshare", flags)
                ns = flags
                break
            except OSError:
                continue
        if ns & CLONE_NEWUSER:
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
                frame(1, "E", f"harness set-up failed: {type(e).__name__}: {e}".encode())
            except OSError:
                pass
        finally:
            os._exit(0)
    if libc is not None:
        try:  # the boot dies with its caller (a SIGKILLed trainer leaves no sandbox behind)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass
    os.close(1)
    _, status = os.waitpid(pid, 0)
    sys.exit(0)


def _init(job: dict, libc, ns: int, userns: bool, layers: list) -> None:
    """The harness process (PID 1 of the new PID namespace when there is one): finish isolation, run the tests."""
    uid = job["uid"]
    if ns:
        rootfs = setup_mounts(libc, job, uid if not userns else None)
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
        libc = Libc()
    pidns = bool(ns & CLONE_NEWPID)
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
        for option, arg in ((PR_SET_NO_NEW_PRIVS, 1), (PR_SET_PDEATHSIG, signal.SIGKILL), (PR_SET_DUMPABLE, 0)):
            try:
                libc.prctl(option, arg)
            except OSError:
                no_new_privs = no_new_privs and option != PR_SET_NO_NEW_PRIVS
        if not pidns:
            try:  # orphans of the tests reparent to the harness, which can then find and kill them
                libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
            except OSError:
                pass
        # on the harness itself, so that every test and everything it starts inherits it and cannot remove it
        if no_new_privs and libc.seccomp_deny(machine):
            layers.append("seccomp")
    if job["strict"] and "seccomp" not in layers:
        raise RuntimeError(f"isolation='strict': no seccomp filter on this machine ({os.uname().machine})")
    session_lock = libc.session_lock(os.uname().machine) if "seccomp" in layers else None
    harness(job, layers, pidns, uid is not None, stdin_fd, session_lock)


if __name__ == "__main__":
    _main(sys.argv[1])
