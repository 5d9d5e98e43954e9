// The emulator's runtime: runs every threadgroup of a dispatch on the CPU with its threads as
// fibers (ucontext), switching only at barriers and SIMD-group calls. At each sync point every
// live thread must wait at the same call site; anything else (a barrier in divergent control
// flow, a SIMD call made by some lanes only, threads that returned before a barrier) is reported
// with the kernel source line. Threadgroup memory starts poisoned (0xFF bytes: NaN) and sits
// between guard zones that are checked when the group ends.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "abi.h"

namespace {

constexpr unsigned kSimdWidth = 32;
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuardBytes = 64;
constexpr unsigned long kMaxThreadgroupMemory = 32 * 1024;
constexpr unsigned kMaxThreadsPerGroup = 1024;

enum class State { Ready, AtBarrier, AtSimdBarrier, AtSimdCall, Done };

struct Fiber {
  ucontext_t ctx;
  State state = State::Ready;
  const char* file = "";
  int line = 0;
  const char* op = "";
  const void* in = nullptr;
  unsigned size = 0;
  void* out = nullptr;
  unsigned* mask = nullptr;
  mslemu_thread_info info;
  unsigned done_epoch = 0;  // the SIMD-group's sync count when this thread returned
};

struct TgArray {
  char* block;
  unsigned long bytes;
  const char* name;
  const char* file;
  int line;
};

struct Launch {
  void** buffers;
  std::vector<Fiber> fibers;
  std::vector<unsigned> simd_epoch;  // sync points each SIMD-group has passed
  std::vector<char*> stacks;
  ucontext_t scheduler;
  Fiber* current = nullptr;
  std::map<int, TgArray> tg_arrays;
  unsigned long tg_bytes = 0;
  unsigned long max_tg_bytes = 0;
  unsigned long bytes_read = 0;
  std::string error;
};

Launch* g_launch = nullptr;

void fail(const char* fmt, ...) {
  if (!g_launch->error.empty()) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_launch->error = buf;
}

void fiber_main() {
  Fiber* f = g_launch->current;
  mslemu_thread_entry(g_launch->buffers, &f->info);
  f->state = State::Done;
  f->done_epoch = g_launch->simd_epoch[f->info.simdgroup_index_in_threadgroup];
  swapcontext(&f->ctx, &g_launch->scheduler);
}

void block(State state, const char* file, int line) {
  Fiber* f = g_launch->current;
  f->state = state;
  f->file = file;
  f->line = line;
  swapcontext(&f->ctx, &g_launch->scheduler);
}

bool same_site(const Fiber& a, const Fiber& b) {
  return a.state == b.state && a.line == b.line && strcmp(a.file, b.file) == 0 &&
         strcmp(a.op, b.op) == 0;
}

const char* describe(const Fiber& f) {
  static char buf[256];
  const char* what = f.state == State::AtBarrier       ? "threadgroup_barrier"
                     : f.state == State::AtSimdBarrier ? "simdgroup_barrier"
                     : f.state == State::AtSimdCall    ? f.op
                                                       : "return";
  if (f.state == State::Done) return "returned";
  snprintf(buf, sizeof buf, "%s at %s:%d", what, f.file, f.line);
  return buf;
}

// Resolves the SIMD-groups whose live lanes all wait at one SIMD call. Returns true if any moved.
bool resolve_simdgroups(std::vector<Fiber>& fibers) {
  bool moved = false;
  for (size_t base = 0; base < fibers.size() && g_launch->error.empty(); base += kSimdWidth) {
    size_t end = std::min(fibers.size(), base + kSimdWidth);
    Fiber* first = nullptr;
    bool any_simd = false, all_simd = true;
    for (size_t i = base; i < end; ++i) {
      Fiber& f = fibers[i];
      if (f.state == State::Done) continue;
      bool simd = f.state == State::AtSimdCall || f.state == State::AtSimdBarrier;
      any_simd |= simd;
      all_simd &= simd;
      if (!first) first = &f;
    }
    if (!first || !any_simd) continue;
    for (size_t i = base; i < end; ++i) {
      Fiber& f = fibers[i];
      if (f.state == State::Done || same_site(f, *first)) continue;
      std::string a = describe(*first);
      fail("divergent SIMD-group: lane %u waits at %s while lane %u waits at %s "
           "(threadgroup %u, simdgroup %u)",
           first->info.thread_index_in_simdgroup, a.c_str(), f.info.thread_index_in_simdgroup,
           describe(f), first->info.threadgroup_position_in_grid[0],
           first->info.simdgroup_index_in_threadgroup);
      return false;
    }
    if (!all_simd) continue;
    // Lanes that returned since this SIMD-group's last sync point skipped this call: divergence.
    unsigned& epoch = g_launch->simd_epoch[first->info.simdgroup_index_in_threadgroup];
    for (size_t i = base; i < end; ++i) {
      const Fiber& f = fibers[i];
      if (f.state != State::Done || f.done_epoch != epoch) continue;
      std::string a = describe(*first);
      fail("divergent SIMD-group: lane %u waits at %s while lane %u returned without reaching "
           "it (threadgroup %u, simdgroup %u)",
           first->info.thread_index_in_simdgroup, a.c_str(), f.info.thread_index_in_simdgroup,
           first->info.threadgroup_position_in_grid[0],
           first->info.simdgroup_index_in_threadgroup);
      return false;
    }
    ++epoch;
    unsigned mask = 0;
    for (size_t i = base; i < end; ++i)
      if (fibers[i].state != State::Done) mask |= 1u << (i - base);
    for (size_t i = base; i < end; ++i) {
      Fiber& f = fibers[i];
      if (f.state == State::Done) continue;
      if (f.state == State::AtSimdCall) {
        char* out = static_cast<char*>(f.out);
        memset(out, 0xFF, size_t(f.size) * kSimdWidth);
        for (size_t j = base; j < end; ++j)
          if (fibers[j].state != State::Done)
            memcpy(out + (j - base) * f.size, fibers[j].in, f.size);
        *f.mask = mask;
      }
    }
    for (size_t i = base; i < end; ++i)
      if (fibers[i].state != State::Done) fibers[i].state = State::Ready;
    moved = true;
  }
  return moved;
}

// All live threads wait at threadgroup barriers: release them if it is the same barrier for all.
bool resolve_barrier(std::vector<Fiber>& fibers) {
  const Fiber* first = nullptr;
  size_t done = 0;
  for (const Fiber& f : fibers) {
    if (f.state == State::Done) {
      ++done;
      continue;
    }
    if (!first) first = &f;
    if (!same_site(f, *first)) {
      std::string a = describe(*first);
      fail("barrier divergence in threadgroup %u: thread %u waits at %s while thread %u waits "
           "at %s",
           first->info.threadgroup_position_in_grid[0], first->info.thread_index_in_threadgroup,
           a.c_str(), f.info.thread_index_in_threadgroup, describe(f));
      return false;
    }
  }
  if (!first) return false;
  if (done) {
    fail("threadgroup_barrier at %s:%d reached by %zu of %zu threads of threadgroup %u; the "
         "others returned before it",
         first->file, first->line, fibers.size() - done, fibers.size(),
         first->info.threadgroup_position_in_grid[0]);
    return false;
  }
  for (Fiber& f : fibers) f.state = State::Ready;
  for (unsigned& e : g_launch->simd_epoch) ++e;
  return true;
}

void free_tg_arrays(Launch& L) {
  for (auto& [id, arr] : L.tg_arrays) {
    const unsigned char* lo = reinterpret_cast<unsigned char*>(arr.block);
    const unsigned char* hi = lo + kGuardBytes + arr.bytes;
    for (size_t i = 0; i < kGuardBytes && L.error.empty(); ++i)
      if (lo[i] != 0xFF || hi[i] != 0xFF)
        fail("write outside threadgroup array '%s' (%lu bytes) declared at %s:%d", arr.name,
             arr.bytes, arr.file, arr.line);
    free(arr.block);
  }
  L.tg_arrays.clear();
  L.tg_bytes = 0;
}

void run_group(Launch& L, const unsigned grid[3], const unsigned tg[3], const unsigned gid[3],
               int order, std::mt19937& rng) {
  unsigned size[3], ngroups[3];
  for (int d = 0; d < 3; ++d) {
    ngroups[d] = (grid[d] + tg[d] - 1) / tg[d];
    size[d] = std::min(tg[d], grid[d] - gid[d] * tg[d]);
  }
  unsigned n = size[0] * size[1] * size[2];
  unsigned nsg = (n + kSimdWidth - 1) / kSimdWidth;
  L.fibers.assign(n, Fiber());
  L.simd_epoch.assign(nsg, 0);
  while (L.stacks.size() < n) L.stacks.push_back(static_cast<char*>(malloc(kStackBytes)));
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = L.fibers[t];
    mslemu_thread_info& i = f.info;
    unsigned local[3] = {t % size[0], (t / size[0]) % size[1], t / (size[0] * size[1])};
    for (int d = 0; d < 3; ++d) {
      i.thread_position_in_threadgroup[d] = local[d];
      i.threadgroup_position_in_grid[d] = gid[d];
      i.thread_position_in_grid[d] = gid[d] * tg[d] + local[d];
      i.threads_per_threadgroup[d] = size[d];
      i.dispatch_threads_per_threadgroup[d] = tg[d];
      i.threadgroups_per_grid[d] = ngroups[d];
      i.threads_per_grid[d] = grid[d];
      i.grid_origin[d] = 0;
    }
    i.thread_index_in_threadgroup = t;
    i.thread_index_in_simdgroup = t % kSimdWidth;
    i.simdgroup_index_in_threadgroup = t / kSimdWidth;
    i.simdgroups_per_threadgroup = nsg;
    i.dispatch_simdgroups_per_threadgroup = (tg[0] * tg[1] * tg[2] + kSimdWidth - 1) / kSimdWidth;
    i.thread_index_in_quadgroup = t % 4;
    i.quadgroup_index_in_threadgroup = t / 4;
    i.quadgroups_per_threadgroup = (n + 3) / 4;
    i.dispatch_quadgroups_per_threadgroup = (tg[0] * tg[1] * tg[2] + 3) / 4;
    i.threads_per_simdgroup = kSimdWidth;
    i.thread_execution_width = kSimdWidth;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = L.stacks[t];
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
  }
  std::vector<unsigned> sched(n);
  for (unsigned t = 0; t < n; ++t) sched[t] = order == 1 ? n - 1 - t : t;
  while (L.error.empty()) {
    if (order == 2) std::shuffle(sched.begin(), sched.end(), rng);
    for (unsigned t : sched) {
      Fiber& f = L.fibers[t];
      if (f.state != State::Ready) continue;
      L.current = &f;
      swapcontext(&L.scheduler, &f.ctx);
      if (!L.error.empty()) break;
    }
    if (!L.error.empty()) break;
    bool all_done = true;
    for (const Fiber& f : L.fibers) all_done &= f.state == State::Done;
    if (all_done) break;
    if (resolve_simdgroups(L.fibers)) continue;
    if (!L.error.empty()) break;
    bool any_simd = false;
    for (const Fiber& f : L.fibers)
      any_simd |= f.state == State::AtSimdCall || f.state == State::AtSimdBarrier;
    if (any_simd) {
      fail("deadlock: a SIMD-group cannot proceed (lanes wait at different sync points)");
      break;
    }
    resolve_barrier(L.fibers);
  }
  L.max_tg_bytes = std::max(L.max_tg_bytes, L.tg_bytes);
  free_tg_arrays(L);
}

}  // namespace

