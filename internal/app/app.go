// Package app builds the agent's command line around a set of fix modules (the runtime behind the
// public front door, package app at the module's root):
//
//	app.NewCommand(version, fx.Options(fixes.Standard, myfix.Module)).Execute()
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/dig"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"github.com/network-node-manager/network-node-manager/backends"
	"github.com/network-node-manager/network-node-manager/core/backend"
	"github.com/network-node-manager/network-node-manager/core/fix"
	"github.com/network-node-manager/network-node-manager/core/rules"
	"github.com/network-node-manager/network-node-manager/internal/agent"
	"github.com/network-node-manager/network-node-manager/internal/config"
	"github.com/network-node-manager/network-node-manager/internal/detect"
	"github.com/network-node-manager/network-node-manager/internal/diagnose"
	"github.com/network-node-manager/network-node-manager/internal/engine"
	"github.com/network-node-manager/network-node-manager/internal/inputs/node"
	"github.com/network-node-manager/network-node-manager/internal/nodelock"
	"github.com/network-node-manager/network-node-manager/internal/watch"
)

// Build identifies the binary; the linker sets its parts (-X main.version=…, -X main.commit=…).
type Build struct {
	// Version is the semantic version (hack/version.sh).
	Version string
	// Commit is the git commit it was built from; empty when unknown.
	Commit string
}

// NewCommand returns the root command with run, plan, cleanup, version and diagnose.
func NewCommand(version string, fixModules fx.Option) *cobra.Command {
	return New(Build{Version: version}, fixModules)
}

// New is NewCommand with the commit too, for `version`.
func New(b Build, fixModules fx.Option) *cobra.Command {
	version := b.Version
	root := &cobra.Command{
		Use:           "network-node-manager",
		Short:         "Keeps a Kubernetes node's netfilter rules in the state its fix modules ask for",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(runCommand(version, fixModules), planCommand(version, fixModules),
		cleanupCommand(version, fixModules), versionCommand(b, fixModules), diagnoseCommand(version, fixModules))
	return root
}

func quiet() fx.Option {
	return fx.WithLogger(func() fxevent.Logger { return fxevent.NopLogger })
}

// buildApp builds the fx graph of a command: the fix modules and opts, with fx's own log silenced.
// A graph that cannot be built is reported by its root cause (the constructor that failed or the
// type nothing provides), not dig's whole chain.
func buildApp(fixModules fx.Option, opts ...fx.Option) (*fx.App, error) {
	app := fx.New(quiet(), fixModules, fx.Options(opts...))
	if err := app.Err(); err != nil {
		return nil, dig.RootCause(err)
	}
	return app, nil
}

func agentInputs(cmd *cobra.Command, version string) agent.Inputs {
	return agent.Inputs{Flags: cmd.Flags(), Environ: config.Environ(), Version: version}
}

// DefaultGCPercent is the agent's GC goal when GOGC is not set: the heap may grow by half of what
// was live after the last collection before the next one starts, where Go's default lets it double.
// The agent allocates in bursts (a cold start lists and programs every Service at once, a change
// rebuilds a map's sorted entries) and holds little between them, so the goal, not the live heap,
// sets its peak RSS: at 10,000 Services 4-8 MiB less (BENCHMARKS.md, "#21 closing runs"), for
// collections twice as often during the bursts (the iptables cold start may be slower by part of
// that: not resolved there). GOGC, when set, is left alone.
const DefaultGCPercent = 50

// gcPercent returns the GC percent to set, and false when GOGC is set in the environment.
func gcPercent(lookupEnv func(string) (string, bool)) (int, bool) {
	if _, set := lookupEnv("GOGC"); set {
		return 0, false
	}
	return DefaultGCPercent, true
}

func runCommand(version string, fixModules fx.Option) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the agent: watch the API and keep the rules in the kernel",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if p, ok := gcPercent(os.LookupEnv); ok {
				debug.SetGCPercent(p)
			}
			app, err := buildApp(fixModules, agent.Agent, agent.Overrides, backends.Module, backends.Takeover,
				fx.Supply(agentInputs(cmd, version)),
				fx.Provide(agent.Hub),
				fx.Invoke(agent.WatchConfig),
			)
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
			defer cancel()
			startCtx, startCancel := context.WithTimeout(ctx, time.Minute)
			defer startCancel()
			if err := app.Start(startCtx); err != nil {
				return err
			}
			<-ctx.Done()
			stopCtx, stopCancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer stopCancel()
			// Rules stay in the kernel: a restart must not interrupt traffic. Use `cleanup` to remove them.
			return app.Stop(stopCtx)
		},
	}
	config.AddFlags(cmd.Flags())
	return cmd
}

