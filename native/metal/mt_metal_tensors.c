/* mt_metal_tensors.c -- zero_grad's fill on Metal: each tensor of the list that holds elements
 * cleared by one launch (mt_metal_tensors.metal), in place in device memory or through a
 * staged twin for a host tensor. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_host.h"
#include "mt_optim_groups.h"

int mt_fill_zero(float *const *tensors, const int32_t *offsets, int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_group_registry(tensors, offsets, n_tensors, "tensors"))) return rc;
    if ((rc = mt_mtl_open())) return rc;
    for (int32_t j = 0; j < n_tensors && rc == MT_OK; ++j) {
        int64_t n = (int64_t)offsets[j + 1] - offsets[j];
        if (n == 0) continue;
        mt_mtl_call call;
        mt_mtl_begin(&call);
        mt_mtl_arg args[2];
        mt_mtl_count_params p = {n};
        mt_mtl_bytes(&args[1], &p, sizeof p);
        if (!(rc = mt_mtl_stage(&call, &args[0], tensors[j], n * 4, MT_MTL_OUT, NULL)))
            rc = mt_mtl_launch("mt_k_fill_zero", args, 2, n);
        mt_mtl_end(&call, rc == MT_OK);
    }
    return rc;
}
