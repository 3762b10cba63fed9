// moe_experts' weight formats, and what each format does of the forward: its
// checks, the conversions before the launches, and the experts' products on
// the routed slots (and, for fp8, a decode path of its own).  moe_experts.cc
// holds the rest (the routing, the combine, the launch group), once for every
// format; each format's products live in expert_products_<format>.cc.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "moe_inputs.h"
#include "op_support.h"

namespace gg::ops {

// gg_runtime.formats' names (the operator's weight_format), parsed once.
enum class WeightFormat { kUnquantized, kFp8SquareBlocks, kFp8Rowwise, kMxfp4, kInt4 };
WeightFormat parse_weight_format(const std::string& text);

// The scales beside quantized weights, and beside tokens given quantized.
struct Scales {
  const std::optional<Tensor>& w13;
  const std::optional<Tensor>& w2;
  const std::optional<Tensor>& x;
};

// The routing as the products read it: sorted slot r is token order[r] / k's,
// the experts' groups of sorted slots end at offs.
struct RoutedSlots {
  const Tensor& order;
  const Tensor& offs;
  int64_t k;
};

// A weight format's part of moe_experts' forward, made once its arguments are
// checked in full (nothing launches before that) and converted as its
// kernels read them.  It holds references to the operator's arguments: it
// lives within the operator's call.
class ExpertProducts {
 public:
  virtual ~ExpertProducts() = default;
  // ys [S, H]: each routed slot's row through the up projection, the
  // activation and the down projection, in the routing's order; the up
  // projection's product plus bias written to gu [S, 2I] where given (the
  // backward's, of gu_dtype()).
  virtual Tensor rows(const RoutedSlots& routed, Tensor* gu, Outputs& temporaries) const = 0;
  // Bytes of rows()' temporaries, allocated with the routing's in one block:
  // by default h [S, I] and the rows [S, H] in x's dtype.
  virtual int64_t temporary_bytes(int64_t slots) const;
  // Whether rows() reads the tokens through the routing's order (the
  // backward's products then do too) rather than from a permuted copy.
  virtual bool gathers() const = 0;
  // Whether the forward of `slots` slots, keeping nothing for a backward,
  // takes decode() instead of the routing, rows() and the combine.
  virtual bool takes_decode(int64_t slots) const;
  // The output [T, H] (before out_dtype's conversion) from ids (int64) and
  // weights (float32, contiguous) in one path of the format's own; written
  // into `into` where given and of the path's dtype.
  virtual Tensor decode(const Tensor& ids, const Tensor& weights, Outputs& temporaries,
                        const Tensor* into) const;
  // The output's dtype, and gu's (rows()' product plus bias, for the backward).
  virtual ScalarType out_dtype() const;
  virtual ScalarType gu_dtype() const;

 protected:
  explicit ExpertProducts(const MoeInputs& in) : in_(in) {}
  const MoeInputs& in_;
};

// The choices every format binds: gate_up and activation (family's values).
struct Choices {
  family::GateUp gate_up;
  family::Activation activation;
};

// Each format's products, after every check of its arguments (messages name
// moe_experts').  16-bit weights in x's dtype:
std::unique_ptr<ExpertProducts> unquantized_products(const MoeInputs& in, const Scales& scales,
                                                     Choices choices);
// float8_e4m3fn weights with float32 scales per 128 x 128 block or per
// output channel (`format`); tokens in 16 bits, or in fp8 with scales.x:
std::unique_ptr<ExpertProducts> fp8_products(const MoeInputs& in, const Scales& scales,
                                             WeightFormat format, Choices choices);
// 4-bit weights, two values a byte along K (MXFP4 or INT4: `format`):
std::unique_ptr<ExpertProducts> w4_products(const MoeInputs& in, const Scales& scales,
                                            WeightFormat format, Choices choices);

// Scales given where the format takes none (unquantized weights, 4-bit
// weights' x_scale): a ValueError naming the first.
void check_no_scales(const Scales& scales, bool weights, const char* why);

}  // namespace gg::ops
