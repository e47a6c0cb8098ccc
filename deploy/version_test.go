package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/mod/semver"
)

// versionRepo is a scratch git repository holding a copy of hack/version.sh and a CHANGELOG.md.
type versionRepo struct {
	t   *testing.T
	dir string
}

func newVersionRepo(t *testing.T) *versionRepo {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	r := &versionRepo{t: t, dir: t.TempDir()}
	script, err := os.ReadFile("../hack/version.sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(r.dir, "hack"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "hack", "version.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	r.git("init", "-q", "-b", "main")
	return r
}

func (r *versionRepo) git(args ...string) string {
	r.t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@t.invalid", "-c", "commit.gpgsign=false"}, args...)...)
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), "GIT_CEILING_DIRECTORIES="+filepath.Dir(r.dir))
	out, err := cmd.CombinedOutput()
	if err != nil {
		r.t.Fatalf("git %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// commit writes CHANGELOG.md (when changelog is not empty) and a file that makes the commit
// differ, commits, and returns the commit.
func (r *versionRepo) commit(changelog, msg string) string {
	r.t.Helper()
	if changelog != "" {
		if err := os.WriteFile(filepath.Join(r.dir, "CHANGELOG.md"), []byte(changelog), 0o644); err != nil {
			r.t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(r.dir, "file"), []byte(msg), 0o644); err != nil {
		r.t.Fatal(err)
	}
	r.git("add", "-A")
	r.git("commit", "-q", "-m", msg)
	return r.git("rev-parse", "HEAD")
}

// version runs the copied hack/version.sh; an error's output is returned with ok false.
func (r *versionRepo) version(args ...string) (string, bool) {
	r.t.Helper()
	cmd := exec.Command(filepath.Join(r.dir, "hack", "version.sh"), args...)
	cmd.Env = append(os.Environ(), "GIT_CEILING_DIRECTORIES="+filepath.Dir(r.dir))
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err == nil
}

func (r *versionRepo) mustVersion(args ...string) string {
	r.t.Helper()
	v, ok := r.version(args...)
	if !ok {
		r.t.Fatalf("hack/version.sh %v: %s", args, v)
	}
	return v
}

const (
	changelogV1 = "# Changelog\n\n## Unreleased\n\n## v0.1.0 — proposed\n\n- first\n"
	changelogV2 = "# Changelog\n\n## Unreleased\n\n## v0.2.0 — 2027-01-01\n\n- second\n\n## v0.1.0 — 2026-12-01\n\n- first\n"
)

// TestVersionsAreUniquePerCommit walks a history with two releases, commits after each, a branch
// and a dirty tree, and checks hack/version.sh at every commit: no two commits share a version, a
// release version is printed only at the commit that wrote its CHANGELOG.md heading (later edits of
// the heading do not move it), every pre-release sorts after the latest release and before the next
// (semver precedence), later commits sort later, and --previous names the release an upgrade of the
// commit starts from.
func TestVersionsAreUniquePerCommit(t *testing.T) {
	r := newVersionRepo(t)
	seen := map[string]string{} // version → commit
	check := func(commit, want string) string {
		t.Helper()
		v := r.mustVersion()
		if !semver.IsValid(v) {
			t.Errorf("%s: %q is not a semantic version", commit[:7], v)
		}
		if prev, ok := seen[v]; ok && prev != commit {
			t.Errorf("commits %s and %s share the version %s", prev[:7], commit[:7], v)
		}
		seen[v] = commit
		if !regexp.MustCompile(want).MatchString(v) {
			t.Errorf("%s: version %q, want %s", commit[:7], v, want)
		}
		return v
	}
	r.commit("# Changelog\n\n## Unreleased\n", "no release yet")
	if out, ok := r.version(); ok || !strings.Contains(out, "no '## vX.Y.Z' heading") {
		t.Errorf("before any release: %q (ok %v), want an error naming the missing heading", out, ok)
	}
	rel1 := r.commit(changelogV1, "release v0.1.0")
	check(rel1, `^v0\.1\.0$`)
	if p, _ := r.version("--previous"); p != "" {
		t.Errorf("at the first release --previous = %q, want nothing", p)
	}
	a1 := r.commit("", "after v0.1.0 (1)")
	va1 := check(a1, `^v0\.2\.0-dev\.1\.g`+a1[:12]+`$`)
	a2 := r.commit("", "after v0.1.0 (2)")
	va2 := check(a2, `^v0\.2\.0-dev\.2\.g`+a2[:12]+`$`)
	// The heading's text edited later (a date added): the release stays the commit that wrote it.
	a3 := r.commit(strings.Replace(changelogV1, "proposed", "2026-12-01", 1), "v0.1.0's heading dated")
	va3 := check(a3, `^v0\.2\.0-dev\.3\.g`+a3[:12]+`$`)
	if got := r.mustVersion("--commit", "v0.1.0"); got != rel1 {
		t.Errorf("--commit v0.1.0 = %s, want %s (the commit that wrote the heading)", got, rel1)
	}
	if got := r.mustVersion("--previous"); got != "v0.1.0 "+rel1 {
		t.Errorf("after v0.1.0: --previous = %q, want v0.1.0 %s", got, rel1)
	}
	// A branch from a1 with as many commits as main: the same count, another commit.
	r.git("checkout", "-q", "-b", "topic", a1)
	b2 := r.commit("", "topic (2)")
	vb2 := check(b2, `^v0\.2\.0-dev\.2\.g`+b2[:12]+`$`)
	r.git("checkout", "-q", "main")
	// Uncommitted changes: never a release, marked dirty.
	if err := os.WriteFile(filepath.Join(r.dir, "file"), []byte("edited"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v := r.mustVersion(); v != va3+".dirty" {
		t.Errorf("dirty tree: %q, want %s.dirty", v, va3)
	}
	r.git("checkout", "-q", "--", "file")
	// The Unreleased heading may name the next release (a patch release here).
	withNext := strings.Replace(strings.Replace(changelogV1, "proposed", "2026-12-01", 1), "## Unreleased", "## Unreleased — v0.1.1", 1)
	a4 := r.commit(withNext, "the next release is a patch release")
	va4 := check(a4, `^v0\.1\.1-dev\.4\.g`+a4[:12]+`$`)
	rel2 := r.commit(changelogV2, "release v0.2.0")
	vrel2 := check(rel2, `^v0\.2\.0$`)
	if got := r.mustVersion("--previous"); got != "v0.1.0 "+rel1 {
		t.Errorf("at the v0.2.0 release commit: --previous = %q, want v0.1.0 %s (its predecessor)", got, rel1)
	}
	c1 := r.commit("", "after v0.2.0")
	vc1 := check(c1, `^v0\.3\.0-dev\.1\.g`+c1[:12]+`$`)
	if got := r.mustVersion("--previous"); got != "v0.2.0 "+rel2 {
		t.Errorf("after v0.2.0: --previous = %q, want v0.2.0 %s", got, rel2)
	}
	if got := r.mustVersion("--latest"); got != "v0.2.0" {
		t.Errorf("--latest = %q, want v0.2.0", got)
	}
	// Precedence along main, and the branch between the releases.
	order := []string{"v0.1.0", va1, va2, va3, vrel2, vc1}
	for i := 1; i < len(order); i++ {
		if semver.Compare(order[i-1], order[i]) >= 0 {
			t.Errorf("semver: %s should sort before %s", order[i-1], order[i])
		}
	}
	// Naming a lower next release (a patch) is a change of plan: its pre-releases sort before the
	// minor release's, still after v0.1.0 and before v0.1.1.
	if semver.Compare("v0.1.0", va4) >= 0 || semver.Compare(va4, "v0.1.1") >= 0 {
		t.Errorf("semver: %s should sort between v0.1.0 and v0.1.1", va4)
	}
	if semver.Compare("v0.1.0", vb2) >= 0 || semver.Compare(vb2, "v0.2.0") >= 0 {
		t.Errorf("semver: the branch's %s should sort between v0.1.0 and v0.2.0", vb2)
	}
	t.Logf("versions: %s (branch: %s)", strings.Join(order, " < "), vb2)
	// Errors name the cause.
	if out, ok := r.version("--relase"); ok || !strings.Contains(out, "unknown argument --relase") {
		t.Errorf("--relase: %q, want an error naming the argument", out)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "CHANGELOG.md"), []byte(strings.Replace(changelogV2, "## Unreleased", "## Unreleased — v0.1.5", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, ok := r.version(); ok || !strings.Contains(out, "not after the latest release v0.2.0") {
		t.Errorf("an Unreleased heading naming an older version: %q, want an error", out)
	}
}

// TestVersionOfThisCheckout: `make -s version` prints what hack/version.sh prints for this checkout,
// a valid semantic version, the release only at the latest release's own commit.
func TestVersionOfThisCheckout(t *testing.T) {
	out, err := exec.Command("../hack/version.sh").Output()
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(out))
	if !semver.IsValid(v) {
		t.Fatalf("hack/version.sh = %q: not a semantic version", v)
	}
	latest := releaseVersion(t)
	if semver.Compare(v, latest) < 0 {
		t.Errorf("hack/version.sh = %s sorts before the latest release %s", v, latest)
	}
	if _, err := exec.LookPath("make"); err == nil {
		mk, err := exec.Command("make", "-s", "-C", "..", "version").Output()
		if err != nil {
			t.Fatalf("make -s version: %v", err)
		}
		if got := strings.TrimSpace(string(mk)); got != v {
			t.Errorf("make -s version = %q, want hack/version.sh's %q", got, v)
		}
	}
	t.Logf("this checkout's version: %s (latest release %s)", v, latest)
}
