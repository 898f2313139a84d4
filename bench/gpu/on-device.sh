#!/bin/bash
# On the machine with a GPU, from the repository root: unpacks the parts that
# bench/gpu/pack.sh made, finds the WebGPU adapter headless Chromium sees, then measures a
# tab on its GPU against its CPU (`cores`), and the native worker beside it. Output: $OUT/log.
exec > >(tee -a $OUT/log) 2>&1
set -x
cd "$(dirname "$0")/.."
unxz() { if command -v xz >/dev/null; then xz -dc "$1"; else python3 -c 'import lzma,sys,shutil; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"; fi; }
mkdir -p /opt/pay && cp .chrC/p /opt/pay/c
cat /opt/pay/a /opt/pay/b /opt/pay/c | tar -x -C /opt/pay || exit 1
unxz /opt/pay/rest.tar.xz | tar -x -C /opt || exit 1
unxz /opt/pay/chromium.bcj.xz > /opt/chr/chromium && chmod +x /opt/chr/chromium
unxz /opt/pay/cores.xz > /opt/cores && chmod +x /opt/cores
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f $ICD ] && export VK_DRIVER_FILES=$ICD VK_ICD_FILENAMES=$ICD
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
nvidia-smi -L
LD_LIBRARY_PATH=/opt/chr/lib ldd /opt/chr/chromium | grep "not found"
(cd /opt/chr && exec python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1) &
sleep 1
probe() { CHROME_EXTRA="$2" CHROME_LOG=$OUT/probe$1.log timeout 15 /opt/chr/run.sh --headless --no-sandbox --enable-unsafe-webgpu --user-data-dir=/tmp/p$1 http://127.0.0.1:8765/probe.html; grep -h PROBE $OUT/probe$1.log; }
V2="--use-vulkan=native --enable-features=Vulkan,VulkanFromANGLE,DefaultANGLEVulkan --use-gl=angle"
probe 1 ""
if ! grep -qi '"vendor":"nvidia' $OUT/probe1.log; then probe 2 "$V2" && grep -qi '"vendor":"nvidia' $OUT/probe2.log && export CHROME_EXTRA="$V2"; fi
grep -h -i -E "vulkan|webgpu|dawn" $OUT/probe*.log | grep -v dbus | head -30
[ -n "$DRY" ] && exit 0
export CHROME=/opt/chr/run.sh CHROME_LOG=$OUT/chrome.log
# The 0.8M GPT first (each about 40 s); the 10.7M's tabs and native worker gave nothing
# within 130 s, 120 s and 50 s on the H200 (2026-11-28): they need minutes each.
timeout 90 /opt/cores --preset gpt --worker tab --cores 1 --gpu auto --seconds 20
timeout 90 /opt/cores --preset gpt --worker tab --cores 1 --gpu off --seconds 20
timeout 60 /opt/cores --preset gpt --worker native --cores 1 --seconds 15
timeout 300 /opt/cores --preset gpt-10m --worker tab --cores 1 --gpu auto --seconds 30
timeout 200 /opt/cores --preset gpt-10m --worker native --cores 1 --seconds 20
timeout 400 /opt/cores --preset gpt-10m --worker tab --cores 1 --gpu off --local-steps 4 --seconds 30
grep -h -i -E "vulkan|webgpu|dawn|gpu" $OUT/chrome.log | grep -v dbus | sort | uniq -c | sort -rn | head -20
