#!/usr/bin/env python3
"""Copy a test-llama-archs GGUF without the tensors real checkpoints of these archs do not have.

Dropped (regex on the tensor name):
  *.scale, *.input_scale        per-tensor/per-expert NVFP4 sidecar scales that test-llama-archs
                                creates (random N(0, 0.1)); llama.cpp multiplies some of them into
                                matmul outputs (build_lora_mm(w, x, w_s) = (w @ x) * w_s)
  blk.N.attn_{q,k,v}.bias       random optional attention biases (real Qwen3.5/Qwen3-Next/LFM2 have none)
  blk.N.ssm_in.weight           legacy Qwen3-Next fused qkvz projection (unused when attn_qkv exists)
All metadata is copied unchanged except empty arrays (gguf-py cannot write them; llama.cpp treats absent = empty). Usage: scripts/research/clean_gguf.py IN.gguf OUT.gguf
Needs the gguf-py package (vendored one: PYTHONPATH=<llama.cpp>/gguf-py).
"""
import re
import sys

import gguf

DROP = re.compile(r"(\.scale$|\.input_scale$|^blk\.\d+\.attn_[qkv]\.bias$|^blk\.\d+\.ssm_in\.weight$)")


def main():
    src, dst = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    arch = r.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    w = gguf.GGUFWriter(dst, arch=arch, endianess=r.endianess)
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF."):
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        if vt == gguf.GGUFValueType.ARRAY and len(f.data) == 0:
            continue  # empty arrays (tokenizer.ggml.merges, classifier.output_labels) cannot be re-written
        w.add_key_value(f.name, f.contents(), vt, sub_type=sub)
    keep = [t for t in r.tensors if not DROP.search(t.name)]
    for t in keep:
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in keep:
        w.write_tensor_data(t.data, tensor_endianess=r.endianess)
    w.close()
    print(f"{dst}: kept {len(keep)}/{len(r.tensors)} tensors, dropped "
          + ", ".join(sorted({re.sub(r'blk\.\d+\.', 'blk.N.', t.name) for t in r.tensors if DROP.search(t.name)})))


if __name__ == "__main__":
    main()
