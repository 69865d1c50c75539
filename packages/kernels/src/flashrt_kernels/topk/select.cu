// Exact top-K select in CUDA C++ (flashrt-kernels backend "cuda"; host side: cuda_select.py).
//
// Keys. Every score becomes an unsigned 32-bit key whose unsigned order is the rank order of the
// contract: the order-preserving signed key of the fp32 value (reference.order_key: NaN highest,
// -0.0 == +0.0) with its sign bit flipped. bf16 / fp16 widen to fp32 exactly first. Among equal
// keys the lower index ranks higher, so the K-th key T and the number of ties at T to keep
// (`ties`) define the selection: every key > T, and the first `ties` keys == T in index order.
//
// A radix search finds T: three digit passes over the key (bits 31..20, 19..8, 7..0); each pass
// histograms the elements that match the digits found so far and picks the bucket that holds the
// remaining rank. Where it runs:
//   - rows of at most `short_max` elements: one block per row, the row's keys in shared memory,
//     all passes there (`finish_kernel` alone: one launch);
//   - longer rows: `step_kernel` launches, several blocks per row, each pass a launch. The last
//     block of a row to finish a pass (an arrival counter; nobody waits for anybody) reads the
//     row's histogram and decides. Once the bucket and everything above it hold at most `cap`
//     elements, the next step compacts them (index order) into per-block segments and the
//     finishing block resolves the rest in shared memory;
//   - with a hint (`guess_kernel`): the smallest current score at the hinted positions is the
//     guess; one pass counts eight thresholds exactly and compacts the scores >= the guess. When
//     that admits between k and `cap` elements the finishing block ranks them; otherwise the
//     finishing block searches its row alone (exact, slower).
// The finishing block writes the selection in ascending index order, the pads, and the state.

#define CTRL_WORDS 32
#define C_STATUS 0
#define C_PASS 1     // digit passes done
#define C_PREFIX 2   // the digits found so far (unsigned key bits)
#define C_NEED 3     // rank still needed inside the prefix's bucket
#define C_ABOVE 4    // valid elements above the prefix's bucket
#define C_LO 5       // candidates are the keys >= LO
#define C_COUNT 6    // exact number of valid keys >= LO
#define C_ARRIVED 7  // blocks of the row done with the current launch
#define C_ROUNDS 8   // counting passes over the row so far
#define C_TRIED 16   // 8 keys (unsigned) then 8 exact counts

#define ST_SEARCH 0   // next step: another digit pass
#define ST_COMPACT 1  // next step: compact the keys >= LO
#define ST_READY 2    // the segments hold every key >= LO
#define ST_EXACT 3    // T is known (PREFIX), NEED ties; the finishing block writes from the row
#define ST_ROW 4      // the finishing block searches the row alone

#define HIST_BINS 4096
#define TILE_ITEMS 8
#define LOAD_ITEMS 16
#define STATE_VALID 0
#define STATE_KTH 1
#define STATE_ACC_KEY 2
#define STATE_ACC_COUNT 3
#define STATE_N_TRIED 4
#define STATE_ROUNDS 5
#define STATE_LENGTH 6
#define STATE_K 7
#define STATE_TRIED_KEY 8
#define STATE_TRIED_COUNT 16

typedef unsigned int u32;

// ---------------------------------------------------------------------------------------------
// keys

__device__ __forceinline__ u32 key_of_f32_bits(u32 f) {
    int k;
    if ((f & 0x7fffffffu) > 0x7f800000u) {
        k = 0x7fffffff;  // every NaN
    } else if (f == 0x80000000u) {
        k = 0;  // -0.0 ties with +0.0
    } else {
        int s = (int)f;
        k = s < 0 ? (s ^ 0x7fffffff) : s;
    }
    return (u32)k ^ 0x80000000u;
}

__device__ __forceinline__ u32 f16_to_f32_bits(u32 h) {
    u32 sign = (h & 0x8000u) << 16;
    u32 e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 31u) return sign | 0x7f800000u | (m << 13);
    if (e == 0u) {  // zero or subnormal: m * 2^-24, exact in fp32
        float v = (float)m * 5.9604644775390625e-8f;
        return sign | __float_as_uint(v);
    }
    return sign | ((e + 112u) << 23) | (m << 13);
}

