// Writes tiny random-weight GGUFs through llama.cpp's public API (llama_model_init_from_user +
// llama_model_save_to_file), for mollm issue 53. Two modes:
//   rwkv7 OUT.gguf [seed]
//       RWKV7 from scratch (llama.cpp's test-llama-archs skips the RWKV archs).
//   from TEMPLATE.gguf OUT.gguf seed [key=u32 ...]
//       copies TEMPLATE's metadata (not its tensors), overrides the listed u32 keys, re-creates
//       every tensor with random data (shapes from the overridden hyper-parameters), saves.
//       e.g. qwen35 with ssm.group_count=1 (H_k=1 < H_v=2) to exercise the GDN head broadcast.
//
// Build (example):
//   B=~/.cache/mollm/llama.cpp-0c1e570-tests; S=~/.cache/mollm/llama.cpp-0c1e570-src/vendor/llama.cpp
//   g++ -O2 -std=c++17 scripts/research/make_random.cpp -I$S/include -I$S/ggml/include \
//       -L$B/bin -lllama -lggml -lggml-base -Wl,-rpath,$B/bin -o make_random
// Run: ./make_random rwkv7 OUT.gguf [seed] | ./make_random from T.gguf OUT.gguf 1 qwen35.ssm.group_count=1
//
// rwkv7 shapes: n_vocab 128, n_embd 256, 2 layers, wkv head_size 64 (4 heads), n_ff 384,
// lora ranks decay/iclr/value_res_mix 32, gate 64, context 256. Weights: all F32,
// N(0, 0.1) from std::mt19937(seed ^ std::hash<std::string>(tensor name)), like test-llama-archs
// (including its -fabs for names containing "ssm_a", i.e. ssm_a AND ssm_alpha): "from" with no
// overrides on a test-llama-archs file reproduces it byte for byte.
#include "gguf.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

struct init_params {
    size_t seed;
    float stdev;
};

static void set_data(struct ggml_tensor * t, void * ud) {
    const init_params & p = *(const init_params *) ud;
    std::mt19937 gen(p.seed ^ std::hash<std::string>{}(t->name));
    std::normal_distribution<float> dis(0.0f, p.stdev);
    if (t->type != GGML_TYPE_F32) {
        fprintf(stderr, "unexpected type for %s\n", t->name);
        abort();
    }
    std::vector<float> v(ggml_nelements(t));
    // like test-llama-archs: Mamba/GDN A must be negative; note the substring test also hits ssm_alpha
    const bool neg = strstr(t->name, "ssm_a") != nullptr;
    for (auto & x : v) {
        const float r = dis(gen);
        x = neg ? -fabsf(r) : r;
    }
    ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
}

static int save_random(gguf_context * g, const char * out, size_t seed) {
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    init_params ip = { seed, 0.1f };
    llama_model * model = llama_model_init_from_user(g, set_data, &ip, mp);
    if (!model) {
        fprintf(stderr, "llama_model_init_from_user failed\n");
        return 1;
    }
    llama_model_save_to_file(model, out);
    llama_model_free(model);
    fprintf(stderr, "wrote %s\n", out);
    return 0;
}

static int from_template(int argc, char ** argv) {
    // argv: from TEMPLATE OUT seed [key=u32 ...]
    gguf_init_params gp = { /*no_alloc =*/ true, /*ctx =*/ nullptr };
    gguf_context * t = gguf_init_from_file(argv[2], gp);
    if (!t) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 1;
    }
    gguf_context * g = gguf_init_empty();
    gguf_set_kv(g, t); // metadata only, no tensor infos
    for (int i = 5; i < argc; i++) {
        std::string kv = argv[i];
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) {
            fprintf(stderr, "bad override %s\n", argv[i]);
            return 1;
        }
        const std::string key = kv.substr(0, eq), val = kv.substr(eq + 1);
        if (!val.empty() && val[0] == '[') {
            // "[a,b,c]" -> INT32 array (e.g. rope.dimension_sections)
            std::vector<int32_t> arr;
            size_t p = 1;
            while (p < val.size() && val[p] != ']') {
                size_t q = val.find_first_of(",]", p);
                arr.push_back((int32_t) std::stol(val.substr(p, q - p)));
                p = val[q] == ',' ? q + 1 : q;
            }
            gguf_set_arr_data(g, key.c_str(), GGUF_TYPE_INT32, arr.data(), arr.size());
        } else {
            gguf_set_val_u32(g, key.c_str(), (uint32_t) std::stoul(val));
        }
    }
    const int rc = save_random(g, argv[3], std::stoull(argv[4]));
    gguf_free(g);
    gguf_free(t);
    return rc;
}

int main(int argc, char ** argv) {
    if (argc >= 5 && std::string(argv[1]) == "from") {
        return from_template(argc, argv);
    }
    if (argc < 3 || std::string(argv[1]) != "rwkv7") {
        fprintf(stderr, "usage: %s rwkv7 OUT.gguf [seed] | %s from TEMPLATE.gguf OUT.gguf seed [key=u32 ...]\n", argv[0], argv[0]);
        return 1;
    }
    const char * out = argv[2];
    const size_t seed = argc > 3 ? std::stoull(argv[3]) : 1;
    const uint32_t n_vocab = 128;

    gguf_context * g = gguf_init_empty();
    gguf_set_val_str(g, "general.architecture", "rwkv7");
    gguf_set_val_u32(g, "rwkv7.vocab_size", n_vocab);
    gguf_set_val_u32(g, "rwkv7.context_length", 256);
    gguf_set_val_u32(g, "rwkv7.embedding_length", 256);
    gguf_set_val_u32(g, "rwkv7.block_count", 2);
    gguf_set_val_u32(g, "rwkv7.feed_forward_length", 384);
    gguf_set_val_u32(g, "rwkv7.attention.head_count", 0); // as the HF converter writes it
    gguf_set_val_f32(g, "rwkv7.attention.layer_norm_epsilon", 1e-5f);
    gguf_set_val_u32(g, "rwkv7.wkv.head_size", 64);
    gguf_set_val_u32(g, "rwkv7.attention.decay_lora_rank", 32);
    gguf_set_val_u32(g, "rwkv7.attention.iclr_lora_rank", 32);
    gguf_set_val_u32(g, "rwkv7.attention.value_residual_mix_lora_rank", 32);
    gguf_set_val_u32(g, "rwkv7.attention.gate_lora_rank", 64);
    gguf_set_val_u32(g, "rwkv7.token_shift_count", 2);

    gguf_set_val_str(g, "tokenizer.ggml.model", "test");
    std::vector<std::string> toks(n_vocab);
    std::vector<const char *> ptrs(n_vocab);
    std::vector<float> scores(n_vocab, 0.0f);
    for (uint32_t i = 0; i < n_vocab; i++) {
        toks[i] = "tok_" + std::to_string(i);
        ptrs[i] = toks[i].c_str();
    }
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", ptrs.data(), ptrs.size());
    gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());

    const int rc = save_random(g, out, seed);
    gguf_free(g);
    return rc;
}
