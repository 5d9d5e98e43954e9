// The data the emulator's runtime hands each emulated GPU thread: every Metal attribute a kernel
// signature may ask for. Plain C layout, shared by the freestanding kernel unit and the runtime.
#pragma once

struct mslemu_thread_info {
  unsigned thread_position_in_grid[3];
  unsigned threadgroup_position_in_grid[3];
  unsigned thread_position_in_threadgroup[3];
  unsigned threads_per_threadgroup[3];
  unsigned dispatch_threads_per_threadgroup[3];
  unsigned threadgroups_per_grid[3];
  unsigned threads_per_grid[3];
  unsigned grid_origin[3];
  unsigned thread_index_in_threadgroup;
  unsigned thread_index_in_simdgroup;
  unsigned simdgroup_index_in_threadgroup;
  unsigned simdgroups_per_threadgroup;
  unsigned dispatch_simdgroups_per_threadgroup;
  unsigned thread_index_in_quadgroup;
  unsigned quadgroup_index_in_threadgroup;
  unsigned quadgroups_per_threadgroup;
  unsigned dispatch_quadgroups_per_threadgroup;
  unsigned threads_per_simdgroup;
  unsigned thread_execution_width;
};

extern "C" {
// Storage of one `threadgroup` array declaration (id: its rewrite site), shared by the group.
void* mslemu_tg_array(int id, unsigned long bytes, const char* name, const char* file, int line);
// Blocks the calling thread until its threadgroup (kind 0) or SIMD-group (kind 1) syncs here.
void mslemu_barrier(int kind, const char* file, int line);
// SIMD-group exchange: every active lane's `size` bytes land in `out[32 * size]`; `mask` gets
// the active lanes.
void mslemu_simd_gather(const void* in, unsigned size, void* out, unsigned* mask, const char* op,
                        const char* file, int line);
unsigned mslemu_lane_id();
void mslemu_count_bytes(unsigned long n);
// Defined by the generated kernel unit: runs one thread of the kernel.
void mslemu_thread_entry(void** buffers, const mslemu_thread_info* info);
}