// DT: 0 fp32, 1 bf16, 2 fp16
template <int DT>
__device__ __forceinline__ u32 load_key(const void* row, long long i) {
    if (DT == 0) return key_of_f32_bits(__ldg((const u32*)row + i));
    u32 h = __ldg((const unsigned short*)row + i);
    return key_of_f32_bits(DT == 1 ? (h << 16) : f16_to_f32_bits(h));
}

template <int DT>
__device__ __forceinline__ void copy_value(void* out, long long pos, const void* row, int i) {
    if (DT == 0) ((u32*)out)[pos] = __ldg((const u32*)row + i);
    else ((unsigned short*)out)[pos] = __ldg((const unsigned short*)row + i);
}

template <int DT>
__device__ __forceinline__ void write_pad(void* out, long long pos) {
    if (DT == 0) ((u32*)out)[pos] = 0xff800000u;  // -inf
    else ((unsigned short*)out)[pos] = DT == 1 ? 0xff80u : 0xfc00u;
}

__device__ __forceinline__ int row_length(const int* lengths, int b, int n) {
    if (lengths == nullptr) return n;
    int l = lengths[b];
    return l < 0 ? 0 : (l > n ? n : l);
}

// ---------------------------------------------------------------------------------------------
// block-wide helpers (every thread of the block calls them)

__device__ __forceinline__ int warp_inclusive_scan(int x) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

// Exclusive prefix sum of v over the block's threads; *total gets the sum. scratch: 33 ints.
__device__ int block_exclusive_scan(int v, int* scratch, int* total) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    int x = warp_inclusive_scan(v);
    if (lane == 31) scratch[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = lane < nwarps ? scratch[lane] : 0;
        w = warp_inclusive_scan(w);
        if (lane < nwarps) scratch[lane] = w;
    }
    __syncthreads();
    int excl = (warp ? scratch[warp - 1] : 0) + x - v;
    *total = scratch[nwarps - 1];
    __syncthreads();
    return excl;
}

// Histogram increment for every active lane. A warp whose active lanes share one bin (a plateau:
// zeros, equal values) adds once; otherwise each lane adds its own.
__device__ __forceinline__ void hist_add(int* h, u32 bin, bool active) {
    u32 act = __ballot_sync(0xffffffffu, active);
    if (act == 0u) return;
    int leader = __ffs(act) - 1;
    u32 b0 = __shfl_sync(0xffffffffu, bin, leader);
    if (__all_sync(0xffffffffu, !active || bin == b0)) {
        if ((int)(threadIdx.x & 31) == leader) atomicAdd(&h[b0], __popc(act));
    } else if (active) {
        atomicAdd(&h[bin], 1);
    }
}

// Bucket search over h[0..nb): the bucket d holding the need-th largest (need >= 1, and the
// bins hold at least need). out[0] = d, out[1] = count in the bins above d.
__device__ void find_bucket(const int* h, int nb, int need, int* out, int* scratch) {
    int per = nb > (int)blockDim.x ? nb / (int)blockDim.x : 1;
    int b0 = threadIdx.x * per;
    int local = 0;
    if (b0 < nb)
        for (int j = 0; j < per; ++j) local += h[b0 + j];
    int total;
    int before = block_exclusive_scan(local, scratch, &total);
    int above = total - before - local;  // bins of higher threads
    if (b0 < nb && above < need && above + local >= need) {
        int acc = above;
        for (int j = per - 1; j >= 0; --j) {
            int c = h[b0 + j];
            if (acc + c >= need) {
                out[0] = b0 + j;
                out[1] = acc;
                break;
            }
            acc += c;
        }
    }
    __syncthreads();
}

__device__ __forceinline__ int pass_shift(int pass) { return pass == 0 ? 20 : (pass == 1 ? 8 : 0); }
__device__ __forceinline__ int pass_bins(int pass) { return pass < 2 ? 4096 : 256; }
__device__ __forceinline__ u32 pass_mask(int pass) {  // the digits found before `pass`
    return pass == 0 ? 0u : (pass == 1 ? 0xfff00000u : 0xffffff00u);
}

// ---------------------------------------------------------------------------------------------
// the row as a source of the finishing block's slow paths (a missed guess, a known T)

template <int DT>
struct GlobalRow {
    const void* row;
    __device__ u32 key(int i) const { return load_key<DT>(row, i); }
    __device__ int index(int i) const { return i; }
};

