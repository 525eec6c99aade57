/* ctrain/models.h — the built-in models (MLP, CNN, GPT-2) and state_dict I/O.
 *
 *   ct_model_config cfg = ct_model_default_config(CT_MODEL_GPT);
 *   cfg.gpt.n_layer = 6; cfg.gpt.n_embd = 256; cfg.gpt.n_head = 8;
 *   ct_model *m;
 *   if (ct_model_create(&cfg, 1337, &m) != CT_OK) { fprintf(stderr, "%s\n", ct_last_error()); return 1; }
 *   puts(ct_model_describe(m));                               // "GPT(...): 4,870,144 parameters"
 *   ct_ctx *ctx;
 *   ct_ctx_create(NULL, &ctx);                                // (check its status too)
 *   ct_tensor *loss = ct_model_loss(ctx, m, tokens, targets);  // [B,T] i32 each
 *   ct_backward(ctx, loss);                                   // grads in ct_params_grad(ct_model_params(m))
 *   ...
 *   ct_model_save(m, "out/model.safetensors");                 // loads in PyTorch: load_state_dict
 *
 * Parameter names are those of PyTorch's state_dict for the equivalent nn.Module
 * (tests/torch/gen_models.py holds the three PyTorch definitions):
 *  - MLP: nn.Sequential(Linear(in, h0), ReLU(), [Dropout(p)], Linear(h0, h1), ReLU(), ...,
 *    Linear(h_last, out)) → "0.weight", "0.bias", "2.weight", ... (Dropout layers only when
 *    dropout > 0, as they shift the numbering). Input [B, in] f32, or [B, C, H, W] (flattened).
 *  - CNN: features = Sequential(Conv2d(in_ch, c1, k, padding=k/2), ReLU(), MaxPool2d(2),
 *    Conv2d(c1, c2, k, padding=k/2), ReLU(), MaxPool2d(2)); flatten;
 *    classifier = Sequential(Linear(c2*(H/4)*(W/4), fc), ReLU(), Dropout(p), Linear(fc, classes))
 *    → "features.0.weight", "features.3.weight", "classifier.0.weight", "classifier.3.weight".
 *    Input [B, in_ch, H, W] f32.
 *  - GPT: nanoGPT's GPT (GPT-2: learned positions, pre-LN blocks, causal self-attention,
 *    4x MLP with exact GELU (or GPT-2's tanh approximation: gpt.gelu_tanh), final LN,
 *    LM head tied to the token embedding), nn.Linear
 *    layouts ([out, in]): "transformer.wte.weight", "transformer.wpe.weight",
 *    "transformer.h.0.ln_1.weight", "transformer.h.0.attn.c_attn.weight",
 *    "transformer.h.0.attn.c_proj.bias", "transformer.h.0.mlp.c_fc.weight", ...,
 *    "transformer.ln_f.bias"; "lm_head.weight" is the same tensor as wte (not a separate
 *    parameter; written by save because PyTorch's state_dict has it). GPT-2 init: N(0, 0.02),
 *    c_proj weights N(0, 0.02/sqrt(2 n_layer)), zero biases, LayerNorm 1/0.
 *    Input [B, T] i32/i64 tokens (T <= block_size) → logits [B, T, vocab].
 *    Dropout (p = dropout) on embeddings, after each c_proj; attention-probability
 *    dropout (nanoGPT's attn_dropout) is not applied.
 *  - Llama: Hugging Face's LlamaForCausalLM: "model.embed_tokens.weight",
 *    "model.layers.N.input_layernorm.weight", "model.layers.N.self_attn.{q,k,v,o}_proj.weight",
 *    "model.layers.N.post_attention_layernorm.weight", "model.layers.N.mlp.{gate,up,down}_proj.weight",
 *    "model.norm.weight", "lm_head.weight" (tied to embed_tokens when tie_word_embeddings).
 *    Init N(0, 0.02), RMSNorm weights 1. Input [B, T] tokens → logits [B, T, vocab]; the
 *    loss takes [B, T] next-token targets with -100 ignored (Hugging Face's).
 */
