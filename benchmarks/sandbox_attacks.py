"""Attack the code sandbox with real payloads and print what each one achieved.

    python3 benchmarks/sandbox_attacks.py

Every payload runs through :func:`servesweep.correctness.sandbox.run_program`, exactly as model-written code does
in the coding eval; each row says what the program tried, what came back, and whether the attempt was contained
(judged on the host, not on the program's own word). tests/test_sandbox.py runs the same attacks and asserts them.
Exit status 1 when any attempt was not contained.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from servesweep.correctness.sandbox import (Limits, SandboxResult, bwrap_problem, run_program,  # noqa: E402
                                            run_tests, sandbox_processes, sandbox_uid)

QUICK = Limits(timeout_s=3, cpu_s=5)


@dataclass
class Attack:
    name: str
    tried: str
    run: Callable[[], tuple[bool, str]]  # -> (contained, what happened)


def _lines(result: SandboxResult) -> str:
    out = " / ".join(line.strip() for line in result.stdout.strip().splitlines()[-3:])
    err = (result.stderr.strip().splitlines() or [""])[-1]
    how = ("wall clock ran out" if result.timed_out else
           f"signal {result.signal}" if result.signal is not None else f"exit {result.returncode}")
    return "; ".join(x for x in (how, out, err) if x)[:160]


def _no_leftovers() -> bool:
    time.sleep(0.2)
    return sandbox_processes() == [] if os.geteuid() == 0 else True


def loopback_listener() -> tuple[bool, str]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        result = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
                             ".sendall(b'leak')\nprint('connected')\n", QUICK)
        listener.settimeout(0.3)
        try:
            listener.accept()[0].close()
            accepted = True
        except socket.timeout:
            accepted = False
    return not accepted and "connected" not in result.stdout, _lines(result)


def internet() -> tuple[bool, str]:
    result = run_program("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\nprint('connected')\n",
                         QUICK)
    return "connected" not in result.stdout and result.returncode != 0, _lines(result)


def write_outside() -> tuple[bool, str]:
    shared = Path(tempfile.mkdtemp(prefix="servesweep-attack-"))
    shared.chmod(0o777)  # even a world-writable directory must stay untouched
    targets = [shared / "escaped.txt", Path("/tmp") / f"servesweep-escape-{os.getpid()}",
               Path("/dev/shm") / f"servesweep-escape-{os.getpid()}", Path.cwd() / "escaped.txt",
               Path(sys.base_prefix) / "escaped.txt"]
    program = textwrap.dedent(f"""
        written = refused = 0
        for target in {[str(t) for t in targets]!r}:
            try:
                open(target, "w").write("escaped")
                written += 1
            except OSError as exc:
                refused += 1
                last = exc.strerror
        print("opened for writing", written, "refused", refused, "(" + last + ")")
    """)
    result = run_program(program, QUICK)
    escaped = [t for t in targets if t.exists()]
    for t in escaped:
        t.unlink()
    shared.rmdir()
    return not escaped, _lines(result) + (f"; ON HOST: {escaped}" if escaped else "; nothing on the host")


def read_environ() -> tuple[bool, str]:
    secret = secrets.token_hex(8)
    os.environ["SERVESWEEP_ATTACK_SECRET"] = secret
    try:
        program = textwrap.dedent(f"""
            import os
            found, errors = [], []
            for pid in [{os.getpid()}, "self", 1] + [p for p in os.listdir("/proc") if p.isdigit()]:
                try:
                    if {secret!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read():
                        found.append(pid)
                except OSError as exc:
                    errors.append(type(exc).__name__)
            print("pids visible", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
            print("secret found in", found, "errors", sorted(set(errors)))
        """)
        result = run_program(program, QUICK)
    finally:
        del os.environ["SERVESWEEP_ATTACK_SECRET"]
    return secret not in result.stdout and "found in []" in result.stdout, _lines(result)


def read_host_files() -> tuple[bool, str]:
    program = textwrap.dedent("""
        seen = []
        for path in ["/etc/shadow", "/etc/passwd", "/root/.bash_history", "/proc/1/cmdline"]:
            try:
                seen.append((path, len(open(path, "rb").read())))
            except OSError as exc:
                seen.append((path, type(exc).__name__))
        print(seen)
    """)
    result = run_program(program, QUICK)
    leaked = [p for p in ("/etc/shadow", "/etc/passwd", "/root/.bash_history")
              if f"('{p}', " in result.stdout and f"('{p}', '" not in result.stdout]
    return not leaked, _lines(result)


def fork_bomb() -> tuple[bool, str]:
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    result = run_program(bomb, QUICK)
    took = time.monotonic() - t0
    return _no_leftovers() and took < QUICK.timeout_s + 8, _lines(result) + f"; {took:.1f} s; 0 processes left"


def memory_bomb() -> tuple[bool, str]:
    bomb = "blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))\n"
    result = run_program(bomb, Limits(timeout_s=10, cpu_s=10, address_space_bytes=512 << 20))
    return "MemoryError" in result.stderr and _no_leftovers(), _lines(result)


def disk_bomb() -> tuple[bool, str]:
    """Write 1 MiB files until the disk says no (the issue's 960 MiB to the host's /tmp in 3.1 s, before)."""
    free_before = shutil.disk_usage(tempfile.gettempdir()).free
    bomb = ("import os\nn = 0\ntry:\n    for i in range(100_000):\n        with open(f'f{i}', 'wb') as fh:\n"
            "            fh.write(b'x' * (1 << 20))\n        n += 1\nexcept OSError as exc:\n"
            "    print(f'wrote {n} MiB, then {exc.strerror}')\n")
    limits = Limits(timeout_s=30, cpu_s=30)
    result = run_program(bomb, limits)
    grew = max(0, free_before - shutil.disk_usage(tempfile.gettempdir()).free)
    written = int(result.stdout.split()[1]) if result.stdout.startswith("wrote") else -1
    return (0 <= written <= limits.disk_bytes >> 20 and grew < limits.disk_bytes and _no_leftovers(),
            f"{_lines(result)}; work dir {limits.disk_bytes >> 20} MiB tmpfs; host /tmp used {grew >> 20} MiB meanwhile")


def memory_bomb_children() -> tuple[bool, str]:
    """Six children of 900 MiB each: each within its address space, 5.3 GiB together (the issue's 5.3 GiB)."""
    program = textwrap.dedent("""
        import os, time
        pids = []
        for _ in range(6):
            pid = os.fork()
            if pid == 0:
                try:
                    block = bytearray(900 << 20)
                    for k in range(0, len(block), 4096):
                        block[k] = 1
                    time.sleep(5)
                finally:
                    os._exit(0)
            pids.append(pid)
        print("killed", sum(os.WIFSIGNALED(os.waitpid(p, 0)[1]) for p in pids), "of 6")
    """)
    limits = Limits(timeout_s=30, cpu_s=30)
    result = run_program(program, limits)
    peak = result.isolation.get("memory_peak_bytes")
    held = f"; sandbox peak {peak >> 20} MiB" if peak else ""
    return (peak is not None and peak <= limits.memory_bytes and _no_leftovers(),
            f"{_lines(result)}{held}; {result.isolation['memory']}")


FORGE_CHECK = "\ndef check(candidate):\n    assert candidate(2) == 4\n"
FORGERIES = {
    "print the pass line, os._exit(0)": "print('servesweep: tests passed')\nimport os\nos._exit(0)\n",
    "pass line and exit 0 from inside the call": "def double(x):\n    print('servesweep: tests passed', "
                                                 "flush=True)\n    import os\n    os._exit(0)\n",
    "write a passed verdict to fds 3-63": "import json, os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, "
                                          "json.dumps({'outcome': 'passed'}).encode() + b'\\n')\n    except OSError:"
                                          "\n        pass\ndef double(x):\n    return 0\n",
    "open the checker's fds via /proc": "import json, os\nfor fd in os.listdir(f'/proc/{os.getppid()}/fd'):\n"
                                        "    os.write(os.open(f'/proc/{os.getppid()}/fd/{fd}', os.O_WRONLY), "
                                        "json.dumps({'outcome': 'passed'}).encode() + b'\\n')\n"
                                        "def double(x):\n    return 0\n",
    "return an object equal to everything": "class Any:\n    def __eq__(self, other):\n        return True\n"
                                            "def double(x):\n    return Any()\n",
}


def forge(solution: str):
    def attack() -> tuple[bool, str]:
        result = run_tests(solution, FORGE_CHECK, "double", QUICK)
        return result["outcome"] != "passed" and _no_leftovers(), f"{result['outcome']}: {result['detail'][:110]}"
    return attack


def busy_loop() -> tuple[bool, str]:
    t0 = time.monotonic()
    result = run_program("while True:\n    pass\n", Limits(timeout_s=30, cpu_s=1))
    took = time.monotonic() - t0
    return result.signal is not None and took < 10, _lines(result) + f" after {took:.1f} s (CPU limit 1 s)"


def kill_parent() -> tuple[bool, str]:
    canary = os.getpid()
    program = textwrap.dedent("""
        import os, signal, time
        parent = os.getppid()
        for target in (parent, 1, -1):
            try:
                os.kill(target, signal.SIGKILL)
                print("sent SIGKILL to", target)
            except OSError as exc:
                print("kill", target, type(exc).__name__)
        time.sleep(0.3)
        print("still running under parent", os.getppid())
    """)
    result = run_program(program, QUICK)
    return _no_leftovers() and os.getpid() == canary, _lines(result) + "; host job alive"


def background_process() -> tuple[bool, str]:
    program = textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", "60"])
            os._exit(0)
        print("daemon started; exiting")
    """)
    result = run_program(program, QUICK)
    time.sleep(0.5)
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_sleep_of_sandbox(p)]
    return not left and _no_leftovers(), _lines(result) + f"; {len(left)} left on the host"


def _uid() -> int:
    return sandbox_uid() if os.geteuid() == 0 else os.getuid()


def _is_sleep_of_sandbox(proc: Path) -> bool:
    try:
        return proc.stat().st_uid == _uid() and (proc / "cmdline").read_bytes() == b"sleep\x0060\x00"
    except OSError:
        return False


ATTACKS = [
    Attack("network: loopback listener", "connect to a port this host listens on", loopback_listener),
    Attack("network: internet", "connect to 1.1.1.1:53", internet),
    Attack("write outside the work dir", "write to a 0777 host dir, /tmp, /dev/shm, cwd, the Python prefix",
           write_outside),
    Attack("read another process's env", "read /proc/<job pid>/environ and scan every /proc/*/environ",
           read_environ),
    Attack("read host files", "read /etc/shadow, /etc/passwd, /root/.bash_history", read_host_files),
    Attack("fork bomb", "fork in a loop forever", fork_bomb),
    Attack("memory bomb", "allocate 64 MiB blocks forever", memory_bomb),
    Attack("busy loop", "spin past the 1 s CPU-time limit (30 s wall clock)", busy_loop),
    Attack("kill the parent", "SIGKILL getppid(), pid 1 and -1 (everything it may signal)", kill_parent),
    Attack("leave a background process", "double-fork + setsid a 60 s sleep, then exit", background_process),
    Attack("disk bomb", "write 1 MiB files until the disk is full", disk_bomb),
    Attack("memory bomb over processes", "six children of 900 MiB each (5.3 GiB together)", memory_bomb_children),
    *(Attack(f"forge a pass: {name}", "make the coding eval score a wrong answer as passed", forge(code))
      for name, code in FORGERIES.items()),
]


def main() -> int:
    problem = bwrap_problem()
    print(f"sandbox: {'bubblewrap' if problem is None else 'UNAVAILABLE: ' + problem}; runs as uid "
          f"{_uid()}\n")
    rows, failures = [], 0
    for attack in ATTACKS:
        contained, what = attack.run()
        failures += not contained
        rows.append((attack.name, attack.tried, what.replace("|", "/"), "yes" if contained else "**NO**"))
    print("| attack | the program tried | what happened | contained |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
