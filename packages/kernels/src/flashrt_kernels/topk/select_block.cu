// Exact top-K select in CUDA C++ (flashrt-kernels backend "cuda"; host side: cuda_select.py),
// part 1 of 2: keys and the block-wide search (part 2, select.cu: the passes and the kernels).
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
//   - rows of at most `short_max` elements: one block per row, the row's keys in shared memory
//     (fp32: all copies in flight at once, cp.async), digit pass 0 as they arrive; the keys in or
//     above pass 0's bucket are then compacted, in index order, into per-warp regions, and the
//     remaining passes and the emission read only those (a warp whose range holds more than its
//     region's slots sends the row through the passes over all its keys instead). One launch;
//   - longer rows: several blocks per row, one launch per pass over the row. The last block of a
//     row to finish a launch (an arrival counter; nobody waits for anybody) decides what the
//     row's next launch does:
//       1. a lower bound L on the K-th key: the row's elements fall into at least
//          G = 4 x pow2(k) disjoint groups, each inside one block's chunk (every block stores its
//          own maxima, no atomics); the k-th largest of the group maxima is <= the K-th largest,
//          and admits about 1.15 k keys on rows without structure (`bound_kernel`, hint-free) --
//          or, with a hint, the smallest current score at the hinted positions (a guess);
//       2. one pass counts eight thresholds from L upward exactly and compacts the keys >= L into
//          per-block segments (`count_kernel`). If that admits between k and `cap` keys the
//          candidates are ready; if another threshold does, the next launch compacts at it;
//       3. otherwise digit passes over the row narrow the K-th key's bucket until it and
//          everything above it hold at most `cap` keys, which one more step compacts: run by
//          helper blocks of the finishing launch where it fits one block an SM (they and the
//          finishing block wait for each step's published outcome), else by `step_kernel`
//          (three launches, no-ops for rows already done);
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
#define C_GEN 10     // publications of a step's outcome (helper blocks wait for the next one)
#define C_TRIED 16   // 8 keys (unsigned) then 8 exact counts

#define ST_SEARCH 0   // next step: another digit pass
#define ST_COMPACT 1  // next step: compact the keys >= LO
#define ST_READY 2    // the segments hold every key >= LO
#define ST_EXACT 3    // T is known (PREFIX), NEED ties; the finishing block writes from the row

#define HIST_BINS 4096
#define BOUND_GROUPS 8192  // most groups of the hint-free bound (2 x HIST_BINS)
#define BOUND_SLOTS (2 * BOUND_GROUPS)  // a row's group maxima: fewer than 2 BOUND_GROUPS
#define BOUND_BITS 11      // digit of the bound's histogram passes over the group maxima
#define BOUND_BINS (1 << BOUND_BITS)
#define BUF_WORDS 8192  // the finishing block's buffer for a narrowed bucket
#define AUX_WORDS (BUF_WORDS + BUF_WORDS / 4 + 64 + HIST_BINS + 256)  // + owners, warp counts,
                                                                  // a short row's pass 1 / 2 bins
#define SCRATCH_WORDS 96  // the finishing block's scratch: scans, warp counts, bucket results
#define TILE_ITEMS 8   // consecutive 32-element rows a warp covers per compaction tile
#define LOAD_ITEMS 16
#define HINT_ITEMS 8   // hinted positions per thread of a counting block (k <= 8 x 512)
#define RECOMPACT_BYTES 3000  // a candidate the finishing block need not rank saves about as much
                              // time as a re-read of this many bytes of the batch's rows costs
#define RECOMPACT_MIN 2048    // and a surplus of fewer candidates is not worth a pass at all
#define SHORT_LOADS 6  // loads in flight per thread as the finishing block reads a 16-bit row
#define REGION_SLOTS 128  // a warp's candidate slots when a short row is compacted
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

