// Greedy sampling on the GPU (issue 7): cuda::argmax against the CPU argmax and the independent
// oracle (std::max_element over f32), and greedy decoding inside the step against the host path.
// Skips itself without a CUDA device.
//
//  1. Grid: vocab 1, 17, 4097, 49152, 151936 x bf16 / f16 / f32 x rows 1, 3 x contiguous or
//     inside a poisoned storage (+inf or NaN before the first row and after every row, odd row
//     pitches so rows start at different 16-byte alignments: head / body / tail paths) x CTAs per
//     row auto, 1, 2, 3, 8 (every cluster reduction), with ties, NaN and -inf planted.
//  2. Ties across CTA boundaries: the row maximum planted at several positions chosen from the
//     kernel's work split (body vector v goes to CTA (v mod (n * threads)) / threads): lowest tie
//     in the last CTA, in CTA 0 with the others later, in the unaligned head, in the tail.
//  3. Special rows (NaN at 0, signed zeros, infinities...) in every dtype and at several CTA
//     counts, placed at a large vocab so the special values sit in different CTAs.
//  4. More rows than the grid's y extent (70000 rows) loop correctly.
//  5. A captured CUDA graph replays with new logits each time and updates ids and the pinned host
//     mirror; PDL on and off after a producer kernel (cast) give the CPU's ids.
//  6. Bad arguments: typed errors naming the argument (device, dtype, shape, ctas_per_row).
//  6b. The session epilogue (SessionOptions::epilogue): called by the warm-up and capturing steps
//     only, its argmax replayed by every later step with that step's values (demo attention model).
//  7. Decoding: the embedded default model, fused arms chosen (steps replayed as CUDA graphs), 48
//     greedy tokens in-step equal the host-greedy tokens on the same device (prompt logits and
//     every step's logits bit-equal; step_greedy continuations equal); the same with decomposed
//     arms (eager steps: capture refused); a tiny random Llama with a 49152-entry vocabulary
//     (the multi-CTA cluster argmax inside the replayed graph) for 32 tokens.
#include "splice/backend/cpu/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "splice/backend/cuda/primitives.h"
#include "splice/backend/cuda/runtime.h"
#include "splice/backend/cuda/sampling.h"
#include "splice/core/error.h"
#include "splice/core/random.h"
#include "splice/exec/session.h"
#include "splice/model/default_model.h"
#include "splice/model/demo.h"
#include "splice/model/generate.h"
#include "splice/model/model.h"
#include "splice/model/safetensors.h"
#include "splice/ops/decode_attention.h"
#include "splice/passes/decode_flash.h"
#include "support/argmax_cases.h"
#include "support/cuda_test_util.h"
#include "support/test_util.h"
#include "support/tiny_llama.h"