// Radix search over src[0..count) from digit pass `pass` on: T (unsigned key) and the ties at T
// to keep. prefix / need describe the bucket found before `pass` (0 / the rank for pass 0).
template <class Src>
__device__ void block_search(const Src& src, int count, int pass, u32 prefix, int need, int* hist,
                             int* scratch, u32* t_out, int* ties_out) {
    for (; pass < 3; ++pass) {
        int shift = pass_shift(pass), nb = pass_bins(pass);
        u32 mask = pass_mask(pass);
        for (int j = threadIdx.x; j < nb; j += blockDim.x) hist[j] = 0;
        __syncthreads();
        for (int base = 0; base < count; base += blockDim.x) {
            int i = base + threadIdx.x;
            u32 u = i < count ? src.key(i) : 0u;
            bool hit = i < count && (u & mask) == prefix;
            hist_add(hist, (u >> shift) & (u32)(nb - 1), hit);
        }
        __syncthreads();
        find_bucket(hist, nb, need, scratch + 40, scratch);
        int d = scratch[40], above = scratch[41];
        __syncthreads();
        prefix |= (u32)d << shift;
        need -= above;
    }
    *t_out = prefix;
    *ties_out = need;
}

// Writes the selection of src[0..count) -- keys > t and the first `ties` keys == t, in index
// order -- at out[0..), values copied as raw bits from the row.
template <int DT, class Src>
__device__ void block_emit(const Src& src, int count, u32 t, int ties, int* out_idx,
                           void* out_val, const void* row, int* scratch) {
    int carry_gt = 0, carry_eq = 0;
    const int tile = blockDim.x * TILE_ITEMS;
    for (int base = 0; base < count; base += tile) {
        int i0 = base + threadIdx.x * TILE_ITEMS;
        u32 keys[TILE_ITEMS];
        int gt = 0, eq = 0;
#pragma unroll
        for (int j = 0; j < TILE_ITEMS; ++j) {
            keys[j] = i0 + j < count ? src.key(i0 + j) : 0u;
            bool ok = i0 + j < count;
            gt += ok && keys[j] > t;
            eq += ok && keys[j] == t;
        }
        int total;
        int excl = block_exclusive_scan((gt << 16) | eq, scratch, &total);
        int g = carry_gt + (excl >> 16), e = carry_eq + (excl & 0xffff);
#pragma unroll
        for (int j = 0; j < TILE_ITEMS; ++j) {
            if (i0 + j >= count) break;
            u32 u = keys[j];
            if (u > t) {
                int pos = g + (e < ties ? e : ties);
                int idx = src.index(i0 + j);
                out_idx[pos] = idx;
                copy_value<DT>(out_val, pos, row, idx);
                ++g;
            } else if (u == t) {
                if (e < ties) {
                    int idx = src.index(i0 + j);
                    out_idx[g + e] = idx;
                    copy_value<DT>(out_val, g + e, row, idx);
                }
                ++e;
            }
        }
        carry_gt += total >> 16;
        carry_eq += total & 0xffff;
    }
}

// Runs: the finishing block's elements in shared memory, thread t owning the contiguous run
// e = t R .. t R + R - 1 (index order = e order), stored transposed -- element e = t R + j at
// [j blockDim + t] -- so that every pass reads shared memory without bank conflicts.

__device__ void runs_search(const u32* k, int R, int count, int pass, u32 prefix, int need,
                            int* hist, int* scratch, u32* t_out, int* ties_out) {
    const int t = threadIdx.x, bd = blockDim.x;
    for (; pass < 3; ++pass) {
        int shift = pass_shift(pass), nb = pass_bins(pass);
        u32 mask = pass_mask(pass);
        for (int j = t; j < nb; j += bd) hist[j] = 0;
        __syncthreads();
        for (int j = 0; j < R; ++j) {
            u32 u = k[j * bd + t];
            hist_add(hist, (u >> shift) & (u32)(nb - 1), t * R + j < count && (u & mask) == prefix);
        }
        __syncthreads();
        find_bucket(hist, nb, need, scratch + 40, scratch);
        int d = scratch[40], above = scratch[41];
        __syncthreads();
        prefix |= (u32)d << shift;
        need -= above;
    }
    *t_out = prefix;
    *ties_out = need;
}

