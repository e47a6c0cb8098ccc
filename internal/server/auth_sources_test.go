package server_test

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
	"github.com/network-node-manager/network-node-manager/internal/server"
	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
	"github.com/network-node-manager/network-node-manager/internal/testing/servertest"
)

// TestReviewBudgetPerSlash64AndGlobal (#41 row 7): the TokenReview budget was per address, so 1,000
// IPv6 addresses of one /64 with 5 garbage tokens each cost 5,000 TokenReviews, and a legitimate
// scrape waited behind them in the client's rate limiter (403 after 5 s). Against the real API
// server, with the agent's client settings, in a namespace whose loopback holds the addresses:
//   - the /64 is one source: its 5,000 tokens cost at most ReviewBurst + ReviewsPerSecond × the
//     flood's duration reviews, and an uncached scrape from another /64 during it answers 200;
//   - 200 sources in distinct /64s with 5 tokens each cost at most the global ceiling
//     (GlobalReviewBurst + GlobalReviewsPerSecond × duration, plus the scraper's), and the scraper,
//     trusted since its scrape was authorized, gets a new token reviewed during it.
func TestReviewBudgetPerSlash64AndGlobal(t *testing.T) {
	cp := controlplane.StartT(t, controlplane.Options{})
	token := scraperToken(t, cp)
	var reviews atomic.Int64
	client := agentClient(t, cp, &reviews)

	ns := netns.NewNoDAD(t, "nnm-rv")
	var batch strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&batch, "addr add fd00:41::%x/128 dev lo nodad\n", i+1)
	}
	for i := range 200 {
		fmt.Fprintf(&batch, "addr add fd00:43:%x::1/128 dev lo nodad\n", i+1)
	}
	batch.WriteString("addr add fd00:42::1/128 dev lo nodad\n")
	if out, err := ns.Run(t.Context(), "ip", []string{"-6", "-batch", "-"}, strings.NewReader(batch.String()), nil); err != nil {
		t.Fatalf("ip -batch: %v: %s", err, out)
	}
	var s *server.Server
	if err := ns.Do(func() error {
		// The connection cap per source (TestIdleFloodDoesNotStarveProbesOrScrape) would refuse most
		// of the /64's concurrent connections before any token is read: lifted here, so that what is
		// measured is the review budget.
		limits := server.DefaultLimits
		limits.MaxConnsPerSource = 0
		s = servertest.StartDelegated(t, client, "nnm_sources_test", server.Options{MetricsAddress: "[fd00:42::1]:0", Limits: limits})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	url := "https://" + s.Addr() + "/metrics"
	from := func(src string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
		return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			DialContext:       netns.DialContext(ns.Path(), d),
			TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
			DisableKeepAlives: true,
		}}
	}
	// flood sends 5 garbage tokens from each of sources, 50 requests at a time, and once a fifth
	// has been answered runs during; it returns the reviews the flood cost and how long it took.
	flood := func(sources []string, during func()) (int64, time.Duration, map[int]int) {
		before := reviews.Load()
		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[int]int{}
		var answered atomic.Int64
		sem := make(chan struct{}, 50)
		start := time.Now()
		go func() {
			// during runs once a fifth is answered, or after a minute at most.
			_ = agenttest.Poll(t.Context(), time.Minute, 5*time.Millisecond, func() error {
				if answered.Load() < int64(len(sources)) {
					return errors.New("a fifth of the flood not answered yet")
				}
				return nil
			})
			during()
		}()
		for i, src := range sources {
			c := from(src)
			for j := range 5 {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					code, _, _ := netns.Get(t.Context(), c, url, fmt.Sprintf("garbage-%d-%d-%d", time.Now().UnixNano(), i, j))
					answered.Add(1)
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		return reviews.Load() - before, time.Since(start), codes
	}
	scrape := func(what, src, tok string) {
		t0 := time.Now()
		code, body, err := netns.Get(t.Context(), from(src), url, tok)
		t.Logf("%s from %s: %d in %v", what, src, code, time.Since(t0).Round(time.Millisecond))
		if err != nil || code != http.StatusOK || !strings.Contains(body, "nnm_sources_test 1") {
			t.Errorf("%s from %s: %d %v %.200q", what, src, code, err, body)
		}
	}

	var oneNet []string
	for i := range 1000 {
		oneNet = append(oneNet, fmt.Sprintf("fd00:41::%x", i+1))
	}
	var scrapeDone sync.WaitGroup
	scrapeDone.Add(1)
	n, took, codes := flood(oneNet, func() {
		defer scrapeDone.Done()
		scrape("an uncached scrape during the /64 flood", "fd00:42::1", token)
	})
	scrapeDone.Wait()
	t.Logf("1,000 sources of one /64, 5 garbage tokens each: %d TokenReviews in %v, answers %v", n, took.Round(time.Millisecond), codes)
	if limit := int64(server.ReviewBurst+server.ReviewsPerSecond*took.Seconds()) + 1 + 1; n > limit {
		t.Errorf("%d TokenReviews for one /64's flood in %v, want at most %d (one source's budget and the scraper's)", n, took, limit)
	}

	var manyNets []string
	for i := range 200 {
		manyNets = append(manyNets, fmt.Sprintf("fd00:43:%x::1", i+1))
	}
	admin := cp.AdminClient()
	scrapeDone.Add(1)
	n, took, codes = flood(manyNets, func() {
		defer scrapeDone.Done()
		fresh := newScraperToken(t, admin)
		scrape("the trusted scraper with a new token during the flood from 200 /64s", "fd00:42::1", fresh)
	})
	scrapeDone.Wait()
	t.Logf("200 sources in 200 /64s, 5 garbage tokens each: %d TokenReviews in %v, answers %v", n, took.Round(time.Millisecond), codes)
	if limit := int64(server.GlobalReviewBurst+server.GlobalReviewsPerSecond*took.Seconds()) + 1 + 1; n > limit {
		t.Errorf("%d TokenReviews for 200 sources' flood in %v, want at most %d (the global ceiling and the scraper's)", n, took, limit)
	}
}
