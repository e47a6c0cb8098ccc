# Shell functions the hack/ scripts share. Source it (`source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"`),
# do not run it.

# NNM_ROOT is the repository root.
NNM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# BIN is where the tools are built: $NNM_BIN_DIR, else <repo>/bin (internal/testing/controlplane reads the same).
BIN="${NNM_BIN_DIR:-$NNM_ROOT/bin}"

# nnm_inputs_hash SCRIPT DIR... prints a hash over everything that determines tool binaries: the Go
# version and platform, the building SCRIPT and the go.mod, go.sum and *.go files below each DIR
# (paths relative to the repository root). The build environment (CGO_ENABLED, GOFLAGS) is set in
# SCRIPT, so that it is hashed; nothing here changes what a build produces.
nnm_inputs_hash() {
	local script="$1"
	shift
	(
		cd "$NNM_ROOT"
		go env GOVERSION GOOS GOARCH
		sha256sum "$script"
		find "$@" -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -print0 |
			LC_ALL=C sort -z | xargs -0 sha256sum
	) | sha256sum | cut -d' ' -f1
}

# nnm_stamped_build NAME HASH BUILD BINARY... runs the function BUILD, which makes the BINARY files,
# unless they are all there and $BIN/.NAME-stamp holds HASH (nnm_inputs_hash); FORCE=1 rebuilds
# anyway. The stamp is removed before BUILD and written only after it succeeds, so that an
# interrupted build is redone.
nnm_stamped_build() {
	local name="$1" hash="$2" build="$3" stamp="$BIN/.$1-stamp" bin
	shift 3
	mkdir -p "$BIN"
	if [[ "${FORCE:-0}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]]; then
		local missing=0
		for bin in "$@"; do
			[[ -x "$bin" ]] || missing=1
		done
		if [[ $missing == 0 ]]; then
			echo "$name binaries in $BIN are up to date"
			return 0
		fi
	fi
	rm -f "$stamp"
	"$build"
	echo "$hash" >"$stamp"
	ls -lh "$@"
}

# nnm_go_build DIR MODULE PACKAGE OUT [LDFLAGS] builds PACKAGE, of the pinned MODULE required by the
# tools module in DIR, into $BIN/OUT: stripped, without local paths, with extra LDFLAGS (-X ...).
nnm_go_build() {
	local dir="$1" mod="$2" pkg="$3" out="$4" ldx="${5:-}"
	echo "building $out from $(cd "$dir" && go list -m -f '{{.Path}}@{{.Version}}' "$mod")"
	(cd "$dir" && go build -trimpath -ldflags="-s -w $ldx" -o "$BIN/.$out.tmp" "$pkg")
	mv -f "$BIN/.$out.tmp" "$BIN/$out"
}

# nnm_have PROBE is true when PROBE is present: an absolute path (e.g. a header) that exists, else a
# command in PATH or in /usr/sbin or /sbin (which a non-root PATH may lack).
nnm_have() {
	if [[ $1 == /* ]]; then
		[[ -e $1 ]]
	else
		command -v "$1" >/dev/null 2>&1 || [[ -x /usr/sbin/$1 || -x /sbin/$1 ]]
	fi
}

# nnm_install_deps DIE PROBE:PACKAGE... installs, with apt-get, the Debian PACKAGE of every PROBE
# that is missing (nnm_have). When something is missing and this is not root on a machine with
# apt-get, it calls the function DIE with a message naming the packages. Progress goes to stderr:
# the scripts print their result on stdout.
nnm_install_deps() {
	local die="$1" missing=() dep
	shift
	for dep in "$@"; do
		nnm_have "${dep%%:*}" || missing+=("${dep##*:}")
	done
	[[ ${#missing[@]} == 0 ]] && return 0
	if [[ $(id -u) != 0 ]] || ! nnm_have apt-get; then
		"$die" "missing packages: ${missing[*]} (install them, or run as root on Debian)"
	fi
	echo "installing: ${missing[*]}" >&2
	DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# nnm_deb_unpack PACKAGE=VERSION DIR downloads that exact Debian package with apt-get download (after
# an apt-get update if the archive's lists do not have it) and unpacks it into DIR with dpkg-deb -x;
# nothing is installed. On failure it prints apt-get's message and returns 1.
nnm_deb_unpack() {
	local pkg="$1" dir="$2" tmp rc=0
	nnm_have apt-get || { echo "no apt-get to fetch $pkg" >&2; return 1; }
	tmp="$(mktemp -d)"
	# apt-get download runs as _apt where it can; let it write the download directory.
	chmod 0777 "$tmp"
	echo "fetching $pkg" >&2
	if ! (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>"$tmp/err"); then
		(cd "$tmp" && DEBIAN_FRONTEND=noninteractive apt-get update -qq && apt-get download -q "$pkg" >/dev/null 2>"$tmp/err") ||
			{ cat "$tmp/err" >&2; rc=1; }
	fi
	if [[ $rc == 0 ]] && ! dpkg-deb -x "$tmp"/*.deb "$dir"; then
		echo "cannot unpack $pkg" >&2
		rc=1
	fi
	rm -rf "$tmp"
	return "$rc"
}

# nnm_kube_version_ldflags DIR prints the -X flags that stamp the k8s.io/kubernetes release required by
# the tools module in DIR into /version and the clients' user agent, as upstream's hack/lib/version.sh
# does (v1.37.x instead of v0.0.0-master).
nnm_kube_version_ldflags() {
	local v major minor f p
	v="$(cd "$1" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
	major="${v#v}"; major="${major%%.*}"
	minor="${v#v*.}"; minor="${minor%%.*}"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		f+=" -X $p.gitVersion=$v -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
	done
	echo "$f"
}
