// autograd/vjp_fp8.cpp - the VJPs of the FP8 ops (see deriver.h).
//
// FP8Quantize and FP8Dequantize pass the gradient straight through to the data (the straight-through
// estimator, as TransformerEngine and torchao do): a quantize followed by a dequantize with the same scale is
// the identity up to rounding, so the pair's gradient is exact; the scale operand gets no gradient.
// AmaxUpdate, AmaxHistory and FP8Scale are scaling statistics: no gradient flows through them (derive.cpp).
#include "autograd/deriver.h"

namespace spmd::autograd_detail {

void Deriver::fp8() { identity(); }

}  // namespace spmd::autograd_detail
