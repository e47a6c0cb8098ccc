package main

// The agent's memory as the kernel's memory cgroup accounts it (issue #38: under the DaemonSet's
// 128Mi limit the kubelet's cgroup OOM-killed agents whose RSS the benchmarks put at 40-90 MiB). The
// bench runs each agent in a fresh child cgroup with the DaemonSet's memory limit (-manifest), as a
// kubelet or `systemd-run --scope -p MemoryMax=` would, and reports the cgroup's peak beside the
// process's VmHWM: the cgroup also counts the agent's children (iptables-restore, iptables-save,
// nft), the kernel memory they and the agent make (nf_tables rules and sets, x_tables blobs, netlink
// sockets: charged to the memcg of the process that allocates them), and page cache.
//
// cgroup v2 (memory.max, memory.peak, memory.events, memory.stat) where the memory controller is on
// the unified hierarchy; else cgroup v1's memory controller (memory.limit_in_bytes,
// memory.max_usage_in_bytes, memory.oom_control, memory.kmem.*), which charges the same pages.

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// memCgroup is one child cgroup the bench made for one agent.
type memCgroup struct {
	dir string
	v2  bool

	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	top  cgSample // the sample with the highest usage so far
	n    int      // samples taken
}

// cgSample is one reading of the cgroup.
type cgSample struct {
	current int64            // bytes charged (memory.current / memory.usage_in_bytes)
	stat    map[string]int64 // bytes: anon, file, kernel, slab, sock, ... (v1 mapped to v2 names where they exist)
	procs   []string         // the processes in the cgroup (comm), e.g. [network-node-ma iptables-nft-re]
}

// cgFigures is what a run reports.
type cgFigures struct {
	peak, current int64
	oomKills      int64
	version       string
	atPeak        cgSample // the breakdown of the sample with the highest usage (sampled every 50 ms)
}

var cgSeq int

// agentCgroup is the cgroup one agent of the bench runs in: the DaemonSet's memory limit with -manifest,
// and the agent binary's pages evicted from the page cache so that they are charged to it.
func agentCgroup(o options) (*memCgroup, error) {
	bin := o.agentBin
	if bin == "" {
		var err error
		if bin, err = agenttest.Binary(); err != nil {
			return nil, err
		}
	}
	evictPageCache(bin)
	return newMemCgroup(o.cgroupLimit())
}

// newMemCgroup makes a child cgroup with memory limit limit (bytes; 0: none) and starts sampling it.
func newMemCgroup(limit int64) (*memCgroup, error) {
	cgSeq++
	name := fmt.Sprintf("nnm-bench-%d-%d", os.Getpid(), cgSeq)
	parent, v2, err := memCgroupParent()
	if err != nil {
		return nil, err
	}
	c := &memCgroup{dir: filepath.Join(parent, name), v2: v2, stop: make(chan struct{}), done: make(chan struct{})}
	if err := os.Mkdir(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	if limit > 0 {
		var err error
		if v2 {
			err = os.WriteFile(filepath.Join(c.dir, "memory.max"), []byte(strconv.FormatInt(limit, 10)), 0o644)
			if err == nil {
				// A kubelet gives a container no swap by default (and the bench machine may have none).
				_ = os.WriteFile(filepath.Join(c.dir, "memory.swap.max"), []byte("0"), 0o644)
			}
		} else {
			err = os.WriteFile(filepath.Join(c.dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644)
		}
		if err != nil {
			_ = os.Remove(c.dir)
			return nil, fmt.Errorf("cgroup %s: set the memory limit: %w", c.dir, err)
		}
	}
	go c.sample()
	return c, nil
}

// memCgroupParent finds where to make the child: on cgroup v2 the root of the unified hierarchy if its
// children may have the memory controller (as systemd's slices are), on v1 this process's own memory
// cgroup.
func memCgroupParent() (string, bool, error) {
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	var v1mnt string
	for _, l := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(l)
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || len(f) < sep+4 {
			continue
		}
		mnt, fstype, opts := f[4], f[sep+1], f[sep+3]
		switch fstype {
		case "cgroup2":
			if b, err := os.ReadFile(filepath.Join(mnt, "cgroup.subtree_control")); err == nil && hasWord(string(b), "memory") {
				return mnt, true, nil
			}
		case "cgroup":
			if hasWord(strings.ReplaceAll(opts, ",", " "), "memory") {
				v1mnt = mnt
			}
		}
	}
	if v1mnt == "" {
		return "", false, errors.New("cgroup: no cgroup v2 hierarchy whose children have the memory controller, and no cgroup v1 memory controller mounted")
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false, err
	}
	for _, l := range strings.Split(string(self), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) == 3 && hasWord(strings.ReplaceAll(parts[1], ",", " "), "memory") {
			return filepath.Join(v1mnt, parts[2]), false, nil
		}
	}
	return v1mnt, false, nil
}

