#!/usr/bin/env bash
# Real Kubernetes worker nodes (kubelet + containerd + runc + CRIU) joined to a control plane that
# tools/kubecluster/cluster.sh started in DIR, several at once on one machine, and the local image registry they
# pull from. Run as root.
#   node.sh lab-up DIR [N]      registry + images + N nodes (default 2) named real-a, real-b, ...; waits for Ready
#   node.sh lab-down DIR        every node of DIR, then the registry
#   node.sh up DIR NAME         one node (needs the registry: registry-up first)
#   node.sh down DIR NAME       stop it and remove what `up` made (processes, mounts, cgroups, bridge, its Node)
#   node.sh registry-up DIR     docker-registry on 127.0.0.1:<free port>, the images pushed (cached build)
#   node.sh registry-down DIR
#   node.sh exec DIR NAME CMD.. run CMD inside the node's mount namespace (e.g. ctr, which reads $CONTAINERD_ADDRESS)
#   node.sh stop DIR NAME C     stop one component C (kubelet, containerd, fakegpu-plugin): e.g. the node goes NotReady
#   node.sh restart DIR NAME C  (re)start it with its command line
# Each node: DIR/nodes/NAME holds its containerd root/state/socket/config, kubelet root, certificates, logs; its
# own mount namespace puts that node's folders over the host paths no flag can move (/var/lib/kubelet with the
# device-plugin socket, /var/log/pods, /var/log/containers, /var/lib/cni, /run/containerd, /run/netns); its own
# CNI bridge gpdk<slot> holding the node IP 10.244.<slot>.1 (the kubelet refuses loopback node IPs), pod subnet
# 10.244.<slot>.0/24, kubelet ports chosen free; its own cgroup parent /gpudefrag-kubenode<slot> (kubelet cgroupRoot). The slot is taken machine-wide under a lock
# (/run/gpudefrag-kubenode), so labs of different checkouts never collide. DIR/nodes/NAME/env says where is what.
# Env: GPUDEFRAG_NODE_GPUS (8), GPUDEFRAG_NODE_GPU_PRODUCT (NVIDIA-H100-80GB-HBM3), GPUDEFRAG_NODE_GPU_MEMORY
# (81559, MiB), GPUDEFRAG_NODE_DRIVER (550.54.15), GPUDEFRAG_NODE_CUDA (12.4), GPUDEFRAG_NODE_LABELS (more
# k=v,k=v labels), GPUDEFRAG_CRIU (criu binary; default: `command -v criu`).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: node.sh lab-up|lab-down|up|down|registry-up|registry-down|exec|stop|restart DIR [NAME] ..."
cmd=${1:?$usage}
dir=${2:?$usage}
log() { printf '[kubenode] %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root"; exit 1; }
[ -d "$dir" ] || { log "no folder $dir (start the control plane first: tools/kubecluster/cluster.sh start DIR)"; exit 1; }
dir=$(cd "$dir" && pwd)
MACHINE=/run/gpudefrag-kubenode          # machine-wide: slots taken, host folders we created
REG_ALIAS=registry.gpudefrag.test       # a stable image name prefix for the lab registry (see registry-up)
CG_CONTROLLERS=(cpu cpuacct cpuset memory devices freezer blkio pids systemd unified)
SHARED_PATHS=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd /run/netns)

kubectl_() { "$dir/bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" "$@"; }

wait_for() {  # wait_for WHAT SECONDS COMMAND...
  local what=$1 secs=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$end" ]; then log "timed out waiting for $what"; return 1; fi
    sleep 0.3
  done
}

free_ports() { python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

# a zombie is not alive (this machine's init reaps orphans late, and kill -0 succeeds on a zombie)
pid_alive() { local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1); [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]; }
alive() { [ -f "$1" ] && pid_alive "$(cat "$1")"; }