#ifndef CTRAIN_MODELS_H
#define CTRAIN_MODELS_H

#include "ctrain/io.h"
#include "ctrain/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The built-in kinds, in the order of the table in src/models/model_internal.h. A kind
 * added to that table without a name here is reached by its name (ct_model_kind_parse) and
 * keeps its config in ct_model_config.custom (docs/adding-a-model.md). */
typedef enum { CT_MODEL_MLP = 0, CT_MODEL_CNN, CT_MODEL_GPT, CT_MODEL_LLAMA } ct_model_kind;

#define CT_MLP_MAX_HIDDEN 16

typedef struct ct_model_config {
    ct_model_kind kind;
    struct {
        int in;                          /* 784 */
        int n_hidden;                    /* number of hidden layers, 0..CT_MLP_MAX_HIDDEN */
        int hidden[CT_MLP_MAX_HIDDEN];   /* widths: {1024, 1024} */
        int out;                         /* 10 */
        float dropout;                   /* after each hidden ReLU; 0 = no Dropout layers */
    } mlp;
    struct {
        int in_channels, height, width;  /* 1, 28, 28 (height, width divisible by 4) */
        int c1, c2;                      /* conv channels: 32, 64 */
        int kernel;                      /* odd, 5 ("same" padding kernel/2) */
        int fc;                          /* hidden linear width: 128 */
        int classes;                     /* 10 */
        float dropout;                   /* classifier dropout p (0 = identity) */
    } cnn;
    struct {
        int n_layer, n_embd, n_head;     /* 6, 256, 8 */
        int block_size;                  /* context length: 256 */
        int vocab_size;                  /* 256 */
        float dropout;                   /* 0: embedding and residual dropout (GPT-2's embd_pdrop, resid_pdrop) */
        /* GPT-2's attn_pdrop, carried from an imported config.json to the export; ctrain's
         * attention applies no dropout (0) */
        float attn_pdrop;
        bool bias;                       /* biases in Linear and LayerNorm (GPT-2: true) */
        /* MLP activation: false = exact GELU (nanoGPT, ctrain's default), true = the tanh
         * approximation OpenAI's GPT-2 uses (Hugging Face "gelu_new") */
        bool gelu_tanh;
        float ln_eps;                    /* LayerNorm epsilon: 1e-5 (GPT-2's layer_norm_epsilon) */
        bool flash_attention;            /* fused attention, O(T) memory (ct_flash_attention; the default); false: plain */
        bool checkpoint_activations;     /* recompute each block in backward instead of keeping its activations */
    } gpt;
    /* Llama (Hugging Face's LlamaConfig names): RMSNorm, rotary positions, grouped-query
     * attention, SwiGLU MLP, no biases */
    struct {
        int vocab_size;                  /* 32000 */
        int hidden_size;                 /* 4096 */
        int intermediate_size;           /* 11008 */
        int num_hidden_layers;           /* 32 */
        int num_attention_heads;         /* 32 (dividing hidden_size) */
        int num_key_value_heads;         /* 32 (dividing num_attention_heads; fewer: grouped-query) */
        int max_position_embeddings;     /* context length: 2048 */
        float rms_norm_eps;              /* 1e-6 */
        float rope_theta;                /* 10000 */
        ct_rope_scaling rope_scaling;    /* rope_scaling "llama3" (factor 0: none, the default) */
        bool tie_word_embeddings;        /* lm_head is embed_tokens (false: its own weight) */
        bool flash_attention;            /* fused attention (the default); false: plain */
        bool checkpoint_activations;     /* recompute each layer in backward */
    } llama;
    /* the config of a kind whose struct is not above: its own file's, stored here */
    _Alignas(8) unsigned char custom[256];
} ct_model_config;

typedef struct ct_model ct_model;

