// Package kubetest adapts a client-go clientset (k8s.io/client-go/kubernetes/fake's, or a real one) to
// kube.Interface, for tests. The agent's binary must not import it (it links every API group; see
// package kube).
package kubetest

import (
	"context"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/core/kube"
)

// From returns cs as a kube.Interface.
func From(cs kubernetes.Interface) kube.Interface { return clientset{cs} }

type clientset struct{ cs kubernetes.Interface }

func (c clientset) ListWatch(r kube.Resource, fieldSelector string) cache.ListerWatcher {
	switch r {
	case kube.Services:
		i := c.cs.CoreV1().Services("")
		return listWatch(c.cs, fieldSelector, i.List, i.Watch)
	case kube.Nodes:
		i := c.cs.CoreV1().Nodes()
		return listWatch(c.cs, fieldSelector, i.List, i.Watch)
	case kube.Pods:
		i := c.cs.CoreV1().Pods("")
		return listWatch(c.cs, fieldSelector, i.List, i.Watch)
	default:
		i := c.cs.NetworkingV1().ServiceCIDRs()
		return listWatch(c.cs, fieldSelector, i.List, i.Watch)
	}
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
