"""Task functions the pool tests run in worker processes (imported there by module name)."""

import os
import time


def echo(x):
    return x


def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


def fail(message):
    raise ValueError(message)


def die(code):
    os._exit(code)


def pid():
    return os.getpid()


def allocate(megabytes):
    return len(bytearray(megabytes * 2**20))


def rendezvous(directory, name, n, wait_s):
    """Mark arrival, then wait until `n` tasks have arrived: True only if they run at the same time."""
    open(os.path.join(directory, name), "w").close()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if len(os.listdir(directory)) >= n:
            return True
        time.sleep(0.01)
    return False
