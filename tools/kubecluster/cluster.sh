#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, for the tests and by hand: etcd, kube-apiserver (RBAC, the usual
# admission plugins), kube-controller-manager, kube-scheduler, and KWOK keeping fake GPU nodes Ready and their
# pods Running/Ready: the nodes annotated kwok.x-k8s.io/node=fake (remove it and the node's "kubelet" is gone). Certificates come from a CA generated into DIR; ports are chosen free at start.
#   tools/kubecluster/cluster.sh start DIR      start everything; DIR/admin.kubeconfig is the admin kubeconfig
#   tools/kubecluster/cluster.sh stop DIR       stop what `start` started (by the PIDs it recorded)
#   tools/kubecluster/cluster.sh restart DIR C  restart one component C (e.g. kube-apiserver) with its command
#   tools/kubecluster/cluster.sh nodes DIR [--count N] [--gpus G] [--product P] [--mig PROFILE=N[,...]]
#                                [--prefix NAME] [--taint KEY=VALUE:EFFECT]
#                               add KWOK GPU nodes as GPU feature discovery and the device plugin leave them
#                               (defaults: 4 nodes gpu-node-0.. of 8 NVIDIA-H100-80GB-HBM3; with --mig the node
#                               is MIG-mixed: G-1 full GPUs and the slices of one GPU); KWOK keeps them Ready
#   export KUBECONFIG=DIR/admin.kubeconfig; DIR/bin/kubectl get nodes
# `start` refuses a DIR that holds an earlier cluster (its etcd data): certificates are made anew on every start,
# so the old nodes and objects would come back under a new CA and old kubeconfigs would stop working. Stop it and
# use a new DIR (or remove the old one).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:?usage: cluster.sh start|stop|restart|nodes DIR [COMPONENT | node options]}
dir=${2:?usage: cluster.sh start|stop|restart|nodes DIR [COMPONENT | node options]}
log() { printf '[kubecluster] %s\n' "$*" >&2; }

alive() { [ -f "$dir/pids/$1" ] && kill -0 "$(cat "$dir/pids/$1")" 2>/dev/null; }

launch() {  # launch NAME: run $dir/cmd/NAME in the background, output to $dir/logs/NAME.log
  local name=$1
  setsid bash "$dir/cmd/$name" >>"$dir/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$dir/pids/$name"
}

stop_one() {
  local name=$1 pid
  [ -f "$dir/pids/$name" ] || return 0
  pid=$(cat "$dir/pids/$name")
  # the recorded PID leads its own session (setsid): end that group only
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$dir/pids/$name"
}

wait_for() {  # wait_for WHAT SECONDS COMMAND...
  local what=$1 secs=$2; shift 2
  local end=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$end" ]; then log "timed out waiting for $what"; return 1; fi
    sleep 0.3
  done
}

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

case $cmd in
stop)
  for ((i=${#COMPONENTS[@]}-1; i>=0; i--)); do stop_one "${COMPONENTS[$i]}"; done
  exit 0 ;;
restart)
  c=${3:?component}
  stop_one "$c"; launch "$c"
  [ "$c" != kube-apiserver ] || wait_for "kube-apiserver" 120 "$dir/bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" get --raw /readyz
  exit 0 ;;
nodes)
  shift 2
  [ -f "$dir/admin.kubeconfig" ] || { log "$dir holds no cluster: run cluster.sh start $dir first"; exit 2; }
  # the options are checked before kubectl runs: a bad one is gpu_nodes.py's one line and exit 2, not kubectl's
  # "no objects passed to apply" after it
  list=$(python3 "$here/gpu_nodes.py" "$@") || exit 2
  printf '%s\n' "$list" | "$dir/bin/kubectl" --kubeconfig "$dir/admin.kubeconfig" apply -f - >&2
  exit 0 ;;
start)
  if [ -d "$dir/etcd" ] && [ -n "$(ls -A "$dir/etcd" 2>/dev/null)" ]; then
    for c in "${COMPONENTS[@]}"; do
      if alive "$c"; then log "$dir: the cluster is running (its $c is); export KUBECONFIG=$dir/admin.kubeconfig"; exit 2; fi
    done
    log "$dir holds a cluster from an earlier start (etcd data): start makes new certificates, so its old nodes"
    log "and objects would come back under a new CA and old kubeconfigs would stop working. Refusing: use a new"
    log "folder, or remove this one first (rm -rf $dir)."
    exit 2
  fi ;;
*) log "unknown command $cmd"; exit 2 ;;
esac

