/* attn_gpu_emulate.cc -- the attention GPU kernels (native/cuda/mt_gpu_attention_kernels.cuh)
 * compiled as C++ over the threaded CPU emulation of attn_gpu_emulate.h, run on a spread of cases
 * and compared byte for byte with the CPU oracle (native/build/libmojo_train_cpu_identical.so,
 * dlopened). tests/test_attention_emulated.py builds and runs it:
 *   g++ -std=c++20 -O1 -ffp-contract=off -Inative/include -Inative/common -Inative/cuda -Itests/c \
 *       tests/c/attn_gpu_emulate.cc -o attn_emu -ldl -lpthread
 *   ./attn_emu native/build/libmojo_train_cpu_identical.so [substring of case names] [-v]
 *   ./attn_emu --self-test     (the emulator's own checks: barriers, shuffles, votes, and the
 *                               errors it must report: a return before a barrier, a deadlock)
 * Each case runs the forward (out, lse) and then the backward (dq, dk, dv) from the oracle's own
 * forward outputs and a random dout, the same inputs on both sides. Per case it prints `ok NAME`,
 * or `MISMATCH NAME ...` with the first differing element of each differing tensor (index, both
 * values as hex and float, how many elements differ), or `ERROR NAME ...` (a refused call or an
 * emulator error). Exit status 1 if any case is not ok, 2 on a usage or setup error.
 *
 * The emulated side gets "device" buffers whose end abuts an inaccessible page (start 256-byte
 * aligned, as cudaMalloc's; the < 256 bytes between the end and the page hold 0xFF bytes that
 * are checked afterwards), outputs filled with 0xFF (NaN) bytes so an unwritten element shows,
 * and its inputs are checked unchanged after each call.
 */
#include "attn_gpu_emulate.h"
#include "mt_gpu_attention_kernels.cuh"
#include "mojo_train.h"

#include <dlfcn.h>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

typedef decltype(&mt_attention_forward) forward_fn;      /* mojo_train.h's signatures */
typedef decltype(&mt_attention_backward) backward_fn;
typedef decltype(&mt_last_error) error_fn;

struct Oracle {
    forward_fn forward;
    backward_fn backward;
    error_fn last_error;
};

/* ---- guarded "device" buffers --------------------------------------------------------------- */

/* bytes at a 256-byte aligned start whose end lies within 256 bytes of an inaccessible page; the
 * slack is 0xFF bytes, checked by intact(). tight: the end abuts the page itself (no slack), so a
 * read one byte past the end faults (the masks: a load the kernel should not make). */
class Guarded {
  public:
    explicit Guarded(size_t bytes, bool tight = false) : bytes_(bytes) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        size_t span = tight ? bytes : (bytes + 255) / 256 * 256;
        map_bytes_ = (span + page - 1) / page * page + page;
        void *p = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            perror("mmap");
            exit(2);
        }
        map_ = (unsigned char *)p;
        mprotect(map_ + map_bytes_ - page, page, PROT_NONE);
        data_ = map_ + map_bytes_ - page - span;
        memset(data_, 0xff, span);
        slack_ = span - bytes;
    }
    ~Guarded() { munmap(map_, map_bytes_); }
    Guarded(const Guarded &) = delete;
    Guarded &operator=(const Guarded &) = delete;
    float *f() { return (float *)data_; }
    unsigned char *bytes() { return data_; }
    const unsigned char *bytes() const { return data_; }
    size_t size() const { return bytes_; }
    bool intact() const {
        for (size_t i = 0; i < slack_; ++i)
            if (data_[bytes_ + i] != 0xff) return false;
        return true;
    }

  private:
    unsigned char *map_, *data_;
    size_t map_bytes_, bytes_, slack_;
};

/* ---- cases ---------------------------------------------------------------------------------- */

enum Layout { FULL, BCAST_QK, BCAST_HEAD, KEYPAD, TRANSPOSED };
enum Pattern {
    RANDOM,     /* about 30% (bool) or 15% (float: -inf) of pairs masked, some rows wholly */
    BAND,       /* row i keeps keys j with |j - i| <= 20: whole key blocks dead for a row, live later */
    NO_MASKED,  /* bool all true, float finite: tiles without a masked pair, with a mask */
    BYTES,      /* bool: the kept pairs' bytes only 1 or 255, about 40% of pairs masked */
};
enum Special {
    PLAIN,      /* q, k uniform in [-amp, amp] */
    OVERFLOW,   /* q in [1e20, 2e20], every third key in [-2e20, -1e20]: those scores overflow to -inf
                   (masked by overflow), the others are small */
    SCORES_NAN, /* q, k in [-1e20, 1e20]: scores +-inf and NaN, the forward's out NaN (forward only) */
    MADE_UP,    /* the backward's saved out and lse made up (lse in [-40, -20], row 3 -inf): p overflows, ds and the
                   chains reach +-inf and NaN */
};
enum { NO_DQ = 1, NO_DK = 2, NO_DV = 4, NO_LSE = 8 };

