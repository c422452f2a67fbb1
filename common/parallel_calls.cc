#include "common/parallel_calls.h"

#include <pthread.h>

#include <algorithm>
#include <memory>
#include <thread>

namespace dtrain {

std::vector<grpc::Status> ParallelCalls::Run(int n, const Call& call, absl::Duration grace,
                                             absl::Time deadline) {
  return Collect(
      n,
      [&](const std::vector<std::pair<grpc::ClientContext*, Done>>& calls) {
        std::vector<std::function<void()>> tasks;
        tasks.reserve(n);
        for (int i = 0; i < n; ++i) {
          tasks.emplace_back([&call, i, context = calls[i].first, done = calls[i].second] {
            done(call(i, context));
          });
        }
        Dispatch(std::move(tasks));
      },
      grace, deadline);
}

std::vector<grpc::Status> ParallelCalls::RunAsync(int n, const AsyncCall& start,
                                                  absl::Duration grace, absl::Time deadline) {
  return Collect(
      n,
      [&](const std::vector<std::pair<grpc::ClientContext*, Done>>& calls) {
        for (int i = 0; i < n; ++i) start(i, calls[i].first, calls[i].second);
      },
      grace, deadline);
}

std::vector<grpc::Status> ParallelCalls::Collect(
    int n,
    const std::function<void(const std::vector<std::pair<grpc::ClientContext*, Done>>&)>& start_all,
    absl::Duration grace, absl::Time deadline) {
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
  // Shared with the completions: a kept thread or gRPC's may still be leaving mu when this
  // returns.
  struct Outcome {
    explicit Outcome(int n) : results(n), finished(n, false) {}
    absl::Mutex mu;
    std::vector<grpc::Status> results ABSL_GUARDED_BY(mu);
    std::vector<bool> finished ABSL_GUARDED_BY(mu);
    int done ABSL_GUARDED_BY(mu) = 0;
    bool failed ABSL_GUARDED_BY(mu) = false;
  };
  auto outcome = std::make_shared<Outcome>(n);
  std::vector<std::pair<grpc::ClientContext*, Done>> calls;
  calls.reserve(n);
  for (int i = 0; i < n; ++i) {
    calls.emplace_back(contexts[i].get(), [outcome, i](grpc::Status status) {
      absl::MutexLock lock(&outcome->mu);
      outcome->failed = outcome->failed || !status.ok();
      outcome->results[i] = std::move(status);
      outcome->finished[i] = true;
      ++outcome->done;
    });
  }
  start_all(calls);
  std::vector<grpc::Status> results;
  {
    Outcome& o = *outcome;
    absl::MutexLock lock(&o.mu);
    auto all_or_failed = [&o, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(o.mu) {
      return o.done == n || o.failed;
    };
    o.mu.Await(absl::Condition(&all_or_failed));
    auto all = [&o, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(o.mu) { return o.done == n; };
    if (o.done < n && !o.mu.AwaitWithTimeout(absl::Condition(&all), grace)) {
      for (int i = 0; i < n; ++i) {
        if (!o.finished[i]) contexts[i]->TryCancel();
      }
    }
    o.mu.Await(absl::Condition(&all));
    results = std::move(o.results);
  }
  absl::MutexLock lock(&mu_);
  for (auto& c : contexts) {
    running_.erase(std::find(running_.begin(), running_.end(), c.get()));
  }
  return results;
}

void ParallelCalls::Dispatch(std::vector<std::function<void()>> tasks) {
  absl::MutexLock lock(&pool_mu_);
  const int promised = std::min(idle_, static_cast<int>(tasks.size()));
  idle_ -= promised;
  for (std::function<void()>& task : tasks) queue_.push_back(std::move(task));
  for (size_t k = promised; k < tasks.size(); ++k) threads_.emplace_back([this] { Serve(); });
}

void ParallelCalls::Serve() {
  pthread_setname_np(pthread_self(), "dtrain-calls");
  absl::MutexLock lock(&pool_mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(pool_mu_) {
      return stopping_ || !queue_.empty();
    };
    pool_mu_.Await(absl::Condition(&ready));
    if (queue_.empty()) return;  // stopping
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    pool_mu_.Unlock();
    task();
    task = nullptr;  // its captures go before the thread counts as idle
    pool_mu_.Lock();
    ++idle_;
  }
}

ParallelCalls::~ParallelCalls() {
  {
    absl::MutexLock lock(&pool_mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ParallelCalls::CancelAll() {
  absl::MutexLock lock(&mu_);
  for (grpc::ClientContext* context : running_) context->TryCancel();
}

}  // namespace dtrain
