// ref_logits: record reference outputs from llama.cpp (libllama public API only).
// Built and run by scripts/gen-arch-expected and scripts/gen-gemma-expected.
//
//   ref_logits logits MODEL OUT.f32 --tokens 1,2,3 [--mode batch|incr] [common options]
//       Feeds the ids (no tokenisation, nothing added) in one batch (batch) or one token
//       per llama_decode (incr), logits requested for every position; writes
//       little-endian f32 [n_tokens][n_vocab] to OUT.f32.
//
//   ref_logits greedy MODEL --prompt-file F [-n 64] [common options]
//       Tokenises the prompt as llama-completion does (add_special = true,
//       parse_special = true), decodes it in n_batch chunks, then takes the argmax of
//       the last logits n times (stopping after an end-of-generation token). Prints one
//       JSON object on stdout: prompt_tokens, tokens, text (pieces joined, special
//       tokens not rendered, as llama-completion prints them), eog.
//
//       A mixture of experts also gets "router_margin" in the JSON it prints: the
//       smallest gap, over every token and layer, between the k-th and (k+1)-th largest
//       router logit (ffn_moe_logits-N, k = <arch>.expert_used_count): how far the
//       fixture's routing is from a tie another implementation could break otherwise.
//       A router with a bias (gpt-oss) picks by ffn_moe_logits_biased-N: its margin
//       is measured there instead.
//
//   common options: --threads N (2)  --ctx N (512)  --batch N (512)  --ubatch N (512)
//                   --kv f32|f16 (f32)  --fa off|on|auto (off)  --swa-full 0|1 (0)
//                   --repack 0|1 (0: no extra buffer types, like llama.cpp's --no-repack)
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static bool g_repack = false;

static void die(const std::string & msg) {
    fprintf(stderr, "ref_logits: %s\n", msg.c_str());
    exit(1);
}

static void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || getenv("REF_LOGITS_VERBOSE")) {
        fputs(text, stderr);
    }
}

struct opts {
    std::string cmd, model, out, prompt_file, mode = "batch", kv = "f32", fa = "off";
    std::vector<llama_token> tokens;
    int threads = 2, n_ctx = 512, n_batch = 512, n_ubatch = 512, n_predict = 64;
    // mode "last": decode in n_batch chunks, keep logits of the last `last` positions only
    // (long-context parity without n_tokens x n_vocab floats in memory).
    int last = 0;
    bool swa_full = false;
};

static std::vector<llama_token> parse_ids(const std::string & s) {
    std::vector<llama_token> v;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (!item.empty()) v.push_back((llama_token) std::stol(item));
    }
    return v;
}

static opts parse(int argc, char ** argv) {
    opts o;
    std::vector<std::string> pos;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) die("missing value after " + a);
            return argv[++i];
        };
        if (a == "--tokens") o.tokens = parse_ids(next());
        else if (a == "--mode") o.mode = next();
        else if (a == "--threads") o.threads = std::stoi(next());
        else if (a == "--ctx") o.n_ctx = std::stoi(next());
        else if (a == "--batch") o.n_batch = std::stoi(next());
        else if (a == "--ubatch") o.n_ubatch = std::stoi(next());
        else if (a == "--kv") o.kv = next();
        else if (a == "--fa") o.fa = next();
        else if (a == "--swa-full") o.swa_full = next() == "1";
        else if (a == "--repack") g_repack = next() == "1";
        else if (a == "--prompt-file") o.prompt_file = next();
        else if (a == "-n") o.n_predict = std::stoi(next());
        else if (a == "--last") o.last = std::stoi(next());
        else if (a.rfind("--", 0) == 0) die("unknown option " + a);
        else pos.push_back(a);
    }
    if (pos.size() < 2) die("usage: ref_logits logits MODEL OUT.f32 --tokens ... | greedy MODEL --prompt-file F");
    o.cmd = pos[0];
    o.model = pos[1];
    if (o.cmd == "logits") {
        if (pos.size() != 3) die("logits needs MODEL OUT.f32");
        o.out = pos[2];
        if (o.tokens.empty()) die("--tokens is required");
    } else if (o.cmd == "greedy") {
        if (o.prompt_file.empty()) die("--prompt-file is required");
    } else {
        die("unknown command " + o.cmd);
    }
    return o;
}

// Router margins seen by the eval callback (see the header).
struct router_watch {
    int top_k = 0;
    // [0]: unbiased router logits, [1]: biased ones (what a biased router picks by).
    double margin[2] = {INFINITY, INFINITY};
    long decisions[2] = {0, 0};
};
static router_watch g_router;