struct Case {
    int64_t B = 2, H = 2, Hkv = 2, Tq, Tk, D;
    int is_causal = 0, kind = 0;
    Layout layout = FULL;
    Pattern pattern = RANDOM;
    float scale_ = NAN;     /* NAN: the default 1/sqrt(D) */
    float amp_ = 1.0f;      /* q and k are uniform in [-amp, amp] */
    Special special_ = PLAIN;
    int nulls_ = 0;
    float drop_ = 0.0f;     /* dropout_p (attention.md, "Dropout"), from stream 5 of seed 11 at offset_ */
    uint64_t offset_ = 0;
    Case(int64_t tq, int64_t tk, int64_t d) : Tq(tq), Tk(tk), D(d) {}
    Case &causal() { is_causal = 1; return *this; }
    Case &mask(int k, Layout l, Pattern p = RANDOM) { kind = k, layout = l, pattern = p; return *this; }
    Case &scale(float x) { scale_ = x; return *this; }
    Case &amp(float x) { amp_ = x; return *this; }
    Case &heads(int64_t b, int64_t h, int64_t hkv) { B = b, H = h, Hkv = hkv; return *this; }
    Case &hkv(int64_t hkv) { Hkv = hkv; return *this; }
    Case &special(Special x) { special_ = x; return *this; }
    Case &nulls(int n) { nulls_ = n; return *this; }
    Case &dropout(float p, uint64_t offset = 0) { drop_ = p, offset_ = offset; return *this; }
};

const uint64_t DROP_SEED = 11, DROP_STREAM = 5;

const char *kind_name(int kind) { return kind == 0 ? "none" : kind == 1 ? "bool" : "float"; }

std::string name_of(const Case &c) {
    static const char *layouts[] = {"full", "bcast_qk", "bcast_head", "keypad", "transposed"};
    static const char *patterns[] = {"", "-band", "-nomasked", "-bytes"};
    static const char *specials[] = {"", "_overflow", "_scores_nan", "_madeup_saved"};
    char buf[340], sc[32] = "default", am[64] = "";
    if (!std::isnan(c.scale_)) snprintf(sc, sizeof sc, "%g", c.scale_);
    if (c.amp_ != 1.0f) snprintf(am, sizeof am, "_amp%g", c.amp_);
    if (c.drop_ > 0.0f)
        snprintf(am + strlen(am), sizeof am - strlen(am), "_dropout%g_offset%llu", c.drop_,
                 (unsigned long long)c.offset_);
    snprintf(buf, sizeof buf, "B%lld_H%lld_Hkv%lld_Tq%lld_Tk%lld_D%lld%s_mask-%s%s%s%s_scale-%s%s%s%s%s%s%s",
             (long long)c.B, (long long)c.H, (long long)c.Hkv, (long long)c.Tq, (long long)c.Tk, (long long)c.D,
             c.is_causal ? "_causal" : "", kind_name(c.kind), c.kind ? "-" : "", c.kind ? layouts[c.layout] : "",
             c.kind ? patterns[c.pattern] : "", sc, am, specials[c.special_], c.nulls_ & NO_LSE ? "_nolse" : "",
             c.nulls_ & NO_DQ ? "_nodq" : "", c.nulls_ & NO_DK ? "_nodk" : "", c.nulls_ & NO_DV ? "_nodv" : "");
    return buf;
}

/* The cases: sizes around the tile (64) and the head dimension's range, masks of every kind,
 * layout and pattern, scales, large and overflowing logits, empty sizes, outputs not asked for,
 * grouped-query heads. */
