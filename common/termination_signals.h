// How dtrain's daemons stop: SIGTERM and SIGINT are blocked in every thread and taken
// synchronously by main, which then shuts down in order (no work in a signal handler).
#pragma once

#include <pthread.h>
#include <signal.h>

namespace dtrain {

// Call first in main, before any thread starts, so that every thread inherits the mask.
inline sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Blocks until SIGTERM or SIGINT arrives; returns which.
inline int WaitForTerminationSignal(const sigset_t& signals) {
  int received = 0;
  sigwait(&signals, &received);
  return received;
}

}  // namespace dtrain