// The selected element's value from its key where the key names one bit pattern (fp32, and bf16,
// which widens by a shift: every key but those of the zeros, +0.0 / -0.0, and of the NaNs), else
// copied from the row (fp16, a zero, a NaN's payload): one dependent load less per emitted
// element, which the emission's loop otherwise waits for.
template <int DT>
__device__ __forceinline__ void write_value(void* out, long long pos, const void* row, int i,
                                            u32 key) {
    if (DT != 2 && key != 0x80000000u && key != 0xffffffffu) {
        int k = (int)(key ^ 0x80000000u);
        u32 f = (u32)(k < 0 ? k ^ 0x7fffffff : k);
        if (DT == 0) ((u32*)out)[pos] = f;
        else ((unsigned short*)out)[pos] = (unsigned short)(f >> 16);
    } else {
        copy_value<DT>(out, pos, row, i);
    }
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

// A full warp's 32 values ranked, largest first: `out[r]` = the value of rank r (ties by lane);
// 32 independent shuffles, no dependent exchange steps.
__device__ __forceinline__ void warp_rank_desc(u32 v, u32* out) {
    const int lane = threadIdx.x & 31;
    int rank = 0;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        const u32 o = __shfl_sync(0xffffffffu, v, j);
        rank += o > v || (o == v && j < lane);
    }
    out[rank] = v;
}

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

// Digit pass 0's increments for four keys a lane holds: a warp whose active lanes' keys all share
// one bin adds once, a lane whose four keys share one bin adds 4 at once, others add each key.
__device__ __forceinline__ void hist_add4(int* h, uint4 v, bool active) {
    const int shift = 20;  // pass_shift(0)
    const u32 b0 = v.x >> shift, b1 = v.y >> shift, b2 = v.z >> shift, b3 = v.w >> shift;
    const bool same = b0 == b1 && b0 == b2 && b0 == b3;
    u32 act = __ballot_sync(0xffffffffu, active);
    if (act == 0u) return;
    int leader = __ffs(act) - 1;
    u32 lb = __shfl_sync(0xffffffffu, b0, leader);
    if (__all_sync(0xffffffffu, !active || (same && b0 == lb))) {
        if ((int)(threadIdx.x & 31) == leader) atomicAdd(&h[lb], 4 * __popc(act));
    } else if (active) {
        if (same) {
            atomicAdd(&h[b0], 4);
        } else {
            atomicAdd(&h[b0], 1);
            atomicAdd(&h[b1], 1);
            atomicAdd(&h[b2], 1);
            atomicAdd(&h[b3], 1);
        }
    }
}

// The same increments, one atomic per distinct bin of a warp (__match_any_sync): for keys that
// sit in a few bins without a whole warp agreeing (the finishing block's candidates just above a
// bound), where per-lane atomics on a handful of addresses serialize. Not for whole rows: the
// match costs more than it saves where a warp's bins are mostly distinct. (Nor, as measured on
// the H200, for the bound's ranking of the group maxima: see docs/kernels/topk.md.)
__device__ __forceinline__ void hist_add_peers(int* h, u32 bin, bool active) {
    u32 act = __ballot_sync(0xffffffffu, active);
    if (!active) return;
    u32 peers = __match_any_sync(act, bin);
    if ((int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&h[bin], __popc(peers));
}

// Programmatic dependent launch (sm_90; the host launches the passes with the attribute where it
// can): every kernel waits for the previous grid's completion and memory before it touches global
// memory, then lets the next grid launch, whose blocks take free slots and wait in turn -- the
// launch latency of each pass overlaps the one before. Both are no-ops without the attribute.
__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The 128-byte lines of row[lo, hi) toward L2, one line per thread (no register waits for them):
// a pass issues this a fixed distance ahead of its loads, so that they find their lines in L2
// instead of each tile's loads paying the full DRAM latency between the block's barriers.
template <int DT>
__device__ __forceinline__ void prefetch_l2(const void* row, int lo, int hi) {
    const char* p = (const char*)row + (long long)lo * (DT == 0 ? 4 : 2);
    const int lines = ((hi - lo) * (DT == 0 ? 4 : 2) + 127) / 128;
    for (int j = threadIdx.x; j < lines; j += blockDim.x)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 128LL * j));
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