std::vector<Case> cases() {
    typedef Case C;
    return {
        /* no mask */
        C(5, 5, 1), C(1, 1, 7), C(5, 64, 7).causal(), C(64, 64, 33), C(65, 65, 33).causal(), C(130, 130, 64),
        C(130, 130, 64).causal(), C(65, 130, 100).hkv(1), C(130, 65, 128).causal().hkv(1), C(64, 130, 128),
        C(5, 130, 64).causal(), C(130, 5, 64).causal(), C(130, 130, 127).causal(),
        /* tiles of 2 * TR query rows (the forward's MT_ATTN_FWD_ROWS=8): under causality key blocks
         * wholly before the tile (the tile from row 128 takes key blocks 0 and 1 plain), Tq < Tk;
         * dropout in a plain tile; a float mask over a whole tile; NaN scores under causality */
        C(260, 260, 64).causal(), C(200, 260, 64).causal(), C(130, 130, 64).dropout(0.3f, 5),
        C(128, 64, 64).mask(2, TRANSPOSED), C(130, 130, 7).causal().special(SCORES_NAN),
        /* bool masks (nonzero keeps) */
        C(130, 130, 1).mask(1, FULL), C(65, 64, 7).mask(1, BCAST_QK), C(64, 65, 33).mask(1, KEYPAD).hkv(1),
        C(130, 130, 64).mask(1, FULL).hkv(1), C(5, 130, 100).mask(1, TRANSPOSED), C(130, 130, 128).mask(1, BCAST_HEAD),
        C(130, 130, 65).mask(1, FULL, BAND), C(130, 130, 64).mask(1, BCAST_QK, NO_MASKED),
        /* float masks (-inf masks) */
        C(65, 130, 1).mask(2, FULL), C(130, 65, 7).mask(2, BCAST_QK), C(130, 130, 33).mask(2, KEYPAD),
        C(64, 64, 64).mask(2, FULL).hkv(1), C(65, 65, 100).mask(2, TRANSPOSED), C(130, 130, 128).mask(2, BCAST_QK),
        C(130, 130, 33).mask(2, BCAST_QK, BAND), C(130, 65, 100).mask(2, FULL, NO_MASKED),
        /* bool bytes of 1 and 255 only, short tiles on either side (the mask's last byte ends at
         * an inaccessible page: a load past it faults) */
        C(63, 1, 7).mask(1, FULL, BYTES), C(65, 127, 7).mask(1, FULL, BYTES), C(127, 65, 33).mask(1, TRANSPOSED, BYTES),
        C(1, 65, 7).mask(1, KEYPAD, BYTES),
        /* other scales: negative, zero */
        C(130, 130, 64).scale(-0.3f), C(65, 130, 7).causal().scale(-0.3f), C(65, 65, 33).mask(2, FULL).scale(-0.3f),
        C(64, 65, 64).scale(0.0f),
        /* large logits (exps underflow), overflow, NaN scores, a made-up saved forward */
        C(130, 130, 64).amp(30), C(130, 130, 128).causal().amp(30), C(65, 65, 1).mask(1, FULL).amp(30),
        C(65, 130, 33).mask(2, KEYPAD).amp(30), C(64, 64, 128).amp(100), C(65, 130, 64).special(OVERFLOW),
        C(5, 1, 7).special(OVERFLOW), C(5, 65, 7).special(SCORES_NAN), C(5, 5, 7).scale(0.0f).special(SCORES_NAN),
        C(65, 130, 64).amp(8).special(MADE_UP), C(64, 64, 7).mask(1, FULL).special(MADE_UP),
        /* empty sizes */
        C(0, 64, 64), C(0, 5, 7).scale(-0.3f), C(65, 0, 33), C(5, 0, 1).scale(-0.3f), C(5, 5, 7).heads(0, 2, 2),
        /* outputs not asked for; grouped-query heads; one row and one key */
        C(130, 130, 64).causal().nulls(NO_DQ), C(65, 130, 33).mask(1, FULL).hkv(1).nulls(NO_DK | NO_DV),
        C(130, 64, 100).mask(2, BCAST_HEAD).nulls(NO_DQ | NO_DK), C(64, 65, 64).nulls(NO_LSE),
        C(130, 65, 64).causal().heads(2, 4, 2), C(65, 130, 100).mask(1, KEYPAD).heads(1, 4, 1),
        C(1, 1, 128).mask(2, BCAST_QK).heads(1, 1, 1),
        /* dropout: causal, masks, GQA, both column groups, an offset off the Philox block's start */
        C(130, 130, 64).causal().dropout(0.25f), C(65, 130, 33).mask(1, FULL).dropout(0.5f, 3),
        C(130, 65, 100).mask(2, KEYPAD).hkv(1).dropout(0.1f, 1 << 20), C(64, 64, 128).heads(1, 4, 2).dropout(0.75f, 7),
        C(5, 130, 7).amp(30).dropout(0.3f), C(65, 65, 33).causal().nulls(NO_DQ).dropout(0.2f, 2),
    };
}

/* ---- inputs --------------------------------------------------------------------------------- */

struct Inputs {
    std::unique_ptr<Guarded> q, k, v, dout, mask;
    int64_t sb = 0, sh = 0, si = 0, sj = 0;
};

void fill_uniform(float *x, int64_t n, float amp, std::mt19937 &rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) x[i] = u(rng) * amp;
}

/* The mask of case c: its strides, and its elements (NULL for kind none). Some rows are wholly
 * masked (every key false / -inf) where the layout has rows of their own. */
