// gg_runtime::send_rows: expert parallelism's transport (the send_rows kernel
// family), one launch: each row of `rows` (and of up to two more row sets
// that go where it goes, each to its own addresses) stored into the
// symmetric buffers of the ranks it goes to, the rows taken as `blocks`
// equal blocks in turns.  gg_runtime::send_fp8_rows (its fp8 dispatch, the
// send_fp8_rows family): 16-bit tokens quantized per 128 columns on the way,
// with their scales and metadata.  Checks, launch; nothing to make (the
// buffers are the caller's, on the peers); Meta tensors run the checks only.
#include <family_args.h>

#include <optional>
#include <vector>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

// A row set's launch arguments: its rows, its peers' table, its width in
// words; zeros where there is none.
struct Companion {
  int64_t rows_ptr = 0, peers_ptr = 0, width = 0;
};

// Checks dest and ranks: [R, C] each, row r's destinations.
void check_destinations(const Tensor& ranks, const Tensor& dest, const Tensor& rows) {
  check_tensor(dest, "dest", 2, ScalarType::Long);
  check_companion(dest, "dest", {rows.size(0), dest.size(1)}, ScalarType::Long, rows, "int64",
                  "(each row's destinations)");
  check_companion(ranks, "ranks", {rows.size(0), dest.size(1)}, ScalarType::Int, rows, "int32",
                  "(the rank of each of dest's rows)");
}

// Checks the row set that travels with `rows`: rows_in [R, *] and its peers'
// table, both or neither given.
void check_row_set(const std::optional<Tensor>& rows_in, const std::optional<Tensor>& peers,
                   const char* rows_name, const char* peers_name, const Tensor& rows,
                   const Tensor& table) {
  if (rows_in.has_value() != peers.has_value()) {
    value_error(rows_name, " and ", peers_name, " must be given together, got only ",
                rows_in ? rows_name : peers_name);
  }
  if (!rows_in) return;
  check_tensor(*rows_in, rows_name, 2, family::SendRows::kDTypes);
  check_companion(*rows_in, rows_name, {rows.size(0), rows_in->size(1)}, rows.scalar_type(), rows,
                  dtype_name(rows.scalar_type()), "(a row for each of rows')");
  check_companion(*peers, peers_name, {table.size(0)}, ScalarType::Long, rows, "int64",
                  "(each rank's address of that row set)");
}

int64_t width(const std::optional<Tensor>& rows_in) { return rows_in ? rows_in->size(1) : 0; }

// A checked row set's launch arguments; `kept` holds what the launch reads.
Companion companion(const std::optional<Tensor>& rows_in, const std::optional<Tensor>& peers,
                    std::vector<Tensor>& kept) {
  if (!rows_in) return {};
  kept.push_back(dense(*rows_in));
  kept.push_back(as_contiguous(*peers));
  return {address(kept[kept.size() - 2]), address(kept.back()), rows_in->size(1)};
}

}  // namespace

void send_rows(Tensor rows_in, Tensor peers, Tensor ranks, Tensor dest, int64_t blocks,
               std::optional<Tensor> rows2, std::optional<Tensor> peers2,
               std::optional<Tensor> rows3, std::optional<Tensor> peers3) {
  check_tensor(rows_in, "rows", 2, family::SendRows::kDTypes);
  check_tensor(peers, "peers", 1, ScalarType::Long);
  check_companion(peers, "peers", {peers.size(0)}, ScalarType::Long, rows_in, "int64",
                  "(each rank's buffer address)");
  check_row_set(rows2, peers2, "rows2", "peers2", rows_in, peers);
  check_row_set(rows3, peers3, "rows3", "peers3", rows_in, peers);
  check_destinations(ranks, dest, rows_in);
  const int64_t count = rows_in.size(0), destinations = dest.size(1);
  if (blocks < 1 || count % blocks != 0)
    value_error("blocks must be >= 1 and divide the ", count, " rows, got ", blocks);
  if (count == 0 || destinations == 0 || shapes_only(rows_in)) return;
  if (rows_in.size(1) + width(rows2) + width(rows3) == 0) return;
  std::vector<Tensor> kept;
  const Companion second = companion(rows2, peers2, kept), third = companion(rows3, peers3, kept);
  const Tensor rows = dense(rows_in), table = as_contiguous(peers), rank = as_contiguous(ranks),
               row = as_contiguous(dest);
  const family::SendRows args{.rows_ptr = address(rows),
                              .peers_ptr = address(table),
                              .ranks_ptr = address(rank),
                              .dest_ptr = address(row),
                              .R = count,
                              .H = rows.size(1),
                              .C = destinations,
                              .BLOCKS = blocks,
                              .rows2_ptr = second.rows_ptr,
                              .peers2_ptr = second.peers_ptr,
                              .H2 = second.width,
                              .rows3_ptr = third.rows_ptr,
                              .peers3_ptr = third.peers_ptr,
                              .H3 = third.width};
  launch(args, {}, target_of(rows, rows.scalar_type()));
}

void send_fp8_rows(Tensor x, Tensor peers, Tensor scale_peers, Tensor ranks, Tensor dest,
                   Tensor meta, Tensor meta_peers) {
  check_tensor(x, "x", 2, family::SendFp8Rows::kDTypes);
  if (x.size(1) % 16 != 0) value_error("x's rows must be a multiple of 16 wide, got ", x.size(1));
  check_tensor(peers, "peers", 1, ScalarType::Long);
  for (const auto& [table, name] :
       {std::pair{&scale_peers, "scale_peers"}, std::pair{&meta_peers, "meta_peers"}}) {
    check_companion(*table, name, {peers.size(0)}, ScalarType::Long, x, "int64",
                    "(each rank's address, as peers)");
  }
  check_tensor(meta, "meta", 2, ScalarType::BFloat16);
  check_companion(meta, "meta", {x.size(0), meta.size(1)}, ScalarType::BFloat16, x, "bfloat16",
                  "(16-bit words, a row for each token)");
  check_destinations(ranks, dest, x);
  if (x.size(0) == 0 || dest.size(1) == 0 || shapes_only(x)) return;
  const Tensor tokens = dense(x), words = dense(meta), values = as_contiguous(peers),
               scales = as_contiguous(scale_peers), metas = as_contiguous(meta_peers),
               rank = as_contiguous(ranks), row = as_contiguous(dest);
  const family::SendFp8Rows args{.x_ptr = address(tokens),
                                 .peers_ptr = address(values),
                                 .scale_peers_ptr = address(scales),
                                 .ranks_ptr = address(rank),
                                 .dest_ptr = address(row),
                                 .R = x.size(0),
                                 .H = x.size(1),
                                 .C = dest.size(1),
                                 .meta_ptr = address(words),
                                 .meta_peers_ptr = address(metas),
                                 .HM = meta.size(1)};
  launch(args, {}, target_of(tokens, tokens.scalar_type()));
}

}  // namespace gg::ops