/* Defaults: MLP 784-1024-1024-10; CNN above with c1=32, c2=64, k=5, fc=128, 10 classes;
 * GPT 6 layers, width 256, 8 heads, context 256, vocabulary 256, no dropout, biases, fused attention. */
ct_model_config ct_model_default_config(ct_model_kind kind);
/* Checks the config: CT_ERR_INVALID naming the bad field. */
ct_status ct_model_config_check(const ct_model_config *cfg);
/* Builds and initialises (seeded, deterministic). CT_ERR_INVALID for a bad config (the
 * message names the field), CT_ERR_NOMEM when out of memory; *out = NULL on error. */
ct_status ct_model_create(const ct_model_config *cfg, uint64_t seed, ct_model **out);
/* The same model with its parameters' values deferred (ct_params_finalize_deferred): no
 * memory for them until ct_params_materialize, or until ct_fsdp_create makes each rank's
 * shards alone (sharded initialisation: the same values as ct_model_create's). */
ct_status ct_model_create_deferred(const ct_model_config *cfg, uint64_t seed, ct_model **out);
void ct_model_free(ct_model *m);
ct_params *ct_model_params(ct_model *m);
const ct_model_config *ct_model_config_of(const ct_model *m);
ct_module *ct_model_module(ct_model *m);       /* root module (for MLP: the Sequential) */
/* Parameters as PyTorch counts them (tied weights once). */
int64_t ct_model_num_params(const ct_model *m);
/* "GPT(n_layer=6, n_embd=256, n_head=8, block_size=256, vocab_size=256, dropout=0): 4,870,144 parameters"
 * (the default GPT; the tied LM head counted once) */
const char *ct_model_describe(const ct_model *m);
/* "mlp" | "cnn" | "gpt"; parse accepts the same (case-insensitive). */
const char *ct_model_kind_name(ct_model_kind k);
ct_status ct_model_kind_parse(const char *s, ct_model_kind *out);

/* Forward: MLP [B, in] (or [B, ...] flattened) → [B, out]; CNN [B, C, H, W] → [B, classes];
 * GPT [B, T] tokens → [B, T, vocab]. Inputs must be contiguous. */
ct_tensor *ct_model_forward(ct_ctx *ctx, ct_model *m, ct_tensor *input);
/* Mean cross-entropy. MLP/CNN: target [B] class indices (i32/i64, -100 ignored);
 * GPT: target [B, T] (i32/i64; -1 ignored, as nanoGPT), mean over all B*T positions. */
ct_tensor *ct_model_loss(ct_ctx *ctx, ct_model *m, ct_tensor *input, ct_tensor *target);

/* ---- state_dict I/O (safetensors; src/models/model_io.c) ----
 * Save: every parameter and buffer under its state_dict name, f32, metadata format=pt;
 * atomic (see ct_st_writer_save). Load: every name of the model must be in the file with the
 * same shape and a float dtype (F32, or F16/BF16/F64 converted as PyTorch's copy_ does);
 * a missing, extra, mis-shaped or non-float tensor is CT_ERR_FORMAT with a message naming the
 * tensor and the file (a file that cannot be opened or parsed: ct_st_open's status and
 * message), and nothing in the model is changed. */
ct_status ct_model_save(const ct_model *m, const char *path);
/* The same file, with fetch called before each tensor's bytes are written (ct_st_writer_set_fetch):
 * how a sharded model is written whole one unit at a time (ct_fsdp_stream). */
ct_status ct_model_save_fetch(const ct_model *m, const char *path, ct_st_fetch_fn fetch, void *user);
/* GPT: also accepts "lm_head.weight" (tied: must match wte's shape; wte is what is used)
 * and nanoGPT's causal-mask buffers "transformer.h.N.attn.bias" (ignored). */
ct_status ct_model_load(ct_model *m, const char *path);
/* The same for any parameter store (strict: exactly the store's names). */
ct_status ct_params_save(const ct_params *P, const char *path);
ct_status ct_params_load(ct_params *P, const char *path);

