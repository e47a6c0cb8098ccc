// RuleCounters exports the kernel counters of a fix's rules (rules.Rule.Counter) as one
// Prometheus counter per family, for fixes that want "packets dropped/matched" metrics.
//
// Kernel rule counters reset whenever the backend rewrites the fix's chains, and Prometheus counters
// must never go down. The collector reads the counters on every scrape, remembers the last raw value
// of each, and adds only increases (after a reset: the new raw value) to a running total.
//
//	reg.MustRegister(metrics.NewRuleCounters(metrics.RuleCounterOptions{
//		Reader: p.Backend, Fix: ID, // nnm_metadata_block_…
//		Name:   "dropped_packets_total",
//		Help:   "Packets from local pods to a blocked metadata address, dropped.",
//		Match:  metrics.CounterPrefix("dropped"),
//	}))

package metrics

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/rules"
)

// CounterReader reads the counters of a fix; backend.Backend is one (and testkit.FakeBackend).
type CounterReader interface {
	Counters(ctx context.Context, fix string, family rules.Family) (map[string]backend.Counter, error)
}

// RuleCounterOptions describe one exported counter.
type RuleCounterOptions struct {
	Reader CounterReader
	// Fix is the fix id whose counters are read.
	Fix string
	// Namespace, Subsystem and Name make the metric name as in prometheus.Opts; Help is its help
	// text. Namespace and Subsystem default (both empty) to Namespace and
	// Subsystem(Fix): nnm_<fix>_<Name>.
	Namespace, Subsystem, Name, Help string
	// Match selects the rule counters summed into the metric (nil: all of them).
	Match func(counter string) bool
	// Bytes exports bytes instead of packets.
	Bytes bool
	// Timeout bounds the read of each family on each scrape (default 5s).
	Timeout time.Duration
}

// CounterPrefix matches counter names that start with p.
func CounterPrefix(p string) func(string) bool {
	return func(name string) bool { return strings.HasPrefix(name, p) }
}

// RuleCounters is a prometheus.Collector with one series per family (label "family").
type RuleCounters struct {
	o    RuleCounterOptions
	desc *prometheus.Desc

	mu    sync.Mutex
	last  map[rules.Family]map[string]uint64
	total map[rules.Family]uint64
}

// NewRuleCounters returns the collector; register it on the injected registry.
func NewRuleCounters(o RuleCounterOptions) *RuleCounters {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Namespace == "" && o.Subsystem == "" {
		o.Namespace, o.Subsystem = Namespace, Subsystem(o.Fix)
	}
	return &RuleCounters{o: o,
		desc:  prometheus.NewDesc(prometheus.BuildFQName(o.Namespace, o.Subsystem, o.Name), o.Help, []string{"family"}, nil),
		last:  map[rules.Family]map[string]uint64{},
		total: map[rules.Family]uint64{},
	}
}

// Describe implements prometheus.Collector.
func (c *RuleCounters) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect reads the kernel counters of every family. A family is exported from its first successful
// read on; a failed read keeps the last total rather than making the series vanish.
func (c *RuleCounters) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, fam := range rules.Families {
		if c.o.Reader != nil {
			// A timeout per family: with one for the scrape, a slow read of the first family (nft
			// under load) used up the second's time, and its series froze.
			ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
			cs, err := c.o.Reader.Counters(ctx, c.o.Fix, fam)
			cancel()
			if err == nil && len(cs) > 0 {
				raw := map[string]uint64{}
				for name, v := range cs {
					if c.o.Match == nil || c.o.Match(name) {
						raw[name] = v.Packets
						if c.o.Bytes {
							raw[name] = v.Bytes
						}
					}
				}
				c.add(fam, raw)
			}
		}
		if total, ok := c.total[fam]; ok {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(total), string(fam))
		}
	}
}

func (c *RuleCounters) add(fam rules.Family, raw map[string]uint64) {
	last := c.last[fam]
	total := c.total[fam]
	for name, v := range raw {
		prev, seen := last[name]
		if !seen || v < prev { // new counter, or reset by a rewrite of the chains
			total += v
		} else {
			total += v - prev
		}
	}
	c.last[fam] = raw // a counter that disappears starts from zero if it comes back
	c.total[fam] = total
}