void make_mask(Inputs &in, const Case &c, std::mt19937 &rng) {
    if (!c.kind) return;
    int64_t B = c.B, H = c.H, Tq = c.Tq, Tk = c.Tk, nb = B, nh = H, ni = Tq, nj = Tk;
    switch (c.layout) {
    case FULL: in.sb = H * Tq * Tk, in.sh = Tq * Tk, in.si = Tk, in.sj = 1; break;
    case BCAST_QK: nb = nh = 1, in.sb = in.sh = 0, in.si = Tk, in.sj = 1; break;
    case BCAST_HEAD: nb = 1, in.sb = 0, in.sh = Tq * Tk, in.si = Tk, in.sj = 1; break;
    case KEYPAD: nh = ni = 1, in.sb = Tk, in.sh = in.si = 0, in.sj = 1; break;
    case TRANSPOSED: in.sb = H * Tq * Tk, in.sh = Tq * Tk, in.si = 1, in.sj = Tq; break;   /* (B, H, Tk, Tq) memory */
    }
    int64_t n = nb * nh * ni * nj, esize = c.kind == 1 ? 1 : 4;
    in.mask = std::make_unique<Guarded>((size_t)(n * esize), true);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t b = 0; b < nb; ++b)
        for (int64_t h = 0; h < nh; ++h)
            for (int64_t i = 0; i < ni; ++i) {
                /* the second row of each (b, h), and every row of the last batch of a key-padding
                 * mask (when there are two batches), masked wholly */
                bool dead = (c.pattern == RANDOM || c.pattern == BYTES) &&
                            (c.layout == KEYPAD ? b == nb - 1 && nb > 1 : i == 1 % ni && ni > 1);
                for (int64_t j = 0; j < nj; ++j) {
                    int64_t at = b * in.sb + h * in.sh + i * in.si + j * in.sj;
                    float r = u(rng);
                    if (c.pattern == NO_MASKED) r = 1.0f;
                    if (c.pattern == BAND) r = (j - i > 20 || i - j > 20) ? 0.0f : 1.0f;
                    if (c.kind == 1) {
                        static const unsigned char keep[] = {1, 2, 255, 7};
                        const unsigned char kv = c.pattern == BYTES ? (((i * 7 + j * 3) & 1) ? 255 : 1) : keep[j % 4];
                        in.mask->bytes()[at] = dead || r < (c.pattern == BYTES ? 0.4f : 0.3f) ? 0 : kv;
                    } else {
                        in.mask->f()[at] = dead || r < 0.15f ? -INFINITY : (u(rng) * 6.0f - 3.0f);
                    }
                }
            }
}

Inputs make_inputs(const Case &c, unsigned seed) {
    std::mt19937 rng(seed);
    Inputs in;
    int64_t nq = c.B * c.H * c.Tq * c.D, nkv = c.B * c.Hkv * c.Tk * c.D;
    in.q = std::make_unique<Guarded>((size_t)nq * 4);
    in.k = std::make_unique<Guarded>((size_t)nkv * 4);
    in.v = std::make_unique<Guarded>((size_t)nkv * 4);
    in.dout = std::make_unique<Guarded>((size_t)nq * 4);
    fill_uniform(in.q->f(), nq, c.amp_, rng);
    fill_uniform(in.k->f(), nkv, c.amp_, rng);
    fill_uniform(in.v->f(), nkv, 1.0f, rng);
    fill_uniform(in.dout->f(), nq, 1.0f, rng);
    if (c.special_ == OVERFLOW) {
        std::uniform_real_distribution<float> u(1.0f, 2.0f);
        for (int64_t e = 0; e < nq; ++e) in.q->f()[e] = u(rng) * 1e20f;
        for (int64_t e = 0; e < nkv; ++e)
            in.k->f()[e] = (e / c.D) % c.Tk % 3 == 0 ? -u(rng) * 1e20f : in.k->f()[e] * 1e-20f;
    } else if (c.special_ == SCORES_NAN) {
        for (int64_t e = 0; e < nq; ++e) in.q->f()[e] *= 1e20f;
        for (int64_t e = 0; e < nkv; ++e) in.k->f()[e] *= 1e20f;
    }
    make_mask(in, c, rng);
    return in;
}

/* ---- comparison ----------------------------------------------------------------------------- */

uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* The index of element e of a (n0, n1, n2, n3) tensor, as text. */
std::string index_text(int64_t e, const std::vector<int64_t> &shape) {
    std::vector<int64_t> idx(shape.size());
    for (size_t d = shape.size(); d-- > 0;) idx[d] = shape[d] ? e % shape[d] : 0, e = shape[d] ? e / shape[d] : 0;
    std::string s = "[";
    for (size_t d = 0; d < idx.size(); ++d) s += (d ? "," : "") + std::to_string(idx[d]);
    return s + "]";
}

/* What -v prints under each case: the oracle's special values per tensor (which paths ran). */
std::string census_notes;

