// Exact top-K select, part 2 of 2: the multi-block passes and the kernels (part 1, select_block.cu,
// holds the keys and the block-wide search; cuda_select.source() joins them, part 1 first).

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
    if (lo + tile < hi) prefetch_l2<DT>(row, lo + tile, min(lo + 2 * tile, hi));
    for (int base = lo; base < hi; base += tile) {
        if (base + 2 * tile < hi)  // two tiles ahead
            prefetch_l2<DT>(row, base + 2 * tile, min(base + 3 * tile, hi));
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

// Arrival: true in the last block of row b to get here (after its global writes are fenced). A
// block that did `weight` of the row's `blocks` chunks arrives for all of them at once.
__device__ bool last_to_arrive(int* ctrl_row, int blocks, int* flag, int weight = 1) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        *flag = atomicAdd(&ctrl_row[C_ARRIVED], weight) + weight == blocks;
    __syncthreads();
    bool last = *flag;
    if (last) __threadfence();
    return last;
}

__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(int* p, int v) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// A step's outcome, by thread 0 of the row's last block once the fields it names are written
// (and the block's other global writes fenced before a barrier): the arrivals reset, the status,
// then the next generation. Each store releases the ones before it, so a block that acquires the
// generation (a helper) or the status (the finishing block) reads the fields of this outcome.
__device__ void publish(int* cr, int status) {
    cr[C_ARRIVED] = 0;
    store_release(&cr[C_STATUS], status);
    store_release(&cr[C_GEN], (int)((u32)__ldcg(&cr[C_GEN]) + 1u));
}

