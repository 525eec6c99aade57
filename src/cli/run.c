/* placeholder until the run subcommand lands */
#include <stdio.h>
#include "cli/cli.h"
int cli_run(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "ctrain run: unavailable in this build\n"); return 2; }
