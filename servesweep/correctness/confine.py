"""Launcher that confines one program, then runs it: ``python -I confine.py <settings-json> <status-fd>``.

It runs as its own process (started by :func:`servesweep.correctness.sandbox.run_program`) rather than as a
``preexec_fn``, because ``preexec_fn`` is unsafe in a parent with threads (the bench job's telemetry sampler).
Standard library only, and nothing from servesweep: it is run by path in isolated mode.

Order matters: namespaces and mounts need root, so they come first; then the resource limits; then the switch to
the unprivileged sandbox uid (RLIMIT_NPROC does not bind root); then a fork so that the program is the first
process of a fresh PID namespace, whose death takes every process it started with it. Facts about what was in
force are written as JSON lines to the status pipe, which the program itself never inherits.
"""
import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
ST_RELATIME = 4096
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def _mount(source, target, fstype, flags: int) -> None:
    _check(_libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags, None),
           f"mount {target}")


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            raw = line.split()[4]
            # mountinfo escapes space, tab, newline and backslash as octal
            points.append(raw.encode().decode("unicode_escape").encode("latin-1").decode())
    return sorted(set(points))


def _read_only_except(writable: str, python_mount: tuple[str, str] | None) -> None:
    """Make every mount read-only inside this mount namespace, except a bind of the work dir onto itself."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount(writable, writable, None, MS_BIND)
    if python_mount:
        _mount(python_mount[0], python_mount[1], None, MS_BIND | MS_REC)
    for point in _mount_points():
        if point == writable:
            continue
        try:
            st = os.statvfs(point)
        except OSError:
            continue  # a mount point hidden under another mount
        # keep the mount's own flags: dropping nosuid/nodev/noexec would loosen it
        keep = st.f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME)
        if st.f_flag & ST_RELATIME:
            keep |= MS_RELATIME
        _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)


def main() -> None:
    settings = json.loads(sys.argv[1])
    status = os.fdopen(int(sys.argv[2]), "w")
    facts: dict = {"network": "shared", "filesystem": "permissions only", "pid_namespace": False, "uid": os.getuid()}
    is_root = os.geteuid() == 0

    try:
        _unshare(CLONE_NEWNET)
        facts["network"] = "isolated (empty network namespace)"
    except OSError as exc:
        facts["network"] = f"not isolated: new network namespace refused ({exc.strerror})"
    if is_root:
        try:
            _unshare(CLONE_NEWNS)
            _read_only_except(settings["workdir"], tuple(settings["python_mount"]) if settings["python_mount"]
                              else None)
            facts["filesystem"] = "read-only except the work dir (mount namespace)"
        except OSError as exc:
            facts["filesystem"] = f"permissions only: private read-only mounts refused ({exc.strerror})"
            if settings["python_mount"]:
                raise  # the interpreter is unreachable for the sandbox uid without its bind mount
        try:
            _unshare(CLONE_NEWPID)
            facts["pid_namespace"] = True
        except OSError:
            pass

    limits = settings["limits"]
    # soft = hard: the first process of a PID namespace ignores SIGXCPU, so only the hard limit's SIGKILL stops it
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"],) * 2)
    resource.setrlimit(resource.RLIMIT_AS, (limits["address_space_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)
    if is_root:
        uid = settings["uid"]
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        facts["uid"] = uid
    facts["process_limit_binding"] = os.getuid() != 0
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    status.write(json.dumps({"isolation": facts}) + "\n")
    status.flush()

    pid = os.fork()
    if pid == 0:
        status.close()
        # the launcher's death (wall-clock kill) must take the program, and with it its PID namespace, along
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        os.chdir(settings["workdir"])
        os.execve(settings["argv"][0], settings["argv"], settings["env"])
    _, wait_status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(wait_status):
        status.write(json.dumps({"signal": os.WTERMSIG(wait_status)}) + "\n")
    else:
        status.write(json.dumps({"exit": os.WEXITSTATUS(wait_status)}) + "\n")
    status.close()


if __name__ == "__main__":
    main()
