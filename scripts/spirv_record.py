"""Record the SPIR-V variants the zoo's models can ask for on this machine's Vulkan device (every candidate kernel
of every layer, fp32 and fp16 where the device has 16-bit storage) into shaders/shipped.txt, merged with what it
lists: the set `inferd.vulkan.precompile` compiles into the package at build time. Run on each device kind the
package should start fast on (lavapipe, an NVIDIA GPU). Usage: python scripts/spirv_record.py [MODEL ...]."""
import sys
import tempfile
from pathlib import Path

import inferd.ops  # noqa: F401
from inferd import zoo
from inferd.frontend import import_model
from inferd.vulkan.precompile import default_list, model_variants, read_list, write_list

MODELS = ["tiny", "mlp_small", "resnet18", "resnet50", "mobilenetv2", "squeezenet1_1", "shufflenetv2_x1_0", "vgg16",
          "efficientnet_b0", "googlenet", "unet_small", "vit_tiny", "vad_lstm", "crnn_lstm", "kws_gru"]


def main() -> None:
    names = sys.argv[1:] or MODELS
    tmp = Path(tempfile.mkdtemp(prefix="spirv-record-"))
    paths = zoo.write_zoo(tmp, names)
    found: set = set()
    for n in names:
        g = import_model(paths[n])
        for p in ("fp32", "fp16"):
            try:
                v = model_variants(g, p)
            except Exception as e:  # a model this device cannot load (a run-time shaped tail) ships nothing
                print(f"{n} {p}: {type(e).__name__}: {e}"[:200])
                continue
            print(f"{n} {p}: {len(v)} variants ({len(v - found)} new)")
            found |= v
    lst = default_list()
    have = read_list(lst) if lst.is_file() else []
    write_list(lst, have + sorted(found))
    print(f"{lst}: {len(set(have) | found)} variants")


if __name__ == "__main__":
    main()
