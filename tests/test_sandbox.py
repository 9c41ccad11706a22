"""The bubblewrap sandbox contains what model-written code can do wrong, and reports it: run for real, as in the
pipeline (these tests need bwrap; setup.sh installs it)."""
import os
import socket
import textwrap
from pathlib import Path

import pytest

from benchmarks.sandbox_attacks import ATTACKS
from servesweep.correctness import sandbox
from servesweep.correctness.sandbox import Limits, run_program, run_tests, sandbox_processes, sandbox_uid

pytestmark = pytest.mark.shares_host

QUICK = Limits(timeout_s=2, cpu_s=5)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="uid switch, read-only mounts and RLIMIT_NPROC need root")
CHECK = "\n\ndef check(candidate):\n    assert candidate(2) == 4\n"


def test_passing_and_failing_tests_are_told_apart():
    assert run_tests("def double(x):\n    return 2 * x\n", CHECK, "double", QUICK)["outcome"] == "passed"
    failed = run_tests("def double(x):\n    return x + 1\n", CHECK, "double", QUICK)
    assert failed["outcome"] == "failed" and "AssertionError" in failed["detail"]
    error = run_tests("def double(x):\n    return y\n", CHECK, "double", QUICK)
    assert error["outcome"] == "error" and "NameError" in error["detail"]


def test_exiting_early_does_not_pass():
    result = run_tests("import sys\nsys.exit(0)\ndef double(x):\n    return 2 * x\n", CHECK, "double", QUICK)
    assert result["outcome"] == "error"
    result = run_tests("import os\nos._exit(0)\n", CHECK, "double", QUICK)
    assert result["outcome"] == "error"


