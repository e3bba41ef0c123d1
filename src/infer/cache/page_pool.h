// PagePool: the pages of the engine's KV storage, handed out and reference counted, each stamped
// with the policy version of the weights that wrote it. Plain host bookkeeping (no device code):
// the KV tensors themselves ([layers, slots, kv_heads, head_dim], slots = pages * page_size) are
// allocated once by the engine (infer/executor.h); a page id p means slots p * page_size ..
// (p + 1) * page_size - 1 there.
//
// Which free page is handed out next is the job of an AllocationStrategy; Paged (a free list of
// fixed-size pages, lowest id first) is the one kiln uses; the interface leaves room for others
// (contiguous runs for kernels that want them).
//
// References: a running request holds one reference on every page of its context; the radix cache
// holds one on every page it keeps. A page whose count drops to zero is free again.
// Thread safety: none; the engine thread owns the pool.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

namespace kiln {

class AllocationStrategy {
 public:
  virtual ~AllocationStrategy() = default;
  virtual int32_t page_size() const = 0;
  // Takes one free page, or returns -1 when none is left.
  virtual int32_t take() = 0;
  // Gives back a page taken earlier.
  virtual void give_back(int32_t page) = 0;
  virtual int32_t free_count() const = 0;
};

// Fixed-size pages from a free list; the lowest free id first (deterministic layouts in tests).
class PagedAllocation final : public AllocationStrategy {
 public:
  PagedAllocation(int32_t num_pages, int32_t page_size);
  int32_t page_size() const override { return page_size_; }
  int32_t take() override;
  void give_back(int32_t page) override;
  int32_t free_count() const override { return static_cast<int32_t>(free_.size()); }

 private:
  int32_t page_size_;
  std::set<int32_t> free_;
};

class PagePool {
 public:
  PagePool(int32_t num_pages, std::unique_ptr<AllocationStrategy> strategy);
  // A pool of `num_pages` pages of `page_size` slots with the Paged strategy.
  static PagePool paged(int32_t num_pages, int32_t page_size);

  int32_t num_pages() const { return num_pages_; }
  int32_t page_size() const { return strategy_->page_size(); }
  int32_t free_pages() const { return strategy_->free_count(); }
  int32_t used_pages() const { return num_pages_ - free_pages(); }

  // A new page with one reference, stamped with `version`; -1 when the pool is empty.
  int32_t allocate(uint64_t version);
  void retain(int32_t page);
  // Drops one reference; the page is free again when none is left.
  void release(int32_t page);
  int32_t ref_count(int32_t page) const { return refs_[page]; }
  // The policy version of the weights whose keys/values the page holds.
  uint64_t version(int32_t page) const { return versions_[page]; }

 private:
  int32_t num_pages_;
  std::unique_ptr<AllocationStrategy> strategy_;
  std::vector<int32_t> refs_;
  std::vector<uint64_t> versions_;
};

}  // namespace kiln
