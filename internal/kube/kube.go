// Package kube is the agent's Kubernetes API client: the few calls the agent makes, over REST clients
// of only the API groups it uses (core/v1, events.k8s.io/v1, authentication.k8s.io/v1,
// authorization.k8s.io/v1, and the groups of the resources the input modules watch, each decoded
// with a scheme of its own group).
//
// client-go's kubernetes.Clientset, its informer factory, discovery client and events broadcaster
// all import k8s.io/client-go/kubernetes/scheme, which registers the types of every API group (55
// packages of k8s.io/api) when the process starts. That cost the agent ~9 MB of resident memory
// before the first Service (BENCHMARKS.md, "Memory (#21)"), so the agent's binary links none of them;
// tests adapt client-go's fake clientset to Interface (package kubetest).
package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
)

// Interface is what the agent asks of the API server.
type Interface interface {
	// ListWatch lists and watches r cluster-wide, only the objects fieldSelector selects ("" for
	// all).
	ListWatch(r Resource, fieldSelector string) cache.ListerWatcher
	// ServerResources is discovery of one group version ("networking.k8s.io/v1"): a NotFound
	// error when the API does not serve it.
	ServerResources(ctx context.Context, groupVersion string) (*metav1.APIResourceList, error)
	GetConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	CreateTokenReview(ctx context.Context, tr *authnv1.TokenReview) (*authnv1.TokenReview, error)
	CreateSubjectAccessReview(ctx context.Context, sar *authzv1.SubjectAccessReview) (*authzv1.SubjectAccessReview, error)
	CreateEvent(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error)
	PatchEvent(ctx context.Context, namespace, name string, pt types.PatchType, data []byte) (*eventsv1.Event, error)
	// GetNode gets one Node; PatchNodeStatus patches its status subresource (the conditions).
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	PatchNodeStatus(ctx context.Context, name string, pt types.PatchType, data []byte) (*corev1.Node, error)
}

// Resource is a kind of object the agent lists and watches (declared by the input modules).
type Resource = inputs.Resource

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, eventsv1.AddToScheme,
		authnv1.AddToScheme, authzv1.AddToScheme} {
		utilruntime.Must(add(scheme))
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
}

// Client is the agent's implementation of Interface: one HTTP client and one rate limiter (the
// config's QPS and burst) shared by the REST clients of its groups, as a clientset shares them.
type Client struct {
	core, events, authn, authz rest.Interface

	cfg        *rest.Config
	httpClient *http.Client
	mu         sync.Mutex
	watched    map[schema.GroupVersion]groupClient // the REST clients of watched resources' groups
}

// groupClient is the REST client of one watched group version and the codec of its list options.
type groupClient struct {
	rest   rest.Interface
	params runtime.ParameterCodec
}

var _ Interface = (*Client)(nil)

// New returns a Client for rc (which it does not modify).
func New(rc *rest.Config) (*Client, error) {
	cfg := rest.CopyConfig(rc)
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	c := &Client{cfg: cfg, httpClient: httpClient, watched: map[schema.GroupVersion]groupClient{}}
	for _, g := range []struct {
		to      *rest.Interface
		gv      schema.GroupVersion
		apiPath string
	}{
		{&c.core, corev1.SchemeGroupVersion, "/api"},
		{&c.events, eventsv1.SchemeGroupVersion, "/apis"},
		{&c.authn, authnv1.SchemeGroupVersion, "/apis"},
		{&c.authz, authzv1.SchemeGroupVersion, "/apis"},
	} {
		gc := *cfg
		gc.GroupVersion, gc.APIPath = &g.gv, g.apiPath
		gc.NegotiatedSerializer = codecs.WithoutConversion()
		if *g.to, err = rest.RESTClientForConfigAndClient(&gc, httpClient); err != nil {
			return nil, fmt.Errorf("kubernetes client for %s: %w", g.gv, err)
		}
	}
	return c, nil
}