void census(const char *name, const float *x, int64_t n) {
    int64_t nan = 0, pinf = 0, ninf = 0, pzero = 0, nzero = 0, sub = 0;
    for (int64_t e = 0; e < n; ++e) {
        uint32_t u = bits_of(x[e]);
        nan += x[e] != x[e], pinf += u == 0x7f800000u, ninf += u == 0xff800000u, pzero += u == 0u;
        nzero += u == 0x80000000u, sub += std::fpclassify(x[e]) == FP_SUBNORMAL;
    }
    char buf[200];
    snprintf(buf, sizeof buf, "\n    oracle %s: %lld elements, NaN %lld, +inf %lld, -inf %lld, +0 %lld, -0 %lld, subnormal %lld",
             name, (long long)n, (long long)nan, (long long)pinf, (long long)ninf, (long long)pzero, (long long)nzero,
             (long long)sub);
    census_notes += buf;
}

/* Appends to report the differences of one tensor (verbose: up to 8 elements, and the census).
 * Returns whether equal. */
bool compare(const char *name, const float *got, const float *want, const std::vector<int64_t> &shape,
             std::string &report, bool verbose) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    int64_t differ = 0, first = -1;
    std::string lines;
    if (verbose) census(name, want, n);
    for (int64_t e = 0; e < n; ++e) {
        if (bits_of(got[e]) == bits_of(want[e])) continue;
        if (!differ) first = e;
        if (verbose && differ < 8) {
            char buf[200];
            snprintf(buf, sizeof buf, "\n      %s%s emulated 0x%08x (%.9g) oracle 0x%08x (%.9g)", name,
                     index_text(e, shape).c_str(), bits_of(got[e]), got[e], bits_of(want[e]), want[e]);
            lines += buf;
        }
        ++differ;
    }
    if (!differ) return true;
    char buf[300];
    snprintf(buf, sizeof buf, "\n    %s%s: emulated 0x%08x (%.9g), oracle 0x%08x (%.9g); %lld of %lld elements differ",
             name, index_text(first, shape).c_str(), bits_of(got[first]), got[first], bits_of(want[first]),
             want[first], (long long)differ, (long long)n);
    report += buf + lines;
    return false;
}

mt_attn_args args_of(const Case &c, const Inputs &in, float scale) {
    mt_attn_args a;
    memset(&a, 0, sizeof a);
    a.q = in.q->f(), a.k = in.k->f(), a.v = in.v->f(), a.dout = in.dout->f();
    a.mask = in.mask ? (const void *)in.mask->bytes() : nullptr;
    a.mask_kind = c.kind, a.is_causal = c.is_causal;
    a.sb = in.sb, a.sh = in.sh, a.si = in.si, a.sj = in.sj;
    a.scale = scale;
    a.B = c.B, a.H = c.H, a.Hkv = c.Hkv, a.Tq = c.Tq, a.Tk = c.Tk, a.D = c.D;
    a.dropout_p = c.drop_, a.dropout_scale = c.drop_ > 0.0f ? mt_dropout_scale(c.drop_) : 1.0f;
    a.seed = DROP_SEED, a.stream = DROP_STREAM, a.offset = c.offset_;
    return a;
}

/* The emulated kernels on d; "" or the error. */
std::string run_emulated(mt_attn_dev &d, int backward) {
    try {
        int rc = mt_attn_enqueue(d, backward, [](auto kernel, unsigned grid, unsigned threads, size_t smem,
                                                 const mt_attn_dev &dd) {
            emu_launch(grid, threads, smem, kernel, dd);
            return 0;
        });
        if (rc) return "mt_attn_enqueue returned " + std::to_string(rc);
    } catch (const std::exception &e) {
        return std::string("emulator: ") + e.what();
    }
    return "";
}

/* Copies of the inputs, to check the emulated kernels leave them alone. */
struct Snapshot {
    std::vector<std::pair<const Guarded *, std::vector<unsigned char>>> held;
    void take(const Guarded *g) {
        if (g) held.emplace_back(g, std::vector<unsigned char>(g->bytes(), g->bytes() + g->size()));
    }
    bool unchanged() const {
        for (auto &h : held)
            if (!h.first->intact() || memcmp(h.first->bytes(), h.second.data(), h.second.size())) return false;
        return true;
    }
};

/* The flags the kernels must leave at zero (the host's check kernels own them). */
bool flags_clear(const Guarded &flags, const char *pass, std::string &report) {
    bool clear = true;
    for (int f = 0; f < MT_ATTN_FLAGS; ++f) {
        int32_t v;
        memcpy(&v, flags.bytes() + 4 * f, 4);
        if (v) report += std::string("\n    ") + pass + " flags[" + std::to_string(f) + "] = " + std::to_string(v);
        clear &= !v;
    }
    return clear;
}

struct Sizes {
    int64_t nq, nkv, rows;
    std::vector<int64_t> qshape, kvshape, rshape;
    explicit Sizes(const Case &c)
        : nq(c.B * c.H * c.Tq * c.D), nkv(c.B * c.Hkv * c.Tk * c.D), rows(c.B * c.H * c.Tq),
          qshape{c.B, c.H, c.Tq, c.D}, kvshape{c.B, c.Hkv, c.Tk, c.D}, rshape{c.B, c.H, c.Tq} {}
};