stop_pidfile() {  # stop_pidfile FILE: end the session the recorded PID leads (setsid), then forget it
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if pid_alive "$pid"; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do pid_alive "$pid" || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# ---------------------------------------------------------------- registry
registry_up() {  # start the registry unless it runs; (re)push the images either way (cached builds: fast)
  local r=$dir/registry port images
  mkdir -p "$r/data"
  if alive "$r/pid" && [ -f "$r/env" ]; then
    port=$(sed -n 's/^REGISTRY=127.0.0.1://p' "$r/env")
  else
    "$here/build.sh" >/dev/null
    # a restart (registry-down, then -up: the "registry down" fault) keeps the port, so image names stay valid
    port=$(sed -n 's/^  addr: 127.0.0.1://p' "$r/config.yml" 2>/dev/null || true)
    [ -n "$port" ] || read -r port <<<"$(free_ports 1)"
    cat > "$r/config.yml" <<CFG
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: $r/data}
  delete: {enabled: true}
http:
  addr: 127.0.0.1:$port
  secret: gpudefrag-test-lab
CFG
    setsid docker-registry serve "$r/config.yml" >>"$r/registry.log" 2>&1 < /dev/null &
    echo $! > "$r/pid"
    wait_for "the registry on 127.0.0.1:$port" 30 curl -fsS "http://127.0.0.1:$port/v2/" \
      || { tail -20 "$r/registry.log" >&2; exit 1; }
  fi
  images=$("$here/images.sh" build)
  "$here/images.sh" push "127.0.0.1:$port" > "$r/pushed"
  printf 'REGISTRY=127.0.0.1:%s\nIMAGES=%s\n' "$port" "$images" > "$r/env"
  log "registry at 127.0.0.1:$port (the nodes also know it as $REG_ALIAS); images pushed"
}

registry_down() { stop_pidfile "$dir/registry/pid"; }

# ---------------------------------------------------------------- machine-wide slots
take_slot() {  # take_slot NODEDIR: print a free slot number (1..200), recorded as taken by NODEDIR
  mkdir -p "$MACHINE"
  (
    flock 9
    for s in $(seq 1 200); do
      f=$MACHINE/slot-$s
      if [ -f "$f" ]; then
        # stale: its node folder is gone, or its namespace holder died (a lab killed without `down`); taken: a
        # live holder, or no holder yet (that node is starting). node_up clears a stale slot's leftovers.
        read -r owner < "$f" || true
        if [ -d "$owner" ] && [ "$owner" != "$1" ]; then
          if alive "$owner/pids/holder" || [ ! -f "$owner/pids/holder" ]; then continue; fi
        fi
      fi
      echo "$1" > "$f"; echo "$s"; exit 0
    done
    exit 1
  ) 9>"$MACHINE.lock"
}

release_slot() {  # release_slot SLOT; the last node out removes the host folders nodes created
  (
    flock 9
    rm -f "$MACHINE/slot-$1"
    if ! ls "$MACHINE"/slot-* >/dev/null 2>&1; then
      if [ -f "$MACHINE/created" ]; then
        tac "$MACHINE/created" | while read -r p; do rmdir "$p" 2>/dev/null || true; done
      fi
      rm -rf "$MACHINE"
    fi
  ) 9>"$MACHINE.lock"
}

ensure_host_paths() {  # the bind-mount targets must exist on the host; remember the ones we make
  (
    flock 9
    for p in "${SHARED_PATHS[@]}"; do
      [ -d "$p" ] && continue
      local parent=$p missing=()
      while [ ! -e "$parent" ]; do missing=("$parent" "${missing[@]}"); parent=$(dirname "$parent"); done
      mkdir -p "$p"
      for m in "${missing[@]}"; do echo "$m" >> "$MACHINE/created"; done
    done
  ) 9>"$MACHINE.lock"
}

# ---------------------------------------------------------------- cgroups
cg_paths() { local c; for c in "${CG_CONTROLLERS[@]}"; do [ -d "/sys/fs/cgroup/$c" ] && echo "/sys/fs/cgroup/$c/$1"; done; }

cg_create() {  # cg_create NAME: the node's cgroup parent in every hierarchy (cpuset needs its cpus/mems first)
  local p
  for p in $(cg_paths "$1"); do
    mkdir -p "$p"
    if [ -f "$p/cpuset.cpus" ]; then
      cat "$(dirname "$p")/cpuset.cpus" > "$p/cpuset.cpus"
      cat "$(dirname "$p")/cpuset.mems" > "$p/cpuset.mems"
    fi
  done
}

