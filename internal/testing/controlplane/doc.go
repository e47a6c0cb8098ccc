// Package controlplane runs a real, throw-away Kubernetes control plane
// (etcd + kube-apiserver, no controllers, no kubelet) for tests and the demo.
//
// Topology. Both components run inside a network namespace of their own
// (named "nnm-cp-<pid>-<rand>" unless Options.Name is set):
//
//	root netns                       control-plane netns                 node netns (per test)
//	+-----------+  198.19.a.b/30    +---------------------------+  198.18.c.d/30  +----------+
//	| test proc |<----------------->| etcd      127.0.0.1:2379  |<--------------->| agent    |
//	| (client)  |  veth "nnmcp<id>" | apiserver 0.0.0.0:6443    |  veth per node  |          |
//	+-----------+                   +---------------------------+                 +----------+
//
// The test process reaches the apiserver over one veth pair between the root
// namespace and the control-plane namespace (AdminKubeconfig, AdminClient).
// Agents under test run in "node" namespaces created by other tests;
// ConnectNamespace wires one more veth pair per node namespace and returns a
// kubeconfig that works from inside it. Addresses come from the benchmark
// range 198.18.0.0/15 (RFC 2544), never a real network: 198.19.0.0/16 for the
// host link (a random /30 not overlapping any route already in the root
// namespace) and 198.18.0.0/16 for node links (sequential /30s that do not
// overlap routes of the node namespace). No host link other than the veth
// created here is touched, and no sysctl or netfilter rule is changed.
//
// TLS. A per-instance CA signs the apiserver's serving certificate for the
// name "kubernetes"; kubeconfigs carry that CA and set tls-server-name, so
// clients verify the server although they dial it by varying IP addresses.
//
// Authentication. A static token file holds an admin token (group
// system:masters); ServiceAccount tokens minted via the TokenRequest API work
// too (the signing key is generated per instance), and authorization is RBAC,
// so a ServiceAccount without bindings is denied.
//
// There is no kube-controller-manager: nothing creates default
// ServiceAccounts, EndpointSlices or finishes namespace deletion. The
// ServiceAccount admission plugin is disabled for that reason.
package controlplane
