#!/usr/bin/env bash
# Stop the test cluster started by start.sh: cancel its jobs, stop the daemons recorded in its pid files, and
# kill leftover slurmstepd processes of THIS cluster (found by their open files under its directory) with
# their descendants. Never kills by name. Idempotent. GPUDEFRAG_SLURM_PURGE=1 also deletes the directory.
set -uo pipefail
LAB=${GPUDEFRAG_SLURM_DIR:-/tmp/gpudefrag-slurm}
RUN=$LAB/run
export SLURM_CONF=$LAB/etc/slurm.conf
log() { echo "[slurm-stop] $*" >&2; }

pid_of() {
  local pid exe
  [ -s "$1" ] || return 1
  pid=$(cat "$1") && [ -d "/proc/$pid" ] || return 1
  exe=$(readlink "/proc/$pid/exe") || return 1
  case "$(basename "$exe")" in "$2" | "$2"-wlm) echo "$pid"; return 0 ;; esac
  return 1
}
descendants() {
  local -A kids=(); local p pp stat
  for stat in /proc/[0-9]*/stat; do
    p=${stat#/proc/}; p=${p%/stat}
    pp=$(awk '{sub(/^.*\) /,""); print $2}' "$stat" 2>/dev/null) || continue
    [ -n "$pp" ] && kids[$pp]+=" $p"
  done
  local queue=("$@") out=() cur
  while [ ${#queue[@]} -gt 0 ]; do
    cur=${queue[0]}; queue=("${queue[@]:1}")
    for p in ${kids[$cur]:-}; do out+=("$p"); queue+=("$p"); done
  done
  echo "${out[@]:-}"
}
stepds() {
  local d exe
  for d in /proc/[0-9]*; do
    exe=$(readlink "$d/exe" 2>/dev/null) || continue
    case "$(basename "$exe")" in slurmstepd | slurmstepd-wlm) ;; *) continue ;; esac
    if [[ "$(readlink "$d/cwd" 2>/dev/null)/" == "$LAB"/* ]] || find "$d/fd" -maxdepth 1 -lname "$LAB/*" 2>/dev/null | grep -q .; then
      echo "${d#/proc/}"
    fi
  done
}
gone() { local i p a; for i in $(seq $(($1 * 10))); do a=0; for p in "${@:2}"; do [ -d "/proc/$p" ] && a=1; done; [ $a = 0 ] && return 0; sleep 0.1; done; return 1; }

if pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null; then
  jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  [ -n "${jobs// /}" ] && scancel $jobs 2>/dev/null
fi
pids=()
for f in "$RUN"/slurmd-*.pid; do [ -e "$f" ] && p=$(pid_of "$f" slurmd) && pids+=("$p"); done
if [ ${#pids[@]} -gt 0 ]; then kill -TERM "${pids[@]}" 2>/dev/null; gone 10 "${pids[@]}" || kill -KILL "${pids[@]}" 2>/dev/null; fi
if p=$(pid_of "$RUN/slurmctld.pid" slurmctld); then kill -TERM "$p"; gone 10 "$p" || kill -KILL "$p" 2>/dev/null; fi
s=$(stepds | tr '\n' ' ')
if [ -n "${s// /}" ]; then
  v="$(descendants $s) $s"
  kill -KILL $v 2>/dev/null; gone 5 $v
fi
if p=$(pid_of "$RUN/munged.pid" munged); then kill -TERM "$p"; gone 10 "$p" || kill -KILL "$p" 2>/dev/null; fi
left=()
for f in "$RUN"/*.pid; do
  [ -e "$f" ] || continue
  b=$(basename "$f" .pid); b=${b%%-node*}
  p=$(pid_of "$f" "$b") && left+=("$b:$p")
  rm -f "$f"
done
for p in $(stepds); do left+=("slurmstepd:$p"); done
[ ${#left[@]} -eq 0 ] || { log "still running: ${left[*]}"; exit 1; }
[ "${GPUDEFRAG_SLURM_PURGE:-0}" = 1 ] && rm -rf "${LAB:?}"
log "stopped"
exit 0