cg_kill_all() {  # cg_kill_all NAME: freeze the node's cgroup tree, SIGKILL every process in it, thaw, wait
  local fz=/sys/fs/cgroup/freezer/$1 pids
  [ -d "$fz" ] || return 0
  echo FROZEN > "$fz/freezer.state" 2>/dev/null || true
  for _ in $(seq 100); do
    pids=$(find "/sys/fs/cgroup/pids/$1" "$fz" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
    [ -n "$pids" ] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    echo THAWED > "$fz/freezer.state" 2>/dev/null || true
    sleep 0.1
  done
  echo THAWED > "$fz/freezer.state" 2>/dev/null || true
}

cg_remove() {  # deepest first
  local p
  for p in $(cg_paths "$1"); do
    [ -d "$p" ] && find "$p" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

# ---------------------------------------------------------------- one node
node_labels() {
  local gpus=$1 product=$2 mem=$3 driver=$4 cuda=$5 name=$6
  local dmaj dmin drev cmaj cmin
  IFS=. read -r dmaj dmin drev <<<"$driver"
  IFS=. read -r cmaj cmin <<<"$cuda"
  local l="gpudefrag.io/kubenode=$name,nvidia.com/gpu.present=true,nvidia.com/gpu.product=$product"
  l="$l,nvidia.com/gpu.count=$gpus,nvidia.com/gpu.memory=$mem,nvidia.com/gpu.family=hopper"
  l="$l,nvidia.com/gpu.compute.major=9,nvidia.com/gpu.compute.minor=0,nvidia.com/gpu.machine=gpudefrag-kubenode"
  l="$l,nvidia.com/cuda.driver-version.full=$driver,nvidia.com/cuda.driver.major=$dmaj"
  l="$l,nvidia.com/cuda.driver.minor=$dmin,nvidia.com/cuda.driver.rev=${drev:-0}"
  l="$l,nvidia.com/cuda.runtime-version.full=$cuda,nvidia.com/cuda.runtime.major=$cmaj,nvidia.com/cuda.runtime.minor=${cmin:-0}"
  echo "$l${GPUDEFRAG_NODE_LABELS:+,$GPUDEFRAG_NODE_LABELS}"
}

node_cert() {  # node_cert NODEDIR NAME IP: a client cert (system:node:NAME) and a serving cert, from the cluster CA
  local n=$1 name=$2 ip=$3 pki=$dir/pki
  ossl() { openssl "$@" 2>/dev/null; }
  mkdir -p "$n/pki"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid:always\nextendedKeyUsage=clientAuth\n' > "$n/pki/client.ext"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid:always\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:%s,DNS:%s\n' "$ip" "$name" > "$n/pki/serving.ext"
  ossl req -newkey rsa:2048 -nodes -subj "/O=system:nodes/CN=system:node:$name" -keyout "$n/pki/client.key" -out "$n/pki/client.csr"
  ossl x509 -req -in "$n/pki/client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 -extfile "$n/pki/client.ext" -out "$n/pki/client.crt"
  ossl req -newkey rsa:2048 -nodes -subj "/CN=$name" -keyout "$n/pki/serving.key" -out "$n/pki/serving.csr"
  ossl x509 -req -in "$n/pki/serving.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 -extfile "$n/pki/serving.ext" -out "$n/pki/serving.crt"
  chmod 600 "$n/pki"/*.key
  local kc=$n/kubelet.kubeconfig server
  server=$(sed -n 's/^KUBE_API=//p' "$dir/env")
  kubectl_ config set-cluster local --server="$server" --certificate-authority="$pki/ca.crt" --embed-certs --kubeconfig="$kc" >/dev/null
  kubectl_ config set-credentials "system:node:$name" --client-certificate="$n/pki/client.crt" --client-key="$n/pki/client.key" --embed-certs --kubeconfig="$kc" >/dev/null
  kubectl_ config set-context local --cluster=local --user="system:node:$name" --kubeconfig="$kc" >/dev/null
  kubectl_ config use-context local --kubeconfig="$kc" >/dev/null
  chmod 600 "$kc"
}

node_up() {
  local name=$1 n=$dir/nodes/$1 bin slot ip cg bridge subnet registry criu
  [ -f "$dir/env" ] || { log "$dir has no running control plane (tools/kubecluster/cluster.sh start $dir)"; exit 1; }
  [ -f "$dir/registry/env" ] || { log "no registry for $dir: run node.sh registry-up $dir first"; exit 1; }
  if [ -f "$n/env" ] && alive "$n/pids/holder"; then log "node $name is already up"; return 0; fi
  bin=$("$here/build.sh")
  criu=${GPUDEFRAG_CRIU:-$(command -v criu || true)}
  [ -n "$criu" ] || { log "no criu (scripts/install-criu.sh)"; exit 1; }
  registry=$(sed -n 's/^REGISTRY=//p' "$dir/registry/env")
  rm -rf "$n"
  mkdir -p "$n"/{pids,logs,cmd,tmp,kubelet,pod-logs,container-logs,cni/net.d,cni/state,run-containerd,netns,opt} \
    "$n/containerd/certs.d/$registry" "$n/containerd/certs.d/$REG_ALIAS"
  slot=$(take_slot "$n") || { log "no free node slot on this machine"; exit 1; }
  ip=10.244.$slot.1 cg=gpudefrag-kubenode$slot bridge=gpdk$slot subnet=10.244.$slot.0/24
  # a slot left by a node that died without `down`: its processes, cgroups and bridge go first
  cg_kill_all "$cg"; cg_remove "$cg"; ip link del "$bridge" 2>/dev/null || true
  # the node IP lives on the node's own pod bridge (the kubelet refuses loopback node IPs; pods reach it too)
  ip link add "$bridge" type bridge && ip addr add "$ip/24" dev "$bridge" && ip link set "$bridge" up
  local ports kport hport
  read -r kport hport <<<"$(free_ports 2)"
  local gpus=${GPUDEFRAG_NODE_GPUS:-8} product=${GPUDEFRAG_NODE_GPU_PRODUCT:-NVIDIA-H100-80GB-HBM3}
  cat > "$n/env" <<ENV
NODE_NAME=$name
NODE_SLOT=$slot
NODE_IP=$ip
KUBELET_PORT=$kport
KUBELET_HEALTHZ_PORT=$hport
KUBELET_ROOT_IN_NODE=/var/lib/kubelet
KUBELET_ROOT=$n/kubelet
CONTAINERD_ADDRESS=$n/run-containerd/containerd.sock
CGROUP_PARENT=/$cg
CNI_BRIDGE=$bridge
POD_SUBNET=$subnet
NODE_GPUS=$gpus
REGISTRY=$registry
ENV
  node_cert "$n" "$name" "$ip"

  # ---- containerd: own root, state, socket; CRI with runc + CRIU; NRI off (its socket is a fixed host path).
  # The socket is in $n/run-containerd, which the node's mount namespace puts over /run/containerd: inside the
  # node (the node agent's DaemonSet, hostPath /run/containerd) it is containerd's default path.
  cat > "$n/containerd/config.toml" <<CFG
version = 3
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$n/run-containerd/containerd.sock"
[ttrpc]
  address = "$n/run-containerd/containerd.sock.ttrpc"
[debug]
  level = "info"
[plugins]
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.internal.v1.opt']
    path = "$n/opt"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "registry.k8s.io/pause:3.10.1"
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = "$n/containerd/certs.d"
  [plugins.'io.containerd.cri.v1.runtime']
    # the kubelet asks for oom_score_adj -998 on sandboxes; root without CAP_SYS_RESOURCE cannot lower it
    restrict_oom_score_adj = true
    # restore from a checkpoint image through CreateContainer (deprecated; gone in containerd 2.4)
    enable_experimental_restore_via_create = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "$bin/runc"
          SystemdCgroup = false
          CriuPath = "$criu"
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["/usr/lib/cni"]
      conf_dir = "$n/cni/net.d"
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "$ip"
    stream_server_port = "0"
CFG
  for h in "$registry" "$REG_ALIAS"; do
    printf 'server = "http://%s"\n[host."http://%s"]\n  capabilities = ["pull", "resolve", "push"]\n' \
      "$registry" "$registry" > "$n/containerd/certs.d/$h/hosts.toml"
  done
  cat > "$n/cni/net.d/10-gpudefrag.conflist" <<CNI
{"cniVersion": "1.0.0", "name": "gpudefrag-$name", "plugins": [
  {"type": "bridge", "bridge": "$bridge", "isGateway": false, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$subnet"}]], "dataDir": "/var/lib/cni/networks"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
CNI

  # ---- kubelet
  cat > "$n/kubelet.yaml" <<CFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$cg
featureGates:
  ContainerCheckpoint: true
containerRuntimeEndpoint: unix://$n/run-containerd/containerd.sock
imageServiceEndpoint: unix://$n/run-containerd/containerd.sock
address: $ip
port: $kport
readOnlyPort: 0
healthzBindAddress: $ip
healthzPort: $hport
tlsCertFile: $n/pki/serving.crt
tlsPrivateKeyFile: $n/pki/serving.key
failSwapOn: false
makeIPTablesUtilChains: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $dir/pki/ca.crt}
authorization:
  mode: Webhook
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
maxPods: 30
serializeImagePulls: false
podLogsDir: /var/log/pods
CFG

  # ---- the mount namespace: a holder process keeps it; every component enters it and joins the node's cgroups
  cg_create "$cg"
  ensure_host_paths
  local cgs
  cgs=$(cg_paths "$cg" | tr '\n' ' ')
  local labels
  labels=$(node_labels "$gpus" "$product" "${GPUDEFRAG_NODE_GPU_MEMORY:-81559}" "${GPUDEFRAG_NODE_DRIVER:-550.54.15}" \
           "${GPUDEFRAG_NODE_CUDA:-12.4}" "$name")
  cat > "$n/cmd/holder" <<CMD
for c in $cgs; do echo \$\$ > \$c/cgroup.procs; done
exec unshare --mount --propagation private -- sleep infinity
CMD
  local enter="for c in $cgs; do echo \$\$ > \$c/cgroup.procs; done; exec nsenter --mount=/proc/\$(cat $n/pids/holder-ns)/ns/mnt --"
  # TMPDIR: containerd unpacks checkpoint images under it (and leaves read-only mounts' folders behind)
  cat > "$n/cmd/containerd" <<CMD
export TMPDIR=$n/tmp
$enter "$bin/containerd" --config "$n/containerd/config.toml"
CMD
  cat > "$n/cmd/kubelet" <<CMD
$enter "$bin/kubelet" --config "$n/kubelet.yaml" --kubeconfig "$n/kubelet.kubeconfig" --root-dir /var/lib/kubelet \\
  --hostname-override "$name" --node-ip "$ip" --node-labels "$labels" -v 1
CMD
  cat > "$n/cmd/fakegpu-plugin" <<CMD
$enter "$bin/fakegpu-plugin" -count "$gpus"
CMD
  nlaunch() { setsid bash "$n/cmd/$1" >>"$n/logs/$1.log" 2>&1 < /dev/null & echo $! > "$n/pids/$1"; }
  nlaunch holder
  # the unshare'd `sleep` is the holder's child once unshare execs; its /proc/PID/ns/mnt is the node's namespace
  local hp=$(cat "$n/pids/holder") nspid=""
  for _ in $(seq 50); do
    nspid=$(pgrep -P "$hp" -x sleep || true)
    [ -z "$nspid" ] && [ "$(readlink "/proc/$hp/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ] && nspid=$hp
    [ -n "$nspid" ] && break; sleep 0.1
  done
  [ -n "$nspid" ] || { log "the mount namespace of $name did not start"; node_down "$name"; exit 1; }
  echo "$nspid" > "$n/pids/holder-ns"
  local binds=("$n/kubelet:/var/lib/kubelet" "$n/pod-logs:/var/log/pods" "$n/container-logs:/var/log/containers"
               "$n/cni/state:/var/lib/cni" "$n/run-containerd:/run/containerd" "$n/netns:/run/netns")
  for b in "${binds[@]}"; do
    nsenter --mount="/proc/$nspid/ns/mnt" -- mount --bind "${b%%:*}" "${b##*:}"
  done
  nlaunch containerd
  wait_for "containerd of $name" 60 test -S "$n/run-containerd/containerd.sock" \
    || { tail -20 "$n/logs/containerd.log" >&2; node_down "$name"; exit 1; }
  # the sandbox image is imported, not pulled: the pod sandboxes never depend on the registry
  local images
  images=$(sed -n 's/^IMAGES=//p' "$dir/registry/env")
  nsenter --mount="/proc/$nspid/ns/mnt" -- "$bin/ctr" --address "$n/run-containerd/containerd.sock" -n k8s.io images import \
    --local --no-unpack=false "$images/pause.tar" >/dev/null 2>>"$n/logs/containerd.log" \
    || { log "importing the pause image failed"; tail -5 "$n/logs/containerd.log" >&2; node_down "$name"; exit 1; }
  nlaunch kubelet
  wait_for "the kubelet's device-plugin socket on $name" 60 test -S "$n/kubelet/device-plugins/kubelet.sock" \
    || { tail -20 "$n/logs/kubelet.log" >&2; node_down "$name"; exit 1; }
  nlaunch fakegpu-plugin
  log "node $name (slot $slot, $ip:$kport) started; waiting for Ready"
}

node_wait_ready() {  # node_wait_ready NAME: Ready and advertising its GPUs
  local name=$1 gpus
  gpus=$(sed -n 's/^NODE_GPUS=//p' "$dir/nodes/$name/env")
  ready() {
    [ "$(kubectl_ get node "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] &&
    [ "$(kubectl_ get node "$name" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" = "$gpus" ]
  }
  wait_for "node $name to be Ready with $gpus GPUs" 180 ready \
    || { tail -30 "$dir/nodes/$name/logs/kubelet.log" >&2; return 1; }
  log "node $name Ready with $gpus nvidia.com/gpu"
}

node_down() {
  local name=$1 n=$dir/nodes/$1 slot cg bridge
  [ -f "$n/env" ] || { log "no node $name in $dir"; return 0; }
  slot=$(sed -n 's/^NODE_SLOT=//p' "$n/env")
  cg=gpudefrag-kubenode$slot bridge=gpdk$slot
  [ -x "$dir/bin/kubectl" ] && kubectl_ delete node "$name" --wait=false --request-timeout=10s >/dev/null 2>&1 || true
  # the kubelet first (SIGKILL: nothing here needs a graceful stop), so it starts nothing new; then everything in
  # the node's cgroups (containerd, shims, containers, the namespace holder): with the last of them the mount
  # namespace and its mounts go
  for c in kubelet fakegpu-plugin containerd; do
    [ -f "$n/pids/$c" ] && kill -KILL -- "-$(cat "$n/pids/$c")" 2>/dev/null || true
    rm -f "$n/pids/$c"
  done
  # the slot's cgroups, bridge and record, unless a later node took the slot over (this one died unattended)
  if [ "$(cat "$MACHINE/slot-$slot" 2>/dev/null)" = "$n" ]; then
    cg_kill_all "$cg"
    stop_pidfile "$n/pids/holder"
    cg_remove "$cg"
    ip link del "$bridge" 2>/dev/null || true
    # pod network namespaces were bind-mounted inside the node's namespace only: gone with it
    release_slot "$slot"
  else
    stop_pidfile "$n/pids/holder"
  fi
  rm -rf "$n/containerd" "$n/kubelet" "$n/tmp" "$n/run-containerd" "$n/netns" "$n/cni/state" "$n/opt" "$n/pod-logs" "$n/container-logs"
  rm -f "$n/env" "$n/pids/holder-ns"
  log "node $name down"
}

case $cmd in
registry-up) registry_up ;;
registry-down) registry_down ;;
up) node_up "${3:?node name}"; node_wait_ready "$3" ;;
down) node_down "${3:?node name}" ;;
lab-up)
  count=${3:-2}
  registry_up
  names=()
  letters=(a b c d e f g h)
  for i in $(seq 0 $((count - 1))); do names+=("real-${letters[$i]}"); done
  for nm in "${names[@]}"; do node_up "$nm"; done
  for nm in "${names[@]}"; do node_wait_ready "$nm"; done
  log "nodes up: ${names[*]}" ;;
lab-down)
  if [ -d "$dir/nodes" ]; then for n in "$dir"/nodes/*/; do [ -f "$n/env" ] && node_down "$(basename "$n")"; done; fi
  registry_down ;;
exec)
  name=${3:?node name}; shift 3
  n=$dir/nodes/$name
  alive "$n/pids/holder" || { log "node $name is not up"; exit 1; }
  CONTAINERD_ADDRESS=$n/run-containerd/containerd.sock CONTAINERD_NAMESPACE=k8s.io \
    exec nsenter --mount="/proc/$(cat "$n/pids/holder-ns")/ns/mnt" -- "$@" ;;
stop|restart)
  name=${3:?node name}; c=${4:?component: kubelet, containerd or fakegpu-plugin}
  n=$dir/nodes/$name
  [ -f "$n/cmd/$c" ] && [ "$c" != holder ] || { log "no component $c on node $name"; exit 2; }
  stop_pidfile "$n/pids/$c"
  if [ "$cmd" = restart ]; then
    setsid bash "$n/cmd/$c" >>"$n/logs/$c.log" 2>&1 < /dev/null &
    echo $! > "$n/pids/$c"
  fi ;;
*) log "$usage"; exit 2 ;;
esac
