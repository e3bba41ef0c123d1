#include "infer/cache/radix_cache.h"

#include <functional>
#include <queue>

#include "core/status.h"

namespace kiln {

RadixCache::~RadixCache() { clear(); }

void RadixCache::clear() {
  // Give back the cache's references (deepest first is not needed: references are independent).
  std::vector<Node*> stack = {root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n->page >= 0) pool_.release(n->page);
    for (auto& [k, c] : n->children) stack.push_back(c.get());
  }
  root_ = std::make_unique<Node>();
  cached_pages_ = 0;
}

std::vector<int32_t> RadixCache::match(const int32_t* tokens, int64_t n, uint64_t version, int64_t max_pages) {
  const int32_t ps = pool_.page_size();
  std::vector<int32_t> pages;
  Node* node = root_.get();
  const uint64_t now = ++clock_;
  Key key{version, std::vector<int32_t>(ps)};
  for (int64_t k = 0; k < max_pages && (k + 1) * ps <= n; ++k) {
    key.second.assign(tokens + k * ps, tokens + (k + 1) * ps);
    auto it = node->children.find(key);
    if (it == node->children.end()) break;
    node = it->second.get();
    node->last_used = now;
    pool_.retain(node->page);
    pages.push_back(node->page);
  }
  return pages;
}

void RadixCache::insert(const int32_t* tokens, const std::vector<int32_t>& pages, uint64_t version) {
  const int32_t ps = pool_.page_size();
  Node* node = root_.get();
  const uint64_t now = ++clock_;
  for (size_t k = 0; k < pages.size(); ++k) {
    Key key{version, std::vector<int32_t>(tokens + k * ps, tokens + (k + 1) * ps)};
    auto it = node->children.find(key);
    if (it == node->children.end()) {
      KILN_ASSERT(pool_.version(pages[k]) == version);
      auto child = std::make_unique<Node>();
      child->parent = node;
      child->key = key;
      child->page = pages[k];
      pool_.retain(pages[k]);
      ++cached_pages_;
      it = node->children.emplace(std::move(key), std::move(child)).first;
    }
    node = it->second.get();
    node->last_used = now;
  }
}

void RadixCache::remove_leaf(Node* n) {
  KILN_ASSERT(n->children.empty() && n->parent);
  pool_.release(n->page);
  --cached_pages_;
  Node* parent = n->parent;
  parent->children.erase(n->key);  // destroys n
}

template <typename Pred>
int32_t RadixCache::evict_where(int32_t n, Pred pred) {
  // Min-heap of evictable leaves by last use; a parent whose last child goes becomes a candidate.
  using Item = std::pair<uint64_t, Node*>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  std::vector<Node*> stack = {root_.get()};
  while (!stack.empty()) {
    Node* x = stack.back();
    stack.pop_back();
    if (x != root_.get() && evictable(*x) && pred(*x)) heap.emplace(x->last_used, x);
    for (auto& [k, c] : x->children) stack.push_back(c.get());
  }
  int32_t freed = 0;
  while (freed < n && !heap.empty()) {
    Node* x = heap.top().second;
    heap.pop();
    Node* parent = x->parent;
    remove_leaf(x);
    ++freed;
    if (parent != root_.get() && evictable(*parent) && pred(*parent)) heap.emplace(parent->last_used, parent);
  }
  return freed;
}

int32_t RadixCache::evict(int32_t n) {
  return evict_where(n, [](const Node&) { return true; });
}

int32_t RadixCache::evict_other_versions(uint64_t current) {
  return evict_where(cached_pages_, [current](const Node& x) { return x.key.first != current; });
}

int32_t RadixCache::evictable_pages() const {
  // A page is reclaimable when nobody else holds it and its whole subtree is reclaimable too.
  std::function<int32_t(const Node&, bool*)> walk = [&](const Node& x, bool* all) -> int32_t {
    int32_t count = 0;
    bool children_all = true;
    for (const auto& [k, c] : x.children) count += walk(*c, &children_all);
    const bool mine = x.page < 0 || pool_.ref_count(x.page) == 1;
    *all = *all && children_all && mine;
    if (x.page >= 0 && children_all && mine) ++count;
    return count;
  };
  bool all = true;
  return walk(*root_, &all);
}

}  // namespace kiln
