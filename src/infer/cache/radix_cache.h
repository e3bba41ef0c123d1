// RadixCache: reuse of computed prompt prefixes across requests, at the granularity of full pages.
//
// A tree whose edges are full pages: the node for tokens t[0 .. (k+1) * page_size) under the node
// for t[0 .. k * page_size) holds the page with the keys/values of tokens k * page_size .. (k + 1) *
// page_size - 1. Keys and values of a token depend on every token before it and on the weights, so
// a node is keyed by its page's token ids AND the policy version that computed it, and a lookup only
// follows nodes of the version it asks for: prefix KV of other weights is never reused.
//
// The cache holds one PagePool reference on every page it keeps. match() adds one for the caller
// (the request that reuses the pages). A page only the cache references is evictable; eviction
// takes least recently used leaves first (a node is used when matched or inserted).
// Thread safety: none; the engine thread owns it (with the PagePool it references).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "infer/cache/page_pool.h"

namespace kiln {

class RadixCache {
 public:
  explicit RadixCache(PagePool& pool) : pool_(pool), root_(std::make_unique<Node>()) {}
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // The pages of the longest cached prefix of tokens[0 .. n) made of full pages of `version`, at
  // most `max_pages` of them; each returned page carries a new reference owned by the caller.
  std::vector<int32_t> match(const int32_t* tokens, int64_t n, uint64_t version, int64_t max_pages);

  // Offers the first pages.size() full pages of a sequence: pages[k] holds the keys/values of
  // tokens[k * page_size .. (k + 1) * page_size) computed by `version`. Pages whose prefix is
  // already cached (maybe in another page) are skipped; new ones gain the cache's reference.
  void insert(const int32_t* tokens, const std::vector<int32_t>& pages, uint64_t version);

  // Frees up to `n` pages, least recently used first, among pages nobody but the cache references.
  // Returns how many were freed.
  int32_t evict(int32_t n);
  // Frees every unreferenced page of a version other than `current` (after a weight update).
  int32_t evict_other_versions(uint64_t current);
  // Drops every node and the cache's reference on its page; pages that requests hold stay theirs.
  // Safe at any time between steps: a request's pages are its own references, never the tree's.
  void clear();

  int32_t cached_pages() const { return cached_pages_; }
  // Pages that evict() could free now.
  int32_t evictable_pages() const;

 private:
  struct Node;
  using Key = std::pair<uint64_t, std::vector<int32_t>>;  // (version, the page's token ids)
  struct Node {
    Node* parent = nullptr;
    Key key;
    int32_t page = -1;
    uint64_t last_used = 0;
    std::map<Key, std::unique_ptr<Node>> children;
  };
  bool evictable(const Node& n) const { return n.children.empty() && n.page >= 0 && pool_.ref_count(n.page) == 1; }
  void remove_leaf(Node* n);
  template <typename Pred>
  int32_t evict_where(int32_t n, Pred pred);

  PagePool& pool_;
  std::unique_ptr<Node> root_;
  uint64_t clock_ = 0;
  int32_t cached_pages_ = 0;
};

}  // namespace kiln
