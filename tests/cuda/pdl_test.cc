// Programmatic dependent launch (src/backend/cuda/launch.cuh) over the primitive and layer-op
// kernels: a long dependent chain gives the same bits with and without PDL, eagerly and inside a
// captured CUDA graph, and agrees with the CPU backend. Skips itself without a CUDA device.
//
//  1. The chain: kChainLength kernels over a few shared buffers, cycling through
//       0: c = x + b               (elementwise binary)
//       1: b = c * half            (overwrites b, which op 0 read: write after read)
//       2: h = bf16(b)             (cast)
//       3: b = rms_norm(h, w)      (bf16 in, f32 out; overwrites b, which op 2 read)
//       4: c = softmax(b, -1)      (row kernel; overwrites c, which op 1 read)
//       5: b[kWriteRow] = c[0]     (write_at, its row offset read from device memory)
//     so every kernel reads what the one before wrote and most overwrite the buffer the one
//     before read. Under PDL a kernel that touched memory before its producers completed would
//     read stale values or clobber live ones, and the bits would differ from the serialized run.
//     One cycle maps b to rms_norm(bf16((x + b) / 2)) * w, a contraction (the normalization's
//     tangential gain 1 / rms((x + b) / 2) is about 1.4, halved), so rounding differences between
//     backends do not grow along the chain.
//  2. Runs: the reference is eager with PDL off on the legacy default stream; then eager with
//     PDL on, on a created stream; a captured graph with PDL on, replayed several times from
//     restored inputs; a captured graph with PDL off; eager with PDL on, on the legacy stream
//     (where the attribute is never set). All must match the reference bit for bit.
//  3. The CPU backend runs the same chain; the reference agrees within the bf16 policy (the chain
//     rounds through bf16 every cycle and is contracting, so differences stay at that level).
//  4. The captured graph itself: with PDL on, every kernel node after the first depends on its
//     producer programmatically (a programmatic edge, or the node's PDL attribute); with it off,
//     none does. This is what makes the A/B of the benchmarks meaningful.
//  5. Sizes: 4 rows (every grid single-wave: each kernel triggers its dependents early) and 300
//     rows (elementwise and rms_norm grids larger than the SM count, which do not trigger, mixed
//     with row-kernel grids that do).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "splice/backend/cpu/layer_ops.h"
#include "splice/backend/cpu/primitives.h"
#include "splice/backend/cuda/layer_ops.h"
#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/core/random.h"
#include "support/cuda_test_util.h"
#include "support/test_util.h"

