# Shell functions the hack/ scripts share. Source it (`source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"`),
# do not run it.

# NNM_ROOT is the repository root.
NNM_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

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

# nnm_up_to_date STAMP HASH BINARY... is true when every BINARY is executable and the STAMP file holds
# HASH, unless FORCE=1 asks for a rebuild.
nnm_up_to_date() {
	local stamp="$1" hash="$2" bin
	shift 2
	[[ "${FORCE:-0}" != 1 && -f "$stamp" && "$(cat "$stamp")" == "$hash" ]] || return 1
	for bin in "$@"; do
		[[ -x "$bin" ]] || return 1
	done
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