FORGERIES = {
    "pass line and exit 0": "print('servesweep: tests passed')\nimport os\nos._exit(0)\n",
    "pass line from inside the call": "def double(x):\n    print('servesweep: tests passed', flush=True)\n"
                                      "    import os\n    os._exit(0)\n",
    "sys.exit(0) from inside the call": "def double(x):\n    raise SystemExit(0)\n",
    "write a verdict to every fd": "import json, os\nfor fd in range(3, 64):\n    try:\n"
                                   "        os.write(fd, json.dumps({'outcome': 'passed'}).encode() + b'\\n')\n"
                                   "    except OSError:\n        pass\ndef double(x):\n    return 0\n",
    "write a verdict to the checker's fds": "import json, os\nfor fd in os.listdir(f'/proc/{os.getppid()}/fd'):\n"
                                            "    os.write(os.open(f'/proc/{os.getppid()}/fd/{fd}', os.O_WRONLY), "
                                            "json.dumps({'outcome': 'passed'}).encode() + b'\\n')\n"
                                            "def double(x):\n    return 0\n",
    "an object equal to everything": "class Any:\n    def __eq__(self, other):\n        return True\n"
                                     "def double(x):\n    return Any()\n",
    "kill the checker": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef double(x):\n    return 0\n",
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_a_solution_cannot_forge_a_pass(name):
    result = run_tests(FORGERIES[name], CHECK, "double", QUICK)
    assert result["outcome"] != "passed", (name, result)


def test_checks_run_outside_the_solutions_process():
    """Helpers of the prompt (HumanEval/38's encode_cyclic) are called in the solution's process; plain values of
    every kind come back as they were."""
    solution = ("def enc(s):\n    return s[::-1]\n"
                "def f(x):\n    return (x, [1.5, -2], {'a': {1, 2}}, None, float('nan'), b'x', set())\n")
    tests = ("import math\ndef check(candidate):\n    t = candidate(x=3)\n    assert t[:4] == (3, [1.5, -2], "
             "{'a': {1, 2}}, None) and math.isnan(t[4]) and t[5:] == (b'x', set())\n    assert enc('ab') == 'ba'\n")
    assert run_tests(solution, tests, "f", QUICK)["outcome"] == "passed"


def test_infinite_loop_is_killed_at_the_wall_clock():
    result = run_tests("def double(x):\n    while True:\n        pass\n", CHECK, "double", QUICK)
    assert result["outcome"] == "timeout" and result["duration_s"] < 8


def test_sleeping_program_is_killed_although_it_uses_no_cpu():
    result = run_tests("import time\ntime.sleep(60)\n", CHECK, "double", QUICK)
    assert result["outcome"] == "timeout" and result["duration_s"] < 8


def test_cpu_limit_stops_a_busy_program_before_a_long_wall_clock():
    result = run_tests("while True:\n    pass\n", CHECK, "double", Limits(timeout_s=60, cpu_s=1))
    assert result["outcome"] == "timeout" and result["detail"].startswith("CPU-time limit")


@as_root
def test_disk_bomb_fills_only_the_sized_work_dir():
    bomb = ("import os\nn = 0\ntry:\n    for i in range(10_000):\n        with open(f'f{i}', 'wb') as fh:\n"
            "            fh.write(b'x' * (1 << 20))\n        n += 1\nexcept OSError as exc:\n"
            "    print(n, exc.errno)\n")
    result = run_program(bomb, Limits(timeout_s=20, cpu_s=20, disk_bytes=32 << 20))
    written, errno_ = result.stdout.split()
    assert int(written) <= 32 and int(errno_) == 28  # ENOSPC at the tmpfs size; nothing reached the host's disk


@as_root
def test_memory_of_all_processes_together_is_bounded():
    """Six children of 192 MiB each under a 512 MiB sandbox: RLIMIT_AS alone allows each; the cgroup does not."""
    program = textwrap.dedent("""
        import os, time
        pids = []
        for _ in range(6):
            pid = os.fork()
            if pid == 0:
                try:
                    block = bytearray(192 << 20)
                    for k in range(0, len(block), 4096):
                        block[k] = 1
                    time.sleep(3)
                finally:
                    os._exit(0)
            pids.append(pid)
        killed = sum(os.WIFSIGNALED(os.waitpid(p, 0)[1]) for p in pids)
        print("killed", killed)
    """)
    limits = Limits(timeout_s=20, cpu_s=20, memory_bytes=512 << 20, address_space_bytes=1 << 30)
    result = run_program(program, limits)
    if "cgroup" not in result.isolation["memory"]:
        pytest.skip(result.isolation["memory"])
    assert int(result.stdout.split()[-1]) >= 4, result
    assert result.isolation["memory_peak_bytes"] <= 512 << 20


def test_memory_bomb_hits_the_address_space_limit():
    bomb = "blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))\n"
    result = run_tests(bomb, CHECK, "double", Limits(timeout_s=10, cpu_s=10, address_space_bytes=512 << 20))
    assert result["outcome"] == "error" and "MemoryError" in result["detail"]


@as_root
def test_fork_bomb_is_refused_and_leaves_no_process_behind():
    counting = textwrap.dedent("""
        import os, time
        refused = 0
        for _ in range(200):
            try:
                if os.fork() == 0:
                    time.sleep(120)
                    os._exit(0)
            except OSError:
                refused += 1
        print("refused", refused)
    """)
    result = run_program(counting, QUICK)
    assert result.returncode == 0 and not result.timed_out
    assert int(result.stdout.split()[-1]) >= 200 - QUICK.processes
    # the sleeping children died with the program's PID namespace
    assert sandbox_processes() == []


@as_root
def test_classic_fork_bomb_times_out_and_is_cleaned_up():
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = run_tests(bomb, CHECK, "double", QUICK)
    assert result["outcome"] == "timeout"
    assert sandbox_processes() == []


@as_root
def test_writes_outside_the_temp_dir_are_refused(tmp_path):
    targets = [tmp_path / "escaped.txt", Path("/tmp") / f"servesweep-escape-{os.getpid()}",
               Path("/dev/shm") / f"servesweep-escape-{os.getpid()}", Path.cwd() / "escaped.txt"]
    tmp_path.chmod(0o777)  # even a world-writable directory must stay untouched
    program = textwrap.dedent(f"""
        outcomes = []
        for target in {[str(t) for t in targets]!r}:
            try:
                with open(target, "w") as fh:
                    fh.write("escaped")
                outcomes.append("written")
            except OSError as exc:
                outcomes.append(type(exc).__name__ + ": " + exc.strerror)
        with open("inside.txt", "w") as fh:
            fh.write("fine")
        print(open("inside.txt").read())
        print(outcomes)
        open("/escaped.txt", "w")
    """)
    raw = run_program(program, QUICK)
    assert raw.isolation["filesystem"].startswith("read-only")
    assert raw.stdout.startswith("fine") and "written" not in raw.stdout
    result = run_tests(program, CHECK, "double", QUICK)
    assert result["outcome"] == "error" and "Read-only file system" in result["detail"]
    assert not any(t.exists() for t in targets)


def test_outbound_socket_cannot_reach_a_listener_on_this_host():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\n"
        result = run_tests(program, CHECK, "double", QUICK)
        assert result["isolation"]["network"].startswith("isolated")
        # the sandbox has a loopback of its own, where nothing listens
        assert result["outcome"] == "error" and "Connection refused" in result["detail"]
        with pytest.raises(socket.timeout):
            listener.accept()


def test_outbound_socket_to_the_internet_is_refused():
    program = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n"
    result = run_tests(program, CHECK, "double", QUICK)
    assert result["isolation"]["network"].startswith("isolated")
    assert result["outcome"] == "error" and "Network is unreachable" in result["detail"]


@pytest.mark.parametrize("attack", [a for a in ATTACKS if a.name in (
    "read another process's env", "read host files", "kill the parent", "leave a background process")],
    ids=lambda a: a.name)
def test_attack_is_contained(attack):
    """The attacks of benchmarks/sandbox_attacks.py that the tests above do not already cover."""
    contained, what = attack.run()
    assert contained, what


def test_proc_shows_only_the_sandbox():
    result = run_program("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n", QUICK)
    assert result.stdout.strip() == "[1, 2]"
    assert result.isolation["pid_namespace"] and result.isolation["sandbox"].startswith("bubblewrap")


def test_without_bwrap_it_refuses_unless_allowed(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap (bubblewrap) is not installed")
    monkeypatch.delenv(sandbox.ALLOW_UNSANDBOXED_ENV, raising=False)
    with pytest.raises(sandbox.SandboxUnavailable) as info:
        run_tests("def double(x):\n    return 2 * x\n", CHECK, "double", QUICK)
    assert "not installed" in str(info.value) and sandbox.ALLOW_UNSANDBOXED_ENV in str(info.value)
    allowed = run_tests("def double(x):\n    return 2 * x\n", CHECK, "double",
                        Limits(timeout_s=5, cpu_s=5, allow_unsandboxed=True))
    assert allowed["outcome"] == "passed"
    assert allowed["isolation"]["sandbox"] == "unsandboxed"
    assert allowed["isolation"]["network"].startswith("not isolated")
    monkeypatch.setenv(sandbox.ALLOW_UNSANDBOXED_ENV, "1")
    assert run_tests("def double(x):\n    return 2 * x\n", CHECK, "double", QUICK)["isolation"]["sandbox"] == \
        "unsandboxed"


def test_refusal_names_the_config_key_that_opts_out(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap (bubblewrap) is not installed")
    monkeypatch.delenv(sandbox.ALLOW_UNSANDBOXED_ENV, raising=False)
    with pytest.raises(sandbox.SandboxUnavailable, match="set correctness.coding_eval.sandbox: none"):
        run_program("print(1)\n", QUICK)


def test_sandbox_none_runs_unconfined_even_where_bwrap_works():
    """The config's explicit opt-out: no bwrap at all (this machine has a working one), the limits still bind, and
    the result is labelled unsandboxed with the key that chose it."""
    assert sandbox.bwrap_problem() is None
    none = Limits(timeout_s=2, cpu_s=5, sandbox="none")
    result = run_tests("def double(x):\n    return 2 * x\n", CHECK, "double", none)
    assert result["outcome"] == "passed"
    assert result["isolation"]["sandbox"] == "unsandboxed" and not result["isolation"]["pid_namespace"]
    assert "correctness.coding_eval.sandbox is none" in result["isolation"]["reason"]
    assert run_tests("def double(x):\n    while True:\n        pass\n", CHECK, "double", none)["outcome"] == "timeout"
    with pytest.raises(ValueError, match="correctness.coding_eval.sandbox: 'docker' is not a sandbox"):
        Limits(sandbox="docker")


def test_self_test_never_runs_unconfined(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bwrap (bubblewrap) is not installed")
    monkeypatch.setenv(sandbox.ALLOW_UNSANDBOXED_ENV, "1")
    probe = sandbox.self_test()
    assert probe["works"] is False and probe["allow_unsandboxed_env"] is True and "not installed" in probe["error"]
    assert "isolation" not in probe


def test_bwrap_outside_the_programs_path_is_run_by_its_full_path(monkeypatch):
    """A bwrap found on this process's PATH but outside the programs' scrubbed PATH (/usr/bin:/bin), as an H200 host
    with bwrap in /usr/local/bin had it, still runs the programs: argv[0] is the path found, not a name to search."""
    import shutil
    import tempfile
    real = shutil.which("bwrap")
    elsewhere = Path(tempfile.mkdtemp(prefix="servesweep-bwrap-elsewhere-", dir="/tmp"))
    try:
        elsewhere.chmod(0o755)
        shutil.copy2(real, elsewhere / "bwrap")
        monkeypatch.setenv("PATH", f"{elsewhere}:{os.environ['PATH']}")
        sandbox.bwrap_problem.cache_clear()
        assert sandbox.bwrap_argv(elsewhere, ["/usr/bin/python3"], QUICK)[0] == str(elsewhere / "bwrap")
        probe = sandbox.self_test()
        assert probe["works"] is True, probe
    finally:
        sandbox.bwrap_problem.cache_clear()
        shutil.rmtree(elsewhere, ignore_errors=True)


def test_environment_is_scrubbed_and_cwd_is_a_fresh_temp_dir(monkeypatch):
    monkeypatch.setenv("SERVESWEEP_SECRET_TOKEN", "do-not-leak")
    result = run_program("import os\nprint(sorted(os.environ))\nprint(os.getcwd())\nprint(os.listdir('.'))\n", QUICK)
    env_keys, cwd, listing = result.stdout.strip().splitlines()
    assert "SERVESWEEP_SECRET_TOKEN" not in env_keys and "do-not-leak" not in result.stdout
    assert "servesweep-sandbox-" in cwd and listing == "['program.py']"
    assert not Path(cwd).exists()


@as_root
def test_program_runs_as_the_unprivileged_uid():
    result = run_program("import os\nprint(os.getuid(), os.geteuid())\n", QUICK)
    assert result.stdout.split() == [str(sandbox_uid())] * 2
    assert result.isolation["uid"] == sandbox_uid() and result.isolation["process_limit_binding"]