static bool watch_router(struct ggml_tensor * t, bool ask, void *) {
    const bool plain = strncmp(t->name, "ffn_moe_logits-", 15) == 0;
    const bool biased = strncmp(t->name, "ffn_moe_logits_biased-", 22) == 0;
    if (ask) return plain || biased;
    if (!(plain || biased) || t->type != GGML_TYPE_F32 || g_router.top_k <= 0) return true;
    const int64_t n_exp = t->ne[0], n_tok = t->ne[1];
    if (g_router.top_k >= n_exp) return true;
    std::vector<float> v((size_t) n_exp * n_tok);
    ggml_backend_tensor_get(t, v.data(), 0, v.size() * sizeof(float));
    const int w = biased ? 1 : 0;
    for (int64_t j = 0; j < n_tok; j++) {
        std::vector<float> col(v.begin() + j * n_exp, v.begin() + (j + 1) * n_exp);
        std::sort(col.begin(), col.end(), std::greater<float>());
        g_router.margin[w] = std::min(g_router.margin[w], (double) col[g_router.top_k - 1] - col[g_router.top_k]);
        g_router.decisions[w]++;
    }
    return true;
}

static int meta_int(llama_model * model, const std::string & key) {
    char buf[128];
    if (llama_model_meta_val_str(model, key.c_str(), buf, sizeof buf) < 0) return 0;
    return atoi(buf);
}

static llama_context * make_ctx(llama_model * model, const opts & o) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = o.n_ctx;
    cp.n_batch = o.n_batch;
    cp.n_ubatch = o.n_ubatch;
    cp.n_seq_max = 1;
    cp.n_threads = o.threads;
    cp.n_threads_batch = o.threads;
    cp.no_perf = true;
    cp.swa_full = o.swa_full;
    char arch[64];
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof arch) >= 0) {
        g_router.top_k = meta_int(model, std::string(arch) + ".expert_used_count");
    }
    if (g_router.top_k > 0) {
        cp.cb_eval = watch_router;
        cp.cb_eval_user_data = nullptr;
    }
    if (o.kv == "f32") { cp.type_k = GGML_TYPE_F32; cp.type_v = GGML_TYPE_F32; }
    else if (o.kv == "f16") { cp.type_k = GGML_TYPE_F16; cp.type_v = GGML_TYPE_F16; }
    else die("--kv must be f32 or f16");
    if (o.fa == "off") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    else if (o.fa == "on") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    else if (o.fa == "auto") cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_AUTO;
    else die("--fa must be off, on or auto");
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) die("llama_init_from_model failed");
    return ctx;
}

static void decode(llama_context * ctx, const std::vector<llama_token> & toks, int pos0, bool all_logits) {
    llama_batch b = llama_batch_init((int) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i];
        b.pos[i] = pos0 + (int) i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all_logits || i + 1 == toks.size();
    }
    b.n_tokens = (int) toks.size();
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    if (rc != 0) die("llama_decode returned " + std::to_string(rc));
}

static int run_logits(llama_model * model, const opts & o) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    for (llama_token t : o.tokens) {
        if (t < 0 || t >= n_vocab) die("token id out of range: " + std::to_string(t));
    }
    llama_context * ctx = make_ctx(model, o);
    const int n = (int) o.tokens.size();
    if (o.mode == "last") {
        if (o.last <= 0 || o.last > n) die("--mode last needs 0 < --last <= n_tokens");
        std::vector<float> kept((size_t) o.last * n_vocab);
        const int first_kept = n - o.last;
        for (int p0 = 0; p0 < n; p0 += o.n_batch) {
            const int p1 = std::min(n, p0 + o.n_batch);
            llama_batch b = llama_batch_init(p1 - p0, 0, 1);
            for (int i = p0; i < p1; i++) {
                b.token[i - p0] = o.tokens[i];
                b.pos[i - p0] = i;
                b.n_seq_id[i - p0] = 1;
                b.seq_id[i - p0][0] = 0;
                b.logits[i - p0] = i >= first_kept;
            }
            b.n_tokens = p1 - p0;
            if (llama_decode(ctx, b) != 0) die("llama_decode failed at " + std::to_string(p0));
            llama_batch_free(b);
            for (int i = std::max(p0, first_kept); i < p1; i++) {
                const float * l = llama_get_logits_ith(ctx, i - p0);
                if (!l) die("no logits for position " + std::to_string(i));
                memcpy(&kept[(size_t) (i - first_kept) * n_vocab], l, sizeof(float) * n_vocab);
            }
        }
        FILE * f = fopen(o.out.c_str(), "wb");
        if (!f) die("cannot write " + o.out);
        fwrite(kept.data(), sizeof(float), kept.size(), f);
        fclose(f);
        printf("{\"n_tokens\": %d, \"n_vocab\": %d, \"last\": %d}\n", n, n_vocab, o.last);
        llama_free(ctx);
        return 0;
    }
    std::vector<float> all((size_t) n * n_vocab);
    if (o.mode == "batch") {
        decode(ctx, o.tokens, 0, true);
        for (int i = 0; i < n; i++) {
            const float * l = llama_get_logits_ith(ctx, i);
            if (!l) die("no logits for position " + std::to_string(i));
            memcpy(&all[(size_t) i * n_vocab], l, sizeof(float) * n_vocab);
        }
    } else if (o.mode == "incr") {
        for (int i = 0; i < n; i++) {
            decode(ctx, {o.tokens[i]}, i, true);
            const float * l = llama_get_logits_ith(ctx, -1);
            if (!l) die("no logits for position " + std::to_string(i));
            memcpy(&all[(size_t) i * n_vocab], l, sizeof(float) * n_vocab);
        }
    } else {
        die("--mode must be batch or incr");
    }
    for (float v : all) {
        if (!std::isfinite(v)) die("non-finite logit");
    }
    FILE * f = fopen(o.out.c_str(), "wb");
    if (!f) die("cannot write " + o.out);
    // x86-64 and aarch64 are little-endian: the in-memory floats are the file format.
    fwrite(all.data(), sizeof(float), all.size(), f);
    fclose(f);
    const int w = g_router.decisions[1] > 0 ? 1 : 0;
    if (g_router.decisions[w] > 0) {
        printf("{\"n_tokens\": %d, \"n_vocab\": %d, \"router_margin\": %.6g, \"router_decisions\": %ld}\n",
               n, n_vocab, g_router.margin[w], g_router.decisions[w]);
    } else {
        printf("{\"n_tokens\": %d, \"n_vocab\": %d}\n", n, n_vocab);
    }
    llama_free(ctx);
    return 0;
}

