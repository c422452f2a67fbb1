// A streamed split's batches written in place, and their reuse; see batch_slabs.h.
#include "worker/data/batch_slabs.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include <ATen/ops/empty.h>

namespace dtrain {

void BatchSlabs::Reset(int64_t base, int64_t batch, int64_t end) {
  base_ = base;
  batch_ = std::max<int64_t>(1, batch);
  end_ = end;
  slabs_.clear();
}

std::shared_ptr<BatchSlabs::Slab> BatchSlabs::Of(int64_t position) {
  if (position < base_ || position >= end_) return nullptr;
  const int64_t index = (position - base_) / batch_;
  std::shared_ptr<Slab>& slab = slabs_[index];
  if (slab == nullptr) {
    slab = std::make_shared<Slab>();
    slab->first = base_ + index * batch_;
    slab->rows = std::min(batch_, end_ - slab->first);
  }
  return slab;
}

std::shared_ptr<BatchSlabs::Slab> BatchSlabs::Finish(int64_t first, int64_t last) {
  std::shared_ptr<Slab> exact;
  while (!slabs_.empty()) {
    const std::shared_ptr<Slab>& s = slabs_.begin()->second;
    if (s->first + s->rows > last + 1) break;
    if (s->first == first && s->rows == last - first + 1) exact = s;
    slabs_.erase(slabs_.begin());
  }
  return exact;
}

at::Tensor BatchSlabs::Row(Slab& slab, int64_t row, size_t field, at::IntArrayRef sizes,
                           at::ScalarType type) {
  std::lock_guard<std::mutex> lock(slab.mu);
  if (slab.columns.size() <= field) slab.columns.resize(field + 1);
  at::Tensor& column = slab.columns[field];
  if (!column.defined()) {
    std::vector<int64_t> shape{slab.rows};
    shape.insert(shape.end(), sizes.begin(), sizes.end());
    column = Buffer(std::move(shape), type);
  }
  if (column.scalar_type() != type || !column.sizes().slice(1).equals(sizes)) return at::Tensor();
  return column.select(0, row);
}

void BatchSlabs::Lend(const std::vector<at::Tensor>& columns) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  for (const at::Tensor& c : columns) pool_.push_back(c);
  const size_t keep = 4 * std::max<size_t>(1, columns.size());
  if (pool_.size() > keep) pool_.erase(pool_.begin(), pool_.end() - keep);
}

at::Tensor BatchSlabs::Buffer(std::vector<int64_t> sizes, at::ScalarType type) {
  {
    // The same sizes, not a view of another shape: a view would keep its base alive, and with
    // it a second reference to the storage, so the buffer would never look free again.
    std::lock_guard<std::mutex> lock(pool_mu_);
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      if (it->use_count() == 1 && it->storage().use_count() == 1 && it->scalar_type() == type &&
          it->sizes().equals(sizes)) {
        at::Tensor reused = std::move(*it);
        pool_.erase(it);
        return reused;
      }
    }
  }
  at::Tensor fresh = at::empty(sizes, at::TensorOptions().dtype(type));
  // A batch of images is tens of megabytes that the decoders write once per batch: in 2 MiB
  // pages its first touch is a few faults rather than thousands (measured: 2% of the decoders'
  // time), and the streamed rows and the step's reads miss the TLB less. Only advice: where
  // transparent huge pages are off it does nothing. (Where THP's defrag is "madvise", such a
  // fault may compact memory first; a slab is made a handful of times per split, then reused.
  // glibc maps a block over its mmap threshold apart, 256 MiB in dtrain's binaries
  // (common/process_tuning.h), and unmaps it when freed, advice and all; a smaller slab sits in a
  // heap, where the advice stays and only allows huge pages.)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(fresh.data_ptr());
  const uintptr_t end = begin + fresh.nbytes();
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1);
  if (end >= first + kHuge) {
    madvise(reinterpret_cast<void*>(first), (end - first) & ~(kHuge - 1), MADV_HUGEPAGE);
  }
  return fresh;
}

}  // namespace dtrain
