// WorkerService's order of training calls (training_call_order.h): where each training call
// starts and ends, pipelined calls held for their predecessors (bounded in number and time),
// and the check, before a pipelined call runs, that it follows the call that ran last.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "worker/runtime/local_work.h"
#include "worker/service/training_call_order.h"
#include "worker/service/worker_service.h"

namespace dtrain {

absl::StatusOr<WorkerTrainOrder> TrainOrderOf(const v1::StepRequest& request) {
  WorkerTrainOrder order;
  int64_t end = 0;
  if (request.work_size() > 0) {
    const v1::LocalWork& work = request.work(0);
    const int64_t first = work.first_batch_idx();
    if (!__builtin_add_overflow(first, LocalWorkBatches(work), &end)) {
      order.end = WorkerTrainPoint{request.job_id(), request.epoch(), end};
      if (request.pipelined()) {
        order.follows = WorkerTrainPoint{request.job_id(), request.epoch(), first};
      }
    }
  }
  if (request.pipelined() && !order.follows.has_value()) {
    return absl::InvalidArgumentError(
        "a pipelined training call must carry work whose first_batch_idx plus its batches fits "
        "in int64: it is ordered by where it starts");
  }
  return order;
}

void WorkerService::QueueInOrder(std::shared_ptr<Task> task) {
  const WorkerTrainOrder& o = task->order;
  if (o.follows.has_value() && train_queued_end_ != o.follows) {
    // Only the job set up here (or being set up) sends the call it follows: a call of another
    // job, or of none, would be held for nothing, in one of the few places a real one needs.
    if (const std::string current = CurrentJobLocked();
        current.empty() || o.follows->job != current) {
      task->reactor->Finish(ToGrpcStatus(absl::FailedPreconditionError(
          absl::StrCat("this pipelined training call is for job '", o.follows->job,
                       "', but worker '", options_.identity.name, "' ",
                       current.empty() ? "has no job; call Setup first"
                                       : absl::StrCat("is set up for job '", current, "'")))));
      return;
    }
    // Its predecessor has not arrived yet: it waits for it, bounded in number and time.
    if (held_.size() >= kMostHeld) {
      task->reactor->Finish(ToGrpcStatus(absl::ResourceExhaustedError(
          absl::StrCat("worker '", options_.identity.name, "' already holds ", held_.size(),
                       " pipelined training calls waiting for the calls before them"))));
      return;
    }
    task->held_until = absl::Now() + kPipelinedHold;
    held_.push_back(std::move(task));
    held_added_ = true;
    return;
  }
  Queue(std::move(task));
}

void WorkerService::Queue(std::shared_ptr<Task> task) {
  const std::optional<WorkerTrainPoint> end = task->order.end;
  queue_.push_back(std::move(task));
  // Other calls leave it: one queued between two training calls fails the pipelined one when it
  // runs (train_done_end_), rather than holding it for a predecessor already queued.
  if (!end.has_value()) return;
  train_queued_end_ = end;
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if ((*it)->order.follows == end) {
      std::shared_ptr<Task> next = std::move(*it);
      held_.erase(it);
      Queue(std::move(next));
      return;
    }
  }
}

absl::Time WorkerService::ExpireHeld() {
  std::vector<std::pair<std::shared_ptr<Task>, absl::Status>> over;
  absl::Time next = absl::InfiniteFuture();
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (auto it = held_.begin(); it != held_.end();) {
      std::shared_ptr<Task>& t = *it;
      if (!stopping_ && t->held_until > now) {
        next = std::min(next, t->held_until);
        ++it;
        continue;
      }
      const WorkerTrainPoint& f = *t->order.follows;
      over.emplace_back(
          std::move(t),
          stopping_ ? absl::UnavailableError("the worker is shutting down")
                    : absl::DeadlineExceededError(absl::StrCat(
                          "this pipelined training call, from batch ", f.batch, " of epoch ",
                          f.epoch, ", waited ", absl::FormatDuration(kPipelinedHold),
                          " for the training call ending there, which never reached worker '",
                          options_.identity.name, "'")));
      it = held_.erase(it);
    }
  }
  for (auto& [task, status] : over) task->reactor->Finish(ToGrpcStatus(status));
  return next;
}

absl::Status WorkerService::CheckFollows(const Task& task) {
  const std::optional<WorkerTrainPoint>& f = task.order.follows;
  if (!f.has_value()) return absl::OkStatus();
  std::string why;
  {
    absl::MutexLock lock(&mu_);
    if (train_done_end_ == f) return absl::OkStatus();
    // Which of the two ways it went, so that a user looks for the right cause.
    if (last_failed_) {
      why = "the call that ran last on it failed";
    } else if (train_done_end_.has_value()) {
      why = absl::StrCat("the training call that ran last on it ends at batch ",
                         train_done_end_->batch, " of epoch ", train_done_end_->epoch,
                         train_done_end_->job == f->job ? "" : " of another job");
    } else {
      why = "a call other than a training step (validation, test, predict, setup) ran last on it";
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("this pipelined training call, from batch ", f->batch, " of epoch ", f->epoch,
                   ", runs only right after the training call ending there succeeded on worker '",
                   options_.identity.name, "', but ", why));
}

void WorkerService::NoteRan(const Task& task, const absl::Status& status) {
  // A pipelined call follows only the training call that ran right before it.
  if (task.order.neutral) return;
  train_done_end_ = status.ok() ? task.order.end : std::nullopt;
  last_failed_ = !status.ok();
}

std::vector<std::shared_ptr<WorkerService::Task>> WorkerService::TakeHeld(const std::string& job) {
  std::vector<std::shared_ptr<Task>> taken;
  for (auto it = held_.begin(); it != held_.end();) {
    if ((*it)->order.follows->job != job) {
      ++it;
      continue;
    }
    taken.push_back(std::move(*it));
    it = held_.erase(it);
  }
  return taken;
}

}  // namespace dtrain
