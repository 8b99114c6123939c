// A small SIMT emulator for the CUDA kernels whose threads work together
// (kernels/cuda/block_kernels.cuh), so that their indexing, barriers, shuffles and reductions
// are checked on a machine without a GPU. Include it before the kernels' header.
//
// A launch runs the grid's blocks one after another; a block's threads are fibers (ucontext)
// on the calling thread, each running the kernel until it finishes or waits at a barrier:
// __syncthreads waits for the whole block, a warp shuffle for the 32 threads of its warp
// (each writes its value, all read their partner's, then all leave together). `__shared__`
// variables are function-local thread_local statics (one block runs at a time on a thread, so
// one copy per thread serves), the dynamic shared memory a buffer of the launch's size. The
// running block and the fiber stacks are per thread too, so devices driven from several
// threads at once (a serving graph's prefill and decode devices) each run their own launches. Device math is the host's (expf ...),
// and the fibers interleave only at barriers, in ascending or descending thread order (tests run
// both: a value one thread writes and others read without a barrier between is then read
// before it is written in one of them). What a real device adds (its math library, its
// scheduling, its memory model) is checked by bench/gpu_check.sh, not here.
#pragma once

#include <ucontext.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

#define TROUPE_SIMT_EMULATOR 1

// CUDA's launch dimensions (a global type there too).
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace troupe::test::simt {

using dim = ::dim3;

struct thread_state {
  ucontext_t context{};
  dim index;
  bool done = false;
};

struct block_state {
  dim block_index, block_dim;
  std::vector<thread_state> threads;
  std::size_t current = 0;
  ucontext_t scheduler{};
  std::function<void()> body;
  std::vector<std::byte> dynamic_shared;
  std::size_t block_arrived = 0;
  std::uint64_t block_generation = 0;
  std::vector<std::size_t> warp_arrived;
  std::vector<std::uint64_t> warp_generation;
  std::vector<float> warp_values;
};

/// The order in which a launch's scheduler runs the threads of a block, pass after pass.
enum class order { ascending, descending };
inline order& thread_order() {
  static order o = order::ascending;
  return o;
}

inline block_state*& running() {
  static thread_local block_state* state = nullptr;
  return state;
}

inline thread_state& self() { return running()->threads[running()->current]; }

// Back to the scheduler until it resumes this thread.
inline void yield() { swapcontext(&self().context, &running()->scheduler); }

inline void sync_block() {
  block_state& b = *running();
  const std::uint64_t generation = b.block_generation;
  if (++b.block_arrived == b.threads.size()) {
    b.block_arrived = 0;
    ++b.block_generation;
    return;
  }
  while (b.block_generation == generation) yield();
}

inline void sync_warp(std::size_t warp) {
  block_state& b = *running();
  const std::uint64_t generation = b.warp_generation[warp];
  if (++b.warp_arrived[warp] == 32) {
    b.warp_arrived[warp] = 0;
    ++b.warp_generation[warp];
    return;
  }
  while (b.warp_generation[warp] == generation) yield();
}

inline float shfl_xor(float v, int lane_mask) {
  const std::size_t t = self().index.x, warp = t / 32, lane = t % 32;
  block_state& b = *running();
  b.warp_values[warp * 32 + lane] = v;
  sync_warp(warp);
  const float partner = b.warp_values[warp * 32 + (lane ^ static_cast<std::size_t>(lane_mask))];
  sync_warp(warp);  // nobody writes the next round's value before every lane has read
  return partner;
}

template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(running()->dynamic_shared.data());
}

inline void thread_entry() {
  running()->body();
  self().done = true;
}

/// Runs kernel(args...) over grid × block (one-dimensional blocks, a multiple of 32 threads),
/// with `shared_bytes` of dynamic shared memory.
template <class... Params, class... Args>
void launch(dim grid, dim block, std::size_t shared_bytes, void (*kernel)(Params...),
            Args&&... args) {
  if (block.y != 1 || block.z != 1 || block.x % 32 != 0)
    throw std::invalid_argument("simt::launch: blocks must be one-dimensional warps");
  constexpr std::size_t stack_bytes = 64 * 1024;
  // One stack per thread, kept from launch to launch (a forward pass launches hundreds).
  static thread_local std::vector<std::vector<char>> stacks;
  while (stacks.size() < block.x) stacks.emplace_back(stack_bytes);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_state b;
        b.block_index = {x, y, z};
        b.block_dim = block;
        b.body = [&] { kernel(args...); };
        b.dynamic_shared.assign(shared_bytes, std::byte{0});
        b.threads.resize(block.x);
        b.warp_arrived.assign(block.x / 32, 0);
        b.warp_generation.assign(block.x / 32, 0);
        b.warp_values.assign(block.x, 0.0f);
        running() = &b;
        for (unsigned t = 0; t < block.x; ++t) {
          thread_state& th = b.threads[t];
          th.index = {t, 0, 0};
          getcontext(&th.context);
          th.context.uc_stack.ss_sp = stacks[t].data();
          th.context.uc_stack.ss_size = stack_bytes;
          th.context.uc_link = &b.scheduler;
          makecontext(&th.context, thread_entry, 0);
        }
        // Round robin until every thread has finished. A pass in which no thread finished and
        // no barrier opened means the threads wait for each other for ever: a kernel bug.
        for (std::size_t left = block.x; left > 0;) {
          const std::uint64_t block_before = b.block_generation;
          const std::vector<std::uint64_t> warps_before = b.warp_generation;
          const std::size_t left_before = left;
          left = 0;
          for (std::size_t i = 0; i < b.threads.size(); ++i) {
            const std::size_t t =
                thread_order() == order::ascending ? i : b.threads.size() - 1 - i;
            if (b.threads[t].done) continue;
            b.current = t;
            swapcontext(&b.scheduler, &b.threads[t].context);
            left += b.threads[t].done ? 0 : 1;
          }
          if (left > 0 && left == left_before && b.block_generation == block_before &&
              b.warp_generation == warps_before)
            throw std::logic_error("simt::launch: the block's threads wait for each other");
        }
        running() = nullptr;
      }
}

}  // namespace troupe::test::simt

// The CUDA spellings the kernels use, for the host compiler.
#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define TROUPE_DYNAMIC_SHARED(type, name) type* name = ::troupe::test::simt::dynamic_shared<type>()
#define threadIdx (::troupe::test::simt::self().index)
#define blockIdx (::troupe::test::simt::running()->block_index)
#define blockDim (::troupe::test::simt::running()->block_dim)

inline void __syncthreads() { ::troupe::test::simt::sync_block(); }
// Separately rounded products and sums: the host compiler does not fuse them (no FMA for the
// baseline x86-64 it targets).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  return ::troupe::test::simt::shfl_xor(v, lane_mask);
}
