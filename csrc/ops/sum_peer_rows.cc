// gg_runtime::sum_peer_rows: expert parallelism's return on one host (the
// sum_peer_rows kernel family), one launch: each token's rows read from the
// ranks' symmetric regions that made them and summed.  Checks, output,
// launch; Meta tensors run the same code without the launch.
#include <family_args.h>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {

Tensor sum_peer_rows(Tensor region, Tensor peers, Tensor index, int64_t first_row) {
  check_tensor(region, "region", 2, family::SumPeerRows::kDTypes);
  check_tensor(index, "index", 2, ScalarType::Long);
  const int64_t tokens = index.size(0), world = index.size(1);
  check_companion(peers, "peers", {world}, ScalarType::Long, region, "int64",
                  "(each rank's region address, one per column of index)");
  check_companion(index, "index", {tokens, world}, ScalarType::Long, region, "int64",
                  "(which ranks made each token's row)");
  if (region.stride(1) != 1 || region.stride(0) != region.size(1))
    value_error("region must be contiguous (the peers' regions are read in its layout)");
  if (first_row < 0 || first_row + tokens > region.size(0)) {
    value_error("first_row must leave the ", tokens, " tokens' rows within region's ",
                region.size(0), " rows, got ", first_row);
  }
  Tensor out = new_output(region, {tokens, region.size(1)}, region.scalar_type());
  if (out.numel() == 0 || shapes_only(out)) return out;
  const Tensor table = as_contiguous(peers), made = as_contiguous(index);
  const family::SumPeerRows args{.peers_ptr = address(table),
                                 .index_ptr = address(made),
                                 .out_ptr = address(out),
                                 .T = tokens,
                                 .H = region.size(1),
                                 .W = world,
                                 .FIRST = first_row};
  launch(args, {}, target_of(region, region.scalar_type()));
  return out;
}

}  // namespace gg::ops
