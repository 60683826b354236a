// Negative tests of the public fused layer ops on CPU tensors (the tables and what they check:
// kernels/layer_ops_validation_tables.h). Each table's valid call runs first and must write every
// output, so "unchanged after a failed call" means something.
#include "kernels/layer_ops_validation_tables.h"

namespace splice {
namespace {

using namespace layer_op_tables;  // NOLINT(google-build-using-namespace): the tables

// ---- tests --------------------------------------------------------------------------------------

TEST(LayerOpsValidation, RmsNorm) { run_strict(rms_norm_table()); }
TEST(LayerOpsValidation, SiluMul) { run_strict(silu_mul_table()); }
TEST(LayerOpsValidation, Rope) { run_strict(rope_table()); }
TEST(LayerOpsValidation, RopeKvAppendLeavesCachesOnError) { run_strict(rope_kv_append_table()); }
TEST(LayerOpsValidation, RmsNormMatMulRopeKvAppendLeavesCachesOnError) {
  run_strict(qkv_rope_table());
}
TEST(LayerOpsValidation, MatMulAdd) { run_strict(matmul_add_table()); }
TEST(LayerOpsValidation, RmsNormMatMul) { run_strict(rms_norm_matmul_table()); }
TEST(LayerOpsValidation, RmsNormMatMulSwiglu) { run_strict(swiglu_table()); }
TEST(LayerOpsValidation, SiluMulMatMulAdd) { run_strict(silu_mul_matmul_add_table()); }

}  // namespace
}  // namespace splice
