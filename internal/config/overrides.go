package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/network-node-manager/network-node-manager/core/fix"
)

// NodeOverridesKey is the file's top-level list of per-node settings: each entry has a nodeSelector
// (a Kubernetes label selector: matchLabels, matchExpressions) and fixes (fixes.<id> settings laid
// over the file's own). On a node, the first entry whose selector matches the Node's labels
// applies; none matching leaves the base configuration. It is set only in the file (no flag or
// environment variable): a list of selectors is no single value.
const NodeOverridesKey = "nodeOverrides"

// NodeOverride is one entry of nodeOverrides, validated. It holds what it needs only (the compiled
// selector; its options in a list, not maps): the loaded configuration is held twice while a reload
// loads the next, and at 6,393 entries (the largest accepted file) the selectors as written and two
// maps per entry were most of it.
type NodeOverride struct {
	// Index is the entry's place in the list, from 0: nodeOverrides[Index].
	Index int

	selector labels.Selector
	// options are the fixes.<id> settings the entry lays over the base ones, option by option,
	// sorted by fix and option (in NormalizeKey's spelling).
	options []fixOption
}

// fixOption is one option of a fix that an entry sets.
type fixOption struct {
	fix, key string
	value    any
}

// Fixes are the fixes.<id> settings the entry lays over the base ones (a map made at each call).
func (o NodeOverride) Fixes() map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, opt := range o.options {
		if out[opt.fix] == nil {
			out[opt.fix] = map[string]any{}
		}
		out[opt.fix][opt.key] = opt.value
	}
	return out
}

// Selector is the entry's selector in Kubernetes' text form ("pool=canary,zone in (a,b)"); an empty
// selector, which selects every node, is "(every node)".
func (o NodeOverride) Selector() string {
	if s := o.selector.String(); s != "" {
		return s
	}
	return "(every node)"
}

// Matches reports whether the entry's selector selects a node with these labels.
func (o NodeOverride) Matches(nodeLabels map[string]string) bool {
	return o.selector.Matches(labels.Set(nodeLabels))
}

// Override says which entry of nodeOverrides a configuration applies on a node.
type Override struct {
	// Index is the entry (nodeOverrides[Index]); -1 when none applies.
	Index int
	// Selector is the entry's selector (NodeOverride.Selector); "" when none applies.
	Selector string
}

// None is the Override of a node that no entry selects (or of a configuration without entries).
var None = Override{Index: -1}

// Applies reports whether an entry applies.
func (o Override) Applies() bool { return o.Index >= 0 }

// String is "override 0 (pool=canary)" or "no override".
func (o Override) String() string {
	if !o.Applies() {
		return "no override"
	}
	return fmt.Sprintf("override %d (%s)", o.Index, o.Selector)
}

// NodeOverrides are the validated entries of the base configuration's nodeOverrides.
func (c *Config) NodeOverrides() []NodeOverride { return c.Base().overrides }

// Base is the configuration as loaded, before any node override (c itself when c is one).
func (c *Config) Base() *Config {
	if c.base != nil {
		return c.base
	}
	return c
}

// Override is the entry of nodeOverrides this configuration applies (None for a base one).
func (c *Config) Override() Override {
	if c.base == nil {
		return None
	}
	return c.override
}

// ResolveOverride returns the first entry of nodeOverrides that selects a node with these labels,
// else None. nil labels (the Node is not known) select nothing: the base configuration applies.
func (c *Config) ResolveOverride(nodeLabels map[string]string) Override {
	if nodeLabels == nil {
		return None
	}
	for _, o := range c.NodeOverrides() {
		if o.Matches(nodeLabels) {
			return Override{Index: o.Index, Selector: o.Selector()}
		}
	}
	return None
}

// ForNode is the configuration in effect on a node with these labels: the base configuration with
// the fixes settings of the first matching entry of nodeOverrides laid over it, option by option
// (keys matched as fix options are, NormalizeKey), and which entry that is. Errors about an
// option an entry set name it as nodeOverrides[i].fixes.<id>.<key> and its line. The result's Base
// is the base configuration, so ForNode may be called on a result again; a configuration no entry
// applies to is a copy of the base with Override None. The agent gives the engine the result, and
// `plan` and `diagnose` show its Override.
func (c *Config) ForNode(nodeLabels map[string]string) (*Config, Override) {
	base := c.Base()
	ov := base.ResolveOverride(nodeLabels)
	eff := *base
	eff.base, eff.override = base, ov
	eff.ignored = nil
	eff.origins = origins{m: map[string]origin{}, under: &base.origins}
	eff.Fixes = map[string]map[string]any{}
	for id, opts := range base.Fixes {
		eff.Fixes[id] = maps.Clone(opts)
	}
	if !ov.Applies() {
		return &eff, ov
	}
	for _, opt := range base.overrides[ov.Index].options {
		id, k := opt.fix, opt.key
		section := eff.Fixes[id]
		if section == nil {
			section = map[string]any{}
			eff.Fixes[id] = section
		}
		for old := range section { // a Config built by hand may spell options otherwise
			if old != k && NormalizeKey(old) == k {
				delete(section, old)
			}
		}
		section[k] = opt.value // in NormalizeKey's spelling
		at := fmt.Sprintf("%s[%d].fixes.%s.%s", NodeOverridesKey, ov.Index, id, k)
		x, ok := base.origins.lookup(originKey(at))
		if !ok {
			x = origin{written: at}
		}
		eff.origins.m[originKey("fixes."+id+"."+k)] = x
	}
	return &eff, ov
}

