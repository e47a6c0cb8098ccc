package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Limits of what every backend can render. Validate enforces them on every Ruleset, and fix options
// that end up in a Ruleset are checked against the same functions, so a value that passes config
// validation is one that both backends can apply.
const (
	// MaxInterfacePrefix is the longest input-interface prefix. Interface names have at most
	// IFNAMSIZ-1 = 15 bytes, and both backends spend one of them on the wildcard: iptables 1.8.9
	// refuses `-i 123456789012345+` ("must be shorter than IFNAMSIZ (15)") and nft 1.0.6 refuses
	// `iifname "123456789012345*"` ("String exceeds maximum length of 16"); 14 characters work in
	// both (tried in a network namespace).
	MaxInterfacePrefix = 14
	// MaxComment is the longest rule or map-element comment in bytes: nftables keeps comments of at
	// most 128 bytes (NFTNL_UDATA_COMMENT_MAXLEN); iptables' limit (255) is larger.
	MaxComment = 128
)

// ValidInterfacePrefix checks a prefix of interface names: 1 to MaxInterfacePrefix bytes of letters,
// digits and "_.@-" (the kernel also refuses '/', ':' and white space in names).
func ValidInterfacePrefix(s string) error {
	if s == "" {
		return fmt.Errorf("interface name prefix is empty")
	}
	if len(s) > MaxInterfacePrefix {
		return fmt.Errorf("interface name prefix %q has %d characters, at most %d can be matched (interface names have 15, and iptables' '+' or nftables' '*' takes one)", s, len(s), MaxInterfacePrefix)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_.@-", r)) {
			return fmt.Errorf("interface name prefix %q has %q, which interface names cannot have (letters, digits and _.@- only)", s, r)
		}
	}
	return nil
}

// ParsePrefix parses one CIDR of a configuration value. A bare address means that host alone (/32,
// /128; an IPv4-mapped address is taken as IPv4); an IPv4-mapped prefix is refused. Host bits set after the prefix length are an
// error, not silently cleared: "10.0.0.1/8" is more likely a typo than a wish for 10.0.0.0/8.
func ParsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	p, err := netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or an IP address", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is an IPv4-mapped prefix: write the IPv4 CIDR", s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Errorf("%q has host bits set (did you mean %s?)", s, m)
	}
	return p, nil
}

// ParsePrefixes parses a list option with ParsePrefix, drops duplicates and names key in errors
// (e.g. "fixes.invalid-drop.exemptSourceCIDRs: ..."). family, when not empty, is the only family
// accepted (for a value that is per family, like POD_CIDR_IPV4).
func ParsePrefixes(key string, family Family, list []string) ([]netip.Prefix, error) {
	return ParseList(key, list, func(s string) (netip.Prefix, error) {
		p, err := ParsePrefix(s)
		if err == nil && family != "" && !family.Contains(p.Addr()) {
			err = fmt.Errorf("%s is not an %s CIDR", p, family)
		}
		return p, err
	})
}

// ParseList parses every entry of a list option with parse and returns the distinct values in the
// order first given (nil for an empty list). The first entry parse refuses ends it, with parse's
// error prefixed by key (e.g. "fixes.invalid-drop.hooks: ...").
func ParseList[T comparable](key string, list []string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, s := range list {
		v, err := parse(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out, nil
}
