// cpp-httplib binds a server's socket with SO_REUSEPORT on Linux, so a second dashboard or
// metrics endpoint on a port already served starts without an error and the kernel splits new
// connections between the two processes. dtrain's HTTP servers bind their port alone instead
// (SO_REUSEADDR only, so a restart still binds past connections in TIME_WAIT): the second start
// fails saying it cannot listen.
#pragma once

#include <sys/socket.h>

#include <httplib.h>

namespace dtrain {

inline void BindPortAlone(httplib::Server& server) {
  server.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

}  // namespace dtrain
