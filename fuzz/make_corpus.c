/* Writes the seed corpus of every fuzz target into fuzz/corpus/<target>/seed-* (small, valid
 * or nearly valid inputs the fuzzer mutates from). Run from the repository root after
 * `make fuzz-build FUZZ=1`: build-fuzz/fuzz/make_corpus. The seeds are committed; run it again
 * only when an input format changes. */
#include <sys/stat.h>
#include <zlib.h>

#include "fuzz.h"

static const char SEP[] = "\n====\n";

typedef struct { uint8_t *p; size_t n; } blob;

static void put(blob *b, const void *d, size_t n) {
    b->p = realloc(b->p, b->n + n + 1);
    if (!b->p) abort();
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u8(blob *b, int v) { uint8_t c = (uint8_t)v; put(b, &c, 1); }
static void put_u32(blob *b, uint32_t v) { put(b, &v, 4); }
static void put_str(blob *b, const char *s) { put_u32(b, (uint32_t)strlen(s)); put(b, s, strlen(s)); }

static void save(const char *target, const char *name, const blob *b) {
    char p[512];
    snprintf(p, sizeof p, "fuzz/corpus/%s", target);
    mkdir("fuzz/corpus", 0755);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "fuzz/corpus/%s/seed-%s", target, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b->p, 1, b->n, f) != b->n || fclose(f)) { perror(p); abort(); }
}

static blob slurp(const char *path) {
    blob b = {0};
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); abort(); }
    uint8_t buf[4096];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, f)) > 0) put(&b, buf, r);
    fclose(f);
    return b;
}

static void seed(const char *target, const char *name, int mode, const blob *body) {
    blob b = {0};
    if (mode >= 0) put_u8(&b, mode);
    put(&b, body->p, body->n);
    save(target, name, &b);
    free(b.p);
}

static void safetensors(void) {
    ct_st_writer *w;
    float x[6] = {1, 2, 3, 4, 5, 6};
    int64_t step = 7, s23[2] = {2, 3}, s4[1] = {4};
    uint8_t u[4] = {1, 0, 1, 1};
    if (ct_st_writer_create(&w)) abort();
    ct_st_writer_add(w, "fc.weight", CT_F32, 2, s23, x);
    ct_st_writer_add(w, "step", CT_I64, 0, NULL, &step);
    ct_st_writer_add(w, "mask", CT_U8, 1, s4, u);
    ct_st_writer_set_metadata(w, "format", "pt");
    char p[600];
    snprintf(p, sizeof p, "%s/seed.safetensors", fz_dir());
    if (ct_st_writer_save(w, p)) abort();
    ct_st_writer_free(w);
    blob b = slurp(p);
    seed("fuzz_safetensors", "three-tensors", -1, &b);
    free(b.p);
    const char *hdr = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},\"__metadata__\":{\"k\":\"v\"}}";
    blob c = {0};
    uint64_t hl = strlen(hdr);
    put(&c, &hl, 8);
    put(&c, hdr, hl);
    put(&c, "\x80\x3f\x00\x40", 4);
    seed("fuzz_safetensors", "bf16", -1, &c);
    free(c.p);
}

static blob idx(int type, int ndim, const uint32_t *dims, const void *data, size_t n) {
    blob b = {0};
    uint8_t magic[4] = {0, 0, (uint8_t)type, (uint8_t)ndim};
    put(&b, magic, 4);
    for (int i = 0; i < ndim; i++) {
        uint32_t be = ((dims[i] & 0xff) << 24) | ((dims[i] & 0xff00) << 8) | ((dims[i] >> 8) & 0xff00) | (dims[i] >> 24);
        put(&b, &be, 4);
    }
    put(&b, data, n);
    return b;
}

