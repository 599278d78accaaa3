#!/usr/bin/env bash
# Start a real Slurm cluster with fake GPUs on this host for gpudefrag's tests (as root).
# Adapted from the slurm-lab notes: one slurmctld + N slurmd (`slurmd -N nodeX`, one port each, all on
# 127.0.0.1), gres "gpu" backed by char devices (/dev/null clones) so Slurm hands out real GPU indices,
# proctrack/linuxproc without cgroups (job processes are plain descendants of slurmstepd, so CRIU can dump
# them), and the requeue delay cut to ~6 s (cred_expire=5, sched_interval=1).
# Idempotent: an already running cluster with the same config is only re-checked.
# Env: GPUDEFRAG_SLURM_DIR (default /tmp/gpudefrag-slurm), GPUDEFRAG_SLURM_NODES (4), GPUDEFRAG_SLURM_GPUS (8),
#      GPUDEFRAG_SLURM_PORT (17817), GPUDEFRAG_SLURM_TIMEOUT (60).
# Prints `export SLURM_CONF=...` on stdout when ready.
set -euo pipefail

LAB=${GPUDEFRAG_SLURM_DIR:-/tmp/gpudefrag-slurm}
NODES=${GPUDEFRAG_SLURM_NODES:-4}
GPUS=${GPUDEFRAG_SLURM_GPUS:-8}
PORT=${GPUDEFRAG_SLURM_PORT:-17817}
TIMEOUT=${GPUDEFRAG_SLURM_TIMEOUT:-60}

log() { echo "[slurm-start] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"
for b in slurmctld slurmd sbatch munged; do
  command -v "$b" >/dev/null || die "$b missing: run scripts/setup.sh all"
done

ETC=$LAB/etc RUN=$LAB/run LOGD=$LAB/log SPOOL=$LAB/spool STATE=$LAB/state MUNGE=$LAB/munge DEV=$LAB/dev
CONF=$ETC/slurm.conf
export SLURM_CONF=$CONF
mkdir -p "$ETC" "$RUN" "$LOGD" "$SPOOL" "$STATE" "$MUNGE" "$DEV"
chmod 700 "$MUNGE"

alive() { # alive PIDFILE BINARY: the pid in the file runs that binary
  local pid exe
  [ -s "$1" ] || return 1
  pid=$(cat "$1") && [ -d "/proc/$pid" ] || return 1
  exe=$(readlink "/proc/$pid/exe") || return 1
  case "$(basename "$exe")" in "$2" | "$2"-wlm) return 0 ;; esac
  return 1
}

# The "none" plugins are the defaults; newer Slurm releases dropped some of them as plugins, and naming one
# that is not installed is fatal. Name each only where its plugin exists (all do on Debian 12's 22.05).
plugdir=$(dirname "$(ls /usr/lib/*/slurm-wlm/proctrack_linuxproc.so /usr/lib/*/slurm/proctrack_linuxproc.so \
  /usr/lib64/slurm/proctrack_linuxproc.so 2>/dev/null | head -1)")
none_plugins() {
  local kv so
  for kv in TaskPlugin=task/none JobAcctGatherType=jobacct_gather/none AccountingStorageType=accounting_storage/none \
            JobCompType=jobcomp/none MpiDefault=mpi/none SwitchType=switch/none; do
    so=${kv#*=}; so=${so/\//_}.so
    [ -f "$plugdir/$so" ] || continue
    case $kv in MpiDefault=*) echo "MpiDefault=none" ;; *) echo "$kv" ;; esac
  done
}

