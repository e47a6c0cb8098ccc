package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	apiserverPort = 6443
	etcdURL       = "http://127.0.0.1:2379"

	// DefaultServiceClusterIPRange is dual-stack, IPv4 primary.
	DefaultServiceClusterIPRange = "10.96.0.0/16,fd00:10:96::/112"
	// DefaultServiceNodePortRange holds >45,000 ports: room for 10,000
	// LoadBalancer Services with health-check node ports.
	DefaultServiceNodePortRange = "20000-65535"
	// DefaultReadyTimeout bounds the wait for etcd and for /readyz.
	DefaultReadyTimeout = 60 * time.Second
	// ServiceAccountIssuer is the issuer of ServiceAccount tokens.
	ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

	stopGrace = 10 * time.Second
)

// Options configures Start. The zero value is usable.
type Options struct {
	// Name of the control-plane network namespace; generated when empty.
	Name string
	// BinDir holds etcd and kube-apiserver; default $NNM_BIN_DIR, else <repo>/bin.
	BinDir string
	// DataDir holds etcd data, certificates, kubeconfigs and logs. When empty
	// a temporary directory is created and removed by Close; a given
	// directory is kept.
	DataDir string
	// ReadyTimeout bounds each readiness wait; default DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// ServiceClusterIPRange defaults to DefaultServiceClusterIPRange.
	ServiceClusterIPRange string
	// ServiceNodePortRange defaults to DefaultServiceNodePortRange.
	ServiceNodePortRange string
	// ExtraAPIServerArgs are appended to kube-apiserver's flags (later flags win).
	ExtraAPIServerArgs []string
	// Controllers also runs kube-controller-manager and kube-scheduler (from BinDir) and turns the
	// ServiceAccount admission plugin on: what a cluster with kubelets needs (DaemonSets scheduled,
	// ServiceAccounts and their token volumes, EndpointSlices, kube-root-ca.crt). The cluster lane
	// (e2e/cluster) sets it.
	Controllers bool
}

func (o *Options) setDefaults() {
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if o.ServiceClusterIPRange == "" {
		o.ServiceClusterIPRange = DefaultServiceClusterIPRange
	}
	if o.ServiceNodePortRange == "" {
		o.ServiceNodePortRange = DefaultServiceNodePortRange
	}
}

// ControlPlane is a running etcd + kube-apiserver pair. All methods are safe
// for concurrent use.
type ControlPlane struct {
	opts       Options
	bins       binaries
	id         string // random, names the host veth
	nsName     string
	dataDir    string
	ownDataDir bool
	creds      *credentials
	ownNetns   bool     // created by us, so Close deletes it
	hostLink   vethLink // root netns (local) <-> control-plane netns (peer)

	adminKubeconfig string
	adminConfig     *rest.Config
	adminClient     kubernetes.Interface

	mu        sync.Mutex
	etcd      *process
	apiserver *process
	// kube-controller-manager and kube-scheduler (Options.Controllers)
	controllers []*process
	nodes       map[string]*nodeConn // by node netns name
	nextNode    int                  // next /30 index in nodeLinkRange
	closed      bool
}

// nodeConn is the wiring of one node netns to the control plane.
type nodeConn struct {
	link       vethLink // control-plane netns (local) <-> node netns (peer)
	kubeconfig string   // admin kubeconfig usable inside the node netns
}