// The lower bound L on the K-th key. The row's elements fall into M disjoint groups, each inside
// one block's chunk: element lo + p of block c (p < chunk) is in group (c, p mod Gb), where
// G = 4x the power of two >= kk (at most BOUND_GROUPS) and Gb = G / (the power of two <= the
// row's S_row nonempty blocks), at least 1, so that M = S_row Gb >= G (= G when S_row is a power
// of two <= G; else < 2 G, or S_row <= 1024 when Gb = 1). The kk-th largest of the M group
// maxima is <= the K-th key (kk distinct groups each hold an element at least that large).
// Every block stores its own Gb maxima with plain stores (no atomics between blocks, which
// contended in L2: S x G of them on G addresses); the row's last block finds the kk-th largest
// of the M values to 2 x BOUND_BITS bits below the bits they all share by two histogram passes,
// and that bucket's lower edge is the bound. On rows without structure it admits about 1.15 kk
// keys (kk <= 1024; 1.39 kk at kk = 4096); a row sorted by value admits about a quarter of
// itself (its top kk lie in a few blocks: exact all the same, by the later passes). Chunks are
// multiples of the tile (TILE_ITEMS x 512 = HIST_BINS): thread t at item q of a tile is in group
// (c, (tile parity x tile + q 512 + t) mod Gb), the same partition up to the groups' names.
// gmax [BOUND_SLOTS] per row: block c's maxima at [c Gb, (c + 1) Gb), each written by every call
// that reads it (nothing to zero).
template <int DT>
__global__ void __launch_bounds__(512) bound_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int chunk, int S,
    int short_max, int* ctrl, int* gmax_all) {
    __shared__ u32 grp[BOUND_GROUPS];  // this block's group maxima; in the last block, the row's
    __shared__ int bins[BOUND_BINS];
    __shared__ int scratch[64];
    grid_dependency_wait();
    int b = blockIdx.y, c = blockIdx.x;
    int len = row_length(lengths, b, n);
    int kk = k < len ? k : len;
    if (len <= short_max || kk == 0) return;
    int* cr = ctrl + (long long)b * CTRL_WORDS;
    int* gmax = gmax_all + (long long)b * BOUND_SLOTS;
    const void* row = (const char*)scores + (long long)b * stride * (DT == 0 ? 4 : 2);
    const int tile = blockDim.x * TILE_ITEMS;  // == HIST_BINS
    int G = 1;
    while (G < kk) G <<= 1;
    G = 4 * G < BOUND_GROUPS ? 4 * G : BOUND_GROUPS;
    const int s_row = (len + chunk - 1) / chunk;
    int P = 1;
    while (2 * P <= s_row) P <<= 1;
    const int Gb = G > P ? G / P : 1, M = s_row * Gb;
    for (int j = threadIdx.x; j < Gb; j += blockDim.x) grp[j] = 0u;
    __syncthreads();
    int lo = c * chunk, hi = lo + chunk < len ? lo + chunk : len;
    u32 mx[2][TILE_ITEMS];  // by the tile's parity (Gb = 2 tiles), else all in mx[0]
#pragma unroll
    for (int q = 0; q < TILE_ITEMS; ++q) mx[0][q] = mx[1][q] = 0u;
    const bool two = Gb > tile;
    if (lo + tile < hi) prefetch_l2<DT>(row, lo + tile, min(lo + 2 * tile, hi));
    for (int base = lo; base < hi; base += tile) {
        if (base + 2 * tile < hi)  // two tiles ahead
            prefetch_l2<DT>(row, base + 2 * tile, min(base + 3 * tile, hi));
        u32 u[TILE_ITEMS];
        load_strided<DT, TILE_ITEMS>(row, base, hi, u);
        if (two && ((base / tile) & 1)) {
#pragma unroll
            for (int q = 0; q < TILE_ITEMS; ++q) mx[1][q] = u[q] > mx[1][q] ? u[q] : mx[1][q];
        } else {
#pragma unroll
            for (int q = 0; q < TILE_ITEMS; ++q) mx[0][q] = u[q] > mx[0][q] ? u[q] : mx[0][q];
        }
    }
    if (Gb <= (int)blockDim.x) {  // all of a thread's items are in group t mod Gb
        u32 m = mx[0][0];
#pragma unroll
        for (int q = 1; q < TILE_ITEMS; ++q) m = mx[0][q] > m ? mx[0][q] : m;
        for (int o = 16; o >= Gb; o >>= 1) {  // lanes of one group (Gb < 32)
            u32 y = __shfl_xor_sync(0xffffffffu, m, o);
            m = y > m ? y : m;
        }
        if (m && (Gb >= 32 || (int)(threadIdx.x & 31) < Gb))
            atomicMax(&grp[threadIdx.x & (Gb - 1)], m);
    } else if (Gb < tile) {  // items q and q + Gb / 512 share a group
#pragma unroll
        for (int q = 0; q < TILE_ITEMS; ++q)
            if (mx[0][q]) atomicMax(&grp[(threadIdx.x + q * blockDim.x) & (Gb - 1)], mx[0][q]);
    } else {  // one group per item (and tile parity)
#pragma unroll
        for (int q = 0; q < TILE_ITEMS; ++q) {
            const int g = threadIdx.x + q * blockDim.x;
            grp[g] = mx[0][q];
            if (two) grp[tile + g] = mx[1][q];
        }
    }
    __syncthreads();
    if (c < s_row)
        for (int j = threadIdx.x; j < Gb; j += blockDim.x) gmax[c * Gb + j] = (int)grp[j];
    if (!last_to_arrive(cr, S, scratch + 48)) return;
    // the row's last block: the M maxima (key 0: a group without elements) through grp, at once
    // when they fit, else BOUND_GROUPS at a time in every pass. First their range: the bits that
    // all nonzero maxima share need no pass, so the two passes of BOUND_BINS-bin histograms
    // take the BOUND_BITS-bit digits below them (digits that spread over the bins, where the
    // top bits of a row's maxima fell into a handful and their increments serialized)
    const bool staged = M <= BOUND_GROUPS;
    u32 lmax = 0u, lmin = 0xffffffffu;
    int nnz = 0;
    for (int j = threadIdx.x; j < M; j += blockDim.x) {
        const u32 v = (u32)__ldcg(&gmax[j]);
        if (staged) grp[j] = v;
        lmax = v > lmax ? v : lmax;
        lmin = v && v < lmin ? v : lmin;
        nnz += v != 0u;
    }
    lmax = __reduce_max_sync(0xffffffffu, lmax);
    lmin = __reduce_min_sync(0xffffffffu, lmin);
    nnz = (int)__reduce_add_sync(0xffffffffu, (u32)nnz);
    if (threadIdx.x == 0) {
        scratch[56] = 0;
        scratch[57] = (int)0xffffffffu;
        scratch[58] = 0;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        atomicMax((u32*)&scratch[56], lmax);
        atomicMin((u32*)&scratch[57], lmin);
        atomicAdd(&scratch[58], nnz);
    }
    __syncthreads();
    lmax = (u32)scratch[56];
    lmin = (u32)scratch[57];
    nnz = scratch[58];
    // fewer than kk nonzero maxima: the kk-th largest is an empty group's 0, and so is L
    u32 prefix = 0u, mask = 0u;
    int need = kk, rest = 0;  // key bits below the prefix still to search
    if (nnz >= kk) {
        rest = lmin == lmax ? 0 : 32 - __clz(lmin ^ lmax);
        mask = rest == 32 ? 0u : ~((1u << rest) - 1u);
        prefix = lmax & mask;
    }
#pragma unroll 1
    for (int pass = 0; pass < 2 && rest > 0; ++pass) {
        const int w = rest < BOUND_BITS ? rest : BOUND_BITS, shift = rest - w;
        const u32 digit = (1u << w) - 1u;
        for (int j = threadIdx.x; j < BOUND_BINS; j += blockDim.x) bins[j] = 0;
        __syncthreads();
#pragma unroll 1
        for (int h = 0; h < M; h += BOUND_GROUPS) {
            const int m = M - h < BOUND_GROUPS ? M - h : BOUND_GROUPS;
            if (!staged) {
                __syncthreads();  // the previous part is counted
                for (int j = threadIdx.x; j < m; j += blockDim.x)
                    grp[j] = (u32)__ldcg(&gmax[h + j]);
                __syncthreads();
            }
            for (int base = 0; base < m; base += blockDim.x) {
                int j = base + threadIdx.x;
                u32 v = j < m ? grp[j] : 0u;
                hist_add(bins, (v >> shift) & digit, j < m && (v & mask) == prefix);
            }
        }
        __syncthreads();
        find_bucket_warps(bins, BOUND_BINS, need, scratch + 40, scratch);  // bins hold >= need
        prefix |= (u32)scratch[40] << shift;
        mask |= digit << shift;
        need -= scratch[41];
        rest = shift;
    }
    if (threadIdx.x == 0) {
        cr[C_LO] = (int)prefix;
        cr[C_MAX] = (int)lmax;
        cr[C_ARRIVED] = 0;
    }
}

