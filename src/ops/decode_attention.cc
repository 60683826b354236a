// The public flash-decode attention op (spec decode_attention.md §5): argument validation against
// the backend's contract row, output allocation and device dispatch.
//
//  1. Presence and devices: q, k, v, k_len are required; every given tensor (alibi, out, lse too)
//     must sit on q's device, and that device's backend must be compiled in.
//  2. The call against the contract row of q's device (cpu_flash_decode_contract /
//     cuda_flash_decode_contract): the row's dtypes, head dims, q_len and group limits, shapes,
//     dtypes and layouts, options, the features the call uses, aliasing
//     (flash_decode_checks::check_call, which the CUDA launcher runs too).
//  3. Value contract 0 <= k_len[b] <= capacity: always on the CPU; on CUDA only with
//     options.validate (it reads k_len back, a device sync).
//  4. Allocate out / lse when undefined and dispatch to cpu::flash_decode or cuda::flash_decode.
// Every refusal is a typed error naming the argument, the value seen and what is allowed.
#include "splice/ops/decode_attention.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/flash_decode_checks.h"
#include "splice/backend/cpu/flash_decode.h"
#include "splice/core/error.h"

// The CUDA launcher's header lands separately; until it exists a CUDA build refuses CUDA tensors.
#if defined(SPLICE_WITH_CUDA) && __has_include("splice/backend/cuda/flash_decode.h")
#include "splice/backend/cuda/flash_decode.h"
#define SPLICE_FD_CUDA 1
#else
#define SPLICE_FD_CUDA 0
#endif

namespace splice {

namespace {

void check_same_device(const Tensor& t, const char* name, const Device& device) {
  if (!(t.device() == device))
    fail<DeviceError>("`", name, "` must be on ", device.str(), " (the device of `q`), got ",
                      t.device().str());
}

// Stage 3: 0 <= k_len[b] <= capacity, k_len read on the host.
void check_k_len_values(const Tensor& k_len_host, std::int64_t capacity) {
  const std::int32_t* data = k_len_host.data<std::int32_t>();
  for (std::int64_t b = 0; b < k_len_host.size(0); ++b) {
    const std::int64_t len = data[b * k_len_host.stride(0)];
    if (len < 0 || len > capacity)
      fail<ValueError>("`k_len[", b, "]` must be in [0, ", capacity,
                       "] (the capacity of `k`), got ", len);
  }
}

}  // namespace

Tensor decode_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_len,
                        const Tensor* alibi, const DecodeAttentionOptions& options, Tensor out,
                        Tensor* lse) {
  // Stage 1: presence and devices.
  check_defined(q, "q");
  check_defined(k, "k");
  check_defined(v, "v");
  check_defined(k_len, "k_len");
  if (alibi) check_defined(*alibi, "alibi");
  const Device device = q.device();
  check_same_device(k, "k", device);
  check_same_device(v, "v", device);
  check_same_device(k_len, "k_len", device);
  if (alibi) check_same_device(*alibi, "alibi", device);
  if (out.defined()) check_same_device(out, "out", device);
  if (lse && lse->defined()) check_same_device(*lse, "lse", device);
#if !SPLICE_FD_CUDA
  if (device.is_cuda())
    fail<DeviceError>("decode_attention: `q` is on ", device.str(),
                      " but this build has no CUDA backend (allowed: cpu)");
#endif
  const AttentionContract& row =
      device.is_cuda() ? cuda_flash_decode_contract() : cpu_flash_decode_contract();

  // Stage 2: the call against the row (backend/flash_decode_checks.h, shared with the CUDA
  // launcher).
  flash_decode_checks::check_call(row, q, k, v, k_len, alibi, options, out, lse);
  const std::int64_t batch = q.size(0), num_qo_heads = q.size(1), q_len = q.size(2),
                     head_dim = q.size(3), capacity = k.size(2);
  const Dims out_shape = {batch, num_qo_heads, q_len, head_dim};
  const Dims lse_shape = {batch, num_qo_heads, q_len};

  // Stage 3: value contract.
  if (device.is_cpu()) {
    check_k_len_values(k_len, capacity);
  } else if (options.validate) {
    check_k_len_values(k_len.to_device(Device::cpu()), capacity);
  }

  // Stage 4: allocate and dispatch.
  if (!out.defined()) out = Tensor::empty(out_shape, q.dtype(), device);
  if (lse && !lse->defined()) *lse = Tensor::empty(lse_shape, DType::f32, device);
  if (device.is_cpu()) {
    cpu::flash_decode(q, k, v, k_len, alibi, options, out, lse);
    return out;
  }
#if SPLICE_FD_CUDA
  cuda::flash_decode(q, k, v, k_len, alibi, options, out, lse);
  return out;
#else
  fail<DeviceError>("decode_attention: no backend for ", device.str(), " in this build");
#endif
}

}  // namespace splice
