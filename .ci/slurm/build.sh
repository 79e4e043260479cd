#!/usr/bin/env bash
# Build Slurm 24.11 from source into /opt/slurm-24.11.5, for up.sh's SLURM_CI_VERSION=24.11: Debian 12 packages Slurm
# 22.05 only, and Debian 13's 24.11 packages need Debian 13's C library, so the CI builds the upstream source that
# Debian 13 packages (its .orig tarball, fetched from Debian's archive and checked against the sha256 of Debian 13's
# Sources index). Installs the build's own needs (libmunge-dev, libmariadb-dev) with apt-get. Idempotent: a no-op when
# the prefix holds a slurmctld of that version and its MariaDB plugin. About 2 minutes on 2 cores. Run as root or with
# passwordless sudo.
# Logs: ${SLURM_CI_LOG_DIR:-/tmp/slurm-ci}/build-*.log.
set -euo pipefail

VERSION=24.11.5
PREFIX=/opt/slurm-$VERSION
TARBALL=slurm-wlm_$VERSION.orig.tar.gz
URL=http://deb.debian.org/debian/pool/main/s/slurm-wlm/$TARBALL
# the sha256 in Debian 13's Sources index, slurm-wlm 24.11.5-4+deb13u1
SHA256=e1a5547edd212c38b5e3230a284133f777b32746551f094aaa81cc4af375e332
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
LOG_DIR=${SLURM_CI_LOG_DIR:-/tmp/slurm-ci}
t0=$(date +%s)

MYSQL_PLUGIN=$PREFIX/lib/slurm/accounting_storage_mysql.so   # slurmdbd's; configure leaves it out without MariaDB
if [ -x "$PREFIX/sbin/slurmctld" ] && "$PREFIX/sbin/slurmctld" -V 2>/dev/null | grep -qx "slurm $VERSION" \
   && [ -e "$MYSQL_PLUGIN" ]; then
    exit 0
fi
$SUDO mkdir -p "$LOG_DIR"; $SUDO chmod 1777 "$LOG_DIR"
fail() {   # fail STEP LOG: the log's end, then exit 1
    echo "build.sh: $1 failed; the end of $2:" >&2; tail -n 40 "$2" >&2; exit 1
}

echo "build.sh: building Slurm $VERSION into $PREFIX ..."
deps=(build-essential pkg-config libmunge-dev libmariadb-dev curl ca-certificates)
apt_install() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${deps[@]}" \
                  >"$LOG_DIR/build-apt.log" 2>&1; }
apt_install || { $SUDO apt-get update -q >>"$LOG_DIR/build-apt.log" 2>&1 && apt_install; } \
    || fail "apt-get install ${deps[*]}" "$LOG_DIR/build-apt.log"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsS --retry 3 -m 300 -o "$work/$TARBALL" "$URL" || { echo "build.sh: could not fetch $URL (Debian's pool keeps" \
    "the current release alone: where Debian 13 moved to a newer 24.11, set VERSION and SHA256 from its Sources)" >&2; exit 1; }
echo "$SHA256  $work/$TARBALL" | sha256sum -c --quiet - \
    || { echo "build.sh: $URL does not have the sha256 of Debian 13's Sources ($SHA256)" >&2; exit 1; }
tar -xzf "$work/$TARBALL" -C "$work"
cd "$work"/slurm-*/
# Only what the CI cluster uses: munge, accounting in MariaDB; no static libraries (half the compile), no GPU libraries
# (the node's GPUs are stand-ins), no MPI plugins, no X11.
./configure --prefix="$PREFIX" --sysconfdir="$PREFIX/etc" --disable-static --disable-debug --disable-x11 \
    --with-munge --without-hdf5 --without-pmix --without-ucx --without-nvml --without-rsmi \
    >"$LOG_DIR/build-configure.log" 2>&1 || fail configure "$LOG_DIR/build-configure.log"
make -j"$(( $(nproc) + 1 ))" >"$LOG_DIR/build-make.log" 2>&1 || fail make "$LOG_DIR/build-make.log"
$SUDO make install >"$LOG_DIR/build-install.log" 2>&1 || fail "make install" "$LOG_DIR/build-install.log"
[ -e "$MYSQL_PLUGIN" ] || fail "the build (no $MYSQL_PLUGIN: configure found no MariaDB client)" \
    "$LOG_DIR/build-configure.log"
$SUDO mkdir -p "$PREFIX/etc"
echo "build.sh: Slurm $VERSION built in $(( $(date +%s) - t0 )) s"
