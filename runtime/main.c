/* main.c: the entry point of a built program, which defines ddp_program_desc. */
#include "runtime.h"

int main(int argc, char **argv) {
    return ddp_main(&ddp_program_desc, argc, argv);
}
