package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/util/cache"

	"github.com/network-node-manager/network-node-manager/internal/kube"
)

// Delegated protects a handler the way kube-rbac-proxy and kubebuilder's metrics filter do: the bearer
// token is authenticated with a TokenReview and the user authorized with a SubjectAccessReview for the
// request's non-resource URL and verb (get /metrics), both answered by the API server. No token or an
// invalid one is 401, a user without the RBAC 403.
//
// It calls the authentication/v1 and authorization/v1 APIs through the agent's client (internal/kube) instead of
// k8s.io/apiserver's delegating authenticator/authorizer (which controller-runtime's filters wrap):
// those bring k8s.io/apiserver and k8s.io/component-base into a node agent that otherwise needs only
// client-go, for two API calls and a cache.
//
// Results are cached (by a hash of the token, and by user) for CacheTTL, so that a scrape every 30s
// costs the API server two calls per node and TTL at most.
//
// Unknown tokens are bounded so that garbage cannot crowd out a legitimate scrape (#19: 500 unique
// garbage tokens each cost a TokenReview through the QPS-limited client, and a legitimate uncached
// scrape then waited 9.6 s or failed): a rejected token is remembered in a cache of its own (a flood
// cannot evict the accepted tokens), and each source (an IPv4 address, an IPv6 /64: Source) may have
// a token reviewed at most ReviewsPerSecond times a second (burst ReviewBurst); beyond that it gets
// 429 without a review. All sources together have GlobalReviewsPerSecond (burst GlobalReviewBurst),
// below the client's QPS, so that reviews never queue in the client's rate limiter behind each
// other (#41: a legitimate scrape got 403 after 5 s there) nor starve the watches; a source that
// was authorized to get the metrics in the last TrustedFor is not held to the global ceiling (a
// scraper whose token rotates during a flood from many sources still gets its review), only to its
// own budget. (Authenticated is not enough: any Pod has a service account token that authenticates.)
type Delegated struct {
	client   kube.Interface
	log      *slog.Logger
	ttl      time.Duration
	cache    *cache.LRUExpireCache // accepted tokens and authorization answers
	rejected *cache.LRUExpireCache // tokens the API server did not authenticate
	sources  *cache.LRUExpireCache // Source → *rate.Limiter of its TokenReviews
	trusted  *cache.LRUExpireCache // Source that was authorized → true
	global   *rate.Limiter         // TokenReviews of untrusted sources, all together
	mu       sync.Mutex            // one limiter per source
}

// CacheTTL is how long a review's answer is reused; a revoked token or binding takes effect after it.
const CacheTTL = time.Minute

// cacheSize bounds the number of remembered tokens and users.
const cacheSize = 1024

// ReviewsPerSecond and ReviewBurst bound the TokenReviews of tokens not in the cache, per source
// address: a scraper needs one per token and CacheTTL.
const (
	ReviewsPerSecond = 1
	ReviewBurst      = 5
)

// GlobalReviewsPerSecond and GlobalReviewBurst bound the TokenReviews of all sources not trusted
// together; the client's QPS is 20 (burst 40, core.RestConfig), so a flood never holds more than a
// quarter of it. TrustedFor is how long a source stays trusted after a request from it was
// authorized.
const (
	GlobalReviewsPerSecond = 5
	GlobalReviewBurst      = 10
	TrustedFor             = time.Hour
)

// NewDelegated returns the filter using client (the agent's own identity, which needs tokenreviews
// create and subjectaccessreviews create).
func NewDelegated(client kube.Interface, log *slog.Logger) *Delegated {
	return &Delegated{client: client, log: log, ttl: CacheTTL, cache: cache.NewLRUExpireCache(cacheSize),
		rejected: cache.NewLRUExpireCache(cacheSize), sources: cache.NewLRUExpireCache(cacheSize),
		trusted: cache.NewLRUExpireCache(cacheSize), global: rate.NewLimiter(GlobalReviewsPerSecond, GlobalReviewBurst)}
}

// errTooManyReviews: the source (or all sources) had their share of TokenReviews.
var (
	errTooManyReviews       = errors.New("too many unknown tokens from this address")
	errTooManyReviewsGlobal = fmt.Errorf("%w: too many unknown tokens from all addresses", errTooManyReviews)
)

