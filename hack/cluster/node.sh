#!/bin/sh
# One node of the cluster lane (e2e/cluster), run by the VM lane's initramfs (hack/vm/init.sh) as
# root inside the guest, with this machine's root, shared read-only, as its root (nnm.root=switch:
# runc's exec into a container needs a real root, not a chroot): every binary comes
# from the host's files (kubelet and kube-proxy from bin/, containerd, runc and the CNI plugins
# from Debian's packages). The test's per-node directory is shared writable as 9p tag "nnmshare":
# it holds node.env (written by the test) and receives every component's log.
#
# It makes what a node needs writable (tmpfs /var and /etc/nnm-cluster; /run is the initramfs's
# tmpfs), mounts cgroup v2, configures eth0 on the test's bridge and the routes to the other nodes'
# pod CIDRs, imports the lane's own images into containerd (pause, workload), trusts the lane's
# registry (REGISTRY, its CA REGISTRY_CA), from which the kubelet pulls the agent's image, and starts
# containerd, kubelet and kube-proxy. A shell on TCP port 2222 (busybox nc) lets the test run
# commands on the node.
set -eu
SHARE=/run/nnm-share
mkdir -p "$SHARE"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 nnmshare "$SHARE"
exec >>"$SHARE/node.log" 2>&1
set -x
. "$SHARE/node.env"
: "$NODE_NAME" "$NODE_IP" "$GATEWAY" "$POD_CIDR" "$CLUSTER_CIDR" "$PROXY_MODE" "$BIN" "$IMAGES" "$PAUSE_IMAGE" "$REGISTRY" "$REGISTRY_CA"

mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tmpfs -o mode=0755 var /var
mkdir -p /var/lib /var/log /var/tmp /run/containerd /run/cni/net.d
hostname "$NODE_NAME"

ip addr flush dev eth0
ip addr add "$NODE_IP/24" dev eth0
ip link set eth0 up
ip route add default via "$GATEWAY"
for r in $ROUTES; do ip route add "${r%@*}" via "${r#*@}"; done
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1

cat >/run/cni/net.d/10-nnm.conflist <<CNI
{"cniVersion": "1.0.0", "name": "nnm", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "/run/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
CNI
cat >/run/containerd/config.toml <<TOML
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/run/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry.configs."$REGISTRY".tls]
    ca_file = "$REGISTRY_CA"
TOML
containerd --config /run/containerd/config.toml >"$SHARE/containerd.log" 2>&1 &
i=0
until ctr --address /run/containerd/containerd.sock version >/dev/null 2>&1; do
	i=$((i + 1)); [ "$i" -lt 300 ] || { echo "containerd did not start"; exit 1; }
	sleep 1
done
for img in $IMAGES; do
	ctr --address /run/containerd/containerd.sock -n k8s.io images import "$img"
done
ctr --address /run/containerd/containerd.sock -n k8s.io images ls -q
echo "NNM-NODE-IMAGES-IMPORTED"

mkdir -p /var/lib/kubelet
cat >/var/lib/kubelet/config.yaml <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: true
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
# The node's disk is tmpfs and its memory small: no eviction, no image GC, during a test run.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
localStorageCapacityIsolation: false
serializeImagePulls: false
resolvConf: /etc/resolv.conf
maxPods: 30
YAML
"$BIN/kubelet" --config=/var/lib/kubelet/config.yaml --kubeconfig="$SHARE/kubeconfig" \
	--hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=2 >"$SHARE/kubelet.log" 2>&1 &
"$BIN/kube-proxy" --kubeconfig="$SHARE/kubeconfig" --proxy-mode="$PROXY_MODE" --hostname-override="$NODE_NAME" \
	--cluster-cidr="$CLUSTER_CIDR" --v=2 >"$SHARE/kube-proxy.log" 2>&1 &
busybox nc -ll -p 2222 -e /bin/sh &
echo "NNM-NODE-STARTED"
wait