// Start creates the control-plane netns, starts etcd and kube-apiserver in
// it and returns once /readyz answers ok. On error everything created so far
// is removed again.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, err error) {
	opts.setDefaults()
	bins, err := findBinaries(opts.BinDir, opts.Controllers)
	if err != nil {
		return nil, err
	}
	if err := bins.removeStale(ctx); err != nil {
		return nil, fmt.Errorf("remove leftovers of earlier runs: %w", err)
	}
	c := &ControlPlane{opts: opts, bins: bins, nodes: map[string]*nodeConn{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	if err := c.prepare(ctx); err != nil {
		return nil, err
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.StartAPIServer(ctx); err != nil {
		return nil, err
	}
	if opts.Controllers {
		if err := c.startControllers(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// startControllers starts kube-controller-manager and kube-scheduler with the admin kubeconfig; the
// caller waits for what it needs of them (a Node's pods, a ServiceAccount).
func (c *ControlPlane) startControllers() error {
	kc := "--kubeconfig=" + c.adminKubeconfig
	for _, argv := range [][]string{
		{c.bins.controllerManager, kc, "--leader-elect=false", "--bind-address=127.0.0.1",
			"--use-service-account-credentials=false",
			// The token controller fills kubernetes.io/service-account-token Secrets; the root CA
			// is published to every namespace as kube-root-ca.crt (the Pods' token volumes).
			"--service-account-private-key-file=" + c.creds.saKey, "--root-ca-file=" + c.creds.caFile},
		{c.bins.scheduler, kc, "--leader-elect=false", "--bind-address=127.0.0.1"},
	} {
		name := filepath.Base(argv[0])
		p, err := startProcess(c.nsName, name, c.logPath(name), argv)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.controllers = append(c.controllers, p)
		c.mu.Unlock()
	}
	return nil
}

// prepare creates the data dir, credentials, netns and host link, and the
// admin kubeconfig and client.
func (c *ControlPlane) prepare(ctx context.Context) error {
	id, err := randomHex(3)
	if err != nil {
		return err
	}
	c.id = id
	c.nsName = c.opts.Name
	if c.nsName == "" {
		c.nsName = generatedNetnetns(id)
	}
	if err := c.makeDataDir(); err != nil {
		return err
	}
	if c.creds, err = writeCredentials(c.dataDir, c.opts.ServiceClusterIPRange); err != nil {
		return err
	}
	if netns.Exists(c.nsName) {
		return fmt.Errorf("network namespace %q already exists", c.nsName)
	}
	if err := netns.Create(ctx, c.nsName); err != nil {
		return fmt.Errorf("create control-plane netns: %w", err)
	}
	c.ownNetns = true
	prefix, err := c.bins.pickHostLinkPrefix(ctx)
	if err != nil {
		return err
	}
	link := vethLink{local: hostVethName(id), peerNS: c.nsName, peer: "host0", prefix: prefix}
	if err := c.bins.createVeth(ctx, link); err != nil {
		return fmt.Errorf("create host link: %w", err)
	}
	c.hostLink = link
	c.adminKubeconfig = filepath.Join(c.dataDir, "kubeconfigs", "admin.yaml")
	if err := writeKubeconfig(c.adminKubeconfig, c.Server(), c.creds.caPEM, "nnm-admin", c.creds.adminToken); err != nil {
		return err
	}
	c.adminConfig = restConfig(c.Server(), c.creds.caPEM, c.creds.adminToken)
	if c.adminClient, err = kubernetes.NewForConfig(c.adminConfig); err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	return nil
}

func (c *ControlPlane) makeDataDir() error {
	if c.opts.DataDir != "" {
		c.dataDir = c.opts.DataDir
		return os.MkdirAll(c.dataDir, 0o700)
	}
	dir, err := os.MkdirTemp("", c.nsName+"-")
	if err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	c.dataDir, c.ownDataDir = dir, true
	return nil
}

func (c *ControlPlane) startEtcd(ctx context.Context) error {
	p, err := startProcess(c.nsName, "etcd", c.logPath("etcd"), c.etcdArgs())
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.etcd = p
	c.mu.Unlock()
	url, client := c.Etcd()
	client.Timeout = 2 * time.Second
	return c.waitReady(ctx, p, client, url+"/health", nil)
}

// Etcd returns etcd's client URL and an HTTP client that reaches it inside the control plane's
// netns: etcd's JSON gateway (/v3/kv/...), for writing objects past the apiserver in bulk.
func (c *ControlPlane) Etcd() (string, *http.Client) {
	return etcdURL, &http.Client{Transport: &http.Transport{DialContext: netns.DialContext(netns.Path(c.nsName), nil)}}
}

func (c *ControlPlane) etcdArgs() []string {
	peer := "http://127.0.0.1:2380"
	return []string{
		c.bins.etcd,
		"--name=nnm",
		"--data-dir=" + filepath.Join(c.dataDir, "etcd"),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=nnm=" + peer,
		"--log-level=warn",
		"--unsafe-no-fsync=true", // throw-away data: speed over durability
	}
}

func (c *ControlPlane) apiserverArgs() []string {
	cr := c.creds
	args := []string{
		c.bins.apiserver,
		"--etcd-servers=" + etcdURL,
		"--bind-address=0.0.0.0",
		"--secure-port=" + strconv.Itoa(apiserverPort),
		// A non-loopback address: loopback ones are invalid in the
		// default/kubernetes endpoints the apiserver maintains.
		"--advertise-address=" + c.hostLink.peerIP().String(),
		"--cert-dir=" + filepath.Join(c.dataDir, "apiserver-certs"),
		"--tls-cert-file=" + cr.tlsCert,
		"--tls-private-key-file=" + cr.tlsKey,
		"--token-auth-file=" + cr.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + cr.saKey,
		"--service-account-signing-key-file=" + cr.saKey,
		"--service-cluster-ip-range=" + c.opts.ServiceClusterIPRange,
		"--service-node-port-range=" + c.opts.ServiceNodePortRange,
		"--profiling=false",
	}
	if !c.opts.Controllers {
		// No token controller runs, so pods must not require one.
		args = append(args, "--disable-admission-plugins=ServiceAccount")
	}
	return append(args, c.opts.ExtraAPIServerArgs...)
}

// StartAPIServer starts kube-apiserver (again) against the running etcd and
// waits until /readyz is ok. It is an error if it already runs.
func (c *ControlPlane) StartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errors.New("control plane is closed")
	}
	if c.apiserver != nil && c.apiserver.exitError() == nil {
		c.mu.Unlock()
		return errors.New("kube-apiserver is already running")
	}
	p, err := startProcess(c.nsName, "kube-apiserver", c.logPath("kube-apiserver"), c.apiserverArgs())
	if err == nil {
		c.apiserver = p
	}
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.waitReady(ctx, p, c.readyzClient(), c.Server()+"/readyz", map[string]string{"Authorization": "Bearer " + c.creds.adminToken})
}

// StopAPIServer stops kube-apiserver only; etcd and all data stay. Use
// StartAPIServer to bring it back (an apiserver outage).
func (c *ControlPlane) StopAPIServer() error {
	c.mu.Lock()
	p := c.apiserver
	c.apiserver = nil
	c.mu.Unlock()
	if p == nil {
		return errors.New("kube-apiserver is not running")
	}
	p.stop(stopGrace)
	return nil
}

func (c *ControlPlane) readyzClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.creds.caPEM)
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: serverName},
			DisableKeepAlives: true,
		},
	}
}

