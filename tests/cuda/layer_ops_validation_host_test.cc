// The public fused layer ops' negative tests on the CUDA path, without a GPU (label cuda_host):
// the tables of kernels/layer_ops_validation_tables.h, each mutated call's tensors moved onto a
// fake device (host memory borrowed as cuda:0, and a tensor the mutation put "on cuda" moved to
// the CPU instead), so the op dispatches to the CUDA launchers, whose host checks must refuse the
// call as the CPU's do: the same error type, the same argument and value in the message, nothing
// written. A check the CUDA path lacks lets the call reach a CUDA call (no device here: a
// CudaError), which fails the case.
//
// Not run here: each table's valid call (it would launch), the mutations a CUDA kernel reads on
// the device (Where::device: out-of-range positions write zeros there, tests/cuda), and
// rms_norm_matmul_rope_kv_append's table, whose B = 2 lies outside the CUDA contract row (one
// decode row): its CUDA operand checks are tests/cuda/qkv_rope_test.cc's.
#include <deque>
#include <functional>

#include "kernels/layer_ops_validation_tables.h"

namespace splice {
namespace {

using namespace layer_op_tables;  // NOLINT(google-build-using-namespace): the tables

// Moves every tensor argument to the other device without copying: CPU tensors become cuda:0
// views of the same host bytes, fake CUDA ones (a device mutation) CPU views.
template <typename Args>
void to_fake_cuda(Args& args) {
  static std::deque<Tensor> owners;  // the host buffers, alive to the end of the process
  for (Tensor* t : args.tensors()) {
    if (!t->defined()) continue;
    owners.push_back(*t);
    const Device other = t->device().is_cpu() ? Device::cuda() : Device::cpu();
    *t = Tensor::borrow(const_cast<void*>(t->raw_data()), t->shape(), t->dtype(), t->strides(),
                        other);
  }
}

template <typename Args>
void run_on_cuda_host(const OpTable<Args>& table) {
  int checked = 0, left = 0;
  for (const Mutation<Args>& m : table.mutations) {
    if (m.where == Where::device) {
      ++left;
      continue;
    }
    ++checked;
    const std::string v = verdict<Args>(table, m, to_fake_cuda<Args>);
    EXPECT_TRUE(v.empty()) << table.op << " on cuda / " << m.what << ": " << v;
  }
  std::printf("[ cases    ] %s on cuda: %d rejected mutations (%d read on the device)\n",
              table.op.c_str(), checked, left);
}

TEST(LayerOpsValidationCudaHost, RmsNorm) { run_on_cuda_host(rms_norm_table()); }
TEST(LayerOpsValidationCudaHost, SiluMul) { run_on_cuda_host(silu_mul_table()); }
TEST(LayerOpsValidationCudaHost, Rope) { run_on_cuda_host(rope_table()); }
TEST(LayerOpsValidationCudaHost, RopeKvAppend) { run_on_cuda_host(rope_kv_append_table()); }
TEST(LayerOpsValidationCudaHost, MatMulAdd) { run_on_cuda_host(matmul_add_table()); }
TEST(LayerOpsValidationCudaHost, RmsNormMatMul) { run_on_cuda_host(rms_norm_matmul_table()); }
TEST(LayerOpsValidationCudaHost, RmsNormMatMulSwiglu) { run_on_cuda_host(swiglu_table()); }
TEST(LayerOpsValidationCudaHost, SiluMulMatMulAdd) {
  run_on_cuda_host(silu_mul_matmul_add_table());
}

}  // namespace
}  // namespace splice
