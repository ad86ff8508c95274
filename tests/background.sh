#!/usr/bin/env sh
# Runs a command at a low CPU priority (nice 10), in a session of its own: `make test` runs
# the suite's xdist workers this way beside the timed tests (tests/alone.py). Where the
# kernel groups scheduling by session (autogroup, /proc/sys/kernel/sched_autogroup_enabled),
# a process's nice counts only within its session, so the session's own nice is set too.
# Nice 10 weighs 110 against a normal task's 1024 (the kernel's sched_prio_to_weight): a
# timed test gets about 90 % of a core it shares with the workers. Not 19 (weight 15): the
# workers' tests have bounds of their own, and a timed test starting its processes on both
# cores would starve them outright.
# Usage: tests/background.sh COMMAND [ARG...]; it waits for COMMAND and exits with its code.
set -eu
export NICE=10
exec setsid --wait sh -c '
  if [ -w /proc/self/autogroup ]; then echo "$NICE" > /proc/self/autogroup || true; fi
  exec nice -n "$NICE" "$@"' background "$@"