// waitReady polls url until it answers 200, the process exits, or the
// timeout passes; errors carry the last answer and the component's log tail.
func (c *ControlPlane) waitReady(ctx context.Context, p *process, client *http.Client, url string, header map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	last := "no answer yet"
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := p.exitError(); err != nil {
			return err
		}
		ok, status := probe(ctx, client, url, header)
		if ok {
			return nil
		}
		last = status
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v (%v); last probe of %s: %s\n%s",
				p.name, c.opts.ReadyTimeout, ctx.Err(), url, last, p.logTail())
		case <-tick.C:
		}
	}
}

func probe(ctx context.Context, client *http.Client, url string, header map[string]string) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode == http.StatusOK, fmt.Sprintf("%s: %s", resp.Status, body)
}

// ConnectNamespace wires the node netns nodeNS (a name under /run/netns, as
// created by `ip netns add`) to the control plane with a veth pair and
// returns the path of an admin kubeconfig that works from inside nodeNS.
// Calling it again for the same namespace returns the same kubeconfig.
func (c *ControlPlane) ConnectNamespace(nodeNS string) (string, error) {
	conn, err := c.connect(nodeNS)
	if err != nil {
		return "", err
	}
	return conn.kubeconfig, nil
}

// nodeServer is the apiserver URL as seen from inside nodeNS.
func (c *ControlPlane) nodeServer(nodeNS string) (string, error) {
	conn, err := c.connect(nodeNS)
	if err != nil {
		return "", err
	}
	return serverURL(conn.link.localIP()), nil
}

