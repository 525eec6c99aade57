/* placeholder until the train subcommand lands */
#include <stdio.h>
#include "cli/cli.h"
int cli_train(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "ctrain train: unavailable in this build\n"); return 2; }