namespace splice {
namespace {

constexpr std::int64_t kHidden = 576;  // SmolLM2-135M's hidden size
constexpr int kChainLength = 200;
constexpr int kOpsPerCycle = 6;
constexpr std::int64_t kWriteRow = 1;
constexpr float kEps = 1e-5f;
constexpr double kHalf = 0.5;
constexpr int kReplays = 3;
const std::int64_t kRowCounts[] = {4, 300};

// The chain's buffers, on one device.
struct Chain {
  Tensor x;       // [rows, hidden] f32: a fixed input (never written)
  Tensor b, c;    // [rows, hidden] f32: the running state
  Tensor h;       // [rows, hidden] bf16: b rounded
  Tensor w;       // [hidden] bf16: the rms_norm weight
  Tensor half;    // [1] f32: 0.5
  Tensor offset;  // [1] i32: kWriteRow (the device chain reads it on the device)
};

Chain make_host_chain(Rng& rng, std::int64_t rows) {
  Chain t;
  t.x = testing::random_tensor(rng, {rows, kHidden}, DType::f32);
  t.b = testing::random_tensor(rng, {rows, kHidden}, DType::f32);
  t.c = testing::random_tensor(rng, {rows, kHidden}, DType::f32);
  t.h = testing::random_tensor(rng, {rows, kHidden}, DType::bf16);
  t.w = testing::random_tensor(rng, {kHidden}, DType::bf16, 0.1, 1.0);
  t.half = Tensor::empty({1}, DType::f32);
  t.half.set_linear(0, kHalf);
  t.offset = Tensor::empty({1}, DType::i32);
  t.offset.set_linear(0, static_cast<double>(kWriteRow));
  return t;
}

Chain to_device(const Chain& t) {
  const Device d = Device::cuda();
  return {t.x.to_device(d), t.b.to_device(d),    t.c.to_device(d),     t.h.to_device(d),
          t.w.to_device(d), t.half.to_device(d), t.offset.to_device(d)};
}

std::vector<const Tensor*> buffers(const Chain& t) {
  return {&t.x, &t.b, &t.c, &t.h, &t.w, &t.half, &t.offset};
}

// Device-to-device copy of every buffer of `from` into `to` (same shapes), on `stream`.
void restore(Chain& to, const Chain& from, cuda::Stream stream) {
  const std::vector<const Tensor*> dst = buffers(to), src = buffers(from);
  for (std::size_t i = 0; i < dst.size(); ++i)
    cuda::copy_async(dst[i]->raw_data(), src[i]->raw_data(), src[i]->nbytes(), stream);
  cuda::stream_synchronize(stream);
}

void run_cpu_chain(Chain& t) {
  Tensor value = t.c.slice(0, 0, 1);  // [1, hidden]
  for (int i = 0; i < kChainLength; ++i) {
    switch (i % kOpsPerCycle) {
      case 0:
        cpu::binary(cpu::BinaryKind::add, t.x, t.b, t.c);
        break;
      case 1:
        cpu::binary(cpu::BinaryKind::mul, t.c, t.half, t.b);
        break;
      case 2:
        cpu::cast(t.b, t.h);
        break;
      case 3:
        cpu::rms_norm(t.h, t.w, kEps, t.b);
        break;
      case 4:
        cpu::softmax(t.b, -1, t.c);
        break;
      default:
        cpu::write_at(t.b, value, 0, kWriteRow);
        break;
    }
  }
}

// The same chain on the current stream (eager, or recorded when the stream is capturing).
void run_cuda_chain(Chain& t) {
  const Tensor value = t.c.slice(0, 0, 1);  // [1, hidden]
  for (int i = 0; i < kChainLength; ++i) {
    switch (i % kOpsPerCycle) {
      case 0:
        cuda::binary(cuda::BinaryKind::add, t.x, t.b, t.c);
        break;
      case 1:
        cuda::binary(cuda::BinaryKind::mul, t.c, t.half, t.b);
        break;
      case 2:
        cuda::cast(t.b, t.h);
        break;
      case 3:
        cuda::rms_norm(t.h, t.w, kEps, t.b);
        break;
      case 4:
        cuda::softmax(t.b, -1, t.c);
        break;
      default:
        cuda::write_at(t.b, value, 0, t.offset);
        break;
    }
  }
}

struct Result {
  Tensor x, b, c, h;  // CPU copies
};

Result download(const Chain& t) {
  cuda::synchronize();
  const Device cpu = Device::cpu();
  return {t.x.to_device(cpu), t.b.to_device(cpu), t.c.to_device(cpu), t.h.to_device(cpu)};
}

::testing::AssertionResult same_bits(const Result& actual, const Result& expected) {
  const Tensor* const got[] = {&actual.x, &actual.b, &actual.c, &actual.h};
  const Tensor* const want[] = {&expected.x, &expected.b, &expected.c, &expected.h};
  const char* const names[] = {"x", "b", "c", "h"};
  for (int i = 0; i < 4; ++i) {
    ::testing::AssertionResult r = testing::bit_equal(*got[i], *want[i]);
    if (!r) return r << " (buffer " << names[i] << ")";
  }
  return ::testing::AssertionSuccess();
}

using testing::PdlScope;

TEST(CudaPdl, SwitchOverridesTheEnvironment) {
  PdlScope scope;
  cuda::set_pdl_enabled(false);
  EXPECT_FALSE(cuda::pdl_enabled());
  cuda::set_pdl_enabled(true);
  EXPECT_TRUE(cuda::pdl_enabled());
}

TEST(CudaPdl, LongDependentChainIsBitIdenticalEagerAndInGraphs) {
  SKIP_WITHOUT_GPU();
  PdlScope scope;
  Rng rng(7);
  for (const std::int64_t rows : kRowCounts) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    const Chain host = make_host_chain(rng, rows);
    const Chain initial = to_device(host);  // pristine copy, never written
    const cuda::Stream stream = cuda::create_stream();

    // Reference: PDL off, legacy default stream, eager.
    cuda::set_pdl_enabled(false);
    Chain dev = to_device(host);
    run_cuda_chain(dev);
    const Result reference = download(dev);

    // CPU oracle.
    Chain cpu_chain{host.x, host.b.clone(), host.c.clone(), host.h.clone(),
                    host.w, host.half,      host.offset};
    run_cpu_chain(cpu_chain);
    const Tolerance tol = default_tolerance(DType::bf16);
    EXPECT_TRUE(testing::close(reference.b, cpu_chain.b, tol)) << "b vs CPU";
    EXPECT_TRUE(testing::close(reference.c, cpu_chain.c, tol)) << "c vs CPU";
    EXPECT_TRUE(testing::close(reference.h, cpu_chain.h, tol)) << "h vs CPU";

    cuda::set_pdl_enabled(true);
    {  // PDL on, created stream, eager.
      cuda::StreamGuard guard(stream);
      restore(dev, initial, stream);
      run_cuda_chain(dev);
      EXPECT_TRUE(same_bits(download(dev), reference)) << "eager, PDL on";
    }
    for (const bool pdl : {true, false}) {  // captured graphs, replayed from restored inputs
      cuda::set_pdl_enabled(pdl);
      cuda::StreamGuard guard(stream);
      restore(dev, initial, stream);
      cuda::begin_capture(stream);
      run_cuda_chain(dev);
      const cuda::GraphExec exec = cuda::end_capture(stream);
      for (int r = 0; r < kReplays; ++r) {
        restore(dev, initial, stream);
        cuda::launch_graph(exec, stream);
        cuda::stream_synchronize(stream);
        EXPECT_TRUE(same_bits(download(dev), reference))
            << "graph replay " << r << ", PDL " << (pdl ? "on" : "off");
      }
      cuda::destroy_graph(exec);
    }
    {  // PDL on, legacy default stream: the attribute is skipped there.
      cuda::set_pdl_enabled(true);
      restore(dev, initial, nullptr);
      run_cuda_chain(dev);
      EXPECT_TRUE(same_bits(download(dev), reference)) << "eager legacy stream, PDL on";
    }
    cuda::destroy_stream(stream);
  }
}

// Back-to-back graph replays without a host sync between them: replay r + 1's first kernel
// reads what replay r's last kernel wrote (the chain state carries over), so the result after
// kReplays replays must equal kReplays eager chains.
TEST(CudaPdl, BackToBackReplaysCarryStateLikeEagerRuns) {
  SKIP_WITHOUT_GPU();
  PdlScope scope;
  Rng rng(11);
  const Chain host = make_host_chain(rng, kRowCounts[0]);
  const cuda::Stream stream = cuda::create_stream();
  cuda::set_pdl_enabled(false);
  Chain eager = to_device(host);
  for (int r = 0; r < kReplays; ++r) run_cuda_chain(eager);
  const Result reference = download(eager);

  cuda::set_pdl_enabled(true);
  Chain dev = to_device(host);
  cuda::GraphExec exec = nullptr;
  {
    cuda::StreamGuard guard(stream);
    cuda::begin_capture(stream);
    run_cuda_chain(dev);
    exec = cuda::end_capture(stream);
    for (int r = 0; r < kReplays; ++r) cuda::launch_graph(exec, stream);
    cuda::stream_synchronize(stream);
  }
  EXPECT_TRUE(same_bits(download(dev), reference));
  cuda::destroy_graph(exec);
  cuda::destroy_stream(stream);
}

// Kernel nodes of `graph` that wait on their producer programmatically: the target of a
// programmatic edge, or a kernel node carrying the PDL attribute.
std::size_t programmatic_kernel_nodes(cudaGraph_t graph) {
  std::set<cudaGraphNode_t> found;
  std::size_t num_edges = 0;
  EXPECT_EQ(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &num_edges), cudaSuccess);
  std::vector<cudaGraphNode_t> from(num_edges), to(num_edges);
  std::vector<cudaGraphEdgeData> data(num_edges);
  EXPECT_EQ(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &num_edges), cudaSuccess);
  for (std::size_t i = 0; i < num_edges; ++i)
    if (data[i].type == cudaGraphDependencyTypeProgrammatic) found.insert(to[i]);
  std::size_t num_nodes = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &num_nodes), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(num_nodes);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &num_nodes), cudaSuccess);
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeKernel)
      continue;
    cudaLaunchAttributeValue value{};
    if (cudaGraphKernelNodeGetAttribute(node, cudaLaunchAttributeProgrammaticStreamSerialization,
                                        &value) == cudaSuccess &&
        value.programmaticStreamSerializationAllowed != 0)
      found.insert(node);
  }
  cudaGetLastError();  // an attribute query the node does not support must not reach a launch
  return found.size();
}