extern "C" {

void* mslemu_tg_array(int id, unsigned long bytes, const char* name, const char* file, int line) {
  Launch& L = *g_launch;
  auto it = L.tg_arrays.find(id);
  if (it != L.tg_arrays.end()) return it->second.block + kGuardBytes;
  if (L.tg_bytes + bytes > kMaxThreadgroupMemory)
    fail("threadgroup memory over %lu bytes: '%s' (%lu bytes) at %s:%d brings it to %lu",
         kMaxThreadgroupMemory, name, bytes, file, line, L.tg_bytes + bytes);
  L.tg_bytes += bytes;
  char* block = static_cast<char*>(malloc(bytes + 2 * kGuardBytes));
  memset(block, 0xFF, bytes + 2 * kGuardBytes);
  L.tg_arrays[id] = TgArray{block, bytes, name, file, line};
  return block + kGuardBytes;
}

void mslemu_barrier(int kind, const char* file, int line) {
  g_launch->current->op = "";
  block(kind == 0 ? State::AtBarrier : State::AtSimdBarrier, file, line);
}

void mslemu_simd_gather(const void* in, unsigned size, void* out, unsigned* mask, const char* op,
                        const char* file, int line) {
  Fiber* f = g_launch->current;
  f->op = op;
  f->in = in;
  f->size = size;
  f->out = out;
  f->mask = mask;
  block(State::AtSimdCall, file, line);
}

unsigned mslemu_lane_id() { return g_launch->current->info.thread_index_in_simdgroup; }

void mslemu_count_bytes(unsigned long n) { g_launch->bytes_read += n; }

// Runs a whole dispatch. order: 0 forward, 1 reverse, 2 random lane order between sync points.
// stats: [threadgroups, max threadgroup memory bytes, counted bytes read]. Returns 0, or 1 with
// the first error in `err`.
__attribute__((visibility("default"))) int mslemu_launch(void** buffers, const unsigned* grid,
                                                         const unsigned* tg, int order,
                                                         unsigned seed, unsigned long* stats,
                                                         char* err, int err_len) {
  Launch L;
  L.buffers = buffers;
  g_launch = &L;
  std::mt19937 rng(seed);
  unsigned ngroups[3];
  for (int d = 0; d < 3; ++d) ngroups[d] = (grid[d] + tg[d] - 1) / tg[d];
  if (tg[0] * tg[1] * tg[2] > kMaxThreadsPerGroup)
    fail("threadgroup of %u threads: Metal allows at most %u", tg[0] * tg[1] * tg[2],
         kMaxThreadsPerGroup);
  unsigned long groups = 0;
  for (unsigned z = 0; z < ngroups[2] && L.error.empty(); ++z)
    for (unsigned y = 0; y < ngroups[1] && L.error.empty(); ++y)
      for (unsigned x = 0; x < ngroups[0] && L.error.empty(); ++x) {
        unsigned gid[3] = {x, y, z};
        run_group(L, grid, tg, gid, order, rng);
        ++groups;
      }
  for (char* s : L.stacks) free(s);
  stats[0] = groups;
  stats[1] = L.max_tg_bytes;
  stats[2] = L.bytes_read;
  g_launch = nullptr;
  if (L.error.empty()) return 0;
  snprintf(err, err_len, "%s", L.error.c_str());
  return 1;
}
}
