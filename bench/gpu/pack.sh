#!/bin/bash
# Packs this machine's Chromium (Debian's, with the libraries it links) and the `cores`
# bench into three parts of about 40 MB each, for a machine with a GPU that has neither
# (issue 47, item 4). The workplace's device tool carries at most 64 MiB a call, the
# repository included, and keeps a machine warm 30 s between calls: carry .chrA, then
# .chrB, each copied to /opt/pay/{a,b} by its call, then .chrC and .gl with
# `bash .chrC/go.sh` (bench/gpu/on-device.sh). Ran on an H200 on 2026-11-28
# (docs/BENCHMARKS.md, "A tab's GPU"): the three calls, unpacking included, took 8 minutes
# of the device's 15.
#
# bench/gpu/pack.sh  (after `cargo build --release -p bench --bin cores`; ~6 min on 2 cores)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
B=$work/chr
mkdir -p "$B/lib" "$B/locales" "$B/fonts"
cd /usr/lib/chromium
cp chrome_crashpad_handler chrome_100_percent.pak resources.pak icudtl.dat snapshot_blob.bin \
  v8_context_snapshot.bin libEGL.so libGLESv2.so libvulkan.so.1 "$B/"
cp locales/en-US.pak "$B/locales/"
nss=/usr/lib/x86_64-linux-gnu
# Every library Chromium and NSS's modules link, but glibc's (the device's is newer).
for f in $( (ldd chromium; for n in libsoftokn3 libfreeblpriv3 libnssckbi; do ldd $nss/$n.so; done) |
  awk '$3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s)\.so|ld-linux'); do
  cp -L "$f" "$B/lib/"
done
cp -L $nss/libsoftokn3.so $nss/libfreebl3.so $nss/libfreeblpriv3.so $nss/libnssckbi.so $nss/libnssdbm3.so "$B/lib/"
cp -L $(fc-list : file | head -3 | cut -d: -f1) "$B/fonts/"
cat > "$B/fonts.conf" <<'X'
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig><dir>/opt/chr/fonts</dir><cachedir>/tmp/fontcache</cachedir></fontconfig>
X
# Headless Chromium's WebGPU on an NVIDIA card goes through Vulkan.
cat > "$B/run.sh" <<'X'
#!/bin/sh
D=/opt/chr
export LD_LIBRARY_PATH=$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FONTCONFIG_FILE=$D/fonts.conf
exec $D/chromium --use-angle=vulkan --enable-features=Vulkan --disable-vulkan-surface --ignore-gpu-blocklist --enable-logging=stderr --v=0 $CHROME_EXTRA "$@" 2>>${CHROME_LOG:-/dev/null}
X
chmod +x "$B/run.sh"
cp "$root/bench/gpu/probe.html" "$B/"
(cd "$work" && tar -cf - chr | xz -9 -T0 > rest.tar.xz)
xz -9e --x86 --lzma2=preset=9e -T0 -c /usr/lib/chromium/chromium > "$work/chromium.bcj.xz"
strip -o "$work/cores" "$root/target/release/cores"
xz -9 --x86 --lzma2=preset=9 -c "$work/cores" > "$work/cores.xz"
(cd "$work" && tar -cf payload.tar chromium.bcj.xz rest.tar.xz cores.xz && split -n 3 -d payload.tar part)
cd "$root"
for d in .chrA .chrB .chrC; do mkdir -p $d; grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
mv "$work/part00" .chrA/p; mv "$work/part01" .chrB/p; mv "$work/part02" .chrC/p
cp bench/gpu/on-device.sh .chrC/go.sh
rm -rf "$work"
ls -la .chrA .chrB .chrC