// The same search in two barriers (every thread calls; nb a multiple of the warps, at most
// 32 x 32 x 4 bins): warp w sums the bins of its nb / warps range, then every warp finds, from
// the warp totals, the warp whose range holds the need-th largest, and that warp finds the lane and
// the bin. out[0] = d, out[1] = count in the bins above d, out[2] = h[d]. scratch: the warp totals
// (32 ints); out must not overlap it, nor anything the block writes before its next barrier.
__device__ void find_bucket_warps(const int* h, int nb, int need, int* out, int* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int bw = nb / nw;                // bins per warp
    const int q = bw > 32 ? bw >> 5 : 1;   // bins per lane
    const int lb = warp * bw + lane * q;   // this lane's first bin
    int s = 0;
    if (lane * q < bw)
        for (int j = 0; j < q; ++j) s += h[lb + j];
    const int wsum = (int)__reduce_add_sync(0xffffffffu, (u32)s);
    if (lane == 0) scratch[warp] = wsum;
    __syncthreads();
    // suffix sums over the warps (bins ascend with the warp; ranks count from the largest key)
    const int t = lane < nw ? scratch[lane] : 0;
    int suf = t;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_down_sync(0xffffffffu, suf, o);
        if (lane + o < 32) suf += y;
    }
    const int ws = 31 - __clz(__ballot_sync(0xffffffffu, suf >= need));  // the warp with the bin
    if (warp == ws) {
        int lsuf = s;  // suffix over the lanes, plus every warp above
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_down_sync(0xffffffffu, lsuf, o);
            if (lane + o < 32) lsuf += y;
        }
        lsuf += __shfl_sync(0xffffffffu, suf, ws) - __shfl_sync(0xffffffffu, t, ws);
        const int ls = 31 - __clz(__ballot_sync(0xffffffffu, lsuf >= need));
        if (lane == ls) {
            int acc = lsuf - s;  // the bins above this lane's
            for (int j = q - 1; j >= 0; --j) {
                const int c = h[lb + j];
                if (acc + c >= need) {
                    out[0] = lb + j;
                    out[1] = acc;
                    out[2] = c;
                    break;
                }
                acc += c;
            }
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

struct SmemKeys {  // a short row's keys in shared memory (a cluster block's: from `base` on)
    const u32* k;
    int base = 0;
    __device__ u32 key(int i) const { return k[i]; }
    __device__ int index(int i) const { return base + i; }
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
            bool in = i < count && (u & mask) == pre;
            hist_add(hist, (u >> shift) & (u32)(nb - 1), in);
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
// the first pass. (A short row whose candidates overflow the per-warp regions; a long row's
// gathered candidates, at most CAP, take smem_search's sweeps instead.)
template <class Src>
__device__ bool block_search(const Src& src, int count, int pass, u32 prefix, int need, int* hist,
                             int* scratch, u32* t_out, int* ties_out, WarpCounts wk,
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
            write_value<DT>(out_val, pos, row, idx, u);
        }
        g += __popc(mg);
        e += __popc(me);
    }
}


// ---------------------------------------------------------------------------------------------
// a short row in the finishing block

// A 4-byte asynchronous copy global -> shared (cp.async: no register holds the value, so every
// copy of the row is in flight at once) and the wait for all of this thread's copies.
__device__ __forceinline__ void cp_async4(u32* dst, const u32* src) {
    u32 s;
    asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
                 : "=r"(s) : "l"(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(src) : "memory");
}

