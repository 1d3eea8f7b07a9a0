#!/usr/bin/env bash
# Install CRIU 4.x for the agent's checkpoint tests and bench (run as root; .ci/run calls it).
#
# Why: Debian 12's criu (3.17) fails `criu check` on current kernels (vDSO bounds); CRIU 4 from
# Debian 13 (trixie) works. We build it from trixie's *source* package, fetched through apt from
# the mirror this machine's own apt sources already use (no download URL lives in the project),
# with build dependencies from Debian 12. The trixie entry is deb-src only and lives in a private
# apt configuration under $WORK, so the system's apt never sees trixie and upgrades nothing.
#
# Idempotent: when `criu --version` already says 4.x and `criu check` passes, it does nothing.
set -euo pipefail

PREFIX=${CRIU_PREFIX:-/usr/local}
SUITE=${CRIU_SOURCE_SUITE:-trixie}
WORK=${CRIU_WORK_DIR:-/var/cache/gpusweep-criu}

criu_ok() {
  command -v criu >/dev/null 2>&1 || return 1
  criu --version 2>/dev/null | grep -Eq '^Version: 4\.' || return 1
  criu check >/dev/null 2>&1
}

# Lazy moves (agent/src/gpusweep_agent/engines/lazy.py): CRIU's page server widens its pipes to
# 4 MiB; without CAP_SYS_RESOURCE (containers, this project's VMs) the kernel refuses above
# fs.pipe-max-size (1 MiB by default) and the first page fails ("page-pipe: tee: 65536: Operation
# not permitted"). Raised here, as root, every run.
if [ "$(id -u)" -eq 0 ] && [ "$(cat /proc/sys/fs/pipe-max-size 2>/dev/null || echo 0)" -lt 4194304 ]; then
  echo 4194304 > /proc/sys/fs/pipe-max-size || echo "build-criu.sh: could not raise fs.pipe-max-size; lazy moves will dump plainly" >&2
fi

if criu_ok; then
  echo "criu: $(criu --version | head -1) already installed and 'criu check' passes"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "build-criu.sh: must run as root (installs packages and $PREFIX/sbin/criu)" >&2
  exit 1
fi

# The mirror: the first Debian main archive URI of a binary ("deb") entry in this machine's own
# sources, in either the deb822 (*.sources) or the one-line (*.list) format.
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  mirror=$(awk '
    /^[[:space:]]*$/ { if (deb && uri != "" && uri !~ /security/) { print uri; exit } deb=0; uri=""; next }
    /^Types:/ { deb = ($0 ~ /(^|[[:space:]])deb([[:space:]]|$)/) }
    /^URIs:/ { uri = $2 }
    END { if (deb && uri != "" && uri !~ /security/) print uri }
  ' "$f" | head -1)
  [ -n "$mirror" ] && break
done
if [ -z "$mirror" ]; then
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    mirror=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } } }' "$f")
    [ -n "$mirror" ] && break
  done
fi
if [ -z "$mirror" ]; then
  echo "build-criu.sh: found no Debian mirror in /etc/apt/sources.list*; add one and rerun" >&2
  exit 1
fi
echo "criu: using mirror $mirror (from this machine's apt sources) for $SUITE sources"

BUILD_DEPS=(
  build-essential pkg-config python3 python3-protobuf protobuf-c-compiler protobuf-compiler
  libprotobuf-c-dev libprotobuf-dev libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev
  libnftables-dev libaio-dev uuid-dev libdrm-dev dpkg-dev iproute2
)
missing=()
for pkg in "${BUILD_DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "criu: installing build dependencies: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# A private apt configuration holding only the deb-src entry: nothing system-wide changes.
mkdir -p "$WORK/apt/lists/partial" "$WORK/src"
cat >"$WORK/apt/sources.list" <<EOF
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $SUITE main
EOF
APT_OPTS=(
  -o "Dir::Etc::SourceList=$WORK/apt/sources.list"
  -o "Dir::Etc::SourceParts=$WORK/apt/none"
  -o "Dir::State::Lists=$WORK/apt/lists"
  -o "APT::Get::List-Cleanup=0"
)
apt-get "${APT_OPTS[@]}" update -qq
cd "$WORK/src"
rm -f criu_*
# apt checks every file against the signed Sources index. Only the orig tarball is needed (the
# build uses upstream's Makefile), so a mirror or proxy that lacks the .dsc/.debian.tar is fine.
apt-get "${APT_OPTS[@]}" source --download-only criu || true
orig=$(ls criu_*.orig.tar.* 2>/dev/null | head -1 || true)
if [ -z "$orig" ]; then
  echo "build-criu.sh: apt-get source did not yield criu's orig tarball from $mirror $SUITE" >&2
  exit 1
fi
version=${orig#criu_}
version=${version%.orig.tar.*}
echo "criu: building $version from $orig"

rm -rf "criu-$version" build
mkdir build
tar -xf "$orig" -C build
srcdir=$(find build -mindepth 1 -maxdepth 1 -type d | head -1)
# Only the binary is needed: skip the docs (asciidoc) and the python library.
make -C "$srcdir" -j"$(nproc)" criu >"$WORK/build.log" 2>&1 || {
  tail -40 "$WORK/build.log" >&2
  echo "build-criu.sh: make criu failed (full log: $WORK/build.log)" >&2
  exit 1
}
install -D -m 0755 "$srcdir/criu/criu" "$PREFIX/sbin/criu"
hash -r

if ! criu_ok; then
  "$PREFIX/sbin/criu" --version || true
  "$PREFIX/sbin/criu" check || true
  echo "build-criu.sh: the built criu does not pass 'criu check'" >&2
  exit 1
fi
echo "criu: $(criu --version | head -1) installed at $PREFIX/sbin/criu; 'criu check' passes"
