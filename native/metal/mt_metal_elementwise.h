/* mt_metal_elementwise.h -- the finiteness pre-pass the Metal maps and dropout share. */
#ifndef MT_METAL_ELEMENTWISE_H
#define MT_METAL_ELEMENTWISE_H
#include "mt_metal_host.h"

/* bad[0] <- a holds NaN/inf, bad[1] <- b does (b NULL: not read), over n elements; *words is
 * bound to the words (a scratch of the call) for kernels that check them. */
int mt_mtl_prepass(mt_mtl_call *call, const mt_mtl_arg *a, const mt_mtl_arg *b, int64_t n, mt_mtl_arg *words,
                   int bad[2]);
#endif
