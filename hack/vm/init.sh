#!/bin/busybox sh
# /init of the VM lane's initramfs (built by hack/vm/prepare.sh). It loads the modules that reach the
# 9p shares and the network, mounts the kernel's modules tree (tag nnmmods) at /lib/modules so that
# modprobe, and the kernel's own module autoloading, work, mounts the host's root read-only (tag
# hostroot) at /host with fresh /proc, /sys, /dev and a tmpfs /run, sets up eth0 (user-mode network,
# no default route) and runs, chrooted into /host, the script named by nnm.run= on the kernel command
# line. Its exit status is printed as "NNM-VM-EXIT=<n>" before the guest powers off.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod "/mods/$m" || echo "nnm-init: insmod $m failed"; done
opts=trans=virtio,version=9p2000.L,msize=512000,ro
mount -t 9p -o "$opts" nnmmods /lib/modules || echo "nnm-init: cannot mount the modules share"
mount -t 9p -o "$opts,cache=loose" hostroot /host || echo "nnm-init: cannot mount the host root share"
echo /bin/modprobe >/proc/sys/kernel/modprobe

run= modules= root=
for w in $(cat /proc/cmdline); do
	case "$w" in
	nnm.run=*) run="${w#nnm.run=}" ;;
	nnm.modules=*) modules="${w#nnm.modules=}" ;;
	nnm.root=*) root="${w#nnm.root=}" ;;
	esac
done
for m in $(echo "$modules" | tr , ' '); do modprobe "$m" || echo "nnm-init: modprobe $m failed"; done

ip link set lo up
if ip link set eth0 up 2>/dev/null; then
	ip addr add 10.0.2.15/24 dev eth0
fi

mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs -o mode=0755 run /host/run
mkdir -p /host/run/tmp /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts 2>/dev/null
mount -t tmpfs shm /host/dev/shm

# nnm.root=switch (the cluster lane, hack/cluster/node.sh): the host's root becomes the root of the
# mount namespace (switch_root) instead of a chroot, so that a container runtime's pivot_root and its
# exec into a container (setns to the container's mount namespace) see the container's root; the
# modules tree is then mounted below its /run and the kernel loads modules with the host's kmod
# (modprobe -d: the host's /lib/modules is not the guest kernel's and is read-only).
if [ "$root" = switch ] && [ -n "$run" ]; then
	mkdir -p /host/run/nnm-modules/lib/modules
	mount --bind /lib/modules /host/run/nnm-modules/lib/modules || echo "nnm-init: cannot bind the modules tree into the new root"
	printf '#!/bin/sh\nexec /sbin/modprobe -d /run/nnm-modules "$@"\n' >/host/run/nnm-modprobe
	chmod 0755 /host/run/nnm-modprobe
	echo /run/nnm-modprobe >/proc/sys/kernel/modprobe
	exec switch_root /host /bin/busybox sh -c "TMPDIR=/run/tmp HOME=/run/tmp /bin/sh '$run'; echo NNM-VM-EXIT=\$?; sync; /bin/busybox poweroff -f"
fi

rc=1
if [ -n "$run" ]; then
	chroot /host /bin/sh -c "TMPDIR=/run/tmp HOME=/run/tmp exec /bin/sh '$run'"
	rc=$?
else
	echo "nnm-init: no nnm.run= on the kernel command line"
fi
echo "NNM-VM-EXIT=$rc"
sync
poweroff -f
