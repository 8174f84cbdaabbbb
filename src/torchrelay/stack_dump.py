"""Stack dumps before a fence: the contract between a worker and its node agent.

Why: a worker fenced for a hang or a stall is gone by the time anyone looks at it, and the
controller knows only that it stopped making progress. Its threads' stacks at the fence say
where it was stuck (``RUN_DIR/logs/<process>.log``).

- The worker runtime (:mod:`torchrelay.runtime.stack_dump`) has :data:`SIGNAL` write every
  thread's stack to stderr, then :data:`END`. It works while a thread holds the GIL or blocks
  in C: the dump is written by faulthandler's C handler, the end line by the compiled
  extension's.
- The node agent (:mod:`torchrelay.agent.stack_dump`), told to fence with stacks, sends
  :data:`SIGNAL` and SIGKILLs once :data:`END` has come through the worker's output.

An operator can ask a live worker for its stacks the same way: ``kill -RTMIN+3 PID``.
"""

from __future__ import annotations

import signal

# A real-time signal: the standard ones all have users (SIGUSR1 and SIGUSR2: Slurm's
# --signal, Lightning's requeue) whose handlers a dump must not take over.
SIGNAL = signal.SIGRTMIN + 3

END = b"torchrelay: end of this process's stacks, dumped before its fence\n"
