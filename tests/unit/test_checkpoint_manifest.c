/* Checkpoint manifests with values no writer produces: each is a format error, never
 * undefined behaviour (before, a CRC-32 of -3656149109 was converted straight to uint32_t,
 * which UBSan reports; `make test-asan` runs this under it). fuzz/fuzz_checkpoint.c
 * explores the same reader with arbitrary input. */
#include <sys/stat.h>

#include "ct_test.h"
#include "ctrain/ctrain.h"

static ct_status verify_with(const char *name, const char *bytes, const char *crc) {
    char dir[300], p[400], man[512];
    snprintf(dir, sizeof dir, "%s", ct_test_tmp_path(name));
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ct_test_write_file(p, "", 0);
    snprintf(p, sizeof p, "%s/train_state.safetensors", dir);
    ct_test_write_file(p, "", 0);
    int n = snprintf(man, sizeof man,
                     "{\"files\": {\"model.safetensors\": {\"bytes\": %s, \"crc32\": %s},"
                     " \"train_state.safetensors\": {\"bytes\": 0, \"crc32\": 0}}}",
                     bytes, crc);
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    ct_test_write_file(p, man, (size_t)n);
    return ct_checkpoint_verify(dir);
}

CT_TEST(empty_files_with_their_real_sizes_and_crcs_verify) {
    /* CRC-32 of nothing is 0: the baseline that the cases below differ from in one field */
    CT_EXPECT_OK(verify_with("good", "0", "0"));
}

CT_TEST(out_of_range_sizes_and_checksums_are_format_errors) {
    static const char *crcs[] = {"-3656149109", "-1", "4294967296", "1e300", "-1e300", "0.5e10"};
    for (size_t i = 0; i < sizeof crcs / sizeof crcs[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "crc%zu", i);
        CT_EXPECTF(verify_with(name, "0", crcs[i]) == CT_ERR_FORMAT, "crc32 %s: %s", crcs[i], ct_last_error());
    }
    static const char *sizes[] = {"-1", "1e300", "-9.3e18", "9.3e18"};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "size%zu", i);
        CT_EXPECTF(verify_with(name, sizes[i], "0") == CT_ERR_FORMAT, "bytes %s: %s", sizes[i], ct_last_error());
    }
}

CT_TEST_MAIN()