// Digit pass `pass` over [lo, hi) of the row into the row's histogram ghist (counted in sh first).
template <int DT>
__device__ void hist_count(const void* row, int lo, int hi, int pass, u32 prefix, int* ghist,
                           int* sh) {
    const int shift = pass_shift(pass), nb = pass_bins(pass);
    for (int j = threadIdx.x; j < nb; j += blockDim.x) sh[j] = 0;
    __syncthreads();
    hist_sweep<DT, LOAD_ITEMS>(row, lo, hi, shift, nb, pass_mask(pass), prefix, sh, nullptr);
    __syncthreads();
    for (int j = threadIdx.x; j < nb; j += blockDim.x)
        if (sh[j]) atomicAdd(&ghist[j], sh[j]);
}

// The row's last block after digit pass `pass`: the bucket of the need-th key in the row's
// histogram (which it leaves zeroed for the next pass / call), and what comes next, published.
__device__ void pass_decide(int pass, int* cr, int* ghist, int cap, int* sh, int* scratch) {
    const u32 prefix = (u32)__ldcg(&cr[C_PREFIX]);
    const int need = __ldcg(&cr[C_NEED]), above = __ldcg(&cr[C_ABOVE]);
    const int shift = pass_shift(pass), nb = pass_bins(pass);
    for (int j = threadIdx.x; j < nb; j += blockDim.x) {
        sh[j] = __ldcg(&ghist[j]);
        ghist[j] = 0;  // zero for the next pass / call
    }
    __threadfence();
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
        cr[C_ROUNDS] = __ldcg(&cr[C_ROUNDS]) + 1;
        cr[C_LO] = (int)np;
        cr[C_COUNT] = count_ge;
        publish(cr, pass == 2 ? ST_EXACT : (count_ge <= cap ? ST_COMPACT : ST_SEARCH));
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
    grid_dependency_wait();
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
        const int pass = __ldcg(&cr[C_PASS]);
        int* gh = ghist + (long long)b * HIST_BINS;
        hist_count<DT>(row, lo, hi, pass, (u32)__ldcg(&cr[C_PREFIX]), gh, sh);
        if (last_to_arrive(cr, S, scratch + 48)) pass_decide(pass, cr, gh, cap, sh, scratch);
    } else {
        u32 lo_key = (u32)__ldcg(&cr[C_LO]);
        int2* my = seg + ((long long)b * S + c) * segcap;
        int cnt = block_compact<DT, false>(row, lo, hi, lo_key, my, segcap, nullptr, nullptr,
                                           scratch);
        if (threadIdx.x == 0) segcnt[b * S + c] = cnt;
        if (last_to_arrive(cr, S, scratch + 48) && threadIdx.x == 0) publish(cr, ST_READY);
    }
}

__device__ __forceinline__ u32 sat_add(u32 a, int d) {
    long long v = (long long)a + d;
    return v < 0 ? 0u : (v > 0xffffffffLL ? 0xffffffffu : (u32)v);
}

