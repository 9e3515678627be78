# Sourced by .ci/run and scripts/test.sh: `phase NAME CMD...` runs CMD and
# records how many seconds it took; the phases are printed when the script
# exits (even when a phase fails), so every run shows where its time went.
PHASES=()
phase() {
  local name=$1 start rc=0
  shift
  start=$(date +%s)
  "$@" || rc=$?
  PHASES+=("$name $(($(date +%s) - start))")
  return "$rc"
}
print_phases() {
  [ "${#PHASES[@]}" -gt 0 ] || return 0
  echo "phase times (seconds):" >&2
  local p
  for p in "${PHASES[@]}"; do
    printf '  %-8s %6s\n' ${p} >&2
  done
}
trap print_phases EXIT
