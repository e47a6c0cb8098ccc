package main

// The fleet benchmark's child: one process that runs K simulated "node agents" at once against the
// control plane, each with its own API client, transport and TCP connection, and reports what they
// asked of the API server (requests by class, 429s, retries per 100 ms) and what it sent them (bytes
// read from the TCP connection, TLS included). The parent (fleet.go) measures the apiserver itself.
//
// Kinds:
//   - agent: the agent's own watch code: agent.RestConfig (protobuf, QPS 20, burst 40, its user
//     agent), kube.New, a watch.Hub with its WrapTransport, and the inputs the default fix set reads
//     on an IPVS node (ipvs-external-ip-dnat reads Services, this Node and its pod CIDRs,
//     ServiceCIDRs), started as the engine starts them (Input.Start); their transforms shrink each
//     object before the cache keeps it, and client-go's reflector streams the first list
//     (WatchListClient).
//   - agent-json: the same with the JSON content type (what protobuf saves).
//   - kube-proxy: kube-proxy v1.36's informers, reproduced from cmd/kube-proxy/app/server.go and
//     pkg/proxy/node.go (importing k8s.io/kubernetes into this module is impractical): a clientset with
//     protobuf and kube-proxy's default QPS 5 / burst 10; Services with the label selector
//     !service.kubernetes.io/service-proxy-name and the field selector spec.clusterIP!=None;
//     EndpointSlices with !service.kubernetes.io/headless; ServiceCIDRs; this Node by name; resync
//     15 min (ConfigSyncPeriod); no transforms.
//   - list, list-json: one plain LIST of every Service (no resourceVersion, no limit: what an
//     informer without a streaming list, or kubectl get, asks), protobuf or JSON.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/inputs/node"
	"github.com/network-node-manager/network-node-manager/internal/inputs/servicecidrs"
	"github.com/network-node-manager/network-node-manager/internal/inputs/services"
	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// fleetChildEnv makes the bench binary (or the test binary) the fleet child; its value is a
// fleetSpec in JSON.
const fleetChildEnv = "NNM_BENCH_FLEET_CHILD"

// fleetProfileEnv names a file for the child's CPU profile (until it quits).
const fleetProfileEnv = "NNM_BENCH_FLEET_CPUPROFILE"

type fleetSpec struct {
	Kind       string
	K          int
	Kubeconfig string
	// SyncTimeout bounds the wait for every member's first list.
	SyncTimeout time.Duration
	// Bin is the program to run as the child ("": this one).
	Bin string `json:"-"`
}

// fleetEvent is a line the child prints (JSON): "synced" once every member synced (or the timeout
// passed), "stats" and "marker" on request.
type fleetEvent struct {
	Event string
	K     int
	// Informers each member runs (relists per informer = Relists / (K × Informers)).
	Informers int
	Synced    int
	// SyncP50, SyncMax: seconds from the child's start (or since the last mark) to members' sync.
	SyncP50, SyncMax float64
	// MinObjects is the fewest Services one member's cache holds.
	MinObjects int
	// BytesIn (from the apiserver) and BytesOut over every member's TCP connections, since the start.
	BytesIn, BytesOut int64
	// Since the start or the last "mark":
	Requests    map[string]int // by class: list, watchlist, watch, discovery, other
	Status429   int
	ConnErrors  int // attempts that got no answer
	MaxPer100ms int // request attempts in the busiest 100 ms
	P99Per100ms int // the 99th percentile of attempts per 100 ms (over buckets with any)
	MaxBucketBy map[string]int
	// Retries: attempts after a member's first of their class since the start or the mark (the
	// first ones start together by construction: K members started, or one apiserver gone).
	Retries          int
	MaxRetryPer100ms int
	RetryBucketBy    map[string]int // the busiest 100 ms of retries, by class
	// MarkerP50, MarkerMax: seconds from the reference time to members' caches holding the marker.
	MarkerP50, MarkerMax float64
	MarkerSeen           int
	ChildHWMkB           int64   // the child's peak RSS
	ChildCPU             float64 // the child's CPU seconds (user + system) since it started
	Err                  string  `json:",omitempty"`
}

// member is one simulated node agent.
type member struct {
	synced  func() bool
	objects func() int            // Services in its cache
	has     func(key string) bool // its Services cache holds namespace/name
	in, out atomic.Int64
	stop    func()
}

// reqLog records every request attempt of every member.
type reqLog struct {
	mu   sync.Mutex
	from time.Time
	recs []reqRec
}

type reqRec struct {
	at     time.Time
	member int
	class  string
	code   int // -1: no answer
}

