#include "infer/cache/page_pool.h"

#include "core/status.h"

namespace kiln {

PagedAllocation::PagedAllocation(int32_t num_pages, int32_t page_size) : page_size_(page_size) {
  KILN_ASSERT(num_pages >= 0 && page_size > 0);
  for (int32_t p = 0; p < num_pages; ++p) free_.insert(free_.end(), p);
}

int32_t PagedAllocation::take() {
  if (free_.empty()) return -1;
  const int32_t p = *free_.begin();
  free_.erase(free_.begin());
  return p;
}

void PagedAllocation::give_back(int32_t page) {
  const bool inserted = free_.insert(page).second;
  KILN_ASSERT(inserted);
}

PagePool::PagePool(int32_t num_pages, std::unique_ptr<AllocationStrategy> strategy)
    : num_pages_(num_pages), strategy_(std::move(strategy)), refs_(num_pages, 0), versions_(num_pages, 0) {
  KILN_ASSERT(strategy_ && strategy_->free_count() == num_pages);
}

PagePool PagePool::paged(int32_t num_pages, int32_t page_size) {
  return PagePool(num_pages, std::make_unique<PagedAllocation>(num_pages, page_size));
}

int32_t PagePool::allocate(uint64_t version) {
  const int32_t p = strategy_->take();
  if (p < 0) return -1;
  KILN_ASSERT(p < num_pages_ && refs_[p] == 0);
  refs_[p] = 1;
  versions_[p] = version;
  return p;
}

void PagePool::retain(int32_t page) {
  KILN_ASSERT(page >= 0 && page < num_pages_ && refs_[page] > 0);
  ++refs_[page];
}

void PagePool::release(int32_t page) {
  KILN_ASSERT(page >= 0 && page < num_pages_ && refs_[page] > 0);
  if (--refs_[page] == 0) strategy_->give_back(page);
}

}  // namespace kiln