// The counting pass: eight thresholds counted exactly, the keys >= the first compacted.
// Hint-free, the thresholds run from the bound L to the row's largest key. With a hint, the
// first is the smallest current score at the hinted positions (at least k keys reach it when
// the hint names k valid positions); then six of a sample of 32 hinted positions spread over the
// hint, at sample ranks 31, 29, 27, 25, 23 and 20 (about 0.97 ... 0.66 of the hint's keys reach
// each): on rows that drifted since the hint, the smallest hinted score falls far and admits many
// times k keys, while one of these stays near k; last, the previous step's K-th key when `state`
// holds a valid row of the same k, else a step below the guess.
template <int DT>
__global__ void __launch_bounds__(512) count_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int chunk, int S,
    int cap, int segcap, int short_max, const int* hint, const int* state, int state_words,
    int* ctrl, int* tc, int2* seg, int* segcnt) {
    __shared__ int scratch[64];
    __shared__ u32 th[9];
    __shared__ int cnt8[8];
    __shared__ u32 gmin;
    __shared__ u32 ladder[32];
    grid_dependency_wait();
    int b = blockIdx.y, c = blockIdx.x;
    int len = row_length(lengths, b, n);
    int kk = k < len ? k : len;
    int* cr = ctrl + (long long)b * CTRL_WORDS;
    if (len <= short_max || kk == 0) return;
    const void* row = (const char*)scores + (long long)b * stride * (DT == 0 ? 4 : 2);
    int lo = c * chunk, hi = lo + chunk < len ? lo + chunk : len;
    if (lo > hi) lo = hi;
    if (hint != nullptr) {
        // the chunk's first two tiles start toward L2 now, while the guess is gathered (no
        // bound pass read the row before this one); the compaction prefetches the later ones
        // (all of a chunk at once overflowed L2 at large B x N: 64 MB at B = 64, N = 256k)
        prefetch_l2<DT>(row, lo, min(lo + 2 * (int)blockDim.x * TILE_ITEMS, hi));
        if (threadIdx.x == 0) gmin = 0xffffffffu;
        __syncthreads();
        // every hinted position first, then every score at them (k <= HINT_ITEMS x 512): two
        // round trips to memory, not two per position a thread reads
        int hs[HINT_ITEMS];
#pragma unroll
        for (int q = 0; q < HINT_ITEMS; ++q) {
            const int j = threadIdx.x + q * blockDim.x;
            hs[q] = j < k ? __ldg(&hint[(long long)b * k + j]) : -1;
        }
        // the sample: 32 positions evenly spaced over the hint (whatever order it lists them in)
        const int sp = threadIdx.x < 32
                           ? __ldg(&hint[(long long)b * k + (long long)threadIdx.x * k / 32])
                           : -1;
        u32 m = 0xffffffffu;
#pragma unroll
        for (int q = 0; q < HINT_ITEMS; ++q) {
            if (hs[q] >= 0 && hs[q] < len) {
                u32 u = load_key<DT>(row, hs[q]);
                m = u < m ? u : m;
            }
        }
        m = __reduce_min_sync(0xffffffffu, m);
        if ((threadIdx.x & 31) == 0) atomicMin(&gmin, m);
        if (threadIdx.x < 32)  // warp 0 ranks the sample, largest first (key 0: not valid)
            warp_rank_desc(sp >= 0 && sp < len ? load_key<DT>(row, sp) : 0u, ladder);
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 g = gmin, last = sat_add(g, -(1 << 17));
            if (state != nullptr) {
                const int* s = state + (long long)b * state_words;
                if (s[STATE_VALID] == 1 && s[STATE_K] == k) last = (u32)s[STATE_KTH] ^ 0x80000000u;
            }
            th[0] = g;
            th[1] = ladder[31];
            th[2] = ladder[29];
            th[3] = ladder[27];
            th[4] = ladder[25];
            th[5] = ladder[23];
            th[6] = ladder[20];
            th[7] = last;
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
    int2* my = seg + ((long long)b * S + c) * segcap;
    int cnt = block_compact<DT, true>(row, lo, hi, th[0], my, segcap, th, cnt8, scratch);
    if (threadIdx.x == 0) segcnt[b * S + c] = cnt < segcap ? cnt : segcap;
    if (threadIdx.x < 8) atomicAdd(&tc[b * 8 + threadIdx.x], cnt8[threadIdx.x]);
    if (!last_to_arrive(cr, S, scratch + 48)) return;
    if (threadIdx.x < 8) {  // the eight totals at once (one loop of loads and stores would wait
        // for each load in turn: the stores might alias the next)
        const int tot = __ldcg(&tc[b * 8 + threadIdx.x]);
        tc[b * 8 + threadIdx.x] = 0;
        cr[C_TRIED + threadIdx.x] = (int)th[threadIdx.x];
        cr[C_TRIED + 8 + threadIdx.x] = tot;
        cnt8[threadIdx.x] = tot;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int best = -1, best_count = 0, tot0 = 0;
        for (int q = 0; q < 8; ++q) {
            int tot = cnt8[q];
            if (q == 0) tot0 = tot;
            if (tot >= kk && tot <= cap && (best < 0 || tot < best_count)) {
                best = q;
                best_count = tot;
            }
        }
        // the keys >= th[0] are compacted already; a threshold admitting far fewer keys is
        // worth one more compaction pass (its launch runs anyway) when the surplus costs the
        // finishing block more than a re-read of the batch's rows costs (measured on drifting
        // chains, docs/kernels/topk.md: small batches gain, B = 64 at 256k lost)
        const long long batch_bytes = (long long)gridDim.y * len * (DT == 0 ? 4 : 2);
        const int surplus = tot0 - best_count;
        const bool recompact = best > 0 && surplus > RECOMPACT_MIN &&
                               (long long)surplus * RECOMPACT_BYTES > batch_bytes;
        bool ready = tot0 >= kk && tot0 <= cap && !recompact;
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

// The end of a row's call, by the block(s) that wrote its selection: the pads past kk and the
// published state (s: the row's state words, or nullptr). `tried` is thread q's word q of the
// counting pass's thresholds and counts (q < 16; read where rounds > 0).
template <int DT>
__device__ void row_end(int* oi, void* ov, int kk, int k, int* s, u32 t, u32 acc_key,
                        int acc_count, int rounds, int tried, int len) {
    for (int j = kk + threadIdx.x; j < k; j += blockDim.x) {
        oi[j] = -1;
        write_pad<DT>(ov, j);
    }
    if (s != nullptr && threadIdx.x < 16) {  // the tried thresholds, one word per thread
        const int q = threadIdx.x & 7, v = rounds > 0 ? tried : 0;
        if (threadIdx.x < 8) s[STATE_TRIED_KEY + q] = rounds > 0 ? (int)((u32)v ^ 0x80000000u) : 0;
        else s[STATE_TRIED_COUNT + q] = v;
    }
    if (s != nullptr && threadIdx.x == 0) {
        s[STATE_VALID] = kk > 0;
        s[STATE_KTH] = kk > 0 ? (int)(t ^ 0x80000000u) : 0;
        s[STATE_ACC_KEY] = (int)(acc_key ^ 0x80000000u);
        s[STATE_ACC_COUNT] = kk > 0 ? acc_count : 0;
        s[STATE_N_TRIED] = rounds > 0 ? 8 : 0;
        s[STATE_ROUNDS] = rounds;
        s[STATE_LENGTH] = len;
        s[STATE_K] = k;
    }
}

// The steps of a row that the counting pass did not settle, by helper h of H blocks of the
// finishing launch (every block of that launch holds an SM of its own, so all are resident at
// once and may wait on each other). The helper takes chunks [c0, c1) of the row's S (contiguous:
// one sweep for a digit pass, and one arrival for all of them), does what the status says, then
// waits for the step's outcome (the generation after the one it saw) and goes on until the row
// is ready: the separate step launches' work without their launches.
template <int DT>
__device__ void helper_steps(const void* row, int len, int chunk, int S, int cap, int segcap,
                             int* cr, int* ghist, int2* seg, int* segcnt, int h, int H, int* sh,
                             int* scratch) {
    const int c0 = h * S / H, c1 = (h + 1) * S / H;
    if (c0 == c1) return;
    const int lo = c0 * chunk < len ? c0 * chunk : len, hi = c1 * chunk < len ? c1 * chunk : len;
    for (;;) {
        if (threadIdx.x == 0) {
            scratch[90] = load_acquire(&cr[C_GEN]);  // then the status of that outcome or later
            scratch[91] = __ldcg(&cr[C_STATUS]);
        }
        __syncthreads();
        const int gen = scratch[90], status = scratch[91];
        if (status != ST_SEARCH && status != ST_COMPACT) return;
        if (status == ST_SEARCH) {
            const int pass = __ldcg(&cr[C_PASS]);
            hist_count<DT>(row, lo, hi, pass, (u32)__ldcg(&cr[C_PREFIX]), ghist, sh);
            if (last_to_arrive(cr, S, scratch + 48, c1 - c0))
                pass_decide(pass, cr, ghist, cap, sh, scratch);
        } else {
            const u32 lo_key = (u32)__ldcg(&cr[C_LO]);
            for (int c = c0; c < c1; ++c) {
                const int a = c * chunk < len ? c * chunk : len;
                const int e = a + chunk < len ? a + chunk : len;
                int cnt = block_compact<DT, false>(row, a, e, lo_key, seg + (long long)c * segcap,
                                                   segcap, nullptr, nullptr, scratch);
                if (threadIdx.x == 0) segcnt[c] = cnt;
                __syncthreads();
            }
            if (last_to_arrive(cr, S, scratch + 48, c1 - c0) && threadIdx.x == 0)
                publish(cr, ST_READY);
        }
        if (threadIdx.x == 0)
            while (load_acquire(&cr[C_GEN]) == gen) __nanosleep(64);
        __syncthreads();
    }
}

template <int DT>
__global__ void __launch_bounds__(1024, 1) finish_kernel(  // (1: else ptxas caps it at 32 regs)
    const void* scores, long long stride, const int* lengths, int n, int k, int S, int segcap,
    int short_max, int multi, int keys_words, int* ctrl, int2* seg, int* segcnt, int* out_idx,
    void* out_val, int* state, int state_words, int chunk, int cap, int helpers, int* ghist) {
    extern __shared__ __align__(16) int smem[];
    int* hist = smem;                   // HIST_BINS
    int* scratch = hist + HIST_BINS;    // SCRATCH_WORDS
    u32* keys = (u32*)(scratch + SCRATCH_WORDS);  // max(short_max, 2 cap)
    WarpCounts wk{keys + keys_words,                                   // BUF_WORDS keys
                  (unsigned char*)(keys + keys_words + BUF_WORDS),       // BUF_WORDS owners
                  (int*)(keys + keys_words + BUF_WORDS + BUF_WORDS / 4),  // 64 counts
                  BUF_WORDS};
    grid_dependency_wait();
    int b = blockIdx.y;  // blockIdx.x: 0 the finishing block, 1..helpers the row's helpers
    int len = row_length(lengths, b, n);
    int kk = k < len ? k : len;
    int* cr = ctrl + (long long)b * CTRL_WORDS;
    const void* row = (const char*)scores + (long long)b * stride * (DT == 0 ? 4 : 2);
    const bool long_row = len > short_max && kk > 0 && multi;
    if (blockIdx.x > 0) {
        if (long_row)
            helper_steps<DT>(row, len, chunk, S, cap, segcap, cr, ghist + (long long)b * HIST_BINS,
                             seg + (long long)b * S * segcap, segcnt + b * S, blockIdx.x - 1,
                             helpers, hist, scratch);
        return;
    }
    if (long_row && helpers > 0) {  // wait for the helpers' outcome
        if (threadIdx.x == 0) {
            int s = load_acquire(&cr[C_STATUS]);
            for (; s == ST_SEARCH || s == ST_COMPACT; s = load_acquire(&cr[C_STATUS]))
                __nanosleep(64);
        }
        __syncthreads();
    }
    int* oi = out_idx + (long long)b * k;
    void* ov = (char*)out_val + (long long)b * k * (DT == 0 ? 4 : 2);
    // a long row's status and segment counts, loaded together (the counts are read only when
    // the status says READY)
    const int cnt = long_row && (int)threadIdx.x < S ? __ldcg(&segcnt[b * S + threadIdx.x]) : 0;
    const int status = long_row ? __ldcg(&cr[C_STATUS]) : -1;
    // the counting pass's thresholds and counts for the state (used where rounds > 0), early
    const int tried = long_row && threadIdx.x < 16 ? __ldcg(&cr[C_TRIED + threadIdx.x]) : 0;
    u32 t = 0u, acc_key = 0u;
    int ties = 0, acc_count = len, rounds = 0;
    if (kk > 0 && status == -1) {  // the row in shared memory; digit pass 0 as it arrives
        int* hist1 = (int*)(wk.wc + 64);  // digit passes 1 and 2 (HIST_BINS, 256)
        load_short_row<DT>(row, len, keys, hist, hist1, hist1 + HIST_BINS);
        find_bucket_warps(hist, HIST_BINS, kk, scratch + 64, scratch);
        const int d0 = scratch[64], above0 = scratch[65], slots = (blockDim.x >> 5) * REGION_SLOTS;
        const bool few = above0 + scratch[66] <= slots;  // candidates: the keys in or above d0
        // the candidates, in index order, into per-warp regions (the buffer's space; keys[]
        // stays); the remaining passes and the emission then read only them
        u32* ck = wk.buf;
        int* ci = (int*)(wk.buf + slots);
        const u32 lo_key = (u32)d0 << pass_shift(0);
        if (few && compact_regions(keys, len, lo_key, ck, ci, 0)) {
            SmemPairs src{ck, ci};
            smem_search(src, slots, 1, lo_key, kk - above0, hist1, hist1 + HIST_BINS, scratch, &t,
                        &ties, false);
            emit_regions<DT>(ck, ci, t, ties, oi, ov, row, scratch);
        } else {  // some warp's range holds more than its region: passes over the whole row
            SmemKeys src{keys};
            bool wc = block_search(src, len, 0, 0u, kk, hist, scratch, &t, &ties, wk, true);
            block_emit<DT>(src, len, t, ties, oi, ov, row, scratch, wc ? wk.wc : nullptr);
        }
    } else if (status == ST_READY) {  // the candidates, gathered in index order
        // where the digit passes over the row left it (loaded before the gather needs them)
        const int pass = __ldcg(&cr[C_PASS]);
        u32 prefix = (u32)__ldcg(&cr[C_PREFIX]);
        int need = __ldcg(&cr[C_NEED]);
        acc_key = (u32)__ldcg(&cr[C_LO]);
        acc_count = __ldcg(&cr[C_COUNT]);
        rounds = __ldcg(&cr[C_ROUNDS]);
        int* hist1 = (int*)(wk.wc + 64);  // digit passes 1 and 2 (HIST_BINS, 256)
        for (int j = threadIdx.x; j < HIST_BINS; j += blockDim.x) {
            hist[j] = 0;
            hist1[j] = 0;
        }
        if (threadIdx.x < 256) hist1[HIST_BINS + threadIdx.x] = 0;
        int total;
        int off = block_exclusive_scan(cnt, scratch, &total);
        int* pfx = (int*)wk.buf;  // the segments' offsets (S <= blockDim)
        if (threadIdx.x < S) pfx[threadIdx.x] = off;
        __syncthreads();
        int* ix = (int*)(keys + total);
        for (int base = 0; base < total; base += blockDim.x) {
            const int p = base + threadIdx.x;
            u32 u = 0u;
            if (p < total) {
                int lo = 0, hi = S - 1;  // the last segment whose offset is <= p
                while (lo < hi) {
                    int mid = (lo + hi + 1) >> 1;
                    if (pfx[mid] <= p) lo = mid; else hi = mid - 1;
                }
                int2 e = __ldcg(&seg[((long long)b * S + lo) * segcap + (p - pfx[lo])]);
                u = (u32)e.x;
                keys[p] = u;
                ix[p] = e.y;
            }
            // digit pass 0 as they arrive: keys just above a bound, in a few bins
            if (pass == 0) hist_add_peers(hist, u >> pass_shift(0), p < total);
        }
        __syncthreads();
        if (pass == 0) {
            find_bucket_warps(hist, HIST_BINS, need, scratch + 64, scratch);
            prefix = (u32)scratch[64] << pass_shift(0);
            need -= scratch[65];
        }
        SmemPairs src{keys, ix};
        smem_search(src, total, pass == 0 ? 1 : pass, prefix, need, hist1, hist1 + HIST_BINS,
                    scratch, &t, &ties, true);
        block_emit<DT>(src, total, t, ties, oi, ov, row, scratch, nullptr);
    } else if (status == ST_EXACT) {  // T known, more than cap keys at it: from the row
        t = (u32)__ldcg(&cr[C_PREFIX]);
        ties = __ldcg(&cr[C_NEED]);
        GlobalRow<DT> src{row};
        block_emit<DT>(src, len, t, ties, oi, ov, row, scratch, nullptr);
        acc_key = t;
        acc_count = __ldcg(&cr[C_COUNT]);
        rounds = __ldcg(&cr[C_ROUNDS]);
    }
    row_end<DT>(oi, ov, kk, k, state == nullptr ? nullptr : state + (long long)b * state_words,
                t, acc_key, acc_count, rounds, tried, len);
}

// ---------------------------------------------------------------------------------------------
// rows as thread-block clusters: one launch

// A row of at most C x chunk elements is searched by a cluster of C blocks (its rank r holds
// elements [r chunk, (r + 1) chunk) in shared memory, loaded as a short row is, with digit pass 0
// counted on the way). Each digit pass's histogram is summed over the cluster through distributed
// shared memory, so every block finds the same buckets; each block compacts its own candidates
// into per-warp regions (or, when some warp's range holds more than its region, the passes and
// the emission read all of its keys), and writes its part of the selection at the offset that the
// blocks of lower rank leave (their counts of keys > T and == T, read from their shared memory).
// Every branch below depends only on the row and on cluster-wide values, so every block of a
// cluster takes the same barriers.

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of every block of the cluster arrives (its earlier shared-memory writes released)
// and waits for the others (their writes acquired).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The int at `local`'s offset in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ int cluster_load(const int* local, u32 rank) {
    u32 a, r;
    asm volatile("{ .reg .u64 p; cvta.to.shared.u64 p, %1; cvt.u32.u64 %0, p; }"
                 : "=r"(a) : "l"(local));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
    int v;
    // (volatile keeps it between the cluster barriers, whose asm clobbers memory; no clobber
    // here, so that a loop's loads can all be in flight at once)
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(r));
    return v;
}

// h[0..nb) summed over the cluster's blocks into every block's h: block r first sums the r-th
// of C equal parts of the bins from every block (only r reads that part of r's h), then reads
// the other parts from their owners (who no longer write them). No block may write h after this
// before a later cluster_sync: the others may still be reading its part.
template <int C>
__device__ void cluster_sum(int* h, int nb, u32 rank) {
    cluster_sync();  // every block's counts are complete
    const int part = nb / C;
    for (int j = (int)rank * part + threadIdx.x; j < ((int)rank + 1) * part; j += blockDim.x) {
        int v = 0;
#pragma unroll
        for (int q = 0; q < C; ++q) v += cluster_load(h + j, (u32)q);
        h[j] = v;
    }
    cluster_sync();  // every part is summed
    for (int j = threadIdx.x; j < nb; j += blockDim.x) {
        const u32 owner = (u32)(j / part);
        if (owner != rank) h[j] = cluster_load(h + j, owner);
    }
    __syncthreads();
}

// A pass's histogram summed over the cluster (smem_search's `sum` in a cluster block).
template <int C>
struct ClusterSum {
    u32 rank;
    __device__ void operator()(int* h, int nb) const { cluster_sum<C>(h, nb, rank); }
};

// This block's keys > t and == t among src[0..count), into scratch[81] / scratch[82] (zeroed
// before, read by the blocks of higher rank).
template <class Src>
__device__ void count_selected(const Src& src, int count, u32 t, int* scratch) {
    int gt = 0, eq = 0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        const u32 u = src.key(i);
        gt += u > t;
        eq += u == t;
    }
    gt = (int)__reduce_add_sync(0xffffffffu, (u32)gt);
    eq = (int)__reduce_add_sync(0xffffffffu, (u32)eq);
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&scratch[81], gt);
        atomicAdd(&scratch[82], eq);
    }
}

