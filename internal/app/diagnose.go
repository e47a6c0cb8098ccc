package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/network-node-manager/network-node-manager/core/inputs"

	"github.com/spf13/cobra"
	"go.uber.org/fx"
	corev1 "k8s.io/api/core/v1"

	"github.com/network-node-manager/network-node-manager/backends"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
)

// ExitError is an error that asks for a particular exit status; its message may be empty (the
// command printed what it had to say).
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return e.Msg }

// ExitCode is the process exit status for the error a command returned: 0 for none, the code of an
// ExitError, else 1.
func ExitCode(err error) int {
	var e *ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return e.Code
	}
	return 1
}

// diagnoseTimeout bounds a whole `diagnose` run.
const diagnoseTimeout = 2 * time.Minute

func diagnoseCommand(version string, fixModules fx.Option) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "diagnose",
		Short: "Tell which of the problems the fixes repair this node has, reading only (exit status 2: a problem no enabled fix handles)",
		Long: "Runs read-only checks on this node (conntrack, sysctls, links and routes, kube-proxy's rules) and,\n" +
			"with API access, on this node's Node and Pods, the Services and EndpointSlices. Each check says ok,\n" +
			"problem, handled by <fix>, or cannot tell and why, with the evidence it read and the fix or setting\n" +
			"that would handle it. --output json prints the versioned document of docs/diagnose.md.\n" +
			"Exit status: 0 no problem left open, 2 some problem that no enabled fix handles, 1 diagnose failed.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("diagnose: --output %q: want text or json", output)
			}
			var p agent.DiagnoseParams
			var api *agent.APIClient
			var cfg *config.Config
			if _, err := buildApp(fixModules, agent.Module, backends.Module,
				fx.Supply(agentInputs(cmd, version)),
				fx.Provide(agent.Hub, agent.RunProbes),
				fx.Populate(&p, &api, &cfg),
			); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), diagnoseTimeout)
			defer cancel()
			// The Node is listed first: its labels choose the nodeOverrides entry, which decides
			// which fixes count as enabled.
			var snap *fix.Snapshot
			var missing map[string]string
			client, apiErr := api.Get()
			if apiErr == nil {
				snap, missing = diagnose.ReadCluster(ctx, client, cfg.NodeName)
			}
			var labels map[string]string
			if n := nodeOf(snap); n != nil {
				labels = n.Labels
				if labels == nil {
					labels = map[string]string{}
				}
			}
			eff, ov := cfg.ForNode(labels)
			if err := p.Engine.Configure(eff); err != nil {
				return err
			}
			env := agent.DiagnoseEnv(p, eff, ov)
			if err := diagnose.ValidateAcknowledged(env.Acknowledged); err != nil {
				return err
			}
			if len(cfg.NodeOverrides()) > 0 && labels == nil {
				env.Override += " (this node's Node was not read: the base configuration)"
			}
			// Which fixes run, with which options, and whether their last sync succeeded is the
			// running agent's to say (its status file); without one, the configuration says which
			// fixes would run, and none counts as handling a problem.
			if path, err := diagnose.StatusPath(diagnose.DefaultStatusDir); err != nil {
				env.Agent = "as configured: " + err.Error()
			} else if st, why := diagnose.ReadStatus(path, time.Now()); st != nil {
				st.Use(env)
			} else {
				env.Agent = "as configured: " + why
			}
			if apiErr != nil {
				env.NoAPI(apiErr)
			} else {
				env.Cluster, env.Missing = snap, missing
			}
			cidrs, err := cfg.ParsedPodCIDRs()
			if err != nil {
				return err
			}
			env.PodCIDRs, env.PodCIDRsWhy = diagnose.PodCIDRsOf(env.Cluster, env.Missing, cidrs)
			r := diagnose.Run(ctx, env, diagnose.Checks())
			render := diagnose.Text
			if output == "json" {
				render = diagnose.JSON
			}
			if err := render(cmd.OutOrStdout(), r); err != nil {
				return err
			}
			if code := r.ExitCode(); code != 0 {
				return &ExitError{Code: code}
			}
			return nil
		},
	}
	config.AddFlags(cmd.Flags())
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

func nodeOf(snap *fix.Snapshot) *corev1.Node {
	if snap == nil {
		return nil
	}
	return inputs.Node.Get(snap)
}
