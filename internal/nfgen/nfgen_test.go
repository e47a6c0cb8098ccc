package nfgen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/network-node-manager/network-node-manager/core/testkit/netns"
)

// TestGenerationCountsCommitsInItsNamespace checks that the generation is read in the calling
// thread's namespace and that each committed nft transaction bumps it by one, while a listing does not.
func TestGenerationCountsCommitsInItsNamespace(t *testing.T) {
	netns.Require(t, "nft")
	ns := netns.New(t, "nnmt-gen")
	read := func() uint32 {
		t.Helper()
		var g uint32
		if err := ns.Do(func() (err error) { g, err = Get(); return err }); err != nil {
			t.Fatal(err)
		}
		return g
	}
	g0 := read()
	ns.MustExec("nft", "add table ip gen-test")
	g1 := read()
	if g1 != g0+1 {
		t.Fatalf("one nft commit: generation %d -> %d, want +1", g0, g1)
	}
	ns.MustExec("nft", "list ruleset")
	if g2 := read(); g2 != g1 {
		t.Fatalf("a listing changed the generation %d -> %d", g1, g2)
	}
	file := filepath.Join(t.TempDir(), "tx.nft")
	if err := os.WriteFile(file, []byte("add chain ip gen-test a\nadd chain ip gen-test b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ns.MustExec("nft", "-f", file)
	if out := ns.MustExec("nft", "list", "table", "ip", "gen-test"); !strings.Contains(out, "chain b") {
		t.Fatalf("transaction not applied:\n%s", out)
	}
	if g3 := read(); g3 != g1+1 {
		t.Fatalf("one transaction of two commands: generation %d -> %d, want +1", g1, g3)
	}
	// A namespace of its own: commits here do not move the namespace above.
	other := netns.New(t, "nnmt-gen2")
	other.MustExec("nft", "add table ip elsewhere")
	if g4 := read(); g4 != g1+1 {
		t.Fatalf("a commit in another namespace moved this one's generation to %d", g4)
	}
}
