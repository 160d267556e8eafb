// cli/main.cpp - the spmdcheck executable.
#include "cli/driver.h"

int main(int argc, char** argv) { return spmd::cli_main(argc, argv); }