func planCommand(version string, fixModules fx.Option) *cobra.Command {
	var servicesFile string
	cmd := &cobra.Command{
		Use:   "plan --services FILE",
		Short: "Print exactly the rules that would be applied for the Services in FILE, touching nothing",
		Long: "Reads Services (and optionally this node's Node) from a YAML file and prints, per enabled fix and\n" +
			"family, the input the backend would feed iptables-restore or nft -f. With --backend auto (the\n" +
			"default) both backends are shown.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var e *engine.Engine
			var cfg *config.Config
			var n *node.Input
			var hub *watch.Hub
			var det detect.Result
			if _, err := buildApp(fixModules, agent.Module, backends.Module,
				fx.Supply(agentInputs(cmd, version)),
				fx.Provide(agent.FileHub(servicesFile)),
				fx.Populate(&e, &cfg, &n, &hub, &det),
			); err != nil {
				return err
			}
			// planForNode may start the Node's informer; printPlan's engine Stop ends it, but not
			// when planForNode fails first.
			defer hub.Stop()
			cfg, err := planForNode(cmd.Context(), cmd.OutOrStdout(), e, cfg, n, hub)
			if err != nil {
				return err
			}
			names := backends.Names
			if cfg.Backend != "auto" {
				names = []string{cfg.Backend}
			}
			printProxyMode(cmd.OutOrStdout(), det)
			return printPlan(cmd.OutOrStdout(), e, cfg, names)
		},
	}
	config.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&servicesFile, "services", "", "YAML file with Services (and optionally a Node)")
	return cmd
}

// planLoadTimeout bounds how long `plan` waits for the inputs to read the file's objects.
const planLoadTimeout = 30 * time.Second

// printProxyMode says what the plan assumes of kube-proxy: its mode and how it was found, or that
// the node has none, or that it could not tell.
func printProxyMode(w io.Writer, r detect.Result) {
	switch r.ProxyMode {
	case detect.ModeNone:
		fmt.Fprintf(w, "# kube-proxy: none on this node (%s: no /proxyMode answer, no kube-proxy chains, tables or kube-ipvs0 link)\n", r.ProxyModeSource)
	case "":
		fmt.Fprintf(w, "# kube-proxy: mode unknown (%s); mode-specific fixes keep their conservative defaults\n", r.ProxyModeSource)
	default:
		fmt.Fprintf(w, "# kube-proxy: %s mode (%s)\n", r.ProxyMode, r.ProxyModeSource)
	}
}

func printPlan(w io.Writer, e *engine.Engine, cfg *config.Config, names []string) error {
	for _, st := range e.Statuses() {
		switch {
		case st.Refusal != nil:
			fmt.Fprintf(w, "# fix %s: refused: %v\n", st.Fix, st.Refusal)
		case !st.Enabled:
			fmt.Fprintf(w, "# fix %s: disabled\n", st.Fix)
		case st.NodeState:
			fmt.Fprintf(w, "# fix %s: enabled; it changes node state, not rules: nothing to print\n", st.Fix)
		default:
			fmt.Fprintf(w, "# fix %s: enabled\n", st.Fix)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), planLoadTimeout)
	defer cancel()
	defer func() { _ = e.Stop(ctx) }()
	if err := e.Load(ctx); err != nil {
		return fmt.Errorf("plan: reading the file's objects: %w", err)
	}
	sets, reports, err := e.Plan()
	if err != nil {
		return err
	}
	for _, name := range names {
		be, err := backends.New(name, cfg.IptablesVariant, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil && name == backend.IPTables {
			be, err = backends.New(name, "nft", slog.New(slog.NewTextHandler(io.Discard, nil)))
		}
		if err != nil {
			return err
		}
		for i, rs := range sets {
			text, err := be.Render(rs)
			if err != nil {
				return fmt.Errorf("%s: render %s (%s): %w", name, rs.Fix, rs.Family, err)
			}
			fmt.Fprintf(w, "\n# ---- backend %s, fix %s, family %s: %d rules, %d objects covered\n",
				name, rs.Fix, rs.Family, rs.RuleCount(), reports[i].Covered)
			for _, s := range reports[i].Skipped {
				fmt.Fprintf(w, "# skipped %s: %s %s\n", s.Object, s.Reason, s.Detail)
			}
			fmt.Fprint(w, text)
		}
	}
	return nil
}

func cleanupCommand(version string, fixModules fx.Option) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "cleanup",
		Short: "Remove every rule, chain and table the agent owns (both backends, both families) and the predecessor's NMANAGER_* chains, and revert node-state fixes (e.g. sysctls)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg *config.Config
			var log *slog.Logger
			var fixes fix.In
			var api *agent.APIClient
			// The fixes are built (not started) so that node-state fixes can be reverted; their
			// constructors need a backend value but use it only when syncing.
			if _, err := buildApp(fixModules, agent.Module, fx.Supply(agentInputs(cmd, version)),
				fx.Provide(func() backend.Backend { return nil }),
				fx.Populate(&cfg, &log, &fixes, &api)); err != nil {
				return err
			}
			if dryRun {
				return CleanupPlan(cmd.Context(), cmd.OutOrStdout(), fixes.Fixes, cfg, log)
			}
			err := errors.Join(Cleanup(cmd.Context(), cfg, log), RevertNodeState(cmd.Context(), fixes.Fixes, cfg, log),
				RemoveNodeConditions(cmd.Context(), cfg, api, log))
			removeAgentStatus(log)
			removeNodeLock(log)
			return err
		},
	}
	// Only the flags cleanup reads: it removes what both backends own in both families whatever
	// --backend or --families say, so accepting those would let an operator believe otherwise.
	config.AddKeyFlags(cmd.Flags(), cleanupKeys...)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what cleanup would remove and revert, and change nothing")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return fmt.Errorf("cleanup: %w; cleanup reads only --config, --set, --dry-run and --%s (it removes what both backends own, in both families)",
			err, strings.Join(cleanupFlags(), ", --"))
	})
	return cmd
}

