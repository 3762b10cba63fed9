// The torch operators of gg_runtime._ops, one function per operator (its
// schema in module.cc).  Each does all of its op's host work: checks,
// case and layout, outputs, arguments, launch.  Where one operator runs
// another's work on arguments it has checked, that work is a function here
// too (ragged_m, combine_slots, route_slots), which skips the checks.
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "op_support.h"

namespace gg::ops {

// torch._grouped_mm's cases; tf32: float32 inputs may use TF32 products.
Tensor grouped_mm(Tensor mat_a, Tensor mat_b, std::optional<Tensor> offs,
                  std::optional<Tensor> bias, std::optional<ScalarType> out_dtype, bool tf32);

// torch._scaled_grouped_mm's ragged M and batched cases in fp8, rowwise or
// 128-block scales.
Tensor scaled_grouped_mm(Tensor mat_a, Tensor mat_b, Tensor scale_a, Tensor scale_b,
                         std::optional<Tensor> offs, std::optional<Tensor> bias,
                         std::optional<Tensor> scale_result, std::optional<ScalarType> out_dtype,
                         bool use_fast_accum);

// grouped_mm's ragged-M product of a [T, K] and b (matrix_of a [G, K, N], n =
// N), + bias[g], for operators that checked their arguments; the product
// [T, N] made by `outputs`, row-major or column-major (its transpose [N, T]
// row-major).
Tensor ragged_m(const Tensor& a, const Matrix& b, int64_t n, const Tensor& offs,
                const std::optional<Tensor>& bias, ScalarType out_dtype, bool tf32,
                Outputs& outputs, family::Major out_major = family::Major::kRow);

// The fp8 weight gradient: out [G, M, N], out[g] = a_g @ b_g^T, of a [M, W]
// and b [N, W] quantized along T within each group of `rows` rows (scaling
// "rowwise" or "blockwise": family::Scaling).
Tensor scaled_grouped_mm_k(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs,
                           int64_t rows, std::string scaling, std::optional<ScalarType> out_dtype);

// (q, scale) with x ~ q * scale.
std::tuple<Tensor, Tensor> quantize_fp8(Tensor x, std::string granularity);
// (q, scale, q_t, scale_t): x [.., N, K] quantized per 128 x 128 block, and
// x.mT's (the same blocks transposed, contiguous [.., K, N]), from one read.
std::tuple<Tensor, Tensor, Tensor, Tensor> quantize_fp8_both_orientations(Tensor x);
// (q, scale) of x [T, C] quantised along T within each group of rows of offs,
// q [C, 128 * (T / 128 + G)] K-major (csrc/ops/quantize_fp8_columns.cc): the
// fp8 weight gradient's operands; with rows, x's rows rows[r] / k (T = the
// rows' count).
std::tuple<Tensor, Tensor> quantize_fp8_columns(Tensor x, Tensor offs, std::string granularity,
                                                std::optional<Tensor> rows, int64_t k);

// C_i = A_i @ B_i (B_i^T with trans_b) for every i, one launch.
std::vector<Tensor> grouped_gemm(std::vector<Tensor> As, std::vector<Tensor> Bs, bool trans_b);

// SwiGLU (activation "swiglu", or gpt-oss's clamped "gpt_oss") of each row's
// gate and up halves (gu [R, 2C] -> [R, C]; gate_up "concatenated" or
// "interleaved": family::GateUp), and its backward: (d gu, h scaled by the
// row's weight, each row's dot of grad and h).
Tensor swiglu(Tensor gu, std::string gate_up, std::string activation);
std::tuple<Tensor, Tensor, Tensor> swiglu_backward(Tensor gu, Tensor grad, Tensor scale,
                                                   std::string gate_up, std::string activation);
// swiglu_backward for fp8 training with 1x128 blocks, its outputs quantized as
// the backward's products read them (aot/kernels/swiglu_backward_fp8.py says
// the layouts), over the rows of offs's groups: d(gu) along its rows and along
// T within the groups, h scaled along T, each row's dot in partial sums
// over 128 columns at a time (dot [cdiv(C, 128), R]), and with dgu_sums,
// d(gu)'s sums over the row blocks of its columns' layout (b13's gradient in
// partial sums; else [0, 2C]).
using Fp8Backward = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
Fp8Backward swiglu_backward_fp8(Tensor gu, Tensor grad, Tensor scale, Tensor offs,
                                std::string gate_up, std::string activation, bool dgu_sums);

// Products over rows gathered through the routing's order (rows int64 [R],
// each rows[r] / k a row of the gathered operand: not checked, the routing
// makes them).  grouped_mm_glu, (h, gu): moe_experts' up projection, the
// ragged-M product gu = a @ w13[g]^T (+ bias[g]) of w13 [G, 2I, H] and the
// gathered tokens a[r] = x[rows[r] / k] (x [T, H]) or, without rows, a = x;
// and h = its SwiGLU [R, I]; gu [R, 2I] is returned where save_gu, else
// [0, 2I] (not made).
std::tuple<Tensor, Tensor> grouped_mm_glu(Tensor x, std::optional<Tensor> rows, int64_t k,
                                          Tensor w13, Tensor offs, std::optional<Tensor> bias,
                                          std::string gate_up, std::string activation,
                                          bool save_gu);
// grouped_mm_glu's work on checked arguments: h made by `outputs`, gu [R, 2I]
// written where given.
Tensor up_projection(const Tensor& x, const std::optional<Tensor>& rows, int64_t k,
                     const Tensor& w13, const Tensor& offs, const std::optional<Tensor>& bias,
                     family::GateUp gate_up, family::Activation activation, Tensor* gu,
                     Outputs& outputs);
// The backward's: gathered_mm's row r is x[rows[r] / k] @ b[g] for b [G, K, N]
// (rows past the last group zero); gathered_mm_k's out[g] = a_g^T @ b_g
// [G, M, N] over the rows r of group g of a [*, M] and b [*, N], the gathered
// one's row r being its row rows[r] / k (a's where gather_a, else b's), the
// other's row r.
Tensor gathered_mm(Tensor x, Tensor rows, int64_t k, Tensor b, Tensor offs);
Tensor gathered_mm_k(Tensor a, Tensor b, Tensor offs, Tensor rows, int64_t k, bool gather_a);

// out[t] = sum_j weights[t, j] * rows[index[t, j]] over the slots whose row lies
// within the groups (offs[-1]); the others are dropped slots and add nothing.
Tensor combine(Tensor rows, Tensor index, Tensor weights, Tensor offs);
// combine's work for index and weights of tokens x k elements each (any
// shape; weights float32), for operators that checked them; written into
// `into` ([tokens, H], contiguous) where given and of rows' dtype.
Tensor combine_slots(const Tensor& rows, const Tensor& index, int64_t tokens, int64_t k,
                     const Tensor& weights, const Tensor& offs, const Tensor* into = nullptr);
// The same for slots made in parts, in the slots' own order: parts [tokens *
// k, P, H] float32 (contiguous), slot t * k + j the sum of its P parts, kept
// where 0 <= ids[t, j] < experts (ids contiguous int64); out bfloat16 (into
// where given and bfloat16).
Tensor combine_parts(const Tensor& parts, const Tensor& ids, int64_t tokens, int64_t k,
                     const Tensor& weights, int64_t experts, const Tensor* into = nullptr);

// Row r of rows (2-byte words) stored at row dest[r, c] of the symmetric buffer
// of rank ranks[r, c] (peers: each rank's buffer address), for every c with
// dest[r, c] >= 0: expert parallelism's transport.  The rows are `blocks` equal
// blocks, taken in turns (rows sent home, block s to rank s, store into every
// peer at once, not into one rank at a time).
void send_rows(Tensor rows, Tensor peers, Tensor ranks, Tensor dest, int64_t blocks,
               std::optional<Tensor> rows2, std::optional<Tensor> peers2,
               std::optional<Tensor> rows3, std::optional<Tensor> peers3);

// send_rows' fp8 dispatch: each 16-bit token x[r] quantized per 128 columns
// (quantize_fp8's 1x128) and stored, for every c with dest[r, c] >= 0, at row
// dest[r, c] of rank ranks[r, c]'s buffers: its fp8 values at peers, its
// float32 scales at scale_peers, its metadata (meta[r], 16-bit words) at
// meta_peers.
void send_fp8_rows(Tensor x, Tensor peers, Tensor scale_peers, Tensor ranks, Tensor dest,
                   Tensor meta, Tensor meta_peers);

// out[t] = sum over the ranks r with index[t, r] >= 0 of row first_row + t of
// rank r's symmetric region (peers[r] its address; region this rank's, of
// every rank's shape and dtype), in float32, rank by rank: expert
// parallelism's return on one host.
Tensor sum_peer_rows(Tensor region, Tensor peers, Tensor index, int64_t first_row);

// Expert parallelism's plan (W = world ranks of experts_per_rank experts,
// `capacity` rows a block; rank s's token t in row t of block s), on the
// sending rank: (dest [T, W] int64, index [T, W] int64, meta [T, 2k] int32)
// for topk_ids [T, k] int64 and topk_weights [T, k] float32: token t's row on
// each rank (-1: not sent), whether each rank makes an output for it (>= 0), and
// its kept ids (-1 otherwise) and weights' bits.  On the receiving rank, for
// meta [W * capacity, 2k] as it arrived (rows not sent all -1; contiguous):
// (ids [R, k] int64, weights [R, k] float32): this rank's experts' local ids
// (-1 otherwise) and their weights (0 otherwise); meta is left all -1, blank
// for the next dispatch.
std::tuple<Tensor, Tensor, Tensor> dispatch_plan(Tensor topk_ids, Tensor topk_weights,
                                                 int64_t world, int64_t rank,
                                                 int64_t experts_per_rank, int64_t capacity);
std::tuple<Tensor, Tensor> received_slots(Tensor meta, int64_t world, int64_t rank,
                                          int64_t experts_per_rank, int64_t capacity);

// (order, offs, inverse): the slots of ids [N] (int64) sorted by expert, stably,
// ids outside [0, experts) last; the groups' end offsets (int32 [experts]); the
// inverse permutation.  Any number of experts: past the kernels' bins, by
// torch's sort.
std::tuple<Tensor, Tensor, Tensor> route(Tensor ids, int64_t experts);
// route's work for int64 ids of any shape, their slots in row-major order
// (unchecked: for operators that checked them), its tensors made by
// `outputs`; route_bytes: the block bytes they take (0 where torch's sort
// makes them).
std::tuple<Tensor, Tensor, Tensor> route_slots(const Tensor& ids, int64_t experts,
                                               Outputs& outputs);
int64_t route_bytes(int64_t slots, int64_t experts);

// moe_experts' forward (gg_runtime/moe/experts.py says what it computes; gate_up
// and activation as swiglu's) for weights in weight_format (csrc/ops/
// expert_products.h; gg_runtime.formats' names): "unquantized", 16-bit in
// x's dtype, no scales; "128x128" or "rowwise", float8_e4m3fn [E, N,
// K] (K-major) with float32 scales per 128 x 128 block ([E, ceil(N/128),
// ceil(K/128)]) or per output channel ([E, N], or [E, N, 1]), the tokens
// quantized alike (per token per 128 columns, or per token) or given so (x
// float8_e4m3fn, x_scale [T, ceil(H/128)] or [T] / [T, 1], the output then
// bfloat16); "mxfp4" or "int4", 4-bit values two a byte along K ([E, N,
// K/2] uint8, the first in the low nibble, 16-byte aligned rows) with
// MXFP4's e8m0 byte scales [E, N, K/32] or INT4's bfloat16 ones [E, N,
// K/32] or [E, N, K/128] (offset-8 integers), x bfloat16.  Its routing and
// the products' rows are temporaries in one block.  The 16-bit products read
// the tokens through the routing's order where the experts are at most
// family::RaggedGlu::kGatherMaxInter wide (I), else from a permuted copy of
// x; the others always through the order.
Tensor moe_experts(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2,
                   std::optional<Tensor> b13, std::optional<Tensor> b2, std::string gate_up,
                   std::string activation, std::string weight_format,
                   std::optional<Tensor> w13_scale, std::optional<Tensor> w2_scale,
                   std::optional<Tensor> x_scale);
// moe_experts' forward written into out ([T, H] of its output dtype,
// contiguous, not overlapping x); the schema's first argument, `into`.
void moe_experts_into(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13,
                      Tensor w2, std::optional<Tensor> b13, std::optional<Tensor> b2,
                      std::string gate_up, std::string activation, std::string weight_format,
                      std::optional<Tensor> w13_scale, std::optional<Tensor> w2_scale,
                      std::optional<Tensor> x_scale);
// The same forward, for unquantized or fp8 weights (4-bit ones serve
// inference only), and what its backward reads beyond the inputs, in this
// order: (out, gu [T*k, 2I], the up projection's product plus bias (in x's
// dtype, bfloat16 with fp8 weights), order, offs and inverse as route gives
// them, whether the products gathered the tokens through the routing's
// order: the backward's products do as they did).
using ExpertsForBackward = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, bool>;
ExpertsForBackward moe_experts_for_backward(Tensor x, Tensor topk_ids, Tensor topk_weights,
                                            Tensor w13, Tensor w2, std::optional<Tensor> b13,
                                            std::optional<Tensor> b2, std::string gate_up,
                                            std::string activation, std::string weight_format,
                                            std::optional<Tensor> w13_scale,
                                            std::optional<Tensor> w2_scale);

}  // namespace gg::ops