/* ---- a model from its file alone (model_io.c, gpt_hf.c) ----
 * ct_model_save also writes the config as string metadata ("ctrain.model" = "gpt",
 * "ctrain.n_layer" = "6", ...; the tensors are unchanged), so that the file alone says what
 * to build. Without that metadata a GPT is recognised by its tensors: ctrain's (nanoGPT's)
 * nn.Linear layout, or Hugging Face's GPT2LMHeadModel (Conv1D weights [in, out], names with or
 * without "transformer."); the shape comes from the tensors and the config.json beside the file
 * (Hugging Face's names: n_head, activation_function, layer_norm_epsilon, ...); without one a
 * GPT-2 has n_head = n_embd / 64 (GPT-2's head size) and gelu_new, a nanoGPT file is refused
 * (its heads are unknown). CT_ERR_FORMAT naming the file when it holds none of these. */
typedef enum { CT_LAYOUT_CTRAIN = 0, CT_LAYOUT_HF, CT_LAYOUT_HF_GPT2 = CT_LAYOUT_HF } ct_weights_layout;
ct_status ct_model_config_from_file(const char *path, ct_model_config *cfg, ct_weights_layout *layout);
/* The model cfg describes against the weights file at path, before it is built: CT_ERR_FORMAT
 * naming the file when the model has more parameters than the file has float values (it
 * cannot load from it), so that a config (a flag, an edited metadata or config.json) never
 * allocates more than the file allows. Counted from the shapes and the file's header alone.
 * `what` begins the message ("the flags describe"; NULL: "the config describes").
 * ct_model_config_from_file checks its config so (ct_model_open, eval, --init-from). */
ct_status ct_model_config_fits_file(const ct_model_config *cfg, const char *path, const char *what);
/* The config ct_model_save (or ct_model_write_config) put into a file's metadata, and the
 * number of parameters it describes (counted, nothing built; numel may be NULL).
 * CT_ERR_NOT_FOUND when the file has no ctrain config, CT_ERR_FORMAT for an invalid one. */
ct_status ct_model_config_from_metadata(const ct_st_file *f, ct_model_config *cfg, double *numel);
/* The model's config as metadata into a writer, as ct_model_save writes it (a sharded
 * checkpoint's train state carries it, so the checkpoint alone says what to build). */
ct_status ct_model_write_config(const ct_model *m, ct_st_writer *w);
/* config, create and load in one: any file ct_model_config_from_file understands */
ct_status ct_model_open(const char *path, ct_model **out);
/* Load weights in the given layout: ct_model_load, or the kind's Hugging Face reader
 * (CT_ERR_UNSUPPORTED for a kind without one). */
ct_status ct_model_load_layout(ct_model *m, const char *path, ct_weights_layout layout);
/* `dir`/model.safetensors + config.json in the kind's Hugging Face layout (GPT:
 * ct_gpt_save_hf); CT_ERR_UNSUPPORTED for a kind without one. */
ct_status ct_model_save_hf(const ct_model *m, const char *dir);

/* ---- what a kind is (model.c) ----
 * Each kind describes itself in its own file: the batch it takes, its options (config
 * keys, saved as metadata and taken as `ctrain train` flags), its data and its training
 * defaults. The trainer's input checks, the CLI's flags and --help, and the model files'
 * metadata read these, so none of them names a kind.
 *
 *   for (int k = 0; k < ct_model_kind_count(); k++) {
 *       const ct_model_kind_info *ki = ct_model_kind_info_of((ct_model_kind)k);
 *       for (int i = 0; i < ki->noptions; i++) printf("%s.%s\n", ki->name, ki->options[i].key);
 *   }
 *   ct_model_config c = ct_model_default_config(CT_MODEL_GPT);
 *   ct_model_config_set(&c, ct_model_option_find(CT_MODEL_GPT, "n_layer"), "12");
 */
typedef enum { CT_MODEL_DATA_IMAGES = 0, CT_MODEL_DATA_TOKENS } ct_model_data;