func (l *reqLog) add(r reqRec) {
	l.mu.Lock()
	l.recs = append(l.recs, r)
	l.mu.Unlock()
}

func (l *reqLog) mark() {
	l.mu.Lock()
	l.from = time.Now()
	l.recs = nil
	l.mu.Unlock()
}

// classify names what a request asks for.
func classify(req *http.Request) string {
	q := req.URL.Query()
	p := strings.TrimSuffix(req.URL.Path, "/")
	switch {
	case req.Method != http.MethodGet:
		return "other"
	case q.Get("watch") == "true" || q.Get("watch") == "1":
		if q.Get("sendInitialEvents") == "true" {
			return "watchlist"
		}
		return "watch"
	case p == "/api" || p == "/apis" || strings.Count(p, "/") <= 3 && strings.HasPrefix(p, "/apis/"):
		return "discovery" // /apis/<group>/<version>
	}
	return "list"
}

// counting wraps a member's connections: bytes read from and written to the apiserver.
type countingConn struct {
	net.Conn
	m *member
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.m.in.Add(int64(n))
	return n, err
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.m.out.Add(int64(n))
	return n, err
}

// instrument gives rc a dialer that counts m's bytes and a transport wrapper (outermost) that logs
// every attempt.
func instrument(rc *rest.Config, m *member, id int, log *reqLog) {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	rc.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, m: m}, nil
	}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTrip(func(req *http.Request) (*http.Response, error) {
			r := reqRec{at: time.Now(), member: id, class: classify(req), code: -1}
			resp, err := rt.RoundTrip(req)
			if err == nil {
				r.code = resp.StatusCode
			}
			log.add(r)
			return resp, err
		})
	})
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// newAgentMember builds one agent's client and inputs as the agent does (internal/agent's
// APIClient.Get and Hub) and starts the inputs.
func newAgentMember(spec fleetSpec, i int, log *reqLog, contentType string, slog *slog.Logger) (*member, error) {
	m := &member{}
	cfg := &config.Config{Kubeconfig: spec.Kubeconfig, NodeName: fmt.Sprintf("fleet-node-%d", i)}
	rc, err := agent.RestConfig(cfg)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		rc.ContentType = contentType
	}
	rc.Impersonate.UserName = agentUser
	var client kube.Interface
	h := watch.NewHub(func() (kube.Interface, error) { return client, nil }, cfg.NodeName, slog)
	rc.Wrap(h.WrapTransport) // as agent.Hub does (api.SetWrap)
	instrument(rc, m, i, log)
	c, err := kube.New(rc)
	if err != nil {
		return nil, err
	}
	client = c
	svc := services.New()
	ins := []inputs.Input{svc, node.New(), servicecidrs.New()}
	for _, in := range ins {
		if err := in.Start(h); err != nil {
			return nil, err
		}
	}
	m.synced = func() bool {
		for _, in := range ins {
			if in.Synced() != nil {
				return false
			}
		}
		return true
	}
	m.objects = func() int {
		if s := svc.Store(); s != nil {
			return len(s.ListKeys())
		}
		return 0
	}
	m.has = func(key string) bool {
		s := svc.Store()
		if s == nil {
			return false
		}
		_, ok, _ := s.GetByKey(key)
		return ok
	}
	m.stop = h.Stop
	return m, nil
}

func adminConfig(spec fleetSpec, m *member, id int, log *reqLog, contentType string, qps float32, burst int) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", spec.Kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.ContentType = contentType
	rc.QPS, rc.Burst = qps, burst
	rc.Impersonate.UserName = agentUser
	instrument(rc, m, id, log)
	return rc, nil
}

const protobufType = "application/vnd.kubernetes.protobuf"

// The members act as the ServiceAccounts a cluster runs them with (the admin kubeconfig
// impersonates them), so that the apiserver's flow control classifies their requests as it would
// (kube-system's ServiceAccounts: the workload-high priority level) and RBAC allows what their roles
// allow: the agent's ClusterRole from deploy/base, kube-proxy's system:node-proxier (fleetIdentities).
const (
	agentUser     = "system:serviceaccount:kube-system:network-node-manager"
	kubeProxyUser = "system:serviceaccount:kube-system:kube-proxy"
)

