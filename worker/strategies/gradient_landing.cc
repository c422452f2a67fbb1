// The lending CPU allocator behind GradientLanding (see the header for why it exists).
#include "worker/strategies/gradient_landing.h"

#include <atomic>
#include <cstdint>
#include <limits>
#include <utility>

#include <c10/core/Allocator.h>
#include <c10/core/alignment.h>

#include "absl/base/const_init.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "worker/strategies/gradient_landing_allocator.h"

namespace dtrain {

struct GradientLanding::State : std::enable_shared_from_this<GradientLanding::State> {
  std::vector<torch::Tensor> places;
  std::vector<char*> data;
  std::vector<size_t> bytes;
  std::unique_ptr<std::atomic<bool>[]> lent;
  absl::flat_hash_map<size_t, std::vector<size_t>> by_size;  // lendable places only
};

namespace {

thread_local GradientLanding::State* t_open = nullptr;
std::atomic<int64_t> g_lent_total{0};

struct Lease {
  std::shared_ptr<GradientLanding::State> state;
  size_t place = 0;
};

// Lent pointers, each holding its state (and so the plane memory) until it is returned.
ABSL_CONST_INIT absl::Mutex g_leases_mu(absl::kConstInit);
absl::flat_hash_map<void*, Lease>& Leases() ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_leases_mu) {
  // Never destroyed: a tensor may return its place during static destruction.
  static auto* leases = new absl::flat_hash_map<void*, Lease>();
  return *leases;
}
// Leases outstanding: a free finds none to look up, without the lock, while this is 0.
std::atomic<int64_t> g_outstanding{0};

c10::DeleterFnPtr g_base_raw_deleter = nullptr;

// Frees a lent place; false if `p` was not lent.
bool Return(void* p) {
  if (g_outstanding.load(std::memory_order_acquire) == 0) return false;
  Lease lease;
  {
    absl::MutexLock lock(&g_leases_mu);
    auto it = Leases().find(p);
    if (it == Leases().end()) return false;
    lease = std::move(it->second);
    Leases().erase(it);
    lease.state->lent[lease.place].store(false, std::memory_order_release);
    g_outstanding.fetch_sub(1, std::memory_order_acq_rel);
  }
  return true;  // the state may die here, outside the lock
}

// Every pointer this allocator hands out carries this deleter, as c10's raw interface requires
// of an allocator with a raw_deleter: the base allocator's own memory goes back to it.
void Delete(void* p) {
  if (!Return(p)) g_base_raw_deleter(p);
}

class LendingAllocator final : public c10::Allocator {
 public:
  explicit LendingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) const override {
    GradientLanding::State* open = t_open;
    if (open != nullptr && n > 0) {
      auto candidates = open->by_size.find(n);
      if (candidates != open->by_size.end()) {
        for (size_t i : candidates->second) {
          bool expected = false;
          if (!open->lent[i].compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
            continue;
          }
          {
            absl::MutexLock lock(&g_leases_mu);
            Leases()[open->data[i]] = Lease{open->shared_from_this(), i};
            g_outstanding.fetch_add(1, std::memory_order_acq_rel);
          }
          g_lent_total.fetch_add(1, std::memory_order_relaxed);
          // The context is the pointer itself, as raw_allocate requires.
          return {open->data[i], open->data[i], &Delete, c10::Device(c10::DeviceType::CPU)};
        }
      }
    }
    c10::DataPtr mine = base_->allocate(n);
    if (g_base_raw_deleter == nullptr || mine.get_deleter() != g_base_raw_deleter ||
        mine.get() != mine.get_context()) {
      return mine;  // a base allocator without the raw interface: its pointers as they are
    }
    void* p = mine.release_context();
    return {p, p, &Delete, mine.device()};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return g_base_raw_deleter != nullptr ? &Delete : nullptr;
  }

 private:
  c10::Allocator* const base_;
};

}  // namespace

void InstallGradientLandingAllocator() {
  ABSL_CONST_INIT static absl::Mutex mu(absl::kConstInit);
  static LendingAllocator* lender = nullptr;
  absl::MutexLock lock(&mu);
  if (lender != nullptr) return;
  c10::Allocator* base = c10::GetAllocator(c10::DeviceType::CPU);
  g_base_raw_deleter = base->raw_deleter();
  lender = new LendingAllocator(base);  // never freed: tensors may outlive every static
  c10::SetAllocator(c10::DeviceType::CPU, lender, std::numeric_limits<uint8_t>::max());
}

GradientLanding::GradientLanding(std::vector<torch::Tensor> places)
    : state_(std::make_shared<State>()) {
  InstallGradientLandingAllocator();
  state_->lent = std::make_unique<std::atomic<bool>[]>(places.size());
  for (size_t i = 0; i < places.size(); ++i) {
    const torch::Tensor& place = places[i];
    state_->data.push_back(static_cast<char*>(place.data_ptr()));
    state_->bytes.push_back(static_cast<size_t>(place.numel()) * place.element_size());
    state_->lent[i].store(false, std::memory_order_relaxed);
    if (Lendable(i)) state_->by_size[state_->bytes.back()].push_back(i);
  }
  state_->places = std::move(places);
}

GradientLanding::~GradientLanding() = default;

bool GradientLanding::Holds(const torch::Tensor& t, size_t i) const {
  const torch::Tensor& place = state_->places[i];
  return t.defined() && t.layout() == torch::kStrided && t.device().is_cpu() && t.is_contiguous() &&
         t.data_ptr() == state_->data[i] && t.scalar_type() == place.scalar_type() &&
         t.sizes() == place.sizes();
}

bool GradientLanding::PlaceGradient(size_t i, const torch::Tensor& grad) {
  if (Holds(grad, i)) return true;
  if (Lent(i)) return false;
  torch::NoGradGuard no_grad;
  CopyGradient(grad, state_->places[i]);
  return true;
}

void CopyGradient(const torch::Tensor& grad, torch::Tensor& into) {
  if (!grad.defined()) {
    into.zero_();
  } else if (grad.layout() == torch::kStrided && grad.sizes() == into.sizes()) {
    into.copy_(grad);
  } else {
    into.view({-1}).copy_((grad.is_sparse() ? grad.to_dense() : grad).reshape({-1}));
  }
}

bool GradientLanding::Lendable(size_t i) const {
  return state_->bytes[i] > 0 &&
         reinterpret_cast<uintptr_t>(state_->data[i]) % c10::gAlignment == 0;
}

bool GradientLanding::Lent(size_t i) const {
  return state_->lent[i].load(std::memory_order_acquire);
}

size_t GradientLanding::size() const { return state_->data.size(); }

GradientLanding::Scope::Scope(GradientLanding* landing) : previous_(t_open) {
  t_open = landing != nullptr ? landing->state_.get() : nullptr;
}

GradientLanding::Scope::~Scope() { t_open = previous_; }

int64_t GradientLanding::lent_total() { return g_lent_total.load(std::memory_order_relaxed); }

}  // namespace dtrain