static void idx_seeds(void) {
    uint8_t px[18];
    for (int i = 0; i < 18; i++) px[i] = (uint8_t)(i * 14);
    uint32_t d3[3] = {2, 3, 3}, d1[1] = {3}, d2[2] = {2, 2};
    blob a = idx(8, 3, d3, px, 18);
    seed("fuzz_idx", "images-plain", 0, &a);
    seed("fuzz_idx", "images-gz", 1, &a);
    seed("fuzz_idx", "images-dataset", 2, &a);
    seed("fuzz_idx", "images-dataset-gz", 3, &a);
    free(a.p);
    uint8_t lab[3] = {0, 9, 4};
    blob l = idx(8, 1, d1, lab, 3);
    /* a real gzip stream in the file itself, for the reader's own checks of it */
    uLongf cap = 256;
    uint8_t gz[256];
    z_stream z = {0};
    deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    z.next_in = l.p, z.avail_in = (uInt)l.n, z.next_out = gz, z.avail_out = (uInt)cap;
    deflate(&z, Z_FINISH);
    blob g = {0};
    put(&g, gz, z.total_out);
    deflateEnd(&z);
    seed("fuzz_idx", "labels-gzfile", 0, &g);
    seed("fuzz_idx", "labels-plain", 0, &l);
    free(g.p);
    free(l.p);
    float f[4] = {0.5f, -1, 2, 3};
    blob ff = idx(0x0D, 2, d2, f, sizeof f);
    seed("fuzz_idx", "f32", 0, &ff);
    free(ff.p);
    int32_t iv[4] = {1, -2, 3, 4};
    blob ii = idx(0x0C, 2, d2, iv, sizeof iv);
    seed("fuzz_idx", "i32", 1, &ii);
    free(ii.p);
    double dv[3] = {1, 2, 3};
    blob dd = idx(0x0E, 1, d1, dv, sizeof dv);
    seed("fuzz_idx", "f64", 0, &dd);
    free(dd.p);
}

static void data_seeds(void) {
    int32_t hdr[256] = {20240520, 1, 40};
    blob s = {0};
    put(&s, hdr, sizeof hdr);
    for (int i = 0; i < 40; i++) { uint16_t t = (uint16_t)(i * 1000 % 50257); put(&s, &t, 2); }
    seed("fuzz_data", "shard-block4", 0 | (3 << 1), &s);
    seed("fuzz_data", "two-shards-block8", 128 | (7 << 1), &s);
    free(s.p);
    blob t = {0};
    const char *txt = "the quick brown fox jumps over the lazy dog, said the 7 cats.\n";
    put(&t, txt, strlen(txt));
    seed("fuzz_data", "text-block4", 1 | (3 << 1), &t);
    seed("fuzz_data", "text-block16", 1 | (15 << 1), &t);
    free(t.p);
}

static void checkpoint_seeds(void) {
    ct_model_config cfg = ct_model_default_config(CT_MODEL_MLP);
    cfg.mlp.in = 4, cfg.mlp.n_hidden = 1, cfg.mlp.hidden[0] = 3, cfg.mlp.out = 2;
    ct_model *m;
    if (ct_model_create(&cfg, 1, &m)) abort();
    ct_train_model tm = ct_train_model_builtin(m);
    for (int adam = 0; adam < 2; adam++) {
        ct_optim *o;
        ct_sgd_opts so = ct_sgd_default_opts();
        so.momentum = 0.9;
        if (adam ? ct_optim_create_adamw(ct_model_params(m), NULL, &o) : ct_optim_create_sgd(ct_model_params(m), &so, &o)) abort();
        ct_train_state ts = {.step = 3, .epoch = 1, .seed = 5, .world_size = 2, .loss_scale = 65536};
        ts.sampler.position = 12;
        char root[600], dir[700], p[800];
        snprintf(root, sizeof root, "%s/ck%d", fz_dir(), adam);
        if (ct_checkpoint_save(root, &tm, o, &ts, 0)) abort();
        snprintf(dir, sizeof dir, "%s/step-00000003", root);
        blob b = {0};
        static const char *names[3] = {"manifest.json", "model.safetensors", "train_state.safetensors"};
        for (int i = 0; i < 3; i++) {
            snprintf(p, sizeof p, "%s/%s", dir, names[i]);
            blob f = slurp(p);
            if (i) put(&b, SEP, sizeof SEP - 1);
            put(&b, f.p, f.n);
            free(f.p);
        }
        seed("fuzz_checkpoint", adam ? "adamw" : "sgd", adam ? 2 : 0, &b);
        seed("fuzz_checkpoint", adam ? "adamw-fixed-manifest" : "sgd-fixed-manifest", adam ? 3 : 1, &b);
        free(b.p);
        ct_optim_free(o);
    }
    ct_model_free(m);
    /* the manifest of issue 12: a CRC outside uint32 */
    blob man = {0};
    const char *t = "{\"files\": {\"model.safetensors\": {\"bytes\": 0, \"crc32\": -3656149109},"
                    " \"train_state.safetensors\": {\"bytes\": 0, \"crc32\": 0}}}\n====\n\n====\n";
    put(&man, t, strlen(t));
    seed("fuzz_checkpoint", "crc-out-of-range", 0, &man);
    free(man.p);
}