// newKubeProxyMember reproduces kube-proxy's informers (see the package comment above).
func newKubeProxyMember(spec fleetSpec, i int, log *reqLog) (*member, error) {
	m := &member{}
	rc, err := adminConfig(spec, m, i, log, protobufType, 5, 10)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "kube-proxy-fleet-bench"
	rc.Impersonate.UserName = kubeProxyUser
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	const resync = 15 * time.Minute
	noProxyName, err := labels.NewRequirement("service.kubernetes.io/service-proxy-name", selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	noHeadless, err := labels.NewRequirement(corev1.IsHeadlessService, selection.DoesNotExist, nil)
	if err != nil {
		return nil, err
	}
	plain := informers.NewSharedInformerFactoryWithOptions(cs, resync)
	eps := informers.NewSharedInformerFactoryWithOptions(cs, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.NewSelector().Add(*noHeadless).String()
	}))
	svcs := informers.NewSharedInformerFactoryWithOptions(cs, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.NewSelector().Add(*noProxyName).String()
		o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone).String()
	}))
	nodeName := fmt.Sprintf("fleet-node-%d", i)
	thisNode := informers.NewSharedInformerFactoryWithOptions(cs, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}))
	var regs []cache.ResourceEventHandlerRegistration
	nop := cache.ResourceEventHandlerFuncs{AddFunc: func(any) {}, UpdateFunc: func(any, any) {}, DeleteFunc: func(any) {}}
	svcInf := svcs.Core().V1().Services().Informer()
	for _, inf := range []cache.SharedIndexInformer{svcInf, eps.Discovery().V1().EndpointSlices().Informer(),
		plain.Networking().V1().ServiceCIDRs().Informer(), thisNode.Core().V1().Nodes().Informer()} {
		reg, err := inf.AddEventHandlerWithResyncPeriod(nop, resync)
		if err != nil {
			return nil, err
		}
		regs = append(regs, reg)
	}
	stop := make(chan struct{})
	for _, f := range []informers.SharedInformerFactory{plain, eps, svcs, thisNode} {
		f.Start(stop)
	}
	m.synced = func() bool {
		for _, r := range regs {
			if !r.HasSynced() {
				return false
			}
		}
		return true
	}
	m.objects = func() int { return len(svcInf.GetStore().ListKeys()) }
	m.has = func(key string) bool { _, ok, _ := svcInf.GetStore().GetByKey(key); return ok }
	m.stop = func() { close(stop) }
	return m, nil
}

// newListMember makes one plain LIST of every Service in the background.
func newListMember(spec fleetSpec, i int, log *reqLog, contentType string) (*member, error) {
	m := &member{}
	rc, err := adminConfig(spec, m, i, log, contentType, 20, 40)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	var done atomic.Bool
	var n atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for ctx.Err() == nil {
			l, err := cs.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
			if err == nil {
				n.Store(int64(len(l.Items)))
				done.Store(true)
				return
			}
			time.Sleep(time.Second)
		}
	}()
	m.synced = done.Load
	m.objects = func() int { return int(n.Load()) }
	m.has = func(string) bool { return true }
	m.stop = cancel
	return m, nil
}

func fleetChild(specJSON string) error {
	var spec fleetSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return fmt.Errorf("%s: %w", fleetChildEnv, err)
	}
	if spec.SyncTimeout == 0 {
		spec.SyncTimeout = 10 * time.Minute
	}
	out := json.NewEncoder(os.Stdout)
	emit := func(e fleetEvent) {
		if err := out.Encode(e); err != nil {
			fmt.Fprintln(os.Stderr, "fleet child:", err)
		}
	}
	log := &reqLog{from: time.Now()}
	slogger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if path := os.Getenv(fleetProfileEnv); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	members := make([]*member, spec.K)
	informersEach := 3
	// Build and start them all at once, as a rollout's pods start.
	var wg sync.WaitGroup
	errs := make([]error, spec.K)
	for i := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var m *member
			var err error
			switch spec.Kind {
			case "agent":
				m, err = newAgentMember(spec, i, log, "", slogger)
			case "agent-json":
				m, err = newAgentMember(spec, i, log, "application/json", slogger)
			case "kube-proxy":
				m, err = newKubeProxyMember(spec, i, log)
			case "list":
				m, err = newListMember(spec, i, log, protobufType)
			case "list-json":
				m, err = newListMember(spec, i, log, "application/json")
			default:
				err = fmt.Errorf("unknown kind %q", spec.Kind)
			}
			members[i], errs[i] = m, err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			emit(fleetEvent{Event: "synced", Err: err.Error()})
			return err
		}
	}
	switch spec.Kind {
	case "kube-proxy":
		informersEach = 4
	case "list", "list-json":
		informersEach = 1
	}
	syncedAt := waitMembers(members, start, spec.SyncTimeout, func(m *member) bool { return m.synced() })
	e := fleetStats(log, members, syncedAt, spec.K)
	e.Event, e.Informers = "synced", informersEach
	emit(e)

	// Commands from the parent, one a line.
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "mark":
			log.mark()
		case "stats":
			e := fleetStats(log, members, nil, spec.K)
			e.Event, e.Informers = "stats", informersEach
			emit(e)
		case "marker":
			// marker <namespace/name> <unix ms of the reference>
			if len(f) != 3 {
				emit(fleetEvent{Event: "marker", Err: "usage: marker ns/name unixms"})
				continue
			}
			ms, _ := strconv.ParseInt(f[2], 10, 64)
			ref := time.UnixMilli(ms)
			key := f[1]
			seen := waitMembers(members, ref, 5*time.Minute, func(m *member) bool { return m.has(key) })
			e := fleetStats(log, members, nil, spec.K)
			e.Event, e.Informers = "marker", informersEach
			e.MarkerSeen = len(seen)
			if len(seen) > 0 {
				e.MarkerP50, e.MarkerMax = seen[len(seen)/2], seen[len(seen)-1]
			}
			emit(e)
		case "quit":
			for _, m := range members {
				m.stop()
			}
			return nil
		}
	}
	return sc.Err()
}

