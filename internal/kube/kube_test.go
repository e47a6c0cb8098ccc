package kube_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/network-node-manager/network-node-manager/internal/kube"
	"github.com/network-node-manager/network-node-manager/internal/testing/controlplane"
)

// services is the Resource of core/v1 Services, as an input module declares it.
var services = kube.Resource{GroupVersion: corev1.SchemeGroupVersion, Name: "services", Kind: "Service",
	New: func() runtime.Object { return &corev1.Service{} }, NewList: func() runtime.Object { return &corev1.ServiceList{} },
	AddToScheme: corev1.AddToScheme}

// Every call of the agent's client against the real API server, in protobuf as the agent speaks it:
// an informer on its ListWatch (with a field selector) sees a Service created after it synced,
// discovery tells a served group version from one that is not, and ConfigMaps and Events go through.
func TestClientAgainstTheAPIServer(t *testing.T) {
	cp := controlplane.StartT(t, controlplane.Options{})
	rc := cp.AdminRESTConfig()
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	c, err := kube.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := cp.AdminClient()

	inf := cache.NewSharedIndexInformerWithOptions(c.ListWatch(services, fields.OneTermEqualSelector("metadata.namespace", "default").String()),
		services.New(), cache.SharedIndexInformerOptions{})
	go inf.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := admin.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok, _ := inf.GetStore().GetByKey("default/web"); ok {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the Service created after the sync never reached the informer")
		case <-time.After(20 * time.Millisecond):
		}
	}
	for _, key := range inf.GetStore().ListKeys() {
		if key != "default/web" && key != "default/kubernetes" {
			t.Errorf("the field selector let %s through", key)
		}
	}

	list, err := c.ServerResources(ctx, "networking.k8s.io/v1")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range list.APIResources {
		found = found || r.Name == "servicecidrs"
	}
	if !found {
		t.Errorf("networking.k8s.io/v1 without servicecidrs: %+v", list.APIResources)
	}
	if _, err := c.ServerResources(ctx, "nothing.example.com/v1"); !apierrors.IsNotFound(err) {
		t.Errorf("a group version the API does not serve: want NotFound, got %v", err)
	}

	if _, err := admin.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kp"},
		Data: map[string]string{"config.conf": "mode: ipvs"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if cm, err := c.GetConfigMap(ctx, "default", "kp"); err != nil || cm.Data["config.conf"] != "mode: ipvs" {
		t.Errorf("GetConfigMap: %+v, %v", cm, err)
	}
	if _, err := c.GetConfigMap(ctx, "default", "missing"); !apierrors.IsNotFound(err) {
		t.Errorf("a missing ConfigMap: want NotFound, got %v", err)
	}

	now := metav1.NewMicroTime(time.Now())
	ev := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "node-a.1"}, EventTime: now,
		ReportingController: "network-node-manager", ReportingInstance: "network-node-manager-test", Action: "x", Reason: "FixEnabled",
		Regarding: corev1.ObjectReference{Kind: "Node", Name: "node-a"}, Note: "n", Type: "Normal"}
	if _, err := c.CreateEvent(ctx, ev); err != nil {
		t.Fatal(err)
	}
	patch, _ := json.Marshal(map[string]any{"series": eventsv1.EventSeries{Count: 2, LastObservedTime: now}})
	got, err := c.PatchEvent(ctx, "default", "node-a.1", types.StrategicMergePatchType, patch)
	if err != nil || got.Series == nil || got.Series.Count != 2 {
		t.Fatalf("PatchEvent: %+v, %v", got, err)
	}
}
