// The kernel emulator: runs Kiln's CUDA C kernels on the CPU.
//
// A kernel source is compiled with the host C++ compiler with this header
// forced in front of it (`-include kiln_emu.h`), the way NVRTC compiles it for
// a GPU. Blocks of a launch run one after another on the calling OS thread;
// the threads of a block are fibers (ucontext) switched cooperatively, so
// `__shared__` is a static buffer, `__syncthreads` a barrier across the
// block's live fibers and a warp shuffle an exchange through a per-warp buffer
// between two warp barriers. A barrier reached from two different call sites
// is reported as an error (it is undefined behaviour on a GPU).
//
// Each kernel `K` gets an entry point `kiln_emu_launch_K(const kiln_emu_launch*,
// void** args)` (args as cuLaunchKernel takes them), appended to the source by
// the Rust side with KILN_EMU_EXPORT(K).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cstddef>
#include <csetjmp>
#include <algorithm>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>
#include <ucontext.h>

#define KILN_EMULATOR 1

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  dim3() = default;
  dim3(unsigned int x_, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

extern "C" struct kiln_emu_launch {
  unsigned int grid[3];
  unsigned int block[3];
  unsigned int shared_bytes;
  // Launched as a programmatic dependent: every thread must call
  // kiln_wait_inputs() (kiln_cuda.cuh) before it returns.
  unsigned int programmatic;
};

namespace kiln_emu {

constexpr int kWarp = 32;
constexpr size_t kStackBytes = 128 * 1024;
// Bytes past a launch's dynamic shared memory (as many again, and this
// many more) held at kGuardByte and checked after each block: a write past
// what the host asked for fails the launch (on a GPU it would land in
// another block's memory, or fault).
constexpr size_t kSharedGuard = 256;
constexpr unsigned char kGuardByte = 0xa5;

#if defined(__x86_64__)
// A fiber switch of its own: the callee-saved registers, MXCSR and the x87
// control word go on the stack, and the stack pointer is swapped (a few
// nanoseconds, where swapcontext makes two system calls).
extern "C" void kiln_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .hidden kiln_emu_switch
  .type kiln_emu_switch, @function
kiln_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kiln_emu_switch, .-kiln_emu_switch
)");

struct Context {
  void* sp = nullptr;
};

inline void switch_to(Context& from, Context& to) { kiln_emu_switch(&from.sp, to.sp); }

// A context that starts `entry` (which must never return) on `stack`.
inline void make_context(Context& c, unsigned char* stack, size_t size, void (*entry)()) {
  uintptr_t top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                             // entry's return address: never used
  *--sp = reinterpret_cast<void*>(entry);      // where the switch returns to
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
  --sp;
  unsigned int mxcsr = 0x1f80;
  unsigned short fpu = 0x037f;
  memcpy(sp, &mxcsr, 4);
  memcpy(reinterpret_cast<char*>(sp) + 4, &fpu, 2);
  c.sp = sp;
}
#else
struct Context {
  ucontext_t uc;
};

inline void switch_to(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

inline void make_context(Context& c, unsigned char* stack, size_t size, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

struct Fiber {
  Context context;
  uint3 tid;
  int linear = 0;
  bool done = false;
  bool awaited = false;  // called kiln_wait_inputs()
  // Barrier bookkeeping: the generation seen on arrival (-1: not waiting).
  long long waiting_gen = -1;
  bool waiting_warp = false;
  // cp.async copies issued and not yet waited for: applied at the wait, so
  // a kernel that reads shared memory before waiting reads stale bytes.
  struct PendingCopy {
    void* to;
    unsigned char bytes[16];
  };
  std::vector<PendingCopy> copies;
};

struct Barrier {
  int arrived = 0;
  long long gen = 0;
  long site = 0;
};

struct Block {
  std::vector<Fiber> fibers;
  int live = 0;
  int current = 0;
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<int> warp_live;
  std::vector<unsigned long long> exchange;  // one slot per thread
  std::vector<unsigned> fragments;           // mma operands: 6 registers per thread
  std::vector<unsigned char> dynamic_shared;
  Context scheduler;
  bool direct = false;
  jmp_buf escape;  // without fibers: where an abandoned thread returns to
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  char error[512] = {0};
};

struct State {
  uint3 thread_idx{0, 0, 0};
  uint3 block_idx{0, 0, 0};
  dim3 block_dim;
  dim3 grid_dim;
  Block* block = nullptr;
};

inline thread_local State state;
inline thread_local char last_error[512];
// Fiber stacks, kept across launches (uninitialized: a fresh stack per
// thread per launch would cost a memset of the whole block's stacks).
inline thread_local std::vector<std::unique_ptr<unsigned char[]>> stacks;

inline Fiber& self() { return state.block->fibers[state.block->current]; }

// kiln_wait_inputs() on the emulator: launches run one after another, so
// there is nothing to wait for; what is recorded is that the thread asked.
inline void inputs_awaited() { self().awaited = true; }

inline void fail(const char* what) {
  Block* b = state.block;
  if (b->error[0] == 0) {
    snprintf(b->error, sizeof b->error, "%s", what);
  }
}

// Switches to the scheduler, which resumes the next fiber.
inline void yield() { switch_to(self().context, state.block->scheduler); }

// Leaves the current thread for good after a failure (its block stops): the
// access that failed is never made (a misaligned 16-byte load would fault on
// the CPU too).
[[noreturn]] inline void abandon() {
  Block* b = state.block;
  if (b->direct) longjmp(b->escape, 1);
  switch_to(self().context, b->scheduler);
  abort();  // the scheduler never resumes a thread of a failed block
}

// A GPU faults on a load or store at an address not a multiple of its size
// (a 16-byte vector at 8, a word at 2); the CPU does not. Kernels are
// compiled with -fsanitize=alignment, whose checks call the handler below
// (defined here, hidden, so they bind to it and not to the sanitizer
// runtime's, which GCC links but nothing calls): a misaligned access in a
// kernel fails its launch, naming the type, the address and the source line
// (file:line:column).
struct UbsanLocation {
  const char* file;
  unsigned line, column;
};
struct UbsanType {
  unsigned short kind, info;
  char name[1];
};
struct UbsanMismatch {
  UbsanLocation location;
  const UbsanType* type;
  unsigned char log_alignment;
  unsigned char check;  // 0 load, 1 store, 2 reference binding, 3 member access, ...
};

inline void misaligned(const UbsanMismatch* data, uintptr_t address) {
  // The check also reports null pointers (with -fsanitize=null, not asked
  // for); only misalignment is a failure here.
  uintptr_t alignment = uintptr_t(1) << data->log_alignment;
  if (address == 0 || address % alignment == 0 || state.block == nullptr) return;
  static const char* const checks[] = {"load of", "store to", "reference to", "member access in"};
  char message[400];
  snprintf(message, sizeof message,
           "misaligned %s %s at address %#llx (it needs %u-byte alignment; a GPU faults) at %s:%u:%u",
           data->check < 4 ? checks[data->check] : "access to", data->type->name,
           (unsigned long long)address, (unsigned)alignment, data->location.file, data->location.line,
           data->location.column);
  fail(message);
  abandon();
}

inline void trampoline() {
  Block* b = state.block;
  b->body(b->body_arg);
  Fiber& f = self();
  if (!f.copies.empty()) fail("a thread exits with asynchronous copies (cp.async) never waited for");
  f.done = true;
  b->live -= 1;
  b->warp_live[f.linear / kWarp] -= 1;
  // A thread that exits no longer counts at barriers: release waiters.
  if (b->block_barrier.arrived > 0 && b->block_barrier.arrived == b->live) {
    b->block_barrier.arrived = 0;
    b->block_barrier.gen += 1;
  }
  Barrier& w = b->warp_barriers[f.linear / kWarp];
  if (w.arrived > 0 && w.arrived == b->warp_live[f.linear / kWarp]) {
    w.arrived = 0;
    w.gen += 1;
  }
  switch_to(f.context, b->scheduler);
}

inline void barrier_wait(Barrier& barrier, int participants, long site) {
  if (state.block->direct) {
    fail("a barrier or shuffle in a module the emulator runs without fibers (KILN_EMU_DIRECT)");
    return;
  }
  if (barrier.arrived == 0) {
    barrier.site = site;
  } else if (barrier.site != site) {
    char message[200];
    snprintf(message, sizeof message,
             "threads of one block wait at barriers on different lines (%ld and %ld)",
             barrier.site, site);
    fail(message);
  }
  long long gen = barrier.gen;
  barrier.arrived += 1;
  if (barrier.arrived == participants) {
    barrier.arrived = 0;
    barrier.gen += 1;
    return;
  }
  while (barrier.gen == gen && state.block->error[0] == 0) {
    yield();
  }
}

inline void syncthreads(long site) {
  barrier_wait(state.block->block_barrier, state.block->live, site);
}

inline void syncwarp(long site) {
  int warp = self().linear / kWarp;
  barrier_wait(state.block->warp_barriers[warp], state.block->warp_live[warp], site);
}

template <typename T>
T shuffle(T value, int src_lane_in_warp, long site) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  Block* b = state.block;
  int linear = self().linear;
  int warp_base = linear - linear % kWarp;
  unsigned long long bits = 0;
  memcpy(&bits, &value, sizeof(T));
  b->exchange[linear] = bits;
  syncwarp(site);
  T out = value;
  int src = warp_base + src_lane_in_warp;
  if (src >= 0 && src < (int)b->fibers.size() && !b->fibers[src].done) {
    memcpy(&out, &b->exchange[src], sizeof(T));
  }
  syncwarp(site);
  return out;
}

inline int lane() { return self().linear % kWarp; }

inline float bf16_bits_to_float(unsigned bits) {
  unsigned u = (bits & 0xffffu) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// PTX's mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 for one warp (d += a·b):
// every lane posts its A (4 registers) and B (2) fragments, then computes
// its own four elements of D from the whole warp's fragments, in the layout
// kiln_cuda.cuh's mma_bf16_16816 documents.
inline void mma_bf16_16816(float* d, const unsigned* a, const unsigned* b, long site) {
  Block* blk = state.block;
  int linear = self().linear;
  int base = linear - linear % kWarp;
  unsigned* mine = &blk->fragments[linear * 6];
  for (int i = 0; i < 4; ++i) mine[i] = a[i];
  mine[4] = b[0];
  mine[5] = b[1];
  syncwarp(site);
  // Element (row, k) of A and (k, col) of B, from the lane that holds it.
  auto a_at = [&](int row, int k) {
    int holder = base + 4 * (row % 8) + (k % 8) / 2;
    unsigned reg = blk->fragments[holder * 6 + row / 8 + 2 * (k / 8)];
    return bf16_bits_to_float(k % 2 ? reg >> 16 : reg);
  };
  auto b_at = [&](int k, int col) {
    int holder = base + 4 * col + (k % 8) / 2;
    unsigned reg = blk->fragments[holder * 6 + 4 + k / 8];
    return bf16_bits_to_float(k % 2 ? reg >> 16 : reg);
  };
  int group = (linear - base) / 4, pair = (linear - base) % 4;
  for (int i = 0; i < 4; ++i) {
    int row = group + 8 * (i / 2), col = 2 * pair + i % 2;
    float sum = d[i];
    for (int k = 0; k < 16; ++k) sum += a_at(row, k) * b_at(k, col);
    d[i] = sum;
  }
  syncwarp(site);
}

// PTX's ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 for one warp: lane
// i posts the address of row i % 8 of 8×8 matrix i / 8 (8 b16, 16-byte
// aligned); register m of every lane then gets two elements of matrix m:
// (row lane / 4, columns 2 (lane % 4), +1), or with `trans` (rows 2 (lane %
// 4), +1, column lane / 4), the lower in the low half.
inline void ldmatrix_x4(unsigned* r, const void* row, bool trans, long site) {
  Block* blk = state.block;
  int linear = self().linear;
  int base = linear - linear % kWarp, l = linear - base;
  if (reinterpret_cast<unsigned long long>(row) % 16 != 0) fail("ldmatrix: a row address not 16-byte aligned");
  blk->exchange[linear] = reinterpret_cast<unsigned long long>(row);
  syncwarp(site);
  for (int m = 0; m < 4; ++m) {
    unsigned halves[2];
    for (int h = 0; h < 2; ++h) {
      int row_in = trans ? 2 * (l % 4) + h : l / 4, column = trans ? l / 4 : 2 * (l % 4) + h;
      const unsigned short* p = reinterpret_cast<const unsigned short*>(blk->exchange[base + 8 * m + row_in]);
      halves[h] = p[column];
    }
    r[m] = halves[0] | (halves[1] << 16);
  }
  syncwarp(site);
}

// PTX's cp.async of 16 bytes (zeros when !valid), completed at
// copy_async_wait(): the source is read at the copy, shared memory written
// at the wait. Until then the destination holds 0xff bytes (a NaN in every
// float type), as on a GPU it holds whatever the copy has landed so far: a
// read before the wait, or a copy issued over data another thread still
// reads (a missing barrier), shows.
inline void copy_async_16(void* to, const void* from, bool valid) {
  if (reinterpret_cast<unsigned long long>(to) % 16 != 0 || (valid && reinterpret_cast<unsigned long long>(from) % 16 != 0))
    fail("cp.async: an address not 16-byte aligned");
  memset(to, 0xff, 16);
  Fiber::PendingCopy copy;
  copy.to = to;
  if (valid)
    memcpy(copy.bytes, from, 16);
  else
    memset(copy.bytes, 0, 16);
  self().copies.push_back(copy);
}

inline void copy_async_wait() {
  for (const Fiber::PendingCopy& copy : self().copies) memcpy(copy.to, copy.bytes, 16);
  self().copies.clear();
}

inline void* dynamic_shared() { return state.block->dynamic_shared.data(); }

// Runs `body` for every thread of every block of the launch.
inline int run(const kiln_emu_launch* cfg, void (*body)(void*), void* arg) {
  Block block;
  int threads = (int)(cfg->block[0] * cfg->block[1] * cfg->block[2]);
  if (threads <= 0 || threads > 1024) {
    snprintf(last_error, sizeof last_error, "block of %d threads (1..1024 allowed)", threads);
    return 1;
  }
  block.fibers.resize(threads);
#ifdef KILN_EMU_DIRECT
  // No barrier or shuffle in this module: threads run one after another as
  // plain calls.
  block.direct = true;
#else
  while ((int)stacks.size() < threads) stacks.emplace_back(new unsigned char[kStackBytes]);
#endif
  block.warp_barriers.resize((threads + kWarp - 1) / kWarp);
  block.exchange.assign(threads, 0);
  block.fragments.assign(threads * 6, 0);
  block.dynamic_shared.assign(2 * (size_t)cfg->shared_bytes + kSharedGuard, 0);
  block.body = body;
  block.body_arg = arg;
  State saved = state;
  state.block = &block;
  state.block_dim = dim3(cfg->block[0], cfg->block[1], cfg->block[2]);
  state.grid_dim = dim3(cfg->grid[0], cfg->grid[1], cfg->grid[2]);
  int status = 0;
  for (unsigned bz = 0; bz < cfg->grid[2] && status == 0; ++bz)
    for (unsigned by = 0; by < cfg->grid[1] && status == 0; ++by)
      for (unsigned bx = 0; bx < cfg->grid[0] && status == 0; ++bx) {
        state.block_idx = uint3{bx, by, bz};
        // Dynamic shared memory starts as NaN bytes, as a GPU's starts as
        // garbage: a read before a write shows up.
        auto guard = block.dynamic_shared.begin() + cfg->shared_bytes;
        std::fill(block.dynamic_shared.begin(), guard, 0xff);
        std::fill(guard, block.dynamic_shared.end(), kGuardByte);
        block.live = threads;
        block.block_barrier = Barrier{};
        for (auto& w : block.warp_barriers) w = Barrier{};
        block.warp_live.assign(block.warp_barriers.size(), 0);
        for (int t = 0; t < threads; ++t) {
          Fiber& f = block.fibers[t];
          f.linear = t;
          f.done = false;
          f.awaited = false;
          f.tid = uint3{t % cfg->block[0], (t / cfg->block[0]) % cfg->block[1],
                        t / (cfg->block[0] * cfg->block[1])};
          block.warp_live[t / kWarp] += 1;
          if (!block.direct) make_context(f.context, stacks[t].get(), kStackBytes, trampoline);
        }
        if (block.direct) {
          for (int t = 0; t < threads && block.error[0] == 0; ++t) {
            block.current = t;
            state.thread_idx = block.fibers[t].tid;
            if (setjmp(block.escape) == 0) body(arg);
          }
        }
        // Round-robin over unfinished fibers until all are done.
        int remaining = block.direct ? 0 : threads;
        while (remaining > 0 && block.error[0] == 0) {
          remaining = 0;
          for (int t = 0; t < threads; ++t) {
            if (block.fibers[t].done) continue;
            block.current = t;
            state.thread_idx = block.fibers[t].tid;
            switch_to(block.scheduler, block.fibers[t].context);
            if (!block.fibers[t].done) remaining += 1;
            if (block.error[0] != 0) break;
          }
        }
        if (block.error[0] == 0 &&
            !std::all_of(guard, block.dynamic_shared.end(), [](unsigned char b) { return b == kGuardByte; }))
          snprintf(block.error, sizeof block.error, "a write past its %u bytes of dynamic shared memory",
                   cfg->shared_bytes);
        for (int t = 0; cfg->programmatic && t < threads && block.error[0] == 0; ++t)
          if (!block.fibers[t].awaited)
            snprintf(block.error, sizeof block.error,
                     "thread %d of a programmatic launch returned without kiln_wait_inputs(): on a GPU "
                     "it could run before the previous kernel's writes",
                     t);
        if (block.error[0] != 0) {
          snprintf(last_error, sizeof last_error, "block (%u, %u, %u): %s", bx, by, bz,
                   block.error);
          status = 1;
        }
      }
  state = saved;
  return status;
}

template <typename... A, size_t... I>
void call_with(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
  kernel(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

template <typename... A>
struct Call {
  void (*kernel)(A...);
  void** args;
  static void invoke(void* self) {
    auto* c = static_cast<Call*>(self);
    call_with(c->kernel, c->args, std::index_sequence_for<A...>{});
  }
};

template <typename... A>
int launch(void (*kernel)(A...), const kiln_emu_launch* cfg, void** args) {
  Call<A...> call{kernel, args};
  return run(cfg, &Call<A...>::invoke, &call);
}

}  // namespace kiln_emu

// Not `inline`: an inline function nobody calls is never emitted, and the
// Rust side resolves this symbol with dlsym.
extern "C" const char* kiln_emu_last_error() { return kiln_emu::last_error; }

// The alignment check's handler (kiln_emu::misaligned); hidden, so the
// module's checks bind to it and not to a sanitizer runtime.
extern "C" __attribute__((visibility("hidden"))) void __ubsan_handle_type_mismatch_v1(
    kiln_emu::UbsanMismatch* data, uintptr_t address) {
  kiln_emu::misaligned(data, address);
}

#define KILN_EMU_EXPORT(name)                                                        \
  extern "C" int kiln_emu_launch_##name(const kiln_emu_launch* cfg, void** args) {   \
    return kiln_emu::launch(name, cfg, args);                                        \
  }

// ---- CUDA C spelled for the host compiler ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__ static thread_local
#define KILN_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(kiln_emu::dynamic_shared())
#define threadIdx (kiln_emu::state.thread_idx)
#define blockIdx (kiln_emu::state.block_idx)
#define blockDim (kiln_emu::state.block_dim)
#define gridDim (kiln_emu::state.grid_dim)
#define warpSize 32
#define __syncthreads() kiln_emu::syncthreads(__LINE__)
#define __syncwarp(...) kiln_emu::syncwarp(__LINE__)

template <typename T>
inline T kiln_emu_shfl_xor(T v, int mask, int width, long site) {
  int l = kiln_emu::lane();
  int base = l - l % width;
  int src = base + ((l % width) ^ mask);
  if (src >= base + width) src = l;
  return kiln_emu::shuffle(v, src, site);
}
template <typename T>
inline T kiln_emu_shfl_down(T v, unsigned delta, int width, long site) {
  int l = kiln_emu::lane();
  int base = l - l % width;
  int src = l + (int)delta;
  if (src >= base + width) src = l;
  return kiln_emu::shuffle(v, src, site);
}
template <typename T>
inline T kiln_emu_shfl_up(T v, unsigned delta, int width, long site) {
  int l = kiln_emu::lane();
  int base = l - l % width;
  int src = l - (int)delta;
  if (src < base) src = l;
  return kiln_emu::shuffle(v, src, site);
}
template <typename T>
inline T kiln_emu_shfl(T v, int src_lane, int width, long site) {
  int l = kiln_emu::lane();
  int base = l - l % width;
  return kiln_emu::shuffle(v, base + src_lane % width, site);
}
// A warp vote as five exchanges (an OR across the lanes' predicates).
inline bool kiln_emu_any(bool predicate, long site) {
  int l = kiln_emu::lane(), any = predicate ? 1 : 0;
  for (int o = 1; o < 32; o <<= 1) any |= kiln_emu::shuffle(any, l ^ o, site);
  return any != 0;
}
#define __any_sync(mask, predicate) kiln_emu_any((predicate), __LINE__)
#define KILN_EMU_WIDTH(w, ...) w
#define __shfl_xor_sync(mask, v, lane_mask, ...) \
  kiln_emu_shfl_xor((v), (lane_mask), KILN_EMU_WIDTH(__VA_ARGS__ __VA_OPT__(, ) 32), __LINE__)
#define __shfl_down_sync(mask, v, delta, ...) \
  kiln_emu_shfl_down((v), (delta), KILN_EMU_WIDTH(__VA_ARGS__ __VA_OPT__(, ) 32), __LINE__)
#define __shfl_up_sync(mask, v, delta, ...) \
  kiln_emu_shfl_up((v), (delta), KILN_EMU_WIDTH(__VA_ARGS__ __VA_OPT__(, ) 32), __LINE__)
#define __shfl_sync(mask, v, src, ...) \
  kiln_emu_shfl((v), (src), KILN_EMU_WIDTH(__VA_ARGS__ __VA_OPT__(, ) 32), __LINE__)

// Atomics: fibers of one launch never run at the same time, so plain
// read-modify-write is atomic here.
template <typename T>
inline T atomicAdd(T* p, T v) { T old = *p; *p = old + v; return old; }
template <typename T>
inline T atomicMax(T* p, T v) { T old = *p; *p = old > v ? old : v; return old; }
template <typename T>
inline T atomicMin(T* p, T v) { T old = *p; *p = old < v ? old : v; return old; }
template <typename T>
inline T atomicExch(T* p, T v) { T old = *p; *p = v; return old; }
template <typename T>
inline T atomicCAS(T* p, T cmp, T v) { T old = *p; if (old == cmp) *p = v; return old; }
// The count wraps to 0 once it reaches `limit`, as on the GPU.
inline unsigned atomicInc(unsigned* p, unsigned limit) {
  unsigned old = *p;
  *p = old >= limit ? 0 : old + 1;
  return old;
}
// Fibers share one memory and run one at a time: writes are seen in order.
inline void __threadfence() {}

inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
inline int __float_as_int(float v) { int i; memcpy(&i, &v, 4); return i; }
inline float __uint_as_float(unsigned v) { float f; memcpy(&f, &v, 4); return f; }
inline unsigned __float_as_uint(float v) { unsigned i; memcpy(&i, &v, 4); return i; }
// Byte k of the result is byte (s >> 4k) & 7 of y:x (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long both = ((unsigned long long)y << 32) | x;
  unsigned r = 0;
  for (int k = 0; k < 4; ++k) r |= (unsigned)((both >> (8 * ((s >> (4 * k)) & 7))) & 0xff) << (8 * k);
  return r;
}
// The low 32 bits of hi:lo shifted right by shift % 32.
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift & 31));
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
template <typename T>
inline T __ldg(const T* p) { return *p; }
template <typename T>
inline T __ldcg(const T* p) { return *p; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
