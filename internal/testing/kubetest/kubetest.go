// Package kubetest adapts a client-go clientset (k8s.io/client-go/kubernetes/fake's, or a real one) to
// kube.Interface, for tests. The agent's binary must not import it (it links every API group; see
// package kube).
package kubetest

import (
	"context"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/internal/kube"
)

// From returns cs as a kube.Interface.
func From(cs kubernetes.Interface) kube.Interface { return clientset{cs} }

type clientset struct{ cs kubernetes.Interface }

// invoker is the fake clientset's way to list and watch any resource (its typed clients use it).
type invoker interface {
	Invokes(action k8stesting.Action, defaultReturnObj runtime.Object) (runtime.Object, error)
	InvokesWatch(action k8stesting.Action) (watch.Interface, error)
}

// ListWatch lists and watches r: through a fake clientset's object tracker, as its typed clients
// do (the field selector is then not applied: the fake does not filter by fields), else through the
// clientset's REST connection.
func (c clientset) ListWatch(r kube.Resource, fieldSelector string) cache.ListerWatcher {
	inv, ok := c.cs.(invoker)
	if !ok {
		return c.restListWatch(r, fieldSelector)
	}
	gvr, gvk := r.GroupVersionResource(), r.GroupVersion.WithKind(r.Kind)
	list := func(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
		obj, err := inv.Invokes(k8stesting.NewListActionWithOptions(gvr, gvk, "", o), r.NewList())
		if obj == nil {
			return r.NewList(), err
		}
		return obj, err
	}
	watchFn := func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.Watch = true
		return inv.InvokesWatch(k8stesting.NewWatchActionWithOptions(gvr, "", o))
	}
	return listWatch(c.cs, fieldSelector, list, watchFn)
}

// restListWatch lists and watches r over the REST client of r's group in the clientset (core,
// networking.k8s.io and discovery.k8s.io: the groups the agent's inputs watch).
func (c clientset) restListWatch(r kube.Resource, fieldSelector string) cache.ListerWatcher {
	var rc rest.Interface
	switch r.GroupVersion {
	case corev1.SchemeGroupVersion:
		rc = c.cs.CoreV1().RESTClient()
	case networkingv1.SchemeGroupVersion:
		rc = c.cs.NetworkingV1().RESTClient()
	case discoveryv1.SchemeGroupVersion:
		rc = c.cs.DiscoveryV1().RESTClient()
	default:
		panic("kubetest: no REST client for " + r.GroupVersion.String())
	}
	list := func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		out := r.NewList()
		err := rc.Get().Resource(r.Name).VersionedParams(&o, scheme.ParameterCodec).Do(ctx).Into(out)
		return out, err
	}
	watchFn := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.Watch = true
		return rc.Get().Resource(r.Name).VersionedParams(&o, scheme.ParameterCodec).Watch(ctx)
	}
	return listWatch(c.cs, fieldSelector, list, watchFn)
}

// listWatch is a typed client's List and Watch as an informer's ListerWatcher (with the fake
// clientset's answer to whether it streams lists), only the objects fieldSelector selects.
func listWatch[L runtime.Object](cs kubernetes.Interface, fieldSelector string,
	list func(context.Context, metav1.ListOptions) (L, error), watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	tweak := func(o *metav1.ListOptions) {
		if fieldSelector != "" {
			o.FieldSelector = fieldSelector
		}
	}
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return watchFn(ctx, o)
		},
	}, cs)
}

func (c clientset) ServerResources(_ context.Context, groupVersion string) (*metav1.APIResourceList, error) {
	return c.cs.Discovery().ServerResourcesForGroupVersion(groupVersion)
}

func (c clientset) GetConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	return c.cs.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (c clientset) CreateTokenReview(ctx context.Context, tr *authnv1.TokenReview) (*authnv1.TokenReview, error) {
	return c.cs.AuthenticationV1().TokenReviews().Create(ctx, tr, metav1.CreateOptions{})
}

func (c clientset) CreateSubjectAccessReview(ctx context.Context, sar *authzv1.SubjectAccessReview) (*authzv1.SubjectAccessReview, error) {
	return c.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
}

func (c clientset) CreateEvent(ctx context.Context, ev *eventsv1.Event) (*eventsv1.Event, error) {
	return c.cs.EventsV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{})
}

func (c clientset) PatchEvent(ctx context.Context, namespace, name string, pt types.PatchType, data []byte) (*eventsv1.Event, error) {
	return c.cs.EventsV1().Events(namespace).Patch(ctx, name, pt, data, metav1.PatchOptions{})
}

func (c clientset) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	return c.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
}

func (c clientset) PatchNodeStatus(ctx context.Context, name string, pt types.PatchType, data []byte) (*corev1.Node, error) {
	return c.cs.CoreV1().Nodes().Patch(ctx, name, pt, data, metav1.PatchOptions{}, "status")
}
