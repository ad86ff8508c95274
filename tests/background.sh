#!/usr/bin/env sh
# Runs a command at the lowest CPU priority, in a session of its own: `make test` runs the
# suite's xdist workers this way beside the timed tests (tests/alone.py). Where the kernel
# groups scheduling by session (autogroup, /proc/sys/kernel/sched_autogroup_enabled), a
# process's nice counts only within its session, so the session's own nice is set too.
# Usage: tests/background.sh COMMAND [ARG...]; it waits for COMMAND and exits with its code.
set -eu
exec setsid --wait sh -c '
  if [ -w /proc/self/autogroup ]; then echo 19 > /proc/self/autogroup || true; fi
  exec nice -n 19 "$@"' background "$@"