TEST(CudaPdl, CaptureRecordsProgrammaticDependencies) {
  SKIP_WITHOUT_GPU();
  PdlScope scope;
  Rng rng(13);
  const Chain host = make_host_chain(rng, kRowCounts[0]);
  Chain dev = to_device(host);
  const cuda::Stream stream = cuda::create_stream();
  constexpr std::size_t kKernels = 3;
  for (const bool pdl : {true, false}) {
    cuda::set_pdl_enabled(pdl);
    cuda::StreamGuard guard(stream);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cuda::binary(cuda::BinaryKind::add, dev.x, dev.b, dev.c);  // elementwise kernel
    cuda::rms_norm(dev.h, dev.w, kEps, dev.b);                 // rms_norm kernel
    cuda::softmax(dev.b, -1, dev.c);                           // row kernel
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    std::size_t num_nodes = 0;
    EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &num_nodes), cudaSuccess);
    EXPECT_EQ(num_nodes, kKernels);
    const std::size_t programmatic = programmatic_kernel_nodes(graph);
    if (pdl)
      EXPECT_GE(programmatic, kKernels - 1) << "PDL on: the captured kernels are not programmatic";
    else
      EXPECT_EQ(programmatic, 0u) << "PDL off: a captured kernel is programmatic";
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
  cuda::destroy_stream(stream);
}

}  // namespace
}  // namespace splice
