// schedule/tasks.hpp: how a generated loop kernel's work is cut into tasks for the thread pool.
// One rule per kernel shape, used by every CPU runner (the static executor, backend/cpu/executor.hpp, and
// the run-time path's host side, backend/cpu/generated_program.hpp), so a kernel splits the same way whichever path
// runs it. (max_autotune may time other splits of a rows kernel: backend/cpu/executor.hpp's tuned_rows.)
// Depends on: the standard library only.
#pragma once

#include <algorithm>
#include <cstddef>

namespace fusebox::schedule {

/// Below this many elements a task costs more to hand out than to run.
inline constexpr std::size_t min_task_elems = 1 << 14;

/// A rows kernel over [rows, width]: tasks of whole rows, at least min_task_elems elements each; a
/// kernel without reduction passes may also cut a long row into column blocks (a multiple of the
/// vector width `vs`), since nothing it computes spans the row.
struct row_split {
  std::size_t col_block = 0, col_blocks = 1, rows_per_task = 1;
  constexpr std::size_t tasks(std::size_t rows) const { return (rows + rows_per_task - 1) / rows_per_task * col_blocks; }
};
constexpr row_split split_rows(std::size_t width, bool has_passes, std::size_t vs) {
  row_split s;
  s.col_block = !has_passes && width > min_task_elems ? std::max<std::size_t>(min_task_elems / vs * vs, vs) : width;
  s.col_blocks = s.col_block == 0 ? 1 : (width + s.col_block - 1) / s.col_block;
  s.rows_per_task = std::max<std::size_t>(1, min_task_elems / std::max<std::size_t>(width, 1));
  return s;
}

/// Whether a kernel writes its outputs with non-temporal stores (cpu::store_stream_v): when they
/// are larger than a last-level cache, they would leave it before anything read them again, and
/// ordinary stores would first read every line they write. 32 MiB is the L3 of one Zen 4 CCD
/// and more than most client chips have; below it a consumer kernel may still find the data there.
/// Measured on W1c and W2c (docs/benchmarks.md, run AP).
inline constexpr std::size_t stream_store_min_bytes = std::size_t(32) << 20;
constexpr bool streams_output(std::size_t output_bytes) { return output_bytes >= stream_store_min_bytes; }

/// A column reduction over an input of `rows` rows of `width` (after merging dimensions), reduced
/// to `out_rows` output rows: tasks own blocks of columns, and slices of the output rows too when
/// there are fewer column blocks than threads (T2's conv 2 bias gradient, [128, 64, 64] summed
/// over the batch, is one block of 64 columns). Every task owns its output elements, so no two
/// tasks add into one, and each output element is summed in the same order whatever the split.
struct column_split {
  std::size_t block = 0, blocks = 1, row_chunks = 1, chunk = 0;
  constexpr std::size_t tasks() const { return blocks * row_chunks; }
};
constexpr column_split split_columns(std::size_t rows, std::size_t width, std::size_t out_rows, std::size_t threads,
                                     std::size_t vs) {
  column_split s;
  threads = std::max<std::size_t>(threads, 1);
  s.block = std::max<std::size_t>(vs * 16, (width + threads - 1) / threads);
  s.blocks = (width + s.block - 1) / s.block;
  const bool worth_sharing = rows * width >= 2 * min_task_elems;
  s.row_chunks = worth_sharing && s.blocks < threads ? std::min(out_rows, (threads + s.blocks - 1) / s.blocks) : 1;
  if (s.row_chunks == 0) s.row_chunks = 1;
  s.chunk = (out_rows + s.row_chunks - 1) / s.row_chunks;
  return s;
}

}  // namespace fusebox::schedule