/* The forward on both sides: the oracle's out and lse into out_o, lse_o (lse always); the
 * emulated ones compared. Returns "" or an ERROR text; *ok and report take the comparison. */
std::string check_forward(const Oracle &O, const Case &c, const Inputs &in, float scale, bool verbose,
                          std::vector<float> &out_o, std::vector<float> &lse_o, bool *ok, std::string &report) {
    const Sizes z(c);
    const bool want_lse = !(c.nulls_ & NO_LSE);
    mt_attn_args a = args_of(c, in, scale);
    out_o.assign((size_t)z.nq + 1, 0.0f), lse_o.assign((size_t)z.rows + 1, 0.0f);
    if (O.forward(out_o.data(), lse_o.data(), a.q, a.k, a.v, a.mask, c.kind, a.sb, a.sh, a.si, a.sj, c.is_causal,
                  scale, c.B, c.H, c.Hkv, c.Tq, c.Tk, c.D, c.drop_, DROP_SEED, DROP_STREAM, c.offset_))
        return std::string("ERROR oracle forward refused: ") + O.last_error();
    Guarded out_e((size_t)z.nq * 4), lse_e((size_t)z.rows * 4), delta((size_t)z.rows * 4), flags(MT_ATTN_FLAGS * 4);
    memset(flags.bytes(), 0, MT_ATTN_FLAGS * 4);
    a.out = out_e.f(), a.lse = want_lse ? lse_e.f() : nullptr;
    mt_attn_dev d{a, delta.f(), (int32_t *)flags.bytes()};
    std::string err = run_emulated(d, 0);
    if (!err.empty()) return "ERROR forward: " + err;
    *ok &= compare("out", out_e.f(), out_o.data(), z.qshape, report, verbose);
    if (want_lse) *ok &= compare("lse", lse_e.f(), lse_o.data(), z.rshape, report, verbose);
    *ok &= flags_clear(flags, "forward", report);
    if (!out_e.intact() || !lse_e.intact() || !delta.intact()) report += "\n    forward wrote past an output's end", *ok = false;
    return "";
}

/* The backward on both sides from the saved out_in, lse_in; the emulated dq, dk, dv compared. */
std::string check_backward(const Oracle &O, const Case &c, const Inputs &in, float scale, bool verbose,
                           const Guarded &out_in, const Guarded &lse_in, bool *ok, std::string &report) {
    const Sizes z(c);
    const bool want_dq = !(c.nulls_ & NO_DQ), want_dk = !(c.nulls_ & NO_DK), want_dv = !(c.nulls_ & NO_DV);
    mt_attn_args b = args_of(c, in, scale);
    b.out_in = (const float *)out_in.bytes(), b.lse_in = (const float *)lse_in.bytes();
    std::vector<float> dq_o((size_t)z.nq + 1), dk_o((size_t)z.nkv + 1), dv_o((size_t)z.nkv + 1);
    if (O.backward(want_dq ? dq_o.data() : nullptr, want_dk ? dk_o.data() : nullptr, want_dv ? dv_o.data() : nullptr,
                   b.dout, b.q, b.k, b.v, b.out_in, b.lse_in, b.mask, c.kind, b.sb, b.sh, b.si, b.sj, c.is_causal,
                   scale, c.B, c.H, c.Hkv, c.Tq, c.Tk, c.D, c.drop_, DROP_SEED, DROP_STREAM, c.offset_))
        return std::string("ERROR oracle backward refused: ") + O.last_error();
    /* twice: dq by the dk/dv kernel's relay (the GPU's way), then by the dq kernel (no relay words) */
    for (int relay = 1; relay >= 0; --relay) {
        const char *how = relay ? " (relay)" : " (dq kernel)";
        Guarded dq_e((size_t)z.nq * 4), dk_e((size_t)z.nkv * 4), dv_e((size_t)z.nkv * 4), delta((size_t)z.rows * 4);
        Guarded flags(MT_ATTN_FLAGS * 4), words((size_t)mt_attn_relay_words(b) * 4);
        memset(flags.bytes(), 0, MT_ATTN_FLAGS * 4);
        memset(words.bytes(), 0, (size_t)mt_attn_relay_words(b) * 4);
        b.dq = want_dq ? dq_e.f() : nullptr, b.dk = want_dk ? dk_e.f() : nullptr, b.dv = want_dv ? dv_e.f() : nullptr;
        mt_attn_dev d{b, delta.f(), (int32_t *)flags.bytes(), relay ? (int32_t *)words.bytes() : nullptr};
        std::string err = run_emulated(d, 1);
        if (!err.empty()) return std::string("ERROR backward") + how + ": " + err + (*ok ? "" : "; and the forward:" + report);
        if (want_dq) *ok &= compare(relay ? "dq (relay)" : "dq (dq kernel)", dq_e.f(), dq_o.data(), z.qshape, report, verbose);
        if (want_dk) *ok &= compare("dk", dk_e.f(), dk_o.data(), z.kvshape, report, verbose);
        if (want_dv) *ok &= compare("dv", dv_e.f(), dv_o.data(), z.kvshape, report, verbose);
        *ok &= flags_clear(flags, "backward", report);
        if (!dq_e.intact() || !dk_e.intact() || !dv_e.intact() || !delta.intact() || !words.intact())
            report += std::string("\n    backward") + how + " wrote past an output's end", *ok = false;
        if (!want_dq) break;                /* without dq the two ways are one */
    }
    return "";
}

