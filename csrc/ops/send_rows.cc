// gg_runtime::send_rows: expert parallelism's transport (the send_rows kernel
// family), one launch: each row of `rows` stored into the symmetric buffers
// of the ranks it goes to, the rows taken as `blocks` equal blocks in turns.
// Checks, launch; nothing to make (the buffers are the caller's, on the
// peers); Meta tensors run the checks only.
#include <family_args.h>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {

void send_rows(Tensor rows_in, Tensor peers, Tensor ranks, Tensor dest, int64_t blocks) {
  check_tensor(rows_in, "rows", 2, family::SendRows::kDTypes);
  check_tensor(peers, "peers", 1, ScalarType::Long);
  check_companion(peers, "peers", {peers.size(0)}, ScalarType::Long, rows_in, "int64",
                  "(each rank's buffer address)");
  const int64_t count = rows_in.size(0), destinations = dest.size(1);
  check_tensor(dest, "dest", 2, ScalarType::Long);
  check_companion(dest, "dest", {count, destinations}, ScalarType::Long, rows_in, "int64",
                  "(each row's destinations)");
  check_companion(ranks, "ranks", {count, destinations}, ScalarType::Int, rows_in, "int32",
                  "(the rank of each of dest's rows)");
  if (blocks < 1 || count % blocks != 0)
    value_error("blocks must be >= 1 and divide the ", count, " rows, got ", blocks);
  if (count == 0 || destinations == 0 || rows_in.size(1) == 0 || shapes_only(rows_in)) return;
  const Tensor rows = dense(rows_in), table = as_contiguous(peers), rank = as_contiguous(ranks),
               row = as_contiguous(dest);
  const family::SendRows args{.rows_ptr = address(rows),
                              .peers_ptr = address(table),
                              .ranks_ptr = address(rank),
                              .dest_ptr = address(row),
                              .R = count,
                              .H = rows.size(1),
                              .C = destinations,
                              .BLOCKS = blocks};
  launch(args, {}, target_of(rows, rows.scalar_type()));
}

}  // namespace gg::ops
