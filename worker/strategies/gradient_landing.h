// Backward's new gradients made where the shm plane reads them (ddp's split step): while a
// GradientLanding::Scope is open on a thread, a CPU allocation of exactly the size of a free
// landing place (one per parameter, in plane memory every rank maps) is given that place instead of
// heap memory. The gradient autograd makes for a parameter then usually lies in the parameter's
// place, and its bucket's all-reduce reads it there: the copy of every gradient into its bucket
// (4.5% of the MLP's step) goes away.
//
// Which allocation gets a place is a guess by size: an intermediate of the same size may take it
// first (it is then freed, and the place with it, or it keeps the place and the gradient comes
// from the heap). So a place is only ever read when the parameter's gradient is found to lie
// exactly in it (Holds); otherwise the gradient is copied as before. Nothing is ever written into
// a place by this code: a tensor that keeps one (a retained intermediate gradient) sees its own
// values, and a place is lent again only once every tensor over it is gone.
//
// libtorch 1.13 has no way to ask autograd for a gradient in given memory (torch DDP copies
// the new gradient into its bucket, or, with bucket views, adds it to zeros there); the CPU
// allocator is the one seam it offers. The lending allocator wraps the allocator in place
// (InstallGradientLandingAllocator, gradient_landing_allocator.h) and delegates every other
// allocation to it, so outside a scope the cost is one thread-local read per allocation.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include <torch/types.h>

namespace dtrain {

class GradientLanding {
 public:
  // A place per entry: `places[i]` is a tensor over plane memory (contiguous, shaped as the
  // gradient it is for; its bytes the size lent). The places' storage stays alive while any tensor
  // over a lent place does. A place is only ever lent if it starts on c10's alignment (64 bytes),
  // which every CPU allocation is promised, whatever its type: Lendable says which are.
  explicit GradientLanding(std::vector<torch::Tensor> places);
  ~GradientLanding();
  GradientLanding(const GradientLanding&) = delete;
  GradientLanding& operator=(const GradientLanding&) = delete;

  // Whether `t` is place `i`'s memory exactly: dense, contiguous, the same first byte, dtype
  // and shape.
  bool Holds(const torch::Tensor& t, size_t i) const;
  bool Lendable(size_t i) const;
  // Whether place `i` is lent now: some tensor still lies over it.
  bool Lent(size_t i) const;
  // Whether PlaceGradient(i, grad) would succeed: `grad` lies there, or the place is free.
  bool CanPlace(size_t i, const torch::Tensor& grad) const { return Holds(grad, i) || !Lent(i); }
  // Makes place `i` hold `grad`'s values: nothing to do when it was made there, else a copy
  // (CopyGradient) unless another tensor holds the place (false, nothing written). Not while a
  // scope over this landing is open on any thread (a free place could be lent meanwhile).
  bool PlaceGradient(size_t i, const torch::Tensor& grad);
  size_t size() const;

  struct State;

  // Opens the lending on the calling thread (null: none) until the scope closes, when the
  // landing open before it, if any, is open again (scopes nest).
  class Scope {
   public:
    explicit Scope(GradientLanding* landing);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    State* previous_;
  };

  // How many allocations were given a place, over the process's life (for tests and the log).
  static int64_t lent_total();

 private:
  std::shared_ptr<State> state_;
};

// Copies `grad` into `into` (a parameter's gradient memory, of its shape): dense, zeros for none,
// a sparse gradient (an embedding's) or one shaped otherwise taken dense.
void CopyGradient(const torch::Tensor& grad, torch::Tensor& into);

}  // namespace dtrain
