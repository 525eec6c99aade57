/* ctrain env: what this build and machine can do (the tutorial's §2.1 check). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ctrain/core.h"

int cli_env(int argc, char **argv) {
    (void)argc; (void)argv;
    printf("ctrain %s\n", CT_VERSION_STRING);
    printf("cores: %ld\n", sysconf(_SC_NPROCESSORS_ONLN));
    return 0;
}
