package main

import (
	"fmt"
	"os"
	"path/filepath"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/network-node-manager/network-node-manager/internal/testing/agenttest"
)

// manifest is what the DaemonSet (deploy/base/daemonset.yaml) gives the agent container that
// matters for memory: its literal environment (GOMEMLIMIT) and its memory limit.
type manifest struct {
	env   []string
	limit resource.Quantity
}

func readManifest() (*manifest, error) {
	root, err := agenttest.RepoRoot()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(root, "deploy", "base", "daemonset.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(data, &ds); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name != "agent" {
			continue
		}
		m := &manifest{limit: c.Resources.Limits.Memory().DeepCopy()}
		for _, e := range c.Env {
			switch {
			case e.ValueFrom == nil:
				m.env = append(m.env, e.Name+"="+e.Value)
			case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
				// The downward API's value: the limit in bytes (the bench's cgroup holds the same).
				m.env = append(m.env, fmt.Sprintf("%s=%d", e.Name, c.Resources.Limits.Memory().Value()))
			}
		}
		if m.limit.IsZero() {
			return nil, fmt.Errorf("%s: the agent container has no memory limit", path)
		}
		return m, nil
	}
	return nil, fmt.Errorf("%s: no container named agent", path)
}
