// GQA decode / small-tree attention for the narrow rows (at most 32 (query, head) tile rows): one
// thread-block cluster of C blocks per (row, KV head), one launch, no workspace.
//
// Block `rank` of a cluster walks its own range of the row's live keys (the row's split: a
// function of the row's live extent only) in stages of BN keys, loaded with cp.async into padded
// shared-memory rows (no global read at or past the extent: those slots are zero-filled); each of
// its 4 warps takes 16 keys of a stage: scores S = Q K^T (mma.sync m16n8k16, fp32 accumulation;
// the tile rows are the row's (query, head) pairs: row r is query r / G, head h * G + r % G), an
// online softmax in the exp2 domain (fp32 statistics), P rounded to the K/V type, O += P V. The
// warps' partials merge in warp order in shared memory; the blocks' partials merge over the
// cluster through distributed shared memory in rank order, each block merging a slice of the
// outputs. Every reduction order is fixed, so a row's bits depend on the row alone.
//
// Compiled with --fmad=false: no multiply-add is contracted behind the source's back, so every
// instantiation (M_TILES, STAGES) computes a row's values with the same operations; the explicit
// fmaf calls are the only fused ones.

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

#define NEG_INF (__int_as_float(0xff800000))

namespace cd {

constexpr int KW = 16;          // keys a warp takes in each stage
constexpr int MIN_SPLIT = 128;  // a block's range is at least this many keys (but the last)

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp16(u32 dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// one bulk copy of `bytes` (a multiple of 16) from global memory into this block's shared
// memory, completing on the mbarrier at `bar` (its transaction count)
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    asm volatile(
        "{\n\t.reg .pred done;\n"
        "wait_%=:\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
        "@!done bra wait_%=;\n}" ::"r"(bar), "r"(parity) : "memory");
}

__device__ __forceinline__ void ldsm4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// c += a (16x16, row) * b (16x8, col); DT 0: bf16, 1: fp16 inputs; fp32 accumulation
template <int DT>
__device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if (DT == 0) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
            "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// two floats rounded (to nearest even) to the K/V type, lo in the low half
template <int DT>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if (DT == 0)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// every thread of every block of the cluster arrives (its shared-memory writes released) and
// waits for the others (their writes acquired)
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\t"
                 "barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// the float(s) at `local`'s offset in the shared memory of the cluster's block `rank`
// (volatile: kept between the cluster barriers; issued back to back, the loads of a loop whose
// results are used after it are all in flight at once)
__device__ __forceinline__ u32 cluster_addr(const float* local, u32 rank) {
    u32 r;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(local)), "r"(rank));
    return r;
}
__device__ __forceinline__ float cluster_load(u32 addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr));
    return v;
}
__device__ __forceinline__ float2 cluster_load2(u32 addr) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}

// the rounded output pair
template <int DT>
__device__ __forceinline__ void store2(u16* p, float lo, float hi) {
    *reinterpret_cast<u32*>(p) = pack2<DT>(lo, hi);
}

}  // namespace cd