static std::string json_escape(const std::string & s) {
    std::string r;
    for (unsigned char c : s) {
        switch (c) {
            case '"': r += "\\\""; break;
            case '\\': r += "\\\\"; break;
            case '\n': r += "\\n"; break;
            case '\r': r += "\\r"; break;
            case '\t': r += "\\t"; break;
            default:
                if (c < 0x20) { char buf[8]; snprintf(buf, sizeof buf, "\\u%04x", c); r += buf; }
                else r += (char) c;
        }
    }
    return r;
}

static std::string piece(const llama_vocab * vocab, llama_token t) {
    std::vector<char> buf(256);
    int n = llama_token_to_piece(vocab, t, buf.data(), (int) buf.size(), 0, false);
    if (n < 0) {
        buf.resize(-n);
        n = llama_token_to_piece(vocab, t, buf.data(), (int) buf.size(), 0, false);
    }
    return std::string(buf.data(), n);
}

static int run_greedy(llama_model * model, const opts & o) {
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::ifstream in(o.prompt_file, std::ios::binary);
    if (!in) die("cannot read " + o.prompt_file);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string prompt = ss.str();
    int n = -llama_tokenize(vocab, prompt.data(), (int) prompt.size(), nullptr, 0, true, true);
    std::vector<llama_token> ptoks(n);
    if (llama_tokenize(vocab, prompt.data(), (int) prompt.size(), ptoks.data(), n, true, true) != n) die("tokenize failed");

    llama_context * ctx = make_ctx(model, o);
    for (int i = 0; i < n; i += o.n_batch) {
        std::vector<llama_token> chunk(ptoks.begin() + i, ptoks.begin() + std::min(n, i + o.n_batch));
        decode(ctx, chunk, i, false);
    }
    std::vector<llama_token> gen;
    std::string text;
    bool eog = false;
    int pos = n;
    for (int k = 0; k < o.n_predict; k++) {
        const float * l = llama_get_logits_ith(ctx, -1);
        int best = 0;
        for (int j = 1; j < n_vocab; j++) {
            if (l[j] > l[best]) best = j;
        }
        gen.push_back(best);
        if (llama_vocab_is_eog(vocab, best)) { eog = true; break; }
        text += piece(vocab, best);
        if (k + 1 < o.n_predict) decode(ctx, {best}, pos++, false);
    }
    printf("{\"prompt_tokens\": [");
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ptoks[i]);
    printf("], \"tokens\": [");
    for (size_t i = 0; i < gen.size(); i++) printf("%s%d", i ? ", " : "", gen[i]);
    printf("], \"eog\": %s, \"text\": \"%s\"}\n", eog ? "true" : "false", json_escape(text).c_str());
    llama_free(ctx);
    return 0;
}

int main(int argc, char ** argv) {
    opts o = parse(argc, argv);
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    // No extra buffer types (weight repacking, AMX): the same as `--no-repack` on the
    // llama.cpp tools. On these VMs the CPU reports AMX, the kernel grants XTILEDATA,
    // and the AMX tile instructions still raise SIGILL; --repack 1 turns it back on.
    mp.use_extra_bufts = g_repack;
    llama_model * model = llama_model_load_from_file(o.model.c_str(), mp);
    if (!model) die("failed to load " + o.model);
    int rc = o.cmd == "logits" ? run_logits(model, o) : run_greedy(model, o);
    llama_model_free(model);
    llama_backend_free();
    return rc;
}
