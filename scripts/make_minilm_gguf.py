#!/usr/bin/env python3
"""The GGUF twin of all-MiniLM-L6-v2 (sentence-transformers), F32, as llama.cpp's converter
(convert_hf_to_gguf.py --outtype f32, class BertModel, at llama.cpp 0c1e570 as vendored in
llama-cpp-python 0.3.36) writes it from the Hugging Face directory that
`scripts/fetch-models.sh minilm` makes. No torch and no transformers: numpy reads the
safetensors file and the `gguf` PyPI package (0.19.0) writes the file.

What the converter does for this model, and so this script:

- general.*: architecture "bert", type "model", then the metadata that gguf's Metadata.load
  derives from config.json's _name_or_path ("nreimers/MiniLM-L6-H384-uncased") and the directory
  name ("all-minilm-l6-v2"): name, version, organization, basename; size_label from the parameter
  count (without pooler.* and position_ids); general.file_type 0 (ALL_F32);
  general.quantization_version 2.
- bert.*: block_count 6, context_length 512 (max_position_embeddings), embedding_length 384,
  feed_forward_length 1536, attention.head_count 12, attention.layer_norm_epsilon 1e-12,
  attention.causal false, pooling_type 1 (MEAN, from modules.json -> 1_Pooling/config.json).
- tokenizer.*: token_type_count 2 (type_vocab_size), model "bert", pre "bert-bge" (the
  converter's hash of the tokenization of its check text; checked below when the `tokenizers`
  package is installed), tokens in "phantom space" form (CONTROL tokens as they are, "##x" -> "x",
  any other token t -> "\u2581" + t, so "[unused0]", a NORMAL token, becomes "\u2581[unused0]"),
  token_type (the five added special tokens CONTROL, the rest NORMAL), then what gguf's
  SpecialVocab of that llama.cpp commit finds: bos 101 ([CLS], as cls_token), eos 102 ([SEP], as
  sep_token), unknown 100, seperator 102, padding 0, mask 103 (there is no cls_token_id key: the
  writer has no handler for it, so the converter skips it), add_bos_token true and
  add_eos_token true (the TemplateProcessing post-processor "[CLS] $A [SEP]"), add_sep_token false,
  and tokenizer.ggml.normalizer.lowercase true (BertNormalizer lowercase; strip_accents is null
  there, so no strip_accents key: llama.cpp then strips accents iff it lowercases). The
  normalizer key is written by hand: gguf 0.19.0 from PyPI predates it.
- tensors: safetensors names in sorted order (as gguf's SafetensorsLocal lists them), skipping
  embeddings.position_ids and pooler.dense.*, mapped to llama.cpp names (token_embd,
  position_embd, token_types, token_embd_norm, blk.N.attn_{q,k,v}, blk.N.attn_output,
  blk.N.attn_output_norm, blk.N.ffn_up, blk.N.ffn_down, blk.N.layer_output_norm), all F32.

The output is deterministic (same input files -> same bytes); its sha256 is printed and recorded
in fixtures/golden/embed.json.

Usage: make_minilm_gguf.py [--model-dir DIR] [--out FILE]
  (defaults: ${MOLLM_MODELS_DIR:-~/.cache/mollm/models}/all-minilm-l6-v2 and .../all-minilm-l6-v2.gguf)
Needs: numpy, gguf==0.19.0 (pip install numpy gguf==0.19.0); tokenizers optional (a check).
"""
import argparse
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
import gguf

MODELS_DIR = os.environ.get("MOLLM_MODELS_DIR", os.path.expanduser("~/.cache/mollm/models"))
# sha256 of model.safetensors of sentence-transformers/all-MiniLM-L6-v2 (as fetch-models.sh pins it)
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
# The converter's tokenizer.ggml.pre for this vocabulary: the sha256 of str(ids) of its check
# text tokenized by the HF tokenizer is this hash, which the converter maps to "bert-bge".
PRE_HASH = "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f"
PRE_NAME = "bert-bge"
KEY_NORMALIZER_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
KEY_NORMALIZER_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"

ST_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64}