bin=$("$here/build.sh")
mkdir -p "$dir"/{pki,logs,pids,cmd,etcd}
dir=$(cd "$dir" && pwd)
ln -sfn "$bin" "$dir/bin"
free_ports() { python3 - "$1" <<'PY'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
read -r ETCD_PORT PEER_PORT API_PORT KWOK_PORT <<<"$(free_ports 4)"

# ---- certificates: one CA, the API server's serving cert, a client cert per component
pki=$dir/pki
ossl() { openssl "$@" 2>/dev/null; }
# The extensions a strict verifier asks for (Python >= 3.13 sets VERIFY_X509_STRICT by default, so Debian 13's
# Python refuses a CA without keyUsage and a leaf without an authority key id), as kubeadm's own PKI has them.
ossl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=gpudefrag-test-ca -keyout "$pki/ca.key" -out "$pki/ca.crt" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign,digitalSignature \
  -addext subjectKeyIdentifier=hash
cert() {  # cert NAME SUBJECT [SAN]
  local name=$1 subj=$2 san=${3:-}
  ossl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$pki/$name.key" -out "$pki/$name.csr"
  local ext="$pki/$name.ext"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n' > "$ext"
  printf 'subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid:always\n' >> "$ext"
  if [ -n "$san" ]; then printf 'extendedKeyUsage=serverAuth\nsubjectAltName=%s\n' "$san" >> "$ext"
  else printf 'extendedKeyUsage=clientAuth\n' >> "$ext"; fi
  ossl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 \
    -extfile "$ext" -out "$pki/$name.crt"
}
cert apiserver /CN=kube-apiserver \
  "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
cert admin "/O=system:masters/CN=gpudefrag-admin"
cert controller-manager /CN=system:kube-controller-manager
cert scheduler /CN=system:kube-scheduler
cert kwok "/O=system:masters/CN=kwok-controller"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"  # logs/exec on real nodes
ossl genrsa -out "$pki/sa.key" 2048
ossl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
chmod 600 "$pki"/*.key

server=https://127.0.0.1:$API_PORT
for who in admin controller-manager scheduler kwok; do
  kc="$dir/$who.kubeconfig"
  "$bin/kubectl" config set-cluster local --server="$server" --certificate-authority="$pki/ca.crt" \
    --embed-certs --kubeconfig="$kc" >/dev/null
  "$bin/kubectl" config set-credentials "$who" --client-certificate="$pki/$who.crt" \
    --client-key="$pki/$who.key" --embed-certs --kubeconfig="$kc" >/dev/null
  "$bin/kubectl" config set-context local --cluster=local --user="$who" --kubeconfig="$kc" >/dev/null
  "$bin/kubectl" config use-context local --kubeconfig="$kc" >/dev/null
done
chmod 600 "$dir"/*.kubeconfig

# ---- one command file per component (so `restart` runs the same command line)
cat > "$dir/cmd/etcd" <<CMD
exec "$bin/etcd" --name default --data-dir "$dir/etcd" --log-level warn --unsafe-no-fsync \\
  --listen-client-urls http://127.0.0.1:$ETCD_PORT --advertise-client-urls http://127.0.0.1:$ETCD_PORT \\
  --listen-peer-urls http://127.0.0.1:$PEER_PORT --initial-advertise-peer-urls http://127.0.0.1:$PEER_PORT \\
  --initial-cluster default=http://127.0.0.1:$PEER_PORT --listen-metrics-urls ''
CMD
# The API server's own record of each pod create, with microsecond times (requestReceivedTimestamp, and the
# stageTimestamp of ResponseComplete, after the object was stored): when a pod came to exist, without the
# client's side of the call. Only pod creates: a line per pod, nothing for the watches and status writes.
cat > "$dir/audit-policy.yaml" <<'YAML'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create]
  resources: [{group: "", resources: [pods]}]
- level: None
YAML
cat > "$dir/cmd/kube-apiserver" <<CMD
exec "$bin/kube-apiserver" --etcd-servers http://127.0.0.1:$ETCD_PORT \\
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port $API_PORT \\
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" --client-ca-file "$pki/ca.crt" \\
  --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \\
  --service-account-issuer https://kubernetes.default.svc --service-cluster-ip-range 10.0.0.0/24 \\
  --authorization-mode Node,RBAC --allow-privileged \\
  --enable-admission-plugins NamespaceLifecycle,LimitRanger,ServiceAccount,DefaultTolerationSeconds,Priority,ResourceQuota,NodeRestriction \\
  --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key" \\
  --kubelet-preferred-address-types InternalIP \\
  --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/logs/audit.log" --audit-log-format json \\
  --audit-log-maxsize 200 --audit-log-maxbackup 1 \\
  --profiling=false --max-requests-inflight 1000 --max-mutating-requests-inflight 500 -v 1
CMD
cat > "$dir/cmd/kube-controller-manager" <<CMD
exec "$bin/kube-controller-manager" --kubeconfig "$dir/controller-manager.kubeconfig" \\
  --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \\
  --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \\
  --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --use-service-account-credentials \\
  --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \\
  --controllers '*' \\
  --kube-api-qps 200 --kube-api-burst 400 --profiling=false -v 1
CMD
cat > "$dir/cmd/kube-scheduler" <<CMD
exec "$bin/kube-scheduler" --kubeconfig "$dir/scheduler.kubeconfig" \\
  --authentication-kubeconfig "$dir/scheduler.kubeconfig" --authorization-kubeconfig "$dir/scheduler.kubeconfig" \\
  --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false --profiling=false -v 1
CMD
cat > "$dir/cmd/kwok" <<CMD
exec "$bin/kwok" --kubeconfig "$dir/kwok.kubeconfig" --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \\
  --server-address 127.0.0.1:$KWOK_PORT --node-ip 127.0.0.1 --cidr 10.128.0.1/10 --node-lease-duration-seconds 40
CMD

kc=(--kubeconfig "$dir/admin.kubeconfig")
launch etcd
wait_for etcd 60 bash -c "exec 3<>/dev/tcp/127.0.0.1/$ETCD_PORT"
launch kube-apiserver
wait_for kube-apiserver 180 "$bin/kubectl" "${kc[@]}" get --raw /readyz || { tail -20 "$dir/logs/kube-apiserver.log" >&2; exit 1; }
launch kube-controller-manager
launch kube-scheduler
launch kwok
wait_for "the default ServiceAccount" 120 "$bin/kubectl" "${kc[@]}" -n default get serviceaccount default \
  || { tail -20 "$dir/logs/kube-controller-manager.log" >&2; exit 1; }
for c in "${COMPONENTS[@]}"; do alive "$c" || { log "$c exited; see $dir/logs/$c.log"; tail -20 "$dir/logs/$c.log" >&2; exit 1; }; done
cat > "$dir/env" <<ENV
KUBECONFIG=$dir/admin.kubeconfig
KUBE_BIN=$bin
KUBE_API=$server
ENV
log "control plane up at $server; export KUBECONFIG=$dir/admin.kubeconfig"