func hasWord(s, w string) bool {
	for _, x := range strings.Fields(s) {
		if x == w {
			return true
		}
	}
	return false
}

func (c *memCgroup) version() string {
	if c.v2 {
		return "v2"
	}
	return "v1"
}

func (c *memCgroup) readInt(name string) int64 {
	b, err := os.ReadFile(filepath.Join(c.dir, name))
	if err != nil {
		return -1
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return v
}

// keyed reads a "key value" file.
func (c *memCgroup) keyed(name string) map[string]int64 {
	out := map[string]int64{}
	f, err := os.Open(filepath.Join(c.dir, name))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[k] = n
		}
	}
	return out
}

func (c *memCgroup) read() cgSample {
	s := cgSample{stat: map[string]int64{}}
	if c.v2 {
		s.current = c.readInt("memory.current")
		st := c.keyed("memory.stat")
		for _, k := range []string{"anon", "file", "kernel", "kernel_stack", "pagetables", "percpu", "sock", "vmalloc", "shmem", "slab", "slab_reclaimable", "slab_unreclaimable"} {
			if v, ok := st[k]; ok {
				s.stat[k] = v
			}
		}
	} else {
		s.current = c.readInt("memory.usage_in_bytes")
		st := c.keyed("memory.stat")
		s.stat["anon"] = st["rss"]
		s.stat["file"] = st["cache"]
		s.stat["shmem"] = st["shmem"]
		s.stat["kernel"] = c.readInt("memory.kmem.usage_in_bytes")
		s.stat["sock"] = c.readInt("memory.kmem.tcp.usage_in_bytes")
	}
	if b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.procs")); err == nil {
		for _, p := range strings.Fields(string(b)) {
			comm, err := os.ReadFile("/proc/" + p + "/comm")
			if err == nil {
				s.procs = append(s.procs, strings.TrimSpace(string(comm)))
			}
		}
		sort.Strings(s.procs)
	}
	return s
}

func (c *memCgroup) sample() {
	defer close(c.done)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		s := c.read()
		c.mu.Lock()
		c.n++
		if s.current > c.top.current {
			c.top = s
		}
		c.mu.Unlock()
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
	}
}

// figures reads the cgroup now.
func (c *memCgroup) figures() cgFigures {
	f := cgFigures{version: c.version(), current: c.read().current}
	if c.v2 {
		f.peak = c.readInt("memory.peak")
		f.oomKills = c.keyed("memory.events")["oom_kill"]
	} else {
		f.peak = c.readInt("memory.max_usage_in_bytes")
		f.oomKills = c.keyed("memory.oom_control")["oom_kill"]
	}
	c.mu.Lock()
	f.atPeak = c.top
	c.mu.Unlock()
	return f
}

// remove stops sampling and removes the cgroup once its processes are gone (the agent was stopped).
// Pages still charged to it (the rules the agent left in the namespace) move to the parent.
func (c *memCgroup) remove() error {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
	var err error
	for range 100 {
		if err = syscall.Rmdir(c.dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", c.dir, err)
}

func mib(b int64) string {
	if b < 0 {
		return "?"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// String is the peak's breakdown, e.g. "anon 60.1 MiB, file 0.2 MiB, kernel 30.5 MiB (slab 20.1 MiB), ...; processes: iptables-nft-re, network-node-ma".
func (s cgSample) String() string {
	if s.stat == nil {
		return "—"
	}
	var parts []string
	for _, k := range []string{"anon", "file", "kernel", "slab", "vmalloc", "pagetables", "kernel_stack", "percpu", "sock"} {
		v, ok := s.stat[k]
		if !ok || v < 0 {
			continue
		}
		parts = append(parts, k+" "+mib(v))
	}
	return fmt.Sprintf("usage %s: %s; processes: %s", mib(s.current), strings.Join(parts, ", "), strings.Join(s.procs, " "))
}

// cgroupLimit is the limit the bench puts on each agent's cgroup: the DaemonSet's with -manifest.
func (o options) cgroupLimit() int64 {
	if o.manifest == nil {
		return 0
	}
	return o.manifest.limit.Value()
}

// evictPageCache drops the page-cache pages of files (the agent's binary) that no process maps,
// written out first (a binary just built is dirty, and dirty pages are not dropped),
// so that the agent's own faults charge them to its cgroup, as a container's first run of its image
// does; pages another process maps stay (and stay charged elsewhere).
func evictPageCache(paths ...string) {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		_ = f.Sync() // dirty pages (a binary just built) are not dropped: write them first
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
	}
}