/* One case, forward then backward. Returns "" (ok) or the report. */
std::string run_case(const Oracle &O, const Case &c, unsigned seed, bool verbose) {
    Inputs in = make_inputs(c, seed);
    const float scale = std::isnan(c.scale_) ? (float)(1.0 / std::sqrt((double)c.D)) : c.scale_;
    const Sizes z(c);
    std::string report;
    bool ok = true;
    Snapshot inputs;
    for (const Guarded *g : {in.q.get(), in.k.get(), in.v.get(), in.dout.get(), in.mask.get()}) inputs.take(g);

    std::vector<float> out_o, lse_o;
    std::string err = check_forward(O, c, in, scale, verbose, out_o, lse_o, &ok, report);
    if (!err.empty()) return err;
    if (c.special_ == SCORES_NAN) {     /* the backward refuses a NaN out: this case is the forward's */
        bool nan = false;
        for (int64_t e = 0; e < z.nq; ++e) nan |= std::isnan(out_o[e]);
        if (!nan) return "MISMATCH\n    the case meant to give NaN scores gave none (a broken case)";
        return ok ? "" : "MISMATCH" + report;
    }

    /* the saved forward: the oracle's (its lse always computed), or a made-up one */
    Guarded out_in((size_t)z.nq * 4), lse_in((size_t)z.rows * 4);
    memcpy(out_in.f(), out_o.data(), (size_t)z.nq * 4);
    memcpy(lse_in.f(), lse_o.data(), (size_t)z.rows * 4);
    if (c.special_ == MADE_UP) {
        std::mt19937 rng(seed + 77);
        fill_uniform(out_in.f(), z.nq, 1.0f, rng);
        std::uniform_real_distribution<float> u(-40.0f, -20.0f);
        for (int64_t r = 0; r < z.rows; ++r) lse_in.f()[r] = r == 3 ? -INFINITY : u(rng);
    }
    inputs.take(&out_in), inputs.take(&lse_in);
    err = check_backward(O, c, in, scale, verbose, out_in, lse_in, &ok, report);
    if (!err.empty()) return err;
    if (!inputs.unchanged()) report += "\n    an input changed (or was written past its end)", ok = false;
    return ok ? "" : "MISMATCH" + report;
}

}  // namespace

/* ---- the emulator's own checks (--self-test) ------------------------------------------------ */