// The same for 16 bytes (four fp32 elements; both addresses 16-byte aligned), through L2 only.
__device__ __forceinline__ void cp_async16(u32* dst, const u32* src) {
    u32 s;
    asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
                 : "=r"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// The keys of row[0, len) into keys[], and digit pass 0's histogram of them into hist (zeroed
// here, as are hist1 and hist2 for passes 1 and 2). fp32 rows are copied asynchronously, all at
// once, then turned into keys in place (each thread converts the elements it copied); 16-bit rows
// load SHORT_LOADS per thread at a time.
template <int DT>
__device__ void load_short_row(const void* row, int len, u32* keys, int* hist, int* hist1,
                               int* hist2) {
    if (DT == 0) {  // 16-byte copies where the row starts on 16 bytes (keys[] always does)
        const u32* src = (const u32*)row;
        const int vec = ((unsigned long long)src & 15u) == 0u ? len >> 2 : 0;
        for (int i = threadIdx.x; i < vec; i += blockDim.x) cp_async16(keys + 4 * i, src + 4 * i);
        for (int i = 4 * vec + threadIdx.x; i < len; i += blockDim.x) cp_async4(keys + i, src + i);
    }
    for (int j = threadIdx.x; j < HIST_BINS; j += blockDim.x) {
        hist[j] = 0;
        hist1[j] = 0;
    }
    if (threadIdx.x < 256) hist2[threadIdx.x] = 0;
    if (DT == 0) cp_async_wait_all();
    __syncthreads();
    if (DT == 0) {  // four keys a thread at a time (16-byte shared accesses), then the tail
        const int len4 = len >> 2;
        uint4* k4 = (uint4*)keys;
        for (int base = 0; base < len4; base += blockDim.x) {
            const int g = base + threadIdx.x;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (g < len4) {
                v = k4[g];
                v.x = key_of_f32_bits(v.x);
                v.y = key_of_f32_bits(v.y);
                v.z = key_of_f32_bits(v.z);
                v.w = key_of_f32_bits(v.w);
                k4[g] = v;
            }
            hist_add4(hist, v, g < len4);
        }
        if (threadIdx.x < 32) {
            const int i = 4 * len4 + threadIdx.x;
            u32 u = 0u;
            if (i < len) {
                u = key_of_f32_bits(keys[i]);
                keys[i] = u;
            }
            hist_add(hist, u >> pass_shift(0), i < len);
        }
    } else {
        hist_sweep<DT, SHORT_LOADS>(row, 0, len, pass_shift(0), HIST_BINS, 0u, 0u, hist, keys);
    }
    __syncthreads();
}

// Ordered compaction of the keys >= lo_key of keys[0, count) into per-warp regions: warp w keeps
// those of its warp_range, in index order, at ck / ci[w * REGION_SLOTS ..], and the unused slots
// of its region get key 0 (below every real key: no digit pass counts it, emission skips it).
// The regions in warp order are then the candidates in index order, a source of nw *
// REGION_SLOTS entries (SmemPairs). Returns false (every thread) when some warp has more than
// REGION_SLOTS of them; keys[] is left as it was either way. Indices are stored as base + i.
__device__ bool compact_regions(const u32* keys, int count, u32 lo_key, u32* ck, int* ci,
                                int base_index) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 below = (1u << lane) - 1u;
    u32* my_k = ck + warp * REGION_SLOTS;
    int* my_i = ci + warp * REGION_SLOTS;
    int lo, hi, pos = 0;
    warp_range(count, &lo, &hi);  // lo: a multiple of 32, so keys + i0 is 16-byte aligned
    for (int base = lo; base < hi; base += 128) {  // four consecutive keys a lane
        const int i0 = base + 4 * lane;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (i0 + 3 < hi) {
            v = *(const uint4*)(keys + i0);
        } else {
            if (i0 < hi) v.x = keys[i0];
            if (i0 + 1 < hi) v.y = keys[i0 + 1];
            if (i0 + 2 < hi) v.z = keys[i0 + 2];
        }
        const u32 u[4] = {v.x, v.y, v.z, v.w};
        bool sel[4];
        int before = 0, all = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            sel[j] = i0 + j < hi && u[j] >= lo_key;
            const u32 bal = __ballot_sync(0xffffffffu, sel[j]);
            before += __popc(bal & below);  // selected keys of the lanes before (index order)
            all += __popc(bal);
        }
        int p = pos + before;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (sel[j]) {
                if (p < REGION_SLOTS) {
                    my_k[p] = u[j];
                    my_i[p] = base_index + i0 + j;
                }
                ++p;
            }
        }
        pos += all;
    }
    for (int p = pos + lane; p < REGION_SLOTS; p += 32) my_k[p] = 0u;
    return !__syncthreads_or(pos > REGION_SLOTS);
}

// The emission of a short row from its candidate regions (compact_regions: warp w's
// REGION_SLOTS = 4 x 32 slots, in index order, unused slots key 0): block_emit's selection and
// positions, with each lane taking four consecutive slots (16-byte shared loads; ck and ci start
// on 16 bytes) instead of four steps of one slot.
static_assert(REGION_SLOTS == 4 * 32, "emit_regions: four slots a lane");

