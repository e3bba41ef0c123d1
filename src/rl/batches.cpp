#include "rl/batches.h"

#include <algorithm>

namespace kiln::rl {

HostBatch sequence_batch(const std::vector<SequenceRef>& sequences) {
  HostBatch b;
  b.batch = static_cast<int32_t>(sequences.size());
  int32_t longest = 1;
  for (const SequenceRef& s : sequences)
    longest = std::max<int32_t>(longest, static_cast<int32_t>(s.prompt->size() + s.completion->size()));
  b.seq_len = longest;
  const size_t n = static_cast<size_t>(b.batch) * longest;
  b.ids.assign(n, 0);
  b.positions.assign(n, 0);
  b.segments.assign(n, -1);
  b.targets.assign(n, -100);
  for (size_t r = 0; r < sequences.size(); ++r) {
    const std::vector<int32_t>& p = *sequences[r].prompt;
    const std::vector<int32_t>& c = *sequences[r].completion;
    const size_t row = r * longest, P = p.size(), L = P + c.size();
    for (size_t i = 0; i < L; ++i) {
      b.ids[row + i] = i < P ? p[i] : c[i - P];
      b.positions[row + i] = static_cast<int32_t>(i);
      b.segments[row + i] = 0;
    }
    for (size_t i = 0; i < c.size(); ++i) b.targets[row + P - 1 + i] = c[i];
  }
  return b;
}

}  // namespace kiln::rl