namespace splice {
namespace {

using testing::argmax_oracle;
using testing::download;
using testing::inf;
using testing::quiet_nan;
using testing::upload;

const DType kDtypes[] = {DType::bf16, DType::f16, DType::f32};
const int kCtaChoices[] = {0, 1, 2, 3, 8};
constexpr std::int32_t kUnwritten = -7;
constexpr std::int64_t kVectorBytes = 16;  // the kernel's load width
constexpr float kPlanted = 8.0f;           // above every N(0, 1) entry

std::vector<std::int32_t> ids_of(const Tensor& device_ids) {
  const Tensor h = download(device_ids);
  std::vector<std::int32_t> out(static_cast<std::size_t>(h.numel()));
  for (std::int64_t i = 0; i < h.numel(); ++i)
    out[static_cast<std::size_t>(i)] = h.data<std::int32_t>()[i];
  return out;
}

std::vector<std::int32_t> cpu_ids(const Tensor& logits) {
  Tensor ids = Tensor::empty({logits.dim() == 2 ? logits.size(0) : 1}, DType::i32);
  cpu::argmax(logits, ids);
  std::vector<std::int32_t> out(static_cast<std::size_t>(ids.numel()));
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    out[static_cast<std::size_t>(i)] = ids.data<std::int32_t>()[i];
  return out;
}

// Runs cuda::argmax on the device copy of `logits` (storage, poison and offset included).
std::vector<std::int32_t> device_ids(const Tensor& logits, int ctas) {
  const Tensor d = upload(logits);
  Tensor ids = Tensor::empty({logits.dim() == 2 ? logits.size(0) : 1}, DType::i32, Device::cuda());
  Tensor fill = Tensor::empty({ids.numel()}, DType::i32);
  fill.fill(kUnwritten);
  ids.copy_from(fill);
  cuda::ArgmaxOptions options;
  options.ctas_per_row = ctas;
  cuda::argmax(d, ids, options);
  cuda::synchronize();
  return ids_of(ids);
}

TEST(CudaArgmax, MatchesCpuOnGrids) {
  SKIP_WITHOUT_GPU();
  Rng rng(17);
  for (DType dtype : kDtypes)
    for (std::int64_t vocab : {1, 17, 4097, 49152, 151936})
      for (std::int64_t rows : {1, 3})
        for (int layout = 0; layout < 3; ++layout) {
          const std::int64_t lead = layout == 0 ? 0 : 2 * layout - 1;  // 0, 1, 3
          const std::int64_t pad = layout == 0 ? 0 : 2 * layout + 1;   // 0, 3, 5
          const float poison = layout == 2 ? quiet_nan() : inf();
          Tensor logits = testing::poisoned_logits(rng, rows, vocab, dtype, lead, pad, poison);
          for (std::int64_t r = 0; r < rows; ++r) {
            for (int c = 0; c <= r; ++c) logits.set({r, rng.integer(0, vocab - 1)}, kPlanted);
            for (int e = 0; e < 4 && vocab > 2; ++e)
              logits.set({r, rng.integer(1, vocab - 1)}, e % 2 ? -inf() : quiet_nan());
          }
          const std::vector<std::int32_t> want = cpu_ids(logits);
          for (std::int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(want[static_cast<std::size_t>(r)], argmax_oracle(logits, r));
          for (int ctas : kCtaChoices) {
            if (ctas > 0 && vocab < 4097 && ctas != 2) continue;  // small rows: auto, 1 and 2
            EXPECT_EQ(device_ids(logits, ctas), want)
                << dtype_name(dtype) << " vocab " << vocab << " rows " << rows << " layout "
                << layout << " ctas " << ctas;
          }
        }
}

// Element index of body vector v's element e in a row whose first `head` elements precede the
// first 16-byte boundary.
std::int64_t body_element(std::int64_t head, std::int64_t per_vector, std::int64_t v,
                          std::int64_t e) {
  return head + v * per_vector + e;
}

TEST(CudaArgmax, TiesAcrossCtaBoundariesGoToTheLowestIndex) {
  SKIP_WITHOUT_GPU();
  Rng rng(23);
  for (DType dtype : kDtypes)
    for (std::int64_t vocab : {4097, 49152, 151936})
      for (int forced : {0, 2, 8})
        for (std::int64_t lead : {0, 1}) {  // row start aligned, or one element past it
          const cuda::ArgmaxLaunch l = cuda::argmax_launch(vocab, dtype);
          const std::int64_t n = forced > 0 ? forced : l.ctas_per_row;
          const std::int64_t threads = l.threads;
          const std::int64_t es = static_cast<std::int64_t>(dtype_size(dtype));
          const std::int64_t per_vector = kVectorBytes / es;
          const std::int64_t head =
              ((kVectorBytes - (lead * es) % kVectorBytes) % kVectorBytes) / es;
          const std::int64_t group = n * threads;  // vectors per round over the cluster
          const std::int64_t last_cta_first = body_element(head, per_vector, (n - 1) * threads, 0);
          const std::int64_t cta0_round1 = body_element(head, per_vector, group + 3, 1);
          const std::int64_t cta1_first = body_element(head, per_vector, threads, per_vector - 1);
          const std::vector<std::vector<std::int64_t>> sets = {
              // lowest tie in the last CTA's first vector, the others in CTA 0's second round
              {cta0_round1, last_cta_first, vocab - 1},
              // lowest tie in CTA 0 (last element of its first vector), the others later
              {vocab - 1, cta1_first, per_vector - 1 + head, last_cta_first},
              // lowest tie in the unaligned head (element 0), others in every CTA
              {last_cta_first, 0, cta1_first, vocab - 1},
              // lowest tie in the tail (the last elements), after the body
              {vocab - 1, vocab - 2},
          };
          for (std::size_t s = 0; s < sets.size(); ++s) {
            Tensor logits = testing::poisoned_logits(rng, 1, vocab, dtype, lead, 2, inf());
            std::int64_t want = vocab;
            for (std::int64_t j : sets[s])
              if (j >= 0 && j < vocab) {
                logits.set({0, j}, kPlanted);
                want = std::min(want, j);
              }
            ASSERT_EQ(argmax_oracle(logits), want);
            EXPECT_EQ(device_ids(logits, forced),
                      std::vector<std::int32_t>{static_cast<std::int32_t>(want)})
                << dtype_name(dtype) << " vocab " << vocab << " ctas " << n << " lead " << lead
                << " tie set " << s;
          }
        }
}

TEST(CudaArgmax, SpecialValuesFollowTheCpuRuleInEveryCta) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : kDtypes)
    for (const testing::SpecialRow& row : testing::special_rows()) {
      // The short row itself.
      const auto n = static_cast<std::int64_t>(row.values.size());
      Tensor small = Tensor::empty({n}, dtype);
      for (std::int64_t j = 0; j < n; ++j) small.set({j}, row.values[static_cast<std::size_t>(j)]);
      for (int ctas : {0, 2})
        EXPECT_EQ(device_ids(small, ctas),
                  std::vector<std::int32_t>{static_cast<std::int32_t>(row.pick)})
            << row.what << " (" << dtype_name(dtype) << ", ctas " << ctas << ")";
      // Spread over a large row of -inf: entry k at position k * spacing (a different CTA each).
      constexpr std::int64_t kVocab = 49152;
      const std::int64_t spacing = kVocab / n;
      Tensor wide = Tensor::empty({kVocab}, dtype);
      wide.fill(-inf());
      for (std::int64_t j = 0; j < n; ++j)
        wide.set({j * spacing}, row.values[static_cast<std::size_t>(j)]);
      const std::int32_t want = static_cast<std::int32_t>(argmax_oracle(wide));
      EXPECT_EQ(cpu_ids(wide), std::vector<std::int32_t>{want});
      for (int ctas : kCtaChoices)
        EXPECT_EQ(device_ids(wide, ctas), std::vector<std::int32_t>{want})
            << row.what << " spread (" << dtype_name(dtype) << ", ctas " << ctas << ")";
    }
}

TEST(CudaArgmax, MoreRowsThanTheGridLoops) {
  SKIP_WITHOUT_GPU();
  Rng rng(31);
  constexpr std::int64_t kRows = 70000;  // beyond gridDim.y's 65535
  Tensor logits = testing::poisoned_logits(rng, kRows, 5, DType::f32, 0, 0, 0.0f);
  const std::vector<std::int32_t> want = cpu_ids(logits);
  for (int ctas : {1, 2}) EXPECT_EQ(device_ids(logits, ctas), want) << "ctas " << ctas;
}

TEST(CudaArgmax, CapturedGraphReplaysNewLogitsIntoIdsAndTheHostMirror) {
  SKIP_WITHOUT_GPU();
  Rng rng(37);
  constexpr std::int64_t kRows = 2, kVocab = 49152;
  cuda::Stream stream = cuda::create_stream();
  auto* mirror = static_cast<std::int32_t*>(cuda::alloc_pinned(kRows * sizeof(std::int32_t)));
  {
    cuda::StreamGuard guard(stream);
    Tensor logits = Tensor::empty({kRows, kVocab}, DType::bf16, Device::cuda());
    Tensor ids = Tensor::empty({kRows}, DType::i32, Device::cuda());
    logits.copy_from(testing::random_tensor(rng, {kRows, kVocab}, DType::bf16));
    cuda::ArgmaxOptions options;
    options.host_mirror = mirror;
    cuda::begin_capture(stream);
    cuda::argmax(logits, ids, options);
    cuda::GraphExec graph = cuda::end_capture(stream);
    for (int replay = 0; replay < 6; ++replay) {
      Tensor host = testing::random_tensor(rng, {kRows, kVocab}, DType::bf16);
      for (std::int64_t r = 0; r < kRows; ++r) host.set({r, rng.integer(0, kVocab - 1)}, kPlanted);
      cuda::synchronize();
      logits.copy_from(host);
      mirror[0] = mirror[1] = kUnwritten;
      cuda::launch_graph(graph, stream);
      cuda::stream_synchronize(stream);
      const std::vector<std::int32_t> want = cpu_ids(host);
      EXPECT_EQ(ids_of(ids), want) << "replay " << replay;
      EXPECT_EQ((std::vector<std::int32_t>{mirror[0], mirror[1]}), want) << "replay " << replay;
    }
    cuda::destroy_graph(graph);
  }
  cuda::free_pinned(mirror);
  cuda::destroy_stream(stream);
}

// The mirror ring of a pipelined decode loop: launch n writes slot n % 2 and leaves the other
// alone, counted by the device counter, also inside a replayed graph.
TEST(CudaArgmax, MirrorRingWritesSlotLaunchModSlots) {
  SKIP_WITHOUT_GPU();
  Rng rng(41);
  constexpr std::int64_t kVocab = 49152;
  constexpr int kSlots = 2;
  cuda::Stream stream = cuda::create_stream();
  auto* mirror = static_cast<std::int32_t*>(cuda::alloc_pinned(kSlots * sizeof(std::int32_t)));
  {
    cuda::StreamGuard guard(stream);
    Tensor logits = Tensor::empty({1, kVocab}, DType::bf16, Device::cuda());
    Tensor ids = Tensor::empty({1}, DType::i32, Device::cuda());
    Tensor counter = Tensor::zeros({1}, DType::i32, Device::cuda());
    cuda::ArgmaxOptions options;
    options.host_mirror = mirror;
    options.mirror_counter = static_cast<std::uint32_t*>(counter.raw_data());
    options.mirror_slots = kSlots;
    cuda::GraphExec graph = nullptr;
    for (int n = 0; n < 7; ++n) {
      SCOPED_TRACE("launch " + std::to_string(n));
      Tensor host = testing::random_tensor(rng, {1, kVocab}, DType::bf16);
      host.set({0, rng.integer(0, kVocab - 1)}, kPlanted);
      cuda::synchronize();
      logits.copy_from(host);
      mirror[0] = mirror[1] = kUnwritten;
      if (n < 3) {  // eager launches, then one capture replayed
        cuda::argmax(logits, ids, options);
      } else {
        if (graph == nullptr) {
          cuda::begin_capture(stream);
          cuda::argmax(logits, ids, options);
          graph = cuda::end_capture(stream);
        }
        cuda::launch_graph(graph, stream);
      }
      cuda::stream_synchronize(stream);
      const std::int32_t want = cpu_ids(host)[0];
      EXPECT_EQ(ids_of(ids)[0], want);
      EXPECT_EQ(mirror[n % kSlots], want);
      EXPECT_EQ(mirror[(n + 1) % kSlots], kUnwritten);
      EXPECT_EQ(counter.to_device(Device::cpu()).data<std::int32_t>()[0], n + 1);
    }
    cuda::destroy_graph(graph);
  }
  cuda::free_pinned(mirror);
  cuda::destroy_stream(stream);
}

TEST(CudaArgmax, PdlOnAndOffAfterAProducerKernel) {
  SKIP_WITHOUT_GPU();
  testing::PdlScope restore;
  Rng rng(41);
  constexpr std::int64_t kVocab = 151936;
  cuda::Stream stream = cuda::create_stream();
  for (bool pdl : {false, true})
    for (int trial = 0; trial < 4; ++trial) {
      cuda::set_pdl_enabled(pdl);
      Tensor host = testing::random_tensor(rng, {1, kVocab}, DType::f32);
      host.set({0, rng.integer(0, kVocab - 1)}, kPlanted);
      const Tensor source = upload(host);
      Tensor logits = Tensor::empty({1, kVocab}, DType::bf16, Device::cuda());
      Tensor ids = Tensor::zeros({1}, DType::i32, Device::cuda());
      {
        cuda::StreamGuard guard(stream);
        cuda::cast(source, logits);  // the producer: argmax must wait for it
        cuda::argmax(logits, ids);
      }
      cuda::stream_synchronize(stream);
      EXPECT_EQ(ids_of(ids), cpu_ids(host.to(DType::bf16))) << "pdl " << pdl << " trial " << trial;
    }
  cuda::destroy_stream(stream);
}

TEST(CudaArgmax, BadArgumentsAreTypedErrorsNamingTheArgument) {
  SKIP_WITHOUT_GPU();
  const Tensor logits = Tensor::zeros({2, 5}, DType::f32, Device::cuda());
  Tensor ids = Tensor::zeros({2}, DType::i32, Device::cuda());
  Tensor host_ids = Tensor::zeros({2}, DType::i32);
  Tensor ids_i64 = Tensor::zeros({2}, DType::i64, Device::cuda());
  Tensor ids_short = Tensor::zeros({1}, DType::i32, Device::cuda());
  testing::expect_error_with<DeviceError>(
      [&] {
        cuda::argmax(Tensor::zeros({2, 5}, DType::f32), ids);
      },
      "`logits` must be on cuda");
  testing::expect_error_with<DeviceError>([&] { cuda::argmax(logits, host_ids); },
                                          "`ids` must be on cuda");
  testing::expect_error_with<DTypeError>(
      [&] {
        cuda::argmax(Tensor::zeros({2, 5}, DType::i32, Device::cuda()), ids);
      },
      "`logits` must be f32, f16 or bf16, got i32");
  testing::expect_error_with<DTypeError>([&] { cuda::argmax(logits, ids_i64); },
                                         "`ids` must be i32, got i64");
  testing::expect_error_with<ShapeError>([&] { cuda::argmax(logits, ids_short); },
                                         "`ids` must have shape [2]");
  testing::expect_error_with<LayoutError>(
      [&] {
        cuda::argmax(Tensor::zeros({5, 2}, DType::f32, Device::cuda()).permute({1, 0}), ids);
      },
      "unit stride on its vocab axis");
  for (int bad : {-1, 9}) {
    cuda::ArgmaxOptions options;
    options.ctas_per_row = bad;
    testing::expect_error_with<ValueError>([&] { cuda::argmax(logits, ids, options); },
                                           "`ctas_per_row` must be in [0, 8]");
  }
  // A mirror ring: needs the mirror, at least one slot and one row.
  Tensor counter = Tensor::zeros({1}, DType::i32, Device::cuda());
  auto* mirror = static_cast<std::int32_t*>(cuda::alloc_pinned(2 * sizeof(std::int32_t)));
  cuda::ArgmaxOptions ring;
  ring.mirror_counter = static_cast<std::uint32_t*>(counter.raw_data());
  ring.mirror_slots = 2;
  testing::expect_error_with<ValueError>(
      [&] { cuda::argmax(logits.slice(0, 0, 1), ids_short, ring); },
      "`mirror_counter` needs a `host_mirror` ring");
  ring.host_mirror = mirror;
  ring.mirror_slots = 0;
  testing::expect_error_with<ValueError>(
      [&] { cuda::argmax(logits.slice(0, 0, 1), ids_short, ring); },
      "`mirror_slots` must be >= 1, got 0");
  ring.mirror_slots = 2;
  testing::expect_error_with<ValueError>([&] { cuda::argmax(logits, ids, ring); },
                                         "takes one row, got 2 rows");
  cuda::free_pinned(mirror);
}

// ---- the session epilogue ----------------------------------------------------------------

// The epilogue's contract on CUDA: called on the host by the eager warm-up step and the capturing
// step only, its launch recorded into the graph and repeated by every replay with that step's
// values. The bf16 demo attention model (flash arm collapsed: capturable) with an epilogue that
// writes argmax(y) into a device buffer and the pinned mirror; each step's ids are checked against
// the CPU argmax of that step's output.
TEST(CudaSessionEpilogue, CalledByEagerAndCapturingStepsReplayedAfter) {
  SKIP_WITHOUT_GPU();
  DemoAttentionOptions o;
  o.num_layers = 2;
  o.batch = 1;
  o.num_qo_heads = 4;
  o.num_kv_heads = 2;
  o.head_dim = 64;
  o.capacity = 64;
  o.dtype = DType::bf16;
  DemoAttentionGraph demo = build_demo_attention_graph(o);
  for (const DecodeFlashSpec& spec : demo.specs) {
    const OfferResult r = offer_decode_flash_arm(demo.graph, spec, cuda_flash_decode_contract());
    ASSERT_TRUE(r.offered) << r.reason;
    collapse(demo.graph, r.branch, 1);
  }
  eliminate_dead_code(demo.graph);
  constexpr std::int64_t kDim = 4 * 64;  // num_qo_heads * head_dim
  Tensor ids = Tensor::zeros({1}, DType::i32, Device::cuda());
  auto* mirror = static_cast<std::int32_t*>(cuda::alloc_pinned(sizeof(std::int32_t)));
  int calls = 0;
  {
    SessionOptions options;
    options.device = Device::cuda();
    options.require_cuda_graph = true;
    options.epilogue = [&](const std::map<std::string, Tensor>& outputs) {
      ++calls;
      const Tensor y = outputs.at("y").reshape({1, kDim});  // [1, 1, dim] -> [1, dim]
      cuda::ArgmaxOptions argmax_options;
      argmax_options.host_mirror = mirror;
      cuda::argmax(y, ids, argmax_options);
    };
    Session session(std::move(demo.graph), options);
    Rng rng(47);
    for (std::int64_t step = 1; step <= 12; ++step) {
      const Tensor x = testing::random_tensor(rng, {1, 1, kDim}, DType::bf16);
      *mirror = kUnwritten;
      session.step({{"k_len", step}}, {{"x", x.to_device(Device::cuda())}});
      cuda::synchronize();
      const Tensor y = download(session.output("y")).reshape({1, kDim});
      const std::vector<std::int32_t> want = cpu_ids(y);
      EXPECT_EQ(ids_of(ids), want) << "step " << step;
      EXPECT_EQ(*mirror, want[0]) << "step " << step;
      EXPECT_EQ(session.last_step_replayed(), step >= 2) << "step " << step;
      EXPECT_EQ(calls, std::min<std::int64_t>(step, 2)) << "step " << step;
    }
  }
  cuda::free_pinned(mirror);
}

// ---- decoding ------------------------------------------------------------------------------

Generator default_generator(bool greedy_in_step, bool fused) {
  const std::string dir = default_model_dir();
  const ModelConfig config = load_config(dir);
  const Weights weights = Weights::from_directory(dir);
  BuildOptions build;
  build.max_seq_len = 96;
  GeneratorOptions options;
  options.device = Device::cuda();
  options.greedy_in_step = greedy_in_step;
  // Collapse every branch to the fused arms (still verified against the decomposed ones) or to
  // the decomposed arms, without timing them.
  options.optimize.tune.time_override = [fused](NodeId, int arm, std::int64_t) {
    return (arm == 0) == fused ? 2.0 : 1.0;
  };
  return Generator(build_decode_model(config, weights, build), options);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `pipelined_with_stops`: whether the model decodes pipelined with stop tokens (no KDA state).
void expect_in_step_equals_host(Generator& in_step, Generator& host, std::int64_t tokens,
                                bool expect_replay, const char* what, bool pipelined_with_stops) {
  const std::vector<std::int32_t> prompt = {1};
  GenerateOptions options;
  options.max_new_tokens = tokens;
  const GenerateResult want = host.generate(prompt, options);
  const GenerateResult got = in_step.generate(prompt, options);
  EXPECT_FALSE(want.greedy_in_step) << what;
  EXPECT_TRUE(got.greedy_in_step) << what;
  EXPECT_FALSE(want.pipelined) << what;
  EXPECT_TRUE(got.pipelined) << what << ": no stop tokens, no kept logits";
  ASSERT_EQ(want.tokens.size(), static_cast<std::size_t>(tokens)) << what;
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_TRUE(testing::bit_equal(got.prompt_logits, want.prompt_logits)) << what;
  EXPECT_EQ(in_step.session().last_step_replayed(), expect_replay)
      << what << "\n"
      << in_step.session().cuda_graph_status();
  std::printf("[%s] %lld greedy tokens: in-step %.1f us/token, host path %.1f us/token (p50)\n",
              what, static_cast<long long>(tokens), median(got.step_us), median(want.step_us));
  const std::set<std::int32_t> distinct(want.tokens.begin(), want.tokens.end());
  std::printf("[%s] %zu distinct ids\n", what, distinct.size());
  // Every step's logits (keep_logits), bit-equal: the same kernels on the same device.
  in_step.reset();
  host.reset();
  options.keep_logits = true;
  const GenerateResult kept_want = host.generate(prompt, options);
  const GenerateResult kept_got = in_step.generate(prompt, options);
  EXPECT_EQ(kept_got.tokens, want.tokens) << what;
  EXPECT_FALSE(kept_got.pipelined) << what << ": every step's logits are read";
  EXPECT_TRUE(testing::bit_equal(kept_got.all_logits, kept_want.all_logits)) << what;
  // A stop token in the middle: the same tokens up to it; pipelined only where the step launched
  // past the stop can be taken back (no recurrent state). Then a second generate() continues the
  // sequence from where the first stopped: its prompt logits and tokens equal the host path's,
  // so the taken-back step left nothing behind.
  const std::size_t stop_at = want.tokens.size() / 2;
  const std::int32_t stop = want.tokens[stop_at];
  const std::size_t first_stop = static_cast<std::size_t>(
      std::find(want.tokens.begin(), want.tokens.end(), stop) - want.tokens.begin());
  in_step.reset();
  host.reset();
  GenerateOptions stopping;
  stopping.max_new_tokens = tokens;
  stopping.stop_tokens = {stop};
  const GenerateResult stopped_want = host.generate(prompt, stopping);
  const GenerateResult stopped_got = in_step.generate(prompt, stopping);
  EXPECT_EQ(stopped_got.pipelined, pipelined_with_stops) << what;
  EXPECT_TRUE(stopped_got.stopped_on_token) << what;
  EXPECT_EQ(stopped_got.tokens,
            std::vector<std::int32_t>(want.tokens.begin(), want.tokens.begin() + first_stop + 1))
      << what;
  EXPECT_EQ(in_step.position(), host.position()) << what;
  GenerateOptions more;
  more.max_new_tokens = 6;
  const GenerateResult more_want = host.generate({3}, more);
  const GenerateResult more_got = in_step.generate({3}, more);
  EXPECT_EQ(more_got.tokens, more_want.tokens) << what << " (after the stop)";
  EXPECT_TRUE(testing::bit_equal(more_got.prompt_logits, more_want.prompt_logits)) << what;
  // step_greedy: the first token from the host, then continuations that never leave the device.
  in_step.reset();
  std::vector<std::int32_t> chain = {in_step.step_greedy(prompt[0])};
  while (chain.size() < want.tokens.size()) chain.push_back(in_step.step_greedy());
  EXPECT_EQ(chain, want.tokens) << what << " (step_greedy)";
}

TEST(CudaGreedyDecode, DefaultModelInStepEqualsHostGreedyFor48Tokens) {
  SKIP_WITHOUT_GPU();
  Generator in_step = default_generator(true, true);
  Generator host = default_generator(false, true);
  expect_in_step_equals_host(in_step, host, 48, true, "default model, fused arms, graph replay",
                             /*pipelined_with_stops=*/false);
}

TEST(CudaGreedyDecode, DefaultModelDecomposedArmsEagerStepsInStepEqualsHostGreedy) {
  SKIP_WITHOUT_GPU();
  Generator in_step = default_generator(true, false);
  Generator host = default_generator(false, false);
  expect_in_step_equals_host(in_step, host, 48, false, "default model, decomposed arms, eager",
                             /*pipelined_with_stops=*/false);
  EXPECT_NE(in_step.session().cuda_graph_status().find("eager"), std::string::npos)
      << in_step.session().cuda_graph_status();
}

// A tiny random Llama with SmolLM2's 49152-entry vocabulary: the argmax runs as a cluster of
// several CTAs inside the replayed graph, right after the lm_head GEMV and the f32 cast.
std::string write_large_vocab_llama(const std::string& dir) {
  testing::TinyLlamaSpec spec;  // two heads of 64 (flash decode's smallest head_dim), one KV head
  spec.vocab = 49152;
  spec.layers = 1;
  spec.tied = false;
  spec.lm_head_stddev = 0.3;
  spec.norm_stddev = 0.1;
  spec.seed = 43;
  spec.dtype = DType::bf16;
  return testing::write_tiny_llama(dir, spec);
}

TEST(CudaGreedyDecode, LargeVocabLlamaInStepEqualsHostGreedy) {
  SKIP_WITHOUT_GPU();
  const std::string dir = write_large_vocab_llama(testing::process_temp_path("large_vocab_llama"));
  const ModelConfig config = load_config(dir + "/config.json");
  const Weights weights = Weights::from_directory(dir);
  ASSERT_GT(cuda::argmax_launch(config.vocab_size, DType::f32).ctas_per_row, 1);
  auto make = [&](bool greedy_in_step) {
    BuildOptions build;
    build.max_seq_len = 64;
    GeneratorOptions options;
    options.device = Device::cuda();
    options.greedy_in_step = greedy_in_step;
    options.optimize.tune.time_override = [](NodeId, int arm, std::int64_t) {
      return arm == 0 ? 2.0 : 1.0;
    };
    return Generator(build_decode_model(config, weights, build), options);
  };
  Generator in_step = make(true);
  Generator host = make(false);
  expect_in_step_equals_host(in_step, host, 32, true, "49152-vocab llama, graph replay",
                             /*pipelined_with_stops=*/true);
}

}  // namespace
}  // namespace splice