// waitMembers polls until cond holds for every member (or timeout) and returns the seconds from
// since at which each did, sorted.
func waitMembers(members []*member, since time.Time, timeout time.Duration, cond func(*member) bool) []float64 {
	done := make([]bool, len(members))
	var at []float64
	deadline := time.Now().Add(timeout)
	for len(at) < len(members) && time.Now().Before(deadline) {
		for i, m := range members {
			if !done[i] && cond(m) {
				done[i] = true
				at = append(at, time.Since(since).Seconds())
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	sort.Float64s(at)
	return at
}

func fleetStats(log *reqLog, members []*member, syncedAt []float64, k int) fleetEvent {
	e := fleetEvent{K: k, Requests: map[string]int{}, MaxBucketBy: map[string]int{}, RetryBucketBy: map[string]int{}, MinObjects: -1}
	if syncedAt != nil {
		e.Synced = len(syncedAt)
		if len(syncedAt) > 0 {
			e.SyncP50, e.SyncMax = syncedAt[len(syncedAt)/2], syncedAt[len(syncedAt)-1]
		}
	} else {
		for _, m := range members {
			if m.synced() {
				e.Synced++
			}
		}
	}
	for _, m := range members {
		e.BytesIn += m.in.Load()
		e.BytesOut += m.out.Load()
		if n := m.objects(); e.MinObjects < 0 || n < e.MinObjects {
			e.MinObjects = n
		}
	}
	log.mu.Lock()
	recs := slices.Clone(log.recs)
	from := log.from
	log.mu.Unlock()
	buckets, retries := map[int64]int{}, map[int64]int{}
	byClass, retriesBy := map[string]map[int64]int{}, map[string]map[int64]int{}
	type memberClass struct {
		member int
		class  string
	}
	seen := map[memberClass]bool{}
	for _, r := range recs {
		e.Requests[r.class]++
		switch r.code {
		case http.StatusTooManyRequests:
			e.Status429++
		case -1:
			e.ConnErrors++
		}
		b := int64(r.at.Sub(from) / (100 * time.Millisecond))
		buckets[b]++
		if byClass[r.class] == nil {
			byClass[r.class] = map[int64]int{}
		}
		byClass[r.class][b]++
		if mc := (memberClass{r.member, r.class}); !seen[mc] {
			seen[mc] = true
			continue
		}
		e.Retries++
		retries[b]++
		if retriesBy[r.class] == nil {
			retriesBy[r.class] = map[int64]int{}
		}
		retriesBy[r.class][b]++
	}
	for _, c := range retries {
		e.MaxRetryPer100ms = max(e.MaxRetryPer100ms, c)
	}
	for class, bs := range retriesBy {
		for _, c := range bs {
			e.RetryBucketBy[class] = max(e.RetryBucketBy[class], c)
		}
	}
	var counts []int
	for _, c := range buckets {
		counts = append(counts, c)
		e.MaxPer100ms = max(e.MaxPer100ms, c)
	}
	if len(counts) > 0 {
		sort.Ints(counts)
		e.P99Per100ms = counts[min(len(counts)-1, len(counts)*99/100)]
	}
	for class, bs := range byClass {
		for _, c := range bs {
			e.MaxBucketBy[class] = max(e.MaxBucketBy[class], c)
		}
	}
	e.ChildHWMkB = procStatusKB(os.Getpid(), "VmHWM")
	e.ChildCPU = procCPU(os.Getpid())
	return e
}

// procStatusKB reads a "kB" field of /proc/<pid>/status (VmRSS, VmHWM), 0 if it cannot.
func procStatusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}
