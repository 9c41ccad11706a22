"""Engine-agnostic server lifecycle: own process group, readiness, identity, guaranteed teardown.

No server outlives its job, whatever ends the job:

- normal exit, any exception, SIGINT/SIGTERM/SIGHUP: :meth:`ServerProcess.stop` kills the whole process group
  (TERM, then KILL after a grace period) and waits until the port is free again;
- SIGKILL of the job (OOM killer, ``kill -9``, a scheduler's hard kill), where no code of the job runs: two guards
  set up at launch. The server's own process (the group leader) asks the kernel for ``PR_SET_PDEATHSIG`` =
  SIGKILL before it execs the engine, so it dies the instant the job does. Engines whose workers outlive their
  leader (vLLM's and SGLang's schedulers, tokenizer and GPU workers) are covered by a watchdog: a tiny process in
  a session of its own (so a kill of the job's process group spares it) that sleeps on a pidfd of the job
  (an exact, wake-on-exit handle that cannot be fooled by pid reuse; polling of ``getppid()`` where pidfds are
  missing) and, once the job is gone, kills the server's process group — TERM, grace, KILL — and exits. It also
  exits by itself once the group is gone after a normal stop. A watchdog rather than a PDEATHSIG on every worker
  because the workers are started by the engine, not by us.
- a launch record (``<records_dir>/<name>.json``: pids, process group, port, GPUs, start time, argv, config) is
  written at launch and removed at a clean stop. :func:`preflight`, called by the next job before it launches,
  reaps any server whose job died without stopping it, and refuses to measure beside a foreign process that holds
  the port (or a running job that holds the GPUs).

One concern a module: ``process`` (the server's process group, its guards and its stop), ``reap`` (what runs before a
launch), ``lease`` (host leases and which GPUs a config gets), ``ready`` (readiness) and ``slurm_ranks`` (a multi-node
launch's ranks as steps of one SLURM job, none outliving it; docs/slurm-multinode.md).
"""
from servesweep.lifecycle.lease import (DEFAULT_LOCK_DIR, HostBusy, HostLease, config_gpus, host_gpu_count,
                                        host_lock_dir, lease_for_config)
from servesweep.lifecycle.process import ServerConflict, ServerProcess, ServerStartError, start_ticks, tail_lines
from servesweep.lifecycle.ready import wait_until_ready
from servesweep.lifecycle.reap import claim_launch, group_members, preflight, read_launch_records, refuse_busy_gpus

__all__ = ["DEFAULT_LOCK_DIR", "HostBusy", "HostLease", "ServerConflict", "ServerProcess", "ServerStartError",
           "claim_launch", "config_gpus", "group_members", "host_gpu_count", "host_lock_dir", "lease_for_config",
           "preflight", "read_launch_records", "refuse_busy_gpus", "start_ticks", "tail_lines",
           "wait_until_ready"]