def read_safetensors(path):
    """name -> numpy array (a copy), from one .safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dt = ST_DTYPES[info["dtype"]]
            a, b = info["data_offsets"]
            f.seek(base + a)
            arr = np.frombuffer(f.read(b - a), dtype=np.dtype(dt).newbyteorder("<"))
            out[name] = arr.reshape(info["shape"]).astype(dt)
    return out


def gguf_tensor_name(hf, n_layers):
    """HF BERT tensor name -> llama.cpp name, or None for the tensors the converter skips."""
    if hf.startswith("bert."):
        hf = hf[5:]
    if hf.endswith(".gamma"):
        hf = hf[:-6] + ".weight"
    if hf.endswith(".beta"):
        hf = hf[:-5] + ".bias"
    if hf in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"):
        return None
    stem, _, suffix = hf.rpartition(".")
    assert suffix in ("weight", "bias"), hf
    fixed = {
        "embeddings.word_embeddings": "token_embd",
        "embeddings.position_embeddings": "position_embd",
        "embeddings.token_type_embeddings": "token_types",
        "embeddings.LayerNorm": "token_embd_norm",
    }
    if stem in fixed:
        return f"{fixed[stem]}.{suffix}"
    parts = stem.split(".")
    assert parts[:2] == ["encoder", "layer"], hf
    bid = int(parts[2])
    assert 0 <= bid < n_layers, hf
    per_layer = {
        "attention.self.query": "attn_q",
        "attention.self.key": "attn_k",
        "attention.self.value": "attn_v",
        "attention.output.dense": "attn_output",
        "attention.output.LayerNorm": "attn_output_norm",
        "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down",
        "output.LayerNorm": "layer_output_norm",
    }
    rest = ".".join(parts[3:])
    assert rest in per_layer, hf
    return f"blk.{bid}.{per_layer[rest]}.{suffix}"


def vocab(model_dir, vocab_size):
    """(tokens in phantom-space form, token types) as BertModel.set_vocab makes them."""
    tj = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    assert tj["model"]["type"] == "WordPiece", tj["model"]["type"]
    id_to_tok = {}
    for tok, i in tj["model"]["vocab"].items():
        id_to_tok[i] = tok
    added = {}
    for at in tj.get("added_tokens", []):
        id_to_tok[at["id"]] = at["content"]
        added[at["id"]] = at
    assert max(id_to_tok) < vocab_size
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in id_to_tok:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tok = id_to_tok[i]
        if i in added:
            at = added[i]
            # The converter round-trips non-normalized added tokens through encode/decode; for
            # these bracketed specials that is the identity. Non-special added tokens would need
            # more of the converter's logic than this model has.
            assert at["special"] and tok.startswith("[") and tok.endswith("]"), at
            types.append(gguf.TokenType.CONTROL)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(tok)

    def phantom(tok, typ):
        if typ == gguf.TokenType.CONTROL:
            return tok
        if tok.startswith("##"):
            return tok[2:]
        return "\u2581" + tok

    return [phantom(t, ty) for t, ty in zip(tokens, types)], types, tj


def special_vocab(model_dir, tj, n_vocab):
    """What gguf's SpecialVocab (llama.cpp 0c1e570) finds in a BERT tokenizer like this one:
    ([(key kind, id)], [(add_* kind, bool)], normalizer lowercase, normalizer strip_accents).
    Written for the shape of this tokenizer (asserted), not for every tokenizer."""
    tc = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    # bos/eos fall back to cls/sep
    if not tc.get("bos_token") and tc.get("cls_token"):
        tc["bos_token"] = tc["cls_token"]
    if not tc.get("eos_token") and tc.get("sep_token"):
        tc["eos_token"] = tc["sep_token"]
    add = {}
    pp = tj.get("post_processor") or {}
    assert pp.get("type") == "TemplateProcessing", pp.get("type")
    single, pair = pp["single"], pp["pair"]
    first = single[0]["SpecialToken"]["id"]
    last = single[-1]["SpecialToken"]["id"]
    assert first in (tc["bos_token"], tc["cls_token"]) and last == tc["eos_token"], (first, last)
    add["bos"] = True
    add["eos"] = True
    # pair "[CLS] A [SEP] B [SEP]": after dropping the leading [CLS] and trailing [SEP], the middle
    # is one [SEP], which counts as add_sep only when the single template has no trailing special
    assert [next(iter(p)) for p in pair] == ["SpecialToken", "Sequence", "SpecialToken", "Sequence",
                                            "SpecialToken"], pair
    middle = pair[2]["SpecialToken"]["id"]
    assert middle in (tc["sep_token"], tc["eos_token"])
    add["sep"] = False
    ids = []
    for typ in ("bos", "eos", "unk", "sep", "pad", "cls", "mask"):
        entry = tc.get(f"{typ}_token")
        if isinstance(entry, dict):
            entry = entry.get("content")
        if not isinstance(entry, str):
            continue
        tid = next((a["id"] for a in tj.get("added_tokens", []) if a["content"] == entry), None)
        if tid is None:
            tid = tj["model"]["vocab"].get(entry)
        if isinstance(tid, int) and 0 <= tid < n_vocab:
            ids.append((typ, tid))
    assert "chat_template" not in tc
    lower = strip = None
    norm = tj.get("normalizer") or {}
    assert norm.get("type") == "BertNormalizer", norm
    if "lowercase" in norm:
        lower = norm["lowercase"]
    if "strip_accents" in norm:
        strip = norm["strip_accents"]
    return ids, add, lower, strip


def check_pre_hash(model_dir):
    """With the `tokenizers` package, recompute the converter's pre-tokenizer hash."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("note: `tokenizers` not installed; tokenizer.ggml.pre taken as", PRE_NAME, "unchecked")
        return
    chktxt = ('\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d'
              '\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 '
              '33333 333333 3333333 33333333 3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2\u1796'
              '\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601 ?\u6211\u60f3\u5728apple\u5de5\u4f5c'
              '1314151\u5929\uff5e ------======= \u043d\u0435\u0449\u043e \u043d\u0430 \u0411\u044a\u043b'
              '\u0433\u0430\u0440\u0441\u043a\u0438 \'\'\'\'\'\'```````""""......!!!!!!?????? I\'ve been '
              '\'told he\'s there, \'RE you sure? \'M not sure I\'ll make it, \'D you like some tea? '
              'We\'Ve a\'lL')
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    ids = tok.encode(chktxt).ids
    h = hashlib.sha256(str(ids).encode()).hexdigest()
    if h != PRE_HASH:
        sys.exit(f"pre-tokenizer hash {h} != {PRE_HASH}: not the vocabulary this script expects")
    print(f"tokenizer.ggml.pre: hash {h[:16]}... -> {PRE_NAME} (checked)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", default=os.path.join(MODELS_DIR, "all-minilm-l6-v2"))
    ap.add_argument("--out", default=os.path.join(MODELS_DIR, "all-minilm-l6-v2.gguf"))
    args = ap.parse_args()
    model_dir = Path(args.model_dir)
    st_path = model_dir / "model.safetensors"
    if not st_path.is_file():
        sys.exit(f"{st_path}: missing (run scripts/fetch-models.sh minilm)")
    h = hashlib.sha256(st_path.read_bytes()).hexdigest()
    if h != SAFETENSORS_SHA256:
        sys.exit(f"{st_path}: sha256 {h}, want {SAFETENSORS_SHA256}")
    hp = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    assert hp["architectures"] == ["BertModel"] and hp["hidden_act"] == "gelu", hp
    assert hp.get("position_embedding_type", "absolute") == "absolute"
    n_layers = hp["num_hidden_layers"]
    check_pre_hash(model_dir)

    weights = read_safetensors(st_path)
    tensors = []
    for hf in sorted(weights):
        name = gguf_tensor_name(hf, n_layers)
        if name is None:
            continue
        tensors.append((name, np.ascontiguousarray(weights[hf].astype(np.float32))))
    assert len(tensors) == 5 + 16 * n_layers, len(tensors)
    total_params = sum(int(np.prod(a.shape)) for _, a in tensors)

    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    w = gguf.GGUFWriter(path=None, arch="bert")
    for name, a in tensors:
        w.add_tensor(name, a, raw_dtype=gguf.GGMLQuantizationType.F32)

    # prepare_metadata: type, model metadata, then set_gguf_parameters, quantization version
    w.add_type(gguf.GGUFType.MODEL)
    meta = gguf.Metadata.load(None, model_dir, None, total_params)
    if meta.name is None:
        meta.name = model_dir.name
    if meta.size_label is None and total_params > 0:
        meta.size_label = gguf.size_label(total_params, total_params, 0, 0)
    meta.set_gguf_meta_model(w)

    w.add_block_count(n_layers)
    w.add_context_length(hp["max_position_embeddings"])
    w.add_embedding_length(hp["hidden_size"])
    w.add_feed_forward_length(hp["intermediate_size"])
    w.add_head_count(hp["num_attention_heads"])
    w.add_layer_norm_eps(hp["layer_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_causal_attention(False)
    pooling = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
    ppath = next(m["path"] for m in pooling if m["type"].endswith("Pooling"))
    pcfg = json.loads((model_dir / ppath / "config.json").read_text(encoding="utf-8"))
    assert pcfg["pooling_mode_mean_tokens"], pcfg
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    # set_vocab
    vocab_size = hp["vocab_size"]
    tokens, types, tj = vocab(model_dir, vocab_size)
    w.add_token_type_count(hp.get("type_vocab_size", 1))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre(PRE_NAME)
    w.add_token_list(tokens)
    w.add_token_types(types)
    ids, add, lower, strip = special_vocab(model_dir, tj, len(tokens))
    for typ, tid in ids:
        handler = getattr(w, f"add_{typ}_token_id", None)
        if handler is not None:  # no add_cls_token_id: the converter skips cls too
            handler(tid)
    for typ, val in add.items():
        getattr(w, f"add_add_{typ}_token")(val)
    if lower is not None:
        w.add_bool(KEY_NORMALIZER_LOWERCASE, lower)
    if strip is not None:
        w.add_bool(KEY_NORMALIZER_STRIP_ACCENTS, strip)

    w.write_header_to_file(path=tmp)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(tensors)} tensors, {total_params} params)")
    print(f"sha256 {sha}")


if __name__ == "__main__":
    main()
