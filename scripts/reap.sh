# reap.sh: sourced by the drivers that keep several trainer runs going at once (sdc_compare.sh, characterize.sh).
#
# reap_one PID...: wait until one of the listed background children has ended; REAP_PID its pid, REAP_STATUS its exit
# status. Polled five times a second (kill -0, then `wait PID` for the status) rather than `wait -n`: bash's `wait -n`
# misses a child that ended while the script was busy elsewhere (launching the next run, printing progress): it waits
# for another one, or returns 127 with no pid, and the child's status is lost; `wait PID` finds it (bash 5.2 measured,
# tests/test_robust.py). Returns 1 when called with no pid.
reap_one() {
  REAP_PID="" REAP_STATUS=0
  [ $# -gt 0 ] || return 1
  local p
  while :; do
    for p in "$@"; do
      if ! kill -0 "$p" 2>/dev/null; then
        REAP_PID=$p
        wait "$p" || REAP_STATUS=$?
        return 0
      fi
    done
    sleep 0.2
  done
}