// cleanupKeys are the configuration keys cleanup reads: this node and the API (to remove its Node's
// conditions), the iptables variant to clean first, where sysctls are reverted, and how it logs
// (fix options come with --set or the file).
var cleanupKeys = []string{"nodeName", "kubeconfig", "iptablesVariant", "procSysPath", "logLevel", "logFormat"}

func cleanupFlags() []string {
	var out []string
	for _, k := range config.Keys {
		if slices.Contains(cleanupKeys, k.Key) {
			out = append(out, k.Flag)
		}
	}
	return out
}

// CleanupPlan prints what Cleanup and RevertNodeState would do, one line each, and changes nothing:
// the chains and tables of every backend target Cleanup visits, and the node-state fixes it reverts.
func CleanupPlan(ctx context.Context, w io.Writer, fixes []fix.Fix, cfg *config.Config, log *slog.Logger) error {
	if ctx == nil {
		ctx = context.Background()
	}
	var errs []error
	n := 0
	for i, t := range cleanupTargets(cfg) {
		be, err := backends.New(t.name, t.variant, log)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p, ok := backend.As[backend.CleanupPlanner](be)
		if !ok {
			fmt.Fprintf(w, "would clean up %s %s (it cannot list what it owns)\n", t.name, t.variant)
			continue
		}
		lines, err := p.CleanupPlan(ctx)
		if err != nil {
			if t.name == backend.IPTables && i > 0 {
				log.Warn("dry run skipped for the other iptables variant", "variant", t.variant, "err", err)
				continue
			}
			errs = append(errs, fmt.Errorf("%s %s: %w", t.name, t.variant, err))
		}
		for _, l := range lines {
			fmt.Fprintf(w, "would remove %s\n", l)
			n++
		}
	}
	for _, f := range fixes {
		if _, ok := f.(fix.Actuator); ok {
			fmt.Fprintf(w, "would revert the node state of fix %s (what it recorded changing, if anything)\n", f.ID())
		}
	}
	if path, err := nodelock.Path(nodelock.Dir); err == nil {
		if _, err := os.Stat(path); err == nil {
			fmt.Fprintf(w, "would remove the node lock file %s (unless an agent still holds it)\n", path)
		}
	}
	if cfg.NodeName != "" {
		fmt.Fprintf(w, "would remove the agent's conditions from Node %s, with API access (%s)\n", cfg.NodeName, diagnose.ConditionTypeList())
	}
	fmt.Fprintf(w, "dry run: %d chains or tables to remove; nothing was changed\n", n)
	return errors.Join(errs...)
}

// removeNodeLock deletes this network namespace's node lock file (internal/nodelock), the last
// file the agent leaves on the node, unless an agent still runs here (it would program its rules
// again: that is logged, not an error of the cleanup).
func removeNodeLock(log *slog.Logger) {
	path, err := nodelock.Remove(nodelock.Dir)
	switch {
	case errors.Is(err, nodelock.ErrHeld):
		log.Warn("an agent still runs in this network namespace and will program its rules again; its lock file stays", "err", err)
	case err != nil:
		log.Warn("the node lock file was not removed", "err", err)
	case path != "":
		log.Info("node lock file removed", "file", path)
	}
}