enum { CMD_HELLO = 1, CMD_SET, CMD_GET, CMD_ADD, CMD_CAS, CMD_DEL, CMD_NKEYS, CMD_CHECK };

static void store_seeds(void) {
    /* mode 3: harness sends HELLO and frames each part */
    blob b = {0};
    put_u8(&b, CMD_SET), put_str(&b, "ctrain/0/k"), put_str(&b, "hello");
    put(&b, SEP, sizeof SEP - 1);
    put_u8(&b, CMD_GET), put_str(&b, "ctrain/0/k"), put_u32(&b, 100);
    put(&b, SEP, sizeof SEP - 1);
    put_u8(&b, CMD_ADD), put_str(&b, "n");
    int64_t d = 5;
    put(&b, &d, 8);
    put(&b, SEP, sizeof SEP - 1);
    put_u8(&b, CMD_CAS), put_str(&b, "ctrain/0/k"), put_u32(&b, 1), put_str(&b, "hello"), put_str(&b, "world");
    put(&b, SEP, sizeof SEP - 1);
    put_u8(&b, CMD_CHECK), put_str(&b, "n");
    put(&b, SEP, sizeof SEP - 1);
    put_u8(&b, CMD_NKEYS);
    put(&b, SEP, sizeof SEP - 1);
    put_u8(&b, CMD_DEL), put_str(&b, "n");
    put(&b, SEP, sizeof SEP - 1);
    put_u8(&b, CMD_GET), put_str(&b, "missing"), put_u32(&b, 10);
    seed("fuzz_store", "session", 3, &b);
    free(b.p);
    /* ADD near the int64 limit, twice */
    blob a = {0};
    int64_t big = INT64_MAX - 1;
    put_u8(&a, CMD_ADD), put_str(&a, "c"), put(&a, &big, 8);
    put(&a, SEP, sizeof SEP - 1);
    put_u8(&a, CMD_ADD), put_str(&a, "c"), put(&a, &big, 8);
    seed("fuzz_store", "add-overflow", 3, &a);
    free(a.p);
    /* mode 0: raw stream with a HELLO framed by hand (the token itself, as before the
     * challenge: now refused), then a SET */
    blob r = {0};
    blob h = {0};
    put_u8(&h, CMD_HELLO), put_str(&h, "fuzz-token");
    put_u32(&r, (uint32_t)h.n), put(&r, h.p, h.n);
    blob s = {0};
    put_u8(&s, CMD_SET), put_str(&s, "k"), put_str(&s, "v");
    put_u32(&r, (uint32_t)s.n), put(&r, s.p, s.n);
    seed("fuzz_store", "raw-hello-set", 0, &r);
    blob wrong = {0};
    put_u8(&wrong, CMD_HELLO), put_str(&wrong, "wrong");
    seed("fuzz_store", "wrong-token", 2, &wrong);
    free(h.p), free(s.p), free(r.p), free(wrong.p);
}

static void args(const char *name, const char *const *v, int n) {
    blob b = {0};
    for (int i = 0; i < n; i++) put(&b, v[i], strlen(v[i]) + (i + 1 < n));
    seed("fuzz_train_opts", name, -1, &b);
    free(b.p);
}

