"""Process machinery beneath the verifiers: untrusted programs in a sandbox, trusted work under a time limit.

- `run_program(code, mode, inputs, ...)` (`xrpo.sandbox.programs`): runs an untrusted Python program once per test
  input in a sandbox of its own and reports what each run printed or returned; the module docstring lists every
  isolation layer, when it holds, and what is not guaranteed. The inside of the sandbox is the boot, five files run
  in one namespace in a fresh interpreter, standard library only: `_boot_isolation.py` (isolation set-up),
  `_boot_check.py` (check mode), `_boot_program.py` (the program's process, as `python3 solution.py` would run it),
  `_boot_harness.py` (the test harness) and `_boot.py` (the entry point).
- `WorkerPool` / `shared_pool` (`xrpo.sandbox.pool`): trusted "module:function" tasks in worker processes, each under
  a wall-clock limit (an overrunning worker is killed and replaced); the workers are forked from a warmed-up template
  process (`xrpo.sandbox._pool_worker`).

The `code` verifier (`xrpo.rewards.code`) runs programs here; the `math` verifier (`xrpo.rewards.math`) grades in a
shared pool. This package imports nothing of xrpo.
"""

from xrpo.sandbox.pool import WorkerPool, default_workers, shared_pool, shutdown_pools
from xrpo.sandbox.programs import ISOLATION, MODES, PACKAGES, Limits, probe, run_program
from xrpo.sandbox.stream import SandboxResult, TestOutcome

__all__ = [
    "ISOLATION",
    "MODES",
    "PACKAGES",
    "Limits",
    "SandboxResult",
    "TestOutcome",
    "WorkerPool",
    "default_workers",
    "probe",
    "run_program",
    "shared_pool",
    "shutdown_pools",
]
