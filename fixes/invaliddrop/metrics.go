package invaliddrop

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/network-node-manager/network-node-manager/core/rules"
)

// scrapeTimeout bounds the counter read done on every scrape.
const scrapeTimeout = 5 * time.Second

type metrics struct {
	redundant prometheus.Gauge
	dropped   *droppedCollector
}

func newMetrics(r CounterReader) *metrics {
	return &metrics{
		redundant: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nnm_invalid_drop_redundant",
			Help: "1 when net.netfilter.nf_conntrack_tcp_be_liberal=1 makes the INVALID drop redundant, else 0.",
		}),
		dropped: newDroppedCollector(r),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	if err := reg.Register(m.redundant); err != nil {
		return err
	}
	return reg.Register(m.dropped)
}

// droppedCollector exports the kernel's drop counters as a Prometheus counter. Rewriting the chains
// resets the kernel counters, so it remembers the last raw value of every kernel counter and adds only
// increases (or, after a reset, the new raw value) to a per-family total that never goes down.
type droppedCollector struct {
	reader CounterReader
	desc   *prometheus.Desc

	mu    sync.Mutex
	last  map[rules.Family]map[string]uint64
	total map[rules.Family]uint64
}

func newDroppedCollector(r CounterReader) *droppedCollector {
	return &droppedCollector{
		reader: r,
		desc: prometheus.NewDesc("nnm_invalid_drop_dropped_packets_total",
			"Packets dropped because conntrack marked them INVALID, summed over hooks and protocols.",
			[]string{"family"}, nil),
		last:  map[rules.Family]map[string]uint64{},
		total: map[rules.Family]uint64{},
	}
}

func (c *droppedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *droppedCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, fam := range rules.Families {
		if c.reader != nil {
			if cs, err := c.reader.Counters(ctx, ID, fam); err == nil && len(cs) > 0 {
				raw := map[string]uint64{}
				for name, v := range cs {
					if strings.HasPrefix(name, "dropped") {
						raw[name] = v.Packets
					}
				}
				c.add(fam, raw)
			}
		}
		// A family seen once keeps being exported (a failed read must not make the series vanish).
		if total, ok := c.total[fam]; ok {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(total), string(fam))
		}
	}
}

// add folds one read of the raw kernel counters of fam into the total.
func (c *droppedCollector) add(fam rules.Family, raw map[string]uint64) {
	last := c.last[fam]
	if last == nil {
		last = map[string]uint64{}
	}
	total := c.total[fam]
	for name, v := range raw {
		prev, seen := last[name]
		switch {
		case !seen || v < prev: // new counter, or reset by a rewrite of the chain
			total += v
		default:
			total += v - prev
		}
	}
	c.last[fam] = raw // counters that disappeared start from zero if they come back
	c.total[fam] = total
}