// RemoveNodeConditions removes the agent's conditions (diagnose.ConditionTypes) from this node's
// Node. Without an API client or a node name there is nothing it can reach: that is logged, not an
// error (the uninstall pods of deploy/uninstall have both).
func RemoveNodeConditions(ctx context.Context, cfg *config.Config, api *agent.APIClient, log *slog.Logger) error {
	client, err := api.Get()
	if err != nil || cfg.NodeName == "" {
		log.Info("the Node's conditions were not removed: no API client or no node name (NNM_NODE_NAME)", "err", err)
		return nil
	}
	nc, err := agent.NewNodeConditions(client, cfg.NodeName, nil, log)
	if err != nil {
		return err
	}
	n, err := nc.Remove(ctx)
	if err != nil {
		return err
	}
	log.Info("node conditions removed", "node", cfg.NodeName, "conditions", n)
	return nil
}

// removeAgentStatus deletes the agent's status file of this network namespace (diagnose's view of
// the running agent).
func removeAgentStatus(log *slog.Logger) {
	path, err := diagnose.StatusPath(diagnose.DefaultStatusDir)
	if err == nil {
		err = diagnose.RemoveStatus(path)
	}
	if err != nil {
		log.Warn("the agent status file was not removed", "err", err)
	}
}

// RevertNodeState reverts every fix that changes node state other than rules (fix.Actuator), enabled
// or not, with its options from cfg (e.g. where it keeps the value to restore).
func RevertNodeState(ctx context.Context, fixes []fix.Fix, cfg *config.Config, log *slog.Logger) error {
	if ctx == nil {
		ctx = context.Background()
	}
	var errs []error
	for _, f := range fixes {
		a, ok := f.(fix.Actuator)
		if !ok {
			continue
		}
		ignored, err := cfg.ConfigureFix(f.ID(), f.Configure)
		for _, w := range ignored {
			log.Warn("config: " + w)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("fix %s: %w", f.ID(), err))
			continue
		}
		if err := a.Revert(ctx); err != nil {
			errs = append(errs, fmt.Errorf("fix %s: revert: %w", f.ID(), err))
			continue
		}
		log.Info("reverted", "fix", f.ID())
	}
	return errors.Join(errs...)
}

type cleanupTarget struct{ name, variant string }

// cleanupTargets are the backends Cleanup visits, the node's own iptables variant first.
func cleanupTargets(cfg *config.Config) []cleanupTarget {
	variants := []string{"nft", "legacy"}
	if cfg.IptablesVariant == "legacy" {
		variants = []string{"legacy", "nft"}
	}
	var targets []cleanupTarget
	for _, v := range variants {
		targets = append(targets, cleanupTarget{backend.IPTables, v})
	}
	return append(targets, cleanupTarget{backend.NFTables, ""})
}

// Cleanup removes what every backend owns. The iptables variant of the node is cleaned; the other
// variant too when its binaries work, so that nothing of ours survives a variant switch.
func Cleanup(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	if ctx == nil {
		ctx = context.Background()
	}
	var errs []error
	for i, t := range cleanupTargets(cfg) {
		be, err := backends.New(t.name, t.variant, log)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := be.Cleanup(ctx); err != nil {
			// The node's own iptables variant and nftables must clean up; the other variant may be absent.
			if t.name == backend.IPTables && i > 0 {
				log.Warn("cleanup skipped for the other iptables variant", "variant", t.variant, "err", err)
				continue
			}
			errs = append(errs, fmt.Errorf("%s %s: %w", t.name, t.variant, err))
			continue
		}
		log.Info("cleaned up", "backend", t.name, "variant", t.variant)
	}
	return errors.Join(errs...)
}

func versionCommand(b Build, fixModules fx.Option) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go version and platform, and the registered fixes and backends",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var fixes struct {
				fx.In
				Fixes []fix.Fix `group:"fixes"`
			}
			// The fixes' constructors need the core's providers, but nothing is started.
			if _, err := buildApp(fixModules, agent.Module,
				fx.Supply(agent.Inputs{Environ: nil, Version: b.Version}),
				fx.Provide(func() backend.Backend { return nil }),
				fx.Populate(&fixes)); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			commit := b.Commit
			if commit == "" {
				commit = "unknown"
			}
			fmt.Fprintf(w, "network-node-manager %s\ncommit: %s\ngo: %s %s/%s\nfixes:\n",
				b.Version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			list := fixes.Fixes
			sort.Slice(list, func(i, j int) bool { return list[i].ID() < list[j].ID() })
			for _, f := range list {
				fmt.Fprintf(w, "  %-22s %s\n", f.ID(), f.Description())
			}
			fmt.Fprintf(w, "backends: %s\nfamilies: %s, %s\n", strings.Join(backends.Names, ", "), rules.IPv4, rules.IPv6)
			return nil
		},
	}
}