// restClient returns the REST client of r's group version, made on first use over the client's
// connections and rate limiter, decoding with a scheme of that group alone.
func (c *Client) restClient(r Resource) (groupClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gc, ok := c.watched[r.GroupVersion]; ok {
		return gc, nil
	}
	s := runtime.NewScheme()
	if err := r.AddToScheme(s); err != nil {
		return groupClient{}, fmt.Errorf("kubernetes client for %s: %w", r.GroupVersion, err)
	}
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	gc := *c.cfg
	gv := r.GroupVersion
	gc.GroupVersion, gc.APIPath = &gv, "/apis"
	if gv.Group == "" {
		gc.APIPath = "/api"
	}
	gc.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	rc, err := rest.RESTClientForConfigAndClient(&gc, c.httpClient)
	if err != nil {
		return groupClient{}, fmt.Errorf("kubernetes client for %s: %w", gv, err)
	}
	c.watched[gv] = groupClient{rest: rc, params: runtime.NewParameterCodec(s)}
	return c.watched[gv], nil
}

// ListWatch lists and watches r as client-go's informers do (the reflector may ask for a streaming
// list through the watch: the options pass through).
func (c *Client) ListWatch(r Resource, fieldSelector string) cache.ListerWatcher {
	gc, err := c.restClient(r)
	if err != nil {
		return &cache.ListWatch{
			ListWithContextFunc:  func(context.Context, metav1.ListOptions) (runtime.Object, error) { return nil, err },
			WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return nil, err },
		}
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			if fieldSelector != "" {
				opts.FieldSelector = fieldSelector
			}
			list := r.NewList()
			err := gc.rest.Get().Resource(r.Name).VersionedParams(&opts, gc.params).Do(ctx).Into(list)
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			if fieldSelector != "" {
				opts.FieldSelector = fieldSelector
			}
			opts.Watch = true
			req := gc.rest.Get().Resource(r.Name).VersionedParams(&opts, gc.params)
			if opts.TimeoutSeconds != nil {
				req = req.Timeout(time.Duration(*opts.TimeoutSeconds) * time.Second)
			}
			return req.Watch(ctx)
		},
	}
}

// ServerResources asks discovery for groupVersion.
func (c *Client) ServerResources(ctx context.Context, groupVersion string) (*metav1.APIResourceList, error) {
	raw, err := c.core.Get().AbsPath("/apis", groupVersion).SetHeader("Accept", "application/json").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	list := &metav1.APIResourceList{}
	if err := json.Unmarshal(raw, list); err != nil {
		return nil, fmt.Errorf("discovery of %s: %w", groupVersion, err)
	}
	return list, nil
}

// GetConfigMap gets one ConfigMap.
func (c *Client) GetConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	out := &corev1.ConfigMap{}
	return out, c.core.Get().Namespace(namespace).Resource("configmaps").Name(name).Do(ctx).Into(out)
}

// CreateTokenReview asks the API server who a token belongs to.
func (c *Client) CreateTokenReview(ctx context.Context, tr *authnv1.TokenReview) (*authnv1.TokenReview, error) {
	out := &authnv1.TokenReview{}
	return out, c.authn.Post().Resource("tokenreviews").Body(tr).Do(ctx).Into(out)
}

// CreateSubjectAccessReview asks the API server whether a user may do something.
func (c *Client) CreateSubjectAccessReview(ctx context.Context, sar *authzv1.SubjectAccessReview) (*authzv1.SubjectAccessReview, error) {
	out := &authzv1.SubjectAccessReview{}
	return out, c.authz.Post().Resource("subjectaccessreviews").Body(sar).Do(ctx).Into(out)
}

// CreateEvent creates an Event in its namespace.
func (c *Client) CreateEvent(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	out := &eventsv1.Event{}
	return out, c.events.Post().Namespace(ev.Namespace).Resource("events").Body(ev).Do(ctx).Into(out)
}

// PatchEvent patches an Event.
func (c *Client) PatchEvent(ctx context.Context, namespace, name string, pt types.PatchType, data []byte) (*eventsv1.Event, error) {
	out := &eventsv1.Event{}
	return out, c.events.Patch(pt).Namespace(namespace).Resource("events").Name(name).Body(data).Do(ctx).Into(out)
}

// GetNode gets one Node.
func (c *Client) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	out := &corev1.Node{}
	return out, c.core.Get().Resource("nodes").Name(name).Do(ctx).Into(out)
}

// PatchNodeStatus patches a Node's status subresource.
func (c *Client) PatchNodeStatus(ctx context.Context, name string, pt types.PatchType, data []byte) (*corev1.Node, error) {
	out := &corev1.Node{}
	return out, c.core.Patch(pt).Resource("nodes").Name(name).SubResource("status").Body(data).Do(ctx).Into(out)
}
