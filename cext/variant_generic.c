/* The portable build of every kernel (baseline ISA of the target; plain C). */
#define EX_TABLE ex_kernels_generic
#include "variant_body.h"