static void cli_seeds(void) {
    const char *a[] = {"mlp", "--epochs", "2", "--hidden", "16,8", "--lr", "0.1", "--batch-size", "32", "--nesterov"};
    args("mlp", a, 10);
    const char *g[] = {"gpt", "--text", "t.txt", "--n-layer", "2", "--n-embd", "64", "--n-head", "4", "--block-size", "16",
                       "--schedule", "linear", "--grad-compression", "bf16", "--optimizer", "adamw"};
    args("gpt", g, 17);
    const char *c[] = {"cnn", "--save-every", "10", "--resume", "auto", "--seed", "4294967295", "--clip", "1e9", "--dropout", "0.5"};
    args("cnn", c, 11);
    const char *dv[] = {"mlp", "--device", "cuda:1", "--hidden", "8"};
    args("device", dv, 5);
    static const struct { const char *var, *val; } cv[] = {
        {"CTRAIN_TIMEOUT", "300"}, {"CTRAIN_DEBUG", "INFO"}, {"CTRAIN_SHM_CHUNK", "4M"}, {"OMP_NUM_THREADS", "4,2"},
        {"SLURM_TASKS_PER_NODE", "2(x3)"}, {"WORLD_SIZE", "2"}, {"CTRAIN_DDP_BUCKET_MB", "25"}, {"CTRAIN_OUTPUT_DIR", "out"}};
    for (size_t i = 0; i < sizeof cv / sizeof cv[0]; i++) {
        int k = ct_config_find(cv[i].var);
        if (k < 0) continue;
        for (int how = 0; how < 2; how++) {
            blob b = {0};
            put_u8(&b, k), put_u8(&b, how), put(&b, cv[i].val, strlen(cv[i].val));
            char name[96];
            snprintf(name, sizeof name, "%s-%s", cv[i].var, how ? "set" : "env");
            seed("fuzz_config", name, -1, &b);
            free(b.p);
        }
    }
}

static void model_seeds(void) {
    static const ct_model_kind kinds[3] = {CT_MODEL_MLP, CT_MODEL_CNN, CT_MODEL_GPT};
    static const char *names[3] = {"mlp", "cnn", "gpt"};
    for (int i = 0; i < 3; i++) {
        ct_model_config cfg = ct_model_default_config(kinds[i]);
        cfg.mlp.in = 4, cfg.mlp.n_hidden = 1, cfg.mlp.hidden[0] = 3, cfg.mlp.out = 2;
        cfg.cnn.in_channels = 1, cfg.cnn.height = cfg.cnn.width = 4, cfg.cnn.c1 = cfg.cnn.c2 = 2, cfg.cnn.kernel = 3;
        cfg.cnn.fc = 4, cfg.cnn.classes = 2;
        cfg.gpt.n_layer = 1, cfg.gpt.n_embd = 8, cfg.gpt.n_head = 2, cfg.gpt.block_size = 4, cfg.gpt.vocab_size = 16;
        ct_model *m;
        if (ct_model_create(&cfg, 1, &m)) { fprintf(stderr, "%s: %s\n", names[i], ct_last_error()); abort(); }
        char p[700];
        snprintf(p, sizeof p, "%s/%s.safetensors", fz_dir(), names[i]);
        if (ct_model_save(m, p)) abort();
        blob b = slurp(p);
        seed("fuzz_model_open", names[i], -1, &b);
        free(b.p);
        if (kinds[i] == CT_MODEL_GPT) {
            char d[700];
            snprintf(d, sizeof d, "%s/hf", fz_dir());
            if (ct_gpt_save_hf(m, d)) abort();
            snprintf(p, sizeof p, "%s/model.safetensors", d);
            blob w = slurp(p);
            snprintf(p, sizeof p, "%s/config.json", d);
            blob c = slurp(p);
            put(&w, SEP, sizeof SEP - 1);
            put(&w, c.p, c.n);
            seed("fuzz_model_open", "gpt-hf", -1, &w);
            free(w.p);
            free(c.p);
        }
        ct_model_free(m);
    }
}

int main(void) {
    safetensors();
    idx_seeds();
    data_seeds();
    checkpoint_seeds();
    store_seeds();
    cli_seeds();
    model_seeds();
    return 0;
}
