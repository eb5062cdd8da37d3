# Sourced by ./up and ./down: the node of `up --node`. containerd (bridge CNI with gatehouse-ipam,
# host-local as its fallback) and a kubelet registered as one node, kube-scheduler, and the network they live on: a bridge of the
# harness's own (gatehouse0, 10.244.0.0/24) whose gateway address the API server binds, and one DNAT
# rule on that bridge standing in for kube-proxy's rule for the `kubernetes` Service (10.0.0.1:443),
# so Pods reach the API server the way they do in any cluster. Nothing is bound or rewritten outside
# that bridge. Everything else lives under $state/node.
#
# Expects: $state, log, start, wait_for, kubeconfig, $pki.

node_name=gatehouse-node
node_bridge=gatehouse0
node_cidr=10.244.0.0/24
node_gateway=10.244.0.1
node_service_ip=10.0.0.1 # the `kubernetes` Service: first address of --service-cluster-ip-range
node_pause_image=docker.io/library/gatehouse-test-pause:1
node_busybox_image=docker.io/library/gatehouse-test-busybox:1
node_dnat_comment="gatehouse test node: kubernetes Service"

node_packages() { # installs what the node needs from Debian
  local missing=()
  command -v containerd >/dev/null 2>&1 || missing+=(containerd)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v buildah >/dev/null 2>&1 || missing+=(buildah)
  # The images need busybox-static's binary (ldd refuses a static executable).
  [ -x /bin/busybox ] && /bin/busybox sleep 0 && ! ldd /bin/busybox >/dev/null 2>&1 || missing+=(busybox-static)
  command -v iptables >/dev/null 2>&1 || missing+=(iptables)
  command -v ip >/dev/null 2>&1 || missing+=(iproute2)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}") >&2
  fi
}

node_network_up() { # the bridge (the API server binds its gateway address) and the Service DNAT
  ip link show "$node_bridge" >/dev/null 2>&1 || ip link add "$node_bridge" type bridge
  ip addr replace "$node_gateway/24" dev "$node_bridge"
  ip link set "$node_bridge" up
}

node_dnat() { # node_dnat -A|-D API_PORT: the kube-proxy stand-in for the `kubernetes` Service
  iptables -t nat "$1" PREROUTING -i "$node_bridge" -d "$node_service_ip/32" -p tcp --dport 443 \
    -m comment --comment "$node_dnat_comment" -j DNAT --to-destination "$node_gateway:$2"
}

node_image() { # node_image NAME ROOTFS ENTRYPOINT_JSON USER [CMD_JSON]: builds NAME from ROOTFS, imports it
  local name=$1 rootfs=$2 entrypoint=$3 user=$4 archive ctr
  archive="$state/node/images/$(echo "$name" | tr '/:' '__').tar"
  mkdir -p "$state/node/images"
  ctr=$(buildah --storage-driver vfs from scratch)
  buildah --storage-driver vfs copy "$ctr" "$rootfs" / >/dev/null
  buildah --storage-driver vfs config --entrypoint "$entrypoint" --user "$user" "$ctr"
  [ -z "${5:-}" ] || buildah --storage-driver vfs config --cmd "$5" "$ctr"
  buildah --storage-driver vfs commit --quiet "$ctr" "$name" >/dev/null
  buildah --storage-driver vfs rm "$ctr" >/dev/null
  rm -f "$archive"
  buildah --storage-driver vfs push --quiet "$name" "oci-archive:$archive:$name" >/dev/null
  ctr --address "$state/node/containerd.sock" -n k8s.io images import --all-platforms "$archive" >/dev/null
  # Listed first, then searched: `grep -q` quitting early would make ctr die of SIGPIPE.
  local images
  images=$(ctr --address "$state/node/containerd.sock" -n k8s.io images ls -q)
  grep -qx "$name" <<<"$images" || { log "image $name was not imported"; return 1; }
}

node_base_images() { # the pause image and a busybox image for test Pods, from busybox-static
  local rootfs="$state/node/busybox-rootfs"
  rm -rf "$rootfs"
  mkdir -p "$rootfs/bin" "$rootfs/tmp"
  cp /bin/busybox "$rootfs/bin/busybox"
  local applet
  for applet in sh sleep cat echo ls wget nc true; do ln -s busybox "$rootfs/bin/$applet"; done
  # The pause process only holds the sandbox's namespaces until it is killed.
  node_image "$node_pause_image" "$rootfs" '["/bin/sleep", "2147483647"]' 0:0
  node_image "$node_busybox_image" "$rootfs" '["/bin/sh"]' 0:0
}

