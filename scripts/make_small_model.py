#!/usr/bin/env python3
"""A smaller model derived from a llama-architecture GGUF (SmolLM2 by default), for machines
that take only a few tens of MiB of files beside the source tree (the GPU machine lent to
some sessions): some of its layers (by default SmolLM2's first four and last three: a model
degrades less without its middle layers), and the token embedding (tied to the output)
requantized to Q4_0. Not a good model; a real one for checking a backend against the
reference on the same file (teacher forcing, generation, speed per layer). Deterministic.

    scripts/make_small_model.py [--src FILE] [--keep 0,1,2,3,27,28,29] OUT.gguf

Needs `pip install gguf==0.19.0 numpy`.
"""

import argparse
import os

import gguf
import numpy as np
from gguf import quants


def main():
    home = os.path.expanduser("~/.cache/mollm/models")
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=os.path.join(home, "smollm2-135m-instruct-q4_1.gguf"))
    ap.add_argument("--keep", default="0,1,2,3,27,28,29", help="layers kept, in order")
    ap.add_argument("out")
    a = ap.parse_args()
    keep = [int(x) for x in a.keep.split(",")]
    new_index = {old: new for new, old in enumerate(keep)}
    r = gguf.GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(a.out + ".tmp", arch)
    for f in r.fields.values():
        if f.name in ("general.architecture", "general.name") or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        value = f.contents()
        if f.name == f"{arch}.block_count":
            value = len(keep)
        w.add_key_value(f.name, value, vt, sub_type=sub)
    w.add_key_value("general.name", f"layers {a.keep} of {os.path.basename(a.src)} "
                    "(scripts/make_small_model.py)", gguf.GGUFValueType.STRING)
    for t in r.tensors:
        name = t.name
        if name.startswith("blk."):
            parts = name.split(".")
            if int(parts[1]) not in new_index:
                continue
            name = ".".join(["blk", str(new_index[int(parts[1])])] + parts[2:])
        data, qtype = np.array(t.data), t.tensor_type
        if t.name == "token_embd.weight" and qtype != gguf.GGMLQuantizationType.Q4_0:
            x = quants.dequantize(data, qtype)
            data, qtype = quants.quantize(x, gguf.GGMLQuantizationType.Q4_0), gguf.GGMLQuantizationType.Q4_0
        shape = list(reversed([int(n) for n in t.shape]))
        w.add_tensor(name, data, raw_shape=quants.quant_shape_to_byte_shape(shape, qtype)
                     if qtype not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
                     else shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(a.out + ".tmp", a.out)
    print(f"{a.out}: {os.path.getsize(a.out)} bytes")


if __name__ == "__main__":
    main()
