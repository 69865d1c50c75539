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
//   - longer rows: several blocks per row, one launch per pass over the row. The last block of a
//     row to finish a launch (an arrival counter; nobody waits for anybody) decides what the
//     row's next launch does:
//       1. a lower bound L on the K-th key: the rows's elements fall into G >= k interleaved
//          groups (index mod G); the smallest of the G group maxima is <= the K-th largest
//          (`bound_kernel`, hint-free) -- or, with a hint, the smallest current score at the
//          hinted positions (a guess, not a bound);
//       2. one pass counts eight thresholds from L upward exactly and compacts the keys >= L into
//          per-block segments (`count_kernel`). If that admits between k and `cap` keys the
//          candidates are ready; if another threshold does, the next launch compacts at it;
//       3. otherwise (`step_kernel`, three launches, no-ops for rows already done) digit passes
//          over the row narrow the K-th key's bucket until it and everything above it hold at
//          most `cap` keys, which one more step compacts;
//   - the finishing block (one per row) ranks the candidates in shared memory, or, when even the
//     last digit pass left more than `cap` keys tied at T, writes the selection from the row.
// It writes the selection in ascending index order, the pads, and the state.

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
#define C_MAX 9      // the row's largest key (bound_kernel)
#define C_TRIED 16   // 8 keys (unsigned) then 8 exact counts

#define ST_SEARCH 0   // next step: another digit pass
#define ST_COMPACT 1  // next step: compact the keys >= LO
#define ST_READY 2    // the segments hold every key >= LO
#define ST_EXACT 3    // T is known (PREFIX), NEED ties; the finishing block writes from the row

#define HIST_BINS 4096
#define BUF_WORDS 8192  // the finishing block's buffer for a narrowed bucket
#define AUX_WORDS (BUF_WORDS + BUF_WORDS / 4 + 64)  // with its owners and the warp counts
#define TILE_ITEMS 8   // consecutive 32-element rows a warp covers per compaction tile
#define LOAD_ITEMS 16
#define SHORT_LOADS 6  // loads in flight per thread as the finishing block reads a short row
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

// Per-warp offsets of two warp-uniform counts (every thread calls; lanes of a warp pass the same
// values): the exclusive prefix over the block's warps, and the block totals. scratch: 64 ints.
__device__ __forceinline__ void warp_offsets(int a, int b, int* scratch, int* a_off, int* b_off,
                                             int* a_tot, int* b_tot) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) {
        scratch[warp] = a;
        scratch[32 + warp] = b;
    }
    __syncthreads();
    int x = lane < nw ? scratch[lane] : 0, y = lane < nw ? scratch[32 + lane] : 0;
    x = warp_inclusive_scan(x);
    y = warp_inclusive_scan(y);
    *a_off = __shfl_sync(0xffffffffu, x, warp) - a;
    *b_off = __shfl_sync(0xffffffffu, y, warp) - b;
    *a_tot = __shfl_sync(0xffffffffu, x, nw - 1);
    *b_tot = __shfl_sync(0xffffffffu, y, nw - 1);
    __syncthreads();
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

// ITEMS keys per thread, strided by the block: element base + q blockDim + thread (0 past hi).
template <int DT, int ITEMS>
__device__ __forceinline__ void load_strided(const void* row, int base, int hi, u32* u) {
#pragma unroll
    for (int q = 0; q < ITEMS; ++q) {
        int i = base + q * blockDim.x + threadIdx.x;
        u[q] = i < hi ? load_key<DT>(row, i) : 0u;
    }
}