// Writes the selection (keys > t, the first `ties` keys == t) in index order; ix == nullptr: the
// element's position is its index.
template <int DT>
__device__ void runs_emit(const u32* k, const int* ix, int R, int count, u32 t, int ties,
                          int* out_idx, void* out_val, const void* row, int* scratch) {
    const int tid = threadIdx.x, bd = blockDim.x;
    int gt = 0, eq = 0;
    for (int j = 0; j < R; ++j) {
        u32 u = k[j * bd + tid];
        bool ok = tid * R + j < count;
        gt += ok && u > t;
        eq += ok && u == t;
    }
    int total;  // counts <= 32768: two 16-bit halves of one unsigned scan
    u32 excl = (u32)block_exclusive_scan((int)(((u32)gt << 16) | (u32)eq), scratch, &total);
    int g = (int)(excl >> 16), e = (int)(excl & 0xffffu);
    for (int j = 0; j < R; ++j) {
        int el = tid * R + j;
        if (el >= count) break;
        u32 u = k[j * bd + tid];
        if (u > t || (u == t && e < ties)) {
            int pos = g + (e < ties ? e : ties);
            int idx = ix ? ix[j * bd + tid] : el;
            out_idx[pos] = idx;
            copy_value<DT>(out_val, pos, row, idx);
        }
        g += u > t;
        e += u == t;
    }
}

// ---------------------------------------------------------------------------------------------
// multi-block passes

// Ordered compaction of this block's [lo, hi) keys >= lo_key into seg (at most segcap written);
// returns the block's count (all threads). Optionally counts eight thresholds too.
template <int DT, bool COUNT8>
__device__ int block_compact(const void* row, int lo, int hi, u32 lo_key, int2* seg, int segcap,
                             const u32* th, int* cnt8, int* scratch) {
    int carry = 0;
    int c8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int tile = blockDim.x * TILE_ITEMS;
    for (int base = lo; base < hi; base += tile) {
        int i0 = base + threadIdx.x * TILE_ITEMS;
        u32 keys[TILE_ITEMS];
        int mine = 0;
#pragma unroll
        for (int j = 0; j < TILE_ITEMS; ++j) {
            bool ok = i0 + j < hi;
            keys[j] = ok ? load_key<DT>(row, i0 + j) : 0u;
            mine += ok && keys[j] >= lo_key;
            if (COUNT8) {
#pragma unroll
                for (int q = 0; q < 8; ++q) c8[q] += ok && keys[j] >= th[q];
            }
        }
        int total;
        int pos = carry + block_exclusive_scan(mine, scratch, &total);
#pragma unroll
        for (int j = 0; j < TILE_ITEMS; ++j) {
            if (i0 + j < hi && keys[j] >= lo_key) {
                if (pos < segcap) seg[pos] = make_int2((int)keys[j], i0 + j);
                ++pos;
            }
        }
        carry += total;
    }
    if (COUNT8) {
        if (threadIdx.x < 8) cnt8[threadIdx.x] = 0;
        __syncthreads();
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            int s = (int)__reduce_add_sync(0xffffffffu, (u32)c8[q]);
            if ((threadIdx.x & 31) == 0) atomicAdd(&cnt8[q], s);
        }
        __syncthreads();
    }
    return carry;
}

// Arrival: true in the last block of row b to get here (after its global writes are fenced).
__device__ bool last_to_arrive(int* ctrl_row, int blocks, int* flag) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) *flag = atomicAdd(&ctrl_row[C_ARRIVED], 1) == blocks - 1;
    __syncthreads();
    bool last = *flag;
    if (last) __threadfence();
    return last;
}

