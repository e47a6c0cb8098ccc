package server

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/network-node-manager/network-node-manager/internal/testing/kubetest"
)

// Unit test of the bounds on unknown tokens (the real API server: auth_flood_test.go): per source
// address at most ReviewBurst reviews at once, then 429 without a review; another address is not
// affected; a rejected token is answered from the cache.
func TestUnknownTokensAreBoundedPerSource(t *testing.T) {
	client := fake.NewClientset()
	var reviews atomic.Int64
	client.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		tr.Status.Authenticated = false
		return true, tr, nil
	})
	d := NewDelegated(kubetest.From(client), slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := d.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	do := func(src, token string) int {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		r.RemoteAddr = src + ":40000"
		r.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	codes := map[int]int{}
	for i := range 100 {
		codes[do("10.0.0.1", fmt.Sprint("garbage-", i))]++
	}
	if codes[http.StatusUnauthorized] > ReviewBurst+1 || codes[http.StatusTooManyRequests] < 100-ReviewBurst-1 || reviews.Load() > ReviewBurst+1 {
		t.Errorf("100 unknown tokens from one address: %v, %d reviews; want at most %d reviews, the rest 429", codes, reviews.Load(), ReviewBurst+1)
	}
	if c := do("10.0.0.2", "garbage-other"); c != http.StatusUnauthorized {
		t.Errorf("another address: %d, want 401 (it has its own budget)", c)
	}
	n := reviews.Load()
	if c := do("10.0.0.3", "garbage-other"); c != http.StatusUnauthorized || reviews.Load() != n {
		t.Errorf("a rejected token again: %d with %d more reviews, want 401 from the cache", c, reviews.Load()-n)
	}
}
