package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hostileServices is a `plan` file with what kube-apiserver would refuse or an attacker would try:
// a Service whose name carries a quote, a backslash and a newline beside an ordinary one, and
// LoadBalancer ingress IPs that must never be DNATed (loopback, the cloud metadata address, a pod-CIDR
// address, IPv6 link-local and multicast).
const hostileServices = `apiVersion: v1
kind: Node
metadata:
  name: node-1
spec:
  podCIDRs: [10.244.1.0/24, "fd00:10:244:1::/64"]
---
apiVersion: v1
kind: Service
metadata:
  name: "we\"ird\\name\nx"
  namespace: "o'dd"
spec:
  type: LoadBalancer
  clusterIPs: [10.96.0.20]
  ports: [{name: http, protocol: TCP, port: 80}]
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.20}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.0.10, "fd00:10:96::a"]
  ports: [{name: http, protocol: TCP, port: 80}]
status:
  loadBalancer:
    ingress: [{ip: 203.0.113.10}, {ip: 127.0.0.1}, {ip: 169.254.169.254}, {ip: 10.244.1.9}, {ip: "fe80::1"}, {ip: "ff02::1"}, {ip: "2001:db8::10"}]
`

// `plan` with one Service of an odd name still prints every fix for both backends (the nftables
// backend refused the whole fix for one comment), and shows the special addresses only as skipped.
func TestPlanHostileServices(t *testing.T) {
	file := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(file, []byte(hostileServices), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := runCmd(t, "plan", "--services", file, "--proxy-mode", "ipvs")
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	for _, want := range []string{
		"# ---- backend nftables, fix ipvs-externalip-dnat, family ipv4",
		`203.0.113.20 . tcp . 80 comment "o'dd/we'ird/name?x:http" : 10.96.0.20 . 80`,
		`203.0.113.10 . tcp . 80 comment "default/web:http" : 10.96.0.10 . 80`,
		`2001:db8::10 . tcp . 80 comment "default/web:http" : fd00:10:96::a . 80`,
		"# ---- backend iptables, fix ipvs-externalip-dnat, family ipv4",
		// A map entry's iptables rule carries no comment (f138994); the name is in the nftables
		// element's comment above.
		`-d 203.0.113.20/32 -p tcp -m tcp --dport 80 -m connlabel --label `,
		"# skipped default/web: special-address",
		"# skipped default/web: pod-cidr",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q", want)
		}
	}
	for _, never := range []string{"127.0.0.1 .", "169.254.169.254 .", "10.244.1.9 .", "fe80::1 .", "ff02::1 .", "-d 127.0.0.1", "-d 169.254.169.254", "-d fe80::1", "-d ff02::1"} {
		if strings.Contains(out, never) {
			t.Errorf("plan output programs %q", never)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}
