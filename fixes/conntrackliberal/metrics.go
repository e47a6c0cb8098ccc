package conntrackliberal

import (
	"strconv"

	"github.com/network-node-manager/network-node-manager/core/sysctl"
	"github.com/prometheus/client_golang/prometheus"
)

// collector reads the sysctl on every scrape, so the value is current even while the fix is
// disabled (e.g. to see that kube-proxy's --conntrack-tcp-be-liberal set it).
type collector struct {
	f        *Fix
	value    *prometheus.Desc
	previous *prometheus.Desc
}

func newCollector(f *Fix) *collector {
	return &collector{
		f: f,
		value: prometheus.NewDesc("nnm_conntrack_liberal_value",
			"Current value of net.netfilter.nf_conntrack_tcp_be_liberal (absent when it cannot be read).", nil, nil),
		previous: prometheus.NewDesc("nnm_conntrack_liberal_previous_value",
			"Value the fix restores when it is disabled (absent when nothing is owed).", nil, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.value
	ch <- c.previous
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	if v, err := c.f.sys.Get(sysctl.ConntrackTCPBeLiberal); err == nil {
		if n, err := strconv.ParseFloat(v, 64); err == nil {
			ch <- prometheus.MustNewConstMetric(c.value, prometheus.GaugeValue, n)
		}
	}
	if p, ok := c.f.previous(); ok {
		if n, err := strconv.ParseFloat(p, 64); err == nil {
			ch <- prometheus.MustNewConstMetric(c.previous, prometheus.GaugeValue, n)
		}
	}
}