namespace selftest {

/* Per block: the sum of x[block*n ..] by a shared-memory tree; every lane's sum of the lane ids
 * of its warp by an xor butterfly (int, and float maxima at width 16); __syncthreads_or votes. */
__global__ void cooperate(const float *x, float *sum, int *votes, unsigned *lanes, int n) {
    MT_ATTN_SMEM_DECL(smem);
    const unsigned t = threadIdx.x, lane = t % 32;
    smem[t] = t < (unsigned)n ? x[blockIdx.x * n + t] : 0.0f;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half >>= 1) {
        if (t < half) smem[t] = smem[t] + smem[t + half];
        __syncthreads();
    }
    if (t == 0) sum[blockIdx.x] = smem[0];
    int acc = (int)lane;
    for (int m = 16; m >= 1; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    float f = (float)lane;
    for (int m = 1; m < 16; m <<= 1) f = fmaxf(f, __shfl_xor_sync(0xffffffffu, f, m, 16));
    lanes[blockIdx.x * blockDim.x + t] = (unsigned)acc == 496u && f == (float)(lane / 16 * 16 + 15) ? 1u : 0u;
    int v = 0;
    for (int r = 0; r < 40; ++r) v |= __syncthreads_or(t == (unsigned)r + blockIdx.x) != (r + blockIdx.x < blockDim.x);
    v |= __syncthreads_or(0) != 0;
    if (t == 0) votes[blockIdx.x] = v;
}
__global__ void read_unwritten(float *out) {
    MT_ATTN_SMEM_DECL(smem);
    if (threadIdx.x == 0) out[blockIdx.x] = smem[blockIdx.x];
}
__global__ void return_before_barrier(int *out) {
    if (threadIdx.x == 5) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}
__global__ void mixed_barriers(int *) {
    if (threadIdx.x < 32) __syncthreads();
    else (void)__syncthreads_or(1);
}
__global__ void cross_wait(int *) {     /* lane 0 at a block barrier, lanes 1..31 at a shuffle */
    if (threadIdx.x == 0) {
        __syncthreads();
        return;
    }
    if (threadIdx.x < 32) (void)__shfl_xor_sync(0xffffffffu, 1, 1);
    __syncthreads();
}

int run() {
    int bad = 0;
    auto check = [&](bool good, const char *what) {
        printf("%s self-test: %s\n", good ? "ok" : "FAIL", what);
        bad += !good;
    };
    auto refused = [&](const char *what, auto launch) {
        try {
            launch();
            check(false, what);
        } catch (const emu::launch_error &e) {
            std::string w = std::string(what) + " -> " + e.what();
            check(true, w.c_str());
        }
    };
    const unsigned grid = 7, threads = 256;
    const int n = 200;
    std::vector<float> x(grid * n), sum(grid);
    std::vector<int> votes(grid), out(threads);
    std::vector<unsigned> lanes(grid * threads);
    for (size_t i = 0; i < x.size(); ++i) x[i] = (float)(i % 17);
    bool good = true;
    for (int rep = 0; rep < 5; ++rep) {
        emu_launch(grid, threads, threads * sizeof(float), cooperate, (const float *)x.data(), sum.data(), votes.data(),
                   lanes.data(), n);
        for (unsigned b = 0; b < grid; ++b) {
            float want = 0.0f;
            for (int i = 0; i < n; ++i) want += x[b * n + i];
            good &= sum[b] == want && votes[b] == 0;
            for (unsigned t = 0; t < threads; ++t) good &= lanes[b * threads + t] == 1u;
        }
    }
    check(good, "block reductions, xor butterflies (widths 32 and 16), __syncthreads_or");
    std::vector<float> junk(3, 0.0f);
    emu_launch(3, 32, 64, read_unwritten, junk.data());
    check(std::isnan(junk[0]) && std::isnan(junk[1]) && std::isnan(junk[2]), "unwritten shared memory reads NaN");
    refused("a return before a barrier", [&] { emu_launch(2, 64, 0, return_before_barrier, out.data()); });
    refused("__syncthreads meeting __syncthreads_or", [&] { emu_launch(1, 64, 0, mixed_barriers, out.data()); });
    refused("a deadlock", [&] { emu_launch(1, 64, 0, cross_wait, out.data()); });
    refused("a grid of 0 blocks", [&] { emu_launch(0, 64, 0, mixed_barriers, out.data()); });
    return bad ? 1 : 0;
}

}  // namespace selftest

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--self-test")) return selftest::run();
    if (argc < 2) {
        fprintf(stderr, "usage: %s path/to/libmojo_train_cpu_identical.so [case-name-substring] [-v]\n"
                        "       %s --self-test\n", argv[0], argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "cannot dlopen %s: %s\n", argv[1], dlerror());
        return 2;
    }
    Oracle O{(forward_fn)dlsym(lib, "mt_attention_forward"), (backward_fn)dlsym(lib, "mt_attention_backward"),
             (error_fn)dlsym(lib, "mt_last_error")};
    if (!O.forward || !O.backward || !O.last_error) {
        fprintf(stderr, "%s lacks the attention entries\n", argv[1]);
        return 2;
    }
    std::string filter;
    bool verbose = false;
    for (int i = 2; i < argc; ++i) {
        if (!strcmp(argv[i], "-v")) verbose = true;
        else filter = argv[i];
    }
    std::vector<Case> all = cases();
    int failed = 0, run = 0;
    for (size_t i = 0; i < all.size(); ++i) {
        std::string name = name_of(all[i]);
        if (!filter.empty() && name.find(filter) == std::string::npos) continue;
        emu_set_label(name);
        census_notes.clear();
        auto t0 = std::chrono::steady_clock::now();
        std::string result = run_case(O, all[i], 1000u + (unsigned)i, verbose);
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++run;
        if (result.empty()) {
            printf("ok %s (%.2f s)%s\n", name.c_str(), s, census_notes.c_str());
        } else {                            /* "STATUS detail" or "STATUS\n    detail lines" */
            size_t cut = result.find_first_of(" \n");
            printf("%s %s\n%s%s%s\n", result.substr(0, cut).c_str(), name.c_str(), result[cut] == ' ' ? "    " : "",
                   result.substr(cut + 1).c_str(), census_notes.c_str());
            ++failed;
        }
        fflush(stdout);
    }
    printf("%d of %d cases ok; largest dynamic shared memory asked for: %zu bytes\n", run - failed, run,
           emu_smem_max_seen());
    return failed ? 1 : 0;
}