template <int DT, int C>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(1024, 1) cluster_kernel(
    const void* scores, long long stride, const int* lengths, int n, int k, int chunk,
    int* out_idx, void* out_val, int* state, int state_words) {
    extern __shared__ __align__(16) int smem[];
    int* hist = smem;                  // HIST_BINS: digit pass 0
    int* hist1 = hist + HIST_BINS;     // HIST_BINS: pass 1
    int* hist2 = hist1 + HIST_BINS;    // 256: pass 2
    int* scratch = hist2 + 256;        // SCRATCH_WORDS
    const int slots = (blockDim.x >> 5) * REGION_SLOTS;
    u32* ck = (u32*)(scratch + SCRATCH_WORDS);  // the candidate regions' keys
    int* ci = (int*)(ck + slots);               // and their indices in the row
    u32* keys = (u32*)(ci + slots);             // this block's part of the row (chunk keys)
    grid_dependency_wait();
    const u32 rank = cluster_rank();
    const int b = blockIdx.y;
    const int len = row_length(lengths, b, n);
    const int kk = k < len ? k : len;
    const int lo = (int)rank * chunk;
    const int cnt = len - lo < 0 ? 0 : (len - lo < chunk ? len - lo : chunk);
    const int esize = DT == 0 ? 4 : 2;
    const void* row = (const char*)scores + (long long)b * stride * esize;
    int* oi = out_idx + (long long)b * k;
    void* ov = (char*)out_val + (long long)b * k * esize;
    u32 t = 0u;
    int ties = 0;
    if (kk > 0) {
        if (threadIdx.x == 0) {
            scratch[81] = 0;
            scratch[82] = 0;
        }
        load_short_row<DT>((const char*)row + (long long)lo * esize, cnt, keys, hist, hist1,
                           hist2);
        cluster_sum<C>(hist, HIST_BINS, rank);
        find_bucket_warps(hist, HIST_BINS, kk, scratch + 64, scratch);
        const int d0 = scratch[64], above0 = scratch[65];
        const u32 lo_key = (u32)d0 << pass_shift(0);
        const bool fits = compact_regions(keys, cnt, lo_key, ck, ci, lo);
        if (threadIdx.x == 0) scratch[80] = fits;
        cluster_sync();  // every block's flag
        const int all = threadIdx.x < C ? cluster_load(scratch + 80, threadIdx.x) : 1;
        const bool regions = __syncthreads_and(all);
        SmemPairs cand{ck, ci};
        SmemKeys mine{keys, lo};
        const ClusterSum<C> sum{rank};
        if (regions) {
            smem_search(cand, slots, 1, lo_key, kk - above0, hist1, hist2, scratch, &t, &ties,
                        true, sum);
            count_selected(cand, slots, t, scratch);
        } else {
            smem_search(mine, cnt, 1, lo_key, kk - above0, hist1, hist2, scratch, &t, &ties, true,
                        sum);
            count_selected(mine, cnt, t, scratch);
        }
        cluster_sync();  // every block's counts
        // the selected keys of the blocks before this one: keys > t, and keys == t (the ties go
        // to the lowest indices, so to the lowest ranks first)
        const int lane = threadIdx.x & 31;
        const int gt = lane < (int)rank ? cluster_load(scratch + 81, lane) : 0;
        const int eq = lane < (int)rank ? cluster_load(scratch + 82, lane) : 0;
        const int gt_before = (int)__reduce_add_sync(0xffffffffu, (u32)gt);
        const int eq_before = (int)__reduce_add_sync(0xffffffffu, (u32)eq);
        const int mine_ties = ties - eq_before < 0 ? 0 : ties - eq_before;
        const int at = gt_before + (eq_before < ties ? eq_before : ties);
        void* ov_at = (char*)ov + (long long)at * esize;
        if (regions) emit_regions<DT>(ck, ci, t, mine_ties, oi + at, ov_at, row, scratch);
        else block_emit<DT>(mine, cnt, t, mine_ties, oi + at, ov_at, row, scratch, nullptr);
    }
    if (rank == 0)
        row_end<DT>(oi, ov, kk, k, state == nullptr ? nullptr : state + (long long)b * state_words,
                    t, 0u, len, 0, 0, len);
    cluster_sync();  // no block leaves while another may read its shared memory
}
