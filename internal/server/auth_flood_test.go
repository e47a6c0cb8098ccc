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

// countReviews counts the TokenReviews the agent's client sends.
type countReviews struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countReviews) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/tokenreviews") {
		c.n.Add(1)
	}
	return c.rt.RoundTrip(r)
}

// fromAddr is an HTTPS client whose connections leave from the loopback address src (all of
// 127.0.0.0/8 is local), so that the server sees distinct sources without any namespace.
func fromAddr(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:       d.DialContext,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // self-signed, as the PodMonitor's
		DisableKeepAlives: true,
	}}
}

// TestGarbageTokensDoNotStarveAScrape (#19): 500 connections with unique garbage bearer tokens used
// to cost 500 TokenReviews through the agent's QPS-limited client, so that a legitimate scrape with
// a token not yet cached waited behind them (9.6 s) or failed with "could not be reviewed". Against
// the real API server, with the agent's own client settings (core.RestConfig): the flood from one
// address costs at most ReviewBurst + ReviewsPerSecond × its duration reviews, a repeated garbage
// token costs none (it is remembered as rejected), and a scrape from another address succeeds. The
// scrape's latency is printed, not asserted.
func TestGarbageTokensDoNotStarveAScrape(t *testing.T) {
	cp := controlplane.StartT(t, controlplane.Options{})
	ctx := t.Context()
	token := scraperToken(t, cp)

	// The agent's client, counting its TokenReviews.
	var reviews atomic.Int64
	client := agentClient(t, cp, &reviews)
	// All 500 connections come from one address: the per-source connection cap
	// (TestIdleFloodDoesNotStarveProbesOrScrape) is lifted so that the review budget is measured.
	limits := server.DefaultLimits
	limits.MaxConnsPerSource = 0
	s := servertest.StartDelegated(t, client, "nnm_flood_test", server.Options{Limits: limits})
	url := "https://" + s.Addr() + "/metrics"

	// The flood: 500 connections from 127.0.0.1, each with its own garbage token.
	const flood = 500
	attacker := fromAddr("127.0.0.1")
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	var answered atomic.Int64
	start := time.Now()
	for i := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body, err := netns.Get(ctx, attacker, url, fmt.Sprintf("garbage-%d-%d", time.Now().UnixNano(), i))
			key := fmt.Sprint(code)
			if err != nil {
				key = "error"
			} else if strings.Contains(body, "could not be reviewed") {
				key += " could not be reviewed"
			}
			answered.Add(1)
			mu.Lock()
			codes[key]++
			mu.Unlock()
		}()
	}
	// The scrape goes in the middle of the flood: once a fifth is answered, or after 10 s at most.
	_ = agenttest.Poll(ctx, 10*time.Second-time.Since(start), 5*time.Millisecond, func() error {
		if answered.Load() < flood/5 {
			return errors.New("a fifth of the flood not answered yet")
		}
		return nil
	})

	// A legitimate scrape, its token not cached yet, from another address, in the middle of the flood.
	scrapeStart := time.Now()
	code, body, err := netns.Get(ctx, fromAddr("127.0.0.2"), url, token)
	took := time.Since(scrapeStart)
	wg.Wait()
	floodTook := time.Since(start)
	t.Logf("legitimate uncached scrape during a flood of %d garbage tokens: %d in %v; flood answered %v in %v; TokenReviews sent: %d",
		flood, code, took.Round(time.Millisecond), codes, floodTook.Round(time.Millisecond), reviews.Load())
	if err != nil || code != http.StatusOK || !strings.Contains(body, "nnm_flood_test 1") {
		t.Errorf("the legitimate scrape: %d %v %.200q", code, err, body)
	}
	if limit := int64(server.ReviewBurst + server.ReviewsPerSecond*floodTook.Seconds() + 1 + 1); reviews.Load() > limit {
		t.Errorf("%d TokenReviews for a flood of %d garbage tokens from one address in %v, want at most %d", reviews.Load(), flood, floodTook, limit)
	}

	// A rejected token is remembered: sent again (from a fresh address) it costs no review.
	other := fromAddr("127.0.0.3")
	if code, _, err := netns.Get(ctx, other, url, "garbage-repeated"); err != nil || code != http.StatusUnauthorized {
		t.Fatalf("garbage token: %d %v, want 401", code, err)
	}
	before := reviews.Load()
	for range 3 {
		if code, _, err := netns.Get(ctx, other, url, "garbage-repeated"); err != nil || code != http.StatusUnauthorized {
			t.Fatalf("garbage token again: %d %v, want 401", code, err)
		}
	}
	if n := reviews.Load() - before; n != 0 {
		t.Errorf("a rejected token sent again cost %d TokenReviews, want 0", n)
	}
}