template <int DT>
__device__ void emit_regions(const u32* ck, const int* ci, u32 t, int ties, int* out_idx,
                             void* out_val, const void* row, int* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int s0 = warp * REGION_SLOTS + 4 * lane;
    const uint4 kv = *(const uint4*)(ck + s0);
    const int4 iv = *(const int4*)(ci + s0);
    const u32 u[4] = {kv.x, kv.y, kv.z, kv.w};
    const int id[4] = {iv.x, iv.y, iv.z, iv.w};
    int gt_l = 0, eq_l = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        gt_l += u[j] > t;
        eq_l += u[j] == t;
    }
    const int gt_w = (int)__reduce_add_sync(0xffffffffu, (u32)gt_l);
    const int eq_w = (int)__reduce_add_sync(0xffffffffu, (u32)eq_l);
    int g, e, gtot, etot;
    warp_offsets(gt_w, eq_w, scratch, &g, &e, &gtot, &etot);
    int gb = g + warp_inclusive_scan(gt_l) - gt_l;  // keys > t before this lane's slots
    int eb = e + warp_inclusive_scan(eq_l) - eq_l;  // keys == t before them
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const bool is_gt = u[j] > t, is_eq = u[j] == t;
        if (is_gt || (is_eq && eb < ties)) {
            const int pos = gb + (eb < ties ? eb : ties);
            out_idx[pos] = id[j];
            write_value<DT>(out_val, pos, row, id[j], u[j]);
        }
        gb += is_gt;
        eb += is_eq;
    }
}

// A pass's histogram complete for the whole block (BlockSum: a barrier), or summed over a cluster
// (select.cu's ClusterSum), before its bucket search.
struct BlockSum {
    __device__ void operator()(int*, int) const { __syncthreads(); }
};

// Digit passes `pass`..2 (pass 1 or 2) over candidates in shared memory (src[0..count)): each
// one sweep into its own histogram (hist1: HIST_BINS, hist2: 256, zeroed before the call), then
// `sum` (hist, bins) and a two-barrier bucket search, with the results in scratch slots of their
// own (SCRATCH_WORDS: 64..75), so no barrier guards a reuse. prefix / need: the bucket found
// before `pass` and the rank still needed in it. T and the ties to keep out. Used for a short
// row's compacted candidates (from pass 1), a long row's gathered ones (from where the passes
// left it) and a cluster block's part. `peers`: pass 1 counts with one atomic per distinct bin
// of a warp (candidates just above a bound, whose digits may share a few bins: 16-bit rows have
// 4 bits of this digit).
template <class Src, class Sum = BlockSum>
__device__ void smem_search(const Src& src, int count, int pass, u32 prefix, int need,
                            int* hist1, int* hist2, int* scratch, u32* t_out, int* ties_out,
                            bool peers, Sum sum = Sum()) {
    if (pass <= 1) {
        for (int base = 0; base < count; base += blockDim.x) {
            const int i = base + threadIdx.x;
            const u32 u = i < count ? src.key(i) : 0u;
            const u32 bin = (u >> pass_shift(1)) & (u32)(HIST_BINS - 1);
            const bool in = i < count && (u & pass_mask(1)) == prefix;
            if (peers) hist_add_peers(hist1, bin, in);
            else hist_add(hist1, bin, in);
        }
        sum(hist1, HIST_BINS);
        find_bucket_warps(hist1, HIST_BINS, need, scratch + 68, scratch);
        prefix |= (u32)scratch[68] << pass_shift(1);
        need -= scratch[69];
    }
    for (int base = 0; base < count; base += blockDim.x) {
        const int i = base + threadIdx.x;
        const u32 u = i < count ? src.key(i) : 0u;
        hist_add(hist2, u & 255u, i < count && (u & pass_mask(2)) == prefix);
    }
    sum(hist2, 256);
    find_bucket_warps(hist2, 256, need, scratch + 72, scratch);
    *t_out = prefix | (u32)scratch[72];
    *ties_out = need - scratch[73];
}