tmp=$(mktemp)
{
  cat <<CONF
# written by tests/slurm/cluster/start.sh
ClusterName=gdtest
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire+1 s is how long a requeued job waits before it may start again (default 121 s)
AuthInfo=socket=$MUNGE/munge.socket,cred_expire=5
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGD/slurmctld.log
SlurmdLogFile=$LOGD/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=5,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
JobRequeue=1
CONF
  none_plugins
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=node$i NodeHostname=node$i NodeAddr=127.0.0.1 Port=$((PORT + 10 + i)) CPUs=64 Boards=1 SocketsPerBoard=1 CoresPerSocket=64 ThreadsPerCore=1 RealMemory=256000 Gres=gpu:$GPUS State=UNKNOWN"
  done
  echo "PartitionName=gpu Nodes=node[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} >"$tmp"
gres=$(mktemp)
{
  echo "AutoDetect=off"
  for i in $(seq 1 "$NODES"); do echo "NodeName=node$i Name=gpu File=$DEV/node$i/nvidia[0-$((GPUS - 1))]"; done
} >"$gres"
for i in $(seq 1 "$NODES"); do
  mkdir -p "$DEV/node$i" "$SPOOL/node$i"
  for g in $(seq 0 $((GPUS - 1))); do
    [ -c "$DEV/node$i/nvidia$g" ] || { rm -f "$DEV/node$i/nvidia$g"; mknod -m 666 "$DEV/node$i/nvidia$g" c 1 3; }
  done
done

running=0
alive "$RUN/slurmctld.pid" slurmctld && running=1
for i in $(seq 1 "$NODES"); do alive "$RUN/slurmd-node$i.pid" slurmd && running=1; done
if [ -f "$CONF" ] && ! cmp -s "$tmp" "$CONF" && [ $running = 1 ]; then
  rm -f "$tmp" "$gres"; die "a cluster with a different config is running in $LAB; run stop.sh first"
fi
mv "$tmp" "$CONF"; mv "$gres" "$ETC/gres.conf"; chmod 644 "$CONF" "$ETC/gres.conf"

fresh=0
if [ $running = 0 ] && ! alive "$RUN/munged.pid" munged; then
  fresh=1
  rm -rf "${STATE:?}"/* "${SPOOL:?}"/*/* "$LOGD"/*.log
fi

if ! alive "$RUN/munged.pid" munged; then
  [ -s "$MUNGE/munge.key" ] || dd if=/dev/urandom of="$MUNGE/munge.key" bs=1024 count=1 status=none
  chmod 600 "$MUNGE/munge.key"
  rm -f "$MUNGE/munge.socket" "$MUNGE/munge.socket.lock"
  munged --force --key-file="$MUNGE/munge.key" --socket="$MUNGE/munge.socket" --pid-file="$RUN/munged.pid" \
    --log-file="$LOGD/munged.log" --seed-file="$MUNGE/munged.seed" || die "munged failed"
  for _ in $(seq 50); do [ -S "$MUNGE/munge.socket" ] && break; sleep 0.1; done
fi

if ! alive "$RUN/slurmctld.pid" slurmctld; then
  if [ $fresh = 1 ]; then slurmctld -f "$CONF" -c; else slurmctld -f "$CONF"; fi || die "slurmctld failed ($LOGD)"
  for _ in $(seq 100); do alive "$RUN/slurmctld.pid" slurmctld && break; sleep 0.1; done
fi
for i in $(seq 1 "$NODES"); do
  alive "$RUN/slurmd-node$i.pid" slurmd || slurmd -f "$CONF" -N "node$i" || die "slurmd node$i failed ($LOGD)"
done

deadline=$(($(date +%s) + TIMEOUT))
while :; do
  if scontrol ping >/dev/null 2>&1; then
    states=$(sinfo -h -N -o '%N %T' 2>/dev/null || true)
    bad=$(echo "$states" | awk '$2 !~ /^(idle|mixed|allocated|completing|drained|draining)$/')
    [ -n "$states" ] && [ -z "$bad" ] && break
  fi
  [ "$(date +%s)" -lt "$deadline" ] || die "nodes not ready after ${TIMEOUT}s: $states"
  sleep 0.2
done
# The first batch scheduling pass comes ~3 s after slurmctld starts: wait for one probe job so that the
# tests' jobs start at once (it is JobId 1 and stays COMPLETED for MinJobAge).
if [ $fresh = 1 ]; then
  pj=$(sbatch --parsable -J gpudefrag-probe -N "$NODES" -t 1 -o /dev/null --wrap 'srun true') || die "probe sbatch failed"
  while :; do
    st=$(scontrol show job "$pj" -o 2>/dev/null | grep -oE 'JobState=[A-Z_]+' | cut -d= -f2 || true)
    [ "$st" = COMPLETED ] && break
    case "$st" in FAILED | CANCELLED | TIMEOUT | NODE_FAIL) die "probe job ended $st" ;; esac
    [ "$(date +%s)" -lt "$deadline" ] || die "probe job not done (state $st)"
    sleep 0.1
  done
fi
log "cluster ready: $NODES nodes x $GPUS GPUs ($(sinfo -V))"
echo "export SLURM_CONF=$CONF"
