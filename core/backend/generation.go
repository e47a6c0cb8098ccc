package backend

import "log/slog"

// Generation reads the generation id of the nf_tables ruleset of the calling thread's network
// namespace (NFT_MSG_GETGEN): a counter that every committed nf_tables transaction bumps, whoever
// sent it. Two equal readings mean nothing in nf_tables changed in between, so the Driver, having
// stamped a record with the generation after its own commit, proves the unit unchanged without
// listing it. Backends take one as a seam (internal/nfgen.Get in the agent; tests count or fake
// it); nil for legacy iptables, which is not nf_tables.
type Generation func() (uint32, error)

// Read calls f; ok is false when there is no generation (f nil: legacy iptables, a fake kernel) or
// it cannot be read, which is logged at debug level: the caller then reads its objects instead.
func (f Generation) Read(log *slog.Logger) (gen uint32, ok bool) {
	if f == nil {
		return 0, false
	}
	g, err := f()
	if err != nil {
		log.Debug("cannot read the nf_tables generation; reading our objects instead", "err", err)
		return 0, false
	}
	return g, true
}

// stamp is the generation at which a backend's record was known to match the kernel. The zero
// stamp knows nothing.
type stamp struct {
	gen uint32
	ok  bool
}

// stampAt is the stamp of generation g when ok (a successful Read), else the zero stamp.
func stampAt(g uint32, ok bool) stamp { return stamp{gen: g, ok: ok} }

// Is reports whether the stamp is generation g (ok: g was read successfully).
func (s stamp) Is(g uint32, ok bool) bool { return ok && s.ok && s.gen == g }

// Promoted is s moved from g0 to g1 after only our own commit moved the generation between
// them; any other stamp is returned unchanged.
func (s stamp) Promoted(g0, g1 uint32) stamp {
	if s.Is(g0, true) {
		return stampAt(g1, true)
	}
	return s
}