// A digit pass over this block's chunk; the last block of the row decides what comes next.
template <int DT>
__device__ void hist_pass(const void* row, int lo, int hi, int pass, int* cr, int* ghist, int S,
                          int cap, int kk, int* sh, int* scratch) {
    u32 prefix = pass ? (u32)__ldcg(&cr[C_PREFIX]) : 0u;
    int need = pass ? __ldcg(&cr[C_NEED]) : kk;
    int above = pass ? __ldcg(&cr[C_ABOVE]) : 0;
    int shift = pass_shift(pass), nb = pass_bins(pass);
    u32 mask = pass_mask(pass);
    for (int j = threadIdx.x; j < nb; j += blockDim.x) sh[j] = 0;
    __syncthreads();
    for (int base = lo; base < hi; base += blockDim.x * LOAD_ITEMS) {
        u32 u[LOAD_ITEMS];
#pragma unroll
        for (int q = 0; q < LOAD_ITEMS; ++q) {
            int i = base + q * blockDim.x + threadIdx.x;
            u[q] = i < hi ? load_key<DT>(row, i) : 0u;
        }
#pragma unroll
        for (int q = 0; q < LOAD_ITEMS; ++q) {
            int i = base + q * blockDim.x + threadIdx.x;
            hist_add(sh, (u[q] >> shift) & (u32)(nb - 1), i < hi && (u[q] & mask) == prefix);
        }
    }
    __syncthreads();
    for (int j = threadIdx.x; j < nb; j += blockDim.x)
        if (sh[j]) atomicAdd(&ghist[j], sh[j]);
    if (!last_to_arrive(cr, S, scratch + 48)) return;
    for (int j = threadIdx.x; j < nb; j += blockDim.x) {
        sh[j] = __ldcg(&ghist[j]);
        ghist[j] = 0;  // zero for the next pass / call
    }
    __syncthreads();
    find_bucket(sh, nb, need, scratch + 40, scratch);
    if (threadIdx.x == 0) {
        int d = scratch[40], ab = scratch[41];
        u32 np = prefix | ((u32)d << shift);
        int nneed = need - ab, nabove = above + ab, count_ge = nabove + sh[d];
        if (pass == 0) {  // publish eight bucket bounds around d with their exact counts
            int suffix_d = count_ge;  // keys >= bucket d's low bound
            for (int q = 0; q < 8; ++q) {
                int j = d - 3 + q;
                j = j < 0 ? 0 : (j > nb - 1 ? nb - 1 : j);
                int c = suffix_d;
                for (int m = d; m < j; ++m) c -= sh[m];
                for (int m = j; m < d; ++m) c += sh[m];
                cr[C_TRIED + q] = (int)((u32)j << shift);
                cr[C_TRIED + 8 + q] = c;
            }
        }
        cr[C_PREFIX] = (int)np;
        cr[C_NEED] = nneed;
        cr[C_ABOVE] = nabove;
        cr[C_PASS] = pass + 1;
        cr[C_ROUNDS] = pass + 1;
        cr[C_LO] = (int)np;
        cr[C_COUNT] = count_ge;
        cr[C_STATUS] = pass == 2 ? ST_EXACT : (count_ge <= cap ? ST_COMPACT : ST_SEARCH);
        cr[C_ARRIVED] = 0;
    }
}

template <int DT>
__global__ void __launch_bounds__(512) step_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int chunk, int S,
    int step, int cap, int segcap, int short_max, int* ctrl, int* ghist, int2* seg, int* segcnt) {
    __shared__ int sh[HIST_BINS];
    __shared__ int scratch[64];
    int b = blockIdx.y, c = blockIdx.x;
    int len = row_length(lengths, b, n);
    int kk = k < len ? k : len;
    int* cr = ctrl + (long long)b * CTRL_WORDS;
    if (len <= short_max || kk == 0) {
        if (step == 0 && c == 0 && threadIdx.x == 0) cr[C_STATUS] = ST_ROW;
        return;
    }
    int status = step == 0 ? ST_SEARCH : __ldcg(&cr[C_STATUS]);
    int pass = step == 0 ? 0 : __ldcg(&cr[C_PASS]);
    const void* row = (const char*)scores + (long long)b * stride * (DT == 0 ? 4 : 2);
    int lo = c * chunk, hi = lo + chunk < len ? lo + chunk : len;
    if (lo > hi) lo = hi;
    if (status == ST_SEARCH) {
        hist_pass<DT>(row, lo, hi, pass, cr, ghist + (long long)b * HIST_BINS, S, cap, kk, sh,
                      scratch);
    } else if (status == ST_COMPACT) {
        u32 lo_key = (u32)__ldcg(&cr[C_LO]);
        int2* my = seg + ((long long)b * S + c) * segcap;
        int cnt = block_compact<DT, false>(row, lo, hi, lo_key, my, segcap, nullptr, nullptr,
                                           scratch);
        if (threadIdx.x == 0) segcnt[b * S + c] = cnt;
        if (last_to_arrive(cr, S, scratch + 48) && threadIdx.x == 0) {
            cr[C_STATUS] = ST_READY;
            cr[C_ARRIVED] = 0;
        }
    }
}

__device__ __forceinline__ u32 sat_add(u32 a, int d) {
    long long v = (long long)a + d;
    return v < 0 ? 0u : (v > 0xffffffffLL ? 0xffffffffu : (u32)v);
}