/* One sample of what a model takes (fields 0: not checked). */
typedef struct ct_model_batch {
    int64_t classes;       /* targets in [0, classes), or ignore_index */
    int64_t ignore_index;  /* the target the loss skips: -100 (the GPT: -1, nanoGPT's) */
    int64_t vocab;         /* > 0: inputs are token ids in [0, vocab); else f32 values */
    int64_t x_numel;       /* values in one input (an MLP flattens it) */
    int x_ndim;            /* > 0: one input has these dims (batch excluded)... */
    int64_t x_shape[CT_MAX_DIMS]; /* ...of these sizes */
    int64_t x_max_len;     /* > 0: the first dim is at most this (a context length) */
} ct_model_batch;
ct_model_batch ct_model_batch_of(const ct_model_config *c);

/* option flags */
#define CT_OPT_META    1u /* saved in the model file's metadata: part of what the model is */
#define CT_OPT_FLAG    2u /* a `ctrain train` flag: "--" + key with '-' for '_' (or .flag) */
#define CT_OPT_RUN     4u /* how the model runs, not what it is: kept over --init-from's config */
#define CT_OPT_CONTEXT 8u /* the context length: with --init-from it may only shorten training's */
/* with CT_OPT_META: saved only when it differs from the kind's default (a field added later:
 * the files of models without it stay byte for byte what they were) */
#define CT_OPT_META_SET 16u

/* One config field of a kind. */
typedef struct ct_model_option {
    const char *key;         /* "n_layer": metadata "ctrain.n_layer", flag "--n-layer" */
    char type;               /* 'i' int, 'f' float, 'b' bool, 'l' comma-separated ints */
    unsigned flags;          /* CT_OPT_* */
    size_t off, len_off;     /* the field in ct_model_config; 'l': its count (an int) */
    double lo, hi;           /* a flag's bounds (each value of a list) */
    const char *flag;        /* NULL: from the key */
    const char *words;       /* a bool flag with a value: "plain|flash" (false|true); NULL: a bare switch */
    const char *cli_default; /* `ctrain train`'s value where it is not the library's ("4"); NULL: the library's */
    const char *want;        /* NULL: "an integer in [lo, hi]"...; what an error says is expected */
    const char *help;        /* one line for --help */
} ct_model_option;

typedef struct ct_model_kind_info {
    const char *name;       /* "gpt": ct_model_kind_name, ct_model_kind_parse */
    ct_model_data data;     /* images (IDX: --data-dir) or token sequences (--text, --shards) */
    const char *optimizer;  /* `ctrain train`'s default: "sgd" (momentum 0.9) or "adamw" */
    double adam_beta2;      /* ... and AdamW's beta2 for it */
    bool eval_each_epoch;   /* evaluate after each epoch (false: at the end, or --eval-every) */
    bool hf;                /* has a Hugging Face layout: --init-from reads it, --export hf writes it */
    bool generates;         /* ctrain generate can sample from it */
    const ct_model_option *options;
    int noptions;
} ct_model_kind_info;

int ct_model_kind_count(void);
/* NULL for a kind past the table */
const ct_model_kind_info *ct_model_kind_info_of(ct_model_kind k);
/* "mlp, cnn or gpt": every kind's name, for messages */
const char *ct_model_kind_list(char *buf, size_t n);
/* the option of kind k with this key or flag ("n_layer" or "--n-layer"); NULL: none */
const ct_model_option *ct_model_option_find(ct_model_kind k, const char *key_or_flag);
/* the option's flag, "--n-layer" */
const char *ct_model_option_flag(const ct_model_option *o, char *buf, size_t n);
/* what a value of the option must be, "an integer in [1, 256]" */
const char *ct_model_option_want(const ct_model_option *o, char *buf, size_t n);
/* Sets the option from text within its bounds (a switch: NULL or "true"/"false";
 * CT_ERR_INVALID "... expects ..., got '...'" otherwise, nothing changed). */