// NormalizeKey is the one spelling under which keys of fix options compare: lower case, without
// '-' and '_' (podInterfacePrefix, pod-interface-prefix and POD_INTERFACE_PREFIX are one option).
// It is fix.NormalizeKey, which fix.Decode matches options with.
func NormalizeKey(key string) string { return fix.NormalizeKey(key) }

// parseNodeOverrides validates the file's nodeOverrides (n, as YAML read it). Errors name the entry
// and the field: nodeOverrides[1].nodeSelector.matchExpressions (line 9): …
//
// The entries are read one at a time: the lines of an entry's keys are recorded in a layer of
// origins of its own over o, its node decoded and then dropped from n, and once it is checked only
// the lines of its fixes' options (what errors name when it applies, ForNode) are kept in o. So the
// memory a load holds at once does not grow with the entries' text beyond their nodes (issue #63).
func parseNodeOverrides(n *yaml.Node, fixIDs []string, o origins, version int) ([]NodeOverride, []string, error) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil, nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		var val any
		_ = n.Decode(&val)
		return nil, nil, o.errorf(NodeOverridesKey, "%s is not a list of {nodeSelector: …, fixes: …} entries", fix.ShowValue(val))
	}
	written, _ := o.at(NodeOverridesKey)
	key := strings.ToLower(NodeOverridesKey)
	var out []NodeOverride
	var warnings []string
	var errs []error
	for i, itemNode := range n.Content {
		index := "[" + strconv.Itoa(i) + "]"
		eo := origins{m: map[string]origin{key + index: {written: written + index, line: itemNode.Line}}, under: &o}
		var item any
		if itemNode.Kind == yaml.MappingNode {
			if err := eo.record(itemNode.Content, written+index+".", key+index+".", 0); err != nil {
				return nil, nil, err
			}
		}
		if err := itemNode.Decode(&item); err != nil {
			return nil, nil, eo.errorf(fmt.Sprintf("%s[%d]", NodeOverridesKey, i), "not a mapping such as {nodeSelector: {matchLabels: {pool: canary}}, fixes: {mss-clamp: {enabled: true}}}")
		}
		n.Content[i] = nil // its nodes are garbage from here on
		entry, w, err := parseNodeOverride(i, item, fixIDs, eo, version)
		warnings = append(warnings, w...)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, entry)
		for k, x := range eo.m {
			if _, opt, isFixes := strings.Cut(k, "].fixes."); isFixes && strings.Count(opt, ".") == 1 && !strings.Contains(opt, "[") {
				o.m[k] = x
			}
		}
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	return out, warnings, nil
}

// parseNodeOverride validates entry i of nodeOverrides (item, as YAML read it), o the origins of
// its keys.
func parseNodeOverride(i int, item any, fixIDs []string, o origins, version int) (NodeOverride, []string, error) {
	newer := func(key string) bool { return version > Version && o.fromFile(key) }
	var warnings []string
	var errs []error
	at := fmt.Sprintf("%s[%d]", NodeOverridesKey, i)
	m, ok := item.(map[string]any)
	if !ok {
		return NodeOverride{}, nil, o.errorf(at, "%s is not a mapping such as {nodeSelector: {matchLabels: {pool: canary}}, fixes: {mss-clamp: {enabled: true}}}", fix.ShowValue(item))
	}
	entry := NodeOverride{Index: i}
	var sel any
	haveSel := false
	for _, k := range slices.Sorted(maps.Keys(m)) {
		switch {
		case strings.EqualFold(k, "nodeSelector"):
			sel, haveSel = m[k], true
		case strings.EqualFold(k, "fixes"):
			w, err := overrideFixes(m[k], at+"."+k, fixIDs, o, newer, version, &entry.options)
			warnings = append(warnings, w...)
			if err != nil {
				errs = append(errs, err)
			}
		case newer(at + "." + k):
			warnings = append(warnings, o.newerKey(at+"."+k, version))
		default:
			errs = append(errs, o.unknown(at+"."+k, "key", k, []string{"nodeSelector", "fixes"}))
		}
	}
	if !haveSel || sel == nil {
		errs = append(errs, o.errorf(at, "no nodeSelector; accepted: a label selector such as {matchLabels: {pool: canary}} ({} selects every node)"))
		return entry, warnings, errors.Join(errs...)
	}
	s, err := labelSelector(sel, at+".nodeSelector", o)
	if err != nil {
		return entry, warnings, errors.Join(append(errs, err)...)
	}
	if entry.selector, err = metav1.LabelSelectorAsSelector(&s); err != nil {
		errs = append(errs, o.errorf(at+".nodeSelector", "%v", err))
	}
	return entry, warnings, errors.Join(errs...)
}

