#!/usr/bin/env python3
"""Print the metadata key/values (and optionally the tensor table) of a GGUF file.

Dependency-free (stdlib only). Long arrays are summarised (length + first few items).

Usage: gguf_meta.py FILE.gguf [--tensors] [--full-arrays KEY ...]
"""
import struct
import sys

T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 = range(13)
SCALAR = {T_U8: "<B", T_I8: "<b", T_U16: "<H", T_I16: "<h", T_U32: "<I", T_I32: "<i",
          T_F32: "<f", T_BOOL: "<?", T_U64: "<Q", T_I64: "<q", T_F64: "<d"}
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
              10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
              17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
              23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16"}


class Reader:
    def __init__(self, f):
        self.f = f

    def unpack(self, fmt):
        n = struct.calcsize(fmt)
        return struct.unpack(fmt, self.f.read(n))[0]

    def string(self):
        n = self.unpack("<Q")
        return self.f.read(n).decode("utf-8", errors="replace")

    def value(self, t, keep_all=False):
        if t in SCALAR:
            return self.unpack(SCALAR[t])
        if t == T_STR:
            return self.string()
        if t == T_ARR:
            et = self.unpack("<I")
            n = self.unpack("<Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"bad gguf value type {t}")


def read_gguf(path, with_tensors=False):
    with open(path, "rb") as f:
        r = Reader(f)
        if f.read(4) != b"GGUF":
            raise SystemExit(f"{path}: not a GGUF file")
        version = r.unpack("<I")
        n_tensors = r.unpack("<Q")
        n_kv = r.unpack("<Q")
        kv = {}
        for _ in range(n_kv):
            k = r.string()
            t = r.unpack("<I")
            kv[k] = r.value(t)
        tensors = []
        if with_tensors:
            for _ in range(n_tensors):
                name = r.string()
                nd = r.unpack("<I")
                dims = [r.unpack("<Q") for _ in range(nd)]
                tt = r.unpack("<I")
                off = r.unpack("<Q")
                tensors.append((name, dims, GGML_TYPES.get(tt, str(tt)), off))
        return version, kv, tensors


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        sys.exit(2)
    path = args[0]
    with_t = "--tensors" in args
    full = set(args[args.index("--full-arrays") + 1:]) if "--full-arrays" in args else set()
    version, kv, tensors = read_gguf(path, with_t)
    print(f"# GGUF v{version}, {len(kv)} kv")
    for k, v in kv.items():
        if isinstance(v, list) and k not in full and len(v) > 8:
            v = f"[{len(v)} items] {v[:5]!r}..."
        elif isinstance(v, str) and len(v) > 300 and k not in full:
            v = repr(v[:300]) + "..."
        print(f"{k} = {v}")
    for name, dims, tt, off in tensors:
        print(f"tensor {name} {dims} {tt} @{off}")


if __name__ == "__main__":
    main()
