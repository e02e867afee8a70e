// mt_metal_optim.metal -- one tensor's SGD or Adam/AdamW step (contract: native/contracts/optim.md):
// every element by mt_pinned.h's mt_adam_elem / mt_sgd_elem on the thread's own copies of the
// element's parameter and state, with the tensor's host scalars (mt_metal_optim.c). The gradient
// is g * coef (coef 1 when not clipping: an exact identity), written back when p.scale.
#include "mt_metal_kernel.h"

kernel void mt_k_adam(device float *param [[buffer(0)]], device float *grad [[buffer(1)]],
                      device float *m [[buffer(2)]], device float *v [[buffer(3)]], device float *w [[buffer(4)]],
                      constant mt_mtl_adam_params &p [[buffer(5)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const mt_adam_scalars s = p.s;
    for (int64_t k = i; k < p.n; k += stride) {
        float g = grad[k] * p.coef;
        if (p.scale) grad[k] = g;
        float pk = param[k], mk = m[k], vk = v[k], wk = s.amsgrad ? w[k] : 0.0f;
        mt_adam_elem(&pk, &mk, &vk, &wk, g, &s, s.coupled, s.amsgrad);
        param[k] = pk;
        m[k] = mk;
        v[k] = vk;
        if (s.amsgrad) w[k] = wk;
    }
}

kernel void mt_k_sgd(device float *param [[buffer(0)]], device float *grad [[buffer(1)]],
                     device float *buf [[buffer(2)]], constant mt_mtl_sgd_params &p [[buffer(3)]],
                     MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const mt_sgd_scalars s = p.s;
    for (int64_t k = i; k < p.n; k += stride) {
        float g = grad[k] * p.coef;
        if (p.scale) grad[k] = g;
        float pk = param[k], bk = p.has_buf && p.initialized ? buf[k] : 0.0f;
        mt_sgd_elem(&pk, &bk, g, &s, s.coupled, p.has_buf, p.initialized);
        param[k] = pk;
        if (p.has_buf) buf[k] = bk;
    }
}
