// The resident interpreter's queue: what a call posts and the grid reads (docs/device-executor.md,
// "The resident interpreter"). Plain data shared by the host code (C++20, g++) and the resident
// kernel (C++17, nvcc), like kernel_params.h.
//
// A call's work is one *descriptor* (the fused kernel's parameter, FusedParams, plus its kernel
// and CTA count) in one of kResidentSlots slots. The host writes a slot's content into
// host-mapped memory (ResidentHostState) only while no run of that slot is in flight, and gives
// each content a new *version*. A call then needs two stream memory operations on its stream:
//   write  request[slot] = version      (the doorbell; ordered after the stream's earlier work)
//   wait   request[slot] == kRequestIdle (the stream goes on once the grid has run it)
// The grid's dispatcher sees the posted version, copies the slot's content into device memory
// when its cached copy is older, marks the request taken and hands the descriptor's CTAs to
// idle CTAs of the grid; the last of them to finish sets the request back to idle. A slot whose
// content repeats (the same executors and buffers: a persistent operation) is reused as is, so
// a repeated call costs the two memory operations and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernel_params.h"

namespace efccl::device {

/// Descriptor slots per grid (one grid per device and process).
inline constexpr uint32_t kResidentSlots = 128;
/// CTAs of the resident grid: at most this many (EFCCL_RESIDENT_CTAS).
inline constexpr uint32_t kResidentMaxCtas = 128;
/// Threads per CTA of the resident grid (the one-call kernel's default CTA size).
inline constexpr int kResidentThreads = 256;

/// request[slot]: idle (a stream may post), taken (the grid runs it), or a posted version.
inline constexpr uint32_t kRequestIdle = 0;
inline constexpr uint32_t kRequestTaken = 0xffffffffu;

/// inbox[cta]: absent (the CTA has not started, or has left), idle (it takes work), or the work
/// handed to it: (slot + 1) | (its CTA index within the descriptor << 32).
inline constexpr uint64_t kInboxAbsent = ~uint64_t{0};
inline constexpr uint64_t kInboxIdle = 0;

/// ResidentDescriptor::flags: a rank's input or output buffer is not the device's (host memory,
/// another GPU's), so the end of a run fences at system scope before it releases the stream, as
/// a kernel's end does; the device's own memory needs only a device-scope fence.
inline constexpr uint32_t kDescriptorSystemFence = 1;
/// Header bytes that identify a content (ncalls .. reduction): `flags` follows from the buffers.
inline constexpr std::size_t kResidentHeaderKeyBytes = 20;

/// One slot's content: the calls of one fused launch, as the fused kernel would take them, and
/// which kernel instantiation runs them.
struct ResidentDescriptor {
  uint32_t ncalls;
  uint32_t nranks;  ///< entries of `ranks` in use
  uint32_t nctas;   ///< CTAs the calls are placed on (FusedCall::cta_begin + nthreadblocks)
  int32_t dtype;    ///< ef::DataType value
  int32_t reduction;
  uint32_t flags;  ///< kDescriptor* bits; derived from the content (not compared: see post)
  uint32_t reserved[2];
  FusedCall calls[kMaxFusedCalls];
  RankCallArgs ranks[kMaxFusedRanks];
};

/// Byte offsets of `calls` and `ranks` (FusedCall is not standard-layout, so no offsetof): the
/// struct has no padding, which the size check proves.
inline constexpr std::size_t kResidentCallsOffset = 32;
inline constexpr std::size_t kResidentRanksOffset =
    kResidentCallsOffset + kMaxFusedCalls * sizeof(FusedCall);
static_assert(sizeof(ResidentDescriptor) ==
                  kResidentRanksOffset + kMaxFusedRanks * sizeof(RankCallArgs),
              "ResidentDescriptor has no padding");
static_assert(sizeof(FusedCall) % 8 == 0 && sizeof(RankCallArgs) % 8 == 0,
              "descriptors are copied in 8-byte words");

/// The grid's device memory (cudaMalloc'd, zeroed once; `inbox` filled with kInboxAbsent). It
/// outlives the grid's launches: a grid that left for idleness is launched again on it.
struct ResidentDeviceState {
  uint32_t request[kResidentSlots];         ///< written by streams (versions) and the grid
  uint32_t cached_version[kResidentSlots];  ///< version of descriptors[slot] (0: none yet)
  uint32_t remaining[kResidentSlots];       ///< CTAs of the slot's run still running
  uint32_t completions[kResidentSlots];     ///< runs of the slot completed (mirrored to the host)
  uint32_t lock;                            ///< the dispatcher's: 1 while a CTA dispatches
  uint32_t exiting;                         ///< the generation that is leaving (no dispatch)
  uint64_t inbox[kResidentMaxCtas];
  ResidentDescriptor descriptors[kResidentSlots];  ///< the device copies
};

/// The grid's host-mapped memory: what the host writes and what it reads back.
struct ResidentHostState {
  uint32_t stop_generation;  ///< the grid launched as generation g leaves once this is >= g
  uint32_t reserved;
  uint32_t completions[kResidentSlots];  ///< runs completed per slot (written by the grid)
  ResidentDescriptor descriptors[kResidentSlots];  ///< contents, versioned by the request
};

/// The resident kernel's parameter.
struct ResidentGridParams {
  ResidentDeviceState* device;
  ResidentHostState* host;
  uint32_t generation;  ///< > 0, one more at every launch of the grid on this state
  uint32_t nctas;       ///< gridDim.x
};

}  // namespace efccl::device
