// A small SIMT emulator for the CUDA kernels whose threads work together
// (kernels/cuda/block_kernels.cuh), so that their indexing, barriers, shuffles and reductions
// are checked on a machine without a GPU. Include it before the kernels' header.
//
// A launch runs the grid's blocks one after another; a block's threads are fibers
// (Boost.Context: a switch costs a few nanoseconds, no system call) on the calling thread,
// each running the kernel until it finishes or waits at a barrier: __syncthreads waits for the whole block, a warp shuffle or ballot for the 32 threads of its
// warp (each writes its value, all read the others', then all leave together). `__shared__`
// variables are function-local thread_local statics (one block runs at a time on a thread, so
// one copy per thread serves), the dynamic shared memory a buffer of the launch's size. The
// running block and the fiber stacks are per thread too, so devices driven from several
// threads at once (a serving graph's prefill and decode devices) each run their own launches.
// Device math is the host's (expf ...), and the fibers interleave only at barriers (so an
// atomicAdd is a plain add), in ascending or descending thread order, or warp by warp (each
// warp as far as it goes before the next starts). Tests run all three: a value one thread
// writes and others read without a barrier between is then read before it is written in one of
// them, and a warp that runs ahead to overwrite shared memory another warp has yet to read does
// so in the third. What a real device adds (its math library, its scheduling, its
// memory model) is checked by bench/gpu_check.sh, not here.
#pragma once

#include <boost/context/fiber.hpp>
#include <boost/context/preallocated.hpp>
#include <boost/context/stack_context.hpp>

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
  boost::context::fiber fiber;   // the thread, while the scheduler runs
  boost::context::fiber caller;  // the scheduler, while the thread runs
  dim index;
  bool done = false;
  // Waiting at __syncthreads for the block's generation to move on from this one.
  bool at_block_barrier = false;
  std::uint64_t barrier_generation = 0;
};

struct block_state {
  dim block_index, block_dim;
  std::vector<thread_state> threads;
  std::size_t current = 0;
  std::function<void()> body;
  std::vector<std::byte> dynamic_shared;
  std::size_t block_arrived = 0;
  std::uint64_t block_generation = 0;
  std::vector<std::size_t> warp_arrived;
  std::vector<std::uint64_t> warp_generation;
  std::vector<float> warp_values;
  std::uint64_t progress = 0;  // arrivals at barriers and threads finished
};

/// The order in which a launch's scheduler runs the threads of a block, pass after pass: every
/// thread in turn up to its next wait, ascending or descending; or warp by warp, each warp's
/// threads (ascending) until all of them finish or wait at __syncthreads.
enum class order { ascending, descending, warp_by_warp };
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
inline void yield() {
  thread_state& me = self();
  me.caller = std::move(me.caller).resume();
}

inline void sync_block() {
  block_state& b = *running();
  const std::uint64_t generation = b.block_generation;
  ++b.progress;
  if (++b.block_arrived == b.threads.size()) {
    b.block_arrived = 0;
    ++b.block_generation;
    return;
  }
  self().at_block_barrier = true;
  self().barrier_generation = generation;
  while (b.block_generation == generation) yield();
  self().at_block_barrier = false;
}

// Whether `th` waits at a barrier that has not opened.
inline bool blocked(const thread_state& th, const block_state& b) {
  return th.at_block_barrier && th.barrier_generation == b.block_generation;
}

inline void sync_warp(std::size_t warp) {
  block_state& b = *running();
  const std::uint64_t generation = b.warp_generation[warp];
  ++b.progress;
  if (++b.warp_arrived[warp] == 32) {
    b.warp_arrived[warp] = 0;
    ++b.warp_generation[warp];
    return;
  }
  while (b.warp_generation[warp] == generation) yield();
}

// Every lane of the caller's warp puts in `v`; returns read(the warp's 32 values, lane).
template <class F>
auto warp_exchange(float v, F read) {
  const std::size_t t = self().index.x, warp = t / 32, lane = t % 32;
  block_state& b = *running();
  b.warp_values[warp * 32 + lane] = v;
  sync_warp(warp);
  const auto got = read(&b.warp_values[warp * 32], lane);
  sync_warp(warp);  // nobody writes the next round's value before every lane has read
  return got;
}

inline unsigned ballot(bool predicate) {
  return warp_exchange(predicate ? 1.0f : 0.0f, [](const float* values, std::size_t) {
    unsigned bits = 0;
    for (std::size_t l = 0; l < 32; ++l)
      if (values[l] != 0.0f) bits |= 1u << l;
    return bits;
  });
}

inline float shfl_xor(float v, int lane_mask) {
  return warp_exchange(v, [lane_mask](const float* values, std::size_t lane) {
    return values[lane ^ static_cast<std::size_t>(lane_mask)];
  });
}

template <class T>
T* dynamic_shared() {
  return reinterpret_cast<T*>(running()->dynamic_shared.data());
}

// A fiber stack the emulator keeps from launch to launch: nothing to free when a thread ends.
struct kept_stack {
  boost::context::stack_context context;
  boost::context::stack_context allocate() { return context; }
  void deallocate(boost::context::stack_context&) noexcept {}
};

// Resumes thread t of b until it waits or finishes.
inline void run_thread(block_state& b, std::size_t t) {
  b.current = t;
  b.threads[t].fiber = std::move(b.threads[t].fiber).resume();
}

// Runs the threads of the warp starting at thread w0 until each has finished or waits at
// __syncthreads (or they stop moving: a deadlock, which the caller reports).
inline void run_warp(block_state& b, std::size_t w0) {
  for (;;) {
    const std::uint64_t before = b.progress;
    bool ran = false;
    for (std::size_t t = w0; t < w0 + 32; ++t) {
      if (b.threads[t].done || blocked(b.threads[t], b)) continue;
      ran = true;
      run_thread(b, t);
    }
    if (!ran || b.progress == before) return;
  }
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
  namespace ctx = boost::context;
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
          ctx::stack_context sc;
          sc.size = stack_bytes;
          sc.sp = stacks[t].data() + stack_bytes;  // the top: stacks grow down
          th.fiber = ctx::fiber(std::allocator_arg, ctx::preallocated(sc.sp, sc.size, sc),
                                kept_stack{sc}, [&b, t](ctx::fiber&& scheduler) {
                                  b.threads[t].caller = std::move(scheduler);
                                  b.body();
                                  b.threads[t].done = true;
                                  ++b.progress;
                                  return std::move(b.threads[t].caller);
                                });
        }
        // Round robin until every thread has finished. A pass in which no thread finished or
        // reached a barrier means the threads wait for each other for ever: a kernel bug.
        for (std::size_t left = block.x; left > 0;) {
          const std::uint64_t before = b.progress;
          if (thread_order() == order::warp_by_warp) {
            for (std::size_t w0 = 0; w0 < b.threads.size(); w0 += 32) run_warp(b, w0);
          } else {
            for (std::size_t i = 0; i < b.threads.size(); ++i) {
              const std::size_t t =
                  thread_order() == order::ascending ? i : b.threads.size() - 1 - i;
              if (!b.threads[t].done && !blocked(b.threads[t], b)) run_thread(b, t);
            }
          }
          left = 0;
          for (const auto& th : b.threads) left += th.done ? 0 : 1;
          if (left > 0 && b.progress == before)
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
inline unsigned __ballot_sync(unsigned, bool predicate) {
  return ::troupe::test::simt::ballot(predicate);
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
// Threads interleave only at barriers, so a read-modify-write is atomic.
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned old = *p;
  *p += v;
  return old;
}