template <int DT>
__global__ void __launch_bounds__(512) guess_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int chunk, int S,
    int cap, int segcap, int short_max, const int* hint, const int* state, int state_words,
    int* ctrl, int* tc, int2* seg, int* segcnt) {
    __shared__ int scratch[64];
    __shared__ u32 th[8];
    __shared__ int cnt8[8];
    __shared__ u32 gmin;
    int b = blockIdx.y, c = blockIdx.x;
    int len = row_length(lengths, b, n);
    int kk = k < len ? k : len;
    int* cr = ctrl + (long long)b * CTRL_WORDS;
    if (len <= short_max || kk == 0) {
        if (c == 0 && threadIdx.x == 0) cr[C_STATUS] = ST_ROW;
        return;
    }
    const void* row = (const char*)scores + (long long)b * stride * (DT == 0 ? 4 : 2);
    if (threadIdx.x == 0) gmin = 0xffffffffu;
    __syncthreads();
    u32 m = 0xffffffffu;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        int h = __ldg(&hint[(long long)b * k + j]);
        if (h >= 0 && h < len) {
            u32 u = load_key<DT>(row, h);
            m = u < m ? u : m;
        }
    }
    atomicMin(&gmin, m);
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 g = gmin, kth = g, acc = g;
        if (state != nullptr) {
            const int* s = state + (long long)b * state_words;
            if (s[STATE_VALID] == 1 && s[STATE_K] == k) {
                kth = (u32)s[STATE_KTH] ^ 0x80000000u;
                acc = (u32)s[STATE_ACC_KEY] ^ 0x80000000u;
            }
        }
        th[0] = g;
        th[1] = sat_add(g, 1);
        th[2] = kth;
        th[3] = sat_add(kth, 1);
        th[4] = acc;
        th[5] = sat_add(g, -(1 << 14));
        th[6] = sat_add(g, -(1 << 17));
        th[7] = sat_add(g, -(1 << 20));
    }
    __syncthreads();
    int lo = c * chunk, hi = lo + chunk < len ? lo + chunk : len;
    if (lo > hi) lo = hi;
    int2* my = seg + ((long long)b * S + c) * segcap;
    int cnt = block_compact<DT, true>(row, lo, hi, th[0], my, segcap, th, cnt8, scratch);
    if (threadIdx.x == 0) segcnt[b * S + c] = cnt < segcap ? cnt : segcap;
    if (threadIdx.x < 8) atomicAdd(&tc[b * 8 + threadIdx.x], cnt8[threadIdx.x]);
    if (!last_to_arrive(cr, S, scratch + 48)) return;
    if (threadIdx.x == 0) {
        int tot[8];
        for (int q = 0; q < 8; ++q) {
            tot[q] = __ldcg(&tc[b * 8 + q]);
            tc[b * 8 + q] = 0;
            cr[C_TRIED + q] = (int)th[q];
            cr[C_TRIED + 8 + q] = tot[q];
        }
        bool admit = tot[0] >= kk && tot[0] <= cap;
        cr[C_STATUS] = admit ? ST_READY : ST_ROW;
        cr[C_PASS] = 0;
        cr[C_PREFIX] = 0;
        cr[C_NEED] = kk;
        cr[C_LO] = (int)th[0];
        cr[C_COUNT] = tot[0];
        cr[C_ROUNDS] = 1;
        cr[C_ARRIVED] = 0;
    }
}

// ---------------------------------------------------------------------------------------------
// the finishing block: one per row