// Histogram of the keys of row[lo, hi) that match prefix under mask (digit at shift, nb bins),
// ITEMS loads in flight per thread; `store` (if set) also gets every key at store[i - lo].
template <int DT, int ITEMS>
__device__ void hist_sweep(const void* row, int lo, int hi, int shift, int nb, u32 mask,
                           u32 prefix, int* h, u32* store) {
    for (int base = lo; base < hi; base += blockDim.x * ITEMS) {
        u32 u[ITEMS];
        load_strided<DT, ITEMS>(row, base, hi, u);
#pragma unroll
        for (int q = 0; q < ITEMS; ++q) {
            int i = base + q * blockDim.x + threadIdx.x;
            if (store != nullptr && i < hi) store[i - lo] = u[q];
            hist_add(h, (u[q] >> shift) & (u32)(nb - 1), i < hi && (u[q] & mask) == prefix);
        }
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
// sources of the finishing block: element i's key and its index in the row

template <int DT>
struct GlobalRow {  // the row itself
    const void* row;
    __device__ u32 key(int i) const { return load_key<DT>(row, i); }
    __device__ int index(int i) const { return i; }
};

struct SmemKeys {  // a short row's keys in shared memory
    const u32* k;
    __device__ u32 key(int i) const { return k[i]; }
    __device__ int index(int i) const { return i; }
};

struct SmemPairs {  // candidates in shared memory, in index order
    const u32* k;
    const int* ix;
    __device__ u32 key(int i) const { return k[i]; }
    __device__ int index(int i) const { return ix[i]; }
};

// One digit pass over src[0..count): narrows (prefix, need) to the bucket holding the need-th
// largest of the keys matching prefix; returns how many keys that bucket holds. `counted`: hist
// already holds this pass's histogram.
template <class Src>
__device__ int search_pass(const Src& src, int count, int pass, u32* prefix, int* need,
                           int* hist, int* scratch, bool counted) {
    int shift = pass_shift(pass), nb = pass_bins(pass);
    u32 mask = pass_mask(pass), pre = *prefix;
    if (!counted) {
        for (int j = threadIdx.x; j < nb; j += blockDim.x) hist[j] = 0;
        __syncthreads();
#pragma unroll 1  // (more unrolling spills in the 1024-thread finishing block)
        for (int base = 0; base < count; base += blockDim.x) {
            int i = base + threadIdx.x;
            u32 u = i < count ? src.key(i) : 0u;
            hist_add(hist, (u >> shift) & (u32)(nb - 1), i < count && (u & mask) == pre);
        }
        __syncthreads();
    }
    find_bucket(hist, nb, *need, scratch + 40, scratch);
    int d = scratch[40], above = scratch[41], in_d = hist[d];
    __syncthreads();
    *prefix = pre | ((u32)d << shift);
    *need -= above;
    return in_d;
}

// The contiguous range of src[0..count) that warp w covers when the block emits.
__device__ __forceinline__ void warp_range(int count, int* lo, int* hi) {
    const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int per = (((count + nw - 1) / nw) + 31) & ~31;
    *lo = warp * per;
    *hi = *lo + per < count ? *lo + per : count;
}

// Per-warp counts the emission needs, collected on the way: wc[w] (keys > T in warp w's range)
// and wc[32 + w] (keys == T there).
struct WarpCounts {
    u32* buf;        // a narrowed bucket's keys (any order)
    unsigned char* owner;  // the warp whose range each of them came from
    int* wc;         // 64 counts
    int cap;
};

// The keys of src[0..count) that match prefix under mask, into wk.buf (any order), with the
// warp that owns each; wk.wc[w] gets the keys above the bucket in warp w's range.
template <class Src>
__device__ void gather_bucket(const Src& src, int count, u32 mask, u32 prefix,
                              const WarpCounts& wk, int* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) scratch[50] = 0;
    __syncthreads();
    int lo, hi, above = 0;
    warp_range(count, &lo, &hi);
    for (int base = lo; base < hi; base += 32) {
        int i = base + lane;
        u32 u = i < hi ? src.key(i) : 0u, top = u & mask;
        above += __popc(__ballot_sync(0xffffffffu, i < hi && top > prefix));
        bool sel = i < hi && top == prefix;
        u32 bal = __ballot_sync(0xffffffffu, sel);
        if (bal == 0u) continue;
        int leader = __ffs(bal) - 1, at = 0;
        if (lane == leader) at = atomicAdd(&scratch[50], __popc(bal));
        at = __shfl_sync(0xffffffffu, at, leader) + __popc(bal & ((1u << lane) - 1u));
        if (sel) {
            wk.buf[at] = u;
            wk.owner[at] = (unsigned char)warp;
        }
    }
    if (lane == 0) {
        wk.wc[warp] = above;
        wk.wc[32 + warp] = 0;
    }
    __syncthreads();
}

// Radix search over src[0..count) from digit pass `pass` on: T (unsigned key) and the ties at T
// to keep. prefix / need describe the bucket found before `pass` (0 / the rank for pass 0).
// When a pass leaves a bucket of at most wk.cap keys, they move to wk.buf and the remaining
// passes run over them alone (they only count, so any order does); then the per-warp counts
// of the emission come out too (returns true). `counted`: hist already holds the histogram of
// the first pass.
template <class Src>
__device__ bool block_search(const Src& src, int count, int pass, u32 prefix, int need, int* hist,
                             int* scratch, u32* t_out, int* ties_out, const WarpCounts& wk,
                             bool counted) {
    bool gathered = false;
    for (; pass < 3; ++pass, counted = false) {
        int in_d = search_pass(src, count, pass, &prefix, &need, hist, scratch, counted);
        if (pass < 2 && in_d <= wk.cap && in_d < count) {
            gather_bucket(src, count, pass_mask(pass + 1), prefix, wk, scratch);
            SmemKeys rest{wk.buf};
            for (++pass; pass < 3; ++pass)
                search_pass(rest, in_d, pass, &prefix, &need, hist, scratch, false);
            for (int j = threadIdx.x; j < in_d; j += blockDim.x) {
                u32 u = wk.buf[j];
                if (u >= prefix) atomicAdd(&wk.wc[(u == prefix ? 32 : 0) + wk.owner[j]], 1);
            }
            __syncthreads();
            gathered = true;
            break;
        }
    }
    *t_out = prefix;
    *ties_out = need;
    return gathered;
}

// Writes the selection of src[0..count) -- keys > t and the first `ties` keys == t, in index
// order -- at out[0..), values copied from the row. Warp w covers one contiguous range of the
// elements (warp_range), its lanes reading 32 consecutive ones at a time; ballots order each 32.
// wc: the per-warp counts of keys > t and == t when block_search collected them, else nullptr.
template <int DT, class Src>
__device__ void block_emit(const Src& src, int count, u32 t, int ties, int* out_idx,
                           void* out_val, const void* row, int* scratch, const int* wc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int lo, hi, gt = 0, eq = 0;
    warp_range(count, &lo, &hi);
    if (wc != nullptr) {  // counted by block_search
        gt = wc[warp];
        eq = wc[32 + warp];
    } else {
        for (int i = lo + lane; i < hi; i += 32) {
            u32 u = src.key(i);
            gt += u > t;
            eq += u == t;
        }
        gt = (int)__reduce_add_sync(0xffffffffu, (u32)gt);
        eq = (int)__reduce_add_sync(0xffffffffu, (u32)eq);
    }
    int g, e, gtot, etot;
    warp_offsets(gt, eq, scratch, &g, &e, &gtot, &etot);
    const u32 below = (1u << lane) - 1u;
    for (int base = lo; base < hi; base += 32) {
        int i = base + lane;
        u32 u = i < hi ? src.key(i) : 0u;
        bool is_gt = i < hi && u > t, is_eq = i < hi && u == t;
        u32 mg = __ballot_sync(0xffffffffu, is_gt), me = __ballot_sync(0xffffffffu, is_eq);
        int gb = g + __popc(mg & below), eb = e + __popc(me & below);
        if (is_gt || (is_eq && eb < ties)) {
            int pos = gb + (eb < ties ? eb : ties);
            int idx = src.index(i);
            out_idx[pos] = idx;
            copy_value<DT>(out_val, pos, row, idx);
        }
        g += __popc(mg);
        e += __popc(me);
    }
}

// ---------------------------------------------------------------------------------------------
// multi-block passes

// Ordered compaction of this block's [lo, hi) keys >= lo_key into seg (at most segcap written);
// returns the block's count (all threads). Optionally counts eight thresholds th[0..8) too
// (th[8]: the smallest of them). Each tile:
// warp w covers TILE_ITEMS consecutive 32-element rows; ballots order them.
template <int DT, bool COUNT8>
__device__ int block_compact(const void* row, int lo, int hi, u32 lo_key, int2* seg, int segcap,
                             const u32* th, int* cnt8, int* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 below = (1u << lane) - 1u;
    int carry = 0;
    int c8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int tile = blockDim.x * TILE_ITEMS;
    for (int base = lo; base < hi; base += tile) {
        const int w0 = base + warp * 32 * TILE_ITEMS + lane;
        u32 keys[TILE_ITEMS];
        u32 hit[TILE_ITEMS];
        int mine = 0;
#pragma unroll
        for (int j = 0; j < TILE_ITEMS; ++j) {
            int i = w0 + j * 32;
            keys[j] = i < hi ? load_key<DT>(row, i) : 0u;
        }
#pragma unroll
        for (int j = 0; j < TILE_ITEMS; ++j) {
            bool ok = w0 + j * 32 < hi;
            hit[j] = __ballot_sync(0xffffffffu, ok && keys[j] >= lo_key);
            mine += __popc(hit[j]);
            if (COUNT8 && __any_sync(0xffffffffu, ok && keys[j] >= th[8])) {
#pragma unroll
                for (int q = 0; q < 8; ++q) c8[q] += ok && keys[j] >= th[q];
            }
        }
        int pos, total, unused0, unused1;
        warp_offsets(mine, 0, scratch, &pos, &unused0, &total, &unused1);
        pos += carry;
#pragma unroll
        for (int j = 0; j < TILE_ITEMS; ++j) {
            if ((hit[j] >> lane) & 1u) {
                int p = pos + __popc(hit[j] & below);
                if (p < segcap) seg[p] = make_int2((int)keys[j], w0 + j * 32);
            }
            pos += __popc(hit[j]);
        }
        carry += total;
    }
    if (COUNT8) {
        if (threadIdx.x < 8) cnt8[threadIdx.x] = 0;
        __syncthreads();
#pragma unroll
        for (int q = 0; q < 8; ++q) {
            int s = (int)__reduce_add_sync(0xffffffffu, (u32)c8[q]);
            if (lane == 0) atomicAdd(&cnt8[q], s);
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

// The lower bound L: element i of the row is in group i mod G (G = the power of two >= kk;
// chunks are multiples of TILE_ITEMS * 32 * warps >= G, so thread t at row step q of a tile sees
// group (t + q * blockDim) mod G). gmax [HIST_BINS] per row collects the group maxima.
template <int DT>
__global__ void __launch_bounds__(512) bound_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int chunk, int S,
    int short_max, int* ctrl, int* gmax_all) {
    __shared__ u32 grp[HIST_BINS];
    __shared__ int scratch[64];
    int b = blockIdx.y, c = blockIdx.x;
    int len = row_length(lengths, b, n);
    int kk = k < len ? k : len;
    if (len <= short_max || kk == 0) return;
    int* cr = ctrl + (long long)b * CTRL_WORDS;
    int* gmax = gmax_all + (long long)b * HIST_BINS;
    const void* row = (const char*)scores + (long long)b * stride * (DT == 0 ? 4 : 2);
    int G = 1;
    while (G < kk) G <<= 1;
    for (int j = threadIdx.x; j < G; j += blockDim.x) grp[j] = 0u;
    __syncthreads();
    int lo = c * chunk, hi = lo + chunk < len ? lo + chunk : len;
    u32 mx[TILE_ITEMS];
#pragma unroll
    for (int q = 0; q < TILE_ITEMS; ++q) mx[q] = 0u;
    for (int base = lo; base < hi; base += blockDim.x * TILE_ITEMS) {
        u32 u[TILE_ITEMS];
        load_strided<DT, TILE_ITEMS>(row, base, hi, u);
#pragma unroll
        for (int q = 0; q < TILE_ITEMS; ++q) mx[q] = u[q] > mx[q] ? u[q] : mx[q];
    }
#pragma unroll
    for (int q = 0; q < TILE_ITEMS; ++q)
        if (mx[q]) atomicMax(&grp[(threadIdx.x + q * blockDim.x) & (G - 1)], mx[q]);
    __syncthreads();
    for (int j = threadIdx.x; j < G; j += blockDim.x)
        if (grp[j]) atomicMax((u32*)&gmax[j], grp[j]);
    if (!last_to_arrive(cr, S, scratch + 48)) return;
    u32 lmin = 0xffffffffu, lmax = 0u;
    for (int j = threadIdx.x; j < G; j += blockDim.x) {
        u32 v = (u32)__ldcg(&gmax[j]);
        gmax[j] = 0;  // zero for the digit passes / the next call
        lmin = v < lmin ? v : lmin;
        lmax = v > lmax ? v : lmax;
    }
    lmin = __reduce_min_sync(0xffffffffu, lmin);
    lmax = __reduce_max_sync(0xffffffffu, lmax);
    if (threadIdx.x == 0) {
        scratch[0] = (int)0xffffffffu;
        scratch[1] = 0;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        atomicMin((u32*)&scratch[0], lmin);
        atomicMax((u32*)&scratch[1], lmax);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        cr[C_LO] = scratch[0];
        cr[C_MAX] = scratch[1];
        cr[C_ARRIVED] = 0;
    }
}

// A digit pass over this block's chunk; the last block of the row decides what comes next.
template <int DT>
__device__ void hist_pass(const void* row, int lo, int hi, int pass, int* cr, int* ghist, int S,
                          int cap, int* sh, int* scratch) {
    u32 prefix = (u32)__ldcg(&cr[C_PREFIX]);
    int need = __ldcg(&cr[C_NEED]);
    int above = __ldcg(&cr[C_ABOVE]);
    int shift = pass_shift(pass), nb = pass_bins(pass);
    u32 mask = pass_mask(pass);
    for (int j = threadIdx.x; j < nb; j += blockDim.x) sh[j] = 0;
    __syncthreads();
    hist_sweep<DT, LOAD_ITEMS>(row, lo, hi, shift, nb, mask, prefix, sh, nullptr);
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
        cr[C_PREFIX] = (int)np;
        cr[C_NEED] = nneed;
        cr[C_ABOVE] = nabove;
        cr[C_PASS] = pass + 1;
        cr[C_ROUNDS] = cr[C_ROUNDS] + 1;
        cr[C_LO] = (int)np;
        cr[C_COUNT] = count_ge;
        cr[C_STATUS] = pass == 2 ? ST_EXACT : (count_ge <= cap ? ST_COMPACT : ST_SEARCH);
        cr[C_ARRIVED] = 0;
    }
}

// One step of a row that the counting pass did not settle: a digit pass or the compaction of
// the keys >= LO, as the row's status says; nothing for rows already ready.
template <int DT>
__global__ void __launch_bounds__(512) step_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int chunk, int S,
    int cap, int segcap, int short_max, int* ctrl, int* ghist, int2* seg, int* segcnt) {
    __shared__ int sh[HIST_BINS];
    __shared__ int scratch[64];
    int b = blockIdx.y, c = blockIdx.x;
    int len = row_length(lengths, b, n);
    int kk = k < len ? k : len;
    int* cr = ctrl + (long long)b * CTRL_WORDS;
    if (len <= short_max || kk == 0) return;
    int status = __ldcg(&cr[C_STATUS]);
    if (status != ST_SEARCH && status != ST_COMPACT) return;
    const void* row = (const char*)scores + (long long)b * stride * (DT == 0 ? 4 : 2);
    int lo = c * chunk, hi = lo + chunk < len ? lo + chunk : len;
    if (lo > hi) lo = hi;
    if (status == ST_SEARCH) {
        hist_pass<DT>(row, lo, hi, __ldcg(&cr[C_PASS]), cr, ghist + (long long)b * HIST_BINS, S,
                      cap, sh, scratch);
    } else {
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

// The counting pass: eight thresholds counted exactly, the keys >= the first compacted.
// Hint-free, the thresholds run from the bound L to the row's largest key; with a hint, the
// first is the smallest current score at the hinted positions, then the previous step's K-th
// and accepted keys (when `state` holds a valid row of the same k) and steps below the guess.
template <int DT>
__global__ void __launch_bounds__(512) count_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int chunk, int S,
    int cap, int segcap, int short_max, const int* hint, const int* state, int state_words,
    int* ctrl, int* tc, int2* seg, int* segcnt) {
    __shared__ int scratch[64];
    __shared__ u32 th[9];
    __shared__ int cnt8[8];
    __shared__ u32 gmin;
    int b = blockIdx.y, c = blockIdx.x;
    int len = row_length(lengths, b, n);
    int kk = k < len ? k : len;
    int* cr = ctrl + (long long)b * CTRL_WORDS;
    if (len <= short_max || kk == 0) return;
    const void* row = (const char*)scores + (long long)b * stride * (DT == 0 ? 4 : 2);
    if (hint != nullptr) {
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
        m = __reduce_min_sync(0xffffffffu, m);
        if ((threadIdx.x & 31) == 0) atomicMin(&gmin, m);
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
    } else if (threadIdx.x == 0) {
        u32 lb = (u32)__ldcg(&cr[C_LO]), mx = (u32)__ldcg(&cr[C_MAX]);
        unsigned long long span = mx > lb ? (unsigned long long)(mx - lb) : 0ull;
        for (int q = 0; q < 8; ++q) th[q] = lb + (u32)(span * q / 8);
    }
    if (threadIdx.x == 0) {
        u32 m = th[0];
        for (int q = 1; q < 8; ++q) m = th[q] < m ? th[q] : m;
        th[8] = m;
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
        int best = -1, best_count = 0, tot0 = 0;
        for (int q = 0; q < 8; ++q) {
            int tot = __ldcg(&tc[b * 8 + q]);
            tc[b * 8 + q] = 0;
            cr[C_TRIED + q] = (int)th[q];
            cr[C_TRIED + 8 + q] = tot;
            if (q == 0) tot0 = tot;
            if (tot >= kk && tot <= cap && (best < 0 || tot < best_count)) {
                best = q;
                best_count = tot;
            }
        }
        bool ready = tot0 >= kk && tot0 <= cap;
        if (ready) {
            best = 0;
            best_count = tot0;
        }
        cr[C_STATUS] = ready ? ST_READY : (best > 0 ? ST_COMPACT : ST_SEARCH);
        cr[C_PASS] = 0;
        cr[C_PREFIX] = 0;
        cr[C_NEED] = kk;
        cr[C_ABOVE] = 0;
        cr[C_LO] = best >= 0 ? (int)th[best] : 0;
        cr[C_COUNT] = best >= 0 ? best_count : len;
        cr[C_ROUNDS] = 1;
        cr[C_ARRIVED] = 0;
    }
}

// ---------------------------------------------------------------------------------------------
// the finishing block: one per row

template <int DT>
__global__ void __launch_bounds__(1024) finish_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int S, int segcap,
    int short_max, int multi, int keys_words, const int* ctrl, const int2* seg, const int* segcnt,
    int* out_idx, void* out_val, int* state, int state_words) {
    extern __shared__ int smem[];
    int* hist = smem;                   // HIST_BINS
    int* scratch = hist + HIST_BINS;    // 64
    u32* keys = (u32*)(scratch + 64);   // max(short_max, 2 cap)
    WarpCounts wk{keys + keys_words,                                   // BUF_WORDS keys
                  (unsigned char*)(keys + keys_words + BUF_WORDS),       // BUF_WORDS owners
                  (int*)(keys + keys_words + BUF_WORDS + BUF_WORDS / 4),  // 64 counts
                  BUF_WORDS};
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
    if (kk > 0 && status == -1) {  // the row in shared memory; digit pass 0 as it arrives
        for (int j = threadIdx.x; j < HIST_BINS; j += blockDim.x) hist[j] = 0;
        __syncthreads();
        hist_sweep<DT, SHORT_LOADS>(row, 0, len, pass_shift(0), HIST_BINS, 0u, 0u, hist, keys);
        __syncthreads();
        SmemKeys src{keys};
        bool wc = block_search(src, len, 0, 0u, kk, hist, scratch, &t, &ties, wk, true);
        block_emit<DT>(src, len, t, ties, oi, ov, row, scratch, wc ? wk.wc : nullptr);
    } else if (status == ST_READY) {  // the candidates, gathered in index order
        int cnt = threadIdx.x < S ? segcnt[b * S + threadIdx.x] : 0;
        int total;
        int off = block_exclusive_scan(cnt, scratch, &total);
        int* pfx = hist;  // the segments' offsets (S <= blockDim)
        if (threadIdx.x < S) pfx[threadIdx.x] = off;
        __syncthreads();
        int* ix = (int*)(keys + total);
        for (int p = threadIdx.x; p < total; p += blockDim.x) {
            int lo = 0, hi = S - 1;  // the last segment whose offset is <= p
            while (lo < hi) {
                int mid = (lo + hi + 1) >> 1;
                if (pfx[mid] <= p) lo = mid; else hi = mid - 1;
            }
            int2 e = seg[((long long)b * S + lo) * segcap + (p - pfx[lo])];
            keys[p] = (u32)e.x;
            ix[p] = e.y;
        }
        __syncthreads();
        SmemPairs src{keys, ix};
        bool wc = block_search(src, total, cr[C_PASS], (u32)cr[C_PREFIX], cr[C_NEED], hist,
                               scratch, &t, &ties, wk, false);
        block_emit<DT>(src, total, t, ties, oi, ov, row, scratch, wc ? wk.wc : nullptr);
        acc_key = (u32)cr[C_LO];
        acc_count = cr[C_COUNT];
        rounds = cr[C_ROUNDS];
    } else if (status == ST_EXACT) {  // T known, more than cap keys at it: from the row
        t = (u32)cr[C_PREFIX];
        ties = cr[C_NEED];
        GlobalRow<DT> src{row};
        block_emit<DT>(src, len, t, ties, oi, ov, row, scratch, nullptr);
        acc_key = t;
        acc_count = cr[C_COUNT];
        rounds = cr[C_ROUNDS];
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
