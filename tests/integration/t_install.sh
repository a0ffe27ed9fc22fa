#!/usr/bin/env bash
# t_install.sh — `make install` into a DESTDIR, and pkg-config before and
# after installing.
#
# After the plain `make` that built this tree (default PREFIX), `make install
# PREFIX=/opt/kvd DESTDIR=tmp` must install a kvclient.pc that says /opt/kvd
# and a kvd.service whose ExecStart is /opt/kvd/bin/kvd: paths that depend on
# PREFIX are written at install time. A program compiles and links against
# the installed tree through that .pc, and against the build tree, before
# installing, through build/kvclient-uninstalled.pc (PKG_CONFIG_PATH=build),
# as the README says.
source "$(dirname "$0")/lib.sh"
command -v pkg-config >/dev/null || skip "no pkg-config"
command -v make >/dev/null || skip "no make"
[ -f "$BUILD/libkvclient.so" ] || skip "$BUILD/libkvclient.so not built"
CC=${CC:-cc}
EX=client/examples/kvc_hello.c

# ---- PREFIX=/opt/kvd into a DESTDIR ------------------------------------------------
D=$T/root
make -s BUILD="$BUILD" install PREFIX=/opt/kvd DESTDIR="$D" >"$T/install.log" 2>&1 ||
	fail "make install PREFIX=/opt/kvd DESTDIR=$D: $(tail -n 20 "$T/install.log")"
for f in bin/kvd bin/kvctl lib/libkvclient.so.0 lib/libkvclient.so lib/libkvclient.a include/kvclient.h \
	lib/pkgconfig/kvclient.pc lib/systemd/system/kvd.service lib/systemd/system/kvd.socket; do
	[ -e "$D/opt/kvd/$f" ] || fail "make install did not install /opt/kvd/$f"
done
[ -f "$D/etc/kvd/kvd.conf" ] || fail "make install did not install /etc/kvd/kvd.conf"
for m in man1/kvctl.1 man5/kvd.conf.5 man8/kvd.8 man3/libkvclient.3; do
	[ -f "$D/opt/kvd/share/man/$m" ] || fail "make install did not install /opt/kvd/share/man/$m"
done
MANWIDTH=80 man -l "$D/opt/kvd/share/man/man5/kvd.conf.5" 2>/dev/null | grep -q pool_size ||
	fail "the installed kvd.conf(5) does not render with man -l"
PC=$D/opt/kvd/lib/pkgconfig/kvclient.pc
grep -qx 'prefix=/opt/kvd' "$PC" || fail "kvclient.pc: $(head -n 1 "$PC"), expected prefix=/opt/kvd"
libdir=$(PKG_CONFIG_PATH=$D/opt/kvd/lib/pkgconfig pkg-config --variable=libdir kvclient)
[ "$libdir" = /opt/kvd/lib ] || fail "kvclient.pc: libdir $libdir, expected /opt/kvd/lib"
grep -q '^ExecStart=/opt/kvd/bin/kvd --config /etc/kvd/kvd.conf$' "$D/opt/kvd/lib/systemd/system/kvd.service" ||
	fail "kvd.service: $(grep ExecStart "$D/opt/kvd/lib/systemd/system/kvd.service"), expected /opt/kvd/bin/kvd"
left=$(grep -rIl /usr/local "$D/opt/kvd/lib/pkgconfig" "$D/opt/kvd/lib/systemd" "$D/etc" 2>/dev/null)
[ -z "$left" ] || fail "installed files still name /usr/local: $left"
ok "make install PREFIX=/opt/kvd: kvclient.pc prefix /opt/kvd, ExecStart=/opt/kvd/bin/kvd"

# a program built against the installed tree (pkg-config's sysroot maps /opt/kvd into DESTDIR)
flags=$(PKG_CONFIG_PATH=$D/opt/kvd/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D pkg-config --cflags --libs kvclient) ||
	fail "pkg-config kvclient (installed)"
$CC -std=c11 -o "$T/hello-installed" "$EX" $flags 2>"$T/cc1.log" ||
	fail "building $EX against the installed tree ($flags): $(cat "$T/cc1.log")"
ok "an example builds against the installed kvclient.pc ($flags)"

# ---- the default PREFIX ---------------------------------------------------------------------
make -s BUILD="$BUILD" install DESTDIR="$T/root2" >"$T/install2.log" 2>&1 || fail "make install DESTDIR=$T/root2"
grep -qx 'prefix=/usr/local' "$T/root2/usr/local/lib/pkgconfig/kvclient.pc" || fail "default PREFIX: kvclient.pc"
grep -q '^ExecStart=/usr/local/bin/kvd ' "$T/root2/usr/local/lib/systemd/system/kvd.service" ||
	fail "default PREFIX: kvd.service ExecStart"
ok "make install with the default PREFIX says /usr/local"

# ---- before installing: the uninstalled .pc ------------------------------------------------------
[ -f "$BUILD/kvclient-uninstalled.pc" ] || fail "$BUILD/kvclient-uninstalled.pc is not built"
flags=$(PKG_CONFIG_PATH=$ROOT/$BUILD pkg-config --cflags --libs kvclient) || fail "PKG_CONFIG_PATH=$BUILD pkg-config kvclient"
(cd "$T" && $CC -std=c11 -o hello-build "$ROOT/$EX" $flags) 2>"$T/cc2.log" ||
	fail "building $EX with PKG_CONFIG_PATH=$BUILD ($flags): $(cat "$T/cc2.log")"
# (ldd's whole output first: with pipefail, grep -q quitting at the match
# while ldd still writes would fail the pipeline on its SIGPIPE)
deps=$(ldd "$T/hello-build") || fail "ldd $T/hello-build"
grep -q "libkvclient.so.0 => $ROOT/$BUILD/" <<<"$deps" ||
	fail "the program does not find libkvclient in $BUILD: $(grep kvclient <<<"$deps")"
"$T/hello-build" --help >/dev/null 2>&1
rc=$?
[ $rc -lt 126 ] || fail "the program built against $BUILD does not run (exit $rc)"
ok "before installing, PKG_CONFIG_PATH=$BUILD pkg-config kvclient builds and runs a program ($flags)"