template <int DT>
__global__ void __launch_bounds__(1024) finish_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int S, int segcap,
    int short_max, int multi, const int* ctrl, const int2* seg, const int* segcnt, int* out_idx,
    void* out_val, int* state, int state_words) {
    extern __shared__ int smem[];
    int* hist = smem;                   // HIST_BINS
    int* scratch = hist + HIST_BINS;    // 64
    u32* keys = (u32*)(scratch + 64);   // max(short_max, cap)
    int b = blockIdx.x;
    int len = row_length(lengths, b, n);
    int kk = k < len ? k : len;
    const int* cr = ctrl + (long long)b * CTRL_WORDS;
    const void* row = (const char*)scores + (long long)b * stride * (DT == 0 ? 4 : 2);
    int* oi = out_idx + (long long)b * k;
    void* ov = (char*)out_val + (long long)b * k * (DT == 0 ? 4 : 2);
    int status = (len <= short_max || kk == 0 || !multi) ? -1 : cr[C_STATUS];
    u32 t = 0u, acc_key = 0u;
    int ties = 0, acc_count = len, rounds = 0;
    if (kk > 0 && status == -1) {  // the row in shared memory
        const int R = (len + blockDim.x - 1) / blockDim.x;
        const int t0 = threadIdx.x * R;
#pragma unroll 8
        for (int j = 0; j < R; ++j)
            keys[j * blockDim.x + threadIdx.x] = t0 + j < len ? load_key<DT>(row, t0 + j) : 0u;
        __syncthreads();
        runs_search(keys, R, len, 0, 0u, kk, hist, scratch, &t, &ties);
        runs_emit<DT>(keys, nullptr, R, len, t, ties, oi, ov, row, scratch);
    } else if (status == ST_READY) {  // the candidates, in index order
        int cnt = threadIdx.x < S ? segcnt[b * S + threadIdx.x] : 0;
        int total;
        int off = block_exclusive_scan(cnt, scratch, &total);
        int* pfx = hist;  // the segments' offsets (S <= blockDim)
        if (threadIdx.x < S) pfx[threadIdx.x] = off;
        __syncthreads();
        const int R = (total + blockDim.x - 1) / blockDim.x;
        int* ix = (int*)(keys + R * blockDim.x);
        const int p0 = threadIdx.x * R;
        int lo = 0, hi = S - 1;  // the last segment whose offset is <= p0
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (pfx[mid] <= p0) lo = mid; else hi = mid - 1;
        }
        for (int j = 0; j < R; ++j) {
            int p = p0 + j;
            if (p >= total) break;
            while (lo < S - 1 && pfx[lo + 1] <= p) ++lo;
            int2 e = seg[((long long)b * S + lo) * segcap + (p - pfx[lo])];
            keys[j * blockDim.x + threadIdx.x] = (u32)e.x;
            ix[j * blockDim.x + threadIdx.x] = e.y;
        }
        __syncthreads();
        runs_search(keys, R, total, cr[C_PASS], (u32)cr[C_PREFIX], cr[C_NEED], hist, scratch, &t,
                    &ties);
        runs_emit<DT>(keys, ix, R, total, t, ties, oi, ov, row, scratch);
        acc_key = (u32)cr[C_LO];
        acc_count = cr[C_COUNT];
        rounds = cr[C_ROUNDS];
    } else if (status == ST_EXACT) {  // T known: one ordered pass over the row
        t = (u32)cr[C_PREFIX];
        ties = cr[C_NEED];
        GlobalRow<DT> src{row};
        block_emit<DT>(src, len, t, ties, oi, ov, row, scratch);
        acc_key = t;
        acc_count = cr[C_COUNT];
        rounds = cr[C_ROUNDS];
    } else if (status == ST_ROW) {  // a missed guess: the row alone, exact
        GlobalRow<DT> src{row};
        block_search(src, len, 0, 0u, kk, hist, scratch, &t, &ties);
        block_emit<DT>(src, len, t, ties, oi, ov, row, scratch);
        rounds = cr[C_ROUNDS] + 3;
    }
    for (int j = kk + threadIdx.x; j < k; j += blockDim.x) {
        oi[j] = -1;
        write_pad<DT>(ov, j);
    }
    if (state != nullptr && threadIdx.x == 0) {
        int* s = state + (long long)b * state_words;
        s[STATE_VALID] = kk > 0;
        s[STATE_KTH] = kk > 0 ? (int)(t ^ 0x80000000u) : 0;
        s[STATE_ACC_KEY] = (int)(acc_key ^ 0x80000000u);
        s[STATE_ACC_COUNT] = kk > 0 ? acc_count : 0;
        s[STATE_N_TRIED] = rounds > 0 ? 8 : 0;
        s[STATE_ROUNDS] = rounds;
        s[STATE_LENGTH] = len;
        s[STATE_K] = k;
        for (int q = 0; q < 8; ++q) {
            s[STATE_TRIED_KEY + q] = rounds > 0 ? (int)((u32)cr[C_TRIED + q] ^ 0x80000000u) : 0;
            s[STATE_TRIED_COUNT + q] = rounds > 0 ? cr[C_TRIED + 8 + q] : 0;
        }
    }
}