// labelSelector reads a metav1.LabelSelector strictly: only matchLabels and matchExpressions, each
// expression only key, operator and values, every label and value a string. It converts what YAML
// read field by field (a round trip through JSON was a tenth of the garbage of loading the largest
// accepted file, issue #63).
func labelSelector(val any, at string, o origins) (metav1.LabelSelector, error) {
	var s metav1.LabelSelector
	m, ok := val.(map[string]any)
	if !ok {
		return s, o.errorf(at, "%s is not a label selector such as {matchLabels: {pool: canary}}", fix.ShowValue(val))
	}
	for k := range m {
		if k != "matchLabels" && k != "matchExpressions" {
			return s, o.unknown(at+"."+k, "key", k, []string{"matchLabels", "matchExpressions"})
		}
	}
	notSelector := func(field string) error {
		return o.errorf(field, "not a label selector such as {matchLabels: {pool: canary}} or {matchExpressions: [{key: pool, operator: In, values: [canary]}]}")
	}
	if v := m["matchLabels"]; v != nil {
		labels, ok := v.(map[string]any)
		if !ok {
			return s, notSelector(at + ".matchLabels")
		}
		s.MatchLabels = make(map[string]string, len(labels))
		for k, lv := range labels {
			if s.MatchLabels[k], ok = lv.(string); !ok {
				return s, notSelector(at + ".matchLabels." + k)
			}
		}
	}
	if v := m["matchExpressions"]; v != nil {
		exprs, ok := v.([]any)
		if !ok {
			return s, notSelector(at + ".matchExpressions")
		}
		for j, e := range exprs {
			where := fmt.Sprintf("%s.matchExpressions[%d]", at, j)
			em, ok := e.(map[string]any)
			if !ok {
				return s, o.errorf(where, "%s is not a mapping such as {key: pool, operator: In, values: [canary]}", fix.ShowValue(e))
			}
			var req metav1.LabelSelectorRequirement
			for k, f := range em {
				switch k {
				case "key":
					req.Key, ok = f.(string)
				case "operator":
					var op string
					op, ok = f.(string)
					req.Operator = metav1.LabelSelectorOperator(op)
				case "values":
					var vals []any
					if vals, ok = f.([]any); ok || f == nil {
						ok = true
						for _, x := range vals {
							str, isStr := x.(string)
							ok = ok && isStr
							req.Values = append(req.Values, str)
						}
					}
				default:
					return s, o.unknown(where+"."+k, "key", k, []string{"key", "operator", "values"})
				}
				if !ok && f != nil {
					return s, notSelector(where + "." + k)
				}
			}
			s.MatchExpressions = append(s.MatchExpressions, req)
		}
	}
	return s, nil
}

// overrideFixes checks an entry's fixes (a mapping of registered fix ids to mappings; enabled true or
// false) into out, sorted by fix and option. The options themselves are checked by the fix wherever the entry applies, as
// the base ones are.
func overrideFixes(val any, at string, fixIDs []string, o origins, newer func(string) bool, version int, out *[]fixOption) ([]string, error) {
	if val == nil {
		return nil, nil
	}
	sections, ok := val.(map[string]any)
	if !ok {
		return nil, o.errorf(at, "%s is not a mapping of fix ids such as {mss-clamp: {enabled: true}}", fix.ShowValue(val))
	}
	var warnings []string
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(sections)) {
		key := at + "." + id
		if !slices.Contains(fixIDs, id) {
			if newer(key) {
				warnings = append(warnings, o.newerKey(key, version))
				continue
			}
			errs = append(errs, o.unknown(key, "fix", id, fixIDs))
			continue
		}
		section, ok := sections[id].(map[string]any)
		if sections[id] != nil && !ok {
			errs = append(errs, o.errorf(key, "%s is not a mapping such as {enabled: true}", fix.ShowValue(sections[id])))
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(section)) {
			v := section[k]
			if strings.EqualFold(k, "enabled") {
				if _, err := parseBool(v); err != nil {
					errs = append(errs, o.errorf(key+"."+k, "%s is not true or false", fix.ShowValue(v)))
					continue
				}
			}
			*out = append(*out, fixOption{fix: id, key: NormalizeKey(k), value: v})
		}
	}
	slices.SortStableFunc(*out, func(a, b fixOption) int { return cmp.Or(strings.Compare(a.fix, b.fix), strings.Compare(a.key, b.key)) })
	return warnings, errors.Join(errs...)
}
