#!/usr/bin/env bash
# Prepares the VM lane (e2e/vm): a Debian 6.1 kernel with IP_VS, booted by qemu under software
# emulation (TCG; no KVM needed), whose root file system is this machine's own root, shared read-only
# over virtio-9p. Nothing is copied into the guest but a busybox initramfs that mounts the shares:
# the agent, kube-proxy, iptables, nft, ipset, conntrack and ip run in the guest from the host's
# files, with the host's shared libraries, so no ldd walk is needed.
#
#   hack/vm/prepare.sh          install what is missing (root on Debian), fetch the pinned kernel,
#                               build the initramfs; prints the directory holding the result
#   hack/vm/prepare.sh --env    only print the path of vm.env (the Go test reads it)
#
# The kernel is the pinned package below, fetched with `apt-get download` and unpacked into the cache
# (it is not installed on the host: the host keeps its own kernel and /boot). The generic flavour is
# used because the cloud flavour lacks 9p. Output, in $NNM_VM_DIR (default
# /var/cache/network-node-manager/vm/<kernel release>):
#   vmlinuz, initrd.gz, root/lib/modules/<release> (shared with the guest), vm.env
#
# Exit status 3 means "cannot prepare here" (not root and something is missing, or no apt-get); the
# message names what is missing. The Go test (e2e/vm) skips on a missing vm.env, or fails under
# CI=true / NNM_REQUIRE_KERNEL=1.
set -euo pipefail

# The pinned kernel: Debian 12 (bookworm) point-release package, generic flavour.
KERNEL_PKG="${NNM_VM_KERNEL_PKG:-linux-image-6.1.0-50-amd64}"
KERNEL_VERSION="${NNM_VM_KERNEL_VERSION:-6.1.176-1}"
KERNEL_RELEASE="${KERNEL_PKG#linux-image-}"

# Host tools the guest runs (from the shared root) or the script needs, as "binary:debian-package".
DEPS=(qemu-system-x86_64:qemu-system-x86 busybox:busybox-static depmod:kmod ipset:ipset
	conntrack:conntrack nft:nftables iptables:iptables ip:iproute2)

# Modules the initramfs loads itself to reach the shares and the network; every other module is
# loaded in the guest from the shared modules tree.
BOOT_MODULES=(virtio_pci 9pnet_virtio 9p virtio_net)

source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
OUT="${NNM_VM_DIR:-/var/cache/network-node-manager/vm/$KERNEL_RELEASE}"

die_unavailable() { echo "hack/vm/prepare.sh: $*" >&2; exit 3; }

fetch_kernel() {
	local dir="$OUT/root/lib/modules/$KERNEL_RELEASE"
	[[ -f $OUT/vmlinuz && -f $dir/modules.dep ]] && return 0
	local tmp
	tmp="$(mktemp -d)"
	nnm_deb_unpack "$KERNEL_PKG=$KERNEL_VERSION" "$tmp/x" ||
		{ rm -rf "$tmp"; die_unavailable "cannot download $KERNEL_PKG=$KERNEL_VERSION (set NNM_VM_KERNEL_PKG/NNM_VM_KERNEL_VERSION to one apt-cache policy lists)"; }
	mkdir -p "$OUT/root/lib/modules"
	rm -rf "$dir"
	mv "$tmp/x/lib/modules/$KERNEL_RELEASE" "$dir"
	mv "$tmp/x/boot/vmlinuz-$KERNEL_RELEASE" "$OUT/vmlinuz"
	rm -rf "$tmp"
	# busybox and kmod modprobe need modules.dep.
	depmod -b "$OUT/root" "$KERNEL_RELEASE"
}

build_initramfs() {
	local init="$NNM_ROOT/hack/vm/init.sh" stamp="$OUT/initrd.stamp" want
	want="$(cat "$init" "$(command -v busybox)" <(printf '%s\n' "${BOOT_MODULES[@]}") | sha256sum | cut -d' ' -f1)"
	[[ -f $OUT/initrd.gz && -f $stamp && $(cat "$stamp") == "$want" ]] && return 0
	local tmp m
	tmp="$(mktemp -d)"
	mkdir -p "$tmp"/{bin,dev,proc,sys,run,host,lib/modules,mods}
	cp "$(command -v busybox)" "$tmp/bin/busybox"
	cp "$init" "$tmp/init"
	chmod 0755 "$tmp/init"
	: >"$tmp/mods/order"
	for m in "${BOOT_MODULES[@]}"; do
		modprobe -d "$OUT/root" -S "$KERNEL_RELEASE" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
	done | awk '!seen[$0]++' | while read -r ko; do
		cp "$ko" "$tmp/mods/"
		basename "$ko" >>"$tmp/mods/order"
	done
	(cd "$tmp" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$OUT/initrd.gz.tmp")
	mv "$OUT/initrd.gz.tmp" "$OUT/initrd.gz"
	rm -rf "$tmp"
	echo "$want" >"$stamp"
}

main() {
	nnm_install_deps die_unavailable "${DEPS[@]}"
	mkdir -p "$OUT"
	fetch_kernel
	build_initramfs
	cat >"$OUT/vm.env" <<ENV
NNM_VM_KERNEL=$OUT/vmlinuz
NNM_VM_INITRD=$OUT/initrd.gz
NNM_VM_MODULES=$OUT/root/lib/modules
NNM_VM_KERNEL_RELEASE=$KERNEL_RELEASE
NNM_VM_KERNEL_PACKAGE=$KERNEL_PKG=$KERNEL_VERSION
NNM_VM_QEMU=$(command -v qemu-system-x86_64)
NNM_VM_BUSYBOX=$(command -v busybox)
ENV
	echo "$OUT"
}

if [[ ${1:-} == --env ]]; then
	echo "$OUT/vm.env"
	exit 0
fi
main "$@"