ct_status ct_model_config_set(ct_model_config *c, const ct_model_option *o, const char *value);
/* The option's value as text ("4", "0.1", "true", "1024,1024") */
const char *ct_model_config_get(const ct_model_config *c, const ct_model_option *o, char *buf, size_t n);
/* `ctrain train`'s config for kind k: the library's defaults with each cli_default applied */
ct_model_config ct_model_cli_config(ct_model_kind k);

/* ---- GPT-2 in Hugging Face's layout (gpt_hf.c) ----
 * Load: a GPT2LMHeadModel / GPT2Model state_dict (F32, F16, BF16 or F64) into a GPT of the
 * same shape; Conv1D weights are transposed, "lm_head.weight" must equal wte (tied), the
 * attention buffers "attn.bias" / "attn.masked_bias" are skipped. All-or-nothing as
 * ct_model_load, the same errors. Save: `dir`/model.safetensors (every weight F32 in
 * GPT2LMHeadModel's state_dict layout, lm_head.weight included, metadata format=pt) and
 * `dir`/config.json (model_type gpt2); the directory is created. A GPT without biases is
 * CT_ERR_UNSUPPORTED (GPT-2 has them). */
ct_status ct_gpt_load_hf(ct_model *m, const char *path);
ct_status ct_gpt_save_hf(const ct_model *m, const char *dir);

/* ---- inference: a key/value cache and generation (decode.c; kinds with info.generates:
 * GPT, Llama) ----
 * A key/value cache (batch 1, the model's context of positions; a Llama keeps its
 * num_key_value_heads per layer, not repeated): ct_model_forward_cached runs only the new
 * tokens [1, t] (positions len .. len+t-1, len + t <= the context) through the model,
 * attending to the cached keys and values of the earlier ones, and appends theirs: logits
 * [1, t, vocab] in ctx, the same as the last t rows of a full forward (within float
 * rounding), at O(T) per token instead of a forward over the context. No autograd; dropout
 * follows the ctx. A Llama's rotary positions are applied at the absolute positions. */
typedef struct ct_kv_cache ct_kv_cache;
ct_status ct_model_cache_create(const ct_model *m, ct_kv_cache **out); /* CT_ERR_UNSUPPORTED: the kind does not generate; CT_ERR_NOMEM */
void ct_kv_cache_free(ct_kv_cache *c);
void ct_kv_cache_reset(ct_kv_cache *c);
int ct_kv_cache_len(const ct_kv_cache *c);
ct_tensor *ct_model_forward_cached(ct_ctx *ctx, ct_model *m, ct_kv_cache *c, ct_tensor *tokens);

/* The GPT's names for the same (CT_ERR_INVALID / abort for a model that is no GPT). */
typedef ct_kv_cache ct_gpt_cache;
ct_status ct_gpt_cache_create(const ct_model *m, ct_gpt_cache **out); /* CT_ERR_INVALID: not a GPT; CT_ERR_NOMEM */
void ct_gpt_cache_free(ct_gpt_cache *c);
void ct_gpt_cache_reset(ct_gpt_cache *c);
int ct_gpt_cache_len(const ct_gpt_cache *c);
ct_tensor *ct_gpt_forward_cached(ct_ctx *ctx, ct_model *m, ct_gpt_cache *c, ct_tensor *tokens);

typedef struct ct_generate_opts {
    int max_new_tokens;   /* 100 */
    double temperature;   /* 1.0; 0 = greedy (the first largest logit) */
    int top_k;            /* 0 = the whole vocabulary; else sample among the k largest logits */
    uint64_t seed;        /* 1337: the same seed, model and prompt give the same tokens */
    bool kv_cache;        /* true; false runs a full forward over the context for every token */
    /* called after each new token; return false to stop early (NULL: none) */
    bool (*on_token)(int32_t token, void *user);
    void *user;
} ct_generate_opts;
ct_generate_opts ct_generate_default_opts(void);

