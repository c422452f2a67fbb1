// Early-return helpers for absl::Status / absl::StatusOr. Debian's Abseil (20220623) ships
// none, so these are the project's one copy.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DTRAIN_CONCAT_INNER_(a, b) a##b
#define DTRAIN_CONCAT_(a, b) DTRAIN_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define DTRAIN_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status dtrain_status_ = (expr);          \
    if (!dtrain_status_.ok()) return dtrain_status_; \
  } while (0)

// `DTRAIN_ASSIGN_OR_RETURN(auto x, F());` binds x to F()'s value or returns its status.
#define DTRAIN_ASSIGN_OR_RETURN(lhs, expr) \
  DTRAIN_ASSIGN_OR_RETURN_IMPL_(DTRAIN_CONCAT_(dtrain_statusor_, __LINE__), lhs, expr)
#define DTRAIN_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
