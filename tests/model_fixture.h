/* The model configuration a torch fixture was made with (the scripts in tests/torch store it as an
 * i64 tensor "config"), shared by the model tests against PyTorch. Include after ct_test.h,
 * ctrain/models.h and ctrain/io.h. */
#ifndef CT_MODEL_FIXTURE_H
#define CT_MODEL_FIXTURE_H
static inline ct_model_config config_from_fixture(ct_model_kind kind, ct_st_file *f) {
    ct_st_tensor t;
    CT_CHECK(ct_st_get(f, "config", &t) == CT_OK && t.dtype == CT_I64, "fixture config");
    const int64_t *v = t.data;
    ct_model_config c = ct_model_default_config(kind);
    if (kind == CT_MODEL_MLP) {
        c.mlp.in = (int)v[0]; c.mlp.out = (int)v[1]; c.mlp.n_hidden = (int)v[2];
        for (int i = 0; i < c.mlp.n_hidden; i++) c.mlp.hidden[i] = (int)v[3 + i];
    } else if (kind == CT_MODEL_CNN) {
        c.cnn.in_channels = (int)v[0]; c.cnn.height = (int)v[1]; c.cnn.width = (int)v[2]; c.cnn.c1 = (int)v[3];
        c.cnn.c2 = (int)v[4]; c.cnn.kernel = (int)v[5]; c.cnn.fc = (int)v[6]; c.cnn.classes = (int)v[7];
    } else {
        c.gpt.n_layer = (int)v[0]; c.gpt.n_embd = (int)v[1]; c.gpt.n_head = (int)v[2];
        c.gpt.block_size = (int)v[3]; c.gpt.vocab_size = (int)v[4];
    }
    return c;
}
#endif