node_containerd_config() {
  local dir="$state/node" plugin
  mkdir -p "$dir/cni" "$dir/containerd" "$dir/cni-bin"
  # The node's CNI binary directory: Debian's plugins, and gatehouse-ipam once config/cni's
  # DaemonSet has copied it there (the node tests install it the way users do).
  for plugin in /usr/lib/cni/*; do ln -sfn "$plugin" "$dir/cni-bin/$(basename "$plugin")"; done
  # Every Pod goes through gatehouse-ipam: a Pod Gatehouse gave an address gets it, any other
  # (Gatehouse's own, system Pods) gets one from host-local. A bridge holds one IPv4 subnet, so
  # both share the node's: host-local the lower half, Gatehouse's pool (ippool.yaml) the upper.
  cat >"$dir/cni/10-gatehouse.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "gatehouse-test",
  "plugins": [
    {
      "type": "bridge", "bridge": "$node_bridge", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "capabilities": {"io.kubernetes.cri.pod-annotations": true},
      "ipam": {
        "type": "gatehouse-ipam",
        "fallback": {
          "type": "host-local", "dataDir": "$dir/cni-ipam",
          "ranges": [[{"subnet": "$node_cidr", "gateway": "$node_gateway", "rangeStart": "10.244.0.2", "rangeEnd": "10.244.0.127"}]],
          "routes": [{"dst": "0.0.0.0/0"}]
        }
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  # The sample pool pods-v4 as this node can route it: 32 addresses of the node's subnet
  # (10.244.0.128/27), beside host-local's range, with the bridge's gateway.
  cat >"$dir/ippool.yaml" <<EOF
apiVersion: gatehouse.dev/v1alpha1
kind: IPPool
metadata:
  name: pods-v4
spec:
  cidr: $node_cidr
  exclude: ["10.244.0.0/25", "10.244.0.160/27", "10.244.0.192/26"]
  gateway: $node_gateway
  routes:
  - dst: 0.0.0.0/0
EOF
  # How the node tests and the demo install Gatehouse: config/default with config/cni, the
  # DaemonSet writing to this node's binary directory.
  mkdir -p "$dir/install"
  cat >"$dir/install/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../../../../config/default
components:
- ../../../../config/cni
patches:
- target: {kind: DaemonSet, name: gatehouse-cni}
  patch: |-
    - op: replace
      path: /spec/template/spec/volumes/0/hostPath/path
      value: $dir/cni-bin
EOF
  # containerd's defaults, with its state under $dir and three changes: cgroupfs, our CNI, and
  # restrict_oom_score_adj (processes here lack CAP_SYS_RESOURCE: a negative oom_score_adj for the
  # sandbox is refused and every Pod fails with runc's "can't get final child's PID from pipe").
  containerd config default | python3 -c '
import re, sys
dir, pause = sys.argv[1], sys.argv[2]
s = sys.stdin.read()
subs = [
    (r"(?m)^root = .*$", f"root = \"{dir}/containerd/root\""),
    (r"(?m)^state = .*$", f"state = \"{dir}/containerd/state\""),
    (r"(?m)^(\[grpc\]\n(?:  .*\n)*?)  address = .*$", lambda m: m.group(1) + f"  address = \"{dir}/containerd.sock\""),
    (r"restrict_oom_score_adj = false", "restrict_oom_score_adj = true"),
    (r"sandbox_image = .*", f"sandbox_image = \"{pause}\""),
    (r"bin_dir = .*", f"bin_dir = \"{dir}/cni-bin\""),
    (r"conf_dir = .*", f"conf_dir = \"{dir}/cni\""),
    (r"(?m)^(  \[plugins.\"io.containerd.internal.v1.opt\"\]\n    path = ).*$", lambda m: m.group(1) + f"\"{dir}/containerd/opt\""),
]
for pattern, repl in subs:
    s, n = re.subn(pattern, repl, s, count=1)
    if n != 1:
        sys.exit(f"containerd config: no match for {pattern}")
if "SystemdCgroup = true" in s:
    sys.exit("containerd config: the runc runtime must use cgroupfs (SystemdCgroup = false)")
print(s)
' "$dir" "$node_pause_image" >"$dir/containerd.toml"
}

node_kubelet_config() { # node_kubelet_config PORT HEALTHZ_PORT
  cat >"$state/node/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# /sys/fs/cgroup is cgroup v1 on these machines; containerd runs with cgroupfs as well.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: unix://$state/node/containerd.sock
address: $node_gateway
port: $1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $2
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
# A shared test machine: never evict or collect images because its disk is fuller than a node's.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
registerNode: true
resolvConf: /etc/resolv.conf
EOF
}

node_start() { # node_start API_PORT KUBELET_PORT KUBELET_HEALTHZ_PORT
  local api_port=$1
  mkdir -p "$state/node"
  node_containerd_config
  start containerd --config "$state/node/containerd.toml"
  running+=(containerd)
  wait_for "containerd" ctr --address "$state/node/containerd.sock" version
  node_base_images
  node_dnat -A "$api_port"

  (
    cd "$pki"
    issue kubelet "/O=system:nodes/CN=system:node:$node_name" "$client_ext"
    issue scheduler "/CN=system:kube-scheduler" "$client_ext"
  )
  kubeconfig "system:node:$node_name" "$pki/kubelet.crt" "$pki/kubelet.key" "$state/kubelet.kubeconfig"
  kubeconfig system:kube-scheduler "$pki/scheduler.crt" "$pki/scheduler.key" "$state/scheduler.kubeconfig"

  start kube-scheduler --kubeconfig="$state/scheduler.kubeconfig" --leader-elect=false --secure-port=0
  running+=(kube-scheduler)

  node_kubelet_config "$2" "$3"
  start kubelet \
    --config="$state/node/kubelet.yaml" \
    --kubeconfig="$state/kubelet.kubeconfig" \
    --hostname-override="$node_name" \
    --node-ip="$node_gateway" \
    --root-dir="$state/node/kubelet" \
    --cert-dir="$state/node/kubelet/pki"
  running+=(kubelet)
  wait_for "node $node_name Ready" "$state/bin/kubectl" --kubeconfig "$state/kubeconfig" wait \
    --for=condition=Ready "node/$node_name" --timeout=2s
}

node_sandbox_netns() { # prints the network namespaces of our containerd's Pod sandboxes
  local ctr_cmd=(ctr --address "$state/node/containerd.sock" -n k8s.io) id
  for id in $("${ctr_cmd[@]}" containers ls -q 2>/dev/null); do
    "${ctr_cmd[@]}" containers info "$id" 2>/dev/null | python3 -c '
import json, sys
spec = json.load(sys.stdin).get("Spec") or {}
for ns in (spec.get("linux") or {}).get("namespaces") or []:
    if ns.get("type") == "network" and ns.get("path", "").startswith("/var/run/netns/"):
        print(ns["path"].rsplit("/", 1)[1])
' || true
  done | sort -u
}

node_stop_containers() { # kills every task of our containerd, drops the sandboxes' network namespaces
  local sock="$state/node/containerd.sock" ctr_cmd id ns
  [ -S "$sock" ] || return 0
  ctr_cmd=(ctr --address "$sock" -n k8s.io)
  mapfile -t netns < <(node_sandbox_netns)
  for id in $("${ctr_cmd[@]}" tasks ls -q 2>/dev/null); do
    "${ctr_cmd[@]}" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
  done
  for id in $("${ctr_cmd[@]}" tasks ls -q 2>/dev/null); do
    "${ctr_cmd[@]}" tasks delete -f "$id" >/dev/null 2>&1 || true
  done
  for ns in "${netns[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
}

node_network_down() { # node_network_down: the DNAT rules and the bridge
  local rules rule
  rules=$(iptables -t nat -S PREROUTING 2>/dev/null | grep -F -- "--comment \"$node_dnat_comment\"" || true)
  while IFS= read -r rule; do
    [ -n "$rule" ] && eval "iptables -t nat ${rule/-A /-D }" || true
  done <<<"$rules"
  ip link show "$node_bridge" >/dev/null 2>&1 && ip link delete "$node_bridge" || true
}

node_unmount() { # unmounts whatever the kubelet and containerd left mounted under $state
  local m
  for m in $(awk -v p="$state/" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
}
