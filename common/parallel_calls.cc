#include "common/parallel_calls.h"

#include <pthread.h>

#include <algorithm>
#include <memory>
#include <thread>

namespace dtrain {

std::vector<grpc::Status> ParallelCalls::Run(int n, const Call& call, absl::Duration grace,
                                             absl::Time deadline) {
  return Wait(Begin(
                  n,
                  [&](const std::vector<std::pair<grpc::ClientContext*, Done>>& calls) {
                    std::vector<std::function<void()>> tasks;
                    tasks.reserve(n);
                    for (int i = 0; i < n; ++i) {
                      tasks.emplace_back([&call, i, context = calls[i].first,
                                          done = calls[i].second] { done(call(i, context)); });
                    }
                    Dispatch(std::move(tasks));
                  },
                  deadline),
              grace);
}

std::vector<grpc::Status> ParallelCalls::RunAsync(int n, const AsyncCall& start,
                                                  absl::Duration grace, absl::Time deadline) {
  return Wait(Start(n, start, deadline), grace);
}

std::unique_ptr<ParallelCalls::Started> ParallelCalls::Start(int n, const AsyncCall& start,
                                                             absl::Time deadline) {
  return Begin(
      n,
      [&](const std::vector<std::pair<grpc::ClientContext*, Done>>& calls) {
        for (int i = 0; i < n; ++i) start(i, calls[i].first, calls[i].second);
      },
      deadline);
}

std::unique_ptr<ParallelCalls::Started> ParallelCalls::Begin(int n, const StartAll& start_all,
                                                             absl::Time deadline) {
  auto started = std::make_unique<Started>(n);
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < n; ++i) {
      started->contexts[i] = std::make_unique<grpc::ClientContext>();
      if (deadline != absl::InfiniteFuture()) {
        started->contexts[i]->set_deadline(absl::ToChronoTime(deadline));
      }
      running_.push_back(started->contexts[i].get());
    }
  }
  std::vector<std::pair<grpc::ClientContext*, Done>> calls;
  calls.reserve(n);
  for (int i = 0; i < n; ++i) {
    calls.emplace_back(started->contexts[i].get(),
                       [outcome = started->outcome, i](grpc::Status status) {
                         absl::MutexLock lock(&outcome->mu);
                         outcome->failed = outcome->failed || !status.ok();
                         outcome->results[i] = std::move(status);
                         outcome->finished[i] = true;
                         ++outcome->done;
                       });
  }
  start_all(calls);
  return started;
}

std::vector<grpc::Status> ParallelCalls::Wait(std::unique_ptr<Started> started,
                                              absl::Duration grace) {
  const int n = static_cast<int>(started->contexts.size());
  std::vector<grpc::Status> results;
  {
    Started::Outcome& o = *started->outcome;
    absl::MutexLock lock(&o.mu);
    auto all_or_failed = [&o, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(o.mu) {
      return o.done == n || o.failed;
    };
    o.mu.Await(absl::Condition(&all_or_failed));
    auto all = [&o, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(o.mu) { return o.done == n; };
    if (o.done < n && !o.mu.AwaitWithTimeout(absl::Condition(&all), grace)) {
      for (int i = 0; i < n; ++i) {
        if (!o.finished[i]) started->contexts[i]->TryCancel();
      }
    }
    o.mu.Await(absl::Condition(&all));
    results = std::move(o.results);
  }
  absl::MutexLock lock(&mu_);
  for (auto& c : started->contexts) {
    running_.erase(std::find(running_.begin(), running_.end(), c.get()));
  }
  return results;
}

void ParallelCalls::Cancel(Started& started) {
  for (auto& c : started.contexts) c->TryCancel();
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