typedef struct ct_generate_stats {
    int64_t new_tokens;   /* tokens generated */
    double seconds;       /* wall time for them, the prompt's forward included */
} ct_generate_stats;

/* Autoregressive generation from prompt[0, n_prompt) (n_prompt >= 1, every id < the
 * vocabulary): max_new_tokens tokens into out (room for that many). Past the context
 * (GPT: block_size, Llama: max_position_embeddings) the context is the last that many
 * tokens at positions 0 .. (nanoGPT's crop); each token then costs a forward over that
 * window, cache or not. CT_ERR_INVALID for a model of a kind that does not generate, an
 * empty prompt, an id outside the vocabulary or a bad option; CT_ERR_NOMEM. */
ct_status ct_model_generate(ct_model *m, const int32_t *prompt, int n_prompt, const ct_generate_opts *opts, int32_t *out,
                            ct_generate_stats *stats);
/* the same for a GPT only (CT_ERR_INVALID for another kind) */
ct_status ct_gpt_generate(ct_model *m, const int32_t *prompt, int n_prompt, const ct_generate_opts *opts, int32_t *out,
                          ct_generate_stats *stats);

/* ---- dynamic int8 quantization for inference (src/models/model_quant.c; nn.h) ----
 *
 *   ct_model_quantize_dynamic(m, NULL);                       // every Linear → int8 (GPT: lm_head too)
 *   ct_model_save_quantized(m, "model.int8.safetensors");
 *   ...
 *   ct_model *q;                                              // same config as the saved model
 *   ct_model_create(&cfg, 0, &q);
 *   if (ct_model_load_quantized(q, "model.int8.safetensors") != CT_OK) puts(ct_last_error());
 *   ct_tensor *logits = ct_model_forward(ctx, q, x);          // int8 Linears, f32 elsewhere
 *
 * File layout (safetensors): per quantized Linear NAME, "NAME.weight" I8 [out, in],
 * "NAME.weight_scale" F32 [1] (per tensor) or [out] (per channel), "NAME.weight_zero_point"
 * I64 of the same shape (zeros: symmetric), "NAME.bias" F32 [out]; every other parameter
 * F32 under its state_dict name (GPT: wte stays f32, lm_head is quantized separately, as
 * PyTorch's quantize_dynamic does). Metadata: quantization=dynamic, dtype=qint8,
 * qscheme=per_tensor_symmetric|per_channel_symmetric, activation=quint8_reduce_range,
 * model=mlp|cnn|gpt. */
/* Converts the model's Linears in place (ct_quantize_dynamic); opts NULL = defaults.
 * CT_ERR_INVALID when already quantized, CT_ERR_NOMEM. Training a quantized model is not
 * supported (no backward through int8 Linears). */
ct_status ct_model_quantize_dynamic(ct_model *m, const ct_quantize_opts *opts);
bool ct_model_is_quantized(const ct_model *m);
/* Bytes of the weights as stored: f32 parameters (PyTorch's count: tied once) or, when
 * quantized, int8 Linear weights + their scales and zero points + f32 biases + the rest. */
size_t ct_model_weight_bytes(const ct_model *m);
/* Atomic like ct_model_save. CT_ERR_INVALID when the model is not quantized. */
ct_status ct_model_save_quantized(const ct_model *m, const char *path);
/* Loads a file written by ct_model_save_quantized into m (created with the same config;
 * quantized here first if it is not, per tensor or per channel as the file says). Strict and
 * all-or-nothing like ct_model_load: a missing, extra, mis-shaped or mistyped tensor, a
 * file that is not a dynamically quantized model, or non-zero weight zero points are
 * CT_ERR_FORMAT naming the tensor and the file; no weight is taken from the file then (a
 * conversion of m done by this call stays: m is quantized with its own weights). */
ct_status ct_model_load_quantized(ct_model *m, const char *path);

#ifdef __cplusplus
}
#endif
#endif
