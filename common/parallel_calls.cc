#include "common/parallel_calls.h"

#include <algorithm>
#include <memory>
#include <thread>

namespace dtrain {

std::vector<grpc::Status> ParallelCalls::Run(int n, const Call& call, absl::Duration grace,
                                             absl::Time deadline) {
  std::vector<grpc::Status> results(n);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(n);
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < n; ++i) {
      contexts[i] = std::make_unique<grpc::ClientContext>();
      if (deadline != absl::InfiniteFuture()) {
        contexts[i]->set_deadline(absl::ToChronoTime(deadline));
      }
      running_.push_back(contexts[i].get());
    }
  }
  absl::Mutex done_mu;
  int done = 0;
  bool failed = false;
  std::vector<bool> finished(n, false);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      grpc::Status status = call(i, contexts[i].get());
      absl::MutexLock lock(&done_mu);
      results[i] = std::move(status);
      finished[i] = true;
      ++done;
      if (!results[i].ok()) failed = true;
    });
  }
  {
    absl::MutexLock lock(&done_mu);
    auto all_or_failed = [&]()
                             ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu) { return done == n || failed; };
    done_mu.Await(absl::Condition(&all_or_failed));
    auto all = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(done_mu) { return done == n; };
    if (done < n && !done_mu.AwaitWithTimeout(absl::Condition(&all), grace)) {
      for (int i = 0; i < n; ++i) {
        if (!finished[i]) contexts[i]->TryCancel();
      }
    }
    done_mu.Await(absl::Condition(&all));
  }
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&mu_);
  for (auto& c : contexts) {
    running_.erase(std::find(running_.begin(), running_.end(), c.get()));
  }
  return results;
}

void ParallelCalls::CancelAll() {
  absl::MutexLock lock(&mu_);
  for (grpc::ClientContext* context : running_) context->TryCancel();
}

}  // namespace dtrain
