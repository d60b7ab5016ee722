#!/bin/bash
# Issue 8's Vulkan cold goals against ncnn on the GPU: `inferd bench cold --device vulkan` with ncnn's Vulkan
# peer (fp16 off, and its default options, fp16, driver cache primed) and, with FIRST_START=1, both with every
# cache empty. The device has no network and no pnnx: the ncnn wheel travels in .whl, and the models' pnnx
# conversions travel in .cw (made here by `scripts/device/ncnn-vulkan-cold.sh prepare`, from this machine's zoo;
# the bench reuses a conversion whose stamp names the same ONNX bytes, which the device's zoo writes again).
# Run from the repo root after `source .gl/run.sh` on the device; writes $OUT/*cold_vulkan*.
set -u
MODELS=${MODELS:-squeezenet1_1,mobilenetv2}
if [ "${1:-}" = prepare ]; then  # here: the conversions and the wheel
  rm -rf .cw && mkdir -p .cw
  python3 - "$MODELS" <<'EOF'
import sys
from pathlib import Path
import onnx
from inferd.zoo import write_zoo
from inferd.bench.ncnn_peer import convert_ncnn
names = sys.argv[1].split(",")
import shutil
paths = write_zoo(Path("/tmp/inferd-coldbench-prep/zoo"), names)
for n in names:
    g = onnx.load(str(paths[n]), load_external_data=False)
    shape = tuple(d.dim_value or 1 for d in g.graph.input[0].type.tensor_type.shape.dim)  # (a free batch: 1)
    work = Path("/tmp/inferd-coldbench-prep/ncnn") / n
    convert_ncnn(Path(paths[n]), shape, work)
    dst = Path(".cw/vulkan") / n / "ncnn"
    dst.mkdir(parents=True, exist_ok=True)
    for ext in (".ncnn.param", ".ncnn.bin", ".ncnn.src"):  # (pnnx's intermediate files stay here)
        shutil.copy2(work / (n + ext), dst / (n + ext))
    print(n, "converted", shape)
EOF
  mkdir -p .whl && ls .whl/ncnn-*.whl > /dev/null 2>&1 || python3 -m pip download --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      -d .whl ncnn
  du -sh .cw .whl
  exit 0
fi
OUT=${OUT:-/tmp/ncnn-vulkan-out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/ncnn-*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
python3 -c "import ncnn; print('ncnn', ncnn.__version__, 'gpus', ncnn.get_gpu_count())" 2>&1 | tail -1
rm -rf /tmp/cw && mkdir -p /tmp/cw && cp -r .cw/vulkan /tmp/cw/
python3 - "$MODELS" <<'EOF'
import hashlib, sys
from pathlib import Path
from inferd.zoo import write_zoo
names = sys.argv[1].split(",")
paths = write_zoo(Path("/tmp/cw/zoo"), names)
for n in names:
    stamp = (Path("/tmp/cw/vulkan") / n / "ncnn" / (n + ".ncnn.src")).read_text().split()[0]
    have = hashlib.sha256(Path(paths[n]).read_bytes()).hexdigest()
    print(n, "zoo bytes as converted" if have == stamp else "zoo bytes DIFFER from the conversion's (ncnn will fail)")
EOF
extra=""; [ "${FIRST_START:-0}" = 1 ] && extra="--first-start"
timeout "${BENCH_TIMEOUT:-420}" python3 -m inferd.cli bench cold --device vulkan $extra --models "$MODELS" \
    --repeat "${REPEAT:-3}" --no-plots --no-refined --no-reload --out "$OUT" --tag "h100_ncnn" --work /tmp/cw 2>&1 | tail -4
grep -E "^\| " "$OUT"/*cold_vulkan_h100_ncnn.md 2>/dev/null | head -12