func (c *ControlPlane) connect(nodeNS string) (*nodeConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("control plane is closed")
	}
	if conn, ok := c.nodes[nodeNS]; ok {
		return conn, nil
	}
	if nodeNS == "" || nodeNS == c.nsName || !netns.Exists(nodeNS) {
		return nil, fmt.Errorf("connect node: network namespace %q not found in /run/netns", nodeNS)
	}
	ctx := context.Background()
	prefix, next, err := c.bins.pickNodeLinkPrefix(ctx, c.nsName, nodeNS, c.nextNode)
	if err != nil {
		return nil, err
	}
	link := vethLink{
		localNS: c.nsName, local: "node" + strconv.Itoa(next-1),
		peerNS: nodeNS, peer: hostVethName(c.id),
		prefix: prefix,
	}
	if err := c.bins.createVeth(ctx, link); err != nil {
		return nil, fmt.Errorf("connect node netns %q: %w", nodeNS, err)
	}
	c.nextNode = next
	conn := &nodeConn{link: link, kubeconfig: filepath.Join(c.dataDir, "kubeconfigs", sanitize("admin@"+nodeNS)+".yaml")}
	if err := writeKubeconfig(conn.kubeconfig, serverURL(link.localIP()), c.creds.caPEM, "nnm-admin", c.creds.adminToken); err != nil {
		return nil, errors.Join(err, c.bins.deleteVeth(ctx, link))
	}
	c.nodes[nodeNS] = conn
	return conn, nil
}

// DisconnectNamespace removes the veth pair ConnectNamespace created (for a
// node netns that is about to be deleted it is not needed: deleting either
// namespace removes the pair).
func (c *ControlPlane) DisconnectNamespace(nodeNS string) error {
	c.mu.Lock()
	conn, ok := c.nodes[nodeNS]
	delete(c.nodes, nodeNS)
	c.mu.Unlock()
	if !ok {
		return nil
	}
	return c.bins.deleteVeth(context.Background(), conn.link)
}

func serverURL(ip netip.Addr) string {
	return "https://" + netip.AddrPortFrom(ip, apiserverPort).String()
}

// APIServerPID is the pid of the running kube-apiserver (its /proc/<pid> has the apiserver's own
// memory and CPU: `ip netns exec` execs it), 0 when it does not run.
func (c *ControlPlane) APIServerPID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.apiserver == nil || c.apiserver.exitError() != nil {
		return 0
	}
	return c.apiserver.cmd.Process.Pid
}

// Server is the apiserver URL reachable from the root netns.
func (c *ControlPlane) Server() string { return serverURL(c.hostLink.peerIP()) }

// Netns is the name of the control plane's network namespace.
func (c *ControlPlane) Netns() string { return c.nsName }

// DataDir holds etcd data, credentials, kubeconfigs and the component logs
// (etcd.log, kube-apiserver.log).
func (c *ControlPlane) DataDir() string { return c.dataDir }

// AdminKubeconfig is the path of a system:masters kubeconfig usable from the
// root netns.
func (c *ControlPlane) AdminKubeconfig() string { return c.adminKubeconfig }

// AdminRESTConfig returns a copy of the admin client configuration.
func (c *ControlPlane) AdminRESTConfig() *rest.Config { return rest.CopyConfig(c.adminConfig) }

// AdminClient is a clientset authenticated as system:masters.
func (c *ControlPlane) AdminClient() kubernetes.Interface { return c.adminClient }

// CACert is the PEM CA certificate that signed the apiserver's serving
// certificate (verify with server name "kubernetes").
func (c *ControlPlane) CACert() []byte { return c.creds.caPEM }

func (c *ControlPlane) logPath(component string) string {
	return filepath.Join(c.dataDir, component+".log")
}

// Stop is Close.
func (c *ControlPlane) Stop() error { return c.Close() }

// Close stops kube-apiserver and etcd, deletes the veth pairs and the
// control-plane netns and, unless Options.DataDir was given, the data dir.
// It is safe to call more than once.
func (c *ControlPlane) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	apiserver, etcd, nodes, controllers := c.apiserver, c.etcd, c.nodes, c.controllers
	c.apiserver, c.etcd, c.nodes, c.controllers = nil, nil, nil, nil
	c.mu.Unlock()

	for _, p := range controllers {
		p.stop(stopGrace)
	}
	apiserver.stop(stopGrace)
	etcd.stop(stopGrace)
	ctx := context.Background()
	var errs []error
	for _, n := range nodes {
		errs = append(errs, c.bins.deleteVeth(ctx, n.link))
	}
	if c.hostLink.local != "" {
		errs = append(errs, c.bins.deleteVeth(ctx, c.hostLink))
	}
	if c.ownNetns {
		errs = append(errs, netns.Delete(ctx, c.nsName))
	}
	if c.ownDataDir {
		errs = append(errs, os.RemoveAll(c.dataDir))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("control plane cleanup: %w", err)
	}
	return nil
}
