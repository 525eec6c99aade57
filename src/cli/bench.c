/* placeholder until the bench subcommand lands */
#include <stdio.h>
#include "cli/cli.h"
int cli_bench(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "ctrain bench: unavailable in this build\n"); return 2; }