// Shared memory (bytes, `cluster_decode.py`'s `smem_bytes` mirrors it): the stages' K and V
// rows (STAGES x 2 x BN x (D + 8) elements; reused after the key loop for the warps' fp32
// partial outputs, WARPS x 16 M_TILES x D), the tile's query rows (16 M_TILES x (D + 8)), then
// fp32 statistics: the warps' max and sum (2 x WARPS x 32) and the block's (2 x 32), then one
// 8-byte mbarrier per stage.
//
// Arguments: q / out [B, q_max, Hq, D] (strides in elements), caches [rows, capacity, Hkv, D],
// cache_lens / q_lens int32 [B], rows (the pool row of each batch row) or null, mask (mode 1:
// uint8 [B, q_max, q_max]; 2: int64 bit rows [B, q_max]; 0: causal, unused) with its strides.
// Grid (C, Hkv, B). Rows of more than 16 M_TILES tile rows are left alone (another kernel's).
template <int DT, int D, int M_TILES, int STAGES, int C, int WARPS>
__global__ void __cluster_dims__(C, 1, 1) __launch_bounds__(WARPS * 32, 1) cluster_decode_kernel(
    const u16* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,
    u16* __restrict__ out, const int* __restrict__ cache_lens, const int* __restrict__ q_lens,
    const int* __restrict__ rows_of, const void* __restrict__ mask, i64 sqb, i64 sqt, i64 sqh,
    i64 skr, i64 skn, i64 skh, i64 svr, i64 svn, i64 svh, i64 sob, i64 sot, i64 soh, i64 smb,
    i64 smi, int capacity, int q_max, int group, int mask_mode, float qk_scale) {
    using namespace cd;
    constexpr int BN = KW * WARPS;  // keys a stage
    constexpr int THREADS = WARPS * 32;
    constexpr int LD = D + 8;  // padded row: ldmatrix's 8 rows fall in distinct banks
    constexpr int CHUNKS = D / 8;  // 16-byte pieces of a row
    constexpr int STAGE_BYTES = STAGES * 2 * BN * LD * 2;
    constexpr int OW_BYTES = WARPS * 16 * M_TILES * D * 4;
    constexpr int BASE = STAGE_BYTES > OW_BYTES ? STAGE_BYTES : OW_BYTES;
    constexpr int MROWS = 16 * M_TILES;
    extern __shared__ __align__(16) unsigned char smem[];
    u16* ks = reinterpret_cast<u16*>(smem);
    u16* vs = ks + STAGES * BN * LD;
    u16* qs = reinterpret_cast<u16*>(smem + BASE);
    float* wm = reinterpret_cast<float*>(smem + BASE + MROWS * LD * 2);  // [WARPS][32]
    float* wl = wm + WARPS * 32;
    float* pm = wl + WARPS * 32;  // [32]: the block's merged statistics
    float* pl = pm + 32;
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(pl + 32);  // [STAGES]
    float* ow = reinterpret_cast<float*>(smem);  // [WARPS][MROWS][D] after the key loop

    asm volatile("griddepcontrol.wait;" ::: "memory");
    const u32 rank = cluster_rank();
    const int h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int q_len = q_lens[b];
    const int n_rows = q_len * group;
    if (n_rows > MROWS) return;  // a wide row (uniform over the cluster)

    // the dead query slots [q_len, q_max) of this KV head's query heads are zeros
    {
        const int per_slot = group * CHUNKS;
        const int n = (q_max - q_len) * per_slot;
        for (int c = (int)rank * THREADS + tid; c < n; c += C * THREADS) {
            const int slot = q_len + c / per_slot, g = c % per_slot / CHUNKS, col = c % CHUNKS;
            *reinterpret_cast<uint4*>(out + b * sob + slot * sot + (h * group + g) * soh +
                                      col * 8) = make_uint4(0, 0, 0, 0);
        }
    }
    if (q_len == 0) return;
    const int cache_len = cache_lens[b];
    const int total = min(cache_len + q_len, capacity);
    const int want = min(C, (total + MIN_SPLIT - 1) / MIN_SPLIT);
    const int chunk = (total + want - 1) / want;
    const int active = (total + chunk - 1) / chunk;
    const int start = (int)rank * chunk;
    const int end = min(total, start + chunk);
    const i64 row = rows_of ? (i64)rows_of[b] : (i64)b;
    const u16* kb = kc + row * skr + h * skh;
    const u16* vb = vc + row * svr + h * svh;

    float acc[M_TILES][CHUNKS][4];
    float m[M_TILES][2], l[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
        for (int i = 0; i < 2; ++i) m[mt][i] = NEG_INF, l[mt][i] = 0.f;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[mt][c][i] = 0.f;
    }

    if ((int)rank < active) {
        // the tile's query rows (dead rows zero-filled), in the first copy group
        for (int c = tid; c < MROWS * CHUNKS; c += THREADS) {
            const int r = c / CHUNKS, col = c % CHUNKS;
            const bool live = r < n_rows;
            const int qi = live ? r / group : 0, g = live ? r % group : 0;
            cp16(smem_addr(qs + r * LD + col * 8),
                 q + b * sqb + qi * sqt + (h * group + g) * sqh + col * 8, live);
        }
        cp_commit();
        const int n_blocks = (end - start + BN - 1) / BN;
        if (tid == 0) {
            for (int i = 0; i < STAGES; ++i) mbar_init(smem_addr(bars + i), 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        }
        __syncthreads();
        // warp 0 fills a stage: one bulk copy per key row of K and of V; rows past the block's
        // range re-read its last live key (masked below), never a slot past the extent
        auto load = [&](int blk) {
            const int s = blk % STAGES, n0 = start + blk * BN;
            const u32 bar = smem_addr(bars + s);
            if (lane == 0) mbar_expect(bar, 2 * BN * D * 2);
            __syncwarp();
#pragma unroll
            for (int key = lane; key < BN; key += 32) {
                const i64 p = min(n0 + key, end - 1);
                bulk_copy(smem_addr(ks + (s * BN + key) * LD), kb + p * skn, D * 2, bar);
                bulk_copy(smem_addr(vs + (s * BN + key) * LD), vb + p * svn, D * 2, bar);
            }
        };
        if (warp == 0)
            for (int i = 0; i < STAGES - 1 && i < n_blocks; ++i) load(i);
        cp_wait<0>();  // the query rows
        __syncthreads();
        // with one row tile, its fragments stay in registers for the whole key loop
        u32 qreg[M_TILES == 1 ? D / 16 : 1][4];
        if (M_TILES == 1) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk)
                ldsm4(qreg[M_TILES == 1 ? kk : 0],
                      smem_addr(qs + (lane & 15) * LD + kk * 16 + (lane >> 4) * 8));
        }
        const int kw = warp * KW;  // this warp's keys in a stage
        const bool two = M_TILES > 1 && n_rows > 16;
        for (int blk = 0; blk < n_blocks; ++blk) {
            __syncthreads();  // every warp is done with the stage the next fill overwrites
            if (warp == 0 && blk + STAGES - 1 < n_blocks) load(blk + STAGES - 1);
            const int s = blk % STAGES, n0 = start + blk * BN;
            mbar_wait(smem_addr(bars + s), (u32)(blk / STAGES) & 1u);
            const u16* kst = ks + s * BN * LD;
            const u16* vst = vs + s * BN * LD;

            // S = Q K^T: the even and the odd 16-wide slices of d accumulate apart (two short
            // dependency chains), then add
            float sc[M_TILES][2][4], sd[M_TILES][2][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) sc[mt][nt][i] = 0.f, sd[mt][nt][i] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                u32 kf[4];
                ldsm4(kf, smem_addr(kst + (kw + ((lane >> 4) << 3) + (lane & 7)) * LD + kk * 16 +
                                    ((lane >> 3) & 1) * 8));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    if (mt == 1 && !two) continue;
                    u32 qf[4];
                    if (M_TILES == 1) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) qf[i] = qreg[kk][i];
                    } else {
                        ldsm4(qf, smem_addr(qs + (mt * 16 + (lane & 15)) * LD + kk * 16 +
                                            (lane >> 4) * 8));
                    }
                    float(&acc0)[4] = kk & 1 ? sd[mt][0] : sc[mt][0];
                    float(&acc1)[4] = kk & 1 ? sd[mt][1] : sc[mt][1];
                    mma<DT>(acc0, qf, kf[0], kf[1]);
                    mma<DT>(acc1, qf, kf[2], kf[3]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) sc[mt][nt][i] = __fadd_rn(sc[mt][nt][i], sd[mt][nt][i]);
            // scale, mask (only a block reaching the extent's end or the new tokens), softmax
            const bool plain = n0 + BN <= end && n0 + BN <= cache_len;
            u32 pf[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                if (mt == 1 && !two) continue;
#pragma unroll
                for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        float x = __fmul_rn(sc[mt][nt][i], qk_scale);
                        if (!plain) {
                            const int r = mt * 16 + (lane >> 2) + ((i >> 1) << 3);
                            const int pos = n0 + kw + nt * 8 + ((lane & 3) << 1) + (i & 1);
                            bool vis = pos < end;
                            if (vis && pos >= cache_len) {
                                const int j = pos - cache_len;
                                if (r >= n_rows) {
                                    vis = false;
                                } else {
                                    const int qi = r / group;
                                    if (mask_mode == 0) {
                                        vis = j <= qi;
                                    } else if (mask_mode == 1) {
                                        vis = static_cast<const unsigned char*>(
                                                  mask)[b * smb + qi * smi + j] != 0;
                                    } else {
                                        vis = (static_cast<const i64*>(
                                                   mask)[b * smb + qi * smi] >> j) & 1;
                                    }
                                }
                            }
                            if (!vis) x = NEG_INF;
                        }
                        sc[mt][nt][i] = x;
                    }
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    float mx = fmaxf(fmaxf(sc[mt][0][2 * hf], sc[mt][0][2 * hf + 1]),
                                     fmaxf(sc[mt][1][2 * hf], sc[mt][1][2 * hf + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float m_new = fmaxf(m[mt][hf], mx);
                    const float m_use = m_new == NEG_INF ? 0.f : m_new;
                    const float alpha = ex2(__fsub_rn(m[mt][hf], m_use));
                    float sum = 0.f;
#pragma unroll
                    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
                        for (int i = 0; i < 2; ++i) {
                            const float p = ex2(__fsub_rn(sc[mt][nt][2 * hf + i], m_use));
                            sc[mt][nt][2 * hf + i] = p;
                            sum = __fadd_rn(sum, p);
                        }
                    l[mt][hf] = fmaf(l[mt][hf], alpha, sum);
                    m[mt][hf] = m_new;
#pragma unroll
                    for (int c = 0; c < CHUNKS; ++c) {
                        acc[mt][c][2 * hf] = __fmul_rn(acc[mt][c][2 * hf], alpha);
                        acc[mt][c][2 * hf + 1] = __fmul_rn(acc[mt][c][2 * hf + 1], alpha);
                    }
                }
                pf[mt][0] = pack2<DT>(sc[mt][0][0], sc[mt][0][1]);
                pf[mt][1] = pack2<DT>(sc[mt][0][2], sc[mt][0][3]);
                pf[mt][2] = pack2<DT>(sc[mt][1][0], sc[mt][1][1]);
                pf[mt][3] = pack2<DT>(sc[mt][1][2], sc[mt][1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                u32 vf[4];
                ldsm4t(vf, smem_addr(vst + (kw + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD +
                                     dp * 16 + (lane >> 4) * 8));
#pragma unroll
                for (int mt = 0; mt < M_TILES; ++mt) {
                    if (mt == 1 && !two) continue;
                    mma<DT>(acc[mt][2 * dp], pf[mt], vf[0], vf[1]);
                    mma<DT>(acc[mt][2 * dp + 1], pf[mt], vf[2], vf[3]);
                }
            }
        }
        __syncthreads();  // the stages are free: the warps' partials go there
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int hf = 0; hf < 2; ++hf) {
                float sum = l[mt][hf];
                sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
                sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
                const int r = mt * 16 + (lane >> 2) + hf * 8;
                if ((lane & 3) == 0) {
                    wm[warp * 32 + r] = m[mt][hf];
                    wl[warp * 32 + r] = sum;
                }
#pragma unroll
                for (int c = 0; c < CHUNKS; ++c)
                    *reinterpret_cast<float2*>(ow + (warp * MROWS + r) * D + c * 8 +
                                               ((lane & 3) << 1)) =
                        make_float2(acc[mt][c][2 * hf], acc[mt][c][2 * hf + 1]);
            }
        __syncthreads();
        // the block's partial: the warps' merged in warp order, into warp 0's place
        for (int e = tid; e < n_rows * D; e += THREADS) {
            const int r = e / D;
            float mx = NEG_INF;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, wm[w * 32 + r]);
            const float mu = mx == NEG_INF ? 0.f : mx;
            float o = 0.f, s = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) {
                const float f = ex2(__fsub_rn(wm[w * 32 + r], mu));
                o = fmaf(ow[(w * MROWS + r) * D + e % D], f, o);
                s = fmaf(wl[w * 32 + r], f, s);
            }
            ow[e] = o;  // r * D + d: warp 0's slot of row r
            if (e % D == 0) pm[r] = mx, pl[r] = s;
        }
    }
    asm volatile("griddepcontrol.launch_dependents;");
    cluster_sync();  // every block's partial is complete
    // block `rank` merges its slice of the row's outputs (pairs of elements) over the active
    // blocks, in rank order
    {
        const int pairs = n_rows * D / 2;
        const int per = (pairs + C - 1) / C;
        const int lo = (int)rank * per, hi = min(pairs, lo + per);
        for (int e2 = lo + tid; e2 < hi; e2 += THREADS) {
            const int e = 2 * e2, r = e / D, d = e % D;
            // every block's values first (all loads in flight at once; blocks past `active`
            // hold no partial: their values are read but not used)
            float mj[C], lj[C];
            float2 oj[C];
#pragma unroll
            for (int j = 0; j < C; ++j) {
                mj[j] = cluster_load(cluster_addr(pm + r, (u32)j));
                lj[j] = cluster_load(cluster_addr(pl + r, (u32)j));
                oj[j] = cluster_load2(cluster_addr(ow + e, (u32)j));
            }
            float mx = NEG_INF;
#pragma unroll
            for (int j = 0; j < C; ++j)
                if (j < active) mx = fmaxf(mx, mj[j]);
            const float mu = mx == NEG_INF ? 0.f : mx;
            float o0 = 0.f, o1 = 0.f, s = 0.f;
#pragma unroll
            for (int j = 0; j < C; ++j) {
                if (j < active) {
                    const float f = ex2(__fsub_rn(mj[j], mu));
                    o0 = fmaf(oj[j].x, f, o0);
                    o1 = fmaf(oj[j].y, f, o1);
                    s = fmaf(lj[j], f, s);
                }
            }
            const bool any = s > 0.f;
            const float inv_ok = any ? s : 1.f;
            const int qi = r / group, g = r % group;
            store2<DT>(out + b * sob + qi * sot + (h * group + g) * soh + d,
                       any ? __fdiv_rn(o0, inv_ok) : 0.f, any ? __fdiv_rn(o1, inv_ok) : 0.f);
        }
    }
    cluster_sync();  // no block leaves while another may read its shared memory
}