type authnResult struct {
	ok   bool
	user authnv1.UserInfo
}

// Wrap returns h behind authentication and authorization.
func (d *Delegated) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearer(r)
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="network-node-manager"`)
			http.Error(w, "Unauthorized: a bearer token is required", http.StatusUnauthorized)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		user, ok, err := d.authenticate(ctx, token, source(r))
		if errors.Is(err, errTooManyReviews) {
			d.log.Debug("metrics: TokenReview refused", "source", source(r), "err", err)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "Too Many Requests: "+err.Error(), http.StatusTooManyRequests)
			return
		}
		if err != nil {
			d.log.Warn("metrics: TokenReview failed", "err", err)
			http.Error(w, "Unauthorized: the token could not be reviewed", http.StatusUnauthorized)
			return
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="network-node-manager"`)
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb := strings.ToLower(r.Method)
		if r.Method == http.MethodHead {
			verb = "get"
		}
		allowed, reason, err := d.authorize(ctx, user, r.URL.Path, verb)
		if err != nil {
			d.log.Warn("metrics: SubjectAccessReview failed", "err", err)
			http.Error(w, "Forbidden: the request could not be authorized", http.StatusForbidden)
			return
		}
		if !allowed {
			msg := fmt.Sprintf("Forbidden: user %q may not %s %s", user.Username, verb, r.URL.Path)
			if reason != "" {
				msg += ": " + reason
			}
			http.Error(w, msg, http.StatusForbidden)
			return
		}
		d.trusted.Add(source(r), true, TrustedFor)
		h.ServeHTTP(w, r)
	})
}

func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "Bearer") && token != ""
}

// source is the client's Source.
func source(r *http.Request) netip.Prefix { return sourceOf(r.RemoteAddr) }

func (d *Delegated) authenticate(ctx context.Context, token string, from netip.Prefix) (authnv1.UserInfo, bool, error) {
	sum := sha256.Sum256([]byte(token))
	key := "authn/" + hex.EncodeToString(sum[:])
	if v, ok := d.cache.Get(key); ok {
		res := v.(authnResult)
		return res.user, res.ok, nil
	}
	if _, ok := d.rejected.Get(key); ok {
		return authnv1.UserInfo{}, false, nil
	}
	if !d.limiter(from).Allow() {
		return authnv1.UserInfo{}, false, errTooManyReviews
	}
	if _, trusted := d.trusted.Get(from); !trusted && !d.global.Allow() {
		return authnv1.UserInfo{}, false, errTooManyReviewsGlobal
	}
	tr, err := d.client.CreateTokenReview(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}})
	if err != nil {
		return authnv1.UserInfo{}, false, err
	}
	res := authnResult{ok: tr.Status.Authenticated, user: tr.Status.User}
	if !res.ok {
		d.rejected.Add(key, true, d.ttl)
		return res.user, false, nil
	}
	d.cache.Add(key, res, d.ttl)
	return res.user, res.ok, nil
}

// limiter returns the TokenReview budget of a source (the LRU forgets idle sources).
func (d *Delegated) limiter(from netip.Prefix) *rate.Limiter {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := d.sources.Get(from); ok {
		return v.(*rate.Limiter)
	}
	l := rate.NewLimiter(ReviewsPerSecond, ReviewBurst)
	d.sources.Add(from, l, 10*time.Minute)
	return l
}

func (d *Delegated) authorize(ctx context.Context, u authnv1.UserInfo, path, verb string) (bool, string, error) {
	groups := slices.Clone(u.Groups)
	slices.Sort(groups)
	key := fmt.Sprintf("authz/%s/%s/%q/%s/%s", u.Username, u.UID, groups, verb, path)
	type result struct {
		allowed bool
		reason  string
	}
	if v, ok := d.cache.Get(key); ok {
		res := v.(result)
		return res.allowed, res.reason, nil
	}
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := d.client.CreateSubjectAccessReview(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: verb},
		},
	})
	if err != nil {
		return false, "", err
	}
	res := result{allowed: sar.Status.Allowed && !sar.Status.Denied, reason: sar.Status.Reason}
	d.cache.Add(key, res, d.ttl)
	return res.allowed, res.reason, nil
}
